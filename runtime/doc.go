// Package runtime wires Atoll's processes together: the head (cluster state, placement,
// metadata), the agents (one per machine: its GPUs, its object store) and the workers (actors
// hosted on an actors.System). Local starts a whole cluster in one process with simulated GPU
// machines; that embedded default is what `atoll demo` and sdk.Local run.
//
// The seams where later parts slot in are small interfaces owned here: Placer (the gang
// scheduler), MetaStore (the Paxos metadata log), ObjectStore (a machine's object store).
// Each has a simple implementation beside it.
package runtime
