package gang

import (
	"fmt"
	"slices"
	"time"
)

// The cluster changes under a running scheduler as deltas: nodes join and leave
// (Reshape, RemoveNode), are cordoned (SetUnschedulable), the queues are reconfigured
// (Reconfigure). Each keeps every gang's state: its arrival order, aging, attained
// service, its placement when it still holds.

// Reshape changes the scheduler's nodes: snap is the new set (its capacity and free
// figures before the scheduler's own gangs, as New takes them; it may be empty), and
// from[i] is the index, among the current nodes, of new node i, or -1 for a node that
// joins. Current nodes not named in from leave: every admitted gang with a member on one
// of them goes back to its queue, keeping its Record (arrival order, aging, attained
// service; the work since its last checkpoint is lost), and so does a gang whose members
// no longer fit a node whose capacity shrank. Everything else carries over: placements
// (renumbered), preemptors' holds (without the nodes that left), node loads. It returns
// the gangs sent back to their queues, in arrival order. Node indexes in placements given
// out before refer to the new numbering afterwards. On an error nothing is changed.
func (s *Scheduler) Reshape(snap Snapshot, from []int, now time.Time) ([]string, error) {
	if len(from) != len(snap.Nodes) {
		return nil, fmt.Errorf("gang: reshape to %d nodes with %d origins: %w", len(snap.Nodes), len(from), ErrInvalidSnapshot)
	}
	inv := make([]int, len(s.c.nodes))
	for i := range inv {
		inv[i] = -1
	}
	for i, o := range from {
		if o < -1 || o >= len(s.c.nodes) || (o >= 0 && inv[o] >= 0) {
			return nil, fmt.Errorf("gang: reshape: node %d comes from %d (of %d, or twice): %w", i, o, len(s.c.nodes), ErrInvalidSnapshot)
		}
		if o >= 0 {
			inv[o] = i
		}
	}
	c, err := newCluster(snap)
	if err != nil {
		return nil, err
	}
	for i, o := range from {
		if o >= 0 {
			c.nodes[i].Load = s.c.nodes[o].Load
		}
	}
	running := slices.Clone(s.running)
	slices.SortFunc(running, func(a, b *gangState) int { return a.seq - b.seq })
	var lost []*gangState
	kept := make(map[*gangState][]alloc, len(running))
	for _, g := range running {
		allocs := make([]alloc, 0, len(g.allocs))
		st := c.newStatement()
		for _, a := range g.allocs {
			n := inv[a.node]
			if n < 0 {
				break
			}
			a.node, a.gpus = n, slices.Clone(a.gpus)
			if c.canApply(a) != nil {
				break
			}
			st.allocate(a)
			allocs = append(allocs, a)
		}
		if len(allocs) < len(g.allocs) {
			st.discard()
			lost = append(lost, g)
			continue
		}
		st.commit()
		kept[g] = allocs
	}
	// Nothing can fail from here on.
	s.c = c
	for g, allocs := range kept {
		g.allocs = allocs
	}
	var out []string
	for _, g := range lost {
		s.requeueLost(g, now)
		out = append(out, g.req.ID)
	}
	for id, h := range s.holds {
		nodes := make(map[int]bool, len(h.nodes))
		for n := range h.nodes {
			if n < len(inv) && inv[n] >= 0 {
				nodes[inv[n]] = true
			}
		}
		s.holds[id] = &reservation{gang: h.gang, start: h.start, nodes: nodes, preemptor: h.preemptor, skipPermit: h.skipPermit}
	}
	s.resvs = nil
	s.nodesChanged()
	return out, nil
}

// RemoveNode removes node i (a machine lost or taken away): as Reshape without it. The
// nodes after it move down by one.
func (s *Scheduler) RemoveNode(i int, now time.Time) ([]string, error) {
	if i < 0 || i >= len(s.c.nodes) {
		return nil, fmt.Errorf("gang: remove node %d of %d: %w", i, len(s.c.nodes), ErrInvalidSnapshot)
	}
	base := s.baseSnapshot()
	from := make([]int, 0, len(base.Nodes)-1)
	for j := range base.Nodes {
		if j != i {
			from = append(from, j)
		}
	}
	base.Nodes = slices.Delete(base.Nodes, i, i+1)
	return s.Reshape(base, from, now)
}

// baseSnapshot is the current nodes as they would be without the scheduler's gangs.
func (s *Scheduler) baseSnapshot() Snapshot {
	nodes := make([]Node, len(s.c.nodes))
	for i, n := range s.c.nodes {
		n.GPUs = slices.Clone(n.GPUs)
		nodes[i] = n
	}
	for _, g := range s.running {
		for _, a := range g.allocs {
			n := &nodes[a.node]
			for _, gi := range a.gpus {
				if a.slices > 0 {
					n.GPUs[gi].FreeSlices += a.slices
				} else {
					n.GPUs[gi].FreeMilli += a.milli
				}
			}
			n.FreeCPU += a.cpu
			n.FreeMem += a.mem
		}
	}
	return Snapshot{Nodes: nodes}
}

// requeueLost sends an admitted gang that lost its placement back to its queue, keeping
// its record; the cluster it was bound on is gone (Reshape), so nothing is released there.
func (s *Scheduler) requeueLost(g *gangState, now time.Time) {
	s.queues.charge(g.q, g.milli, g.cpu, g.mem, -1)
	s.accountAttained(g, now)
	g.progress += max(0, s.sinceStartToCheckpoint(g, now))
	g.keptUntil = time.Time{}
	g.shrinkTo, g.shrinkIdx = 0, nil
	g.allocs = nil
	g.milli, g.cpu, g.mem = 0, 0, 0
	s.dropRunning(g)
	g.queued = now
	s.addPending(g, now)
}

// dropRunning takes g out of the admitted gangs.
func (s *Scheduler) dropRunning(g *gangState) {
	last := s.running[len(s.running)-1]
	s.running[g.runIdx] = last
	last.runIdx = g.runIdx
	s.running = s.running[:len(s.running)-1]
}

// SetUnschedulable cordons node i (on: nothing new is placed there; the gangs on it keep
// running) or lifts its cordon.
func (s *Scheduler) SetUnschedulable(i int, on bool) error {
	if i < 0 || i >= len(s.c.nodes) {
		return fmt.Errorf("gang: cordon node %d of %d: %w", i, len(s.c.nodes), ErrInvalidSnapshot)
	}
	c := s.c
	if c.nodes[i].Unschedulable == on {
		return nil
	}
	c.bucketRemove(i)
	old := c.freeWhole[i]
	c.nodes[i].Unschedulable = on
	c.freeWhole[i] = c.countWhole(i)
	c.rackFree[c.rackOf[i]] += c.freeWhole[i] - old
	c.bucketAdd(i)
	c.updatePartial(i)
	return nil
}

// SetCollectiveModel replaces the AllReduce cost model, e.g. with one over the nodes after
// a Reshape.
func (s *Scheduler) SetCollectiveModel(m CollectiveModel) { s.coll = m }

// Requeue is a gang's queue and priority under a new configuration (Reconfigure); an
// empty Queue is the configuration's DefaultQueue.
type Requeue struct {
	Queue    string
	Priority int
}

// Reconfigure replaces the scheduler's configuration (queues, weights, plugins, bounds)
// and moves the gangs named in moves to their new queue and priority; the others keep
// theirs. Every gang keeps its state and placement. A configuration that leaves a gang
// without a queue is refused (wrapping ErrUnknownQueue), and nothing is changed.
func (s *Scheduler) Reconfigure(cfg Config, moves map[string]Requeue) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	tree := newQueueTree(cfg.Queues)
	queueOf := func(id string, g *gangState) string {
		if m, ok := moves[id]; ok {
			if m.Queue == "" {
				return cfg.DefaultQueue
			}
			return m.Queue
		}
		return g.req.Queue
	}
	for id, g := range s.gangs {
		if q := tree.byName[queueOf(id, g)]; q == nil || !q.leaf {
			return fmt.Errorf("gang: reconfigure: gang %s in queue %q: %w", id, queueOf(id, g), ErrUnknownQueue)
		}
	}
	reg := InTreeRegistry()
	if err := reg.Merge(s.extra); err != nil {
		return err
	}
	old := s.cfg
	s.cfg = cfg // plugin factories read the configuration through the scheduler
	prof, err := buildProfile(cfg, reg, s)
	if err != nil {
		s.cfg = old
		return err
	}
	s.prof, s.steps, s.queues = prof, cfg.steps(), tree
	for id, g := range s.gangs {
		g.req.Queue = queueOf(id, g)
		if m, ok := moves[id]; ok {
			g.req.Priority = m.Priority
		}
		g.q = tree.byName[g.req.Queue]
		switch g.status {
		case stPending:
			tree.addPending(g.q, 1)
		case stRunning, stTerminating:
			tree.charge(g.q, g.milli, g.cpu, g.mem, 1)
		}
	}
	return nil
}
