// Package gang is Atoll's scheduler as a pure, deterministic core: a cluster snapshot and
// events in, decisions out. It owns queues with fair share, all-or-nothing gang admission,
// placement scoring, checkpoint-aware preemption and backfill. No I/O, no goroutines, and
// time is an input: every method takes "now".
//
// The pieces:
//   - Request: a gang of Min..Max identical members; each member asks for whole cards on one
//     machine, a share of one card (gpu_milli), or a MIG profile, plus CPU and memory; a GPU
//     model constraint, priority, queue, expected duration and checkpoint facts.
//   - Admission is all-or-nothing: members are allocated tentatively in a statement and
//     committed together or undone in reverse (as Volcano's Statement).
//   - Placement is filter then score. Free-capacity indexes (nodes bucketed by idle cards,
//     per-rack and per-island free counts, the set of nodes with partly used cards) propose
//     at most Config.MaxCandidates placements, smallest topology domain first; each is
//     scored by the plugins (topology + modeled AllReduce, FGD-style fragmentation, measured
//     load, binpack) with the weights in Config.Weights.
//   - Queues: hierarchical, weighted, DRF dominant shares against fair shares; borrowing of
//     idle capacity, reclaim by preemption, aging, and the dynamic priority
//     α·(remaining/total) + β·(resource satisfaction) + γ·(queue sensitivity).
//   - Preemption evicts whole gangs, cheapest first (work since the last checkpoint + save +
//     restore + CUDA context teardown and re-creation), only when that admits the preemptor,
//     and gives victims a checkpoint deadline; the freed nodes are reserved for the preemptor.
//   - Backfill: the first blocked gang gets a reservation at its shadow time; others may use
//     the reserved nodes only if their expected duration ends before it.
//   - Backpressure: beyond Config.MaxPending, submissions are QueuedSaturated.
//
// Usage sketch:
//
//	snap := gang.Snapshot{Nodes: []gang.Node{{
//		Name: "m0", Rack: 0, CPUMilli: 64000, FreeCPU: 64000, MemMiB: 512 << 10, FreeMem: 512 << 10,
//		GPUs: []gang.GPU{{Model: "H100", Island: 0, FreeMilli: gang.Milli}, /* ... */},
//	}}}
//	s, err := gang.New(gang.DefaultConfig(), snap, gang.WithCollectiveModel(model))
//	st, err := s.Submit(gang.Request{ID: "job-1", Min: 2, Member: gang.Member{GPUs: 4}}, now)
//	d := s.Cycle(now)
//	for _, p := range d.Placements { /* bind p.Members; p.Scores explains the choice */ }
//	for _, v := range d.Preemptions { /* ask v.Victim to checkpoint before v.Deadline */ }
//	s.Evicted("victim", now, true) // when a victim stopped
//	s.Finish("job-1", now)         // when a gang ended
package gang
