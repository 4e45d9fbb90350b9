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
