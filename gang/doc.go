// Package gang is Atoll's scheduler as a pure, deterministic core: a cluster snapshot and
// events in, decisions out. It owns queues with fair share, all-or-nothing gang admission,
// placement scoring, cost-aware preemption, elastic resizing and backfill. No I/O, no
// goroutines, and time is an input: every method takes "now".
//
// The pieces:
//   - Request: a gang of Min..Max identical members; each member asks for whole cards on one
//     machine, a share of one card (gpu_milli), or a MIG profile, plus CPU and memory; a GPU
//     model constraint, priority, queue, expected duration and checkpoint facts.
//   - Admission is all-or-nothing: members are allocated tentatively in a statement and
//     committed together or undone in reverse (as Volcano's Statement).
//   - Cycle takes the pending gangs in QueueSort order through Volcano's actions
//     (Config.Actions: enqueue, allocate, preempt, reclaim, backfill), which run
//     kube-scheduler's extension points (framework.go): PreFilter, Filter, Score, Permit,
//     PostFilter, Reserve. Each gang's attempt has a CycleState its plugins share. Plugins
//     are built by name from a Registry (Config.Plugins names them; WithRegistry adds
//     out-of-tree ones) and reach the scheduler through a Handle and a Trial.
//   - Placement strategies (Request.Strategy: spread, strict-spread, strict-pack) are
//     Filter and Score plugins: strategy gangs queue, preempt and are preempted as any.
//   - Placement is filter then score. Free-capacity indexes propose at most
//     Config.MaxCandidates placements, smallest topology domain first; each is scored by
//     the plugins (topology + modeled AllReduce, FGD-style fragmentation, measured load,
//     binpack) with the weights in Config.Weights.
//   - Queue order ("urgency"): expected remaining GPU-time (least attained service when
//     unknown), weighted by class, discounted by waiting; DRF fair share across queues.
//     Run times come from Request.Duration, else from the runs of completed gangs of the
//     same kind (Scheduler.Complete, Config.Predict), capped by Request.TimeLimit, else
//     from the limit alone (runtimes.go).
//   - Preemption evicts whole gangs (or shrinks elastic ones) cheapest first, only when the
//     freed capacity admits the preemptor and its weighted wait pays for the victims' cost
//     from the CostModel (lost work or save, restore, CUDA context, communicator set-up);
//     victims get deadlines and the freed nodes are held for the preemptor.
//   - Elastic gangs grow when capacity is free (Decisions.Resizes) and shrink before anyone
//     is evicted whole (ResizeDone when the members stopped); one that shrinking to its
//     minimum does not make room enough is evicted whole.
//   - Waiting gangs carry a WaitKind and a specific reason; GangStatus reports them.
//   - Backfill: a long-blocked gang gets a reservation at its shadow time; others may use
//     the reserved nodes only if their declared duration or time limit ends before it.
//   - Backpressure: past Config.MaxPending, submissions are refused with ErrSaturated and a
//     retry hint.
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
//	for _, r := range d.Resizes { /* start r.Add, or stop r.Remove then ResizeDone */ }
//	s.Evicted("victim", now, true) // when a victim stopped
//	s.Finish("job-1", now)         // when a gang ended
package gang
