// Package actors is Atoll's actor layer on protoactor-go: actor kinds registered by name on a
// System (no global registry), job trees (a job root, one all-for-one supervisor per gang, the
// gang's workers), typed request/response calls that return futures and honour
// context.Context, and supervision with bounded restarts and backoff.
//
// A sketch:
//
//	sys, _ := actors.NewSystem(actors.Config{Logger: log})
//	defer sys.Shutdown(ctx)
//	_ = sys.Register("echo", func() actors.Handler { return echo{} })
//	job, _ := sys.NewJob("job-1")
//	g, _ := job.SpawnGang(ctx, actors.GangSpec{Name: "g", Kind: "echo", Size: 4, MaxRestarts: 3})
//	reply, err := actors.Call[string](ctx, sys, g.Worker(0), "hello")
//
// Handlers run one message at a time (the actor's mailbox serialises them). A Handler that
// panics fails its actor; in a gang the whole gang restarts together (all-for-one), bounded by
// GangSpec.MaxRestarts within GangSpec.RestartWindow, each restart after GangSpec.Backoff.
package actors
