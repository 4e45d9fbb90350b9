package sdk_test

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/atoll-run/atoll/internal/testtime"
	"github.com/atoll-run/atoll/sdk"
	"github.com/atoll-run/atoll/sdk/sdktest"
)

// These tests run on a cluster of real processes (sdktest.Up: `atoll up`): the agents run
// this test binary as the job's workers (TestMain serves them).

func connect(t *testing.T, cl *sdktest.Cluster) *sdk.Cluster {
	t.Helper()
	ctx, cancel := testtime.Context(t, time.Minute)
	defer cancel()
	c, err := sdk.Connect(ctx, cl.Address, append([]sdk.Option{sdk.WithLogger(zaptest.NewLogger(t)), sdk.WithCallTimeout(testtime.Scale(30 * time.Second))},
		testOptions()...)...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// raceDetector is set in a -race build (race_test.go).
var raceDetector bool

func TestClusterTasksDetachedActorsAndObjectOwners(t *testing.T) {
	if raceDetector {
		// Two drivers in one process: protoactor-go's remote.Start sets gRPC's global
		// logger (remote/server.go: grpclog.SetLoggerV2) each time, which races with the
		// first driver's gRPC logging. One driver per process, as in production, has no
		// such race; the test runs without -race.
		t.Skip("two actor systems with remoting in one process race inside protoactor-go (grpclog.SetLoggerV2 in remote.Start); run without -race")
	}
	cl := sdktest.Up(t, 2, "")
	ctx, cancel := testtime.Context(t, 3*time.Minute)
	defer cancel()
	c1 := connect(t, cl)
	job, err := c1.Submit(ctx, sdk.JobSpec{Name: "first"})
	if err != nil {
		t.Fatal(err)
	}
	// Tasks run in worker processes, on their resources.
	var fs []*sdk.Future[int]
	for i := 0; i < 6; i++ {
		fs = append(fs, square.Remote(ctx, job, i))
	}
	for i, f := range fs {
		if v, err := f.Await(ctx); err != nil || v != i*i {
			t.Fatalf("task %d: %d, %v", i, v, err)
		}
	}
	if v, err := crashOnce.Remote(ctx, job, 1).Await(ctx); err != nil || v != 2 {
		t.Fatalf("a task whose worker process crashed once: %d, %v", v, err)
	}
	m, err := where.With(sdk.TaskOptions{Resources: sdk.Resources{GPUs: 2}}).Remote(ctx, job, struct{}{}).Await(ctx)
	if err != nil || len(m.GPUs) != 2 {
		t.Fatalf("a two-GPU task ran on %+v, %v", m, err)
	}
	// A worker process's large puts (in place, in its machine's shared memory).
	big, err := putPattern.Remote(ctx, job, 3<<20+5).Await(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := sdk.Get(ctx, c1, big); err != nil || len(b) != 3<<20+5 {
		t.Fatalf("a worker's large put: %d bytes, %v", len(b), err)
	} else {
		for i, x := range b {
			if x != byte(i%251) {
				t.Fatalf("byte %d of a worker's large put is %d, want %d", i, x, i%251)
			}
		}
	}
	// A detached actor and a detached object outlive the driver; its other objects do not.
	reg, err := job.SpawnActor(ctx, sdk.ActorSpec{Name: "registry", Kind: "keeper", Detached: true, Resources: sdk.Resources{CPUMilli: 100}})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := sdk.Call[int](ctx, c1, reg, tick{}); err != nil || n != 1 {
		t.Fatalf("tick: %d, %v", n, err)
	}
	kept, err := sdk.Put(ctx, c1, []byte("kept"), sdk.Detached())
	if err != nil {
		t.Fatal(err)
	}
	gone, err := sdk.Put(ctx, c1, []byte("gone"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c1.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}

	c2 := connect(t, cl)
	defer c2.Shutdown(context.Background())
	found, err := sdk.Lookup(ctx, c2, "registry")
	if err != nil {
		t.Fatal(err)
	}
	if n, err := sdk.Call[int](ctx, c2, found, tick{}); err != nil || n != 2 {
		t.Fatalf("the detached actor from another driver: %d, %v", n, err)
	}
	if b, err := sdk.Get(ctx, c2, kept); err != nil || string(b) != "kept" {
		t.Fatalf("a detached object after its driver left: %q, %v", b, err)
	}
	if _, err := sdk.Get(ctx, c2, gone); err == nil {
		t.Fatalf("a driver's object outlived the driver")
	}
	st, err := c2.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range st.Gangs {
		if g.Job == "first" && g.State == "running" {
			t.Fatalf("gang %s of the first driver's job runs after the driver left", g.Name)
		}
	}
	if err := sdk.StopActor(ctx, c2, found); err != nil {
		t.Fatal(err)
	}
	if err := sdk.Free(ctx, c2, kept); err != nil {
		t.Fatal(err)
	}
}

// TestClusterCollectiveFailureIsStaleOnEveryRank crashes one rank of a 16-worker gang across
// two machines in the middle of an AllReduce, several times: every surviving rank must
// answer ErrStale, whichever machine it is on.
func TestClusterCollectiveFailureIsStaleOnEveryRank(t *testing.T) {
	cl := sdktest.Up(t, 2, "")
	ctx, cancel := testtime.Context(t, 4*time.Minute)
	defer cancel()
	c := connect(t, cl)
	defer c.Shutdown(context.Background())
	job, err := c.Submit(ctx, sdk.JobSpec{Name: "stale"})
	if err != nil {
		t.Fatal(err)
	}
	g, err := job.SpawnGang(ctx, sdk.GangSpec{Name: "g", Kind: "stepper", Workers: 16, GPUsPerWorker: 1, MaxRestarts: 10,
		Backoff: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if ms := g.Placement().Machines; len(ms) != 2 {
		t.Fatalf("gang on machines %v, want two", ms)
	}
	pids := map[int]bool{}
	for _, w := range g.Workers() {
		pids[w.PID] = true
	}
	if len(pids) != 16 || pids[os.Getpid()] {
		t.Fatalf("%d worker processes, want 16 besides this one", len(pids))
	}
	step := func(crash int) []error {
		// Every call goes to the same incarnation: the references are taken before the
		// first call, since the crash may restart the gang while the calls go out (a
		// reference taken then names the next generation, whose workers are not up yet).
		refs := make([]sdk.ActorRef, g.Size())
		for r := range refs {
			refs[r] = g.Worker(r)
		}
		fs := make([]*sdk.Future[[]float32], len(refs))
		for r := range fs {
			fs[r] = sdk.CallAsync[[]float32](ctx, c, refs[r], stepReq{Crash: crash})
		}
		errs := make([]error, len(fs))
		for r, f := range fs {
			v, err := f.Await(ctx)
			if err == nil && (len(v) != 2 || v[0] != 120 || v[1] != 16) {
				err = errors.New("wrong sum")
			}
			errs[r] = err
		}
		return errs
	}
	for round := 0; round < 3; round++ {
		gen := g.Generation()
		for r, err := range step(-1) {
			if err != nil {
				t.Fatalf("round %d: a step without failure: rank %d: %v", round, r, err)
			}
		}
		crash := 3 + 5*round // ranks on either machine
		for r, err := range step(crash) {
			if r != crash && !errors.Is(err, sdk.ErrStale) {
				t.Errorf("round %d: rank %d (machine %s) after rank %d crashed: %v; want ErrStale", round, r, g.Placement().Members[r].Machine, crash, err)
			}
		}
		if _, err := g.AwaitRunning(ctx, gen+1); err != nil {
			t.Fatal(err)
		}
	}
}
