package sdk_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/atoll-run/atoll/internal/testtime"
	"github.com/atoll-run/atoll/sdk"
	"github.com/atoll-run/atoll/sdk/sdktest"
)

// serviceOptions are the kinds of the services tests: a replica that serves requests, and
// an elastic training worker that counts its steps and checkpoints them.
func serviceOptions() []sdk.Option {
	return []sdk.Option{
		sdk.Kind("replica", func() sdk.Actor { return replica{} }, serveReq{}),
		sdk.Kind("counter", func() sdk.Actor { return &counter{} }, trainStep{}, stepsReq{}),
	}
}

// serveReq is a request to a replica: Work is what serving it takes (the model's time).
type serveReq struct{ Work time.Duration }

type replica struct{}

func (replica) Receive(c *sdk.Context, msg any) (any, error) {
	m := msg.(serveReq)
	select {
	case <-time.After(m.Work):
	case <-c.Done():
		return nil, c.Err()
	}
	return c.Self().Name(), nil
}

// trainStep is one data-parallel step: every rank AllReduces a one and checks that the
// sum is the world's size, then counts the step.
type trainStep struct{ Step int64 }
type stepsReq struct{}

type counter struct{ steps int64 }

func (w *counter) Receive(c *sdk.Context, msg any) (any, error) {
	switch m := msg.(type) {
	case trainStep:
		if m.Step != w.steps {
			return nil, fmt.Errorf("rank %d at step %d was asked step %d", c.Rank(), w.steps, m.Step)
		}
		v := []float32{1}
		ctx, cancel := context.WithTimeout(c, testtime.Scale(30*time.Second))
		defer cancel()
		if err := c.AllReduce(ctx, v); err != nil {
			return nil, err
		}
		if int(v[0]) != c.Size() {
			return nil, fmt.Errorf("rank %d: the sum of ones is %v, the world %d", c.Rank(), v[0], c.Size())
		}
		w.steps++
		return w.steps, nil
	case stepsReq:
		return w.steps, nil
	}
	return nil, fmt.Errorf("counter got %T", msg)
}

func (w *counter) Checkpoint() ([]byte, error) { return binary.AppendVarint(nil, w.steps), nil }
func (w *counter) Restore(b []byte) error {
	n, k := binary.Varint(b)
	if k <= 0 {
		return errors.New("counter: bad checkpoint")
	}
	w.steps = n
	return nil
}

// training runs an elastic gang's steps until stop, taking its notices at step
// boundaries: it records the sizes it trained at and fails on any lost step.
type training struct {
	c     *sdk.Cluster
	g     *sdk.Gang
	step  int64
	mu    sync.Mutex
	sizes []int
}

func (tr *training) run(ctx context.Context, stop <-chan struct{}) error {
	for {
		select {
		case <-stop:
			return nil
		case n := <-tr.g.Notices():
			switch n.Kind {
			case sdk.NoticeShrink, sdk.NoticeGrow:
			default:
				return fmt.Errorf("training was given a %s notice (%s): a service must take a shrink", n.Kind, n.Reason)
			}
			if err := tr.g.Yield(ctx, n); err != nil {
				return fmt.Errorf("%s %d -> %d: %w", n.Kind, n.From, n.To, err)
			}
			tr.mu.Lock()
			tr.sizes = append(tr.sizes, tr.g.Size())
			tr.mu.Unlock()
			continue
		default:
		}
		size := tr.g.Size()
		fs := make([]*sdk.Future[int64], size)
		for r := range fs {
			fs[r] = sdk.CallAsync[int64](ctx, tr.c, tr.g.Worker(r), trainStep{Step: tr.step})
		}
		for r, f := range fs {
			if n, err := f.Await(ctx); err != nil || n != tr.step+1 {
				return fmt.Errorf("step %d, rank %d of %d: %d, %v", tr.step, r, size, n, err)
			}
		}
		tr.step++
	}
}

// runServiceBesideTraining is the scenario on one machine of eight GPUs: an
// elastic training gang of 4..6 workers beside a service of 2..4 replicas of a higher
// priority. A burst of requests scales the service to 4 replicas, which the scheduler
// makes room for by shrinking the training gang to 4 (no step lost: it takes the shrink at
// a step boundary); when the burst ends the service goes back to 2 and the training gang
// grows back to 6.
func runServiceBesideTraining(t *testing.T, c *sdk.Cluster, ctx context.Context) {
	job, err := c.Submit(ctx, sdk.JobSpec{Name: "mixed"})
	if err != nil {
		t.Fatal(err)
	}
	g, err := job.SpawnGang(ctx, sdk.GangSpec{Name: "train", Kind: "counter", Workers: 6, MinWorkers: 4, GPUsPerWorker: 1, CheckpointOnNotice: true})
	if err != nil {
		t.Fatal(err)
	}
	if g.Size() != 6 {
		t.Fatalf("training started at %d workers, want 6", g.Size())
	}
	svc, err := job.SpawnService(ctx, sdk.ServiceSpec{Name: "infer", Kind: "replica", MinReplicas: 2, MaxReplicas: 4, GPUsPerReplica: 1,
		Priority: 10, TargetInFlight: 2, LatencySLO: time.Minute, ScaleUpCooldown: 100 * time.Millisecond, ScaleDownCooldown: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if svc.Ready() != 2 || svc.Replicas() != 2 {
		t.Fatalf("service started with %d ready of %d, want 2", svc.Ready(), svc.Replicas())
	}
	tr := &training{c: c, g: g}
	stopTrain := make(chan struct{})
	trained := make(chan error, 1)
	go func() { trained <- tr.run(ctx, stopTrain) }()

	// await polls the cluster status until ok says the state is reached.
	await := func(what string, ok func(sdk.Status, sdk.ServiceStatus, sdk.GangStatus) bool) {
		t.Helper()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		var last sdk.Status
		for {
			st, err := c.Status(ctx)
			if err == nil {
				last = st
				var ss sdk.ServiceStatus
				var gs sdk.GangStatus
				for _, s := range st.Services {
					if s.Job == "mixed" && s.Name == "infer" {
						ss = s
					}
				}
				for _, x := range st.Gangs {
					if x.Job == "mixed" && x.Name == "train" {
						gs = x
					}
				}
				if ok(st, ss, gs) {
					return
				}
			}
			select {
			case err := <-trained:
				t.Fatalf("waiting for %s: training ended: %v", what, err)
			case <-tick.C:
			case <-ctx.Done():
				t.Fatalf("waiting for %s: %v; last status: services %+v gangs %+v", what, ctx.Err(), last.Services, last.Gangs)
			}
		}
	}

	burstAt := time.Now()
	// The burst: 16 callers, each with a request of 50 ms in flight at all times.
	burst, endBurst := context.WithCancel(ctx)
	var callers sync.WaitGroup
	served := map[string]int{}
	var servedMu sync.Mutex
	var callErr error
	for i := 0; i < 16; i++ {
		callers.Add(1)
		go func() {
			defer callers.Done()
			for burst.Err() == nil {
				who, err := sdk.CallService[string](burst, svc, serveReq{Work: 50 * time.Millisecond})
				servedMu.Lock()
				if err == nil {
					served[who]++
				} else if burst.Err() == nil && callErr == nil {
					callErr = err
				}
				servedMu.Unlock()
			}
		}()
	}
	await("the service at 4 ready replicas, the training shrunk to 4", func(_ sdk.Status, s sdk.ServiceStatus, gs sdk.GangStatus) bool {
		return s.Replicas == 4 && s.Ready == 4 && gs.Workers == 4
	})
	if err := svc.AwaitReady(ctx, 4); err != nil {
		t.Fatal(err)
	}
	upIn := time.Since(burstAt)
	// Calls reach the new replicas too.
	servedMu.Lock()
	before := len(served)
	servedMu.Unlock()
	await("calls served by all four replicas", func(sdk.Status, sdk.ServiceStatus, sdk.GangStatus) bool {
		servedMu.Lock()
		defer servedMu.Unlock()
		return len(served) == 4
	})
	endBurst()
	callers.Wait()
	endAt := time.Now()
	if callErr != nil {
		t.Fatalf("a call of the burst failed: %v", callErr)
	}
	t.Logf("burst served by %v (%d replicas had served when the fourth was ready)", served, before)

	await("the service back at 2, the training grown back to 6", func(_ sdk.Status, s sdk.ServiceStatus, gs sdk.GangStatus) bool {
		return s.Replicas == 2 && s.GPUs == 2 && gs.Workers == 6 && s.ScaleDowns >= 1
	})
	t.Logf("4 replicas ready %v after the burst began; GPUs back to training %v after it ended (scale-down cooldown 1 s)",
		upIn.Round(time.Millisecond), time.Since(endAt).Round(time.Millisecond))
	close(stopTrain)
	if err := <-trained; err != nil {
		t.Fatal(err)
	}
	// No step lost: the gang never restarted, and every worker counted every step.
	if g.Generation() != 0 || g.Restarts() != 0 {
		t.Fatalf("training restarted: generation %d, %d restarts", g.Generation(), g.Restarts())
	}
	for r := 0; r < g.Size(); r++ {
		if n, err := sdk.Call[int64](ctx, c, g.Worker(r), stepsReq{}); err != nil || n != tr.step {
			t.Fatalf("rank %d counted %d steps, the driver ran %d: %v", r, n, tr.step, err)
		}
	}
	tr.mu.Lock()
	sizes := tr.sizes
	tr.mu.Unlock()
	if len(sizes) < 2 || slices.Min(sizes) != 4 || sizes[len(sizes)-1] != 6 {
		t.Fatalf("training sizes %v: want shrinks to 4 and a grow back to 6", sizes)
	}
	t.Logf("training ran %d steps at sizes 6 -> %v", tr.step, sizes)
	if err := svc.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	st, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Services) != 0 {
		t.Fatalf("services after the stop: %+v", st.Services)
	}
}

// TestServiceBesideTrainingEmbedded runs the scenario on the embedded default.
func TestServiceBesideTrainingEmbedded(t *testing.T) {
	c := newCluster(t, sdk.WithSpec("dgx-h100"))
	ctx, cancel := testtime.Context(t, time.Minute)
	defer cancel()
	runServiceBesideTraining(t, c, ctx)
}

// TestClusterServiceBesideTraining runs the scenario on a cluster of processes (atoll up):
// the replicas and the training workers are worker processes of this test binary.
func TestClusterServiceBesideTraining(t *testing.T) {
	cl := sdktest.Up(t, 1, "")
	c := connect(t, cl)
	defer c.Shutdown(context.Background())
	ctx, cancel := testtime.Context(t, time.Minute)
	defer cancel()
	runServiceBesideTraining(t, c, ctx)
}

// TestServiceSpecErrors: a bad spec is refused with ErrInvalid naming the field.
func TestServiceSpecErrors(t *testing.T) {
	c := newCluster(t, sdk.WithSpec("dgx-h100"))
	ctx := testContext(t)
	job, err := c.Submit(ctx, sdk.JobSpec{Name: "bad"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		spec sdk.ServiceSpec
		want string
	}{
		{sdk.ServiceSpec{Name: "s", Kind: "replica", MinReplicas: 0, MaxReplicas: 2}, "min replicas 0"},
		{sdk.ServiceSpec{Name: "s", Kind: "replica", MinReplicas: 3, MaxReplicas: 2}, "max replicas 2"},
		{sdk.ServiceSpec{Name: "s", Kind: "replica", MinReplicas: 1, MaxReplicas: 2, LatencySLO: -time.Second}, "latency SLO"},
	} {
		if _, err := job.SpawnService(ctx, tc.spec); !errors.Is(err, sdk.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want ErrInvalid saying %q", tc.spec, err, tc.want)
		}
	}
}
