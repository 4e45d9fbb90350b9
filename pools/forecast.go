package pools

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Forecaster predicts gang arrivals per shape (member, size, island and interruption needs,
// pinned pool) from their history, so that capacity can be pre-warmed before the gangs
// arrive: an exponentially weighted moving average of arrivals per window, one series per
// shape. It is deliberately simple (Holt-Winters or a learned model would need far more
// history than a cluster has for most shapes) and measured by the pool simulation.
// Not safe for concurrent use.
type Forecaster struct {
	// Window is the width of one counting window. Default 10 minutes.
	Window time.Duration
	// Alpha is the weight of the newest window in the average. Default 0.3.
	Alpha float64
	// MinExpected is the fewest expected arrivals within the horizon for which capacity is
	// pre-warmed (below it, a launch would mostly idle). Default 0.5.
	MinExpected float64
	// MaxShapes bounds the series kept (the oldest is dropped). Default 256.
	MaxShapes int

	series map[string]*series
	order  []string
}

type series struct {
	example Gang
	start   time.Time // start of the current window
	count   int       // arrivals in the current window
	rate    float64   // smoothed arrivals per window
	seen    int       // windows closed
}

func (f *Forecaster) defaults() {
	if f.Window <= 0 {
		f.Window = 10 * time.Minute
	}
	if f.Alpha <= 0 || f.Alpha > 1 {
		f.Alpha = 0.3
	}
	if f.MinExpected <= 0 {
		f.MinExpected = 0.5
	}
	if f.MaxShapes <= 0 {
		f.MaxShapes = 256
	}
	if f.series == nil {
		f.series = map[string]*series{}
	}
}

func shapeKey(g *Gang) string {
	return fmt.Sprintf("%d/%d/%d/%d/%t/%t/%s/%s", g.Member.GPUs, g.Member.CPUMilli, g.Member.MemMiB, g.Size, g.SameIsland, g.Tolerant, g.Pool, strings.Join(g.Member.Models, ","))
}

// roll closes the windows that ended by now.
func (f *Forecaster) roll(s *series, now time.Time) {
	for !now.Before(s.start.Add(f.Window)) {
		s.rate = f.Alpha*float64(s.count) + (1-f.Alpha)*s.rate
		if s.seen == 0 {
			s.rate = float64(s.count)
		}
		s.count = 0
		s.seen++
		s.start = s.start.Add(f.Window)
		if s.rate < 1e-6 && s.seen > 64 {
			// A long-gone shape: skip ahead instead of closing every empty window.
			n := now.Sub(s.start) / f.Window
			s.start = s.start.Add(n * f.Window)
		}
	}
}

// Observe records a gang's arrival.
func (f *Forecaster) Observe(g Gang, at time.Time) {
	f.defaults()
	k := shapeKey(&g)
	s := f.series[k]
	if s == nil {
		if len(f.order) >= f.MaxShapes {
			delete(f.series, f.order[0])
			f.order = f.order[1:]
		}
		s = &series{start: at.Truncate(f.Window)}
		f.series[k] = s
		f.order = append(f.order, k)
	}
	g.ID, g.Arrived = "", time.Time{}
	s.example = g
	f.roll(s, at)
	s.count++
}

// Expected returns, per shape, the arrivals expected within horizon from now.
func (f *Forecaster) Expected(now time.Time, horizon time.Duration) map[string]float64 {
	f.defaults()
	out := map[string]float64{}
	for k, s := range f.series {
		f.roll(s, now)
		out[k] = s.rate * float64(horizon) / float64(f.Window)
	}
	return out
}

// Forecast returns the gangs expected within horizon from now (rounded down, per shape,
// once at least MinExpected are), as pending-like gangs with IDs "forecast/<shape>/<n>".
func (f *Forecaster) Forecast(now time.Time, horizon time.Duration) []Gang {
	exp := f.Expected(now, horizon)
	keys := make([]string, 0, len(exp))
	for k := range exp {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var out []Gang
	for _, k := range keys {
		e := exp[k]
		if e < f.MinExpected {
			continue
		}
		n := max(1, int(e))
		for i := 0; i < n && i < 1000; i++ {
			g := f.series[k].example
			g.ID = fmt.Sprintf("forecast/%s/%d", k, i)
			g.Arrived = now
			out = append(out, g)
		}
	}
	return out
}
