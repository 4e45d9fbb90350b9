// Package meta is the cluster's metadata state machine on the Paxos log: nodes, jobs,
// gangs, placements, actors, objects and checkpoints, with versioned keys, compare-and-swap,
// transactions and watches.
package meta
