package head

import (
	"context"
	"errors"
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
