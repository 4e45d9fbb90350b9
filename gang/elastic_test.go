package gang

import (
	"fmt"
	"slices"
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
