package gang

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"
)

// on builds a candidate of members on the given nodes: placed before, then added.
func on(placed, added []int) *Candidate {
	c := &Candidate{Input: &ScoreInput{}}
	for _, n := range placed {
		c.placed = append(c.placed, alloc{node: n})
	}
	for _, n := range added {
		c.add = append(c.add, alloc{node: n})
	}
	return c
}

func TestStrategyFilters(t *testing.T) {
	tests := []struct {
		name   string
		p      FilterPlugin
		placed []int
		node   int
		fits   bool
	}{
		{"strict-spread: first member anywhere", strictSpread{}, nil, 0, true},
		{"strict-spread: a new machine", strictSpread{}, []int{0, 1}, 2, true},
		{"strict-spread: a machine it is on", strictSpread{}, []int{0, 1}, 1, false},
		{"strict-pack: first member anywhere", strictPack{}, nil, 3, true},
		{"strict-pack: the first member's machine", strictPack{}, []int{1, 1}, 1, true},
		{"strict-pack: another machine", strictPack{}, []int{1}, 2, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := tt.p.Filter(NewCycleState(), &QueuedGang{}, on(tt.placed, nil), tt.node, &Node{})
			if st.IsSuccess() != tt.fits {
				t.Fatalf("Filter = %+v, want fits %v", st, tt.fits)
			}
			if !tt.fits && (st.Code != Unschedulable || st.Reason == "") {
				t.Fatalf("refusal %+v: want Unschedulable with a reason", st)
			}
		})
	}
}

func TestSpreadScore(t *testing.T) {
	tests := []struct {
		name          string
		placed, added []int
		want          float64
	}{
		{"all on distinct machines", nil, []int{0, 1, 2}, 1},
		{"two machines, two each", nil, []int{0, 0, 1, 1}, (1 + 0.5 + 1 + 0.5) / 4},
		{"all on one machine", nil, []int{0, 0, 0}, (1 + 0.5 + 1.0/3) / 3},
		{"next member on an unused machine (preferred)", []int{0, 1}, []int{2}, 1},
		{"next member beside one of its gang", []int{0, 1}, []int{1}, 0.5},
		{"next member beside two of its gang", []int{1, 1}, []int{1}, 1.0 / 3},
		{"nothing added", []int{0}, nil, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := (spreadScore{}).Score(NewCycleState(), &QueuedGang{}, on(tt.placed, tt.added)); math.Abs(got-tt.want) > 1e-12 {
				t.Fatalf("Score = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestStrategySkip: each strategy plugin applies to its strategy's gangs only.
func TestStrategySkip(t *testing.T) {
	plugins := map[Strategy]SkipPlugin{StrategySpread: spreadScore{}, StrategyStrictSpread: strictSpread{}, StrategyStrictPack: strictPack{}}
	for _, gs := range []Strategy{"", StrategyPack, StrategySpread, StrategyStrictSpread, StrategyStrictPack} {
		for ps, p := range plugins {
			g := &QueuedGang{Request: &Request{Strategy: gs}}
			if skip := p.Skip(NewCycleState(), g); skip != (gs != ps) {
				t.Errorf("plugin of %q on a gang of %q: skip %v", ps, gs, skip)
			}
		}
	}
}

// TestStrategyPlacement places one gang by its strategy on four 8-GPU machines of one
// rack, after fillers took their share: where it goes, that it waits, or that it can never
// fit.
func TestStrategyPlacement(t *testing.T) {
	fill := func(id string, gpus int, nodes int) []Request { // gpus GPUs taken on each of nodes machines
		return []Request{{ID: id, Min: nodes, Member: Member{GPUs: gpus}, Strategy: StrategyStrictSpread, NotPreemptible: true}}
	}
	tests := []struct {
		name     string
		fill     []Request
		req      Request
		machines int    // distinct machines of its placement; 0: it waits
		most     int    // at most this many members on one machine (0: no check)
		never    bool   // refused at submission
		saying   string // in the refusal or the wait reason
	}{
		{name: "no strategy packs", req: Request{Min: 3, Member: Member{GPUs: 2}}, machines: 1},
		{name: "pack is the default", req: Request{Min: 3, Member: Member{GPUs: 2}, Strategy: StrategyPack}, machines: 1},
		{name: "strict spread on distinct machines", req: Request{Min: 3, Member: Member{GPUs: 2}, Strategy: StrategyStrictSpread}, machines: 3, most: 1},
		{name: "strict spread of GPU shares", req: Request{Min: 4, Member: Member{GPUs: 1, GPUMilli: 250}, Strategy: StrategyStrictSpread}, machines: 4, most: 1},
		{name: "strict spread of CPU-only members", req: Request{Min: 2, Member: Member{CPUMilli: 1000}, Strategy: StrategyStrictSpread}, machines: 2, most: 1},
		{name: "strict spread over more machines than there are", req: Request{Min: 5, Member: Member{GPUs: 1}, Strategy: StrategyStrictSpread}, never: true, saying: "4 machine(s) can hold one"},
		{name: "strict spread waits for a machine", fill: fill("f", 8, 1), req: Request{Min: 4, Member: Member{GPUs: 1}, Strategy: StrategyStrictSpread},
			saying: "every member on a different machine"},
		{name: "strict pack on one machine", fill: fill("f", 6, 1), req: Request{Min: 4, Member: Member{GPUs: 2}, Strategy: StrategyStrictPack}, machines: 1},
		{name: "strict pack of GPU shares", req: Request{Min: 6, Member: Member{GPUs: 1, GPUMilli: 500}, Strategy: StrategyStrictPack}, machines: 1},
		{name: "strict pack larger than a machine", req: Request{Min: 3, Member: Member{GPUs: 4}, Strategy: StrategyStrictPack}, never: true, saying: "a machine holds at most 2"},
		{name: "strict pack waits while every machine is half used", fill: fill("f", 4, 4), req: Request{Min: 2, Member: Member{GPUs: 4}, Strategy: StrategyStrictPack},
			saying: "every member on one machine"},
		{name: "no strategy finds two half-used machines, and waits for one (topology wait)", fill: fill("f", 4, 4), req: Request{Min: 2, Member: Member{GPUs: 4}},
			saying: "best now crosses 2"},
		{name: "spread prefers distinct machines", req: Request{Min: 3, Member: Member{GPUs: 2}, Strategy: StrategySpread}, machines: 3, most: 1},
		{name: "spread doubles up evenly when machines run out", req: Request{Min: 6, Member: Member{GPUs: 4}, Strategy: StrategySpread}, machines: 4, most: 2},
		{name: "spread takes one machine when only one has room", fill: fill("f", 8, 3), req: Request{Min: 4, Member: Member{GPUs: 2}, Strategy: StrategySpread}, machines: 1},
		{name: "spread of GPU shares", req: Request{Min: 3, Member: Member{GPUs: 1, GPUMilli: 300}, Strategy: StrategySpread}, machines: 3, most: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := New(DefaultConfig(), testSnapshot(4, 8, 4))
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range tt.fill {
				if _, err := s.Submit(f, epoch); err != nil {
					t.Fatal(err)
				}
			}
			if d := s.Cycle(epoch); len(d.Placements) != len(tt.fill) {
				t.Fatalf("fillers placed %d of %d", len(d.Placements), len(tt.fill))
			}
			req := tt.req
			req.ID = "g"
			st, err := s.Submit(req, epoch)
			if tt.never {
				if !errors.Is(err, ErrNeverFits) || !strings.Contains(st.Reason, tt.saying) {
					t.Fatalf("submit: %v (%q), want ErrNeverFits saying %q", err, st.Reason, tt.saying)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			d := s.Cycle(epoch)
			if tt.machines == 0 {
				if len(d.Placements) != 0 || len(d.Waiting) != 1 || !strings.Contains(d.Waiting[0].Reason, tt.saying) {
					t.Fatalf("placements %+v, waiting %+v: want it to wait saying %q", d.Placements, d.Waiting, tt.saying)
				}
				return
			}
			if len(d.Placements) != 1 {
				t.Fatalf("placements %+v, waiting %+v", d.Placements, d.Waiting)
			}
			per := map[int]int{}
			for _, m := range d.Placements[0].Members {
				per[m.Node]++
			}
			if len(d.Placements[0].Members) != req.Min || len(per) != tt.machines || d.Placements[0].Machines != tt.machines {
				t.Fatalf("%d members on machines %v, want %d members on %d machines", len(d.Placements[0].Members), per, req.Min, tt.machines)
			}
			for n, k := range per {
				if tt.most > 0 && k > tt.most {
					t.Fatalf("%d members on machine %d, want at most %d (%v)", k, n, tt.most, per)
				}
			}
			for _, sc := range d.Placements[0].Scores {
				if sc.Plugin == PluginSpread && req.Strategy != StrategySpread {
					t.Fatalf("the spread score is reported for a gang of strategy %q", req.Strategy)
				}
			}
		})
	}
}

// cycleUntil runs cycles at the times the scheduler asks for until done holds.
func cycleUntil(t *testing.T, s *Scheduler, now time.Time, done func(Decisions) bool) (Decisions, time.Time) {
	t.Helper()
	for i := 0; i < 20; i++ {
		d := s.Cycle(now)
		if done(d) {
			return d, now
		}
		if d.NextCycle.IsZero() {
			t.Fatalf("cycle %d at %s: not done and no next cycle (waiting %+v)", i, now, d.Waiting)
		}
		now = d.NextCycle
	}
	t.Fatal("not done in 20 cycles")
	return Decisions{}, now
}

func distinctNodes(p Placement) bool {
	seen := map[int]bool{}
	for _, m := range p.Members {
		if seen[m.Node] {
			return false
		}
		seen[m.Node] = true
	}
	return true
}

// TestStrictSpreadPreemptsAndIsPreempted: a strategy gang goes through the cycle like any:
// it preempts lower-priority gangs for machines of its own, and is preempted by a
// higher-priority gang.
func TestStrictSpreadPreemptsAndIsPreempted(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Backfill = false
	s, err := New(cfg, testSnapshot(3, 8, 3))
	if err != nil {
		t.Fatal(err)
	}
	now := epoch
	for i := range 3 { // one low-priority 6-GPU gang per machine
		if _, err := s.Submit(Request{ID: fmt.Sprintf("low%d", i), Min: 1, Member: Member{GPUs: 6}, Checkpoint: Checkpoint{JustInTime: true, Save: time.Second}}, now); err != nil {
			t.Fatal(err)
		}
	}
	if d := s.Cycle(now); len(d.Placements) != 3 {
		t.Fatalf("placed %+v", d.Placements)
	}
	// Two free GPUs on each machine: a strict spread of three 3-GPU members needs one
	// machine per member, so every low gang goes.
	now = now.Add(time.Hour)
	if _, err := s.Submit(Request{ID: "ss", Priority: 1, Min: 3, Member: Member{GPUs: 3}, Strategy: StrategyStrictSpread, Checkpoint: Checkpoint{JustInTime: true, Save: time.Second}}, now); err != nil {
		t.Fatal(err)
	}
	d, now := cycleUntil(t, s, now, func(d Decisions) bool { return len(d.Preemptions) > 0 })
	if len(d.Preemptions) != 3 {
		t.Fatalf("preemptions %+v, want the three low gangs", d.Preemptions)
	}
	for _, p := range d.Preemptions {
		if p.For != "ss" || p.Reason != "priority" {
			t.Fatalf("preemption %+v", p)
		}
		if err := s.Evicted(p.Victim, now, true); err != nil {
			t.Fatal(err)
		}
	}
	d = s.Cycle(now)
	if len(d.Placements) != 1 || d.Placements[0].Gang != "ss" || !d.Placements[0].Preemptor || !distinctNodes(d.Placements[0]) {
		t.Fatalf("placements %+v: want ss on three machines, as preemptor", d.Placements)
	}
	// A higher-priority gang needing whole machines preempts the strict spread gang.
	now = now.Add(time.Hour)
	if _, err := s.Submit(Request{ID: "hi", Priority: 2, Min: 3, Member: Member{GPUs: 8}}, now); err != nil {
		t.Fatal(err)
	}
	d, now = cycleUntil(t, s, now, func(d Decisions) bool { return len(d.Preemptions) > 0 })
	var victims []string
	for _, p := range d.Preemptions {
		victims = append(victims, p.Victim)
		if err := s.Evicted(p.Victim, now, true); err != nil {
			t.Fatal(err)
		}
	}
	if !strings.Contains(strings.Join(victims, ","), "ss") {
		t.Fatalf("victims %v: want the strict spread gang among them", victims)
	}
	d, _ = cycleUntil(t, s, now, func(d Decisions) bool { return len(d.Placements) > 0 })
	if d.Placements[0].Gang != "hi" {
		t.Fatalf("placements %+v: want hi", d.Placements)
	}
	if st, _ := s.GangStatus("ss"); st.State != GangPending || st.Evictions != 1 {
		t.Fatalf("ss status %+v: want pending again after one eviction", st)
	}
}

// TestStrictSpreadQueuesBehindPriority: with room for one of them, the higher-priority
// gang goes first and the strategy gang waits in its queue.
func TestStrictSpreadQueuesBehindPriority(t *testing.T) {
	s, err := New(DefaultConfig(), testSnapshot(3, 8, 3))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []Request{
		{ID: "ss", Priority: 0, Min: 3, Member: Member{GPUs: 4}, Strategy: StrategyStrictSpread},
		{ID: "hi", Priority: 1, Min: 3, Member: Member{GPUs: 8}},
	} {
		if _, err := s.Submit(r, epoch); err != nil {
			t.Fatal(err)
		}
	}
	d := s.Cycle(epoch)
	if len(d.Placements) != 1 || d.Placements[0].Gang != "hi" {
		t.Fatalf("placements %+v: want hi first", d.Placements)
	}
	if st, _ := s.GangStatus("ss"); st.State != GangPending || st.Waiting.Kind != WaitCapacity {
		t.Fatalf("ss status %+v: want pending for capacity", st)
	}
	if err := s.Finish("hi", epoch.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	d = s.Cycle(epoch.Add(time.Hour))
	if len(d.Placements) != 1 || d.Placements[0].Gang != "ss" || !distinctNodes(d.Placements[0]) {
		t.Fatalf("placements %+v: want ss on three machines", d.Placements)
	}
}

// TestStrictSpreadGrows: an elastic strict spread gang grows onto machines it is not on.
func TestStrictSpreadGrows(t *testing.T) {
	s, err := New(DefaultConfig(), testSnapshot(4, 8, 4))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if _, err := s.Submit(Request{ID: fmt.Sprintf("f%d", i), Min: 1, Member: Member{GPUs: 8}, NotPreemptible: true}, epoch); err != nil {
			t.Fatal(err)
		}
	}
	if d := s.Cycle(epoch); len(d.Placements) != 2 {
		t.Fatalf("fillers placed %+v", d.Placements)
	}
	if _, err := s.Submit(Request{ID: "e", Min: 2, Max: 4, Member: Member{GPUs: 2}, Strategy: StrategyStrictSpread}, epoch); err != nil {
		t.Fatal(err)
	}
	d := s.Cycle(epoch)
	var e Placement
	for _, p := range d.Placements {
		if p.Gang == "e" {
			e = p
		}
	}
	if len(e.Members) != 2 || !distinctNodes(e) {
		t.Fatalf("e placed as %+v: want 2 members on the 2 free machines", e)
	}
	for _, f := range []string{"f0", "f1"} {
		if err := s.Finish(f, epoch.Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	d = s.Cycle(epoch.Add(time.Hour))
	if len(d.Resizes) != 1 || d.Resizes[0].To != 4 {
		t.Fatalf("resizes %+v: want e grown to 4", d.Resizes)
	}
	all := Placement{Members: append(append([]MemberPlacement(nil), e.Members...), d.Resizes[0].Add...)}
	if !distinctNodes(all) {
		t.Fatalf("after the grow the members are on %+v: want four machines", all.Members)
	}
}

// pinPlugin is an out-of-tree plugin at three points sharing the attempt's CycleState:
// PreFilter writes the node a gang is pinned to (from its priority), Filter and Score
// read it.
type pinPlugin struct{ scored *[]int }

const pinKey StateKey = "pin/node"

func (pinPlugin) Name() string { return "pin" }
func (pinPlugin) PreFilter(_ Handle, state *CycleState, g *QueuedGang, _ time.Time) *Status {
	state.Write(pinKey, g.Request.Priority)
	return nil
}
func (pinPlugin) Filter(state *CycleState, _ *QueuedGang, _ *Candidate, node int, _ *Node) *Status {
	if pin, ok := ReadState[int](state, pinKey); ok && pin != node {
		return NewStatus(Unschedulable, WaitFragmented, fmt.Sprintf("pinned to node %d", pin))
	}
	return nil
}
func (p pinPlugin) Score(state *CycleState, _ *QueuedGang, _ *Candidate) float64 {
	pin, _ := ReadState[int](state, pinKey)
	*p.scored = append(*p.scored, pin)
	return 1
}

// TestCycleState: what PreFilter writes for a gang, its Filter and Score read; the next
// gang's attempt starts from an empty state.
func TestCycleState(t *testing.T) {
	var scored []int
	cfg := DefaultConfig()
	cfg.Plugins = Plugins{PreFilter: []string{"pin"}, Filter: []string{"pin"}, Score: []ScoreWeight{{"pin", 1}}}
	s, err := New(cfg, testSnapshot(3, 8, 3), WithRegistry(Registry{"pin": func(Handle) (Plugin, error) { return pinPlugin{&scored}, nil }}))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []Request{{ID: "to2", Priority: 2, Min: 1, Member: Member{GPUs: 4}}, {ID: "to1", Priority: 1, Min: 1, Member: Member{GPUs: 4}}} {
		if _, err := s.Submit(r, epoch); err != nil {
			t.Fatal(err)
		}
	}
	d := s.Cycle(epoch)
	got := map[string]int{}
	for _, p := range d.Placements {
		got[p.Gang] = p.Members[0].Node
	}
	if got["to2"] != 2 || got["to1"] != 1 || len(got) != 2 {
		t.Fatalf("placed %v, want to2 on node 2, to1 on node 1", got)
	}
	if len(scored) == 0 {
		t.Fatal("Score never ran")
	}
	var st CycleState
	if _, ok := st.Read(pinKey); ok {
		t.Fatal("an empty state reads a value")
	}
	st.Write(pinKey, "not an int")
	if _, ok := ReadState[int](&st, pinKey); ok {
		t.Fatal("ReadState returned a value of another type")
	}
	st.Delete(pinKey)
	if _, ok := (*CycleState)(nil).Read(pinKey); ok {
		t.Fatal("a nil state reads a value")
	}
}

// TestStrategyInvalid: an unknown strategy is refused at submission.
func TestStrategyInvalid(t *testing.T) {
	s, err := New(DefaultConfig(), testSnapshot(1, 8, 1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Submit(Request{ID: "x", Min: 1, Member: Member{GPUs: 1}, Strategy: "scatter"}, epoch); !errors.Is(err, ErrInvalidRequest) || !strings.Contains(err.Error(), `"scatter"`) {
		t.Fatalf("submit: %v, want ErrInvalidRequest naming the strategy", err)
	}
}

// A gang pinned to machines is placed on them alone, waits while they are full, and can
// never fit when none of them is in the cluster.
func TestPinnedToMachines(t *testing.T) {
	s, err := New(DefaultConfig(), testSnapshot(3, 8, 3))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Submit(Request{ID: "pinned", Min: 2, Member: Member{GPUs: 1}, Machines: []string{"n2"}}, epoch); err != nil {
		t.Fatal(err)
	}
	d := s.Cycle(epoch)
	if len(d.Placements) != 1 {
		t.Fatalf("placements %+v: want the pinned gang", d.Placements)
	}
	for _, m := range d.Placements[0].Members {
		if m.NodeName != "n2" {
			t.Fatalf("a gang pinned to n2 placed on %+v", d.Placements[0].Members)
		}
	}
	if _, err := s.Submit(Request{ID: "nowhere", Min: 1, Member: Member{GPUs: 1}, Machines: []string{"z"}}, epoch); !errors.Is(err, ErrNeverFits) {
		t.Fatalf("a gang pinned to no machine of the cluster: %v, want ErrNeverFits", err)
	}
	if _, err := s.Submit(Request{ID: "full", Min: 7, Member: Member{GPUs: 1}, Machines: []string{"n2"}}, epoch); err != nil {
		t.Fatal(err)
	}
	if d := s.Cycle(epoch); len(d.Placements) != 0 {
		t.Fatalf("7 members placed on n2, which has 6 GPUs free: %+v", d.Placements)
	}
	if st, _ := s.GangStatus("full"); st.State != GangPending {
		t.Fatalf("full: %+v, want pending", st)
	}
}
