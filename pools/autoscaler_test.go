package pools

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func testPool(t testing.TB, name, machine string, capacity Capacity, lo, hi int, price float64) *Pool {
	t.Helper()
	ms, sh, err := LoadShape(machine, "")
	if err != nil {
		t.Fatal(err)
	}
	return &Pool{Spec: PoolSpec{Name: name, Machine: machine, Min: lo, Max: hi, Capacity: capacity, PricePerHour: price,
		IdleTimeout: Duration(5 * time.Minute), NoticeSeconds: 120, Provider: ProviderSpec{Type: "sim"}}, Shape: sh, MachineSpec: ms}
}

func gpuGang(id string, members, gpus int, tolerant bool) Gang {
	return Gang{ID: id, Size: members, Member: Member{GPUs: gpus, CPUMilli: 8000, MemMiB: 64 << 10}, Tolerant: tolerant, Arrived: t0}
}

func decide(t *testing.T, s *Snapshot) Decision {
	t.Helper()
	a, err := New(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	d, err := a.Decide(s)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func launched(d Decision, pool string) int {
	n := 0
	for _, l := range d.Launches {
		if l.Pool == pool {
			n += l.Count
		}
	}
	return n
}

func verdictOf(list []Verdict, gang string) (string, bool) {
	for _, v := range list {
		if v.Gang == gang {
			return v.Reason, true
		}
	}
	return "", false
}

func TestScaleUp(t *testing.T) {
	h100 := testPool(t, "h100", "dgx-h100", OnDemand, 0, 4, 98)
	gb := testPool(t, "gb200", "gb200-nvl72", OnDemand, 0, 36, 40)
	pairs := testPool(t, "pairs", "a100-pcie-nvlink-pairs", OnDemand, 0, 8, 20)
	sameIsland := func(g Gang) Gang { g.SameIsland = true; return g }
	cases := []struct {
		name      string
		pools     []*Pool
		machines  []Machine
		pending   []Gang
		want      map[string]int // machines launched per pool
		launches  int            // launch entries
		waiting   []string
		infeasibl []string
	}{
		{name: "16-GPU gang needs two machines, launched together",
			pools: []*Pool{h100}, pending: []Gang{gpuGang("g16", 2, 8, false)}, want: map[string]int{"h100": 2}, launches: 1},
		{name: "sixteen 1-GPU members also take exactly two machines",
			pools: []*Pool{h100}, pending: []Gang{gpuGang("g16", 16, 1, false)}, want: map[string]int{"h100": 2}, launches: 1},
		{name: "two 4-GPU gangs share one new machine",
			pools: []*Pool{h100}, pending: []Gang{gpuGang("a", 1, 4, false), gpuGang("b", 2, 2, false)}, want: map[string]int{"h100": 1}, launches: 1},
		{name: "capacity already launching is used, not launched again",
			pools:    []*Pool{h100},
			machines: []Machine{{Name: "h100-0", Pool: "h100", State: Launching, Since: t0}, {Name: "h100-1", Pool: "h100", State: Launching, Since: t0}},
			pending:  []Gang{gpuGang("g16", 2, 8, false)}, want: map[string]int{}, waiting: []string{"g16"}},
		{name: "infeasible gang beside a feasible one",
			pools: []*Pool{h100}, pending: []Gang{gpuGang("huge", 40, 8, false), gpuGang("ok", 1, 8, false), gpuGang("toobig", 1, 16, false)},
			want: map[string]int{"h100": 1}, launches: 1, infeasibl: []string{"huge", "toobig"}},
		{name: "a gang at the pool's max waits and does not block a smaller one behind it",
			pools: []*Pool{testPool(t, "h100", "dgx-h100", OnDemand, 0, 3, 98)},
			machines: []Machine{{Name: "h100-0", Pool: "h100", State: Ready, Since: t0, Gangs: []Hosted{{Gang: "x", Members: 1}}},
				{Name: "h100-1", Pool: "h100", State: Ready, Since: t0, Gangs: []Hosted{{Gang: "y", Members: 1}}}},
			pending: []Gang{gpuGang("big", 2, 8, false), gpuGang("small", 1, 8, false)},
			want:    map[string]int{"h100": 1}, launches: 1, waiting: []string{"big"}},
		{name: "same-island 16 GPUs go to a rack-fabric domain, not two NVSwitch boxes",
			pools: []*Pool{h100, gb}, pending: []Gang{sameIsland(gpuGang("si", 4, 4, false))}, want: map[string]int{"gb200": 4}, launches: 1},
		{name: "same-island gang larger than any island is infeasible",
			pools: []*Pool{h100}, pending: []Gang{sameIsland(gpuGang("si", 2, 8, false))}, want: map[string]int{}, infeasibl: []string{"si"}},
		{name: "fewest islands wins over price: 8-GPU gang on one NVSwitch box, not NVLink pairs",
			pools: []*Pool{pairs, h100}, pending: []Gang{gpuGang("g8", 4, 2, false)}, want: map[string]int{"h100": 1}, launches: 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := &Snapshot{Now: t0, Machines: c.machines, Pending: c.pending}
			for _, p := range c.pools {
				s.Pools = append(s.Pools, PoolState{Pool: p})
			}
			d := decide(t, s)
			for _, p := range c.pools {
				if got := launched(d, p.Spec.Name); got != c.want[p.Spec.Name] {
					t.Errorf("pool %s: launched %d machines, want %d (decision %+v)", p.Spec.Name, got, c.want[p.Spec.Name], d)
				}
			}
			if len(d.Launches) != c.launches {
				t.Errorf("%d launch requests, want %d: %+v", len(d.Launches), c.launches, d.Launches)
			}
			for _, g := range c.waiting {
				if _, ok := verdictOf(d.Waiting, g); !ok {
					t.Errorf("gang %s not reported waiting: %+v", g, d.Waiting)
				}
			}
			for _, g := range c.infeasibl {
				if _, ok := verdictOf(d.Infeasible, g); !ok {
					t.Errorf("gang %s not reported infeasible: %+v", g, d.Infeasible)
				}
			}
			if len(d.Infeasible) != len(c.infeasibl) {
				t.Errorf("infeasible %+v, want only %v", d.Infeasible, c.infeasibl)
			}
		})
	}
}

func TestSpotFallback(t *testing.T) {
	od := testPool(t, "od", "dgx-h100", OnDemand, 0, 4, 98)
	spot := testPool(t, "spot", "dgx-h100", Spot, 0, 4, 30)
	cases := []struct {
		name        string
		tolerant    bool
		unavailable bool
		spotFull    bool
		wantPool    string
		wantReason  string
	}{
		{name: "tolerant gang takes spot", tolerant: true, wantPool: "spot"},
		{name: "spot unavailable: on-demand fallback", tolerant: true, unavailable: true, wantPool: "od", wantReason: "on-demand fallback: pool spot: spot capacity unavailable"},
		{name: "spot pool at max: on-demand fallback", tolerant: true, spotFull: true, wantPool: "od", wantReason: "on-demand fallback: pool spot: 4 machines + 1 would pass its max 4"},
		{name: "gang without checkpoints never gets spot", tolerant: false, wantPool: "od", wantReason: "not preemptible"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := &Snapshot{Now: t0, Pools: []PoolState{{Pool: od}, {Pool: spot, SpotUnavailable: c.unavailable}},
				Pending: []Gang{gpuGang("g", 1, 8, c.tolerant)}}
			if c.spotFull {
				for i := 0; i < 4; i++ {
					s.Machines = append(s.Machines, Machine{Name: "spot-" + string(rune('a'+i)), Pool: "spot", State: Ready, Since: t0, Gangs: []Hosted{{Gang: "o", Members: 1}}})
				}
			}
			d := decide(t, s)
			if len(d.Launches) != 1 || d.Launches[0].Pool != c.wantPool || d.Launches[0].Count != 1 {
				t.Fatalf("launches %+v, want one machine of %s", d.Launches, c.wantPool)
			}
			if !strings.Contains(d.Launches[0].Reason, c.wantReason) {
				t.Errorf("reason %q does not say %q", d.Launches[0].Reason, c.wantReason)
			}
			if c.wantPool == "od" && d.Launches[0].Capacity != OnDemand || c.wantPool == "spot" && d.Launches[0].Capacity != Spot {
				t.Errorf("capacity %s", d.Launches[0].Capacity)
			}
		})
	}
	// Only spot pools and a gang that cannot be interrupted: infeasible, and said why.
	d := decide(t, &Snapshot{Now: t0, Pools: []PoolState{{Pool: spot}}, Pending: []Gang{gpuGang("g", 1, 8, false)}})
	if why, ok := verdictOf(d.Infeasible, "g"); !ok || !strings.Contains(why, "not preemptible") {
		t.Fatalf("infeasible %+v", d.Infeasible)
	}
}

func TestMinMaxBudget(t *testing.T) {
	cases := []struct {
		name     string
		pool     func(*Pool)
		spent    float64
		machines int
		busy     bool
		pending  []Gang
		launch   int
		drains   int
		waiting  string
	}{
		{name: "below min: launch to min", pool: func(p *Pool) { p.Spec.Min = 2 }, launch: 2},
		{name: "at min: idle machines past the timeout are kept", pool: func(p *Pool) { p.Spec.Min = 2 }, machines: 2},
		{name: "at max: a gang waits", pool: func(p *Pool) { p.Spec.Max = 2 }, machines: 2, busy: true, pending: []Gang{gpuGang("g", 1, 8, false)}, waiting: "would pass its max 2"},
		{name: "above max (lowered): busy machines drain", pool: func(p *Pool) { p.Spec.Max = 1 }, machines: 3, busy: true, drains: 2},
		{name: "hourly budget", pool: func(p *Pool) { p.Spec.Budget.USDPerHour = 200 }, machines: 2, busy: true, pending: []Gang{gpuGang("g", 1, 8, false)}, waiting: "budget of 200.00 USD/h"},
		{name: "total budget spent", pool: func(p *Pool) { p.Spec.Budget.USDTotal = 1000 }, spent: 1000, pending: []Gang{gpuGang("g", 1, 8, false)}, waiting: "spent 1000.00 USD"},
		{name: "budget leaves room for one", pool: func(p *Pool) { p.Spec.Budget.USDPerHour = 300 }, machines: 2, busy: true, pending: []Gang{gpuGang("g", 1, 8, false)}, launch: 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := testPool(t, "p", "dgx-h100", OnDemand, 0, 8, 100)
			c.pool(p)
			s := &Snapshot{Now: t0.Add(time.Hour), Pools: []PoolState{{Pool: p, Spent: c.spent}}, Pending: c.pending}
			for i := 0; i < c.machines; i++ {
				m := Machine{Name: "p-" + string(rune('a'+i)), Pool: "p", State: Ready, Since: t0, IdleSince: t0}
				if c.busy {
					m.Gangs, m.IdleSince = []Hosted{{Gang: "x", Members: 1}}, time.Time{}
				}
				s.Machines = append(s.Machines, m)
			}
			d := decide(t, s)
			if d.Machines() != c.launch || len(d.Drains) != c.drains {
				t.Fatalf("launched %d, drained %d; want %d, %d: %+v", d.Machines(), len(d.Drains), c.launch, c.drains, d)
			}
			if c.waiting != "" {
				if why, ok := verdictOf(d.Waiting, "g"); !ok || !strings.Contains(why, c.waiting) {
					t.Fatalf("waiting %+v, want a reason with %q", d.Waiting, c.waiting)
				}
			}
		})
	}
}

// TestScaleDownMovesLastCopyFirst follows an idle machine that holds the last copy of
// objects through the decisions that drain and remove it.
func TestScaleDownMovesLastCopyFirst(t *testing.T) {
	p := testPool(t, "p", "dgx-h100", OnDemand, 0, 4, 100)
	m := Machine{Name: "p-0", Pool: "p", State: Ready, Since: t0, IdleSince: t0, LastCopies: 3}
	busy := Machine{Name: "p-1", Pool: "p", State: Ready, Since: t0, Gangs: []Hosted{{Gang: "x", Members: 1}}}
	snap := func(now time.Time, ms ...Machine) *Snapshot {
		return &Snapshot{Now: now, Pools: []PoolState{{Pool: p}}, Machines: ms}
	}
	// Not idle long enough: nothing.
	if d := decide(t, snap(t0.Add(4*time.Minute), m, busy)); len(d.Drains)+len(d.Removes) != 0 {
		t.Fatalf("drained before the idle timeout: %+v", d)
	}
	// Past the timeout: drained, objects to move, not removed.
	d := decide(t, snap(t0.Add(6*time.Minute), m, busy))
	if len(d.Drains) != 1 || d.Drains[0].Machine != "p-0" || d.Drains[0].MoveObjects != 3 || len(d.Removes) != 0 {
		t.Fatalf("decision %+v: want p-0 drained with 3 objects to move, nothing removed", d)
	}
	// Draining, copies not moved yet: still not removed.
	m.State, m.Since = Draining, t0.Add(6*time.Minute)
	if d := decide(t, snap(t0.Add(7*time.Minute), m, busy)); len(d.Removes) != 0 {
		t.Fatalf("removed with its last copies still there: %+v", d)
	}
	// Copies moved: removed.
	m.LastCopies = 0
	d = decide(t, snap(t0.Add(8*time.Minute), m, busy))
	if len(d.Removes) != 1 || d.Removes[0].Machine != "p-0" {
		t.Fatalf("decision %+v: want p-0 removed", d)
	}
	// A draining machine whose gang does not finish is preempted after the grace, not removed.
	busy.State, busy.Since = Draining, t0
	d = decide(t, snap(t0.Add(31*time.Minute), busy))
	if len(d.Preemptions) != 1 || d.Preemptions[0].Gang != "x" || len(d.Removes) != 0 {
		t.Fatalf("decision %+v: want x preempted, p-1 kept", d)
	}
}

// TestInterruptionNotice follows a spot machine from its notice to its removal: its gang is
// asked to checkpoint before the deadline, a replacement is launched, and the machine is
// removed only once the gang stopped.
func TestInterruptionNotice(t *testing.T) {
	spot := testPool(t, "spot", "dgx-h100", Spot, 0, 4, 30)
	od := testPool(t, "od", "dgx-h100", OnDemand, 0, 4, 98)
	g := gpuGang("job/train", 2, 8, true)
	notice := t0.Add(2 * time.Minute)
	ms := []Machine{
		{Name: "spot-0", Pool: "spot", State: Ready, Since: t0, Gangs: []Hosted{{Gang: g.ID, Members: 1}}, Notice: notice},
		{Name: "spot-1", Pool: "spot", State: Ready, Since: t0, Gangs: []Hosted{{Gang: g.ID, Members: 1}}},
	}
	s := &Snapshot{Now: t0, Pools: []PoolState{{Pool: spot, SpotUnavailable: true}, {Pool: od}}, Machines: ms, Running: []Gang{g}}
	d := decide(t, s)
	if len(d.Preemptions) != 1 || d.Preemptions[0].Gang != g.ID || !d.Preemptions[0].Deadline.Equal(notice.Add(-10*time.Second)) {
		t.Fatalf("preemptions %+v: want %s to checkpoint by %v", d.Preemptions, g.ID, notice.Add(-10*time.Second))
	}
	if len(d.Drains) != 1 || d.Drains[0].Machine != "spot-0" || len(d.Removes) != 0 {
		t.Fatalf("drains %+v removes %+v: want spot-0 drained, nothing removed", d.Drains, d.Removes)
	}
	if len(d.Launches) != 1 || d.Launches[0].Replaces != "spot-0" || d.Launches[0].Count != 1 || d.Launches[0].Pool != "od" {
		t.Fatalf("launches %+v: want one on-demand replacement for spot-0 (spot unavailable)", d.Launches)
	}
	// Next decision: draining, the gang checkpointing: nothing removed, nothing launched again.
	ms[0].State, ms[0].Gangs[0].Stopping = Draining, true
	s.Now = t0.Add(30 * time.Second)
	s.Machines = append(ms, Machine{Name: "od-0", Pool: "od", State: Launching, Since: t0})
	d = decide(t, s)
	if len(d.Removes)+len(d.Launches)+len(d.Preemptions) != 0 {
		t.Fatalf("decision %+v: want nothing while the gang checkpoints", d)
	}
	// The gang stopped: the machine goes.
	ms[0].Gangs = nil
	s.Machines[0] = ms[0]
	d = decide(t, s)
	if len(d.Removes) != 1 || d.Removes[0].Machine != "spot-0" {
		t.Fatalf("removes %+v: want spot-0", d.Removes)
	}
}

func TestForecastPrewarms(t *testing.T) {
	p := testPool(t, "p", "dgx-h100", OnDemand, 0, 8, 100)
	var f Forecaster
	g := gpuGang("", 1, 8, false)
	// Two arrivals every 10 minutes for an hour.
	for i := 0; i < 12; i++ {
		f.Observe(g, t0.Add(time.Duration(i)*5*time.Minute))
	}
	fc := f.Forecast(t0.Add(time.Hour), 10*time.Minute)
	if len(fc) != 2 {
		t.Fatalf("forecast %d gangs, want 2: %+v", len(fc), fc)
	}
	d := decide(t, &Snapshot{Now: t0.Add(time.Hour), Pools: []PoolState{{Pool: p}}, Forecast: fc})
	if d.Machines() != 2 || !d.Launches[0].Prewarm {
		t.Fatalf("launches %+v: want 2 pre-warmed machines", d.Launches)
	}
	// Arrivals stop: the forecast decays to nothing.
	if fc := f.Forecast(t0.Add(5*time.Hour), 10*time.Minute); len(fc) != 0 {
		t.Fatalf("forecast %d gangs after 4 quiet hours", len(fc))
	}
}

func TestSnapshotErrors(t *testing.T) {
	p := testPool(t, "p", "dgx-h100", OnDemand, 0, 8, 100)
	for _, s := range []*Snapshot{
		{Pools: []PoolState{{Pool: p}, {Pool: p}}},
		{Pools: []PoolState{{Pool: p}}, Machines: []Machine{{Name: "x", Pool: "q", State: Ready}}},
		{Pools: []PoolState{{Pool: p}}, Machines: []Machine{{Name: "x", Pool: "p", State: Ready}, {Name: "x", Pool: "p", State: Ready}}},
		{Pools: []PoolState{{Pool: p}}, Machines: []Machine{{Name: "x", Pool: "p"}}},
	} {
		a, _ := New(DefaultConfig())
		if _, err := a.Decide(s); !errors.Is(err, ErrSnapshot) {
			t.Errorf("snapshot %+v: error %v, want ErrSnapshot", s, err)
		}
	}
}

// TestDecideDeterministic runs Decide on one snapshot many times, and on the same machines
// listed in other orders (so the per-domain counts are built in other insertion orders):
// with two NVLink domains equally full, every decision must be the same.
func TestDecideDeterministic(t *testing.T) {
	gb := testPool(t, "gb200", "gb200-nvl72", OnDemand, 0, 36, 40)
	var machines []Machine
	for dom := 0; dom < 4; dom++ {
		for i := 0; i < 3; i++ {
			machines = append(machines, Machine{Name: fmt.Sprintf("gb-%d-%d", dom, i), Pool: "gb200", State: Ready, Domain: dom, Since: t0,
				Gangs: []Hosted{{Gang: "busy", Members: 1}}})
		}
	}
	orders := [][]Machine{machines, slices.Clone(machines), nil}
	slices.Reverse(orders[1])
	for i := range machines { // interleaved: domains first seen 3, 0, 2, 1
		orders[2] = append(orders[2], machines[(i*5+9)%len(machines)])
	}
	var want Decision
	for k, ms := range orders {
		for i := 0; i < 50; i++ {
			s := &Snapshot{Now: t0, Pools: []PoolState{{Pool: gb}}, Machines: ms, Pending: []Gang{gpuGang("g", 8, 4, false)}}
			d := decide(t, s)
			if k == 0 && i == 0 {
				want = d
				continue
			}
			if !reflect.DeepEqual(d, want) {
				t.Fatalf("order %d, run %d: decision %+v, want %+v", k, i, d, want)
			}
		}
	}
	if len(want.Launches) != 1 || want.Launches[0].Domain != 0 {
		t.Fatalf("launches %+v: want one, in domain 0 (the lowest of those equally full)", want.Launches)
	}
}

// TestForecastWithoutVerdicts: a forecast gang that can never be placed (invalid, or pinned
// to a pool no longer configured, as the Forecaster keeps the pool it observed) gets no
// verdict and launches nothing; Decide must not fail on it.
func TestForecastWithoutVerdicts(t *testing.T) {
	p := testPool(t, "p", "dgx-h100", OnDemand, 0, 8, 100)
	gone := gpuGang("forecast/gone", 1, 8, false)
	gone.Pool = "removed"
	cases := []struct {
		name string
		g    Gang
	}{
		{name: "invalid", g: gpuGang("forecast/invalid", 0, 8, false)},
		{name: "pinned to a pool no longer configured", g: gone},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := decide(t, &Snapshot{Now: t0, Pools: []PoolState{{Pool: p}}, Forecast: []Gang{c.g}, Pending: []Gang{gpuGang("real", 1, 8, false)}})
			if len(d.Infeasible)+len(d.Waiting) != 0 {
				t.Errorf("verdicts for a forecast gang: infeasible %+v, waiting %+v", d.Infeasible, d.Waiting)
			}
			if len(d.Launches) != 1 || d.Launches[0].Prewarm || !slices.Equal(d.Launches[0].Gangs, []string{"real"}) {
				t.Errorf("launches %+v: want only the pending gang's", d.Launches)
			}
		})
	}
}

// TestReplacementsNameTheirMachine: a gang on two machines that both got an interruption
// notice gets a replacement for each, each naming the machine it replaces.
func TestReplacementsNameTheirMachine(t *testing.T) {
	spot := testPool(t, "spot", "dgx-h100", Spot, 0, 4, 30)
	od := testPool(t, "od", "dgx-h100", OnDemand, 0, 4, 98)
	g := gpuGang("job/train", 3, 8, true)
	hosted := func(n int) []Hosted { return []Hosted{{Gang: g.ID, Members: n}} }
	notice := t0.Add(2 * time.Minute)
	s := &Snapshot{Now: t0, Pools: []PoolState{{Pool: spot, SpotUnavailable: true}, {Pool: od}}, Running: []Gang{g}, Machines: []Machine{
		{Name: "spot-0", Pool: "spot", State: Ready, Since: t0, Gangs: hosted(2), Notice: notice},
		{Name: "spot-1", Pool: "spot", State: Ready, Since: t0, Gangs: hosted(1), Notice: notice},
	}}
	d := decide(t, s)
	got := map[string]int{}
	for _, l := range d.Launches {
		got[l.Replaces] += l.Count
	}
	if want := map[string]int{"spot-0": 2, "spot-1": 1}; !reflect.DeepEqual(got, want) {
		t.Fatalf("machines launched per replaced machine %v, want %v: %+v", got, want, d.Launches)
	}
}

// TestTopUpUsesIdleMachines follows a gang too large for a spot pool's idle machines: it gets
// only the machines they lack, on spot where the whole gang on fresh machines would pass the
// pool's max and fall back to on-demand; the idle machines it is counted on are not drained
// for idleness; and once the launches are in flight, it waits for them.
func TestTopUpUsesIdleMachines(t *testing.T) {
	od := testPool(t, "od", "dgx-h100", OnDemand, 0, 8, 98)
	spot := testPool(t, "spot", "dgx-h100", Spot, 0, 6, 40)
	idleSince := t0.Add(-time.Hour) // long past the 5 min idle timeout
	var ms []Machine
	for i := range 3 {
		ms = append(ms, Machine{Name: fmt.Sprintf("spot-idle-%d", i), Pool: "spot", State: Ready, Since: t0.Add(-2 * time.Hour), IdleSince: idleSince})
	}
	ms = append(ms, Machine{Name: "spot-busy", Pool: "spot", State: Ready, Since: t0.Add(-2 * time.Hour), Gangs: []Hosted{{Gang: "x", Members: 1}}})
	pending := []Gang{gpuGang("g", 5, 8, true)} // 40 cards: 3 idle machines + 2 fresh
	d := decide(t, &Snapshot{Now: t0, Pools: []PoolState{{Pool: od}, {Pool: spot}}, Machines: ms, Pending: pending})
	if launched(d, "spot") != 2 || launched(d, "od") != 0 {
		t.Fatalf("launches %+v, want 2 spot machines beside the 3 idle ones (5 fresh would pass the max of 6 and go on-demand)", d.Launches)
	}
	if !strings.Contains(d.Launches[0].Reason, "need 2 machines beside the pool's idle ones") {
		t.Errorf("reason %q", d.Launches[0].Reason)
	}
	for _, dr := range d.Drains {
		t.Errorf("drained %s (%s), which the gang is counted on", dr.Machine, dr.Reason)
	}

	// The next decision: the two launching, the idle ones still idle and past their timeout.
	ms = append(ms, Machine{Name: "spot-new-0", Pool: "spot", State: Launching, Since: t0}, Machine{Name: "spot-new-1", Pool: "spot", State: Launching, Since: t0})
	d = decide(t, &Snapshot{Now: t0.Add(10 * time.Second), Pools: []PoolState{{Pool: od}, {Pool: spot}}, Machines: ms, Pending: pending})
	if d.Machines() != 0 || len(d.Drains) != 0 {
		t.Fatalf("launched %d, drained %+v; want neither while the gang waits for its machines", d.Machines(), d.Drains)
	}
	if why, ok := verdictOf(d.Waiting, "g"); !ok || !strings.Contains(why, "launching in pool spot") {
		t.Fatalf("waiting %+v", d.Waiting)
	}

	// Without a pending gang the idle machines go as before.
	d = decide(t, &Snapshot{Now: t0, Pools: []PoolState{{Pool: od}, {Pool: spot}}, Machines: ms[:4]})
	if len(d.Drains) != 3 {
		t.Fatalf("drains %+v, want the 3 idle machines", d.Drains)
	}

	// A gang the idle machines hold alone is the scheduler's to place there: it does not
	// combine with them, and the pool sizes for it as for any pending gang.
	d = decide(t, &Snapshot{Now: t0, Pools: []PoolState{{Pool: od}, {Pool: spot}}, Machines: ms[:4], Pending: []Gang{gpuGang("s", 2, 8, true)}})
	if launched(d, "spot") != 2 {
		t.Fatalf("launches %+v, want the 2 fresh machines a gang the idle ones hold gets", d.Launches)
	}
}
