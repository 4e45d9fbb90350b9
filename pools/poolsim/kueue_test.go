package poolsim

import (
	"context"
	"testing"
	"time"

	"github.com/atoll-run/atoll/pools"
)

// TestKueueAdmitsWholeWorkloads: quota is reserved for a whole workload in one flavor or
// not at all, so a workload runs all its pods on one pool or none; spot first while its
// quota holds the whole workload.
func TestKueueAdmitsWholeWorkloads(t *testing.T) {
	set := testSet(t, 1, 4, 0) // quotas: spot 8 GPUs, on-demand 32
	jobs := []Job{
		{ID: "a16", Submit: 0, Duration: 2 * time.Hour, GPUs: 16},
		{ID: "b8", Submit: 0, Duration: 2 * time.Hour, GPUs: 8},
		{ID: "c32", Submit: time.Minute, Duration: time.Hour, GPUs: 32},
	}
	opt := DefaultOptions()
	k := newKueue(opt.Kueue, set)
	w := newWorld(jobs, set, opt, k)
	if err := k.start(w); err != nil {
		t.Fatal(err)
	}
	runUntil(t, w, 30*time.Minute)
	checkWhole(t, w)
	od, spot := poolOf(t, set, pools.OnDemand), poolOf(t, set, pools.Spot)
	flavor := func(ji int) *pools.Pool {
		if wl := k.wl[ji]; wl != nil && wl.flavor >= 0 {
			return &set.Pools[wl.flavor]
		}
		return nil
	}
	if flavor(0) != od || flavor(1) != spot {
		t.Errorf("flavors: a16 %v, b8 %v; want a16 on-demand (spot quota is 8), b8 spot", flavor(0), flavor(1))
	}
	if w.jobs[2].started >= 0 || flavor(2) != nil {
		t.Errorf("c32 got quota or started though 16 + 32 GPUs pass the on-demand quota")
	}
	if n := len(w.alive()); n != 3 {
		t.Errorf("%d machines, want 3 (two for a16, one for b8, none for c32)", n)
	}
	if err := w.loop(context.Background(), -1); err != nil {
		t.Fatal(err)
	}
	checkWhole(t, w)
	w.finish()
	if w.res.Unfinished != 0 {
		t.Fatalf("%d unfinished", w.res.Unfinished)
	}
}

// TestKueueAtomicScaleUp: a ProvisioningRequest gets all the nodes its workload needs in one
// scale-up or none; none leaves it to retry with a growing backoff.
func TestKueueAtomicScaleUp(t *testing.T) {
	for _, max := range []int{2, 3} {
		set := testSet(t, 0, max, 0)
		od := &set.Pools[0]
		opt := DefaultOptions()
		k := newKueue(opt.Kueue, set)
		w := newWorld([]Job{{ID: "busy", GPUs: 8, Duration: 10 * time.Hour}, {ID: "g16", GPUs: 16, Duration: time.Hour}}, set, opt, k)
		// By hand, without the event loop: busy runs on the one machine there is, g16 waits.
		readyMachine(w, od)
		w.pending = []int{1}
		w.jobs[0].on, w.jobs[0].started = map[int]int{0: 1}, 0
		w.machines[0].free, w.machines[0].hosts, w.machines[0].idleSince = 0, map[int]int{0: 1}, -1
		k.quota[0] = 1000 // quota out of the way: the node group's max decides
		if err := k.reconcile(w); err != nil {
			t.Fatal(err)
		}
		launched := len(w.machines) - 1
		switch {
		case max == 2 && (launched != 0 || len(k.reqs) != 1 || k.reqs[0].retryAt != opt.Kueue.RetryInitial || k.wl[1].admitted):
			t.Errorf("max 2: %d launched, requests %+v: want none launched and a retry after %v", launched, k.reqs, opt.Kueue.RetryInitial)
		case max == 3 && (launched != 2 || len(k.reqs) != 0 || !k.wl[1].admitted):
			t.Errorf("max 3: %d launched, requests %d, admitted %v: want both nodes at once and the workload admitted", launched, len(k.reqs), k.wl[1].admitted)
		}
	}
}

// TestKueueScaleDown: CA removes a node below the utilization threshold whose pods fit on
// another node, once it has been unneeded for scale-down-unneeded-time; its pod is evicted
// with a grace that fits its checkpoint, and nothing is lost.
func TestKueueScaleDown(t *testing.T) {
	set := testSet(t, 0, 4, 0)
	jobs := []Job{
		{ID: "x1", Submit: 0, Duration: 10 * time.Hour, GPUs: 1},
		{ID: "y4", Submit: 0, Duration: time.Hour, GPUs: 4},
		{ID: "z4", Submit: 0, Duration: 10 * time.Hour, GPUs: 4},
	}
	opt := DefaultOptions()
	k := newKueue(opt.Kueue, set)
	w := newWorld(jobs, set, opt, k)
	runUntil(t, w, 30*time.Minute)
	if n := len(w.alive()); n != 2 {
		t.Fatalf("%d machines, want 2 (x1 and y4 on one, z4 on another)", n)
	}
	x := w.jobs[0]
	var home int
	for mi := range x.on {
		home = mi
	}
	// When y4 ends, x1's node is 1/8 used and x1 fits beside z4.
	yEnd := w.jobs[1].firstStart + time.Hour
	if _, ok := w.jobs[1].on[home]; !ok {
		t.Fatalf("y4 is not beside x1")
	}
	runUntil(t, w, yEnd+opt.Kueue.ScaleDownUnneededTime-time.Minute)
	if w.machines[home].gone || w.machines[home].draining {
		t.Fatalf("x1's node removed before it was unneeded for %v", opt.Kueue.ScaleDownUnneededTime)
	}
	runUntil(t, w, yEnd+opt.Kueue.ScaleDownUnneededTime+2*time.Minute)
	if !w.machines[home].gone {
		t.Fatalf("x1's node not removed %v after it became unneeded", opt.Kueue.ScaleDownUnneededTime)
	}
	if x.started < 0 || w.res.CheckpointsSaved != 1 || w.res.CheckpointsMissed != 0 || x.progress < time.Hour {
		t.Errorf("x1: started %v, progress %v, checkpoints saved %d missed %d: want it moved with its work", x.started, x.progress, w.res.CheckpointsSaved, w.res.CheckpointsMissed)
	}
	checkWhole(t, w)
}

// TestKueueNoticeCheckpoints: with a node termination handler, a spot notice drains the
// node and its pods checkpoint within the notice; without one, the work since the last
// periodic checkpoint is lost.
func TestKueueNoticeCheckpoints(t *testing.T) {
	var jobs []Job
	for i := 0; i < 16; i++ {
		jobs = append(jobs, Job{ID: "j", Submit: time.Duration(i) * 5 * time.Minute, Duration: 4 * time.Hour, GPUs: []int{2, 4, 8}[i%3]})
	}
	lost := map[bool]float64{}
	for _, nth := range []bool{true, false} {
		opt := DefaultOptions()
		opt.Policies = []string{"kueue"}
		opt.Kueue.NodeTerminationHandler = nth
		res, err := Run(context.Background(), jobs, testSet(t, 8, 8, 0.5), opt)
		if err != nil {
			t.Fatal(err)
		}
		r := res[0]
		if r.Interruptions == 0 || r.Unfinished != 0 {
			t.Fatalf("handler %v: %+v: want interruptions and every job done", nth, r)
		}
		if nth && r.CheckpointsSaved == 0 {
			t.Errorf("with the handler no checkpoint was saved: %+v", r)
		}
		lost[nth] = r.LostGPUHours / float64(r.Interruptions)
	}
	if lost[true] >= lost[false] {
		t.Errorf("lost %.2f GPU-h per interruption with the handler, %.2f without: the checkpoints saved nothing", lost[true], lost[false])
	}
}
