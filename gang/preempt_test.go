package gang

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestElasticPreemptedAboveMin: an elastic gang above its minimum is shrunk for a more
// important gang when shrinking makes room enough (to no fewer members than needed), and
// evicted whole when it does not (before, it could only be shrunk to its minimum, and a
// gang needing more than that freed waited for ever); with a fixed gang beside it, the
// elastic one is shrunk and the fixed one evicted rather than both evicted.
func TestElasticPreemptedAboveMin(t *testing.T) {
	type gangSpec struct {
		id       string
		min, max int
	}
	tests := []struct {
		name     string
		nodes    int
		running  []gangSpec // low priority, placed first, in order
		need     int        // GPUs (one-GPU members) of the priority-10 gang
		evicted  []string
		shrunkTo map[string]int
	}{
		{"shrink is enough", 2, []gangSpec{{"el", 8, 16}}, 6, nil, map[string]int{"el": 10}},
		{"shrink to min is not enough", 2, []gangSpec{{"el", 8, 16}}, 12, []string{"el"}, nil},
		{"shrink one, evict the other", 2, []gangSpec{{"el", 4, 8}, {"fixed", 8, 8}}, 12, []string{"fixed"}, map[string]int{"el": 4}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := New(DefaultConfig(), testSnapshot(tt.nodes, 8, tt.nodes))
			if err != nil {
				t.Fatal(err)
			}
			now := epoch
			ck := Checkpoint{Interval: 30 * time.Minute, Save: 30 * time.Second, Restore: time.Minute, JustInTime: true}
			for _, g := range tt.running {
				req := Request{ID: g.id, Min: g.min, Max: g.max, Member: Member{GPUs: 1}, Checkpoint: ck}
				if _, err := s.Submit(req, now); err != nil {
					t.Fatal(err)
				}
				if d := s.Cycle(now); len(d.Placements) != 1 || len(d.Placements[0].Members) != g.max {
					t.Fatalf("%s not placed at %d members: %+v", g.id, g.max, d.Placements)
				}
			}
			now = now.Add(time.Hour) // past every protection
			if _, err := s.Submit(Request{ID: "hi", Priority: 10, Min: tt.need, Member: Member{GPUs: 1}, Checkpoint: ck}, now); err != nil {
				t.Fatal(err)
			}
			var d Decisions
			for i := 0; i < 20; i++ {
				if d = s.Cycle(now); len(d.Preemptions)+len(d.Resizes) > 0 {
					break
				}
				if d.NextCycle.IsZero() {
					t.Fatalf("cycle %d: the priority-10 gang waits with nothing stopped and no retry: %+v", i, d.Waiting)
				}
				now = d.NextCycle
			}
			var evicted []string
			for _, p := range d.Preemptions {
				if p.For != "hi" {
					t.Fatalf("preemption for %s", p.For)
				}
				evicted = append(evicted, p.Victim)
			}
			shrunk := map[string]int{}
			for _, r := range d.Resizes {
				if r.For != "hi" || len(r.Add) > 0 {
					t.Fatalf("resize %+v: want shrinks for hi", r)
				}
				shrunk[r.Gang] = r.To
			}
			slices.Sort(evicted)
			if !slices.Equal(evicted, tt.evicted) || fmt.Sprint(shrunk) != fmt.Sprint(orEmpty(tt.shrunkTo)) {
				t.Fatalf("evicted %v and shrunk %v; want evicted %v and shrunk %v", evicted, shrunk, tt.evicted, tt.shrunkTo)
			}
			// The victims stop; the priority-10 gang then runs on the room they left.
			stop := now.Add(time.Minute)
			for _, v := range evicted {
				if err := s.Evicted(v, stop, true); err != nil {
					t.Fatal(err)
				}
			}
			for g := range shrunk {
				if err := s.ResizeDone(g, stop); err != nil {
					t.Fatal(err)
				}
			}
			d = s.Cycle(stop)
			if !slices.ContainsFunc(d.Placements, func(p Placement) bool { return p.Gang == "hi" && len(p.Members) == tt.need }) {
				t.Fatalf("the priority-10 gang not placed after its victims stopped: %+v (waiting %+v)", d.Placements, d.Waiting)
			}
		})
	}
}

func orEmpty(m map[string]int) map[string]int {
	if m == nil {
		return map[string]int{}
	}
	return m
}

// TestCompactPreemptionByMachine: a gang that must wait for a compact placement (two
// whole machines) on a cluster full of one-GPU gangs spread over every machine gets its
// room by evicting the gangs of two machines, not the cheapest ones wherever they are
// (which frees scattered cards no compact placement can use: with a small search bound
// nothing was evicted at all).
func TestCompactPreemptionByMachine(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxPreemptionTries = 4
	s, err := New(cfg, testSnapshot(4, 8, 4))
	if err != nil {
		t.Fatal(err)
	}
	now := epoch
	ck := Checkpoint{Save: 30 * time.Second, Restore: time.Minute, JustInTime: true}
	for i := range 32 {
		req := Request{ID: fmt.Sprintf("low%02d", i), Min: 1, Member: Member{GPUs: 1}, Checkpoint: ck, Machines: []string{fmt.Sprintf("n%d", i%4)}}
		if _, err := s.Submit(req, now); err != nil {
			t.Fatal(err)
		}
	}
	if d := s.Cycle(now); len(d.Placements) != 32 {
		t.Fatalf("placed %d of 32", len(d.Placements))
	}
	now = now.Add(time.Hour)
	if _, err := s.Submit(Request{ID: "hi", Priority: 2, Min: 16, Member: Member{GPUs: 1}, Checkpoint: ck}, now); err != nil {
		t.Fatal(err)
	}
	var d Decisions
	for i := 0; i < 10; i++ {
		if d = s.Cycle(now); len(d.Preemptions) > 0 || d.NextCycle.IsZero() {
			break
		}
		now = d.NextCycle
	}
	if len(d.Preemptions) != 16 {
		t.Fatalf("%d preemptions (%+v): want the 16 gangs of two machines", len(d.Preemptions), d.Preemptions)
	}
	nodes := map[string]int{}
	for _, p := range d.Preemptions {
		var k int
		fmt.Sscanf(p.Victim, "low%02d", &k)
		nodes[fmt.Sprintf("n%d", k%4)]++
	}
	if len(nodes) != 2 {
		t.Fatalf("victims on %v: want two whole machines", nodes)
	}
	stop := now.Add(time.Minute)
	for _, p := range d.Preemptions {
		if err := s.Evicted(p.Victim, stop, true); err != nil {
			t.Fatal(err)
		}
	}
	d = s.Cycle(stop)
	if len(d.Placements) != 1 || d.Placements[0].Gang != "hi" || d.Placements[0].Machines != 2 {
		t.Fatalf("placements after the evictions %+v: want hi on two machines", d.Placements)
	}
}

// TestHeldGangPreemptsForCompactRoom: a gang that fits only scattered, and that its
// topology wait holds for a compact placement, may evict lower-priority gangs of one
// machine to get it, when that pays, instead of waiting (before, only a gang with no
// placement at all could preempt, so it waited out its topology wait).
func TestHeldGangPreemptsForCompactRoom(t *testing.T) {
	s, err := New(DefaultConfig(), testSnapshot(2, 8, 2))
	if err != nil {
		t.Fatal(err)
	}
	now := epoch
	ck := Checkpoint{Save: 30 * time.Second, Restore: time.Minute, JustInTime: true}
	for i := range 8 {
		req := Request{ID: fmt.Sprintf("low%d", i), Min: 1, Member: Member{GPUs: 1}, Checkpoint: ck, Machines: []string{fmt.Sprintf("n%d", i%2)}}
		if _, err := s.Submit(req, now); err != nil {
			t.Fatal(err)
		}
	}
	if d := s.Cycle(now); len(d.Placements) != 8 {
		t.Fatalf("placed %d of 8", len(d.Placements))
	}
	now = now.Add(time.Hour)
	if _, err := s.Submit(Request{ID: "hi", Priority: 2, Min: 8, Member: Member{GPUs: 1}, Checkpoint: ck}, now); err != nil {
		t.Fatal(err)
	}
	var d Decisions
	for i := 0; i < 10; i++ {
		if d = s.Cycle(now); len(d.Preemptions) > 0 || len(d.Placements) > 0 || d.NextCycle.IsZero() {
			break
		}
		now = d.NextCycle
	}
	if len(d.Placements) > 0 || len(d.Preemptions) != 4 {
		t.Fatalf("placed %+v, preempted %+v: want the four gangs of one machine evicted for a compact placement", d.Placements, d.Preemptions)
	}
	if w := now.Sub(epoch.Add(time.Hour)); w > time.Minute {
		t.Fatalf("preempted after %s: want it within a minute (a high-priority gang's wait pays fast)", w)
	}
	stop := now.Add(time.Minute)
	for _, p := range d.Preemptions {
		if err := s.Evicted(p.Victim, stop, true); err != nil {
			t.Fatal(err)
		}
	}
	d = s.Cycle(stop)
	if len(d.Placements) != 1 || d.Placements[0].Gang != "hi" || d.Placements[0].Machines != 1 {
		t.Fatalf("placements after the evictions %+v: want hi on one machine", d.Placements)
	}
}

// TestStarvingGangPreempts: a large high-priority gang whose remaining work is long sorts
// behind short gangs of its class pinned to a machine nobody may evict (two shapes, two
// searches): they use up their class's preemption searches every cycle, so it never gets
// a search of its own and waits for ever beside a machine of low-priority work. Once it
// has waited Preempt.StarvationWait / ClassWeight^2 (an hour), it is starving: it searches
// from its class's starving budget, evicts the low-priority machine's gangs and starts
// there.
func TestStarvingGangPreempts(t *testing.T) {
	tests := []struct {
		name    string
		starve  time.Duration // Preempt.StarvationWait
		preempt bool          // the high-priority gang gets victims within 3 h
	}{
		{"no starvation bound", 0, false},
		{"default bound", DefaultPreemptConfig().StarvationWait, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Preempt.StarvationWait = tt.starve
			s, err := New(cfg, testSnapshot(2, 8, 2))
			if err != nil {
				t.Fatal(err)
			}
			now := epoch
			ck := Checkpoint{Interval: 30 * time.Minute, Save: 30 * time.Second, Restore: time.Minute, JustInTime: true}
			for i := 0; i < 16; i++ {
				// run0-7 on n0, not preemptible; run8-15 on n1, low priority.
				req := Request{ID: fmt.Sprintf("run%d", i), Min: 1, Member: Member{GPUs: 1}, Checkpoint: ck,
					Machines: []string{fmt.Sprint("n", i/8)}, NotPreemptible: i < 8}
				if _, err := s.Submit(req, now); err != nil {
					t.Fatal(err)
				}
			}
			if d := s.Cycle(now); len(d.Placements) != 16 {
				t.Fatalf("placed %d of the 16 low-priority gangs", len(d.Placements))
			}
			now = now.Add(time.Hour) // past every protection
			submitted := now
			for _, req := range []Request{
				// Short gangs of its class, of two shapes, pinned to n0: first in the urgency
				// order, each blocked with no victim.
				{ID: "small-a", Priority: 2, Min: 1, Member: Member{GPUs: 1}, Duration: time.Minute, Machines: []string{"n0"}},
				{ID: "small-b", Priority: 2, Min: 1, Member: Member{GPUs: 1, CPUMilli: 500}, Duration: time.Minute, Machines: []string{"n0"}},
				// 8 GPUs for 10 h at priority 2: 8 × 36,000 GPU-seconds, after theirs.
				{ID: "big", Priority: 2, Min: 8, Member: Member{GPUs: 1}, Duration: 10 * time.Hour, Checkpoint: ck},
			} {
				if _, err := s.Submit(req, now); err != nil {
					t.Fatal(err)
				}
			}
			victims, now := firstVictims(t, s, now, submitted, 3*time.Hour, "big")
			if !tt.preempt {
				if victims != nil {
					t.Fatalf("evicted %v for the big gang without a starvation bound: the scenario no longer starves it", victims)
				}
				return
			}
			if len(victims) != 8 || !slices.Contains(victims, "run8") {
				t.Fatalf("evicted %v for the big gang within 3 h; want n1's 8 gangs", victims)
			}
			if waited := now.Sub(submitted); waited < time.Hour {
				t.Fatalf("the big gang preempted after %s, before its starvation bound (1 h)", waited)
			}
			stop := now.Add(time.Minute)
			for _, v := range victims {
				if err := s.Evicted(v, stop, true); err != nil {
					t.Fatal(err)
				}
			}
			d := s.Cycle(stop)
			if !slices.ContainsFunc(d.Placements, func(p Placement) bool { return p.Gang == "big" && len(p.Members) == 8 && p.Machines == 1 }) {
				t.Fatalf("the big gang not placed on one machine after its victims stopped: %+v (waiting %+v)", d.Placements, d.Waiting)
			}
		})
	}
}

// jitCkpt is the checkpoint the starvation tests' gangs declare: every 30 minutes, saved
// just in time on a notice.
var jitCkpt = Checkpoint{Interval: 30 * time.Minute, Save: 30 * time.Second, Restore: time.Minute, JustInTime: true}

// twoMachines is a scheduler of the default configuration, changed by set, on two
// machines of 8 GPUs.
func twoMachines(t *testing.T, set func(*Config)) *Scheduler {
	t.Helper()
	cfg := DefaultConfig()
	set(&cfg)
	s, err := New(cfg, testSnapshot(2, 8, 2))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// submitAll submits reqs at now; with place >= 0 it then runs a cycle that must place
// that many gangs, and returns its decisions.
func submitAll(t *testing.T, s *Scheduler, now time.Time, place int, reqs ...Request) Decisions {
	t.Helper()
	for _, r := range reqs {
		if _, err := s.Submit(r, now); err != nil {
			t.Fatal(err)
		}
	}
	if place < 0 {
		return Decisions{}
	}
	d := s.Cycle(now)
	if len(d.Placements) != place {
		t.Fatalf("placed %+v; want %d gangs", d.Placements, place)
	}
	return d
}

// TestStarvingGangEvictsItsOwnClass: a cluster full of one-GPU gangs of the high class;
// an eight-GPU gang of that class waits. Without a starvation bound it waits for ever (no
// gang is below it); with the default bound, once it has waited an hour, it evicts one
// machine's gangs of its own class that were running when it queued (n0's), not those
// that started after it, ahead of it in the order (n1's). A class of priority 10 (a live
// cluster's value: ClassWeight^10 makes it starving at once) still waits OwnClassAfter,
// an hour; latency-sensitive gangs (a service's replicas) are never taken.
func TestStarvingGangEvictsItsOwnClass(t *testing.T) {
	tests := []struct {
		name      string
		starve    time.Duration // Preempt.StarvationWait
		prio      int
		sensitive bool // the running gangs are latency-sensitive
		evict     bool
	}{
		{"no starvation bound", 0, 2, false, false},
		{"default bound", DefaultPreemptConfig().StarvationWait, 2, false, true},
		{"priority 10", DefaultPreemptConfig().StarvationWait, 10, false, true},
		{"latency-sensitive victims", DefaultPreemptConfig().StarvationWait, 2, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := twoMachines(t, func(c *Config) { c.Preempt.StarvationWait = tt.starve })
			class := func(node string, d time.Duration) []Request {
				var out []Request
				for i := range 8 {
					out = append(out, Request{ID: fmt.Sprintf("%s-%d", node, i), Priority: tt.prio, Min: 1, Member: Member{GPUs: 1}, Machines: []string{node}, Duration: d, Checkpoint: jitCkpt, LatencySensitive: tt.sensitive})
				}
				return out
			}
			now := epoch
			submitAll(t, s, now, 9, append(class("n0", 0), Request{ID: "holder", Min: 8, Member: Member{GPUs: 1}, Machines: []string{"n1"}, NotPreemptible: true})...)
			now = now.Add(time.Hour)
			submitted := now
			submitAll(t, s, now, 0, Request{ID: "big", Priority: tt.prio, Min: 8, Member: Member{GPUs: 1}, Duration: 10 * time.Hour, Checkpoint: jitCkpt})
			// n1 frees; its new gangs (short: first in the order) take it before big.
			now = now.Add(10 * time.Minute)
			if err := s.Finish("holder", now); err != nil {
				t.Fatal(err)
			}
			d := submitAll(t, s, now, 8, class("n1", time.Hour)...)
			if slices.ContainsFunc(d.Placements, func(p Placement) bool { return p.Gang == "big" }) {
				t.Fatalf("placed %+v; want n1's 8 new gangs ahead of big", d.Placements)
			}
			victims := d.Preemptions
			for now.Sub(submitted) < 3*time.Hour && len(victims) == 0 {
				now = now.Add(time.Minute)
				victims = s.Cycle(now).Preemptions
			}
			if !tt.evict {
				if len(victims) > 0 {
					t.Fatalf("evicted %+v: want none (no gang below it, and none of its class may go)", victims)
				}
				return
			}
			if len(victims) != 8 {
				t.Fatalf("evicted %+v for the starving gang within 3 h; want one machine's 8 gangs", victims)
			}
			for _, p := range victims {
				if p.For != "big" || p.Reason != "starvation" || !strings.HasPrefix(p.Victim, "n0-") {
					t.Fatalf("preemption %+v: want n0's gangs (running when it queued), cause starvation", p)
				}
			}
			if waited := now.Sub(submitted); waited < time.Hour {
				t.Fatalf("evicted after %s, before the starvation bound and OwnClassAfter (1 h)", waited)
			}
		})
	}
}

// TestStarvingBudgetGoesRound: four starving high-priority gangs pinned to a machine whose
// gangs nobody may evict come first in the order and, searching every cycle, would spend
// their class's starving budget and its own (MaxPreemptionSearches, 2, each) before the
// fifth starving gang, which low-priority work could make room for. After a fruitless
// search a starving gang waits StarvationRetry before it searches from the starving budget
// again, so the fifth is searched and evicts; with the retry at zero (every cycle) it
// never is.
func TestStarvingBudgetGoesRound(t *testing.T) {
	for _, retry := range []time.Duration{0, DefaultPreemptConfig().StarvationRetry} {
		t.Run(fmt.Sprint("retry ", retry), func(t *testing.T) {
			s := twoMachines(t, func(c *Config) { c.Preempt.StarvationRetry = retry })
			now := heldAndLow(t, s)
			submitted := now
			submitAll(t, s, now, -1,
				// Short low-priority gangs of two shapes, first in the order, with nothing
				// below them: they spend the cycle's own searches.
				Request{ID: "small-a", Min: 1, Member: Member{GPUs: 1}, Duration: time.Minute},
				Request{ID: "small-b", Min: 1, Member: Member{GPUs: 1, CPUMilli: 500}, Duration: time.Minute},
				// Starving high-priority gangs of four shapes pinned to n0, shorter than
				// "big": before it.
				Request{ID: "pinned-a", Priority: 2, Min: 1, Member: Member{GPUs: 1}, Machines: []string{"n0"}, Duration: time.Hour},
				Request{ID: "pinned-b", Priority: 2, Min: 1, Member: Member{GPUs: 1, CPUMilli: 500}, Machines: []string{"n0"}, Duration: time.Hour},
				Request{ID: "pinned-c", Priority: 2, Min: 1, Member: Member{GPUs: 1, CPUMilli: 250}, Machines: []string{"n0"}, Duration: time.Hour},
				Request{ID: "pinned-d", Priority: 2, Min: 1, Member: Member{GPUs: 1, CPUMilli: 750}, Machines: []string{"n0"}, Duration: time.Hour},
				Request{ID: "big", Priority: 2, Min: 8, Member: Member{GPUs: 1}, Duration: 10 * time.Hour, Checkpoint: jitCkpt},
			)
			victims, now := firstVictims(t, s, now, submitted, 3*time.Hour, "big")
			if retry == 0 {
				if victims != nil {
					t.Fatalf("big evicted %v with the budget spent by the pinned gangs every cycle: the scenario no longer blocks it", victims)
				}
				return
			}
			if len(victims) != 8 || !strings.HasPrefix(victims[0], "low-") {
				t.Fatalf("big evicted %v within 3 h; want n1's 8 low-priority gangs", victims)
			}
		})
	}
}

// TestClassesHaveTheirOwnPreemptionSearches: short low-priority gangs that cannot preempt
// anything (nothing below their class) come first in the urgency order and spend their
// class's preemption searches every cycle (two shapes, two searches). A high-priority gang
// behind them still searches from its own class's and evicts the low-priority machine's
// gangs in minutes, long before its starvation bound (an hour); with one budget for every
// class it waited for that bound.
func TestClassesHaveTheirOwnPreemptionSearches(t *testing.T) {
	s := twoMachines(t, func(*Config) {})
	now := heldAndLow(t, s)
	submitted := now
	submitAll(t, s, now, -1,
		Request{ID: "small-a", Min: 1, Member: Member{GPUs: 1}, Duration: time.Minute},
		Request{ID: "small-b", Min: 1, Member: Member{GPUs: 1, CPUMilli: 500}, Duration: time.Minute},
		// 8 × 3,600 / 64 GPU-seconds: after theirs (60 each) in the order.
		Request{ID: "hi", Priority: 2, Min: 8, Member: Member{GPUs: 1}, Duration: time.Hour, Checkpoint: jitCkpt},
	)
	victims, now := firstVictims(t, s, now, submitted, time.Hour, "hi")
	if len(victims) != 8 || !strings.HasPrefix(victims[0], "low-") {
		t.Fatalf("hi evicted %v within its first hour; want n1's 8 low-priority gangs", victims)
	}
	if waited := now.Sub(submitted); waited > 10*time.Minute {
		t.Fatalf("hi evicted after %s: the low class's searches held it back", waited)
	}
}

// TestFailedShapeIsPerClass: a low-priority gang of 8 one-GPU members, first in the order,
// finds no room and no victim (nothing below its class) every cycle. A high-priority gang
// of the same shape and size behind it is not passed over as "its shape failed": its
// search evicts the low-priority gangs of a machine at once; before, it was skipped until
// it starved (an hour).
func TestFailedShapeIsPerClass(t *testing.T) {
	s := twoMachines(t, func(*Config) {})
	now := epoch
	var full []Request
	for i := range 16 {
		full = append(full, Request{ID: fmt.Sprint("low-", i), Min: 1, Member: Member{GPUs: 1}, Checkpoint: jitCkpt})
	}
	submitAll(t, s, now, 16, full...)
	now = now.Add(time.Hour) // past every protection
	submitted := now
	submitAll(t, s, now, -1,
		Request{ID: "lo", Min: 8, Member: Member{GPUs: 1}, Duration: time.Minute},
		// 8 × 7,200 / 64 GPU-seconds: after lo's 8 × 60 in the order.
		Request{ID: "hi", Priority: 2, Min: 8, Member: Member{GPUs: 1}, Duration: 2 * time.Hour, Checkpoint: jitCkpt},
	)
	victims, now := firstVictims(t, s, now, submitted, time.Hour, "hi")
	if len(victims) != 8 {
		t.Fatalf("hi evicted %v within its first hour; want one machine's 8 gangs", victims)
	}
	if waited := now.Sub(submitted); waited > 10*time.Minute {
		t.Fatalf("hi evicted after %s: passed over as the low-priority gang's shape", waited)
	}
}

// TestHighClassTakesScatteredRoomByPreemption: each machine runs 4 high-priority and 4
// low-priority gangs, so no machine can be cleared of lower classes alone. A high-priority
// gang of 8 wants compact room (one machine) only during its topology wait for unforeseen
// room (TopologyWaitUnforeseen / 64, under a minute); then it evicts the 8 low-priority
// gangs of both machines and starts across them. Before, its preemption sought compact
// room only, and it waited until it could evict its own class (an hour). A normal-priority
// gang in its place still waits for compact room.
func TestHighClassTakesScatteredRoomByPreemption(t *testing.T) {
	for _, prio := range []int{2, 1} {
		t.Run(fmt.Sprint("priority ", prio), func(t *testing.T) {
			s := twoMachines(t, func(*Config) {})
			now := epoch
			var full []Request
			for i := range 8 {
				n := []string{fmt.Sprint("n", i%2)}
				full = append(full, Request{ID: fmt.Sprint("high-", i), Priority: 2, Min: 1, Member: Member{GPUs: 1}, Machines: n, Checkpoint: jitCkpt},
					Request{ID: fmt.Sprint("low-", i), Min: 1, Member: Member{GPUs: 1}, Machines: n, Checkpoint: jitCkpt})
			}
			submitAll(t, s, now, 16, full...)
			now = now.Add(time.Hour) // past every protection
			submitted := now
			submitAll(t, s, now, -1, Request{ID: "g", Priority: prio, Min: 8, Member: Member{GPUs: 1}, Duration: time.Hour, Checkpoint: jitCkpt})
			var victims []Preemption
			for now.Sub(submitted) < 30*time.Minute && victims == nil {
				victims = s.Cycle(now).Preemptions
				now = now.Add(10 * time.Second)
			}
			if prio == 1 {
				if victims != nil {
					t.Fatalf("the normal-priority gang evicted %+v: want it waiting for compact room", victims)
				}
				return
			}
			if len(victims) != 8 {
				t.Fatalf("evicted %+v within 30 min; want the 8 low-priority gangs", victims)
			}
			for _, p := range victims {
				if !strings.HasPrefix(p.Victim, "low-") || p.Reason != "priority" {
					t.Fatalf("preemption %+v: want low-priority victims only", p)
				}
			}
			waited := now.Sub(submitted)
			if waited > 5*time.Minute {
				t.Fatalf("evicted after %s: want once its unforeseen topology wait (under a minute) ran out", waited)
			}
			stop := now.Add(time.Minute)
			for _, p := range victims {
				if err := s.Evicted(p.Victim, stop, true); err != nil {
					t.Fatal(err)
				}
			}
			d := s.Cycle(stop)
			if len(d.Placements) != 1 || d.Placements[0].Gang != "g" || d.Placements[0].Machines != 2 {
				t.Fatalf("placements after the evictions %+v (waiting %+v): want g across both machines", d.Placements, d.Waiting)
			}
		})
	}
}

// firstVictims runs a cycle every minute from now until one evicts or within has passed
// since submitted, and returns that cycle's victims (none: nil) and the minute after it.
// Every eviction must be for gang forGang.
func firstVictims(t *testing.T, s *Scheduler, now, submitted time.Time, within time.Duration, forGang string) ([]string, time.Time) {
	t.Helper()
	var victims []string
	for now.Sub(submitted) < within && victims == nil {
		for _, p := range s.Cycle(now).Preemptions {
			if p.For != forGang {
				t.Fatalf("preemption %+v: only %s has victims", p, forGang)
			}
			victims = append(victims, p.Victim)
		}
		now = now.Add(time.Minute)
	}
	return victims, now
}

// heldAndLow fills s's two machines at epoch: n0 with 8 one-GPU gangs nobody may evict
// ("held-i"), n1 with 8 low-priority ones ("low-i"), and returns an hour later, when every
// protection has passed.
func heldAndLow(t *testing.T, s *Scheduler) time.Time {
	t.Helper()
	var full []Request
	for i := range 8 {
		full = append(full, Request{ID: fmt.Sprint("held-", i), Min: 1, Member: Member{GPUs: 1}, Machines: []string{"n0"}, NotPreemptible: true},
			Request{ID: fmt.Sprint("low-", i), Min: 1, Member: Member{GPUs: 1}, Machines: []string{"n1"}, Checkpoint: jitCkpt})
	}
	submitAll(t, s, epoch, 16, full...)
	return epoch.Add(time.Hour)
}
