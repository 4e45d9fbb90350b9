package gang

import (
	"fmt"
	"time"
)

// Adopt records a gang that already runs at the given placement: a head that takes over
// from another rebuilds its scheduler from the metadata log this way, and a head whose
// machines changed rebuilds its snapshot and adopts every running gang again. The members
// must name valid nodes and cards and fit the capacity still free (an error wrapping
// ErrInvalidRequest names the member otherwise, and nothing is changed). started is when
// the gang started running.
func (s *Scheduler) Adopt(req Request, members []MemberPlacement, started time.Time) error {
	if err := req.normalize(s.cfg.DefaultQueue); err != nil {
		return err
	}
	if _, dup := s.gangs[req.ID]; dup {
		return fmt.Errorf("gang: adopt %s: %w", req.ID, ErrDuplicate)
	}
	q, ok := s.queues.byName[req.Queue]
	if !ok || !q.leaf {
		return fmt.Errorf("gang: adopt %s in queue %q: %w", req.ID, req.Queue, ErrUnknownQueue)
	}
	if len(members) < req.Min || len(members) > req.Max {
		return fmt.Errorf("gang: adopt %s with %d members, want %d..%d: %w", req.ID, len(members), req.Min, req.Max, ErrInvalidRequest)
	}
	st := s.c.newStatement()
	allocs := make([]alloc, 0, len(members))
	for i, m := range members {
		a, err := s.adoptAlloc(req, m)
		if err == nil {
			err = s.c.canApply(a)
		}
		if err != nil {
			st.discard()
			return fmt.Errorf("gang: adopt %s member %d on node %d: %v: %w", req.ID, i, m.Node, err, ErrInvalidRequest)
		}
		st.allocate(a)
		allocs = append(allocs, a)
	}
	st.discard() // bind allocates them again, as one statement
	if req.AllReduceBytes == 0 {
		req.AllReduceBytes = s.cfg.DefaultAllReduceBytes
	}
	s.seq++
	g := &gangState{req: req, q: q, seq: s.seq, submit: started}
	s.gangs[req.ID] = g
	s.learner.observe(req.Member, req.Min)
	s.bind(g, allocs, len(members), started)
	return nil
}

// adoptAlloc turns a recorded member placement back into the allocation it holds.
func (s *Scheduler) adoptAlloc(req Request, m MemberPlacement) (alloc, error) {
	if m.Node < 0 || m.Node >= len(s.c.nodes) {
		return alloc{}, fmt.Errorf("no node %d of %d", m.Node, len(s.c.nodes))
	}
	a := alloc{node: m.Node, gpus: append([]int(nil), m.GPUs...), cpu: m.CPUMilli, mem: m.MemMiB}
	mem := req.Member
	switch {
	case mem.MIG != "":
		a.slices, _ = MIGSlices(mem.MIG)
	case mem.GPUs > 0:
		a.milli = mem.gpuMilli()
	}
	want := mem.GPUs
	if mem.MIG != "" || (mem.GPUs > 0 && mem.gpuMilli() < Milli) {
		want = 1
	}
	if len(a.gpus) != want {
		return alloc{}, fmt.Errorf("%d cards, the request asks %d", len(a.gpus), want)
	}
	return a, nil
}

// canApply reports whether an allocation fits the node's free capacity now.
func (c *cluster) canApply(a alloc) error {
	n := &c.nodes[a.node]
	if n.FreeCPU < a.cpu || n.FreeMem < a.mem {
		return fmt.Errorf("cpu %d/%d or memory %d/%d not free", a.cpu, n.FreeCPU, a.mem, n.FreeMem)
	}
	seen := map[int]bool{}
	for _, gi := range a.gpus {
		if gi < 0 || gi >= len(n.GPUs) {
			return fmt.Errorf("no card %d of %d", gi, len(n.GPUs))
		}
		if seen[gi] {
			return fmt.Errorf("card %d listed twice", gi)
		}
		seen[gi] = true
		g := n.GPUs[gi]
		switch {
		case a.slices > 0:
			if !g.MIG || g.FreeSlices < a.slices {
				return fmt.Errorf("card %d has no %d free MIG slices", gi, a.slices)
			}
		case g.MIG:
			return fmt.Errorf("card %d is MIG-partitioned", gi)
		case g.FreeMilli < a.milli:
			return fmt.Errorf("card %d has %d milli free, %d needed", gi, g.FreeMilli, a.milli)
		}
	}
	return nil
}
