package poolsim

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/atoll-run/atoll/pools"
)

// testSet is the built-in pair of DGX H100 pools with the given maxes (0 drops the pool)
// and spot interruption rate.
func testSet(t *testing.T, spotMax, odMax int, rate float64) *pools.Set {
	t.Helper()
	set, err := Builtin()
	if err != nil {
		t.Fatal(err)
	}
	var keep []pools.Pool
	for _, p := range set.Pools {
		if p.Spec.Capacity == pools.Spot {
			p.Spec.Max, p.Spec.InterruptionsPerHour = spotMax, rate
		} else {
			p.Spec.Max = odMax
		}
		if p.Spec.Max > 0 {
			keep = append(keep, p)
		}
	}
	set.Pools = keep
	return set
}

// poolOf returns the set's pool of that capacity.
func poolOf(t *testing.T, set *pools.Set, c pools.Capacity) *pools.Pool {
	t.Helper()
	for i := range set.Pools {
		if set.Pools[i].Spec.Capacity == c {
			return &set.Pools[i]
		}
	}
	t.Fatalf("no %s pool", c)
	return nil
}

// idleScaler buys nothing: tests drive the world themselves.
type idleScaler struct{}

func (idleScaler) name() string                      { return "idle" }
func (idleScaler) interval() time.Duration           { return time.Hour }
func (idleScaler) start(*world) error                { return nil }
func (idleScaler) reconcile(*world) error            { return nil }
func (idleScaler) wake(*world) (time.Duration, bool) { return 0, false }

// readyMachine launches a machine of the pool and makes it ready at once.
func readyMachine(w *world, p *pools.Pool) int {
	i := w.launch(p)
	m := w.machines[i]
	m.ready, m.readyAt, m.idleSince, m.changed = true, w.now, w.now, w.now
	w.capVer++
	return i
}

// runUntil runs the world's events up to t.
func runUntil(t *testing.T, w *world, at time.Duration) {
	t.Helper()
	if err := w.loop(context.Background(), at); err != nil {
		t.Fatal(err)
	}
}

// checkWhole fails unless every running job has all its members placed, on one pool when
// pinned (a Kueue flavor).
func checkWhole(t *testing.T, w *world) {
	t.Helper()
	for ji, j := range w.jobs {
		n := 0
		var ps []*pools.Pool
		for mi, k := range j.on {
			n += k
			if p := w.machines[mi].pool; !slices.Contains(ps, p) {
				ps = append(ps, p)
			}
		}
		if n != 0 && n != j.members {
			t.Errorf("job %d: %d of its %d members placed", ji, n, j.members)
		}
		if j.pool != nil && len(ps) > 0 && (len(ps) > 1 || ps[0] != j.pool) {
			t.Errorf("job %d admitted to pool %s runs on %d pools", ji, j.pool.Spec.Name, len(ps))
		}
	}
}
