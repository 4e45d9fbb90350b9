package head

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/atoll-run/atoll/runtime/api"
)

// TestProcessGangExits: the head's decisions on a process gang's clean exits: it
// completes once every member exited 0 (one is not enough); the yield code with no notice
// to answer is a failure (an all-for-one restart, counted); after a drain's stop notice,
// every member yielding queues it again (no restart counted), and after a time-limit
// notice it stops.
func TestProcessGangExits(t *testing.T) {
	c := setup(t, 2, api.SchedulerConfig{NoticeGrace: api.Duration(time.Minute)}, "pj")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	spawn := func(name string, limit time.Duration) api.Gang {
		t.Helper()
		s := api.GangSpec{Job: "pj", Name: name, Workers: 2, Resources: api.Resources{GPUs: 1}, SameIsland: true, MaxRestarts: 3,
			JustInTime: true, TimeLimit: api.Duration(limit), Process: &api.ProcessSpec{Command: []string{"python3", "train.py"}}}
		if _, err := c.SpawnGang(ctx, s); err != nil {
			t.Fatal(err)
		}
		g := awaitGang(t, c, "pj", name, "placed", placed)
		for r, m := range g.Placement.Members {
			w := api.Worker{Job: "pj", Gang: name, Rank: r, Generation: g.Generation, GangUID: g.UID, Machine: m.Machine, Address: "a", ActorID: "p"}
			if err := c.WorkerReady(ctx, w); err != nil {
				t.Fatal(err)
			}
		}
		return awaitGang(t, c, "pj", name, "running", func(g api.Gang) bool { return g.State == api.GangRunning })
	}
	exit := func(g api.Gang, rank int, completed, yielded bool) {
		t.Helper()
		x := api.WorkerExit{Job: "pj", Gang: g.Spec.Name, Rank: rank, Generation: g.Generation, Machine: g.Placement.Members[rank].Machine,
			Reason: "exited", Completed: completed, Yielded: yielded}
		if err := c.WorkerExited(ctx, x); err != nil {
			t.Fatal(err)
		}
	}

	// Completion: every member's exit 0, not the first one's.
	g := spawn("done", 0)
	exit(g, 0, true, false)
	if now, _, err := c.Gang(ctx, "pj", "done"); err != nil || now.State != api.GangRunning {
		t.Fatalf("after one member of two exited 0: %s %v; want still running", now.State, err)
	}
	exit(g, 1, true, false)
	g = awaitGang(t, c, "pj", "done", "completed", func(g api.Gang) bool { return !g.State.Live() })
	if g.State != api.GangStopped || !strings.Contains(g.Reason, "completed") || g.Restarts != 0 {
		t.Fatalf("after both exited 0: %s %q, %d restarts; want stopped as completed", g.State, g.Reason, g.Restarts)
	}

	// The yield code with no notice: a failure, restarted all-for-one.
	g = spawn("eager", 0)
	exit(g, 0, false, true)
	g = awaitGang(t, c, "pj", "eager", "restarted", func(g api.Gang) bool { return g.Generation == 1 })
	if g.Restarts != 1 || !strings.Contains(g.Reason, "yield code") {
		t.Fatalf("a yield with no notice: %d restarts, reason %q; want a counted restart saying so", g.Restarts, g.Reason)
	}
	if err := c.StopGang(ctx, "pj", "eager"); err != nil {
		t.Fatal(err)
	}

	// A drain's stop notice answered by every member's yield: queued again, no restart.
	g = spawn("drained", 0)
	machine := g.Placement.Members[0].Machine
	if err := c.Drain(ctx, api.DrainRequest{Machine: machine, Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	g = awaitGang(t, c, "pj", "drained", "told to stop", func(g api.Gang) bool { return g.Notice != nil })
	if g.Notice.Kind != api.NoticeDrain {
		t.Fatalf("notice %+v: want a drain", g.Notice)
	}
	exit(g, 0, false, true)
	exit(g, 1, false, true)
	g = awaitGang(t, c, "pj", "drained", "queued again", func(g api.Gang) bool { return g.Generation == 1 })
	if g.Restarts != 0 || g.Preemptions != 1 {
		t.Fatalf("after yielding to the drain: %s, %d restarts, %d preemptions, %q; want queued again, no restart", g.State, g.Restarts, g.Preemptions, g.Reason)
	}
	if g.Placement != nil { // placed again at once, on the other machine
		for _, m := range g.Placement.Members {
			if m.Machine == machine {
				t.Fatalf("queued again onto the drained machine %s: %+v", machine, g.Placement)
			}
		}
	}
	if err := c.StopGang(ctx, "pj", "drained"); err != nil {
		t.Fatal(err)
	}
	if err := c.Undrain(ctx, api.UndrainRequest{Machine: machine}); err != nil {
		t.Fatal(err)
	}

	// A time-limit notice answered by every member's yield: stopped, not queued again.
	g = spawn("timed", 2*time.Second)
	g = awaitGang(t, c, "pj", "timed", "warned of its time limit", func(g api.Gang) bool { return g.Notice != nil })
	if g.Notice.Kind != api.NoticeTimeLimit {
		t.Fatalf("notice %+v: want its time limit's", g.Notice)
	}
	exit(g, 0, false, true)
	exit(g, 1, false, true)
	g = awaitGang(t, c, "pj", "timed", "stopped", func(g api.Gang) bool { return !g.State.Live() })
	if g.State != api.GangStopped || !strings.Contains(g.Reason, "time limit") {
		t.Fatalf("after yielding to its time limit: %s %q; want stopped there", g.State, g.Reason)
	}
}

// TestPoolViewLastCopies: an object's last copy is counted on a machine that holds its
// only alive copy, and on the first of the machines that hold copies when all of them are
// draining (removed together, they would take it with them); a copy on a machine that
// stays leaves it uncounted.
func TestPoolViewLastCopies(t *testing.T) {
	heads, c := group(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i, name := range []string{"m0", "m1", "m2"} {
		m := machine(t, name)
		m.Agent.Transfer = fmt.Sprintf("t%d", i)
		if _, err := c.RegisterMachine(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	for id, locs := range map[string][]string{"only": {"t0"}, "pair": {"t0", "t1"}, "spread": {"t1", "t2"}} {
		b, _ := json.Marshal(map[string]any{"id": id, "owner": "job/j", "locations": locs})
		if _, err := c.Meta().Put(ctx, api.TableObjects+id, b); err != nil {
			t.Fatal(err)
		}
	}
	lead := leader(t, heads)
	view := func() map[string][]string {
		t.Helper()
		caughtUp(t, heads)
		v, err := lead.Controller().PoolView()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string][]string{}
		for _, m := range v.Machines {
			for _, o := range m.LastCopyObjects {
				out[m.Name] = append(out[m.Name], o.ID)
			}
			if len(m.LastCopyObjects) != m.LastCopies {
				t.Errorf("%s: %d last copies, %d named", m.Name, m.LastCopies, len(m.LastCopyObjects))
			}
		}
		return out
	}
	if got := fmt.Sprint(view()); got != "map[m0:[only]]" {
		t.Fatalf("last copies %s: want only's on m0", got)
	}
	// m0 and m1 drain together: pair's two copies go with them, unless it moves first.
	for _, m := range []string{"m0", "m1"} {
		if err := c.Drain(ctx, api.DrainRequest{Machine: m, Reason: "test"}); err != nil {
			t.Fatal(err)
		}
	}
	got := view()
	slices.Sort(got["m0"])
	if fmt.Sprint(got) != "map[m0:[only pair]]" {
		t.Fatalf("last copies with m0 and m1 draining: %v; want only and pair on m0 (spread has a copy on m2, which stays)", got)
	}
}
