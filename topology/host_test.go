package topology

import (
	"testing"
	"time"
)

func TestHostAllReduceTime(t *testing.T) {
	l := DefaultHostLinks()
	for _, tc := range []struct {
		name       string
		perMachine []int
		bytes      int64
		want       Algo // the faster one
	}{
		{"8 on 2 machines, 64 MiB: the hierarchy moves a quarter across", []int{4, 4}, 64 << 20, Hierarchical},
		{"8 on 2 machines, 4 KiB: fewer steps", []int{4, 4}, 4 << 10, Hierarchical},
		{"one machine, 64 MiB: no sockets", []int{8}, 64 << 20, Hierarchical},
		{"one per machine: the hierarchy only adds copies", []int{1, 1, 1, 1}, 64 << 20, Ring},
	} {
		ring := HostAllReduceTime(tc.perMachine, tc.bytes, Ring, l)
		hier := HostAllReduceTime(tc.perMachine, tc.bytes, Hierarchical, l)
		best := HostAllReduceTime(tc.perMachine, tc.bytes, Best, l)
		got := Ring
		if hier < ring {
			got = Hierarchical
		}
		if got != tc.want || best != min(ring, hier) {
			t.Errorf("%s: ring %v, hierarchical %v, best %v: want %v", tc.name, ring, hier, best, tc.want)
		}
	}
	if d := HostAllReduceTime([]int{1}, 1<<20, Ring, l); d != 0 {
		t.Errorf("one member: %v, want 0", d)
	}
	if d := HostAllReduceTime([]int{2, 2}, 1<<20, Tree, l); d != Unreachable {
		t.Errorf("tree: %v, want Unreachable", d)
	}
	// 64 MiB, [4 4]: the ring's 14 steps of 8 MiB at the link (1.75 times the vector out
	// of each machine), against 2 steps of 32 MiB (once the vector) plus the copies.
	if r, h := HostAllReduceTime([]int{4, 4}, 64<<20, Ring, l), HostAllReduceTime([]int{4, 4}, 64<<20, Hierarchical, l); r <= h || r > 10*time.Second {
		t.Errorf("64 MiB on [4 4]: ring %v, hierarchical %v", r, h)
	}
}
