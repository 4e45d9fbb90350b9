package sdk_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/atoll-run/atoll/internal/testtime"
	"github.com/atoll-run/atoll/sdk"
	"github.com/atoll-run/atoll/sdk/sdktest"
)

// The semantics a Ray user relies on (issue 23): each test here failed before its fix.

// quotaError is a user's own error type; errLuck a user's sentinel. Both are registered
// (testOptions: sdk.Errors, sdk.ErrorTypes), so they keep their identity across a call.
type quotaError struct{ Need int }

func (e *quotaError) Error() string { return fmt.Sprintf("quota: need %d more", e.Need) }

var errLuck = errors.New("test: out of luck")

// notes are what notifier actors in this (the driver's) process were told.
var notes = make(chan string, 64)

// notifier passes what it is told to notes: a task or actor in any process tells the test
// where it is.
type notifier struct{}

func (notifier) Receive(_ *sdk.Context, msg any) (any, error) {
	notes <- msg.(string)
	return "ok", nil
}

// panicker panics on "panic REASON", fails with a registered error on "quota" and "luck",
// and otherwise answers with its incarnation.
type panicker struct{}

func (panicker) Receive(c *sdk.Context, msg any) (any, error) {
	s := msg.(string)
	switch {
	case strings.HasPrefix(s, "panic "):
		panic(strings.TrimPrefix(s, "panic "))
	case s == "quota":
		return nil, fmt.Errorf("admit: %w", &quotaError{Need: 3})
	case s == "luck":
		return nil, fmt.Errorf("draw: %w", errLuck)
	}
	return fmt.Sprint("ok ", c.Generation()), nil
}

var (
	// boom panics with its argument.
	boom = sdk.Task("boom", func(_ *sdk.Context, reason string) (int, error) { panic(reason) })

	// typedFail fails with the user's registered error type and sentinel.
	typedFail = sdk.Task("typed-fail", func(_ *sdk.Context, need int) (int, error) {
		if need == 0 {
			return 0, fmt.Errorf("task: %w", errLuck)
		}
		return 0, fmt.Errorf("task: %w", &quotaError{Need: need})
	})

	// hang tells the notifier it started, waits until its context ends, and tells it so.
	hang = sdk.Task("hang", func(c *sdk.Context, to sdk.ActorRef) (int, error) {
		// The test kills the worker once the note is in, which can be before the
		// notifier's answer is: the call then fails with the handler's own cancellation,
		// and the handler goes on to say it stopped (CI met that race).
		if _, err := sdk.Call[string](c, c, to, "started"); err != nil && c.Err() == nil {
			return 0, err
		}
		<-c.Done()
		_, _ = sdk.Call[string](context.WithoutCancel(c), c, to, "stopped: "+context.Cause(c).Error())
		return 0, c.Err()
	})
)

// semanticsOptions are the kinds, tasks and errors of these tests (in testOptions).
func semanticsOptions() []sdk.Option {
	return []sdk.Option{
		sdk.Kind("notifier", func() sdk.Actor { return notifier{} }),
		sdk.Kind("panicker", func() sdk.Actor { return panicker{} }),
		sdk.Tasks(boom, typedFail, hang),
		sdk.Errors(errLuck),
		sdk.ErrorTypes(&quotaError{}),
	}
}

func TestWaitReturnsExactlyN(t *testing.T) {
	fs := make([]sdk.Waitable, 20)
	for i := range fs {
		ch := make(waitable)
		close(ch)
		fs[i] = ch
	}
	ready, pending, err := sdk.Wait(context.Background(), fs, 5)
	if err != nil || len(ready) != 5 || len(pending) != 15 {
		t.Fatalf("Wait(5) on 20 ready futures: ready %v, pending %v, %v; want 5 ready and 15 pending", ready, pending, err)
	}
	for i, r := range ready {
		if r != i {
			t.Fatalf("ready %v: want the first five, in order", ready)
		}
	}
	// Some ready at the call, the rest later: still exactly n.
	later := make(waitable)
	mixed := []sdk.Waitable{later, fs[0], later, fs[1]}
	go close(later)
	ready, pending, err = sdk.Wait(context.Background(), mixed, 3)
	if err != nil || len(ready) != 3 || len(pending) != 1 {
		t.Fatalf("Wait(3) on four futures: ready %v, pending %v, %v", ready, pending, err)
	}
}

// waitNote waits for a note that starts with prefix.
func waitNote(t *testing.T, ctx context.Context, prefix string) string {
	t.Helper()
	for {
		select {
		case n := <-notes:
			if strings.HasPrefix(n, prefix) {
				return n
			}
		case <-ctx.Done():
			t.Fatalf("no note %q: %v", prefix, ctx.Err())
		}
	}
}

func TestTaskChargedOnlyWithItsOwnFailures(t *testing.T) {
	c := newCluster(t)
	ctx := testContext(t)
	job, _ := c.Submit(ctx, sdk.JobSpec{Name: "charged"})
	once := sdk.TaskOptions{MaxRetries: -1}
	for i := 0; i < 5; i++ {
		_, err := boom.With(once).Remote(ctx, job, fmt.Sprint("round ", i)).Await(ctx)
		if err == nil {
			t.Fatalf("round %d: a task that panics succeeded", i)
		}
		// The next task, on the same pooled worker, runs: the panic was the first task's.
		if v, err := square.With(once).Remote(ctx, job, i).Await(ctx); err != nil || v != i*i {
			t.Fatalf("round %d: a task after another's panic on its worker: %d, %v; want %d from its own run", i, v, err, i*i)
		}
	}
}

// panicsAreActorFailed checks a task's and an actor's panic: ErrActorFailed, with the
// panic's message.
func panicsAreActorFailed(t *testing.T, ctx context.Context, c *sdk.Cluster, job *sdk.Job, a sdk.ActorRef) {
	t.Helper()
	_, err := boom.With(sdk.TaskOptions{MaxRetries: -1}).Remote(ctx, job, "the task's own panic").Await(ctx)
	if !errors.Is(err, sdk.ErrActorFailed) || !strings.Contains(err.Error(), "the task's own panic") {
		t.Errorf("a task's panic: %v; want ErrActorFailed with its message", err)
	}
	_, err = sdk.Call[string](ctx, c, a, "panic the actor's own panic")
	if !errors.Is(err, sdk.ErrActorFailed) || !strings.Contains(err.Error(), "the actor's own panic") {
		t.Errorf("an actor's panic: %v; want ErrActorFailed with its message", err)
	}
}

// errorsKeepIdentity checks that registered errors cross a task and an actor call.
func errorsKeepIdentity(t *testing.T, ctx context.Context, c *sdk.Cluster, job *sdk.Job, a sdk.ActorRef) {
	t.Helper()
	check := func(what string, err error, need int) {
		t.Helper()
		var q *quotaError
		switch {
		case need == 0 && !errors.Is(err, errLuck):
			t.Errorf("%s: %v; want errLuck (errors.Is)", what, err)
		case need != 0 && (!errors.As(err, &q) || q.Need != need):
			t.Errorf("%s: %v; want a *quotaError needing %d (errors.As)", what, err, need)
		case need != 0 && !strings.Contains(err.Error(), fmt.Sprintf("quota: need %d more", need)):
			t.Errorf("%s: %q lost the error's text", what, err)
		}
	}
	_, err := typedFail.Remote(ctx, job, 7).Await(ctx)
	check("a task's error type", err, 7)
	_, err = typedFail.Remote(ctx, job, 0).Await(ctx)
	check("a task's sentinel", err, 0)
	_, err = sdk.Call[string](ctx, c, a, "quota")
	check("an actor's error type", err, 3)
	_, err = sdk.Call[string](ctx, c, a, "luck")
	check("an actor's sentinel", err, 0)
	if _, err := sdk.Call[string](ctx, c, a, "luck"); errors.Is(err, sdk.ErrActorFailed) || errors.Is(err, sdk.ErrActorDead) {
		t.Errorf("a user's error reads as the runtime's: %v", err)
	}
}

// killStopsARunningHandler kills the worker of a task while the task runs: the task fails
// as its worker's failure, at once; inProcess: its handler's context ended.
func killStopsARunningHandler(t *testing.T, ctx context.Context, c *sdk.Cluster, job *sdk.Job, inProcess bool) {
	t.Helper()
	n, err := c.Spawn(ctx, "notifier", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	f := hang.With(sdk.TaskOptions{MaxRetries: -1}).Remote(ctx, job, n)
	waitNote(t, ctx, "started")
	st, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var killed bool
	for _, g := range st.Gangs {
		if g.Job == job.Name() && strings.HasPrefix(g.Name, "task-") && g.State == "running" {
			if err := gangOf(t, c, job, g.Name).Kill(ctx, 0); err != nil {
				t.Fatal(err)
			}
			killed = true
		}
	}
	if !killed {
		t.Fatalf("no running task worker in %+v", st.Gangs)
	}
	// Well before the task's own deadline (the test's minute).
	wait, cancel := context.WithTimeout(ctx, testtime.Scale(20*time.Second))
	defer cancel()
	_, err = f.Await(wait)
	if err == nil || !strings.Contains(err.Error(), "its worker failed") {
		t.Fatalf("a task whose worker was killed: %v; want its worker's failure", err)
	}
	if inProcess {
		waitNote(t, wait, "stopped")
	}
}

// restartingActor checks that a call right after a restartable actor's panic reaches its
// next incarnation, and one right after StopActor is refused.
func restartingActor(t *testing.T, ctx context.Context, c *sdk.Cluster, job *sdk.Job) {
	t.Helper()
	a, err := job.SpawnActor(ctx, sdk.ActorSpec{Name: "phoenix", Kind: "panicker", MaxRestarts: 5})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if _, err := sdk.Call[string](ctx, c, a, "panic again"); !errors.Is(err, sdk.ErrActorFailed) {
			t.Fatalf("round %d: the panicking call: %v", i, err)
		}
		v, err := sdk.Call[string](ctx, c, a, "hello")
		if err != nil || v != fmt.Sprint("ok ", i+1) {
			t.Fatalf("round %d: the call right after a panic: %q, %v; want the next incarnation's answer", i, v, err)
		}
	}
	if err := sdk.StopActor(ctx, c, a); err != nil {
		t.Fatal(err)
	}
	if v, err := sdk.Call[string](ctx, c, a, "hello"); !errors.Is(err, sdk.ErrActorDead) {
		t.Fatalf("a call after StopActor returned: %q, %v; want ErrActorDead", v, err)
	}
}

func TestKillStopsARunningHandler(t *testing.T) {
	c := newCluster(t)
	ctx := testContext(t)
	job, _ := c.Submit(ctx, sdk.JobSpec{Name: "kill"})
	killStopsARunningHandler(t, ctx, c, job, true)
}

func TestRestartingActorCalls(t *testing.T) {
	c := newCluster(t)
	ctx := testContext(t)
	job, _ := c.Submit(ctx, sdk.JobSpec{Name: "restart"})
	restartingActor(t, ctx, c, job)
}

func TestPanicsAndErrorsKeepIdentity(t *testing.T) {
	c := newCluster(t)
	ctx := testContext(t)
	job, _ := c.Submit(ctx, sdk.JobSpec{Name: "errs"})
	a, err := job.SpawnActor(ctx, sdk.ActorSpec{Name: "p", Kind: "panicker", MaxRestarts: 5})
	if err != nil {
		t.Fatal(err)
	}
	errorsKeepIdentity(t, ctx, c, job, a)
	panicsAreActorFailed(t, ctx, c, job, a)
}

func TestStatusListsEveryHead(t *testing.T) {
	c := newCluster(t)
	everyHead(t, testContext(t), c)
}

// everyHead checks that the status lists the three heads, one of them the leader.
func everyHead(t *testing.T, ctx context.Context, c *sdk.Cluster) {
	t.Helper()
	st, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ids, leaders := map[uint64]bool{}, 0
	for _, h := range st.Heads {
		ids[h.ID] = true
		if h.Leader {
			leaders++
		}
	}
	if len(st.Heads) != 3 || len(ids) != 3 || leaders != 1 || !ids[st.Leader] {
		t.Fatalf("heads %+v (leader %d); want three, one the leader", st.Heads, st.Leader)
	}
}

// TestClusterSemantics checks the same semantics on a cluster of processes: panics, error
// identity, kill, restarting actors, every head in the status.
func TestClusterSemantics(t *testing.T) {
	cl := sdktest.Up(t, 1, "")
	ctx, cancel := testtime.Context(t, 4*time.Minute)
	defer cancel()
	c := connect(t, cl)
	defer c.Shutdown(context.Background())
	job, err := c.Submit(ctx, sdk.JobSpec{Name: "sem"})
	if err != nil {
		t.Fatal(err)
	}
	t.Run("heads", func(t *testing.T) { everyHead(t, ctx, c) })
	a, err := job.SpawnActor(ctx, sdk.ActorSpec{Name: "p", Kind: "panicker", MaxRestarts: 5, Resources: sdk.Resources{CPUMilli: 100}})
	if err != nil {
		t.Fatal(err)
	}
	t.Run("errors", func(t *testing.T) { errorsKeepIdentity(t, ctx, c, job, a) })
	t.Run("panics", func(t *testing.T) { panicsAreActorFailed(t, ctx, c, job, a) })
	t.Run("kill", func(t *testing.T) { killStopsARunningHandler(t, ctx, c, job, false) })
	t.Run("restarts", func(t *testing.T) { restartingActor(t, ctx, c, job) })
}
