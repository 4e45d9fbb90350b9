package gang

import (
	"fmt"
	"slices"
	"sort"
	"time"
)

// Record is what the scheduler keeps of a gang beyond its Request: every input its
// decisions about the gang depend on (queue order, aging, the service it attained, the
// work it kept, the stop or shrink under way, a preemptor's hold). A runtime that must
// survive its own restart, or hand the scheduler to another process, stores it with every
// change of the gang (Scheduler.Record) and gives it back to Restore: a scheduler rebuilt
// that way from every gang's Request and Record, with the cost model (WithCostModel) and
// the learned workload (SetLearnedWorkload), decides as the original would have.
type Record struct {
	// Seq is the gang's place in arrival order: ties of the queue order go to the lower.
	Seq int
	// Submitted is when it was submitted (priority aging counts from here); Queued when it
	// last entered its queue (QueuedGang.Waited counts from here).
	Submitted, Queued time.Time
	// Started is when its current placement was bound (admitted gangs).
	Started time.Time
	// Attained is its attained service in GPU-seconds, up to AttainedAt (for an admitted
	// gang the service since AttainedAt is added at its current GPUs).
	Attained   float64
	AttainedAt time.Time
	// Progress is the work kept across stops (checkpoints that survived).
	Progress time.Duration
	// Evictions counts the times it was preempted; LastEvicted the latest.
	Evictions   int
	LastEvicted time.Time
	// Resizes counts its grows and shrinks; LastResized the latest decided.
	Resizes     int
	LastResized time.Time
	// Stopping: an admitted gang asked to stop (a preemption victim), whose checkpoint
	// will hold the run up to KeptUntil.
	Stopping  bool
	KeptUntil time.Time
	// ShrinkTo and ShrinkIndex are a shrink under way: down to ShrinkTo members, stopping
	// the members at these indexes of its placement (the order Restore is given them in).
	ShrinkTo    int
	ShrinkIndex []int
	// Hold is a pending preemptor's hold on the nodes freed for it.
	Hold *Hold
	// FitSince is, for a pending gang, the first cycle since it queued that found it a
	// placement (the topology wait counts from there).
	FitSince time.Time
}

// Hold is a pending gang's hold on nodes freed for it by preemption, from Start (when its
// victims are expected to have stopped) until it is placed or Config.HoldTimeout past it.
type Hold struct {
	Nodes      []int
	Start      time.Time
	SkipPermit bool // the freed room is taken as it is, compact or not
}

// Record returns the record of gang id (see Record).
func (s *Scheduler) Record(id string) (Record, error) {
	g, ok := s.gangs[id]
	if !ok {
		return Record{}, fmt.Errorf("gang: record of %s: %w", id, ErrUnknownGang)
	}
	r := Record{
		Seq: g.seq, Submitted: g.submit, Queued: g.queued,
		Attained: g.attained, AttainedAt: g.attainedAt, Progress: g.progress,
		Evictions: g.evictions, LastEvicted: g.lastEvict, Resizes: g.resizes, LastResized: g.lastResize,
	}
	switch g.status {
	case stPending:
		r.FitSince = g.fitSince
		if h := s.holds[id]; h != nil {
			r.Hold = &Hold{Start: h.start, SkipPermit: h.skipPermit}
			for n := range h.nodes {
				r.Hold.Nodes = append(r.Hold.Nodes, n)
			}
			sort.Ints(r.Hold.Nodes)
		}
	case stRunning, stTerminating:
		r.Started = g.start
		r.Stopping, r.KeptUntil = g.status == stTerminating, g.keptUntil
		if g.shrinkTo > 0 {
			r.ShrinkTo, r.ShrinkIndex = g.shrinkTo, slices.Clone(g.shrinkIdx)
		}
	}
	return r, nil
}

// Restore gives the scheduler back a gang it held before, with its Record: admitted on
// members (its placement, in the order Record.ShrinkIndex counts) when they are given,
// pending otherwise. Unlike Submit and Adopt it neither checks that the gang could ever
// fit (it was admitted when it could; it waits now) nor counts it against MaxPending, nor
// adds it to the learned workload (SetLearnedWorkload restores that). Members that do not
// fit the free capacity are refused as Adopt refuses them, and nothing is changed. A zero
// Record.Seq takes the next one; the scheduler's later gangs come after every Seq it has
// seen.
func (s *Scheduler) Restore(req Request, rec Record, members []MemberPlacement) error {
	if err := req.normalize(s.cfg.DefaultQueue); err != nil {
		return err
	}
	if _, dup := s.gangs[req.ID]; dup {
		return fmt.Errorf("gang: restore %s: %w", req.ID, ErrDuplicate)
	}
	q, ok := s.queues.byName[req.Queue]
	if !ok || !q.leaf {
		return fmt.Errorf("gang: restore %s in queue %q: %w", req.ID, req.Queue, ErrUnknownQueue)
	}
	if req.AllReduceBytes == 0 {
		req.AllReduceBytes = s.cfg.DefaultAllReduceBytes
	}
	var allocs []alloc
	if len(members) > 0 {
		if len(members) < req.Min || len(members) > req.Max {
			return fmt.Errorf("gang: restore %s with %d members, want %d..%d: %w", req.ID, len(members), req.Min, req.Max, ErrInvalidRequest)
		}
		if rec.ShrinkTo > 0 {
			if rec.ShrinkTo < req.Min || rec.ShrinkTo >= len(members) || len(rec.ShrinkIndex) != len(members)-rec.ShrinkTo {
				return fmt.Errorf("gang: restore %s: shrink to %d of %d members dropping %v: %w", req.ID, rec.ShrinkTo, len(members), rec.ShrinkIndex, ErrInvalidRequest)
			}
			for _, i := range rec.ShrinkIndex {
				if i < 0 || i >= len(members) {
					return fmt.Errorf("gang: restore %s: shrink drops member %d of %d: %w", req.ID, i, len(members), ErrInvalidRequest)
				}
			}
		}
		st := s.c.newStatement()
		for i, m := range members {
			a, err := s.adoptAlloc(req, m)
			if err == nil {
				err = s.c.canApply(a)
			}
			if err != nil {
				st.discard()
				return fmt.Errorf("gang: restore %s member %d on node %d: %v: %w", req.ID, i, m.Node, err, ErrInvalidRequest)
			}
			st.allocate(a)
			allocs = append(allocs, a)
		}
		st.discard() // bind allocates them again, as one statement
	}
	seq := rec.Seq
	if seq <= 0 {
		seq = s.seq + 1
	}
	s.seq = max(s.seq, seq)
	g := &gangState{req: req, q: q, seq: seq, submit: rec.Submitted, queued: rec.Queued,
		progress: rec.Progress, evictions: rec.Evictions, lastEvict: rec.LastEvicted,
		resizes: rec.Resizes, lastResize: rec.LastResized}
	s.gangs[req.ID] = g
	if len(allocs) == 0 {
		g.attained, g.attainedAt = rec.Attained, rec.AttainedAt
		seen := rec.Queued
		if seen.IsZero() {
			seen = rec.Submitted
		}
		s.addPending(g, seen)
		g.fitSince = rec.FitSince
		if h := rec.Hold; h != nil {
			nodes := make(map[int]bool, len(h.Nodes))
			for _, n := range h.Nodes {
				if n >= 0 && n < len(s.c.nodes) {
					nodes[n] = true
				}
			}
			s.holds[req.ID] = &reservation{gang: req.ID, start: h.Start, nodes: nodes, preemptor: true, skipPermit: h.SkipPermit}
		}
		return nil
	}
	started := rec.Started
	if started.IsZero() {
		started = rec.Submitted
	}
	s.bind(g, allocs, len(allocs), started)
	g.attained = rec.Attained
	if !rec.AttainedAt.IsZero() {
		g.attainedAt = rec.AttainedAt
	}
	g.lastResize = rec.LastResized // bind clears what a new placement does not keep
	if rec.Stopping {
		g.status, g.keptUntil = stTerminating, rec.KeptUntil
	}
	if rec.ShrinkTo > 0 {
		g.shrinkTo, g.shrinkIdx = rec.ShrinkTo, slices.Clone(rec.ShrinkIndex)
	}
	return nil
}

// AfterSeq makes the gangs submitted from now on come after sequence n in arrival order:
// a runtime that gave out sequences the scheduler does not hold (gangs that ended) keeps
// them increasing.
func (s *Scheduler) AfterSeq(n int) { s.seq = max(s.seq, n) }

// LearnedWorkload is the state of the workload the scheduler learned from submissions
// (unless WithWorkload fixed one): the member shapes seen with their member counts, the
// observations made and those since the workload was last rebuilt, and that workload.
// A runtime that rebuilds its scheduler gives it back (SetLearnedWorkload) so that
// fragmentation is measured as before.
type LearnedWorkload struct {
	Shapes       []LearnedShape `json:"shapes,omitempty"`
	Observations int            `json:"observations,omitempty"`
	Since        int            `json:"since,omitempty"`
	Current      Workload       `json:"current,omitempty"`
}

// LearnedShape is one member shape seen at submission and the members seen of it.
type LearnedShape struct {
	GPUs     int     `json:"gpus,omitempty"`
	Milli    int     `json:"milli,omitempty"`
	CPUMilli int64   `json:"cpu_milli,omitempty"`
	MemMiB   int64   `json:"mem_mib,omitempty"`
	Members  float64 `json:"members"`
}

// LearnedWorkload returns the learned workload's state, shapes in a fixed order.
func (s *Scheduler) LearnedWorkload() LearnedWorkload {
	l := &s.learner
	out := LearnedWorkload{Observations: l.n, Since: l.since, Current: slices.Clone(l.cached)}
	keys := make([]shapeKey, 0, len(l.counts))
	for k := range l.counts {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].less(keys[j]) })
	for _, k := range keys {
		out.Shapes = append(out.Shapes, LearnedShape{GPUs: k.gpus, Milli: k.milli, CPUMilli: k.cpu, MemMiB: k.mem, Members: l.counts[k]})
	}
	return out
}

// SetLearnedWorkload replaces the learned workload's state with one LearnedWorkload
// returned (by this scheduler or another).
func (s *Scheduler) SetLearnedWorkload(w LearnedWorkload) {
	l := workloadLearner{n: w.Observations, since: w.Since, cached: slices.Clone(w.Current)}
	for _, sh := range w.Shapes {
		if l.counts == nil {
			l.counts = map[shapeKey]float64{}
		}
		l.counts[shapeKey{gpus: sh.GPUs, milli: sh.Milli, cpu: sh.CPUMilli, mem: sh.MemMiB}] += sh.Members
		l.total += sh.Members
	}
	s.learner = l
}
