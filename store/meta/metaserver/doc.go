// Package metaserver is the server side of the metadata log: the StateMachine that the
// Paxos replicas apply (versioned keys, compare-and-swap, transactions, watches,
// snapshots), the head's client API over HTTP (Handler, NewHTTPServer), LocalConn for a
// client in the replica's process, and StartCluster, an in-process cluster of replicas
// for tests and benchmarks. Clients need only package meta.
package metaserver
