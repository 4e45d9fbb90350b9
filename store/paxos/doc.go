// Package paxos is Multi-Paxos as a pure state machine, shaped like etcd raft's RawNode:
// messages and ticks in, a Ready batch (what to persist, send and apply) out.
package paxos
