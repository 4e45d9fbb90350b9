package head

import (
	"runtime/metrics"
	"sync"
	"time"
)

// schedLatency reads how long this process's goroutines waited to run (the Go scheduler's
// /sched/latencies histogram) since its last call: when the leader finds a gap between
// two sweeps, it says whether its goroutines were runnable and not run (a process with
// more runnable goroutines than its cores serve, or a starved machine), or were blocked.
type schedLatency struct {
	mu   sync.Mutex
	prev []uint64
}

// since returns the largest wait seen since the last call (the upper bound of the
// highest histogram bucket that gained a count) and how many goroutine wakeups waited
// longer than 100 ms.
func (s *schedLatency) since() (worst time.Duration, over100ms uint64) {
	sample := []metrics.Sample{{Name: "/sched/latencies:seconds"}}
	metrics.Read(sample)
	if sample[0].Value.Kind() != metrics.KindFloat64Histogram {
		return 0, 0
	}
	h := sample[0].Value.Float64Histogram()
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, n := range h.Counts {
		d := n
		if i < len(s.prev) {
			d = n - min(n, s.prev[i])
		}
		if d == 0 {
			continue
		}
		hi := h.Buckets[i+1]
		if hi > 1e9 { // the last bucket is open (+Inf): its lower bound
			hi = h.Buckets[i]
		}
		worst = max(worst, time.Duration(hi*float64(time.Second)))
		if h.Buckets[i] >= 0.1 {
			over100ms += d
		}
	}
	s.prev = append(s.prev[:0], h.Counts...)
	return worst, over100ms
}
