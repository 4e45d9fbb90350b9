package gang

import (
	"cmp"
	"fmt"
	"slices"
	"sort"
	"time"
)

// What the scheduler knows of how long a gang runs. Three sources, used in this order:
//
//   - Request.Duration, a declared expected run time (a benchmark's oracle, or a job that
//     knows how long it runs), taken as it is;
//   - the run times of gangs that have completed (Scheduler.Complete), learnt online
//     (Config.Predict): the expected run time left of a gang that has already run for a is
//     the mean of (r − a) over the recent completed runs r > a of its kind (its queue and
//     GPUs, and its time limit when it declared one), as in Tsafrir, Etsion and Feitelson,
//     "Backfilling using system-generated predictions rather than user runtime estimates"
//     (IEEE TPDS 2007), which predicts from the user's recent completed jobs;
//   - Request.TimeLimit, an upper bound the user declared (Slurm's --time): the run time
//     left is at most TimeLimit − a, and a gang with a limit and no history of its kind
//     is expected to use all of it (as EASY backfilling takes user estimates).
//
// Without any of them the run time is unknown: the queue order then uses least attained
// service (Config.UnknownDuration), shadow times and Smith's rule leave the gang out.

// PredictConfig tunes the run-time predictor (the second source above).
type PredictConfig struct {
	// Enabled learns run times from completed gangs and predicts those of gangs that
	// declare no Duration. Off: only Duration and TimeLimit are used.
	Enabled bool
	// Window is the completed runs remembered per kind, the latest kept (default 32:
	// recent runs say more of the next one than old ones, and the learned state stays
	// small enough to be recorded with every gang's end).
	Window int
	// MinRuns is how many remembered runs longer than a gang's age a kind needs before its
	// runs predict that gang's (default 3); with fewer, the next coarser kind is asked.
	MinRuns int
}

// DefaultPredictConfig returns the defaults above, enabled.
func DefaultPredictConfig() PredictConfig {
	return PredictConfig{Enabled: true, Window: 32, MinRuns: 3}
}

// maxRuntimeKinds bounds the kinds of runs remembered (the least recently updated goes).
const maxRuntimeKinds = 64

// runtimeKind names one history of completed runs. The finest kind of a gang is its
// queue, GPUs (all members) and time limit; coarser ones drop the GPUs, and, for gangs
// with limits, remember what share of its limit each run used (Ratio) instead of its
// length, so that a run of a 2-hour limit can inform a gang of an 8-hour one.
type runtimeKind struct {
	queue string
	gpus  int           // -1: any
	limit time.Duration // the kind's time limit; 0: none (or any, with ratio)
	ratio bool          // values are run time / limit
}

// runtimeHistory is one kind's recent runs (seconds, or shares of the limit), with a
// sorted copy and its suffix sums for mean residual lookups.
type runtimeHistory struct {
	runs    []float64 // oldest first, at most Window
	sorted  []float64
	suffix  []float64 // suffix[i] = sum of sorted[i:]
	updated int64     // the learner's update count when it last changed
}

func (h *runtimeHistory) rebuild() {
	h.sorted = append(h.sorted[:0], h.runs...)
	sort.Float64s(h.sorted)
	h.suffix = slices.Grow(h.suffix[:0], len(h.sorted)+1)[:len(h.sorted)+1]
	h.suffix[len(h.sorted)] = 0
	for i := len(h.sorted) - 1; i >= 0; i-- {
		h.suffix[i] = h.suffix[i+1] + h.sorted[i]
	}
}

// residual returns the mean of (v − x) over the remembered values v > x, and how many
// there are.
func (h *runtimeHistory) residual(x float64) (float64, int) {
	i := sort.Search(len(h.sorted), func(i int) bool { return h.sorted[i] > x })
	n := len(h.sorted) - i
	if n == 0 {
		return 0, 0
	}
	return h.suffix[i]/float64(n) - x, n
}

// runtimeLearner keeps the histories. Its predictions are a function of the sequence of
// completions alone, so a scheduler given back its state (SetLearnedRuntimes) predicts as
// the original did.
type runtimeLearner struct {
	kinds   map[runtimeKind]*runtimeHistory
	updates int64
}

func (l *runtimeLearner) add(k runtimeKind, v float64, window int) {
	if l.kinds == nil {
		l.kinds = map[runtimeKind]*runtimeHistory{}
	}
	h := l.kinds[k]
	if h == nil {
		if len(l.kinds) >= maxRuntimeKinds {
			var drop runtimeKind
			var oldest *runtimeHistory
			for kk, hh := range l.kinds {
				if oldest == nil || hh.updated < oldest.updated || hh.updated == oldest.updated && kindLess(kk, drop) {
					drop, oldest = kk, hh
				}
			}
			delete(l.kinds, drop)
		}
		h = &runtimeHistory{}
		l.kinds[k] = h
	}
	h.runs = append(h.runs, v)
	if len(h.runs) > window {
		h.runs = slices.Delete(h.runs, 0, len(h.runs)-window)
	}
	h.updated = l.updates
	h.rebuild()
}

func kindLess(a, b runtimeKind) bool {
	if c := cmp.Compare(a.queue, b.queue); c != 0 {
		return c < 0
	}
	if a.gpus != b.gpus {
		return a.gpus < b.gpus
	}
	if a.limit != b.limit {
		return a.limit < b.limit
	}
	return !a.ratio && b.ratio
}

// gangGPUs is the GPUs a gang's kind is keyed by: its Max members' (what it asks for when
// room allows).
func gangGPUs(r *Request) int {
	return int(int64(r.Max) * int64(r.Member.TotalMilli()) / Milli)
}

// learn records a completed run of g (ran seconds of run time in all).
func (l *runtimeLearner) learn(r *Request, ran time.Duration, cfg PredictConfig) {
	if ran <= 0 {
		return
	}
	l.updates++
	w := cfg.Window
	gpus := gangGPUs(r)
	if r.TimeLimit > 0 {
		share := ran.Seconds() / r.TimeLimit.Seconds()
		l.add(runtimeKind{queue: r.Queue, gpus: gpus, limit: r.TimeLimit}, ran.Seconds(), w)
		l.add(runtimeKind{queue: r.Queue, gpus: gpus, ratio: true}, share, w)
		l.add(runtimeKind{queue: r.Queue, gpus: -1, ratio: true}, share, w)
		return
	}
	l.add(runtimeKind{queue: r.Queue, gpus: gpus}, ran.Seconds(), w)
	l.add(runtimeKind{queue: r.Queue, gpus: -1}, ran.Seconds(), w)
}

// predict returns the expected run time left of a gang of request r that has run for age
// (false: no kind knows enough).
func (l *runtimeLearner) predict(r *Request, age time.Duration, cfg PredictConfig) (time.Duration, bool) {
	if len(l.kinds) == 0 {
		return 0, false
	}
	a := age.Seconds()
	gpus := gangGPUs(r)
	try := func(k runtimeKind, scale float64) (time.Duration, bool) {
		h := l.kinds[k]
		if h == nil {
			return 0, false
		}
		res, n := h.residual(a / scale)
		if n < max(1, cfg.MinRuns) {
			return 0, false
		}
		return time.Duration(res * scale * float64(time.Second)), true
	}
	if lim := r.TimeLimit; lim > 0 {
		s := lim.Seconds()
		for _, k := range []struct {
			k     runtimeKind
			scale float64
		}{
			{runtimeKind{queue: r.Queue, gpus: gpus, limit: lim}, 1},
			{runtimeKind{queue: r.Queue, gpus: gpus, ratio: true}, s},
			{runtimeKind{queue: r.Queue, gpus: -1, ratio: true}, s},
		} {
			if d, ok := try(k.k, k.scale); ok {
				return min(d, lim-age), true
			}
		}
		return 0, false
	}
	if d, ok := try(runtimeKind{queue: r.Queue, gpus: gpus}, 1); ok {
		return d, true
	}
	return try(runtimeKind{queue: r.Queue, gpus: -1}, 1)
}

// expectedLeft returns the run time gang g is expected to need from now, and whether
// anything is known of it (see the top of this file): its declared Duration less its age
// (negative once it overran it); else the learnt prediction at its age, capped by its
// time limit; else what is left of its time limit (at least a second).
func (s *Scheduler) expectedLeft(g *gangState, now time.Time) (time.Duration, bool) {
	return s.expectedLeftAt(g, s.age(g, now))
}

// expectedLeftAt is expectedLeft for a gang whose age (Scheduler.age) is known.
func (s *Scheduler) expectedLeftAt(g *gangState, age time.Duration) (time.Duration, bool) {
	if d := g.req.Duration; d > 0 {
		return d - age, true
	}
	if s.cfg.Predict.Enabled {
		if d, ok := s.predictCached(g, age); ok {
			return max(d, time.Second), true
		}
	}
	if lim := g.req.TimeLimit; lim > 0 {
		return max(lim-age, time.Second), true
	}
	return 0, false
}

// age is the run time g has behind it: the work kept across stops, and its current run.
func (s *Scheduler) age(g *gangState, now time.Time) time.Duration {
	a := g.progress
	if g.status != stPending && now.After(g.start) {
		a += now.Sub(g.start)
	}
	return a
}

// predictCached is the learner's prediction for g at age, remembered until the learner
// changes or g's age does (a pending gang's age stands still: one lookup per completion,
// not per cycle).
func (s *Scheduler) predictCached(g *gangState, age time.Duration) (time.Duration, bool) {
	if c := &g.pred; c.valid && c.updates == s.runtimes.updates && c.age == age {
		return c.left, c.ok
	}
	left, ok := s.runtimes.predict(&g.req, age, s.cfg.Predict)
	g.pred = predCache{valid: true, updates: s.runtimes.updates, age: age, left: left, ok: ok}
	return left, ok
}

// predCache is a gang's latest prediction.
type predCache struct {
	valid   bool
	updates int64
	age     time.Duration
	left    time.Duration
	ok      bool
}

// upperBound is a bound on the run time g has left that the scheduler may rely on (a
// backfilled gang must end before the reservation it uses starts): its declared Duration,
// else its time limit; false without either. Predictions are not bounds.
func (s *Scheduler) upperBound(g *gangState) (time.Duration, bool) {
	switch {
	case g.req.Duration > 0:
		return max(g.req.Duration-g.progress, time.Second), true
	case g.req.TimeLimit > 0:
		return max(g.req.TimeLimit-g.progress, time.Second), true
	}
	return 0, false
}

// Complete reports that a gang ran to its end (or failed for good, or was cancelled) and
// forgets it as Finish does; a gang that ran feeds its run time (the work it kept across
// stops plus its last run) to the run-time predictor (Config.Predict). Use Finish for a
// gang that is withdrawn to be given back (Restore) or whose end says nothing of its
// length.
func (s *Scheduler) Complete(id string, now time.Time) error {
	g, ok := s.gangs[id]
	if !ok {
		return fmt.Errorf("gang: complete %s: %w", id, ErrUnknownGang)
	}
	if s.cfg.Predict.Enabled && (g.status != stPending || g.attained > 0) {
		s.runtimes.learn(&g.req, s.age(g, now), s.cfg.Predict)
	}
	return s.Finish(id, now)
}

// LearnedRuntimes is the state of the run-time predictor: each kind's recent runs. A
// runtime that rebuilds its scheduler gives it back (SetLearnedRuntimes) so that it
// predicts as before.
type LearnedRuntimes struct {
	Updates int64            `json:"updates,omitempty"`
	Kinds   []LearnedRuntime `json:"kinds,omitempty"`
}

// LearnedRuntime is one kind's runs, oldest first: seconds, or shares of the limit when
// Ratio is set.
type LearnedRuntime struct {
	Queue   string        `json:"queue"`
	GPUs    int           `json:"gpus"` // -1: any
	Limit   time.Duration `json:"limit,omitempty"`
	Ratio   bool          `json:"ratio,omitempty"`
	Runs    []float64     `json:"runs"`
	Updated int64         `json:"updated,omitempty"`
}

// LearnedRuntimes returns the predictor's state, kinds in a fixed order.
func (s *Scheduler) LearnedRuntimes() LearnedRuntimes {
	l := &s.runtimes
	out := LearnedRuntimes{Updates: l.updates}
	keys := make([]runtimeKind, 0, len(l.kinds))
	for k := range l.kinds {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b runtimeKind) int {
		if kindLess(a, b) {
			return -1
		}
		if kindLess(b, a) {
			return 1
		}
		return 0
	})
	for _, k := range keys {
		h := l.kinds[k]
		out.Kinds = append(out.Kinds, LearnedRuntime{Queue: k.queue, GPUs: k.gpus, Limit: k.limit, Ratio: k.ratio, Runs: slices.Clone(h.runs), Updated: h.updated})
	}
	return out
}

// SetLearnedRuntimes replaces the predictor's state with one LearnedRuntimes returned (by
// this scheduler or another). Runs beyond Config.Predict.Window, and kinds beyond the
// bound, are dropped (the oldest first).
func (s *Scheduler) SetLearnedRuntimes(r LearnedRuntimes) {
	l := runtimeLearner{updates: r.Updates}
	w := max(1, s.cfg.Predict.Window)
	kinds := slices.Clone(r.Kinds)
	slices.SortStableFunc(kinds, func(a, b LearnedRuntime) int { return cmp.Compare(b.Updated, a.Updated) })
	for _, k := range kinds {
		if len(l.kinds) >= maxRuntimeKinds {
			break
		}
		runs := k.Runs
		if len(runs) > w {
			runs = runs[len(runs)-w:]
		}
		if l.kinds == nil {
			l.kinds = map[runtimeKind]*runtimeHistory{}
		}
		h := &runtimeHistory{runs: slices.Clone(runs), updated: k.Updated}
		h.rebuild()
		l.kinds[runtimeKind{queue: k.Queue, gpus: k.GPUs, limit: k.Limit, ratio: k.Ratio}] = h
	}
	s.runtimes = l
}
