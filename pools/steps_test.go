package pools

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestByPriority(t *testing.T) {
	g := func(id string, prio int, at time.Duration) Gang {
		return Gang{ID: id, Priority: prio, Arrived: t0.Add(at)}
	}
	cases := []struct {
		name  string
		gangs []Gang
		want  []string
	}{
		{name: "empty"},
		{name: "larger priority first", gangs: []Gang{g("a", 0, 0), g("b", 5, time.Hour), g("c", 1, 0)}, want: []string{"b", "c", "a"}},
		{name: "then earlier arrival", gangs: []Gang{g("a", 1, 2), g("b", 1, 1)}, want: []string{"b", "a"}},
		{name: "then by ID", gangs: []Gang{g("b", 1, 0), g("a", 1, 0)}, want: []string{"a", "b"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			in := append([]Gang(nil), c.gangs...)
			var got []string
			for _, x := range byPriority(c.gangs) {
				got = append(got, x.ID)
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("order %v, want %v", got, c.want)
			}
			if !reflect.DeepEqual(in, c.gangs) {
				t.Errorf("the input was reordered: %v", c.gangs)
			}
		})
	}
}

func TestDrained(t *testing.T) {
	hosted := []Hosted{{Gang: "x", Members: 1}, {Gang: "y", Members: 1, Stopping: true}}
	cases := []struct {
		name     string
		m        Machine
		now      time.Time
		removed  string // the removal's reason, "" for none
		preempts []string
	}{
		{name: "taken back by the provider", m: Machine{Notice: t0, Gangs: hosted, LastCopies: 2}, now: t0, removed: "taken back"},
		{name: "empty: removed", m: Machine{Since: t0}, now: t0, removed: "drained: no gangs"},
		{name: "empty before its notice: removed", m: Machine{Since: t0, Notice: t0.Add(time.Minute)}, now: t0, removed: "before its spot interruption"},
		{name: "last copies still there: kept", m: Machine{Since: t0, LastCopies: 1}, now: t0.Add(time.Hour)},
		{name: "gangs within the grace: kept", m: Machine{Since: t0, Gangs: hosted}, now: t0.Add(29 * time.Minute)},
		{name: "gangs past the grace: those not stopping are preempted", m: Machine{Since: t0, Gangs: hosted}, now: t0.Add(30 * time.Minute),
			preempts: []string{"x"}},
		{name: "gangs before a notice: left to the notice path", m: Machine{Since: t0, Gangs: hosted, Notice: t0.Add(2 * time.Hour)}, now: t0.Add(time.Hour)},
	}
	a, _ := New(DefaultConfig())
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.m.Name, c.m.Pool, c.m.State = "m", "p", Draining
			var d Decision
			a.drained(&d, &c.m, c.now)
			if c.removed == "" && len(d.Removes) != 0 || c.removed != "" && (len(d.Removes) != 1 || !strings.Contains(d.Removes[0].Reason, c.removed)) {
				t.Errorf("removes %+v, want one saying %q", d.Removes, c.removed)
			}
			var got []string
			for _, p := range d.Preemptions {
				got = append(got, p.Gang)
				if !p.Deadline.Equal(c.now.Add(DefaultConfig().PreemptDeadline)) {
					t.Errorf("deadline %v", p.Deadline)
				}
			}
			if !reflect.DeepEqual(got, c.preempts) {
				t.Errorf("preempted %v, want %v", got, c.preempts)
			}
		})
	}
}

func TestNoticed(t *testing.T) {
	running := map[string]*Gang{"x": {ID: "x", Size: 2, SameIsland: true, Pool: "spot"}, "y": {ID: "y", Size: 1, SameIsland: true}}
	cases := []struct {
		name     string
		notice   time.Duration // after now
		gangs    []Hosted
		deadline time.Duration // after now
		preempts []string
		replace  []Gang
	}{
		{name: "idle: drained only", notice: 2 * time.Minute, deadline: 110 * time.Second},
		{name: "a gang with some members here: replaced by those, anywhere, no longer in one island",
			notice: 2 * time.Minute, gangs: []Hosted{{Gang: "x", Members: 1}}, deadline: 110 * time.Second,
			preempts: []string{"x"}, replace: []Gang{{ID: "x", Size: 1}}},
		{name: "a gang wholly here keeps its island", notice: time.Minute, gangs: []Hosted{{Gang: "y", Members: 1}}, deadline: 50 * time.Second,
			preempts: []string{"y"}, replace: []Gang{{ID: "y", Size: 1, SameIsland: true}}},
		{name: "stopping gangs are left alone; unknown gangs preempted, not replaced",
			notice: 5 * time.Second, gangs: []Hosted{{Gang: "x", Members: 2, Stopping: true}, {Gang: "z", Members: 1}},
			deadline: 0, preempts: []string{"z"}},
	}
	a, _ := New(DefaultConfig())
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := Machine{Name: "m", Pool: "spot", State: Ready, Gangs: c.gangs, Notice: t0.Add(c.notice), LastCopies: 3}
			var d Decision
			rep := a.noticed(&d, &m, t0, running)
			if len(d.Drains) != 1 || d.Drains[0].Machine != "m" || d.Drains[0].MoveObjects != 3 {
				t.Errorf("drains %+v", d.Drains)
			}
			var got []string
			for _, p := range d.Preemptions {
				got = append(got, p.Gang)
				if !p.Deadline.Equal(t0.Add(c.deadline)) {
					t.Errorf("deadline %v, want %v", p.Deadline, t0.Add(c.deadline))
				}
			}
			if !reflect.DeepEqual(got, c.preempts) || !reflect.DeepEqual(rep, c.replace) {
				t.Errorf("preempted %v, replaced %+v; want %v, %+v", got, rep, c.preempts, c.replace)
			}
		})
	}
}

func TestScaleDown(t *testing.T) {
	idle := func(name string, since time.Duration) Machine {
		return Machine{Name: name, Pool: "p", State: Ready, Since: t0, IdleSince: t0.Add(since)}
	}
	busy := func(name string) Machine {
		return Machine{Name: name, Pool: "p", State: Ready, Since: t0, Gangs: []Hosted{{Gang: "g", Members: 1}}}
	}
	unstamped := func(name string) Machine { // no gangs, no idle timestamp
		return Machine{Name: name, Pool: "p", State: Ready, Since: t0.Add(-time.Hour)}
	}
	cases := []struct {
		name     string
		min, max int
		machines []Machine
		noticed  string // a machine drainStep drained
		launches bool   // the pool launches in this decision
		want     []string
	}{
		{name: "idle past the timeout", max: 8, machines: []Machine{idle("a", -10*time.Minute), idle("b", -time.Minute), busy("c")}, want: []string{"a"}},
		{name: "down to the min only", min: 2, max: 8, machines: []Machine{idle("a", -time.Hour), idle("b", -time.Hour), busy("c")}, want: []string{"a"}},
		{name: "a pool that launches drains nothing", max: 8, launches: true, machines: []Machine{idle("a", -time.Hour)}},
		{name: "above max: busy machines too, as far as the idle ones left cannot make up the excess", max: 1,
			machines: []Machine{busy("a"), idle("b", 0), busy("c")}, want: []string{"a", "b"}},
		{name: "above max with enough idle machines: only idle ones", max: 1,
			machines: []Machine{busy("a"), idle("b", 0), idle("c", 0)}, want: []string{"b", "c"}},
		{name: "a machine drained for its notice is not drained again and no longer counts", max: 2,
			machines: []Machine{busy("a"), busy("b"), busy("c")}, noticed: "a", want: nil},
		{name: "above max: a machine without gangs is idle even without an idle timestamp", max: 1,
			machines: []Machine{busy("a"), unstamped("b"), busy("c")}, want: []string{"a", "b"}},
		{name: "above max: a machine without gangs drained for its notice is not counted idle", max: 1,
			machines: []Machine{idle("a", 0), busy("b"), busy("c")}, noticed: "a", want: []string{"b"}},
		{name: "no idle timestamp: not drained for the idle timeout", max: 8, machines: []Machine{unstamped("a"), busy("b")}},
		{name: "other pools' and draining machines are left alone", max: 8,
			machines: []Machine{{Name: "q", Pool: "other", State: Ready, IdleSince: t0.Add(-time.Hour)}, {Name: "d", Pool: "p", State: Draining, IdleSince: t0.Add(-time.Hour)}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := testPool(t, "p", "dgx-h100", OnDemand, c.min, c.max, 100)
			s := &Snapshot{Now: t0, Pools: []PoolState{{Pool: p}, {Pool: testPool(t, "other", "dgx-h100", OnDemand, 0, 8, 100)}}, Machines: c.machines}
			runs, _, err := newRuns(s)
			if err != nil {
				t.Fatal(err)
			}
			r := runs["p"]
			drainingNow := map[string]bool{}
			if c.noticed != "" {
				drainingNow[c.noticed] = true
				r.draining++
			}
			if c.launches {
				r.launch(1, launchKey{}, "g", "test")
			}
			var d Decision
			r.scaleDown(&d, s, drainingNow)
			var got []string
			for _, dr := range d.Drains {
				got = append(got, dr.Machine)
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("drained %v, want %v: %+v", got, c.want, d.Drains)
			}
		})
	}
}

func TestLaunchMinimum(t *testing.T) {
	cases := []struct {
		name                    string
		min, max                int
		ready, draining, launch int
		want                    int
	}{
		{name: "short of the min", min: 3, max: 8, ready: 1, want: 2},
		{name: "draining machines do not count toward the min", min: 2, max: 8, ready: 1, draining: 1, want: 1},
		{name: "launching ones do", min: 2, max: 8, launch: 2, want: 0},
		{name: "no further than the max", min: 4, max: 4, ready: 1, draining: 2, want: 1},
		{name: "at the min", min: 2, max: 8, ready: 2, want: 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := testPool(t, "p", "dgx-h100", OnDemand, c.min, c.max, 100)
			s := &Snapshot{Now: t0, Pools: []PoolState{{Pool: p}}}
			for i, st := range append(append(repeat(Ready, c.ready), repeat(Draining, c.draining)...), repeat(Launching, c.launch)...) {
				s.Machines = append(s.Machines, Machine{Name: string(rune('a' + i)), Pool: "p", State: st})
			}
			runs, _, err := newRuns(s)
			if err != nil {
				t.Fatal(err)
			}
			runs["p"].launchMinimum()
			got := 0
			for _, l := range runs["p"].appendLaunches(nil) {
				got += l.Count
				if !strings.Contains(l.Reason, "pool minimum") {
					t.Errorf("reason %q", l.Reason)
				}
			}
			if got != c.want {
				t.Errorf("launched %d, want %d", got, c.want)
			}
		})
	}
}

func repeat(s MachineState, n int) []MachineState {
	out := make([]MachineState, n)
	for i := range out {
		out[i] = s
	}
	return out
}

func TestIdleDrain(t *testing.T) {
	cases := []struct {
		name   string
		copies int
		want   string
	}{
		{name: "no last copies", want: "idle for 7m0s, past the pool's idle timeout 5m0s"},
		{name: "last copies move first", copies: 2, want: "idle for 7m0s, past the pool's idle timeout 5m0s; 2 last object copies move first"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := Machine{Name: "m", Pool: "p", IdleSince: t0, LastCopies: c.copies}
			dr := idleDrain(&m, t0.Add(7*time.Minute+200*time.Millisecond), 5*time.Minute)
			if dr != (Drain{Machine: "m", Pool: "p", MoveObjects: c.copies, Reason: c.want}) {
				t.Errorf("drain %+v", dr)
			}
		})
	}
}

func TestCandidates(t *testing.T) {
	p := testPool(t, "p", "dgx-h100", OnDemand, 0, 8, 100)
	q := testPool(t, "q", "dgx-h100", Spot, 0, 8, 30)
	runs, order, err := newRuns(&Snapshot{Pools: []PoolState{{Pool: p}, {Pool: q}}})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name  string
		g     Gang
		pools []string
		why   string
	}{
		{name: "any pool", g: gpuGang("g", 1, 8, true), pools: []string{"p", "q"}},
		{name: "pinned", g: Gang{ID: "g", Size: 1, Pool: "q"}, pools: []string{"q"}},
		{name: "pinned to an unknown pool", g: Gang{ID: "g", Size: 1, Pool: "x"}, why: `pinned to pool "x", which is not configured`},
		{name: "no members", g: Gang{ID: "g"}, why: "gang of 0 members"},
		{name: "negative ask", g: Gang{ID: "g", Size: 1, Member: Member{MemMiB: -1}}, why: "gang of 1 members asking"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rs, why := candidates(runs, order, &c.g)
			var got []string
			for _, r := range rs {
				got = append(got, r.p.Spec.Name)
			}
			if !reflect.DeepEqual(got, c.pools) || !strings.Contains(why, c.why) || (c.why == "") != (why == "") {
				t.Errorf("pools %v why %q; want %v, %q", got, why, c.pools, c.why)
			}
		})
	}
}

func TestCompareCands(t *testing.T) {
	mk := func(name string, price float64, latency time.Duration) *poolRun {
		p := testPool(t, name, "dgx-h100", OnDemand, 0, 8, price)
		p.Spec.LaunchLatency = Duration(latency)
		return &poolRun{p: p}
	}
	cheap, dear, slow, b := mk("a", 10, 0), mk("a", 50, 0), mk("a", 10, time.Minute), mk("b", 10, 0)
	cases := []struct {
		name string
		x, y cand
		want int
	}{
		{name: "spot first", x: cand{r: dear, k: 9, islands: 9, spot: true}, y: cand{r: cheap, k: 1, islands: 1}, want: -1},
		{name: "fewest islands before price", x: cand{r: dear, k: 1, islands: 1}, y: cand{r: cheap, k: 1, islands: 2}, want: -1},
		{name: "price of all the machines", x: cand{r: cheap, k: 6, islands: 1}, y: cand{r: dear, k: 1, islands: 1}, want: 1},
		{name: "launch latency", x: cand{r: slow, k: 1}, y: cand{r: cheap, k: 1}, want: 1},
		{name: "name last", x: cand{r: cheap, k: 1}, y: cand{r: b, k: 1}, want: -1},
		{name: "equal", x: cand{r: cheap, k: 1}, y: cand{r: cheap, k: 1}, want: 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := compareCands(c.x, c.y); got != c.want {
				t.Errorf("compare %d, want %d", got, c.want)
			}
			if got := compareCands(c.y, c.x); got != -c.want {
				t.Errorf("reversed: compare %d, want %d", got, -c.want)
			}
		})
	}
}

func TestLaunchReason(t *testing.T) {
	od := testPool(t, "od", "dgx-h100", OnDemand, 0, 8, 100)
	sp := testPool(t, "sp", "dgx-h100", Spot, 0, 8, 30)
	runs, order, err := newRuns(&Snapshot{Pools: []PoolState{{Pool: od}, {Pool: sp}}})
	if err != nil {
		t.Fatal(err)
	}
	onlyOD := []*poolRun{runs["od"]}
	g := gpuGang("g", 2, 8, false)
	tol := gpuGang("g", 2, 8, true)
	odCand := cand{r: runs["od"], k: 2, islands: 2}
	cases := []struct {
		name     string
		g        Gang
		best     cand
		order    []*poolRun
		replaces string
		prewarm  bool
		notNow   []string
		want     string
	}{
		{name: "a pending gang", g: tol, best: odCand, order: order, want: "gang g: 2 members of 8 cards need 2 machines, 2 island(s)"},
		{name: "a replacement", g: tol, best: odCand, order: order, replaces: "m", want: "replacement for m (spot interruption)"},
		{name: "pre-warm, no spot note", g: g, best: odCand, order: order, prewarm: true, want: "pre-warm for forecast arrivals"},
		{name: "a gang without checkpoints where there is spot", g: g, best: odCand, order: order,
			want: "gang g: 2 members of 8 cards need 2 machines, 2 island(s); on-demand: the gang is not preemptible with checkpoints"},
		{name: "a gang without checkpoints where there is no spot", g: g, best: odCand, order: onlyOD,
			want: "gang g: 2 members of 8 cards need 2 machines, 2 island(s)"},
		{name: "on-demand fallback names the spot pools that could not launch", g: tol, best: odCand, order: order, replaces: "m",
			notNow: []string{"pool sp: 8 machines + 1 would pass its max 8", "pool od2: spent 5.00 USD of its 5.00 budget", "pool x: spot capacity unavailable"},
			want:   "replacement for m (spot interruption); on-demand fallback: pool sp: 8 machines + 1 would pass its max 8; pool x: spot capacity unavailable"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := launchReason(&c.g, c.best, c.replaces, c.prewarm) + spotNote(runs, c.order, &c.g, c.best, c.prewarm, c.notNow)
			if got != c.want {
				t.Errorf("reason\n%q, want\n%q", got, c.want)
			}
		})
	}
}

func TestLaunchFor(t *testing.T) {
	cases := []struct {
		name    string
		machine string
		g       Gang
		k       int
		want    []int // machines per launch, in order
		domains []int
	}{
		{name: "NVSwitch boxes: one launch", machine: "dgx-h100", g: gpuGang("g", 3, 8, false), k: 3, want: []int{3}, domains: []int{0}},
		{name: "within one rack-fabric domain", machine: "gb200-nvl72", g: gpuGang("g", 18, 4, false), k: 18, want: []int{18}, domains: []int{0}},
		{name: "larger than a domain: whole new domains", machine: "gb200-nvl72", g: gpuGang("g", 40, 4, false), k: 40, want: []int{18, 18, 4}, domains: []int{0, 1, 2}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := testPool(t, "p", c.machine, OnDemand, 0, 100, 10)
			runs, _, err := newRuns(&Snapshot{Pools: []PoolState{{Pool: p}}})
			if err != nil {
				t.Fatal(err)
			}
			r := runs["p"]
			r.launchFor(&c.g, c.k, launchKey{replaces: "m"}, "why")
			var counts, domains []int
			for _, l := range r.appendLaunches(nil) {
				counts = append(counts, l.Count)
				domains = append(domains, l.Domain)
				if l.Replaces != "m" || l.Reason != "why" || !reflect.DeepEqual(l.Gangs, []string{"g"}) {
					t.Errorf("launch %+v", l)
				}
			}
			if !reflect.DeepEqual(counts, c.want) || !reflect.DeepEqual(domains, c.domains) {
				t.Errorf("launched %v in domains %v, want %v in %v", counts, domains, c.want, c.domains)
			}
			free := 0
			for _, v := range r.flight {
				free += v.total
			}
			if want := c.k*p.Shape.GPUs - c.g.Size*c.g.Member.GPUs; free != want {
				t.Errorf("%d cards left free on the new machines, want %d (the gang placed on them)", free, want)
			}
		})
	}
}
