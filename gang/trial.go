package gang

// Trial is a tentative change of the cluster for plugins (Volcano's Statement): gangs
// released, members taken back, placements tried. Nothing is kept: Discard undoes every
// operation newest first, and Rollback undoes back to a Mark. A Trial must be discarded
// before the cycle goes on; two trials must not be open at once.
type Trial struct {
	s   *Scheduler
	st  *statement
	rel map[*gangState][]int // member indexes released per gang, in release order
}

// Fit describes a placement a trial found.
type Fit struct {
	Nodes []int // distinct nodes, in placement order
	Input ScoreInput
}

// NewTrial implements Handle.
func (s *Scheduler) NewTrial() *Trial {
	return &Trial{s: s, st: s.c.newStatement(), rel: map[*gangState][]int{}}
}

// Evict releases every member of r (as if it had stopped); of a gang this trial shrank,
// the members the shrink kept.
func (t *Trial) Evict(r *RunningGang) {
	done := make(map[int]bool, len(t.rel[r.g]))
	idx := t.rel[r.g]
	for _, i := range idx {
		done[i] = true
	}
	for i, a := range r.g.allocs {
		if done[i] {
			continue
		}
		t.st.release(a)
		idx = append(idx, i)
	}
	t.rel[r.g] = idx
}

// keepShrunk takes back, of r released whole by this trial, the members a shrink to `to`
// keeps, so that r stands shrunk instead of evicted. It returns false, and changes
// nothing, when one of them is no longer free.
func (t *Trial) keepShrunk(r *RunningGang, to int) bool {
	drop := shrinkMembers(r.g, to)
	gone := make(map[int]bool, len(drop))
	for _, i := range drop {
		gone[i] = true
	}
	m := t.Mark()
	for _, i := range t.rel[r.g] {
		if gone[i] {
			continue
		}
		a := r.g.allocs[i]
		if !t.s.canRetake(a) {
			t.Rollback(m)
			return false
		}
		t.st.allocate(a)
	}
	t.rel[r.g] = drop
	return true
}

// Shrink releases the members of r that a shrink to `to` members would stop (those on
// the machines holding the fewest of its members) and returns their indexes.
func (t *Trial) Shrink(r *RunningGang, to int) []int {
	idx := shrinkMembers(r.g, to)
	for _, i := range idx {
		t.st.release(r.g.allocs[i])
	}
	t.rel[r.g] = idx
	return idx
}

// Retake takes back, as they were, the members of r this trial released. It returns
// false, and changes nothing, when one of them is no longer free.
func (t *Trial) Retake(r *RunningGang) bool {
	m := t.Mark()
	for _, i := range t.rel[r.g] {
		a := r.g.allocs[i]
		if !t.s.canRetake(a) {
			t.Rollback(m)
			return false
		}
		t.st.allocate(a)
	}
	return true
}

// RetakeLast takes back the member of r this trial released last; false (nothing changed)
// when none is left or its capacity is no longer free.
func (t *Trial) RetakeLast(r *RunningGang) bool {
	idx := t.rel[r.g]
	if len(idx) == 0 {
		return false
	}
	a := r.g.allocs[idx[len(idx)-1]]
	if !t.s.canRetake(a) {
		return false
	}
	t.st.allocate(a)
	t.rel[r.g] = idx[:len(idx)-1]
	return true
}

// Mark returns a point to roll back to.
func (t *Trial) Mark() int { return len(t.st.ops) }

// Rollback undoes, newest first, every operation after mark.
func (t *Trial) Rollback(mark int) {
	for i := len(t.st.ops) - 1; i >= mark; i-- {
		op := t.st.ops[i]
		if op.release {
			t.s.c.apply(op.a, -1)
		} else {
			t.s.c.apply(op.a, +1)
		}
	}
	t.st.ops = t.st.ops[:mark]
}

// Discard undoes every operation of the trial.
func (t *Trial) Discard() { t.st.discard() }

// FreeMilli returns the cluster's free GPU capacity in the trial's state.
func (t *Trial) FreeMilli() int64 { return t.s.c.totalMilli - t.s.c.usedMilli }

// Fits returns where members members of g would go in the trial's state, outside nodes
// held or reserved for other gangs (Scheduler's exclusion rules), or nil. The placement
// search runs the Filter and Score plugins of g's attempt with state (nil: a fresh one),
// as the cycle's would. With compact set only placements on the fewest machines count.
func (t *Trial) Fits(state *CycleState, g *QueuedGang, members int, compact bool) *Fit {
	s := t.s
	old, oldAtt := s.compactOnly, s.att
	s.compactOnly = compact
	if oldAtt == nil || oldAtt.g != g || (state != nil && oldAtt.state != state) || len(oldAtt.base) > 0 {
		s.att = s.newAttempt(g, state, nil)
	}
	cand := s.place(g.g, members, s.exclusion(g.g, s.now))
	s.compactOnly, s.att = old, oldAtt
	if cand == nil {
		return nil
	}
	f := &Fit{Input: cand.in}
	seen := map[int]bool{}
	for _, a := range cand.allocs {
		if !seen[a.node] {
			seen[a.node] = true
			f.Nodes = append(f.Nodes, a.node)
		}
	}
	return f
}

// canRetake reports whether an allocation released in a statement can be taken back as is.
func (s *Scheduler) canRetake(a alloc) bool {
	n := &s.c.nodes[a.node]
	if n.FreeCPU < a.cpu || n.FreeMem < a.mem {
		return false
	}
	for _, gi := range a.gpus {
		g := n.GPUs[gi]
		if a.slices > 0 {
			if g.FreeSlices < a.slices {
				return false
			}
		} else if g.FreeMilli < a.milli {
			return false
		}
	}
	return true
}
