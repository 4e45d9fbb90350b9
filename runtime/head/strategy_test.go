package head

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/atoll-run/atoll/runtime/api"
)

// The placement strategies are plugins of the scheduler core: these tests drive strategy
// gangs through the live head as drivers and agents do, and check that they take the
// core's paths (queues, priorities, preemption) like every gang.

// distinct reports whether the gang's members are on as many machines as it has members,
// with GPUs GPUs each.
func distinct(g api.Gang, gpus int) bool {
	if g.Placement == nil {
		return false
	}
	seen := map[string]bool{}
	for _, m := range g.Placement.Members {
		if seen[m.Machine] || len(m.GPUs) != gpus {
			return false
		}
		seen[m.Machine] = true
	}
	return len(seen) == len(g.Placement.Members)
}

// TestStrictSpreadMachineLoss: a strict-spread gang placed by the core moves, when one of
// its machines is lost, to machines that are all different again; a new strict spread
// over more machines than there are is refused as never fitting, but the admitted gang,
// with two machines left, waits in its queue (a lost machine fails no gang) and is placed
// on three distinct machines again when one comes back.
func TestStrictSpreadMachineLoss(t *testing.T) {
	heads, c := group(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, n := range []string{"m0", "m1", "m2", "m3"} {
		if _, err := c.RegisterMachine(ctx, machine(t, n)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.SubmitJob(ctx, api.Job{Name: "j"}); err != nil {
		t.Fatal(err)
	}
	spec := api.GangSpec{Job: "j", Name: "s", Kind: "k", Workers: 3, Resources: api.Resources{GPUs: 2}, Strategy: api.StrategyStrictSpread, MaxRestarts: 3}
	g, err := c.SpawnGang(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if !distinct(g, 2) {
		t.Fatalf("strict spread placed as %+v", g.Placement)
	}
	ctl := leader(t, heads).Controller()
	lost := g.Placement.Members[1].Machine
	if err := ctl.MachineDown(ctx, lost, "test"); err != nil {
		t.Fatal(err)
	}
	g = waitGang(t, c, "j", "s", func(g api.Gang) bool { return g.Generation == 1 && g.State == api.GangStarting })
	if !distinct(g, 2) {
		t.Fatalf("after losing %s the gang is placed as %+v", lost, g.Placement)
	}
	for _, m := range g.Placement.Members {
		if m.Machine == lost {
			t.Fatalf("placed on the lost machine %s", lost)
		}
	}
	if _, err := c.SpawnGang(ctx, api.GangSpec{Job: "j", Name: "t", Kind: "k", Workers: 4, Strategy: api.StrategyStrictSpread}); !errors.Is(err, api.ErrNeverFits) {
		t.Fatalf("a strict spread of 4 over 3 machines: %v, want ErrNeverFits", err)
	}
	second := g.Placement.Members[0].Machine
	if err := ctl.MachineDown(ctx, second, "test"); err != nil {
		t.Fatal(err)
	}
	g = waitGang(t, c, "j", "s", func(g api.Gang) bool { return g.Generation == 2 })
	if g.State != api.GangPending || !strings.Contains(g.Reason, second) {
		t.Fatalf("after losing a second machine the gang is %s (%q): want it waiting, naming %s", g.State, g.Reason, second)
	}
	st, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, gs := range st.Gangs {
		if gs.Name == "s" && (gs.State != api.GangPending || !strings.Contains(gs.Reason, "strict-spread")) {
			t.Fatalf("status of the waiting gang: %s %q; want it pending for the strict spread", gs.State, gs.Reason)
		}
	}
	if _, err := c.RegisterMachine(ctx, machine(t, lost)); err != nil {
		t.Fatal(err)
	}
	g = waitGang(t, c, "j", "s", func(g api.Gang) bool { return g.State == api.GangStarting })
	if !distinct(g, 2) || g.Generation != 2 {
		t.Fatalf("after %s came back the gang is placed as %+v (generation %d)", lost, g.Placement, g.Generation)
	}
}

// TestStrictSpreadQueuesBehindPriority: a strict-spread gang waits in its queue behind a
// higher-priority gang submitted after it, and is placed on distinct machines once that
// one ends.
func TestStrictSpreadQueuesBehindPriority(t *testing.T) {
	c := setup(t, 3, api.SchedulerConfig{}, "block", "low", "high")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.SpawnGang(ctx, api.GangSpec{Job: "block", Name: "all", Kind: "k", Workers: 3, Resources: api.Resources{GPUs: 8}, NotPreemptible: true}); err != nil {
		t.Fatal(err)
	}
	awaitGang(t, c, "block", "all", "placed", placed)
	ss := api.GangSpec{Job: "low", Name: "ss", Kind: "k", Workers: 3, Resources: api.Resources{GPUs: 2}, Strategy: api.StrategyStrictSpread}
	if _, err := c.SpawnGang(ctx, ss); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SpawnGang(ctx, api.GangSpec{Job: "high", Name: "all", Kind: "k", Workers: 3, Resources: api.Resources{GPUs: 8}, Priority: 1}); err != nil {
		t.Fatal(err)
	}
	awaitGang(t, c, "low", "ss", "pending", pending)
	awaitGang(t, c, "high", "all", "pending", pending)
	// The blocker ends: the higher-priority gang takes the cluster, the strict spread waits.
	if err := c.StopGang(ctx, "block", "all"); err != nil {
		t.Fatal(err)
	}
	awaitGang(t, c, "high", "all", "placed", placed)
	if g := awaitGang(t, c, "low", "ss", "pending", pending); !strings.Contains(g.Reason, "GPU") {
		t.Fatalf("the strict spread waits with reason %q: want the GPUs it waits for", g.Reason)
	}
	if err := c.StopGang(ctx, "high", "all"); err != nil {
		t.Fatal(err)
	}
	g := awaitGang(t, c, "low", "ss", "placed", placed)
	if !distinct(g, 2) {
		t.Fatalf("strict spread placed as %+v", g.Placement)
	}
}

// TestStrictSpreadPreempted: a strict-spread gang holding the cluster is given a stop
// notice for a higher-priority gang (strategy gangs are preemptible like any); once it
// yields, the preemptor is placed and the strict spread queues again, to be placed on
// distinct machines when the preemptor ends.
func TestStrictSpreadPreempted(t *testing.T) {
	c := setup(t, 3, api.SchedulerConfig{NoticeGrace: api.Duration(10 * time.Second)}, "low", "high")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ss := api.GangSpec{Job: "low", Name: "ss", Kind: "k", Workers: 3, Resources: api.Resources{GPUs: 8}, Strategy: api.StrategyStrictSpread, JustInTime: true}
	if _, err := c.SpawnGang(ctx, ss); err != nil {
		t.Fatal(err)
	}
	lg := awaitGang(t, c, "low", "ss", "placed", placed)
	if !distinct(lg, 8) {
		t.Fatalf("strict spread placed as %+v", lg.Placement)
	}
	if _, err := c.SpawnGang(ctx, api.GangSpec{Job: "high", Name: "hp", Kind: "k", Workers: 2, Resources: api.Resources{GPUs: 8}, Priority: 1}); err != nil {
		t.Fatal(err)
	}
	lg = awaitGang(t, c, "low", "ss", "given a stop notice", func(g api.Gang) bool { return g.Notice != nil && g.Notice.Kind == api.NoticePreempt })
	if lg.Notice.For != "high/hp" {
		t.Fatalf("notice %+v: want one for high/hp", lg.Notice)
	}
	if err := c.Yield(ctx, api.Yield{Job: "low", Gang: "ss", UID: lg.UID, Generation: lg.Generation, Checkpointed: true, Step: 5}); err != nil {
		t.Fatal(err)
	}
	awaitGang(t, c, "high", "hp", "placed", placed)
	lg = awaitGang(t, c, "low", "ss", "requeued", func(g api.Gang) bool { return g.State == api.GangPending && g.Generation == 1 })
	if lg.Preemptions != 1 {
		t.Fatalf("strict spread preemptions %d, want 1", lg.Preemptions)
	}
	if err := c.StopGang(ctx, "high", "hp"); err != nil {
		t.Fatal(err)
	}
	lg = awaitGang(t, c, "low", "ss", "placed again", func(g api.Gang) bool { return placed(g) && g.Generation == 1 })
	if !distinct(lg, 8) {
		t.Fatalf("strict spread placed again as %+v", lg.Placement)
	}
}
