package topoadapt

import (
	"time"

	"testing"

	"github.com/atoll-run/atoll/gang"
	"github.com/atoll-run/atoll/topology"
)

func TestSnapshotAndModel(t *testing.T) {
	c, err := topology.Load("4xdgx-h100/2")
	if err != nil {
		t.Fatal(err)
	}
	snap := Snapshot(c)
	if len(snap.Nodes) != 4 || snap.Nodes[2].Rack != 1 || snap.Nodes[0].CPUMilli == 0 || snap.Nodes[0].FreeMem != snap.Nodes[0].MemMiB {
		t.Fatalf("nodes %+v", snap.Nodes[:2])
	}
	for i, n := range snap.Nodes {
		if len(n.GPUs) != 8 || n.GPUs[0].Island == snap.Nodes[(i+1)%4].GPUs[0].Island || n.GPUs[0].FreeMilli != gang.Milli {
			t.Fatalf("node %d GPUs %+v", i, n.GPUs)
		}
	}
	m := NewModel(c, topology.Best)
	in := m.AllReduceTime([]gang.GPURef{{Node: 0, GPU: 0}, {Node: 0, GPU: 1}}, 1<<30)
	across := m.AllReduceTime([]gang.GPURef{{Node: 0, GPU: 0}, {Node: 2, GPU: 0}}, 1<<30)
	if in <= 0 || across <= in {
		t.Fatalf("NVLink %v, across racks %v", in, across)
	}
	if m.AllReduceTime([]gang.GPURef{{Node: 1, GPU: 3}}, 1<<30) != 0 {
		t.Fatal("one GPU needs no AllReduce")
	}
	// The scheduler core runs on the adapted snapshot with the adapted model.
	s, err := gang.New(gang.DefaultConfig(), snap, gang.WithCollectiveModel(m))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Submit(gang.Request{ID: "g", Min: 2, Member: gang.Member{GPUs: 8}}, epoch0); err != nil {
		t.Fatal(err)
	}
	if d := s.Cycle(epoch0); len(d.Placements) != 1 || d.Placements[0].Racks != 1 {
		t.Fatalf("placements %+v, want one gang in one rack", d.Placements)
	}
}

var epoch0 = time.Unix(0, 0)
