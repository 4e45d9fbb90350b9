package sdk_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/atoll-run/atoll/internal/testtime"
	"github.com/atoll-run/atoll/sdk"
	"github.com/atoll-run/atoll/sdk/local"
	"github.com/atoll-run/atoll/sdk/sdktest"
)

// testOptions are the kinds and tasks of this test program: its worker processes (on a
// cluster of processes) register them as the driver does.
func testOptions() []sdk.Option {
	return append([]sdk.Option{
		sdk.Kind("summer", func() sdk.Actor { return summer{} }, sumReq{}),
		sdk.Kind("echo", func() sdk.Actor { return echo{} }),
		sdk.Kind("fetcher", func() sdk.Actor { return fetcher{} }, sdk.Ref[point]{}),
		sdk.Kind("sizer", func() sdk.Actor { return sizer{} }, sdk.Ref[[]byte]{}),
		sdk.Kind("keeper", func() sdk.Actor { return &keeper{} }, tick{}),
		sdk.KindOf("greeter", func(a greeting) sdk.Actor { return greeter{a} }, tick{}),
		sdk.KindOf("forwarder", func(a forwardArgs) sdk.Actor { return forwarder{a} }, tick{}),
		sdk.Kind("stepper", func() sdk.Actor { return &stepper{} }, stepReq{}, stateReq{}),
		sdk.Kind("logging", func() sdk.Actor { return logging{} }, logStep{}),
		sdk.Kind("collector", func() sdk.Actor { return collector{} }, collReq{}),
		sdk.Kind("givingup", func() sdk.Actor { return givingUp{} }, givenUpReq{}),
		sdk.Tasks(square, where, crashOnce, failing, putBytes, putPattern, spawnFromTask, rendezvous, fanOut),
	}, append(semanticsOptions(), serviceOptions()...)...)
}

func TestMain(m *testing.M) {
	if sdk.InWorker() { // an agent started this test binary as a worker: serve it
		os.Exit(sdk.WorkerMain(testOptions()...))
	}
	os.Exit(sdktest.Run(m))
}

func newCluster(t *testing.T, opts ...sdk.Option) *sdk.Cluster {
	t.Helper()
	ctx := context.Background()
	c, err := local.Cluster(ctx, append(append([]sdk.Option{sdk.WithLogger(zaptest.NewLogger(t)), sdk.WithCallTimeout(testtime.Scale(10 * time.Second))},
		testOptions()...), opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	return c
}

// testContext bounds a test's waits: a minute on a quiet machine, scaled to this one
// (testtime), ending with the test.
func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := testtime.Context(t, time.Minute)
	t.Cleanup(cancel)
	return ctx
}

type sumReq struct{ N int }

// summer AllReduces a vector made from its rank and returns the result.
type summer struct{}

func (summer) Receive(c *sdk.Context, msg any) (any, error) {
	n := msg.(sumReq).N
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(c.Rank() + i)
	}
	ctx, cancel := context.WithTimeout(c, testtime.Scale(10*time.Second))
	defer cancel()
	err := c.AllReduce(ctx, v)
	return v, err
}

func TestGangPlacementAndAllReduce(t *testing.T) {
	c := newCluster(t)
	ctx := testContext(t)
	job, err := c.Submit(ctx, sdk.JobSpec{Name: "j"})
	if err != nil {
		t.Fatal(err)
	}
	var gangs []*sdk.Gang
	for i := 0; i < 4; i++ { // four islands of eight
		g, err := job.SpawnGang(ctx, sdk.GangSpec{Name: fmt.Sprint("g", i), Kind: "summer", Workers: 8, GPUsPerWorker: 1, SameIsland: true})
		if err != nil {
			t.Fatalf("gang %d: %v", i, err)
		}
		if p := g.Placement(); p.Islands != 1 || len(p.Members) != 8 || len(p.Machines) != 1 {
			t.Fatalf("gang %d placed on %d islands, machines %v; want one island of 8", i, p.Islands, p.Machines)
		}
		gangs = append(gangs, g)
	}
	seen := map[string]bool{}
	for _, g := range gangs {
		m := g.Placement().Machines[0]
		if seen[m] {
			t.Fatalf("two gangs share machine %s", m)
		}
		seen[m] = true
	}
	st, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range st.Machines {
		if m.FreeGPUs != 0 {
			t.Fatalf("machine %s has %d free GPUs, want 0", m.Name, m.FreeGPUs)
		}
	}
	// A gang on a full cluster waits in its queue (with the scheduler's reason) instead of
	// being refused, and starts when a gang ends; a wait cut short withdraws it.
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	if _, err := job.SpawnGang(short, sdk.GangSpec{Name: "late", Kind: "summer", Workers: 1, GPUsPerWorker: 1}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("gang on a full cluster, waited 300 ms: %v, want the deadline", err)
	}
	cancelShort()
	type spawned struct {
		g   *sdk.Gang
		err error
	}
	late := make(chan spawned, 1)
	go func() {
		g, err := job.SpawnGang(ctx, sdk.GangSpec{Name: "late", Kind: "summer", Workers: 1, GPUsPerWorker: 1})
		late <- spawned{g, err}
	}()
	for waiting := false; !waiting; {
		st, err := c.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, gs := range st.Gangs {
			waiting = waiting || (gs.Name == "late" && gs.State == "pending" && gs.Reason != "")
		}
		select {
		case r := <-late:
			t.Fatalf("the gang on a full cluster returned before any capacity freed: %v, %v", r.g, r.err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	if err := gangs[3].Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if r := <-late; r.err != nil || r.g.Placement().Machines[0] != gangs[3].Placement().Machines[0] {
		t.Fatalf("the waiting gang after a gang stopped: %v on %v, want it on the freed machine", r.err, r.g)
	}
	g := gangs[1]
	fs := make([]*sdk.Future[[]float32], g.Size())
	for r := range fs {
		fs[r] = sdk.CallAsync[[]float32](ctx, c, g.Worker(r), sumReq{N: 5})
	}
	for r, f := range fs {
		v, err := f.Await(ctx)
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
		for i, x := range v {
			if want := float32(28 + 8*i); x != want { // sum of ranks 0..7 = 28
				t.Fatalf("rank %d: v[%d] = %v, want %v", r, i, x, want)
			}
		}
	}
	// A gang stops and frees its GPUs; the job stops the rest.
	if err := gangs[0].Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := job.SpawnGang(ctx, sdk.GangSpec{Name: "after", Kind: "summer", Workers: 8, GPUsPerWorker: 1, SameIsland: true}); err != nil {
		t.Fatalf("after a gang stopped its island must be free: %v", err)
	}
	if err := job.Stop(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestBadRequestsAreRejectedWithReasons(t *testing.T) {
	c := newCluster(t)
	ctx := testContext(t)
	job, err := c.Submit(ctx, sdk.JobSpec{Name: "bad"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		spec sdk.GangSpec
		want error
		text string
	}{
		{"larger than cluster", sdk.GangSpec{Name: "a", Kind: "summer", Workers: 40, GPUsPerWorker: 1}, sdk.ErrNeverFits, "40"},
		{"larger than island", sdk.GangSpec{Name: "a", Kind: "summer", Workers: 9, GPUsPerWorker: 1, SameIsland: true}, sdk.ErrNeverFits, "island"},
		{"negative GPUs", sdk.GangSpec{Name: "a", Kind: "summer", Workers: 2, GPUsPerWorker: -1}, sdk.ErrInvalid, "negative"},
		{"zero workers", sdk.GangSpec{Name: "a", Kind: "summer", Workers: 0, GPUsPerWorker: 1}, sdk.ErrInvalid, "0 workers"},
		{"too many GPUs per worker", sdk.GangSpec{Name: "a", Kind: "summer", Workers: 1, GPUsPerWorker: 9}, sdk.ErrNeverFits, "9"},
		{"unknown kind", sdk.GangSpec{Name: "a", Kind: "nobody", Workers: 1, GPUsPerWorker: 1}, sdk.ErrUnknownKind, `"nobody"`},
		{"bad name", sdk.GangSpec{Name: "../a", Kind: "summer", Workers: 1, GPUsPerWorker: 1}, sdk.ErrInvalid, "[A-Za-z0-9._-]"},
		{"unserializable args", sdk.GangSpec{Name: "a", Kind: "greeter", Workers: 1, Args: func() {}}, sdk.ErrUnserializable, "func"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := job.SpawnGang(ctx, tc.spec)
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.text) {
				t.Fatalf("err = %v; want %v mentioning %q", err, tc.want, tc.text)
			}
		})
	}
	st, _ := c.Status(ctx)
	for _, m := range st.Machines {
		if m.FreeGPUs != m.GPUs {
			t.Fatalf("a rejected gang holds GPUs on %s: %d of %d free", m.Name, m.FreeGPUs, m.GPUs)
		}
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := job.SpawnGang(cancelled, sdk.GangSpec{Name: "c", Kind: "summer", Workers: 1, GPUsPerWorker: 1}); !errors.Is(err, context.Canceled) {
		t.Fatalf("SpawnGang with a cancelled context: %v", err)
	}
	if _, err := sdk.Put(cancelled, c, []byte("x")); !errors.Is(err, context.Canceled) {
		t.Fatalf("Put with a cancelled context: %v", err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "cluster.json")
	_ = os.WriteFile(path, []byte("{\"machines\": [\n  {\"type\": \"dgx-h100\", \"count\": 2,}\n]}\n"), 0o644)
	if _, err := local.Cluster(ctx, sdk.WithSpec(path)); err == nil || !strings.Contains(err.Error(), path+":2:") {
		t.Fatalf("malformed spec file: %v; want the file and line", err)
	}
	if _, err := local.Cluster(ctx, sdk.WithSpec("4xdgx-h1000")); err == nil || !strings.Contains(err.Error(), "dgx-h1000") {
		t.Fatalf("unknown machine type: %v", err)
	}
	if _, err := local.Cluster(ctx, sdk.Kind("k", func() sdk.Actor { return echo{} }, struct{ f func() }{})); !errors.Is(err, sdk.ErrUnserializable) {
		t.Fatalf("a message type that cannot cross processes: %v", err)
	}
}

type echo struct{}

func (echo) Receive(_ *sdk.Context, msg any) (any, error) { return msg, nil }

func TestCallStoppedActorFailsFast(t *testing.T) {
	c := newCluster(t)
	ctx := testContext(t)
	job, _ := c.Submit(ctx, sdk.JobSpec{Name: "s"})
	g, err := job.SpawnGang(ctx, sdk.GangSpec{Name: "e", Kind: "echo", Workers: 2, GPUsPerWorker: 1})
	if err != nil {
		t.Fatal(err)
	}
	if v, err := sdk.Call[string](ctx, c, g.Worker(1), "hi"); err != nil || v != "hi" {
		t.Fatalf("call: %q %v", v, err)
	}
	w := g.Worker(1)
	if err := job.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := sdk.Call[string](ctx, c, w, "hi"); !errors.Is(err, sdk.ErrStale) && !errors.Is(err, sdk.ErrActorDead) {
		t.Fatalf("call to a stopped worker: %v, want ErrStale or ErrActorDead", err)
	}
}

type point struct {
	X, Y int
	Tag  string
}

// fetcher Gets a ref on its own machine.
type fetcher struct{}

func (fetcher) Receive(c *sdk.Context, msg any) (any, error) {
	return sdk.Get(c, c, msg.(sdk.Ref[point]))
}

func TestObjectsTypedAcrossMachines(t *testing.T) {
	c := newCluster(t)
	ctx := testContext(t)
	r, err := sdk.Put(ctx, c, point{1, 2, "p"})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := sdk.Get(ctx, c, r); err != nil || got != (point{1, 2, "p"}) {
		t.Fatalf("Get = %+v, %v", got, err)
	}
	fr, _ := sdk.Put(ctx, c, []float32{1.5, -2, 3})
	if got, err := sdk.Get(ctx, c, fr); err != nil || len(got) != 3 || got[1] != -2 {
		t.Fatalf("float32 Get = %v, %v", got, err)
	}
	// A worker on another machine pulls the driver's object to its own machine.
	job, _ := c.Submit(ctx, sdk.JobSpec{Name: "o"})
	other := otherMachine(t, c)
	g, err := job.SpawnGang(ctx, sdk.GangSpec{Name: "f", Kind: "fetcher", Workers: 1, GPUsPerWorker: 1, Machines: []string{other}})
	if err != nil {
		t.Fatal(err)
	}
	if m := g.Placement().Members[0].Machine; m != other {
		t.Fatalf("fetcher pinned to %s placed on %s", other, m)
	}
	got, err := sdk.Call[point](ctx, c, g.Worker(0), r)
	if err != nil || got.Tag != "p" {
		t.Fatalf("remote Get = %+v, %v", got, err)
	}
	if err := sdk.Free(ctx, c, r); err != nil {
		t.Fatal(err)
	}
	if _, err := sdk.Get(ctx, c, r); !errors.Is(err, sdk.ErrUnknownObject) {
		t.Fatalf("Get after Free: %v", err)
	}
}

// otherMachine names a machine of the embedded cluster other than the driver's: the driver
// keeps its objects in the first machine's store.
func otherMachine(t *testing.T, c *sdk.Cluster) string {
	t.Helper()
	ms, err := c.Machines(testContext(t))
	if err != nil || len(ms) < 2 {
		t.Fatalf("machines %v, %v: the test needs two", ms, err)
	}
	return ms[len(ms)-1].Name
}

type tick struct{}

// keeper checkpoints a counter.
type keeper struct{ n int }

func (k *keeper) Receive(*sdk.Context, any) (any, error) { k.n++; return k.n, nil }
func (k *keeper) Checkpoint() ([]byte, error)            { return []byte{byte(k.n)}, nil }
func (k *keeper) Restore(b []byte) error                 { k.n = int(b[0]); return nil }

func TestRestartRestoresFromTheCommittedCheckpoint(t *testing.T) {
	c := newCluster(t)
	ctx := testContext(t)
	job, err := c.Submit(ctx, sdk.JobSpec{Name: "logged"})
	if err != nil {
		t.Fatal(err)
	}
	g, err := job.SpawnGang(ctx, sdk.GangSpec{Name: "k", Kind: "keeper", Workers: 2, GPUsPerWorker: 1, SameIsland: true, MaxRestarts: 1})
	if err != nil {
		t.Fatal(err)
	}
	for r := 0; r < 2; r++ {
		if _, err := sdk.Call[int](ctx, c, g.Worker(r), tick{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := g.Checkpoint(ctx, 1); err != nil {
		t.Fatal(err)
	}
	defer func() { // done: its checkpoints go, records and parts
		if err := g.DropCheckpoints(ctx); err != nil {
			t.Errorf("DropCheckpoints: %v", err)
		}
		if _, ok, err := g.LatestCheckpoint(ctx); ok || err != nil {
			t.Errorf("a checkpoint after DropCheckpoints: %v %v", ok, err)
		}
	}()
	for r := 0; r < 2; r++ { // progress after the checkpoint, lost by the restart
		if _, err := sdk.Call[int](ctx, c, g.Worker(r), tick{}); err != nil {
			t.Fatal(err)
		}
	}
	old := g.Worker(1)
	if err := g.Kill(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if gen, err := g.AwaitRunning(ctx, 1); err != nil || gen != 1 {
		t.Fatalf("after the kill: generation %d, %v", gen, err)
	}
	if g.Restarts() != 1 {
		t.Fatalf("restarts = %d", g.Restarts())
	}
	if n, err := sdk.Call[int](ctx, c, g.Worker(1), tick{}); err != nil || n != 2 {
		t.Fatalf("after restore from the checkpoint (n=1), a tick gives %d, %v; want 2", n, err)
	}
	if _, err := sdk.Call[int](ctx, c, old, tick{}); !errors.Is(err, sdk.ErrStale) {
		t.Fatalf("a call to a worker of the ended generation: %v, want ErrStale", err)
	}
	// Past MaxRestarts the gang fails and frees its GPUs.
	if err := g.Kill(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := g.AwaitRunning(ctx, 2); !errors.Is(err, sdk.ErrGangFailed) {
		t.Fatalf("a gang past its restarts: %v, want ErrGangFailed", err)
	}
	if _, err := job.SpawnGang(ctx, sdk.GangSpec{Name: "k2", Kind: "keeper", Workers: 32, GPUsPerWorker: 1}); err != nil {
		t.Fatalf("the failed gang's GPUs must be free: %v", err)
	}
}

// TestCheckpointOfAnEndedGenerationIsNotCommitted: a checkpoint whose parts the workers of
// one generation gave is not committed once the gang has restarted (its new workers have
// restored from the checkpoint before it, each on its own: a commit among their restores
// would leave ranks at different steps). The hook restarts the gang between the parts and
// the commit.
func TestCheckpointOfAnEndedGenerationIsNotCommitted(t *testing.T) {
	c := newCluster(t)
	ctx := testContext(t)
	job, err := c.Submit(ctx, sdk.JobSpec{Name: "late"})
	if err != nil {
		t.Fatal(err)
	}
	g, err := job.SpawnGang(ctx, sdk.GangSpec{Name: "k", Kind: "keeper", Workers: 2, GPUsPerWorker: 1, MaxRestarts: 2})
	if err != nil {
		t.Fatal(err)
	}
	tickAll := func(want int) {
		t.Helper()
		for r := 0; r < 2; r++ {
			if n, err := sdk.Call[int](ctx, c, g.Worker(r), tick{}); err != nil || n != want {
				t.Fatalf("rank %d: tick gives %d, %v; want %d", r, n, err, want)
			}
		}
	}
	tickAll(1)
	if err := g.Checkpoint(ctx, 1); err != nil {
		t.Fatal(err)
	}
	tickAll(2)
	restarted := false
	defer sdk.SetCheckpointCommitHook(func(h *sdk.Gang) {
		if h != g || restarted {
			return
		}
		restarted = true
		if err := g.Kill(ctx, 0); err != nil {
			t.Error(err)
			return
		}
		if _, err := g.AwaitRunning(ctx, 1); err != nil {
			t.Error(err)
		}
	})()
	err = g.Checkpoint(ctx, 2)
	if !restarted {
		t.Fatal("the hook did not run")
	}
	if !errors.Is(err, sdk.ErrStale) {
		t.Fatalf("a checkpoint of generation 0 committed after the restart: %v, want ErrStale", err)
	}
	step, ok, err := g.LatestCheckpoint(ctx)
	if err != nil || !ok || step != 1 {
		t.Fatalf("the latest checkpoint: step %d, %v, %v; want step 1", step, ok, err)
	}
	tickAll(2) // both ranks restored from step 1
	if err := g.Checkpoint(ctx, 3); err != nil {
		t.Fatalf("a checkpoint of the new generation: %v", err)
	}
}

type greeting struct{ Name string }

type greeter struct{ g greeting }

func (g greeter) Receive(*sdk.Context, any) (any, error) { return "hello " + g.g.Name, nil }

func TestConstructorArguments(t *testing.T) {
	c := newCluster(t)
	ctx := testContext(t)
	job, _ := c.Submit(ctx, sdk.JobSpec{Name: "a"})
	g, err := job.SpawnGang(ctx, sdk.GangSpec{Name: "g", Kind: "greeter", Workers: 2, Args: greeting{"atoll"}, MaxRestarts: 2})
	if err != nil {
		t.Fatal(err)
	}
	if s, err := sdk.Call[string](ctx, c, g.Worker(1), tick{}); err != nil || s != "hello atoll" {
		t.Fatalf("greeting = %q, %v", s, err)
	}
	_ = g.Kill(ctx, 0)
	if _, err := g.AwaitRunning(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if s, err := sdk.Call[string](ctx, c, g.Worker(0), tick{}); err != nil || s != "hello atoll" {
		t.Fatalf("a restarted worker keeps its arguments: %q, %v", s, err)
	}
	a, err := c.Spawn(ctx, "greeter", "solo", greeting{"solo"})
	if err != nil {
		t.Fatal(err)
	}
	if s, err := sdk.Call[string](ctx, c, a, tick{}); err != nil || s != "hello solo" {
		t.Fatalf("standalone actor: %q, %v", s, err)
	}
}

func TestWait(t *testing.T) {
	c := newCluster(t)
	ctx := testContext(t)
	job, _ := c.Submit(ctx, sdk.JobSpec{Name: "w"})
	g, err := job.SpawnGang(ctx, sdk.GangSpec{Name: "e", Kind: "echo", Workers: 4})
	if err != nil {
		t.Fatal(err)
	}
	var fs []sdk.Waitable
	for r := 0; r < 4; r++ {
		fs = append(fs, sdk.CallAsync[string](ctx, c, g.Worker(r), "x"))
	}
	ready, pending, err := sdk.Wait(ctx, fs, 4)
	if err != nil || len(ready) != 4 || len(pending) != 0 {
		t.Fatalf("Wait all: %v %v %v", ready, pending, err)
	}
	never := make(chan struct{})
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	ready, pending, err = sdk.Wait(short, append(fs[:1:1], waitable(never)), 2)
	if !errors.Is(err, context.DeadlineExceeded) || len(ready) != 1 || len(pending) != 1 || pending[0] != 1 {
		t.Fatalf("Wait with one never ready: %v %v %v", ready, pending, err)
	}
}

type waitable chan struct{}

func (w waitable) Done() <-chan struct{} { return w }

// TestFreeRightAfterPut: an object freed as soon as Put returns (its record committed
// behind the put, by group commit) is freed everywhere: Get refuses it, and its store
// holds it no more.
func TestFreeRightAfterPut(t *testing.T) {
	c := newCluster(t)
	ctx := testContext(t)
	for i := 0; i < 20; i++ {
		r, err := sdk.Put(ctx, c, []byte{byte(i)})
		if err != nil {
			t.Fatal(err)
		}
		if err := sdk.Free(ctx, c, r); err != nil {
			t.Fatalf("put %d freed at once: %v", i, err)
		}
		if _, err := sdk.Get(ctx, c, r); !errors.Is(err, sdk.ErrUnknownObject) {
			t.Fatalf("put %d: Get after Free: %v", i, err)
		}
	}
	st, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Objects != nil && st.Objects.Live != 0 {
		t.Fatalf("%d live object records after every object was freed: %+v", st.Objects.Live, st.Objects)
	}
}
