// Package sdk is the Go API a program uses to run on Atoll: tasks, actors, gangs of workers
// on GPUs, objects, and waiting on any of them. A program needs no other Atoll package.
//
// # Starting
//
// Start connects to the cluster named by ATOLL_ADDRESS (or WithAddress). The embedded
// default (three heads and four simulated 8-GPU machines in this process) is opt-in:
// local.Start, from package sdk/local, connects the same way and otherwise starts it, so the
// same program runs unchanged on both. A program that imports only sdk links the client
// side alone (API client, actor system, object client, worker mode): no head, Paxos or
// agent. Go cannot ship closures to other processes, so a program declares its actor kinds
// and tasks by name when it starts, and on a cluster the agents run this same executable as
// its workers: main begins by serving the worker when it is one (WorkerMain returns the
// exit status; the library never exits the process).
//
//	var square = sdk.Task("square", func(ctx *sdk.Context, x int) (int, error) { return x * x, nil })
//
//	func kinds() []sdk.Option {
//		return []sdk.Option{sdk.Tasks(square),
//			sdk.Kind("counter", func() sdk.Actor { return &Counter{} }, Incr{}),
//			sdk.KindOf("trainer", NewTrainer, Step{})} // NewTrainer(args TrainerArgs) sdk.Actor
//	}
//
//	func main() {
//		if sdk.InWorker() {
//			os.Exit(sdk.WorkerMain(kinds()...))
//		}
//		ctx := context.Background()
//		c, err := local.Start(ctx, kinds()...) // or sdk.Start: clusters only
//		if err != nil { ... }
//		defer c.Shutdown(ctx)
//		job, err := c.Submit(ctx, sdk.JobSpec{Name: "demo"})
//		...
//	}
//
// # Tasks
//
// A task is a stateless function run on a worker of the cluster with its resources (one
// CPU by default), as Ray's remote functions are. Remote returns a Future at once; a task
// whose worker fails runs again elsewhere (TaskOptions.MaxRetries); an error the function
// returns is its result. Task workers are pooled per job and shape of resources, reused, and
// stopped when idle.
//
//	var fs []*sdk.Future[int]
//	for i := range 100 {
//		fs = append(fs, square.Remote(ctx, job, i))
//	}
//	gpu := train.With(sdk.TaskOptions{Resources: sdk.Resources{GPUs: 1, GPUMilli: 250}}) // a quarter GPU
//	score, err := gpu.Remote(ctx, job, trial).Await(ctx)
//
// # Futures and Wait
//
// A Future (a call's reply or a task's result) can be awaited any number of times, from any
// goroutine. Wait returns the first n ready, as ray.wait does:
//
//	ready, pending, err := sdk.Wait(ctx, fs, 10)
//	for _, i := range ready {
//		v, err := fs[i].Await(ctx) // at once
//	}
//
// Cancelling the context given to Remote or CallAsync cancels the run: the handler's or
// function's Context is cancelled too, in whatever process it runs.
//
// # Actors
//
// An actor is a value of a registered kind that handles one message at a time (Receive).
// Job.SpawnActor places one on a machine with its resources and restarts it on failure;
// its ref is a handle whose calls go to its current incarnation. Detached actors outlive
// their job and driver; any driver finds them with Lookup. Refs cross processes: pass them
// in messages and constructor arguments. Inside Receive, the *Context is a context.Context
// carrying the caller's deadline and cancellation, and a Caller and Host of its own: an
// actor calls, spawns, runs tasks (Context.Job), puts and gets.
//
//	ps, err := job.SpawnActor(ctx, sdk.ActorSpec{Name: "ps", Kind: "ps", Resources: sdk.Resources{CPUMilli: 2000}})
//	n, err := sdk.Call[int](ctx, c, ps, Incr{})
//	reg, err := job.SpawnActor(ctx, sdk.ActorSpec{Name: "registry", Kind: "registry", Detached: true})
//	same, err := sdk.Lookup(ctx, otherDriver, "registry")
//
// # Gangs
//
// A gang is Workers actors placed all-or-nothing (whole GPUs, a share of one, a MIG slice,
// CPU and memory each; SameIsland or a Strategy: Pack, Spread, StrictPack, StrictSpread;
// Machines pins them to named machines), restarted all-for-one when one fails, from the
// gang's newest checkpoint (workers that implement Checkpointer). Calls to a worker of an
// ended incarnation fail with ErrStale; a gang that used up its restarts fails with
// ErrGangFailed and frees its GPUs; Stop frees them at once.
//
//	g, err := job.SpawnGang(ctx, sdk.GangSpec{Name: "dp", Kind: "trainer", Args: TrainerArgs{Data: ref},
//		Workers: 16, GPUsPerWorker: 1, MaxRestarts: 3})
//	loss, err := sdk.Call[float64](ctx, c, g.Worker(0), Step{N: 1}) // inside: ctx.AllReduce(ctx, grads)
//	err = g.Checkpoint(ctx, step)                                 // every worker's state, committed as one
//	parts, step, err := g.ReadCheckpoint(ctx, -1)                 // and read back
//
// Inside a gang worker, the Context runs collectives with the other workers: AllReduce,
// AllGather and ReduceScatter (on shards: Shard), Broadcast, Barrier, and AllReduceAsync
// and Buckets (DDP's gradient buckets) that return a Pending to wait for while the next
// computation runs. Workers that share a machine, a process each, meet in its shared
// memory; one ring per rail crosses machines, over mutual TLS.
//
//	b, _ := c.Buckets(c, 25<<20)
//	for _, g := range layerGrads { pending = append(pending, b.Add(c, g)) } // as backward yields them
//	b.Flush(c)                                                             // then Wait on each
//
// # Services
//
// A service (Job.SpawnService) is MinReplicas..MaxReplicas replicas of one kind that serve
// the program's own requests: CallService routes each call to the ready replica with the
// fewest calls in flight, following the service's scaling. The replicas' workers report
// their load (calls in flight, latency; Context.ReportLoad for a replica serving requests
// of its own), and the cluster's leader scales the service from it, with cooldowns and a
// hysteresis band so that it does not oscillate. The first MinReplicas replicas are never
// preempted; the others take GPUs from gangs of a lower priority through the scheduler's
// preemption (an elastic gang shrinks, another checkpoints and stops, by notice), and give
// them back when the load falls (a shrunk gang grows again).
//
//	svc, _ := job.SpawnService(ctx, sdk.ServiceSpec{Name: "infer", Kind: "model",
//		MinReplicas: 2, MaxReplicas: 4, GPUsPerReplica: 1, LatencySLO: 200 * time.Millisecond, Priority: 10})
//	reply, err := sdk.CallService[Reply](ctx, svc, Request{Prompt: p})
//
// # Objects
//
// Put stores an immutable value in the cluster's object store and returns a typed Ref that
// crosses processes; Get fetches it (pulling it to the caller's machine), View lends its
// bytes without copying. An object belongs to who put it and goes with it (a driver's when
// it disconnects, a worker's when its incarnation ends, a task's when its job stops) unless
// Detached; Free drops it at once. Objects larger than their store are stored in parts that
// spill to disk.
//
//	ref, err := sdk.Put(ctx, c, dataset)
//	data, err := sdk.Get(ctx, workerCtx, ref)
//
// # Errors
//
// Every error wraps one of the sentinels below (ErrStale, ErrNoCapacity, ErrUnknownKind,
// ...), across processes too; a cancelled context's error satisfies errors.Is(err,
// context.Canceled).
//
// Tests can run a program on a cluster of real processes with package sdktest.
package sdk
