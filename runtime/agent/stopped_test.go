package agent

import (
	"context"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/runtime/head"
	"github.com/atoll-run/atoll/store/paxos"
	"github.com/atoll-run/atoll/topology"
)

var headToken = []byte("agent-test-token-0123456789")

// gateLauncher counts launches and holds each one until release is closed.
type gateLauncher struct {
	mu      sync.Mutex
	calls   int
	entered chan struct{}
	release chan struct{}
}

func (l *gateLauncher) Launch(ctx context.Context, spec api.WorkerSpec, job api.Job) (Handle, error) {
	l.mu.Lock()
	l.calls++
	l.mu.Unlock()
	l.entered <- struct{}{}
	select {
	case <-l.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return &runningHandle{done: make(chan struct{})}, nil
}

func (l *gateLauncher) launches() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.calls
}

// runningHandle is a worker that runs until stopped.
type runningHandle struct {
	once sync.Once
	done chan struct{}
}

func (h *runningHandle) PID() int              { return 0 }
func (h *runningHandle) Done() <-chan struct{} { return h.done }
func (h *runningHandle) Err() error            { return nil }
func (h *runningHandle) Stop(context.Context, time.Duration) error {
	h.once.Do(func() { close(h.done) })
	return nil
}
func (h *runningHandle) Kill() error { return h.Stop(context.Background(), 0) }

// waitAgent waits, on the agent's change notifications, until cond holds (under a.mu).
func waitAgent(t *testing.T, a *Agent, what string, cond func() bool) {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		a.mu.Lock()
		ok, ch := cond(), a.changed
		a.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-ch:
		case <-timeout:
			t.Fatalf("timed out waiting until %s", what)
		}
	}
}

// TestStoppedJobsWorkersAreNotLaunched: the members of a gang wait their turn to launch;
// once the job is stopped, those not started are never started, and a launch for the
// stopped job is refused even while the agent's view of the gangs still shows it running.
func TestStoppedJobsWorkersAreNotLaunched(t *testing.T) {
	h, err := head.Start(head.Config{ID: 1, Initial: []uint64{1}, Transport: paxos.NewMemNetwork(1).Transport(1), DataDir: t.TempDir(),
		NoSync: true, Token: headToken, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tc, err := topology.Load("dgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	l := &gateLauncher{entered: make(chan struct{}, 64), release: make(chan struct{})}
	a, err := Start(ctx, Config{Name: "m0", Spec: tc.Machines[0].Spec, Simulated: true, Heads: []string{h.Address()}, Token: headToken,
		Dir: t.TempDir(), ShmDir: t.TempDir(), Launcher: l, MaxLaunches: 2, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Shutdown(context.Background())
	c := a.Client()
	if _, err := c.SubmitJob(ctx, api.Job{Name: "j"}); err != nil {
		t.Fatal(err)
	}
	g, err := c.SpawnGang(ctx, api.GangSpec{Job: "j", Name: "g", Kind: "k", Workers: 12})
	if err != nil || g.State != api.GangStarting {
		t.Fatalf("spawn: %+v %v", g, err)
	}
	// Two launches are in flight (the bound); ten members wait their turn.
	<-l.entered
	<-l.entered
	if err := c.StopJob(ctx, "j"); err != nil {
		t.Fatal(err)
	}
	var running api.Gang
	waitAgent(t, a, "the agent sees the gang stopped (it drops ended gangs)", func() bool {
		got, ok := a.gangs["j/g"]
		if got.State == api.GangStarting {
			running = got
		}
		return !ok
	})
	close(l.release)
	waitAgent(t, a, "every worker is gone", func() bool { return len(a.workers) == 0 })
	if n := l.launches(); n != 2 {
		t.Fatalf("%d launches for a gang whose job stopped while 2 were in flight: want 2", n)
	}
	// The agent's view lags (the stopped gang shows starting again): the launch reads the
	// job, finds it stopped, and the agent stops reconciling that incarnation.
	if running.UID == "" {
		running = g
	}
	a.mu.Lock()
	a.gangs["j/g"] = running
	a.mu.Unlock()
	a.reconcile()
	waitAgent(t, a, "the launch for the stopped job is refused", func() bool {
		return a.ended[incarnation(running.UID, running.Generation)] && len(a.workers) == 0
	})
	a.reconcile()
	a.mu.Lock()
	n := len(a.workers)
	a.mu.Unlock()
	if n != 0 || l.launches() != 2 {
		t.Fatalf("after the refusal: %d workers, %d launches; want none started", n, l.launches())
	}
	// The same for a gang stopped by its driver while its job runs on.
	if _, err := c.SubmitJob(ctx, api.Job{Name: "j2"}); err != nil {
		t.Fatal(err)
	}
	g2, err := c.SpawnGang(ctx, api.GangSpec{Job: "j2", Name: "g", Kind: "k", Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	<-l.entered // its one member launches
	if err := c.StopGang(ctx, "j2", "g"); err != nil {
		t.Fatal(err)
	}
	waitAgent(t, a, "the agent sees the second gang stopped", func() bool { _, ok := a.gangs["j2/g"]; return !ok })
	waitAgent(t, a, "every worker is gone again", func() bool { return len(a.workers) == 0 })
	a.mu.Lock()
	a.gangs["j2/g"] = g2
	a.mu.Unlock()
	a.reconcile()
	waitAgent(t, a, "the launch for the stopped gang is refused", func() bool {
		return a.ended[incarnation(g2.UID, g2.Generation)] && len(a.workers) == 0
	})
	if l.launches() != 3 {
		t.Fatalf("%d launches: want 3 (none for the stopped gang's stale record)", l.launches())
	}
}
