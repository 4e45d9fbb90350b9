package head

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/atoll-run/atoll/runtime/api"
)

// TestStrictSpreadSurvivesMachineLoss: a strict-spread gang placed by the head moves, when
// one of its machines is lost, to machines that are all different again; with too few
// machines left it waits (pending), and is placed when a machine comes back.
func TestStrictSpreadSurvivesMachineLoss(t *testing.T) {
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
	spec := api.GangSpec{Job: "j", Name: "s", Kind: "k", Workers: 3, Resources: api.Resources{GPUs: 2}, Strategy: api.StrategyStrictSpread, MaxRestarts: 1}
	g, err := c.SpawnGang(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	distinct := func(g api.Gang) bool {
		seen := map[string]bool{}
		for _, m := range g.Placement.Members {
			if seen[m.Machine] || len(m.GPUs) != 2 {
				return false
			}
			seen[m.Machine] = true
		}
		return len(seen) == 3
	}
	if !distinct(g) {
		t.Fatalf("strict spread placed as %+v", g.Placement)
	}
	ctl := leader(t, heads).Controller()
	lost := g.Placement.Members[1].Machine
	if err := ctl.MachineDown(ctx, lost, "test"); err != nil {
		t.Fatal(err)
	}
	g = waitGang(t, c, "j", "s", func(g api.Gang) bool { return g.Generation == 1 && g.State == api.GangStarting })
	if !distinct(g) {
		t.Fatalf("after losing %s the gang is placed as %+v", lost, g.Placement)
	}
	for _, m := range g.Placement.Members {
		if m.Machine == lost {
			t.Fatalf("placed on the lost machine %s", lost)
		}
	}
	// Two machines left: three members cannot be on three machines; the gang waits.
	if err := ctl.MachineDown(ctx, g.Placement.Members[0].Machine, "test"); err != nil {
		t.Fatal(err)
	}
	g = waitGang(t, c, "j", "s", func(g api.Gang) bool { return g.Generation == 2 && g.State == api.GangPending })
	if _, err := c.SpawnGang(ctx, api.GangSpec{Job: "j", Name: "t", Kind: "k", Workers: 3, Strategy: api.StrategyStrictSpread}); !errors.Is(err, api.ErrNoCapacity) && !errors.Is(err, api.ErrNeverFits) {
		t.Fatalf("a strict spread of 3 over 2 machines: %v", err)
	}
	if _, err := c.RegisterMachine(ctx, machine(t, "m4")); err != nil {
		t.Fatal(err)
	}
	g = waitGang(t, c, "j", "s", func(g api.Gang) bool { return g.Generation == 2 && g.State == api.GangStarting })
	if !distinct(g) {
		t.Fatalf("placed again as %+v", g.Placement)
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
		{Job: "j", Name: "b", Kind: "k", Workers: 2, SameIsland: true, Machines: []string{"m0"}},
		{Job: "j", Name: "b", Kind: "k", Workers: 2, MinWorkers: 1, Machines: []string{"m0"}},
	} {
		if _, err := c.SpawnGang(ctx, bad); !errors.Is(err, api.ErrInvalid) {
			t.Fatalf("machines %q (same island %v, min workers %d): %v, want ErrInvalid", bad.Machines, bad.SameIsland, bad.MinWorkers, err)
		}
	}
}
