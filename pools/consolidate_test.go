package pools

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// consolidating returns a core with consolidation on.
func consolidating(t *testing.T) *Autoscaler {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Consolidate = true
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// ready is a ready machine of the pool hosting the gangs (each whole on it), unchanged since
// changed.
func ready(name, pool string, changed time.Time, gangs ...Gang) Machine {
	m := Machine{Name: name, Pool: pool, State: Ready, Since: t0, Changed: changed}
	for _, g := range gangs {
		m.Gangs = append(m.Gangs, Hosted{Gang: g.ID, Members: g.Size})
	}
	if len(gangs) == 0 {
		m.IdleSince = changed
	}
	return m
}

func preempted(d Decision) []string {
	var out []string
	for _, p := range d.Preemptions {
		out = append(out, p.Gang+"@"+p.Machine)
	}
	slices.Sort(out)
	return out
}

func drained(d Decision) []string {
	var out []string
	for _, dr := range d.Drains {
		out = append(out, dr.Machine)
	}
	slices.Sort(out)
	return out
}

func TestConsolidate(t *testing.T) {
	spot := testPool(t, "spot", "dgx-h100", Spot, 0, 8, 40)
	od := testPool(t, "od", "dgx-h100", OnDemand, 0, 8, 98)
	settled := t0.Add(-10 * time.Minute) // past the pools' 5-minute idle timeout
	recent := t0.Add(-time.Minute)
	g := func(id string, members, gpus int) Gang { return gpuGang(id, members, gpus, true) }
	a1, b2, c4, d6, e8 := g("a1", 1, 1), g("b2", 1, 2), g("c4", 1, 4), g("d6", 1, 6), g("e8", 1, 8)
	fixed := gpuGang("f1", 1, 1, false)
	split := g("s2", 2, 8) // two members, one on each of two machines
	cases := []struct {
		name     string
		machines []Machine
		running  []Gang
		pending  []Gang
		preempt  []string // gang@machine
		drain    []string
		launch   map[string]int
		waiting  []string
	}{
		{name: "a settled machine whose gangs fit elsewhere is emptied",
			machines: []Machine{ready("spot-0", "spot", settled, a1, b2), ready("spot-1", "spot", settled, c4)},
			running:  []Gang{a1, b2, c4},
			preempt:  []string{"a1@spot-0", "b2@spot-0"}, drain: []string{"spot-0"}},
		{name: "not before its gangs have stayed unchanged for the idle timeout",
			machines: []Machine{ready("spot-0", "spot", recent, a1, b2), ready("spot-1", "spot", recent, c4)},
			running:  []Gang{a1, b2, c4}},
		{name: "not when its gangs do not all fit elsewhere",
			machines: []Machine{ready("spot-0", "spot", settled, a1, c4), ready("spot-1", "spot", settled, d6)},
			running:  []Gang{a1, c4, d6}},
		{name: "a gang that does not tolerate interruption stays, and so does its machine",
			machines: []Machine{ready("spot-0", "spot", settled, fixed), ready("spot-1", "spot", settled, e8)},
			running:  []Gang{fixed, e8}},
		{name: "a gang with members on two machines does not move",
			machines: []Machine{{Name: "spot-0", Pool: "spot", State: Ready, Changed: settled, Gangs: []Hosted{{Gang: "s2", Members: 1}}},
				{Name: "spot-1", Pool: "spot", State: Ready, Changed: settled, Gangs: []Hosted{{Gang: "s2", Members: 1}}}, ready("spot-2", "spot", recent)},
			running: []Gang{split}},
		{name: "a machine hosting an unknown gang neither moves nor takes",
			machines: []Machine{ready("spot-0", "spot", settled, a1), {Name: "spot-1", Pool: "spot", State: Ready, Changed: settled, Gangs: []Hosted{{Gang: "ghost", Members: 1}}}},
			running:  []Gang{a1}},
		{name: "while a gang is pending nothing is emptied: the pending gang gets room",
			machines: []Machine{ready("spot-0", "spot", settled, a1), ready("spot-1", "spot", settled, c4), ready("spot-2", "spot", settled, b2)},
			running:  []Gang{a1, b2, c4}, pending: []Gang{e8}, preempt: []string{"a1@spot-0"}, waiting: []string{"e8"}},
		{name: "the emptiest machine is emptied first",
			machines: []Machine{ready("spot-0", "spot", settled, b2), ready("od-0", "od", settled, a1), ready("spot-1", "spot", settled, g("x5", 1, 5))},
			running:  []Gang{b2, a1, g("x5", 1, 5)},
			preempt:  []string{"a1@od-0", "b2@spot-0"}, drain: []string{"od-0", "spot-0"}},
		{name: "an on-demand machine whose gangs fit nowhere gets a spot machine",
			machines: []Machine{ready("od-0", "od", settled, d6), ready("spot-0", "spot", settled, e8)},
			running:  []Gang{d6, e8}, launch: map[string]int{"spot": 1}},
		{name: "a pending gang gets room by moving the fewest cards, not a launch",
			machines: []Machine{ready("spot-0", "spot", recent, c4, b2), ready("spot-1", "spot", recent, d6), ready("spot-2", "spot", recent, g("x7", 1, 7))},
			running:  []Gang{c4, b2, d6, g("x7", 1, 7)}, pending: []Gang{g("p4", 1, 4)},
			preempt: []string{"b2@spot-0"}, waiting: []string{"p4"}},
		{name: "a pending gang waits for cards already moving off a machine",
			machines: []Machine{{Name: "spot-0", Pool: "spot", State: Ready, Changed: recent, Gangs: []Hosted{{Gang: "c4", Members: 1}, {Gang: "b2", Members: 1, Stopping: true}}}},
			running:  []Gang{c4, b2}, pending: []Gang{g("p4", 1, 4)}, waiting: []string{"p4"}},
		{name: "moves dearer than the machine-time they save wait",
			machines: []Machine{ready("spot-0", "spot", settled, costly(a1, 2*time.Hour)), ready("spot-1", "spot", settled, costly(d6, 2*time.Hour))},
			running:  []Gang{costly(a1, 2*time.Hour), costly(d6, 2*time.Hour)}},
		{name: "moves dearer than a launch: a launch",
			machines: []Machine{ready("spot-0", "spot", recent, c4, costly(b2, 1000*time.Second)), ready("spot-1", "spot", recent, d6)},
			running:  []Gang{c4, costly(b2, 1000*time.Second), d6}, pending: []Gang{g("p4", 1, 4)}, launch: map[string]int{"spot": 1}},
		{name: "an on-demand premium too small for the moves: no spot machine yet",
			machines: []Machine{ready("od-0", "od", settled, costly(d6, time.Hour)), ready("spot-0", "spot", settled, e8)},
			running:  []Gang{costly(d6, time.Hour), e8}},
		{name: "no room to make: a launch",
			machines: []Machine{ready("spot-0", "spot", recent, d6), ready("spot-1", "spot", recent, d6x("d6b"))},
			running:  []Gang{d6, d6x("d6b")}, pending: []Gang{g("p4", 1, 4)}, launch: map[string]int{"spot": 1}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := &Snapshot{Now: t0, Pools: []PoolState{{Pool: spot}, {Pool: od}}, Machines: c.machines, Running: c.running, Pending: c.pending}
			d, err := consolidating(t).Decide(s)
			if err != nil {
				t.Fatal(err)
			}
			if got := preempted(d); !slices.Equal(got, c.preempt) {
				t.Errorf("preempted %v, want %v", got, c.preempt)
			}
			if got := drained(d); !slices.Equal(got, c.drain) {
				t.Errorf("drained %v, want %v", got, c.drain)
			}
			for _, p := range []string{"spot", "od"} {
				if got := launched(d, p); got != c.launch[p] {
					t.Errorf("pool %s: launched %d, want %d: %+v", p, got, c.launch[p], d.Launches)
				}
			}
			for _, w := range c.waiting {
				if r, ok := verdictOf(d.Waiting, w); !ok || !strings.Contains(r, "moving off") {
					t.Errorf("gang %s: waiting %q, want it to wait for gangs moving off a machine", w, r)
				}
			}
			for _, p := range d.Preemptions {
				if want := t0.Add(DefaultConfig().MoveDeadline); !p.Deadline.Equal(want) {
					t.Errorf("preemption %+v: deadline want %v", p, want)
				}
			}
		})
	}
}

// costly is g with a move cost.
func costly(g Gang, cost time.Duration) Gang { g.MoveCost = cost; return g }

// b2x and d6x are tolerant gangs of one member of 2 and 6 cards with the given ID.
func b2x(id string) Gang { return gpuGang(id, 1, 2, true) }
func d6x(id string) Gang { return gpuGang(id, 1, 6, true) }

// TestConsolidateOffByDefault: without Config.Consolidate nothing moves.
func TestConsolidateOffByDefault(t *testing.T) {
	spot := testPool(t, "spot", "dgx-h100", Spot, 0, 8, 40)
	a1, c4 := gpuGang("a1", 1, 1, true), gpuGang("c4", 1, 4, true)
	settled := t0.Add(-time.Hour)
	s := &Snapshot{Now: t0, Pools: []PoolState{{Pool: spot}}, Running: []Gang{a1, c4},
		Machines: []Machine{ready("spot-0", "spot", settled, a1), ready("spot-1", "spot", settled, c4)}}
	if d := decide(t, s); len(d.Preemptions)+len(d.Drains) != 0 {
		t.Fatalf("decision %+v: want nothing moved", d)
	}
}
