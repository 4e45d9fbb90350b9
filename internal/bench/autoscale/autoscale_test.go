package autoscale

import (
	"context"
	"testing"
)

// TestRunSmall runs the benchmark at a small size: both the batched decision and the
// per-gang loop launch capacity, and the snapshot's infeasible gangs are reported.
func TestRunSmall(t *testing.T) {
	res, err := Run(context.Background(), Options{Machines: 40, Gangs: 200, Reps: 3, Baseline: true, Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	if res.MachinesLaunched == 0 || res.BaselineLaunched == 0 {
		t.Fatalf("nothing launched: %+v", res)
	}
	if res.Infeasible == 0 {
		t.Fatalf("the snapshot's 16-card members were not reported infeasible: %+v", res)
	}
	if res.DecisionP99ms < res.DecisionP50ms || res.SpeedupVsPerGang <= 0 {
		t.Fatalf("percentiles or ratio wrong: %+v", res)
	}
	if _, err := Run(context.Background(), Options{Machines: -1}); err == nil {
		t.Fatal("negative machines accepted")
	}
}
