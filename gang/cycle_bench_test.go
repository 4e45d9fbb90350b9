package gang

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkAdmissionWithPending is one admission and its cycle, as the head runs them for
// every submission, on 1,000 machines of 8 GPUs with 500 running gangs and N gangs waiting
// for a machine another gang holds (bench scale's workload): the cycle's cost grows with
// the pending gangs it views, sorts and pops.
//
// With actors=N, N more gangs of one worker without GPUs run beside them (bench scale's
// placed actors, of the pending gangs' class): the preemption search of the first blocked
// gang then has thousands of running gangs of its class, none of which it may evict.
func BenchmarkAdmissionWithPending(b *testing.B) {
	for _, tc := range []struct{ pending, actors int }{{1000, 0}, {3000, 0}, {10000, 0}, {10000, 10000}} {
		pending := tc.pending
		name := fmt.Sprintf("pending=%d", pending)
		if tc.actors > 0 {
			name += fmt.Sprintf(",actors=%d", tc.actors)
		}
		b.Run(name, func(b *testing.B) {
			cfg := DefaultConfig()
			cfg.MaxPending = 2 * pending
			s, err := New(cfg, testSnapshot(1000, 8, 16))
			if err != nil {
				b.Fatal(err)
			}
			now := time.Unix(1e6, 0)
			submit := func(r Request) {
				if _, err := s.Submit(r, now); err != nil {
					b.Fatal(err)
				}
			}
			for i := range 500 {
				submit(Request{ID: fmt.Sprint("run", i), Priority: 1, Min: 2, Member: Member{GPUs: 4, GPUMilli: Milli}})
			}
			for i := range tc.actors {
				submit(Request{ID: fmt.Sprint("actor", i), Min: 1, Member: Member{CPUMilli: 1}})
			}
			for i := 0; s.Pending() > 0; i++ { // a cycle places MaxGangsPerCycle at most
				if i > 1000 {
					b.Fatalf("%d still pending", s.Pending())
				}
				s.Cycle(now)
			}
			submit(Request{ID: "holder", Min: 1, Member: Member{GPUs: 8, GPUMilli: Milli}, Machines: []string{"n999"}, NotPreemptible: true})
			s.Cycle(now)
			for i := range pending {
				submit(Request{ID: fmt.Sprint("wait", i), Min: 1, Member: Member{GPUs: 8, GPUMilli: Milli}, Machines: []string{"n999"}})
				if i%500 == 0 {
					s.Cycle(now)
				}
			}
			s.Cycle(now)
			if s.Pending() != pending {
				b.Fatalf("%d pending, want %d", s.Pending(), pending)
			}
			b.ResetTimer()
			for i := range b.N {
				now = now.Add(time.Millisecond)
				id := fmt.Sprint("probe", i)
				submit(Request{ID: id, Min: 1, Member: Member{GPUs: 1, GPUMilli: Milli}})
				if d := s.Cycle(now); len(d.Placements) != 1 {
					b.Fatalf("the probe was not placed: %d placements", len(d.Placements))
				}
				if err := s.Finish(id, now); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
