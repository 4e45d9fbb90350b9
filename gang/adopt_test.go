package gang

import (
	"errors"
	"testing"
	"time"
)

func TestAdoptRebuildsOccupancy(t *testing.T) {
	now := time.Unix(1000, 0)
	snap := testSnapshot(2, 8, 2)
	s1, err := New(DefaultConfig(), snap)
	if err != nil {
		t.Fatal(err)
	}
	a := Request{ID: "a", Min: 6, Member: Member{GPUs: 1, CPUMilli: 1000, MemMiB: 1024}, SameIsland: true}
	if _, err := s1.Submit(a, now); err != nil {
		t.Fatal(err)
	}
	d := s1.Cycle(now)
	if len(d.Placements) != 1 {
		t.Fatalf("placements %+v", d)
	}
	placed := d.Placements[0].Members

	// A new head rebuilds the scheduler from the recorded placement.
	s2, err := New(DefaultConfig(), snap)
	if err != nil {
		t.Fatal(err)
	}
	if err := s2.Adopt(a, placed, now); err != nil {
		t.Fatal(err)
	}
	if u1, u2 := s1.Utilization(), s2.Utilization(); u1 != u2 || u2 == 0 {
		t.Fatalf("utilization after adopt %v, original %v", u2, u1)
	}
	// A gang that overlaps the adopted one is refused, and nothing changes.
	b := Request{ID: "b", Min: 1, Member: Member{GPUs: 1}}
	if err := s2.Adopt(b, placed[:1], now); !errors.Is(err, ErrInvalidRequest) {
		t.Fatalf("adopting onto taken cards: %v", err)
	}
	if err := s2.Adopt(a, placed, now); !errors.Is(err, ErrDuplicate) {
		t.Fatalf("adopting twice: %v", err)
	}
	bad := append([]MemberPlacement(nil), placed...)
	bad[0].Node = 9
	if err := s2.Adopt(Request{ID: "c", Min: 6, Member: Member{GPUs: 1}}, bad, now); !errors.Is(err, ErrInvalidRequest) {
		t.Fatalf("adopting on a missing node: %v", err)
	}
	if u := s2.Utilization(); u != s1.Utilization() {
		t.Fatalf("a refused adopt changed utilization to %v", u)
	}
	// Scheduling goes on around the adopted gang: 10 cards are left, in islands of 2 and 8.
	c := Request{ID: "c", Min: 8, Member: Member{GPUs: 1}, SameIsland: true}
	if _, err := s2.Submit(c, now); err != nil {
		t.Fatal(err)
	}
	d = s2.Cycle(now)
	if len(d.Placements) != 1 {
		t.Fatalf("second gang not placed: %+v", d.Waiting)
	}
	taken := map[[2]int]bool{}
	for _, m := range placed {
		for _, g := range m.GPUs {
			taken[[2]int{m.Node, g}] = true
		}
	}
	for _, m := range d.Placements[0].Members {
		for _, g := range m.GPUs {
			if taken[[2]int{m.Node, g}] {
				t.Fatalf("gang c placed on adopted card %d/%d", m.Node, g)
			}
		}
	}
	if err := s2.Finish("a", now); err != nil {
		t.Fatal(err)
	}
}

// TestQueueShareAfterAdopt: a new leader adopts a running gang without running a cycle; the
// cycle's ratio is against a fair share never computed (it reads as borrowing without
// bound, 1e9), the status's share is against the fair share now.
func TestQueueShareAfterAdopt(t *testing.T) {
	now := time.Unix(1000, 0)
	snap := testSnapshot(2, 8, 2)
	cfg := DefaultConfig()
	cfg.Queues = []QueueConfig{{Name: "a", Weight: 1}, {Name: "b", Weight: 3}}
	cfg.DefaultQueue = "a"
	s1, err := New(cfg, snap)
	if err != nil {
		t.Fatal(err)
	}
	r := Request{ID: "g", Queue: "a", Min: 4, Member: Member{GPUs: 1}, SameIsland: true}
	if _, err := s1.Submit(r, now); err != nil {
		t.Fatal(err)
	}
	d := s1.Cycle(now)
	if len(d.Placements) != 1 {
		t.Fatalf("placements %+v", d)
	}
	want := s1.QueueShare("a")
	if want <= 0 || want >= 1e9 {
		t.Fatalf("the placing leader's share of queue a: %v", want)
	}
	s2, err := New(cfg, snap)
	if err != nil {
		t.Fatal(err)
	}
	if err := s2.Adopt(r, d.Placements[0].Members, now); err != nil {
		t.Fatal(err)
	}
	if got := s2.QueueShare("a"); got != want {
		t.Errorf("queue a's share after adoption %v, want %v as on the leader that placed it", got, want)
	}
	for _, q := range []string{"b", "nosuch"} {
		if got := s2.QueueShare(q); got != 0 {
			t.Errorf("queue %s holds nothing, share %v", q, got)
		}
	}
}
