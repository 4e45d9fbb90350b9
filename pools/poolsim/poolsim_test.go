package poolsim

import (
	"context"
	"testing"
	"time"
)

// TestPolicies replays a small synthetic trace: every job finishes under every policy,
// the static reference costs the most, and only the notice-handling policies lose no
// work beyond restores to interruptions.
func TestPolicies(t *testing.T) {
	set, err := Builtin()
	if err != nil {
		t.Fatal(err)
	}
	for i := range set.Pools {
		set.Pools[i].Spec.Max = 4
		if set.Pools[i].Spec.InterruptionsPerHour > 0 {
			set.Pools[i].Spec.InterruptionsPerHour = 0.5 // many interruptions in a short trace
		}
	}
	var jobs []Job
	for i := 0; i < 40; i++ {
		jobs = append(jobs, Job{ID: "j", Submit: time.Duration(i) * 20 * time.Minute, Duration: 2 * time.Hour, GPUs: []int{1, 4, 8, 16}[i%4]})
	}
	res, err := Run(context.Background(), jobs, set, DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	by := map[string]Result{}
	for _, r := range res {
		by[r.Policy] = r
		if r.Unfinished != 0 {
			t.Errorf("%s left %d jobs unfinished", r.Policy, r.Unfinished)
		}
		t.Logf("%+v", r)
	}
	if len(by) != 6 {
		t.Fatalf("policies %v", res)
	}
	if by["static"].CostVsOnDemandPct != 100 || by["atoll"].Cost >= by["static"].Cost {
		t.Errorf("atoll %.0f USD vs static %.0f", by["atoll"].Cost, by["static"].Cost)
	}
	if by["static"].Interruptions != 0 || by["atoll-on-demand"].Interruptions != 0 || by["atoll-on-demand"].SpotShare != 0 {
		t.Errorf("static on-demand machines interrupted")
	}
	if by["atoll"].Interruptions > 0 && by["ray"].Interruptions > 0 {
		perA := by["atoll"].LostGPUHours / float64(by["atoll"].Interruptions)
		perR := by["ray"].LostGPUHours / float64(by["ray"].Interruptions)
		if perA >= perR {
			t.Errorf("atoll loses %.2f GPU-h per interruption, ray %.2f: notices should save the work", perA, perR)
		}
	}
}
