package gang

import (
	"fmt"
	"sort"
	"time"

	"go.uber.org/zap"
)

// Elastic gangs ask for Min..Max members. A gang is admitted at Max when that fits, else at
// Min; while running it grows toward Max when capacity is free and nothing waits for it,
// and it shrinks toward Min for a blocked gang (PostFilter) before anyone is evicted
// whole. Both come out of Cycle as Decisions.Resizes; a shrink is carried out by the
// caller (stop the listed members, then ResizeDone), a grow is bound at once (start the
// listed members, re-form the collective).

// shrinkMembers picks which members of g to stop to go down to `to`: the members on the
// machines holding the fewest of its members first (the survivors stay compact), later
// members first on ties. It returns member indexes in the order to release them.
func shrinkMembers(g *gangState, to int) []int {
	n := len(g.allocs)
	if to >= n {
		return nil
	}
	perNode := map[int]int{}
	for _, a := range g.allocs {
		perNode[a.node]++
	}
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool {
		na, nb := perNode[g.allocs[idx[a]].node], perNode[g.allocs[idx[b]].node]
		if na != nb {
			return na < nb
		}
		return idx[a] > idx[b]
	})
	return idx[:n-to]
}

// ShrinkCost implements Handle.
func (s *Scheduler) ShrinkCost(r *RunningGang, to int, now time.Time) EvictionCost {
	return s.shrinkCost(r.g, to, now)
}

// shrinkCost is what shrinking g to `to` members costs: the survivors keep their state and
// CUDA contexts but re-form their communicator (Communicator for `to` ranks, on every GPU
// of the gang while it waits); the stopped members tear down their contexts.
func (s *Scheduler) shrinkCost(g *gangState, to int, now time.Time) EvictionCost {
	per := float64(g.milli) / Milli / float64(max(1, g.members))
	c := EvictionCost{GPUs: per * float64(g.members), StopBy: now.Add(s.cfg.CheckpointGrace), Kept: now}
	c.Communicator = s.costs.Estimate(g.gpuModel, ranks(to, int64(float64(g.milli)*float64(to)/float64(max(1, g.members)))), CostCommunicator)
	c.GPUSeconds = c.Communicator.Seconds() * c.GPUs
	return c
}

// growGain is whether growing g from its size to `to` members is worth the pause: with
// work that scales with members, the time saved, R × (1 − size/to) for R the expected time
// left at the current size, must exceed the communicator set-up (plus the new members'
// CUDA contexts). Gangs whose run time nothing tells always grow.
func (s *Scheduler) growGain(g *gangState, to int, now time.Time) bool {
	left, ok := s.expectedLeft(g, now)
	if !ok {
		return true
	}
	saved := time.Duration(float64(left) * (1 - float64(g.members)/float64(to)))
	newMilli := int64(float64(g.milli) * float64(to) / float64(max(1, g.members)))
	pause := s.costs.Estimate(g.gpuModel, ranks(to, newMilli), CostCommunicator) + s.costs.Estimate(g.gpuModel, 1, CostCUDAContext)
	return saved > pause
}

// grow lets running elastic gangs below Max take free capacity, most important first, when
// no pending gang waits for capacity this cycle (growth must not take what a queued gang
// could use). One resize per gang per cycle.
func (s *Scheduler) grow(d *Decisions, now time.Time) {
	if !s.cfg.ElasticGrow {
		return
	}
	for _, g := range s.pending {
		switch g.wait.Kind {
		case WaitCapacity, WaitFragmented, WaitReserved, WaitPreempting, WaitNotReached:
			return
		}
	}
	var cands []*gangState
	for _, g := range s.running {
		// Not in the cycle it started, nor within MinRunBeforePreempt of its last resize:
		// a gang just shrunk for someone is not grown back at once.
		if g.status == stRunning && g.members < g.req.Max && g.shrinkTo == 0 && g.start.Before(now) &&
			(g.lastResize.IsZero() || now.Sub(g.lastResize) >= s.cfg.MinRunBeforePreempt) {
			cands = append(cands, g)
		}
	}
	sort.Slice(cands, func(i, j int) bool {
		if cands[i].req.Priority != cands[j].req.Priority {
			return cands[i].req.Priority > cands[j].req.Priority
		}
		return cands[i].seq < cands[j].seq
	})
	for _, g := range cands {
		if s.c.totalMilli-s.c.usedMilli < int64(g.req.Member.TotalMilli()) {
			return
		}
		excl := s.exclusion(g, now)
		room := int((s.c.totalMilli - s.c.usedMilli) / int64(g.req.Member.TotalMilli()))
		qv := s.queuedView(g, now)
		s.att = s.newAttempt(&qv, nil, g.allocs) // its plugins see the members it runs
		for extra := min(g.req.Max-g.members, room); extra > 0; extra /= 2 {
			if !s.growGain(g, g.members+extra, now) {
				break
			}
			cand := s.place(g, extra, excl)
			if cand == nil {
				continue
			}
			d.Resizes = append(d.Resizes, s.commitGrow(g, cand, now))
			break
		}
		s.att = nil
	}
}

// commitGrow binds the new members of g.
func (s *Scheduler) commitGrow(g *gangState, cand *candidate, now time.Time) Resize {
	r := Resize{Gang: g.req.ID, From: g.members, To: g.members + len(cand.allocs), Reason: "capacity is free and no gang waits for it"}
	to := r.To
	r.Cost.Communicator = s.costs.Estimate(g.gpuModel, ranks(to, int64(float64(g.milli)*float64(to)/float64(max(1, g.members)))), CostCommunicator)
	s.accountAttained(g, now)
	st := s.c.newStatement()
	var milli, cpu, mem int64
	for _, a := range cand.allocs {
		st.allocate(a)
		milli += int64(a.totalMilli())
		cpu += a.cpu
		mem += a.mem
		r.Add = append(r.Add, s.memberPlacement(g, a))
	}
	st.commit()
	g.allocs = append(g.allocs, cand.allocs...)
	g.members += len(cand.allocs)
	g.lastResize = now
	g.resizes++
	g.milli += milli
	g.cpu += cpu
	g.mem += mem
	r.Cost.GPUs = float64(g.milli) / Milli
	r.Cost.GPUSeconds = r.Cost.Communicator.Seconds() * r.Cost.GPUs
	s.queues.charge(g.q, milli, cpu, mem, 1)
	s.log.Debug("grew", zap.String("gang", g.req.ID), zap.Int("from", r.From), zap.Int("to", r.To))
	return r
}

// ResizeDone reports that the members a shrink decision listed have stopped: their
// capacity is released and the gang runs on with the rest.
func (s *Scheduler) ResizeDone(id string, now time.Time) error {
	g, ok := s.gangs[id]
	if !ok {
		return fmt.Errorf("gang: resize done %s: %w", id, ErrUnknownGang)
	}
	if g.shrinkTo == 0 || g.status != stRunning {
		return fmt.Errorf("gang: resize done %s: %w", id, ErrNoShrink)
	}
	s.accountAttained(g, now)
	drop := map[int]bool{}
	for _, i := range g.shrinkIdx {
		drop[i] = true
	}
	st := s.c.newStatement()
	var keep []alloc
	var milli, cpu, mem int64
	for i, a := range g.allocs {
		if !drop[i] {
			keep = append(keep, a)
			continue
		}
		st.release(a)
		milli += int64(a.totalMilli())
		cpu += a.cpu
		mem += a.mem
	}
	st.commit()
	g.allocs = keep
	g.members = len(keep)
	g.milli -= milli
	g.cpu -= cpu
	g.mem -= mem
	s.queues.charge(g.q, milli, cpu, mem, -1)
	g.shrinkTo, g.shrinkIdx = 0, nil
	g.resizes++
	return nil
}

// accountAttained brings g's attained service up to now.
func (s *Scheduler) accountAttained(g *gangState, now time.Time) {
	if now.After(g.attainedAt) {
		g.attained += now.Sub(g.attainedAt).Seconds() * float64(g.milli) / Milli
		g.attainedAt = now
	}
}

func (s *Scheduler) memberPlacement(g *gangState, a alloc) MemberPlacement {
	mp := MemberPlacement{Node: a.node, NodeName: s.c.nodes[a.node].Name, GPUs: a.gpus, Milli: a.milli, CPUMilli: a.cpu, MemMiB: a.mem}
	if a.slices > 0 {
		mp.MIG = g.req.Member.MIG
		mp.Milli = 0
	}
	return mp
}
