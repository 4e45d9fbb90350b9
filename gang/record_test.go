package gang

import (
	"errors"
	"fmt"
	"math/rand"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"
)

// rebuilt builds a new scheduler from what a runtime records of s: its nodes, every gang's
// request, Record and placement, the cost model and the learned workload (what a new
// leader reads from the log).
func rebuilt(t *testing.T, s *Scheduler) *Scheduler {
	t.Helper()
	costs := DefaultCostModel()
	for _, l := range s.Costs().Learned() {
		if err := costs.SetLearned(l); err != nil {
			t.Fatal(err)
		}
	}
	base := s.baseSnapshot()
	for i := range base.Nodes {
		base.Nodes[i].Load = Load{} // loads are measured again, not recorded
	}
	n, err := New(s.cfg, base, WithCostModel(costs))
	if err != nil {
		t.Fatal(err)
	}
	for i, nd := range s.c.nodes {
		if err := n.UpdateLoad(i, nd.Load); err != nil {
			t.Fatal(err)
		}
	}
	n.SetLearnedWorkload(s.LearnedWorkload())
	ids := make([]string, 0, len(s.gangs))
	for id := range s.gangs {
		ids = append(ids, id)
	}
	sort.Strings(ids) // not arrival order: Restore must not depend on it
	for _, id := range ids {
		g := s.gangs[id]
		rec, err := s.Record(id)
		if err != nil {
			t.Fatal(err)
		}
		var members []MemberPlacement
		for _, a := range g.allocs {
			members = append(members, s.memberPlacement(g, a))
		}
		if err := n.Restore(g.req, rec, members); err != nil {
			t.Fatalf("restore %s: %v", id, err)
		}
		if !g.lastCkpt.IsZero() {
			_ = n.Checkpointed(id, g.lastCkpt)
		}
	}
	return n
}

// decided renders a cycle's decisions (not the waiting reasons, which are for display).
func decided(d Decisions) string {
	var b strings.Builder
	for _, p := range d.Placements {
		fmt.Fprintf(&b, "place %s:", p.Gang)
		for _, m := range p.Members {
			fmt.Fprintf(&b, " n%d%v", m.Node, m.GPUs)
		}
		b.WriteString("\n")
	}
	for _, p := range d.Preemptions {
		fmt.Fprintf(&b, "preempt %s for %s by %s cost %.3f\n", p.Victim, p.For, p.Deadline.Format(time.TimeOnly), p.Cost)
	}
	for _, r := range d.Resizes {
		fmt.Fprintf(&b, "resize %s %d->%d add %d remove %v for %s\n", r.Gang, r.From, r.To, len(r.Add), r.RemoveIndex, r.For)
	}
	if !d.NextCycle.IsZero() {
		fmt.Fprintf(&b, "next %s\n", d.NextCycle.Format(time.TimeOnly))
	}
	return b.String()
}

// churn drives a scheduler through a seeded workload (two queues, two priorities,
// elastic gangs, preemptions answered, shrinks taken, a node lost and back, a queue
// change, cost measurements) and returns the trace of its decisions. rebuildAt lists the
// steps after which the scheduler is replaced by one rebuilt from its records.
func churn(t *testing.T, rebuildAt ...int) []string {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Queues = []QueueConfig{{Name: "a", Weight: 2}, {Name: "b", Weight: 1}}
	cfg.DefaultQueue = "a"
	cfg.MinRunBeforePreempt = 10 * time.Minute
	cfg.AgingStep = 3 * time.Hour
	cfg.TopologyWait = 20 * time.Minute
	cfg.TopologyWaitUnforeseen = 5 * time.Minute
	snap := testSnapshot(6, 8, 2)
	s, err := New(cfg, snap)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewSource(7))
	now := time.Unix(1_000_000, 0)
	type pendingOp struct {
		id     string
		shrink bool
	}
	var todo []pendingOp
	running := map[string]bool{}
	var trace []string
	removed := -1
	n := 0
	for step := 0; step < 60; step++ {
		now = now.Add(time.Duration(1+rng.Intn(9)) * time.Minute)
		for _, op := range todo {
			if op.shrink {
				_ = s.ResizeDone(op.id, now)
			} else if s.Evicted(op.id, now, rng.Intn(2) == 0) == nil {
				delete(running, op.id)
			}
		}
		todo = nil
		for k := rng.Intn(3); k > 0; k-- {
			n++
			shapes := []Member{{GPUs: 1}, {GPUs: 2}, {GPUs: 4}, {GPUs: 8}, {GPUs: 1, GPUMilli: 500}}
			r := Request{ID: fmt.Sprintf("g%02d", n), Queue: []string{"a", "b"}[rng.Intn(2)], Priority: rng.Intn(2),
				Min: 1 + rng.Intn(3), Member: shapes[rng.Intn(len(shapes))],
				Duration:   time.Duration(20+rng.Intn(120)) * time.Minute,
				Checkpoint: Checkpoint{Interval: 10 * time.Minute, Save: 20 * time.Second, JustInTime: rng.Intn(2) == 0}}
			r.Max = r.Min
			if rng.Intn(3) == 0 {
				r.Max = r.Min + 2
			}
			_, _ = s.Submit(r, now)
		}
		switch step {
		case 20: // a node is lost with its gangs
			removed = 3
			lost, err := s.RemoveNode(removed, now)
			if err != nil {
				t.Fatal(err)
			}
			trace = append(trace, fmt.Sprintf("lost %v", lost))
			for _, id := range lost {
				delete(running, id)
			}
		case 30: // it comes back, last
			base := s.baseSnapshot()
			from := make([]int, len(base.Nodes))
			for i := range from {
				from[i] = i
			}
			back := testSnapshot(6, 8, 2).Nodes[removed]
			base.Nodes = append(base.Nodes, back)
			from = append(from, -1)
			if _, err := s.Reshape(base, from, now); err != nil {
				t.Fatal(err)
			}
		case 35: // queue b is weighted up, and one node cordoned
			c2 := cfg
			c2.Queues = []QueueConfig{{Name: "a", Weight: 1}, {Name: "b", Weight: 3}}
			if err := s.Reconfigure(c2, nil); err != nil {
				t.Fatal(err)
			}
			if err := s.SetUnschedulable(1, true); err != nil {
				t.Fatal(err)
			}
		case 45:
			if err := s.SetUnschedulable(1, false); err != nil {
				t.Fatal(err)
			}
		}
		if step%5 == 0 {
			_ = s.ObserveCost("H100", 8, CostCUDAContext, time.Duration(500+rng.Intn(1000))*time.Millisecond)
			_ = s.UpdateLoad(rng.Intn(s.NumNodes()), Load{CPU: rng.Float64(), GPU: rng.Float64()})
		}
		if rng.Intn(3) == 0 && len(running) > 0 {
			ids := make([]string, 0, len(running))
			for id := range running {
				ids = append(ids, id)
			}
			sort.Strings(ids)
			id := ids[rng.Intn(len(ids))]
			_ = s.Finish(id, now)
			delete(running, id)
		}
		d := s.Cycle(now)
		trace = append(trace, fmt.Sprintf("step %d:\n%s", step, decided(d)))

		for _, p := range d.Placements {
			running[p.Gang] = true
		}
		for _, p := range d.Preemptions {
			todo = append(todo, pendingOp{id: p.Victim})
		}
		for _, r := range d.Resizes {
			if len(r.RemoveIndex) > 0 {
				todo = append(todo, pendingOp{id: r.Gang, shrink: true})
			}
		}
		if slices.Contains(rebuildAt, step) {
			s = rebuilt(t, s)
		}
	}
	return trace
}

// TestRebuiltSchedulerDecidesTheSame: a scheduler rebuilt from its gangs' Records (in
// whatever order), the cost model and the learned workload, at many points of a churning
// workload (pending gangs of two queues, preemption victims stopping, shrinks under way,
// holds, after a node was lost and came back), makes the same decisions as the original.
func TestRebuiltSchedulerDecidesTheSame(t *testing.T) {
	want := churn(t)
	placements, preemptions := 0, 0
	for _, l := range want {
		placements += strings.Count(l, "place ")
		preemptions += strings.Count(l, "preempt ")
	}
	if placements < 30 || preemptions == 0 {
		t.Fatalf("the workload is too tame to test anything: %d placements, %d preemptions\n%s", placements, preemptions, strings.Join(want, ""))
	}
	var at []int
	for i := 0; i < 60; i += 3 {
		at = append(at, i)
	}
	got := churn(t, at...)
	for i := range want {
		if i >= len(got) || got[i] != want[i] {
			g := ""
			if i < len(got) {
				g = got[i]
			}
			t.Fatalf("decisions differ after rebuilds at %v:\n--- want\n%s\n--- got\n%s", at, want[i], g)
		}
	}
}

func TestReshapeKeepsGangsAndRequeuesTheLost(t *testing.T) {
	now := time.Unix(1000, 0)
	s, err := New(DefaultConfig(), testSnapshot(3, 8, 3))
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b", "c", "d"} {
		if _, err := s.Submit(Request{ID: id, Min: 1, Member: Member{GPUs: 8}}, now); err != nil {
			t.Fatal(err)
		}
	}
	d := s.Cycle(now)
	on := map[string]int{}
	for _, p := range d.Placements {
		on[p.Gang] = p.Members[0].Node
	}
	if len(on) != 3 {
		t.Fatalf("placed %v, want 3 of 4", on)
	}
	before := map[string]Record{}
	for id := range s.gangs {
		before[id], _ = s.Record(id)
	}
	var victim string
	for id, n := range on {
		if n == 1 {
			victim = id
		}
	}
	later := now.Add(time.Hour)
	lost, err := s.RemoveNode(1, later)
	if err != nil || !slices.Equal(lost, []string{victim}) {
		t.Fatalf("remove node 1: lost %v, %v; want [%s]", lost, err, victim)
	}
	if s.NumNodes() != 2 || s.Utilization() != 1 {
		t.Fatalf("after the loss: %d nodes, utilization %v", s.NumNodes(), s.Utilization())
	}
	r, _ := s.Record(victim)
	if r.Seq != before[victim].Seq || !r.Submitted.Equal(now) || !r.Queued.Equal(later) || r.Attained != 8*3600 || r.Evictions != 0 {
		t.Fatalf("the lost gang's record %+v: want its arrival kept, queued again now, an hour of 8 GPUs attained, no eviction", r)
	}
	// The gangs left keep their cards, renumbered.
	for id, n := range on {
		if id == victim {
			continue
		}
		st, _ := s.GangStatus(id)
		if st.State != GangRunning {
			t.Fatalf("%s is %v after another node was lost", id, st.State)
		}
		want := n
		if n > 1 {
			want--
		}
		if got := s.gangs[id].allocs[0].node; got != want {
			t.Fatalf("%s on node %d after the loss, want %d", id, got, want)
		}
	}
	// No room: both wait; when a node comes back, the one that has waited longer (d, since
	// it was submitted; the lost gang only since the loss) goes first.
	if d := s.Cycle(later); len(d.Placements) != 0 {
		t.Fatalf("placed %+v with no room", d.Placements)
	}
	back := s.baseSnapshot()
	back.Nodes = append(back.Nodes, testSnapshot(3, 8, 3).Nodes[1])
	if _, err := s.Reshape(back, []int{0, 1, -1}, later); err != nil {
		t.Fatal(err)
	}
	d = s.Cycle(later)
	if len(d.Placements) != 1 || d.Placements[0].Gang != "d" || d.Placements[0].Members[0].Node != 2 {
		t.Fatalf("after the node came back: %+v, want d placed on node 2", d.Placements)
	}
	// Down to no node at all, and back.
	for s.NumNodes() > 0 {
		if _, err := s.RemoveNode(0, later); err != nil {
			t.Fatal(err)
		}
	}
	if s.Pending() != 4 || s.Running() != 0 {
		t.Fatalf("with no node: %d pending, %d running", s.Pending(), s.Running())
	}
	if d := s.Cycle(later); len(d.Placements) != 0 {
		t.Fatalf("placed on no node: %+v", d.Placements)
	}
	if _, err := s.Reshape(testSnapshot(3, 8, 3), []int{-1, -1, -1}, later); err != nil {
		t.Fatal(err)
	}
	if d := s.Cycle(later); len(d.Placements) != 3 {
		t.Fatalf("placed %d after the nodes came back, want 3", len(d.Placements))
	}
	if _, err := s.Reshape(testSnapshot(1, 8, 1), []int{0, 0}, later); !errors.Is(err, ErrInvalidSnapshot) {
		t.Fatalf("a reshape naming a node twice: %v", err)
	}
}

func TestReconfigureMovesGangs(t *testing.T) {
	now := time.Unix(1000, 0)
	cfg := DefaultConfig()
	s, err := New(cfg, testSnapshot(1, 8, 1))
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b"} {
		if _, err := s.Submit(Request{ID: id, Min: 1, Member: Member{GPUs: 8}}, now); err != nil {
			t.Fatal(err)
		}
	}
	s.Cycle(now)
	c2 := cfg
	c2.Queues = []QueueConfig{{Name: "x", Weight: 1}}
	c2.DefaultQueue = "x"
	if err := s.Reconfigure(c2, map[string]Requeue{"a": {Queue: "x"}}); !errors.Is(err, ErrUnknownQueue) {
		t.Fatalf("a configuration leaving b without a queue: %v", err)
	}
	if err := s.Reconfigure(c2, map[string]Requeue{"a": {}, "b": {Queue: "x", Priority: 2}}); err != nil {
		t.Fatal(err)
	}
	if s.gangs["a"].req.Queue != "x" || s.gangs["b"].req.Priority != 2 || s.QueueRatio("x") == 0 || s.queues.byName["x"].pending != 1 {
		t.Fatalf("after the move: a in %q, b priority %d, x ratio %v", s.gangs["a"].req.Queue, s.gangs["b"].req.Priority, s.QueueRatio("x"))
	}
}

func TestCostModelCarriesOver(t *testing.T) {
	m := DefaultCostModel()
	for _, d := range []time.Duration{2 * time.Second, 3 * time.Second} {
		if err := m.Observe("H100", 8, CostCommunicator, d); err != nil {
			t.Fatal(err)
		}
	}
	_ = m.Observe("A100", 1, CostCUDAContext, 300*time.Millisecond)
	n := DefaultCostModel()
	for _, l := range m.Learned() {
		if err := n.SetLearned(l); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range []CostKind{CostCUDAContext, CostCommunicator} {
		for _, model := range []string{"H100", "A100", "B200"} {
			if a, b := m.Estimate(model, 64, k), n.Estimate(model, 64, k); a != b {
				t.Fatalf("%s %s: %v learned, %v carried over", model, k, a, b)
			}
		}
	}
	if err := n.SetLearned(LearnedCost{Model: "x", Kind: CostCommunicator, Factor: -1, Count: 1}); !errors.Is(err, ErrInvalidRequest) {
		t.Fatalf("a negative factor: %v", err)
	}
}
