package poolsim

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/atoll-run/atoll/pools"
)

// TestRayUpscalingBound replays a burst of gangs under the Ray model and checks every
// reconcile that requested instances: per node type at most
// max(1, ceil(upscaling_speed × instances requested or allocated)), at most
// MaxConcurrentLaunches in all, and that the bound did hold instances back (else the test
// would prove nothing).
func TestRayUpscalingBound(t *testing.T) {
	cases := []struct {
		name  string
		speed float64
		conc  int
	}{
		{name: "Ray's defaults", speed: 1, conc: 10},
		{name: "half speed", speed: 0.5, conc: 10},
		{name: "fast, capped by concurrent launches", speed: 4, conc: 6},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			set := testSet(t, 32, 32, 0)
			var jobs []Job
			for i := 0; i < 40; i++ {
				jobs = append(jobs, Job{ID: "burst", Submit: time.Duration(i) * time.Second, Duration: 2 * time.Hour, GPUs: 8})
			}
			opt := DefaultOptions()
			opt.Ray.UpscalingSpeed, opt.Ray.MaxConcurrentLaunches = c.speed, c.conc
			sc := &rayScaler{cfg: opt.Ray}
			w := newWorld(jobs, set, opt, sc)
			if err := w.run(context.Background()); err != nil {
				t.Fatal(err)
			}
			w.finish()
			if w.res.Unfinished != 0 {
				t.Fatalf("%d jobs unfinished", w.res.Unfinished)
			}
			held := false
			for _, r := range sc.rounds {
				total := 0
				for p, n := range r.requested {
					bound := max(1, int(math.Ceil(c.speed*float64(r.allocated[p]))))
					if n > bound {
						t.Errorf("at %v pool %d: %d requested with %d allocated, bound %d", r.at, p, n, r.allocated[p], bound)
					}
					total += n
					if n == bound && r.queued > 0 {
						held = true
					}
				}
				if total > c.conc {
					t.Errorf("at %v: %d requested, max concurrent launches %d", r.at, total, c.conc)
				}
				if total == c.conc && r.queued > 0 {
					held = true
				}
			}
			if !held {
				t.Errorf("the bound never held instances back in %d rounds: the burst did not test it", len(sc.rounds))
			}
		})
	}
}

// TestRayBestNode: Ray's scorer packs onto the most utilized node that takes the request,
// and a node type's priority (spot, in the model) only breaks ties.
func TestRayBestNode(t *testing.T) {
	set := testSet(t, 4, 4, 0)
	w := newWorld([]Job{{ID: "j", Duration: time.Hour, GPUs: 1}}, set, DefaultOptions(), idleScaler{})
	r := &rayScaler{cfg: DefaultRayConfig()}
	spot, od := -1, -1
	for i, p := range set.Pools {
		if p.Spec.Capacity == pools.Spot {
			spot = i
		} else {
			od = i
		}
	}
	nodes := []rnode{
		{pool: od, total: 8, avail: 8, mi: 0},
		{pool: od, total: 8, avail: 3, mi: 1},
		{pool: spot, total: 8, avail: 8, mi: 2},
	}
	if i, n, rem := r.bestNode(w, []int{2}, nodes); i != 1 || n.avail != 1 || len(rem) != 0 {
		t.Errorf("2 GPUs went to node %d (avail after %d, left %v), want the fuller node 1", i, n.avail, rem)
	}
	if i, _, _ := r.bestNode(w, []int{8}, nodes); i != 2 {
		t.Errorf("8 GPUs went to node %d, want the spot node 2 (ties broken by priority)", i)
	}
	if i, _, rem := r.bestNode(w, []int{8, 8, 8}, nodes[:2]); i != 0 || len(rem) != 2 {
		t.Errorf("three 8-GPU bundles: node %d took some, %d left; want node 0 to take one", i, len(rem))
	}
	// A gang larger than all the capacity there could be is never planned.
	big := []int{8, 8, 8, 8, 8, 8, 8, 8, 8}
	if _, rem := r.trySchedule(w, nodes, big); len(rem) == 0 {
		t.Error("nine 8-GPU bundles fit on 3 nodes plus 5 more of room")
	}
}

// TestRayIgnoresNotices: Ray hears of no notice; an interrupted gang restarts from its
// periodic checkpoint, and nothing is checkpointed on request.
func TestRayIgnoresNotices(t *testing.T) {
	set := testSet(t, 4, 4, 0.5)
	var jobs []Job
	for i := 0; i < 12; i++ {
		jobs = append(jobs, Job{ID: "j", Submit: time.Duration(i) * 10 * time.Minute, Duration: 3 * time.Hour, GPUs: []int{1, 4, 8, 16}[i%4]})
	}
	opt := DefaultOptions()
	opt.Policies = []string{"ray"}
	res, err := Run(context.Background(), jobs, set, opt)
	if err != nil {
		t.Fatal(err)
	}
	r := res[0]
	if r.Interruptions == 0 || r.CheckpointsSaved+r.CheckpointsMissed != 0 || r.LostGPUHours <= 0 || r.Unfinished != 0 {
		t.Fatalf("ray: %+v: want interruptions, no checkpoint on request, work lost, every job done", r)
	}
}
