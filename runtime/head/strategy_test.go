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

// TestPinnedGangsGoOnlyToTheirMachines: a gang that names machines is placed on them alone,
// by its strategy; it waits while they are full (though others have room) and is placed
// when they free; a gang pinned to no machine of the cluster never fits.
func TestPinnedGangsGoOnlyToTheirMachines(t *testing.T) {
	_, c := group(t)
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
	machinesOf := func(g api.Gang) map[string]int {
		out := map[string]int{}
		for _, m := range g.Placement.Members {
			out[m.Machine] += len(m.GPUs)
		}
		return out
	}
	one := api.GangSpec{Job: "j", Name: "one", Kind: "k", Workers: 1, Resources: api.Resources{GPUs: 1}, Machines: []string{"m2"}}
	g, err := c.SpawnGang(ctx, one)
	if err != nil {
		t.Fatal(err)
	}
	if ms := machinesOf(g); len(ms) != 1 || ms["m2"] != 1 {
		t.Fatalf("a gang pinned to m2 placed on %v", ms)
	}
	// Pack (no strategy) on two named machines: the fewest of them, the fullest first.
	pack := api.GangSpec{Job: "j", Name: "pack", Kind: "k", Workers: 4, Resources: api.Resources{GPUs: 3}, Machines: []string{"m1", "m2"}}
	if g, err = c.SpawnGang(ctx, pack); err != nil {
		t.Fatal(err)
	}
	if ms := machinesOf(g); len(ms) != 2 || ms["m1"]+ms["m2"] != 12 {
		t.Fatalf("4 members of 3 GPUs pinned to m1 and m2 placed on %v", ms)
	}
	spread := api.GangSpec{Job: "j", Name: "spread", Kind: "k", Workers: 2, Resources: api.Resources{GPUs: 1}, Strategy: api.StrategyStrictSpread,
		Machines: []string{"m0", "m3"}}
	if g, err = c.SpawnGang(ctx, spread); err != nil {
		t.Fatal(err)
	}
	if ms := machinesOf(g); len(ms) != 2 || ms["m0"] != 1 || ms["m3"] != 1 {
		t.Fatalf("a strict spread pinned to m0 and m3 placed on %v", ms)
	}
	// The first two gangs hold part of m2: eight do not fit there, though m0 and m3 have room.
	full := api.GangSpec{Job: "j", Name: "full", Kind: "k", Workers: 8, Resources: api.Resources{GPUs: 1}, Machines: []string{"m2"}}
	if g, err = c.SpawnGang(ctx, full); err != nil {
		t.Fatal(err)
	}
	if g.State != api.GangPending || !strings.Contains(g.Reason, "[m2]") {
		t.Fatalf("a gang pinned to a full machine: %s (%q), want pending with the machine named", g.State, g.Reason)
	}
	for _, name := range []string{"one", "pack"} {
		if err := c.StopGang(ctx, "j", name); err != nil {
			t.Fatal(err)
		}
	}
	g = waitGang(t, c, "j", "full", func(g api.Gang) bool { return g.State == api.GangStarting })
	if ms := machinesOf(g); len(ms) != 1 || ms["m2"] != 8 {
		t.Fatalf("the pinned gang once m2 freed placed on %v", ms)
	}
	if _, err := c.SpawnGang(ctx, api.GangSpec{Job: "j", Name: "nowhere", Kind: "k", Workers: 1, Machines: []string{"m9"}}); !errors.Is(err, api.ErrNeverFits) {
		t.Fatalf("a gang pinned to a machine not in the cluster: %v, want ErrNeverFits", err)
	}
	for _, bad := range []api.GangSpec{
		{Job: "j", Name: "b", Kind: "k", Workers: 1, Machines: []string{"m0", "m0"}},
		{Job: "j", Name: "b", Kind: "k", Workers: 1, Machines: []string{""}},
	} {
		if _, err := c.SpawnGang(ctx, bad); !errors.Is(err, api.ErrInvalid) {
			t.Fatalf("machines %q (same island %v, min workers %d): %v, want ErrInvalid", bad.Machines, bad.SameIsland, bad.MinWorkers, err)
		}
	}
}
