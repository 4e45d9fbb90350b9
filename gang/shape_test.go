package gang

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// TestFailedShapeSkipsOnlyItsLikes: a cycle that found no placement for a gang skips the
// later gangs of its shape, and a gang pinned to machines or held to one NVLink island is
// not of the same shape as one of its size that is neither: the free machine takes the
// second.
func TestFailedShapeSkipsOnlyItsLikes(t *testing.T) {
	eight := Member{GPUs: 8, GPUMilli: Milli}
	four := Member{GPUs: 4, GPUMilli: Milli}
	for _, tc := range []struct {
		name          string
		holders       []Request
		blocked, free Request
		why           string // in the blocked gang's reason
	}{
		{
			name:    "pinned",
			holders: []Request{{ID: "holder", Min: 1, Member: eight, Machines: []string{"n0"}, NotPreemptible: true}},
			blocked: Request{ID: "blocked", Min: 1, Member: eight, Machines: []string{"n0"}},
			free:    Request{ID: "free", Min: 1, Member: eight},
			why:     "pinned to machines [n0]",
		},
		{
			name: "one island",
			holders: []Request{
				{ID: "h0", Min: 1, Member: four, Machines: []string{"n0"}, NotPreemptible: true},
				{ID: "h1", Min: 1, Member: four, Machines: []string{"n1"}, NotPreemptible: true},
			},
			blocked: Request{ID: "blocked", Min: 2, Member: four, SameIsland: true},
			free:    Request{ID: "free", Min: 2, Member: four},
			why:     "in one NVLink island",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.TopologyWait = 0 // a gang across two machines is placed, not held for a compact room
			s, err := New(cfg, testSnapshot(2, 8, 16))
			if err != nil {
				t.Fatal(err)
			}
			now := time.Unix(1e6, 0)
			submit := func(r Request) {
				t.Helper()
				if _, err := s.Submit(r, now); err != nil {
					t.Fatal(err)
				}
			}
			for _, r := range tc.holders {
				submit(r)
			}
			if d := s.Cycle(now); len(d.Placements) != len(tc.holders) {
				t.Fatalf("%d holders placed, want %d", len(d.Placements), len(tc.holders))
			}
			submit(tc.blocked) // first in the queue: same size, earlier
			submit(tc.free)
			d := s.Cycle(now.Add(time.Second))
			if len(d.Placements) != 1 || d.Placements[0].Gang != "free" {
				t.Fatalf("placements %+v, waiting %+v: want %q placed and %q waiting", d.Placements, d.Waiting, "free", "blocked")
			}
			if i := slices.IndexFunc(d.Waiting, func(w Waiting) bool { return w.Gang == "blocked" }); i < 0 || !strings.Contains(d.Waiting[i].Reason, tc.why) {
				t.Fatalf("waiting %+v: want %q waiting for a reason that says %q", d.Waiting, "blocked", tc.why)
			}
		})
	}
}

// TestSameIslandPlacedInOneIsland: a gang that asks for one NVLink island gets one when
// a machine has the room, on an otherwise empty cluster of one island per machine.
func TestSameIslandPlacedInOneIsland(t *testing.T) {
	s, err := New(DefaultConfig(), testSnapshot(2, 8, 16))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1e6, 0)
	if _, err := s.Submit(Request{ID: "g", Min: 2, Member: Member{GPUs: 4, GPUMilli: Milli}, SameIsland: true}, now); err != nil {
		t.Fatal(err)
	}
	d := s.Cycle(now)
	if len(d.Placements) != 1 || d.Placements[0].Islands != 1 {
		t.Fatalf("placements %+v, waiting %+v: want g placed in one island", d.Placements, d.Waiting)
	}
}
