package actors

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
)

type echo struct{}

func (echo) Receive(_ *Context, msg any) (any, error) {
	switch m := msg.(type) {
	case string:
		return "echo:" + m, nil
	case int:
		return m * 2, nil
	case error:
		return nil, m
	case time.Duration:
		time.Sleep(m)
		return "slept", nil
	}
	return nil, nil
}

func newTestSystem(t *testing.T) *System {
	t.Helper()
	s, err := NewSystem(Config{Logger: zaptest.NewLogger(t), DefaultCallTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	if err := s.Register("echo", func() Handler { return echo{} }); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestCallTypedReply(t *testing.T) {
	s := newTestSystem(t)
	ref, err := s.Spawn("echo", "e1")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	got, err := Call[string](ctx, s, ref, "hi")
	if err != nil || got != "echo:hi" {
		t.Fatalf("Call = %q, %v; want echo:hi", got, err)
	}
	n, err := Call[int](ctx, s, ref, 21)
	if err != nil || n != 42 {
		t.Fatalf("Call = %d, %v; want 42", n, err)
	}
	if _, err := Call[int](ctx, s, ref, "wrong type"); err == nil || !strings.Contains(err.Error(), "reply is string") {
		t.Fatalf("wrong reply type: err = %v", err)
	}
	want := errors.New("handler says no")
	if _, err := Call[string](ctx, s, ref, want); !errors.Is(err, want) {
		t.Fatalf("handler error not returned: %v", err)
	}
	// Futures: several in flight at once.
	fs := make([]*Future[int], 10)
	for i := range fs {
		fs[i] = CallAsync[int](s, ref, i)
	}
	for i, f := range fs {
		if v, err := f.Await(ctx); err != nil || v != 2*i {
			t.Fatalf("future %d = %d, %v", i, v, err)
		}
	}
}

func TestRegistryErrors(t *testing.T) {
	s := newTestSystem(t)
	if err := s.Register("echo", func() Handler { return echo{} }); !errors.Is(err, ErrDuplicateKind) {
		t.Fatalf("duplicate kind: %v", err)
	}
	if err := s.Register("", func() Handler { return echo{} }); !errors.Is(err, ErrInvalidSpec) {
		t.Fatalf("empty kind: %v", err)
	}
	_, err := s.Spawn("nope", "")
	if !errors.Is(err, ErrUnknownKind) || !strings.Contains(err.Error(), `"nope"`) {
		t.Fatalf("unknown kind: %v", err)
	}
	if _, err := s.Lookup("no-such-actor"); !errors.Is(err, ErrUnknownActor) {
		t.Fatalf("lookup: %v", err)
	}
	if _, err := Call[string](context.Background(), s, Ref{}, "x"); !errors.Is(err, ErrUnknownActor) {
		t.Fatalf("zero ref: %v", err)
	}
}

func TestCallDeadActorFailsFast(t *testing.T) {
	s := newTestSystem(t)
	ref, _ := s.Spawn("echo", "doomed")
	ctx := context.Background()
	if err := s.Stop(ctx, ref); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err := Call[string](ctx, s, ref, "anyone?")
	if !errors.Is(err, ErrActorDead) {
		t.Fatalf("call to stopped actor: %v, want ErrActorDead", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("dead-actor call took %v; it must fail fast, not time out", d)
	}
}

func TestCallHonoursContext(t *testing.T) {
	s := newTestSystem(t)
	ref, _ := s.Spawn("echo", "slow")
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := Call[string](ctx, s, ref, 2*time.Second)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("deadline: %v", err)
	}
	ctx2, cancel2 := context.WithCancel(context.Background())
	cancel2()
	if _, err := Call[string](ctx2, s, ref, "x"); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
}

// counter remembers how many times it was started, across restarts, through a shared counter.
type counter struct {
	starts *atomic.Int32
	calls  int
}

func (c *counter) Started(*Context) error { c.starts.Add(1); return nil }
func (c *counter) Receive(ctx *Context, msg any) (any, error) {
	c.calls++
	if msg == "boom" {
		panic("boom")
	}
	return ctx.Rank()*1000 + c.calls, nil
}

func TestGangAllForOneRestart(t *testing.T) {
	s := newTestSystem(t)
	var starts atomic.Int32
	if err := s.Register("counter", func() Handler { return &counter{starts: &starts} }); err != nil {
		t.Fatal(err)
	}
	job, err := s.NewJob("j1")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var failures atomic.Int32
	g, err := job.SpawnGang(ctx, GangSpec{Name: "g", Kind: "counter", Size: 4, MaxRestarts: 2,
		Backoff: time.Millisecond, OnFailure: func(Failure) { failures.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	if starts.Load() != 4 {
		t.Fatalf("starts = %d, want 4", starts.Load())
	}
	for r := 0; r < 4; r++ {
		if v, err := Call[int](ctx, s, g.Worker(r), "tick"); err != nil || v != r*1000+1 {
			t.Fatalf("rank %d: %d, %v", r, v, err)
		}
	}
	// A call that makes the worker fail gets ErrActorFailed, and the whole gang restarts.
	if _, err := Call[int](ctx, s, g.Worker(2), "boom"); !errors.Is(err, ErrActorFailed) {
		t.Fatalf("failing call: %v", err)
	}
	gen, err := g.AwaitRunning(ctx, 1)
	if err != nil || gen != 1 {
		t.Fatalf("AwaitRunning = %d, %v", gen, err)
	}
	if starts.Load() != 8 || g.Restarts() != 1 || failures.Load() != 1 {
		t.Fatalf("after one failure: starts %d (want 8), restarts %d (want 1), failures %d", starts.Load(), g.Restarts(), failures.Load())
	}
	// State was reset in every worker, not only the failed one.
	for r := 0; r < 4; r++ {
		if v, err := Call[int](ctx, s, g.Worker(r), "tick"); err != nil || v != r*1000+1 {
			t.Fatalf("rank %d after restart: %d, %v (state not fresh)", r, v, err)
		}
	}
	// Injected failures use up the restart budget; then the gang fails for good.
	if err := g.InjectFailure(0, "test"); err != nil {
		t.Fatal(err)
	}
	if _, err := g.AwaitRunning(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if err := g.InjectFailure(1, "test"); err != nil {
		t.Fatal(err)
	}
	_, err = g.AwaitRunning(ctx, 3)
	if !errors.Is(err, ErrGangFailed) || g.State() != GangFailed {
		t.Fatalf("after exceeding MaxRestarts: %v, state %v", err, g.State())
	}
	if _, err := Call[int](ctx, s, g.Worker(3), "tick"); !errors.Is(err, ErrActorDead) {
		t.Fatalf("call to a failed gang's worker: %v", err)
	}
}

func TestGangSpecErrors(t *testing.T) {
	s := newTestSystem(t)
	job, _ := s.NewJob("j")
	ctx := context.Background()
	for _, tc := range []struct {
		spec GangSpec
		want error
		text string
	}{
		{GangSpec{Name: "a", Kind: "echo", Size: 0}, ErrInvalidSpec, "size 0"},
		{GangSpec{Name: "a", Kind: "echo", Size: -3}, ErrInvalidSpec, "size -3"},
		{GangSpec{Name: "", Kind: "echo", Size: 1}, ErrInvalidSpec, "no name"},
		{GangSpec{Name: "a", Kind: "ghost", Size: 1}, ErrUnknownKind, "ghost"},
		{GangSpec{Name: "a", Kind: "echo", Size: 1, MaxRestarts: -1}, ErrInvalidSpec, "negative"},
	} {
		_, err := job.SpawnGang(ctx, tc.spec)
		if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.text) {
			t.Errorf("%+v: err = %v, want %v mentioning %q", tc.spec, err, tc.want, tc.text)
		}
	}
	if _, err := s.NewJob("j"); !errors.Is(err, ErrInvalidSpec) {
		t.Fatalf("duplicate job: %v", err)
	}
}
