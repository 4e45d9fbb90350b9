package dashboard

import (
	"sort"
	"sync"
	"time"

	"github.com/atoll-run/atoll/runtime/api"
)

// Sample is one point of the dashboard's plots, taken every SampleInterval by every head
// (the figures only the leader hears are absent while a head follows).
type Sample struct {
	// T is the time in Unix milliseconds.
	T int64 `json:"t"`
	// Leading says the head led when it took the sample.
	Leading   bool `json:"leading"`
	GPUs      int  `json:"gpus"`
	Allocated int  `json:"allocated"`
	// Utilization in [0, 1]: allocated share, measured (NVML) and reported by agents.
	UtilAllocated float64  `json:"util_allocated"`
	UtilMeasured  *float64 `json:"util_measured,omitempty"`
	UtilReported  *float64 `json:"util_reported,omitempty"`
	Pending       int      `json:"pending"`
	Running       int      `json:"running"`
	// Queues are the pending gangs per queue.
	Queues map[string]int `json:"queues,omitempty"`
	// CycleMs is the mean scheduling cycle over the interval; WaitMs the mean time gangs
	// placed in the interval waited; CommitMs the mean Paxos commit (nil: none happened).
	CycleMs  *float64 `json:"cycle_ms,omitempty"`
	WaitMs   *float64 `json:"wait_ms,omitempty"`
	CommitMs *float64 `json:"commit_ms,omitempty"`
	// Object store bytes per tier and the transfer plane's throughput, over all machines.
	StoreHot    int64    `json:"store_hot"`
	StoreCold   int64    `json:"store_cold"`
	TransferBps *float64 `json:"transfer_bps,omitempty"`
}

// SampleOf turns a state into a sample (the interval figures are the caller's).
func SampleOf(st State) Sample {
	s := Sample{T: st.Time.UnixMilli(), Leading: st.Leading, GPUs: st.Totals.GPUs, Allocated: st.Totals.Allocated,
		UtilMeasured: st.Totals.UtilMeasured, UtilReported: st.Totals.UtilReported, Pending: st.Totals.Pending,
		Running: st.Totals.Running + st.Totals.Starting + st.Totals.Restarting, StoreHot: st.Totals.StoreHot, StoreCold: st.Totals.StoreCold}
	if st.Totals.GPUs > 0 {
		s.UtilAllocated = float64(st.Totals.Allocated) / float64(st.Totals.GPUs)
	}
	for _, q := range st.Queues {
		if s.Queues == nil {
			s.Queues = map[string]int{}
		}
		s.Queues[q.Name] = q.Pending
	}
	return s
}

// Series is a ring of samples. It is safe for concurrent use.
type Series struct {
	mu   sync.Mutex
	buf  []Sample
	next int
	full bool
}

// NewSeries keeps the newest n samples.
func NewSeries(n int) *Series {
	if n <= 0 {
		n = 1
	}
	return &Series{buf: make([]Sample, n)}
}

// Add appends a sample, dropping the oldest when full.
func (s *Series) Add(x Sample) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.buf[s.next] = x
	s.next = (s.next + 1) % len(s.buf)
	if s.next == 0 {
		s.full = true
	}
}

// Since returns the samples after t (Unix milliseconds), oldest first.
func (s *Series) Since(t int64) []Sample {
	s.mu.Lock()
	defer s.mu.Unlock()
	var all []Sample
	if s.full {
		all = append(append(all, s.buf[s.next:]...), s.buf[:s.next]...)
	} else {
		all = append(all, s.buf[:s.next]...)
	}
	i := sort.Search(len(all), func(i int) bool { return all[i].T > t })
	return all[i:]
}

// ProgressLog keeps the newest progress reports of each gang. It is safe for concurrent
// use.
type ProgressLog struct {
	mu     sync.Mutex
	per    int
	gangs  int
	byGang map[string][]api.Progress
	seen   map[string]time.Time
}

// NewProgressLog keeps per reports of each of at most gangs gangs (the least recently
// reporting gang is forgotten first).
func NewProgressLog(per, gangs int) *ProgressLog {
	return &ProgressLog{per: max(1, per), gangs: max(1, gangs), byGang: map[string][]api.Progress{}, seen: map[string]time.Time{}}
}

// Add records a report (its Time must be set).
func (l *ProgressLog) Add(p api.Progress) {
	key := p.Job + "/" + p.Gang
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.byGang[key]; !ok && len(l.byGang) >= l.gangs {
		oldest, at := "", time.Time{}
		for k, t := range l.seen {
			if oldest == "" || t.Before(at) {
				oldest, at = k, t
			}
		}
		delete(l.byGang, oldest)
		delete(l.seen, oldest)
	}
	r := append(l.byGang[key], p)
	if len(r) > l.per {
		r = append([]api.Progress(nil), r[len(r)-l.per:]...)
	}
	l.byGang[key] = r
	l.seen[key] = p.Time
}

// Latest returns each gang's newest report.
func (l *ProgressLog) Latest() map[string]api.Progress {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]api.Progress, len(l.byGang))
	for k, r := range l.byGang {
		out[k] = r[len(r)-1]
	}
	return out
}

// Of returns a gang's reports after t (Unix milliseconds), oldest first.
func (l *ProgressLog) Of(gang string, t int64) []api.Progress {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.byGang[gang]
	i := sort.Search(len(r), func(i int) bool { return r[i].Time.UnixMilli() > t })
	return append([]api.Progress(nil), r[i:]...)
}
