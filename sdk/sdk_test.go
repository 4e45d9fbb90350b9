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

	"github.com/atoll-run/atoll/actors"
	"github.com/atoll-run/atoll/runtime"
	"github.com/atoll-run/atoll/sdk"
)

func newCluster(t *testing.T, opts ...sdk.Option) *sdk.Cluster {
	t.Helper()
	ctx := context.Background()
	c, err := sdk.Local(ctx, append([]sdk.Option{sdk.WithLogger(zaptest.NewLogger(t)), sdk.WithCallTimeout(10 * time.Second)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Shutdown(ctx) })
	return c
}

// summer AllReduces a vector made from its rank and returns the result.
type summer struct{}

func (summer) Receive(c *sdk.Context, msg any) (any, error) {
	n := msg.(int)
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(c.Rank() + i)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := c.AllReduce(ctx, v)
	return v, err
}

func TestGangPlacementAndAllReduce(t *testing.T) {
	c := newCluster(t)
	ctx := context.Background()
	if err := c.Register("summer", func() sdk.Actor { return summer{} }); err != nil {
		t.Fatal(err)
	}
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
		if p := g.Placement(); len(p.Islands) != 1 || len(p.GPUs()) != 8 {
			t.Fatalf("gang %d placed on islands %v with GPUs %v; want one island of 8", i, p.Islands, p.GPUs())
		}
		gangs = append(gangs, g)
	}
	seen := map[int]bool{}
	for _, g := range gangs {
		if seen[g.Placement().Islands[0]] {
			t.Fatalf("two gangs share island %d", g.Placement().Islands[0])
		}
		seen[g.Placement().Islands[0]] = true
	}
	if c.FreeGPUs() != 0 {
		t.Fatalf("free GPUs = %d, want 0", c.FreeGPUs())
	}
	_, err = job.SpawnGang(ctx, sdk.GangSpec{Name: "late", Kind: "summer", Workers: 1, GPUsPerWorker: 1})
	if !errors.Is(err, runtime.ErrNoCapacity) {
		t.Fatalf("gang on a full cluster: %v, want ErrNoCapacity", err)
	}
	// AllReduce across the gang's workers.
	g := gangs[1]
	fs := make([]sdk.Future[[]float32], g.Size())
	for r := range fs {
		fs[r] = sdk.CallAsync[[]float32](c, g.Worker(r), 5)
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
	if err := job.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if c.FreeGPUs() != 32 {
		t.Fatalf("after the job stopped, free GPUs = %d, want 32", c.FreeGPUs())
	}
}

func TestBadRequestsAreRejectedWithReasons(t *testing.T) {
	c := newCluster(t)
	ctx := context.Background()
	_ = c.Register("summer", func() sdk.Actor { return summer{} })
	job, _ := c.Submit(ctx, sdk.JobSpec{Name: "bad"})
	for _, tc := range []struct {
		name string
		spec sdk.GangSpec
		want error
		text string
	}{
		{"larger than cluster", sdk.GangSpec{Name: "a", Kind: "summer", Workers: 40, GPUsPerWorker: 1}, runtime.ErrNeverFits, "needs 40 GPUs (40 x 1) but the whole cluster has 32"},
		{"larger than island", sdk.GangSpec{Name: "a", Kind: "summer", Workers: 9, GPUsPerWorker: 1, SameIsland: true}, runtime.ErrNeverFits, "largest island has 8"},
		{"zero GPUs", sdk.GangSpec{Name: "a", Kind: "summer", Workers: 2, GPUsPerWorker: 0}, runtime.ErrInvalidRequest, "0 GPUs per member"},
		{"negative GPUs", sdk.GangSpec{Name: "a", Kind: "summer", Workers: 2, GPUsPerWorker: -1}, runtime.ErrInvalidRequest, "-1 GPUs per member"},
		{"zero workers", sdk.GangSpec{Name: "a", Kind: "summer", Workers: 0, GPUsPerWorker: 1}, runtime.ErrInvalidRequest, "0 members"},
		{"too many GPUs per worker", sdk.GangSpec{Name: "a", Kind: "summer", Workers: 1, GPUsPerWorker: 9}, runtime.ErrNeverFits, "largest machine has 8"},
		{"unknown kind", sdk.GangSpec{Name: "a", Kind: "nobody", Workers: 1, GPUsPerWorker: 1}, actors.ErrUnknownKind, `"nobody"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := job.SpawnGang(ctx, tc.spec)
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.text) {
				t.Fatalf("err = %v; want %v mentioning %q", err, tc.want, tc.text)
			}
			if c.FreeGPUs() != 32 {
				t.Fatalf("a rejected gang holds GPUs: %d free", c.FreeGPUs())
			}
		})
	}
	if _, err := c.Spawn("nobody", ""); !errors.Is(err, actors.ErrUnknownKind) {
		t.Fatalf("spawn unknown kind: %v", err)
	}
	if _, err := c.Actor("job-bad/gang-zz/w0"); !errors.Is(err, actors.ErrUnknownActor) {
		t.Fatalf("lookup unknown actor: %v", err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "cluster.json")
	_ = os.WriteFile(path, []byte("{\"machines\": [\n  {\"type\": \"dgx-h100\", \"count\": 2,}\n]}\n"), 0o644)
	if _, err := sdk.Local(ctx, sdk.WithSpec(path)); err == nil || !strings.Contains(err.Error(), path+":2:") {
		t.Fatalf("malformed spec file: %v; want the file and line", err)
	}
	if _, err := sdk.Local(ctx, sdk.WithSpec("4xdgx-h1000")); err == nil || !strings.Contains(err.Error(), "dgx-h1000") {
		t.Fatalf("unknown machine type: %v", err)
	}
	bad := runtime.SimulatedCluster(1, 4, "x", "y")
	bad.Machines[0].GPUs[2].Island = 7
	if _, err := sdk.Local(ctx, sdk.WithCluster(bad)); !errors.Is(err, runtime.ErrInvalidRequest) || !strings.Contains(err.Error(), "island 7") {
		t.Fatalf("malformed cluster: %v", err)
	}
}

type echo struct{}

func (echo) Receive(_ *sdk.Context, msg any) (any, error) { return msg, nil }

func TestCallStoppedActorFailsFast(t *testing.T) {
	c := newCluster(t)
	ctx := context.Background()
	_ = c.Register("echo", func() sdk.Actor { return echo{} })
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
	start := time.Now()
	if _, err := sdk.Call[string](ctx, c, w, "hi"); !errors.Is(err, actors.ErrActorDead) {
		t.Fatalf("call to stopped worker: %v", err)
	}
	if time.Since(start) > 2*time.Second {
		t.Fatal("a call to a stopped actor must fail fast")
	}
}

type point struct {
	X, Y int
	Tag  string
}

// fetcher Gets a ref on its own machine.
type fetcher struct{}

func (fetcher) Receive(c *sdk.Context, msg any) (any, error) {
	return sdk.Get(context.Background(), c, msg.(sdk.Ref[point]))
}

func TestObjectsTypedAcrossMachines(t *testing.T) {
	c := newCluster(t)
	ctx := context.Background()
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
	_ = c.Register("fetcher", func() sdk.Actor { return fetcher{} })
	job, _ := c.Submit(ctx, sdk.JobSpec{Name: "o"})
	if _, err := job.SpawnGang(ctx, sdk.GangSpec{Name: "fill", Kind: "fetcher", Workers: 8, GPUsPerWorker: 1, SameIsland: true}); err != nil {
		t.Fatal(err)
	}
	g, err := job.SpawnGang(ctx, sdk.GangSpec{Name: "f", Kind: "fetcher", Workers: 1, GPUsPerWorker: 1})
	if err != nil {
		t.Fatal(err)
	}
	if m := g.Placement().Members[0].Machine; m == 0 {
		t.Fatalf("fetcher placed on machine 0; the test needs another machine")
	}
	got, err := sdk.Call[point](ctx, c, g.Worker(0), r)
	if err != nil || got.Tag != "p" {
		t.Fatalf("remote Get = %+v, %v", got, err)
	}
	if err := sdk.Free(ctx, c, r); err != nil {
		t.Fatal(err)
	}
	if _, err := sdk.Get(ctx, c, r); !errors.Is(err, runtime.ErrUnknownObject) {
		t.Fatalf("Get after Free: %v", err)
	}
}

// keeper checkpoints a counter.
type keeper struct{ n int }

func (k *keeper) Receive(*sdk.Context, any) (any, error) { k.n++; return k.n, nil }
func (k *keeper) Checkpoint() ([]byte, error)            { return []byte{byte(k.n)}, nil }
func (k *keeper) Restore(b []byte) error                 { k.n = int(b[0]); return nil }

func TestDecisionsAreCommittedToThePaxosLog(t *testing.T) {
	c := newCluster(t)
	ctx := context.Background()
	if _, ok := c.Runtime().Meta().(*runtime.LogMeta); !ok {
		t.Fatalf("the embedded head's metadata store is %T, want the Paxos log", c.Runtime().Meta())
	}
	_ = c.Register("keeper", func() sdk.Actor { return &keeper{} })
	job, err := c.Submit(ctx, sdk.JobSpec{Name: "logged"})
	if err != nil {
		t.Fatal(err)
	}
	g, err := job.SpawnGang(ctx, sdk.GangSpec{Name: "k", Kind: "keeper", Workers: 2, GPUsPerWorker: 1, SameIsland: true, MaxRestarts: 1})
	if err != nil {
		t.Fatal(err)
	}
	for r := 0; r < 2; r++ {
		if _, err := sdk.Call[int](ctx, c, g.Worker(r), "tick"); err != nil {
			t.Fatal(err)
		}
	}
	if err := g.Checkpoint(ctx, 1); err != nil {
		t.Fatal(err)
	}
	m := c.Runtime().Meta()
	for _, want := range []struct{ table, prefix string }{
		{runtime.TableMachines, "dgx-h100-"}, {runtime.TableJobs, "logged"}, {runtime.TableGangs, "logged/k"},
		{runtime.TablePlacements, "logged/k"}, {runtime.TableCheckpoints, "logged/k/"}, {runtime.TableObjects, ""},
	} {
		kvs, err := m.List(ctx, want.table, want.prefix)
		if err != nil || len(kvs) == 0 {
			t.Errorf("metadata log has no %s%s* (%v)", want.table, want.prefix, err)
		}
	}
	// A gang restart restores every worker from the committed checkpoint.
	if err := g.Kill(0, "test"); err != nil {
		t.Fatal(err)
	}
	if _, err := g.AwaitRunning(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if n, err := sdk.Call[int](ctx, c, g.Worker(1), "tick"); err != nil || n != 2 {
		t.Fatalf("after restore from the checkpoint (n=1), a tick gives %d, %v; want 2", n, err)
	}
}
