// Package sdk is the Go API a training program uses to run on Atoll.
//
// A program starts (or, later, connects to) a cluster, registers its actor kinds by name,
// submits a job, spawns gangs of workers on GPUs, calls them, passes objects, and lets the
// workers AllReduce and checkpoint:
//
//	c, _ := sdk.Local(ctx)                                   // embedded cluster, simulated GPUs
//	defer c.Shutdown(ctx)
//	_ = c.Register("trainer", func() sdk.Actor { return &Trainer{} })
//	job, _ := c.Submit(ctx, sdk.JobSpec{Name: "digits"})
//	g, _ := job.SpawnGang(ctx, sdk.GangSpec{Name: "dp", Kind: "trainer", Workers: 8, GPUsPerWorker: 1, SameIsland: true, MaxRestarts: 3})
//	ref, _ := sdk.Put(ctx, c, dataset)                        // typed object refs
//	loss, _ := sdk.Call[float64](ctx, c, g.Worker(0), Step{Data: ref})
//	_ = g.Checkpoint(ctx, step)                               // Checkpoint() on every worker, committed as one
//
// Inside a worker, Receive gets a *Context: its rank, its GPUs, AllReduce among the gang, and
// Put/Get on its machine's store. A worker that implements Checkpointer is restored from the
// gang's newest complete checkpoint whenever the gang restarts.
//
// Go cannot ship closures to other processes, so actor kinds are registered by name in the
// program, and the same binary runs the driver and the workers.
package sdk
