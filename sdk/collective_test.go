package sdk_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/atoll-run/atoll/internal/testtime"
	"github.com/atoll-run/atoll/sdk"
	"github.com/atoll-run/atoll/sdk/sdktest"
)

type collReq struct{ N int }

// collector runs every collective of the Context on vectors made from its rank and checks
// each result exactly against what one process computes.
type collector struct{}

func (collector) Receive(c *sdk.Context, msg any) (any, error) {
	n, rank, length := c.Size(), c.Rank(), msg.(collReq).N
	vecs := make([][]float32, n)
	for r := range vecs {
		vecs[r] = make([]float32, length)
		for i := range vecs[r] {
			vecs[r][i] = float32(r*10 + i%7)
		}
	}
	vec := func(r int) []float32 { return append([]float32(nil), vecs[r]...) }
	check := func(what string, got []float32, lo, hi int, want func(i int) float32) error {
		for i := lo; i < hi; i++ {
			if got[i] != want(i) {
				return fmt.Errorf("rank %d %s: [%d] = %v, want %v", rank, what, i, got[i], want(i))
			}
		}
		return nil
	}
	sum := func(i int) float32 {
		var s float32
		for r := 0; r < n; r++ {
			s += vecs[r][i]
		}
		return s
	}
	v := make([]float32, length)
	lo, hi := c.Shard(length, rank)
	copy(v[lo:hi], vec(rank)[lo:hi])
	if err := c.AllGather(c, v); err != nil {
		return nil, err
	}
	for r := 0; r < n; r++ {
		rlo, rhi := c.Shard(length, r)
		if err := check("allgather", v, rlo, rhi, func(i int) float32 { return vecs[r][i] }); err != nil {
			return nil, err
		}
	}
	v = vec(rank)
	if err := c.ReduceScatter(c, v); err != nil {
		return nil, err
	}
	if err := check("reducescatter", v, lo, hi, sum); err != nil {
		return nil, err
	}
	v = vec(rank)
	if err := c.Broadcast(c, n-1, v); err != nil {
		return nil, err
	}
	if err := check("broadcast", v, 0, length, func(i int) float32 { return vecs[n-1][i] }); err != nil {
		return nil, err
	}
	if err := c.Barrier(c); err != nil {
		return nil, err
	}
	b, err := c.Buckets(c, 1<<10)
	if err != nil {
		return nil, err
	}
	grads := [][]float32{vec(rank), vec(rank)[:3], vec(rank)}
	var ps []*sdk.Pending
	for _, g := range grads {
		ps = append(ps, b.Add(c, g))
	}
	b.Flush(c)
	async := vec(rank)
	pa := c.AllReduceAsync(c, async)
	for i, p := range append(ps, pa) {
		if err := p.Wait(c); err != nil {
			return nil, fmt.Errorf("pending %d: %w", i, err)
		}
	}
	for _, g := range append(grads, async) {
		if err := check("bucketed allreduce", g, 0, len(g), sum); err != nil {
			return nil, err
		}
	}
	return nil, nil
}

// TestCollectives runs AllGather, ReduceScatter, Broadcast, Barrier, buckets and an
// asynchronous AllReduce in a gang of the embedded default (workers in the driver's
// process: the flat ring in memory); TestClusterCollectives in worker processes.
func TestCollectives(t *testing.T) {
	c := newCluster(t)
	ctx := testContext(t)
	job, err := c.Submit(ctx, sdk.JobSpec{Name: "coll"})
	if err != nil {
		t.Fatal(err)
	}
	g, err := job.SpawnGang(ctx, sdk.GangSpec{Name: "g", Kind: "collector", Workers: 5, GPUsPerWorker: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, length := range []int{3, 1000, 100003} {
		fs := make([]*sdk.Future[any], 5)
		for r := range fs {
			fs[r] = sdk.CallAsync[any](ctx, c, g.Worker(r), collReq{N: length})
		}
		for r, f := range fs {
			if _, err := f.Await(ctx); err != nil {
				t.Fatalf("length %d rank %d: %v", length, r, err)
			}
		}
	}

}

// TestClusterCollectives runs them in a gang of 8 worker processes on 2 machines of a
// cluster of processes: 4 to a machine, they meet in its shared memory, and the rails
// between the machines go over the transfer plane.
func TestClusterCollectives(t *testing.T) {
	clusterCollectives(t, sdktest.Up(t, 2, ""))
}

// TestClusterCollectivesTrustedFabric: on a cluster whose operator declared the fabric
// between machines trusted (atoll up --trusted-fabric), the collective links between
// machines run without TLS, and the collectives are as exact.
func TestClusterCollectivesTrustedFabric(t *testing.T) {
	if raceDetector {
		// Its driver would be the next in this process right after TestClusterCollectives'
		// driver: protoactor-go's remote.Start sets gRPC's global logger (grpclog.SetLoggerV2)
		// while the previous driver's endpoint writers may still log through it (CI saw the
		// race). It adds nothing the race detector checks that TestClusterCollectives does not.
		t.Skip("a second driver right after another races inside protoactor-go (grpclog.SetLoggerV2 in remote.Start); run without -race")
	}
	cl := sdktest.UpWith(t, 2, "", "--trusted-fabric")
	clusterCollectives(t, cl)
	logs, _ := filepath.Glob(filepath.Join(cl.Dir, "agents", "*", "logs", "coll", "g.*.log"))
	clear := 0
	for _, l := range logs {
		if b, err := os.ReadFile(l); err == nil && strings.Contains(string(b), "collective links without TLS") {
			clear++
		}
	}
	if clear != 8 {
		t.Fatalf("%d of 8 workers' logs (%d found) say their collective links run without TLS", clear, len(logs))
	}
}

func clusterCollectives(t *testing.T, cl *sdktest.Cluster) {
	ctx, cancel := testtime.Context(t, 3*time.Minute)
	defer cancel()
	c := connect(t, cl)
	defer c.Shutdown(context.Background())
	job, err := c.Submit(ctx, sdk.JobSpec{Name: "coll"})
	if err != nil {
		t.Fatal(err)
	}
	g, err := job.SpawnGang(ctx, sdk.GangSpec{Name: "g", Kind: "collector", Workers: 8, GPUsPerWorker: 2})
	if err != nil {
		t.Fatal(err)
	}
	per := map[string]int{}
	for _, m := range g.Placement().Members {
		per[m.Machine]++
	}
	if len(per) != 2 {
		t.Fatalf("gang on machines %v, want two", per)
	}
	for _, length := range []int{3, 100003} {
		fs := make([]*sdk.Future[any], 8)
		for r := range fs {
			fs[r] = sdk.CallAsync[any](ctx, c, g.Worker(r), collReq{N: length})
		}
		for r, f := range fs {
			if _, err := f.Await(ctx); err != nil {
				t.Fatalf("length %d rank %d: %v", length, r, err)
			}
		}
	}
}

// givenUpReq asks a worker for an AllReduce of Len copies of Value, bounded by Timeout.
type givenUpReq struct {
	Value   float32
	Len     int
	Timeout time.Duration
}

// givingUp runs one AllReduce per call, with the caller's deadline.
type givingUp struct{}

func (givingUp) Receive(c *sdk.Context, msg any) (any, error) {
	m := msg.(givenUpReq)
	ctx, cancel := context.WithTimeout(c, m.Timeout)
	defer cancel()
	v := make([]float32, m.Len)
	for i := range v {
		v[i] = m.Value
	}
	if err := c.AllReduce(ctx, v); err != nil {
		return nil, err
	}
	return v[0], nil
}

// TestCollectiveGivenUpWhileTheRingForms: a worker whose first collective's deadline passes
// while its world's communicator forms gives that collective up, and the communicator
// forms all the same; the rank that ran the collective sees it fail, and the next
// collective of both sums exactly. (CI once saw a 32-rank gang that never recovered from
// a ring that formed slowly: the rank that gave up formed its ring again, one collective
// behind the others, and the ranks met each other's collectives out of step.)
func TestCollectiveGivenUpWhileTheRingForms(t *testing.T) {
	c := newCluster(t)
	ctx := testContext(t)
	job, err := c.Submit(ctx, sdk.JobSpec{Name: "giveup"})
	if err != nil {
		t.Fatal(err)
	}
	g, err := job.SpawnGang(ctx, sdk.GangSpec{Name: "g", Kind: "givingup", Workers: 2, GPUsPerWorker: 1})
	if err != nil {
		t.Fatal(err)
	}
	// Rank 0 alone: its ring cannot form before rank 1 takes part.
	_, err = sdk.Call[float32](ctx, c, g.Worker(0), givenUpReq{Value: 1, Len: 4, Timeout: 200 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "still forming") {
		t.Fatalf("rank 0 alone: %v, want its collective given up while the ring forms", err)
	}
	// Rank 1 forms the ring with rank 0's formation, still under way, then runs the
	// collective rank 0 gave up: it waits for rank 0's part, which never comes.
	_, err = sdk.Call[float32](ctx, c, g.Worker(1), givenUpReq{Value: 2, Len: 4, Timeout: 2 * time.Second})
	if err == nil || !strings.Contains(err.Error(), "rank 0 never sent it") {
		t.Fatalf("rank 1 in the collective rank 0 gave up: %v, want it to wait for rank 0's part", err)
	}
	f0 := sdk.CallAsync[float32](ctx, c, g.Worker(0), givenUpReq{Value: 1, Len: 4, Timeout: time.Minute})
	f1 := sdk.CallAsync[float32](ctx, c, g.Worker(1), givenUpReq{Value: 2, Len: 4, Timeout: time.Minute})
	for r, f := range []*sdk.Future[float32]{f0, f1} {
		sum, err := f.Await(ctx)
		if err != nil || sum != 3 {
			t.Fatalf("rank %d: the next collective: %v %v, want the sum 3", r, sum, err)
		}
	}
}
