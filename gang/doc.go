// Package gang is Atoll's scheduler as a pure, deterministic core: a cluster snapshot and
// events in, decisions out. It owns queues with fair share, all-or-nothing gang admission,
// placement scoring, checkpoint-aware preemption and backfill. No I/O, no goroutines, and
// time is an input.
package gang
