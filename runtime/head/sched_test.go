package head

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/atoll-run/atoll/runtime/api"
)

// These tests drive the live scheduler through the heads' API as drivers and agents do:
// queues, backpressure, stop and shrink notices answered or not, grows, requeues. (Real
// worker processes take the same paths in cmd/atoll's scheduler tests.)

// awaitGang polls the gang's record until ok holds (the leader acts on timers of its own:
// notice deadlines, cycles), failing after 15 s with the last record.
func awaitGang(t *testing.T, c *api.Client, job, name, what string, ok func(api.Gang) bool) api.Gang {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	var last api.Gang
	for {
		g, _, err := c.Gang(ctx, job, name)
		if err == nil {
			last = g
			if ok(g) {
				return g
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("gang %s/%s never %s; last %+v (notice %+v), %v", job, name, what, last, last.Notice, err)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func placed(g api.Gang) bool {
	return g.Placement != nil && g.State.Live() && g.State != api.GangPending
}
func pending(g api.Gang) bool { return g.State == api.GangPending }

func setup(t *testing.T, machines int, conf api.SchedulerConfig, jobs ...string) *api.Client {
	t.Helper()
	_, c := setupHeads(t, machines, conf, jobs...)
	return c
}

// setupHeads is setup, with the heads.
func setupHeads(t *testing.T, machines int, conf api.SchedulerConfig, jobs ...string) ([]*Head, *api.Client) {
	t.Helper()
	heads, c := group(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range machines {
		if _, err := c.RegisterMachine(ctx, machine(t, "m"+string(rune('0'+i)))); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.SetSchedulerConfig(ctx, conf); err != nil {
		t.Fatal(err)
	}
	for _, j := range jobs {
		if _, err := c.SubmitJob(ctx, api.Job{Name: j}); err != nil {
			t.Fatal(err)
		}
	}
	return heads, c
}

func island(job, name, queue string) api.GangSpec {
	return api.GangSpec{Job: job, Name: name, Kind: "k", Workers: 8, Resources: api.Resources{GPUs: 1}, SameIsland: true, Queue: queue}
}

// TestQueuesShareAndSaturate: gangs that do not fit wait in their queues; past the pending
// bound a submission is refused as saturated with a retry hint and nothing queued is lost;
// freed capacity goes to the queue under its fair share, not to the older submission of
// the queue over it.
func TestQueuesShareAndSaturate(t *testing.T) {
	c := setup(t, 2, api.SchedulerConfig{Queues: []api.QueueSpec{{Name: "a", Weight: 1}, {Name: "b", Weight: 1}}, DefaultQueue: "a", MaxPending: 2}, "ja", "jb")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, n := range []string{"a1", "a2", "a3"} {
		if _, err := c.SpawnGang(ctx, island("ja", n, "a")); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.SpawnGang(ctx, island("jb", "b1", "b")); err != nil {
		t.Fatal(err)
	}
	awaitGang(t, c, "ja", "a1", "placed", placed)
	awaitGang(t, c, "ja", "a2", "placed", placed)
	for _, k := range [][2]string{{"ja", "a3"}, {"jb", "b1"}} {
		g := awaitGang(t, c, k[0], k[1], "pending", pending)
		if !strings.Contains(g.Reason, "GPU") {
			t.Errorf("%s waits with reason %q: want the resource it waits for", k[1], g.Reason)
		}
	}
	// Two pending: the next is refused, with a hint, and nothing queued is dropped.
	_, err := c.SpawnGang(ctx, island("ja", "a4", "a"))
	var se *api.SaturatedError
	if !errors.Is(err, api.ErrSaturated) || !errors.As(err, &se) || se.RetryAfter <= 0 {
		t.Fatalf("a submission past the pending bound: %v; want ErrSaturated with a retry hint", err)
	}
	st, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	qs := map[string]api.QueueStatus{}
	for _, q := range st.Queues {
		qs[q.Name] = q
	}
	if qs["a"].Pending != 1 || qs["a"].Running != 2 || qs["a"].GPUs != 16 || qs["b"].Pending != 1 || qs["b"].Running != 0 {
		t.Fatalf("queues after the refusal: %+v; want a: 1 pending, 2 running on 16 GPUs; b: 1 pending", st.Queues)
	}
	// a1 ends: b1 (queue b holds nothing, a still 8 GPUs) goes before a3, submitted earlier.
	if err := c.StopGang(ctx, "ja", "a1"); err != nil {
		t.Fatal(err)
	}
	awaitGang(t, c, "jb", "b1", "placed", placed)
	if g, _, err := c.Gang(ctx, "ja", "a3"); err != nil || g.State != api.GangPending {
		t.Fatalf("a3 after b1 was placed: %+v %v; want it still pending", g, err)
	}
}

// TestStopNoticeAnsweredOrNot: a high-priority gang arriving on a full cluster makes the
// scheduler give the low-priority one a stop notice with its costs (the CUDA context and
// communicator terms among them) and a deadline. Answered after a just-in-time checkpoint,
// the gang is requeued to resume from it; unanswered, it is stopped at the deadline and
// resumes from its newest checkpoint. Either way it is placed again when room frees.
func TestStopNoticeAnsweredOrNot(t *testing.T) {
	for _, answer := range []bool{true, false} {
		name := map[bool]string{true: "answered", false: "deadline missed"}[answer]
		t.Run(name, func(t *testing.T) {
			// The notice stands for its grace: unanswered, it is gone at the deadline, so the
			// grace must outlast a poll on a loaded machine (CI, under the race detector: a
			// 300 ms grace ended before the 10 ms poll saw the notice).
			grace := 300 * time.Millisecond
			if !answer {
				grace = 3 * time.Second
			}
			c := setup(t, 1, api.SchedulerConfig{NoticeGrace: api.Duration(grace)}, "low", "high")
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			low := island("low", "dp", "")
			low.JustInTime = true
			if _, err := c.SpawnGang(ctx, low); err != nil {
				t.Fatal(err)
			}
			lg := awaitGang(t, c, "low", "dp", "placed", placed)
			if err := c.ReportCheckpoint(ctx, api.CheckpointReport{Job: "low", Gang: "dp", UID: lg.UID, Step: 10, Save: api.Duration(20 * time.Millisecond)}); err != nil {
				t.Fatal(err)
			}
			high := island("high", "dp", "")
			high.Priority = 1
			if _, err := c.SpawnGang(ctx, high); err != nil {
				t.Fatal(err)
			}
			lg = awaitGang(t, c, "low", "dp", "given a stop notice", func(g api.Gang) bool { return g.Notice != nil && g.Notice.Kind == api.NoticePreempt })
			n := lg.Notice
			if n.For != "high/dp" || n.Deadline.IsZero() || n.Costs == nil || n.Costs.CUDAContext <= 0 || n.Costs.Communicator <= 0 || n.Costs.Checkpoint <= 0 {
				t.Fatalf("notice %+v (costs %+v): want one for high/dp with a deadline and the checkpoint, CUDA context and communicator costs", n, n.Costs)
			}
			if g, _, _ := c.Gang(ctx, "high", "dp"); g.Placement != nil && g.State != api.GangPending {
				// The victim's GPUs are not free until it stops.
				t.Fatalf("the high-priority gang placed before the victim stopped: %+v", g)
			}
			if answer {
				if err := c.ReportCheckpoint(ctx, api.CheckpointReport{Job: "low", Gang: "dp", UID: lg.UID, Step: 17, Save: api.Duration(20 * time.Millisecond)}); err != nil {
					t.Fatal(err)
				}
				if err := c.Yield(ctx, api.Yield{Job: "low", Gang: "dp", UID: lg.UID, Generation: lg.Generation, Checkpointed: true, Step: 17}); err != nil {
					t.Fatal(err)
				}
			}
			awaitGang(t, c, "high", "dp", "placed", placed)
			lg = awaitGang(t, c, "low", "dp", "requeued", func(g api.Gang) bool { return g.State == api.GangPending && g.Generation == 1 })
			if lg.Preemptions != 1 {
				t.Errorf("victim preemptions %d, want 1", lg.Preemptions)
			}
			evs, _, err := c.Events(ctx, 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			want := "step 17, taken since the notice"
			if !answer {
				want = "its deadline passed"
			}
			found := false
			for _, e := range evs {
				found = found || (e.Kind == "gang_preempted" && strings.Contains(e.String(), want))
			}
			if !found {
				t.Fatalf("no gang_preempted event saying %q in %v", want, evs)
			}
			// Requeue and resume: the high gang ends, the victim is placed again.
			if err := c.StopGang(ctx, "high", "dp"); err != nil {
				t.Fatal(err)
			}
			awaitGang(t, c, "low", "dp", "placed again", func(g api.Gang) bool { return placed(g) && g.Generation == 1 })
		})
	}
}

// TestElasticShrinkThenGrow: an elastic gang on the whole cluster is asked to shrink, not
// stopped, for a high-priority gang; once its driver takes the smaller world the freed
// GPUs go to the preemptor; when that ends, the gang grows back with new members.
func TestElasticShrinkThenGrow(t *testing.T) {
	heads, c := setupHeads(t, 2, api.SchedulerConfig{NoticeGrace: api.Duration(10 * time.Second)}, "el", "high")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	el := api.GangSpec{Job: "el", Name: "dp", Kind: "k", Workers: 16, MinWorkers: 8, Resources: api.Resources{GPUs: 1}, JustInTime: true}
	if _, err := c.SpawnGang(ctx, el); err != nil {
		t.Fatal(err)
	}
	g := awaitGang(t, c, "el", "dp", "placed on 16 GPUs", func(g api.Gang) bool { return placed(g) && len(g.Active()) == 16 })
	high := island("high", "dp", "")
	high.Priority = 1
	if _, err := c.SpawnGang(ctx, high); err != nil {
		t.Fatal(err)
	}
	g = awaitGang(t, c, "el", "dp", "asked to shrink", func(g api.Gang) bool { return g.Notice != nil && g.Notice.Kind == api.NoticeShrink })
	if n := g.Notice; n.From != 16 || n.To != 8 || len(n.Remove) != 8 {
		t.Fatalf("shrink notice %+v: want 16 -> 8 removing 8 members", n)
	}
	keep := slices.DeleteFunc(g.Active(), func(m int) bool { return slices.Contains(g.Notice.Remove, m) })
	if err := c.TakeWorld(ctx, api.WorldChange{Job: "el", Gang: "dp", UID: g.UID, Generation: g.Generation, Epoch: 1, Members: keep}); err != nil {
		t.Fatal(err)
	}
	awaitGang(t, c, "high", "dp", "placed", placed)
	g = awaitGang(t, c, "el", "dp", "shrunk", func(g api.Gang) bool { return g.World != nil && g.World.Epoch == 1 && g.Notice == nil })
	if g.Generation != 0 || g.Resizes != 1 || len(g.Ranks()) != 8 || len(g.Active()) != 8 {
		t.Fatalf("after the shrink: generation %d, %d resizes, ranks %v, active %v; want the same generation at 8", g.Generation, g.Resizes, g.Ranks(), g.Active())
	}
	if err := c.StopGang(ctx, "high", "dp"); err != nil {
		t.Fatal(err)
	}
	g = awaitGang(t, c, "el", "dp", "asked to grow", func(g api.Gang) bool { return g.Notice != nil && g.Notice.Kind == api.NoticeGrow })
	if n := g.Notice; n.From != 8 || n.To != 16 || len(n.Add) != 8 || len(g.Ranks()) != 8 {
		t.Fatalf("grow notice %+v with ranks %v: want 8 -> 16 adding 8, the program still at 8 until it takes it", n, g.Ranks())
	}
	for _, m := range g.Notice.Add { // their agents started them
		w := api.Worker{Job: "el", Gang: "dp", Rank: m, Generation: g.Generation, GangUID: g.UID, Machine: g.Placement.Members[m].Machine, Address: "a", ActorID: "w"}
		if err := c.WorkerReady(ctx, w); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.TakeWorld(ctx, api.WorldChange{Job: "el", Gang: "dp", UID: g.UID, Generation: g.Generation, Epoch: 2, Members: append(g.Ranks(), g.Notice.Add...)}); err != nil {
		t.Fatal(err)
	}
	g = awaitGang(t, c, "el", "dp", "grown", func(g api.Gang) bool { return g.World != nil && g.World.Epoch == 2 })
	if g.Generation != 0 || len(g.Ranks()) != 16 || g.Restarts != 0 {
		t.Fatalf("after the grow: generation %d, ranks %v, restarts %d; want 16 ranks, no restart", g.Generation, g.Ranks(), g.Restarts)
	}
	checkWorkerCount(t, heads)
}

// TestTimeLimit: a gang is held to its TimeLimit (Slurm's --time): one with JustInTime
// gets a time-limit notice a grace before and, yielding, stops there; one that does not
// answer, or has no JustInTime, fails at the limit, its GPUs freed for the next gang.
func TestTimeLimit(t *testing.T) {
	c := setup(t, 1, api.SchedulerConfig{NoticeGrace: api.Duration(time.Second)}, "tl")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	spec := func(name string, jit bool, limit time.Duration) api.GangSpec {
		s := island("tl", name, "")
		s.JustInTime, s.TimeLimit = jit, api.Duration(limit)
		return s
	}
	ready := func(g api.Gang) {
		for r, m := range g.Placement.Members {
			w := api.Worker{Job: "tl", Gang: g.Spec.Name, Rank: r, Generation: g.Generation, GangUID: g.UID, Machine: m.Machine, Address: "a", ActorID: "w"}
			if err := c.WorkerReady(ctx, w); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Warned, answers: stopped at its limit, not queued again.
	if _, err := c.SpawnGang(ctx, spec("warned", true, 3*time.Second)); err != nil {
		t.Fatal(err)
	}
	g := awaitGang(t, c, "tl", "warned", "placed", placed)
	ready(g)
	g = awaitGang(t, c, "tl", "warned", "warned of its time limit", func(g api.Gang) bool { return g.Notice != nil })
	if n := g.Notice; n.Kind != api.NoticeTimeLimit || n.Deadline.Sub(n.Issued) > 1100*time.Millisecond || g.State != api.GangRunning {
		t.Fatalf("notice %+v in state %s: want a time-limit notice at most a grace (1 s) before the limit", n, g.State)
	}
	if err := c.Yield(ctx, api.Yield{Job: "tl", Gang: "warned", UID: g.UID, Generation: g.Generation, Checkpointed: true, Step: 7}); err != nil {
		t.Fatal(err)
	}
	g = awaitGang(t, c, "tl", "warned", "stopped", func(g api.Gang) bool { return !g.State.Live() })
	if g.State != api.GangStopped || !strings.Contains(g.Reason, "time limit") || !strings.Contains(g.Reason, "step 7") {
		t.Fatalf("after yielding: %s %q; want stopped at its time limit after its checkpoint", g.State, g.Reason)
	}
	// No JustInTime: no notice, failed at the limit; the next gang takes its GPUs.
	if _, err := c.SpawnGang(ctx, spec("blunt", false, 2*time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SpawnGang(ctx, spec("next", false, 0)); err != nil {
		t.Fatal(err)
	}
	g = awaitGang(t, c, "tl", "blunt", "placed", placed)
	placedAt := time.Now()
	ready(g)
	g = awaitGang(t, c, "tl", "blunt", "ended", func(g api.Gang) bool { return !g.State.Live() })
	if g.State != api.GangFailed || !strings.Contains(g.Reason, "time limit of 2s reached") || time.Since(placedAt) < 2*time.Second {
		t.Fatalf("%s %q after %v: want failed at its 2 s time limit", g.State, g.Reason, time.Since(placedAt))
	}
	awaitGang(t, c, "tl", "next", "placed on the freed GPUs", placed)
}
