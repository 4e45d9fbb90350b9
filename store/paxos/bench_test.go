package paxos

import "testing"

// BenchmarkCommit measures the pure core: a leader and two followers exchanging every
// message synchronously (no disk, no network), 64 proposals per round; ns/op is per
// committed entry. It compares versions of the core (run it on two commits).
func BenchmarkCommit(b *testing.B) {
	h := newHarness(&testing.T{}, 3, nil)
	h.elect(1)
	l := h.nodes[1]
	data := make([]byte, 128)
	b.ReportAllocs()
	b.ResetTimer()
	for done := 0; done < b.N; {
		for i := 0; i < 64 && done < b.N; i++ {
			if _, _, err := l.Propose(data); err != nil {
				b.Fatal(err)
			}
			done++
		}
		h.settle()
		for id := range h.log {
			h.log[id] = h.log[id][:0]
		}
		h.sent = h.sent[:0]
	}
}
