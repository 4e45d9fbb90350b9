package object

import (
	"context"
	"testing"
)

// recount is Stats as it was computed before the tally: a walk of every entry.
func (s *Store) recount() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := Stats{Objects: len(s.objs), HotBytes: s.used, Recycled: s.poolBytes, Capacity: s.capacity}
	for _, e := range s.objs {
		switch e.state {
		case stateHot:
			st.HotObjects++
		case stateCold:
			st.ColdObjects++
			st.ColdBytes += e.size
		}
		if e.durable {
			st.DurableObjects++
			st.DurableBytes += e.size
		}
	}
	return st
}

// TestStatsTallyMatchesTheTable: the counts Stats keeps as entries change (puts, spills,
// restores, persists, frees) equal a walk of the table after every step, and the steps
// did reach cold and durable objects.
func TestStatsTallyMatchesTheTable(t *testing.T) {
	s := newTestStore(t, func(c *Config) { c.Capacity = 2 << 20 })
	ctx := context.Background()
	var sawCold, sawDurable bool
	check := func(step string) {
		t.Helper()
		got, want := s.Stats(), s.recount()
		if got != want {
			t.Fatalf("after %s: Stats %+v, the table says %+v", step, got, want)
		}
		sawCold = sawCold || got.ColdObjects > 0
		sawDurable = sawDurable || got.DurableObjects > 0
	}
	var ids []ID
	for i := range 4 { // 4 MiB into 2: the oldest spill
		id, err := s.Put(ctx, "o", randBytes(1<<20, uint64(i)))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
		check("a put")
	}
	if _, err := s.Persist(ctx, ids[3]); err != nil {
		t.Fatal(err)
	}
	check("a persist")
	v, err := s.Get(ctx, ids[0]) // cold: restored, spilling another
	if err != nil {
		t.Fatal(err)
	}
	check("a restore")
	v.Release()
	small, err := s.Put(ctx, "p", randBytes(1000, 9))
	if err != nil {
		t.Fatal(err)
	}
	check("a small put")
	for _, id := range append(ids, small) {
		owner := "o"
		if id == small {
			owner = "p"
		}
		if err := s.Release(ctx, id, owner); err != nil {
			t.Fatal(err)
		}
		check("a release")
	}
	if !sawCold || !sawDurable {
		t.Fatalf("the steps reached no cold (%v) or no durable (%v) object", sawCold, sawDurable)
	}
	if st := s.Stats(); st.Objects != 0 || st.HotObjects != 0 || st.ColdObjects != 0 || st.DurableObjects != 0 || st.ColdBytes != 0 || st.DurableBytes != 0 {
		t.Fatalf("every object released, Stats %+v", st)
	}
}
