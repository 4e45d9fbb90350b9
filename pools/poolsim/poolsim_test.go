package poolsim

import (
	"context"
	"testing"
	"time"
)

// synthetic is a small trace of mixed gangs, two hours each, one every 20 minutes.
func synthetic(n int) []Job {
	var jobs []Job
	for i := 0; i < n; i++ {
		jobs = append(jobs, Job{ID: "j", Submit: time.Duration(i) * 20 * time.Minute, Duration: 2 * time.Hour, GPUs: []int{1, 4, 8, 16}[i%4]})
	}
	return jobs
}

// TestPolicies replays a small synthetic trace with many interruptions under every policy:
// every job finishes; no policy pays less than the oracle or saves more than the max
// saving; the bounds are the same in every result; the static reference costs the most;
// on-demand policies see no interruption; Ray checkpoints nothing on request, while the
// notice-taking policies do.
func TestPolicies(t *testing.T) {
	set := testSet(t, 4, 4, 0.5)
	res, err := Run(context.Background(), synthetic(40), set, DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	by := map[string]Result{}
	for _, r := range res {
		by[r.Policy] = r
		if r.Unfinished != 0 {
			t.Errorf("%s left %d jobs unfinished", r.Policy, r.Unfinished)
		}
		if r.Cost < r.OracleCostUSD || r.SavingPct > r.MaxSavingPct {
			t.Errorf("%s: cost %.0f, oracle %.0f, saving %.1f%% of max %.1f%%", r.Policy, r.Cost, r.OracleCostUSD, r.SavingPct, r.MaxSavingPct)
		}
		if r.MaxSavingPct != res[0].MaxSavingPct || r.OracleCostUSD != res[0].OracleCostUSD || r.GoodputBoundPct != res[0].GoodputBoundPct {
			t.Errorf("%s: bounds differ from %s's", r.Policy, res[0].Policy)
		}
		if r.UsefulGPUHours+r.LaunchingGPUHours+r.UnusedGPUHours+r.LostGPUHours > r.PaidGPUHours*1.0001 {
			t.Errorf("%s: the paid GPU-hours' causes add up to more than paid: %+v", r.Policy, r)
		}
		t.Logf("%-16s cost %6.0f saving %5.1f%% (max %.1f) goodput %5.1f%% intr %d saved %d missed %d lost %.1f",
			r.Policy, r.Cost, r.SavingPct, r.MaxSavingPct, r.GoodputPct, r.Interruptions, r.CheckpointsSaved, r.CheckpointsMissed, r.LostGPUHours)
	}
	if len(by) != len(Policies()) {
		t.Fatalf("policies %v", res)
	}
	for name, r := range by {
		if name != "static" && r.Cost >= by["static"].Cost {
			t.Errorf("%s costs %.0f, static %.0f", name, r.Cost, by["static"].Cost)
		}
	}
	if by["static"].CostVsOnDemandPct != 100 || by["static"].Interruptions+by["atoll-on-demand"].Interruptions != 0 || by["atoll-on-demand"].SpotShare != 0 {
		t.Errorf("static or on-demand policies interrupted or on spot")
	}
	if by["ray"].CheckpointsSaved != 0 || by["ray"].Interruptions == 0 {
		t.Errorf("ray: %d interruptions, %d checkpoints saved: want some, and none", by["ray"].Interruptions, by["ray"].CheckpointsSaved)
	}
	for _, name := range []string{"atoll", "kueue"} {
		if by[name].Interruptions > 0 && by[name].CheckpointsSaved == 0 {
			t.Errorf("%s: %d interruptions and no checkpoint saved", name, by[name].Interruptions)
		}
	}
}

// TestCheckpointsThatDoNotFitLoseWork: with a checkpoint too large to write within the
// notice, the notice-taking policies miss their checkpoints and lose more work than when it
// fits; the same model applies to every policy.
func TestCheckpointsThatDoNotFitLoseWork(t *testing.T) {
	set := testSet(t, 4, 4, 0.5)
	for _, policy := range []string{"atoll", "kueue"} {
		lost := map[float64]float64{}
		for _, gb := range []float64{10, 40} { // 40 s or 160 s on an 8-GPU machine at 2 GB/s, 120 s notices
			opt := DefaultOptions()
			opt.Policies = []string{policy}
			opt.Checkpoint.GBPerGPU = gb
			res, err := Run(context.Background(), synthetic(40), set, opt)
			if err != nil {
				t.Fatal(err)
			}
			r := res[0]
			if r.Unfinished != 0 || r.Interruptions == 0 {
				t.Fatalf("%s, %v GB/GPU: %+v", policy, gb, r)
			}
			if gb == 40 && r.CheckpointsMissed == 0 {
				t.Errorf("%s: a 160 s checkpoint never missed a 120 s notice", policy)
			}
			lost[gb] = r.LostGPUHours / float64(r.Interruptions)
		}
		if lost[40] <= lost[10] {
			t.Errorf("%s: lost %.2f GPU-h per interruption with checkpoints that do not fit, %.2f with ones that do", policy, lost[40], lost[10])
		}
	}
}

func TestOptionsValidate(t *testing.T) {
	if err := DefaultOptions().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	bad := []func(*Options){
		func(o *Options) { o.CheckpointEvery = 0 },
		func(o *Options) { o.Checkpoint.StorageGBps = 0 },
		func(o *Options) { o.Checkpoint.GBPerGPU = -1 },
		func(o *Options) { o.Policies = []string{"nosuch"} },
		func(o *Options) { o.Ray.UpscalingSpeed = 0 },
		func(o *Options) { o.Ray.MaxConcurrentLaunches = 0 },
		func(o *Options) { o.Kueue.GPUUtilizationThreshold = 2 },
		func(o *Options) { o.Kueue.RetryMax = time.Second },
	}
	for i, f := range bad {
		o := DefaultOptions()
		f(&o)
		if err := o.Validate(); err == nil {
			t.Errorf("case %d: %+v accepted", i, o)
		}
	}
}
