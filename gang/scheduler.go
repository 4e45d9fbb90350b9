package gang

import (
	"container/heap"
	"fmt"
	"sort"
	"strings"
	"time"

	"go.uber.org/zap"
)

// BlindPolicy picks nodes member by member when Config.TopologyAware is false.
type BlindPolicy int

// Topology-blind member placement policies (for the baselines).
const (
	// BlindBinpack takes the fullest node that fits (Volcano's binpack).
	BlindBinpack BlindPolicy = iota
	// BlindSpread takes the emptiest node (kube-scheduler's LeastAllocated default, as Kueue
	// admits and leaves placement to kube-scheduler).
	BlindSpread
	// BlindFirstFit takes the first node in snapshot order that fits.
	BlindFirstFit
)

// Option configures optional dependencies of a Scheduler.
type Option func(*Scheduler)

// WithLogger sets the logger (default zap.NewNop()).
func WithLogger(l *zap.Logger) Option { return func(s *Scheduler) { s.log = l.Named("gang") } }

// WithCollectiveModel sets the AllReduce cost model (default DefaultTieredModel()).
func WithCollectiveModel(m CollectiveModel) Option { return func(s *Scheduler) { s.coll = m } }

// WithWorkload fixes the typical requests fragmentation is measured against (by default
// they are learned from submissions).
func WithWorkload(w Workload) Option { return func(s *Scheduler) { s.fixedWorkload = w } }

// SetWorkload replaces the typical requests fragmentation is measured against, e.g. with
// a distribution re-learnt by the caller from the requests seen so far. A nil workload
// returns to the one learned from submissions.
func (s *Scheduler) SetWorkload(w Workload) { s.fixedWorkload = w }

// SetFragOptions replaces the fragmentation measure of the fragmentation plugin, e.g. with
// a CPU-per-GPU ratio re-learnt from the requests seen so far.
func (s *Scheduler) SetFragOptions(o FragOptions) {
	s.fragOpt = o
	s.frag = nil // memoised values belong to the old measure
}

// WithFragOptions selects the fragmentation measure of the fragmentation plugin (default:
// memory-aware).
func WithFragOptions(o FragOptions) Option { return func(s *Scheduler) { s.fragOpt = o } }

// WithBlindPolicy sets the member placement used when Config.TopologyAware is false.
func WithBlindPolicy(p BlindPolicy) Option { return func(s *Scheduler) { s.blind = p } }

type gangStatus int

const (
	stPending gangStatus = iota
	stOverflow
	stRunning
	stTerminating
)

type gangState struct {
	req      Request
	q        *queue
	seq      int
	submit   time.Time
	status   gangStatus
	allocs   []alloc
	members  int
	start    time.Time
	lastCkpt time.Time
	progress time.Duration // work kept across preemptions
	milli    int64
	cpu, mem int64
}

type reservation struct {
	gang      string
	start     time.Time
	nodes     map[int]bool
	preemptor bool
}

// Scheduler is the gang scheduler core. It is not safe for concurrent use: one goroutine (the
// runtime's leader loop or the simulator) feeds it events and runs cycles. Every method
// takes the current time as an argument; nothing reads a clock.
type Scheduler struct {
	cfg           Config
	log           *zap.Logger
	coll          CollectiveModel
	blind         BlindPolicy
	fixedWorkload Workload
	learner       workloadLearner
	frag          *FragCache
	fragW         Workload
	fragOpt       FragOptions
	plugins       []weightedPlugin

	c      *cluster
	queues *queueTree
	gangs  map[string]*gangState
	seq    int

	pending  []*gangState // unordered; sorted per cycle
	overflow []*gangState // FIFO beyond MaxPending
	resv     *reservation

	maxIslandGPUs, maxRackGPUs int
	compactOnly                bool // place: accept only placements on the fewest machines
	caps                       map[string]*capStats
	maxCPU, maxMem             int64
}

// New builds a scheduler over a snapshot of the cluster.
func New(cfg Config, snap Snapshot, opts ...Option) (*Scheduler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c, err := newCluster(snap)
	if err != nil {
		return nil, err
	}
	s := &Scheduler{
		cfg:     cfg,
		log:     zap.NewNop(),
		coll:    DefaultTieredModel(),
		c:       c,
		queues:  newQueueTree(cfg.Queues),
		gangs:   map[string]*gangState{},
		plugins: pluginsFor(cfg.Weights),
		fragOpt: FragOptions{Memory: true},
	}
	for _, o := range opts {
		o(s)
	}
	for _, n := range c.islandGPUs {
		s.maxIslandGPUs = max(s.maxIslandGPUs, n)
	}
	for _, n := range c.rackGPUs {
		s.maxRackGPUs = max(s.maxRackGPUs, n)
	}
	s.buildCapStats()
	return s, nil
}

// Pending returns the number of gangs waiting (including the overflow beyond MaxPending).
func (s *Scheduler) Pending() int { return len(s.pending) + len(s.overflow) }

// Running returns the number of admitted gangs.
func (s *Scheduler) Running() int { return len(s.gangs) - s.Pending() }

// Utilization returns the allocated share of the cluster's GPUs, in [0, 1].
func (s *Scheduler) Utilization() float64 {
	if s.c.totalMilli == 0 {
		return 0
	}
	return float64(s.c.usedMilli) / float64(s.c.totalMilli)
}

// Node returns a copy of node i as the scheduler currently sees it (with allocations applied).
func (s *Scheduler) Node(i int) Node {
	n := s.c.nodes[i]
	n.GPUs = append([]GPU(nil), n.GPUs...)
	return n
}

// NumNodes returns the number of nodes.
func (s *Scheduler) NumNodes() int { return len(s.c.nodes) }

// Submit queues a gang request. A request that can never fit is rejected with the reason
// (and an error wrapping ErrNeverFits); past Config.MaxPending the gang is queued with
// the QueuedSaturated status.
func (s *Scheduler) Submit(req Request, now time.Time) (SubmitStatus, error) {
	if err := req.normalize(s.cfg.DefaultQueue); err != nil {
		return SubmitStatus{State: Rejected, Reason: err.Error()}, err
	}
	if _, dup := s.gangs[req.ID]; dup {
		err := fmt.Errorf("gang: submit %s: %w", req.ID, ErrDuplicate)
		return SubmitStatus{State: Rejected, Reason: err.Error()}, err
	}
	q, ok := s.queues.byName[req.Queue]
	if !ok || !q.leaf {
		err := fmt.Errorf("gang: submit %s to queue %q: %w", req.ID, req.Queue, ErrUnknownQueue)
		return SubmitStatus{State: Rejected, Reason: err.Error()}, err
	}
	if reason := s.neverFits(&req); reason != "" {
		err := fmt.Errorf("gang: submit %s: %s: %w", req.ID, reason, ErrNeverFits)
		return SubmitStatus{State: Rejected, Reason: reason}, err
	}
	if req.AllReduceBytes == 0 {
		req.AllReduceBytes = s.cfg.DefaultAllReduceBytes
	}
	s.seq++
	g := &gangState{req: req, q: q, seq: s.seq, submit: now}
	s.gangs[req.ID] = g
	s.learner.observe(req.Member, req.Min)
	if len(s.pending) >= s.cfg.MaxPending {
		g.status = stOverflow
		s.overflow = append(s.overflow, g)
		return SubmitStatus{State: QueuedSaturated, Reason: fmt.Sprintf("queued, cluster saturated: %d gangs pending (bound %d)", s.Pending(), s.cfg.MaxPending)}, nil
	}
	s.addPending(g)
	return SubmitStatus{State: Queued}, nil
}

func (s *Scheduler) addPending(g *gangState) {
	g.status = stPending
	s.pending = append(s.pending, g)
	s.queues.addPending(g.q, 1)
}

func (s *Scheduler) removePending(g *gangState) {
	for i, p := range s.pending {
		if p == g {
			s.pending[i] = s.pending[len(s.pending)-1]
			s.pending = s.pending[:len(s.pending)-1]
			s.queues.addPending(g.q, -1)
			return
		}
	}
}

// capStats summarises, per GPU model, the static capacity that submission checks use.
type capStats struct {
	maxNode, total, maxIsland int
	mig                       bool
}

func (s *Scheduler) buildCapStats() {
	s.caps = map[string]*capStats{}
	islands := map[string]map[int]int{}
	for i := range s.c.nodes {
		n := &s.c.nodes[i]
		per := map[string]int{}
		for _, g := range n.GPUs {
			cs := s.caps[g.Model]
			if cs == nil {
				cs = &capStats{}
				s.caps[g.Model] = cs
				islands[g.Model] = map[int]int{}
			}
			if g.MIG {
				cs.mig = true
				continue
			}
			per[g.Model]++
			cs.total++
			islands[g.Model][g.Island]++
		}
		for m, k := range per {
			s.caps[m].maxNode = max(s.caps[m].maxNode, k)
		}
		s.maxCPU = max(s.maxCPU, n.CPUMilli)
		s.maxMem = max(s.maxMem, n.MemMiB)
	}
	for m, is := range islands {
		for _, k := range is {
			s.caps[m].maxIsland = max(s.caps[m].maxIsland, k)
		}
	}
}

// neverFits returns why no cluster state could admit the request, or "". It uses capacity
// summaries built once, so submission does not scan the nodes.
func (s *Scheduler) neverFits(r *Request) string {
	m := r.Member
	var bestNode, total, bestIsland int
	mig := false
	for model, cs := range s.caps {
		if !modelOK(r.GPUModels, model) {
			continue
		}
		bestNode = max(bestNode, cs.maxNode)
		bestIsland = max(bestIsland, cs.maxIsland)
		total += cs.total
		mig = mig || cs.mig
	}
	switch {
	case m.CPUMilli > s.maxCPU:
		return fmt.Sprintf("member asks %d milli-CPU, the largest node has %d", m.CPUMilli, s.maxCPU)
	case m.MemMiB > s.maxMem:
		return fmt.Sprintf("member asks %d MiB, the largest node has %d", m.MemMiB, s.maxMem)
	case m.MIG != "":
		if !mig {
			return fmt.Sprintf("no MIG-enabled GPU of models %v can host profile %s", r.GPUModels, m.MIG)
		}
	case m.GPUs > 0 && bestNode == 0:
		return fmt.Sprintf("no GPU of models %v in the cluster", r.GPUModels)
	case m.GPUs > 0 && m.gpuMilli() == Milli && m.GPUs > bestNode:
		return fmt.Sprintf("member asks %d GPUs on one machine, the largest machine with models %v has %d", m.GPUs, r.GPUModels, bestNode)
	case m.GPUs > 0 && m.gpuMilli() == Milli && r.Min*m.GPUs > total:
		return fmt.Sprintf("gang asks %d GPUs, the cluster has %d of models %v", r.Min*m.GPUs, total, r.GPUModels)
	case r.SameIsland && m.GPUs > 0 && r.Min*m.GPUs > bestIsland:
		return fmt.Sprintf("gang asks %d GPUs in one NVLink island, the largest island has %d", r.Min*m.GPUs, bestIsland)
	}
	return ""
}

// Finish releases a gang that completed (or failed, or was cancelled) and forgets it.
func (s *Scheduler) Finish(id string, now time.Time) error {
	g, ok := s.gangs[id]
	if !ok {
		return fmt.Errorf("gang: finish %s: %w", id, ErrUnknownGang)
	}
	switch g.status {
	case stPending:
		s.removePending(g)
	case stOverflow:
		for i, p := range s.overflow {
			if p == g {
				s.overflow = append(s.overflow[:i], s.overflow[i+1:]...)
				break
			}
		}
	case stRunning, stTerminating:
		s.unbind(g)
	}
	delete(s.gangs, id)
	if s.resv != nil && s.resv.gang == id {
		s.resv = nil
	}
	return nil
}

// Checkpointed records that a running gang completed a checkpoint at time at.
func (s *Scheduler) Checkpointed(id string, at time.Time) error {
	g, ok := s.gangs[id]
	if !ok {
		return fmt.Errorf("gang: checkpointed %s: %w", id, ErrUnknownGang)
	}
	g.lastCkpt = at
	return nil
}

// Evicted reports that a preempted gang has stopped: its resources are released and it
// queues again. checkpointed says whether it saved its state before stopping (work since
// its last checkpoint is lost otherwise).
func (s *Scheduler) Evicted(id string, now time.Time, checkpointed bool) error {
	g, ok := s.gangs[id]
	if !ok {
		return fmt.Errorf("gang: evicted %s: %w", id, ErrUnknownGang)
	}
	if g.status != stRunning && g.status != stTerminating {
		return fmt.Errorf("gang: evicted %s while not running: %w", id, ErrUnknownGang)
	}
	if checkpointed {
		g.progress += now.Sub(g.start)
	} else if !g.lastCkpt.IsZero() && g.lastCkpt.After(g.start) {
		g.progress += g.lastCkpt.Sub(g.start)
	}
	s.unbind(g)
	s.addPending(g)
	return nil
}

// UpdateLoad records a node's measured load (from the agents' heartbeats).
func (s *Scheduler) UpdateLoad(node int, l Load) error {
	if node < 0 || node >= len(s.c.nodes) {
		return fmt.Errorf("gang: load for node %d of %d: %w", node, len(s.c.nodes), ErrInvalidSnapshot)
	}
	s.c.nodes[node].Load = l
	return nil
}

func (s *Scheduler) bind(g *gangState, allocs []alloc, members int, now time.Time) {
	st := s.c.newStatement()
	for _, a := range allocs {
		st.allocate(a)
	}
	st.commit()
	g.allocs, g.members = allocs, members
	g.status = stRunning
	g.start = now
	g.lastCkpt = time.Time{}
	g.milli, g.cpu, g.mem = 0, 0, 0
	for _, a := range allocs {
		g.milli += int64(a.totalMilli())
		g.cpu += a.cpu
		g.mem += a.mem
	}
	s.queues.charge(g.q, g.milli, g.cpu, g.mem, 1)
}

func (s *Scheduler) unbind(g *gangState) {
	st := s.c.newStatement()
	for i := len(g.allocs) - 1; i >= 0; i-- {
		st.release(g.allocs[i])
	}
	st.commit()
	s.queues.charge(g.q, g.milli, g.cpu, g.mem, -1)
	g.allocs = nil
	g.milli, g.cpu, g.mem = 0, 0, 0
}

// effClass is the gang's priority class raised by aging.
func (s *Scheduler) effClass(g *gangState, now time.Time) int {
	p := g.req.Priority
	if s.cfg.AgingStep > 0 && now.After(g.submit) {
		p += int(now.Sub(g.submit) / s.cfg.AgingStep)
	}
	return p
}

// DynamicPriority returns α·(remaining/total) + β·(resource satisfaction) + γ·(queue
// sensitivity) for a pending gang: remaining/total is the share of its expected work still
// to do (1 when unknown or fresh); resource satisfaction is 1 - min(1, dominant share /
// fair share) of its queue (under-served queues first); queue sensitivity is the queue's
// declared sensitivity, or 1 for a latency-sensitive request.
func (s *Scheduler) dynamicPriority(g *gangState) float64 {
	rem := 1.0
	if g.req.Duration > 0 {
		rem = clamp01(float64(g.req.Duration-g.progress) / float64(g.req.Duration))
	}
	sat := 1 - min(1, g.q.ratio(s.c))
	sens := g.q.sens
	if g.req.LatencySensitive {
		sens = 1
	}
	w := s.cfg.Priority
	return w.Alpha*rem + w.Beta*sat + w.Gamma*sens
}

// Cycle runs one scheduling cycle at time now: it orders pending gangs, admits what fits
// (all-or-nothing), preempts for blocked higher-priority or under-share gangs, holds a
// reservation for the first blocked gang and backfills around it. It returns the decisions;
// placements are already accounted in the scheduler's state.
func (s *Scheduler) Cycle(now time.Time) Decisions {
	d := Decisions{Now: now}
	for len(s.overflow) > 0 && len(s.pending) < s.cfg.MaxPending {
		g := s.overflow[0]
		s.overflow = s.overflow[1:]
		s.addPending(g)
	}
	if len(s.pending) == 0 {
		s.resv = nil
		return d
	}
	s.queues.computeFair()
	type keyed struct {
		g     *gangState
		class int
		dyn   float64
	}
	order := make([]keyed, len(s.pending))
	for i, g := range s.pending {
		order[i] = keyed{g: g, class: s.effClass(g, now), dyn: s.dynamicPriority(g)}
	}
	if s.cfg.StrictFIFO {
		sort.Slice(order, func(i, j int) bool { return order[i].g.seq < order[j].g.seq })
	} else {
		sort.Slice(order, func(i, j int) bool {
			a, b := order[i], order[j]
			if a.class != b.class {
				return a.class > b.class
			}
			if a.dyn != b.dyn {
				return a.dyn > b.dyn
			}
			return a.g.seq < b.g.seq
		})
	}
	// A reservation whose gang is gone, or a backfill reservation from an earlier cycle, is
	// recomputed; a preemptor's reservation stands until it is placed.
	if s.resv != nil {
		if g, ok := s.gangs[s.resv.gang]; !ok || g.status != stPending || !s.resv.preemptor {
			s.resv = nil
		}
	}
	preemptTries := 0
	reserveTried, compactTried := false, false // one search of each kind per cycle
	var placed []*gangState
	// failed remembers, per member shape, the fewest members that found no placement this
	// cycle with no node excluded: a gang of that shape asking as many or more cannot fit
	// either and is passed over without a search. Such skips do not count against
	// MaxGangsPerCycle, so a backlog of blocked large gangs does not hide the small ones
	// behind it; scanned bounds the whole loop.
	type shapeKey struct {
		m      Member
		models string
	}
	failed := map[shapeKey]int{}
	scanned := 0
	for _, k := range order {
		if d.Attempts >= s.cfg.MaxGangsPerCycle || scanned >= 16*s.cfg.MaxGangsPerCycle {
			break
		}
		scanned++
		g := k.g
		sk := shapeKey{g.req.Member, strings.Join(g.req.GPUModels, "|")}
		if n, ok := failed[sk]; ok && g.req.Min >= n && !s.cfg.StrictFIFO {
			continue
		}
		d.Attempts++
		if s.cfg.QuotaAdmission && g.q.quota > 0 {
			need := int64(g.req.Min) * int64(g.req.Member.TotalMilli())
			if g.q.usedMilli+need > int64(g.q.quota)*Milli {
				d.Waiting = appendWaiting(d.Waiting, g.req.ID, "queue quota exhausted")
				continue
			}
		}
		excl := s.exclusion(g, now)
		cand, members, reason := s.placeElastic(g, excl)
		if cand != nil && s.cfg.TopologyAware && s.cfg.TopologyWait > 0 && cand.in.Machines > cand.in.MinMachines &&
			now.Sub(g.submit) < s.cfg.TopologyWait {
			d.Waiting = appendWaiting(d.Waiting, g.req.ID, fmt.Sprintf("waiting up to %s for a placement on %d machine(s), best now crosses %d",
				s.cfg.TopologyWait, cand.in.MinMachines, cand.in.Machines))
			if s.resv == nil && s.cfg.Backfill && !compactTried {
				// Hold the machines that free up first for a compact placement, or
				// one-GPU work would refill every card the moment it frees.
				compactTried = true
				s.compactOnly = true
				s.reserve(g, now)
				s.compactOnly = false
			}
			continue
		}
		if cand != nil {
			p := s.commitPlacement(g, cand, members, now)
			p.Backfill = s.resv != nil && s.resv.gang != g.req.ID && touches(cand.allocs, s.resv.nodes)
			if s.resv != nil && s.resv.gang == g.req.ID {
				p.Preemptor = s.resv.preemptor
				s.resv = nil
			}
			d.Placements = append(d.Placements, p)
			placed = append(placed, g)
			continue
		}
		d.Waiting = appendWaiting(d.Waiting, g.req.ID, reason)
		if s.cfg.StrictFIFO {
			break
		}
		if excl == nil {
			if n, ok := failed[sk]; !ok || g.req.Min < n {
				failed[sk] = g.req.Min
			}
		}
		if s.resv != nil {
			continue
		}
		if s.cfg.Preemption && preemptTries < 2 {
			preemptTries++
			if pre := s.tryPreempt(g, now); len(pre) > 0 {
				d.Preemptions = append(d.Preemptions, pre...)
				continue
			}
		}
		if s.cfg.Backfill && !reserveTried {
			reserveTried = true // one reservation search per cycle bounds its latency
			s.reserve(g, now)
		}
	}
	for _, g := range placed {
		s.removePending(g)
	}
	if s.resv != nil {
		r := &Reservation{Gang: s.resv.gang, Start: s.resv.start}
		for n := range s.resv.nodes {
			r.Nodes = append(r.Nodes, n)
		}
		sort.Ints(r.Nodes)
		d.Reservation = r
	}
	return d
}

func appendWaiting(w []Waiting, id, reason string) []Waiting {
	if len(w) < 64 {
		w = append(w, Waiting{Gang: id, Reason: reason})
	}
	return w
}

func touches(allocs []alloc, nodes map[int]bool) bool {
	for _, a := range allocs {
		if nodes[a.node] {
			return true
		}
	}
	return false
}

// exclusion returns the nodes gang g may not use now: a reservation's nodes, unless g is
// the reserved gang or is known to finish before the reservation starts (backfill).
func (s *Scheduler) exclusion(g *gangState, now time.Time) map[int]bool {
	r := s.resv
	if r == nil || r.gang == g.req.ID {
		return nil
	}
	if rg, ok := s.gangs[r.gang]; ok && g.req.Priority > rg.req.Priority {
		return nil // a reservation does not hold back higher-priority work
	}
	if !r.preemptor && g.req.Duration > 0 && !now.Add(g.req.Duration).After(r.start) {
		return nil
	}
	return r.nodes
}

// placeElastic tries Max members, then Min.
func (s *Scheduler) placeElastic(g *gangState, excl map[int]bool) (*candidate, int, string) {
	cand, reason := s.place(g, g.req.Max, excl)
	if cand != nil {
		return cand, g.req.Max, ""
	}
	if g.req.Min < g.req.Max {
		if cand, reason2 := s.place(g, g.req.Min, excl); cand != nil {
			return cand, g.req.Min, ""
		} else {
			reason = reason2
		}
	}
	return nil, 0, reason
}

func (s *Scheduler) commitPlacement(g *gangState, cand *candidate, members int, now time.Time) Placement {
	s.bind(g, cand.allocs, members, now)
	p := Placement{
		Gang:      g.req.ID,
		Scores:    cand.scores,
		Total:     cand.total,
		Islands:   cand.in.Islands,
		Machines:  cand.in.Machines,
		Racks:     cand.in.Racks,
		AllReduce: cand.in.AllReduce,
	}
	for _, a := range cand.allocs {
		mp := MemberPlacement{Node: a.node, NodeName: s.c.nodes[a.node].Name, GPUs: a.gpus, Milli: a.milli, CPUMilli: a.cpu, MemMiB: a.mem}
		if a.slices > 0 {
			mp.MIG = g.req.Member.MIG
			mp.Milli = 0
		}
		p.Members = append(p.Members, mp)
	}
	s.log.Debug("placed", zap.String("gang", g.req.ID), zap.Int("members", members), zap.Int("machines", p.Machines), zap.Duration("allreduce", p.AllReduce))
	return p
}

// victimCost is the GPU-seconds an eviction of g at now costs.
func victimCost(g *gangState, now time.Time) float64 {
	ck := g.req.Checkpoint
	last := g.start
	if g.lastCkpt.After(last) {
		last = g.lastCkpt
	} else if ck.Interval > 0 && now.After(g.start) {
		last = g.start.Add(now.Sub(g.start) / ck.Interval * ck.Interval)
	}
	lost := now.Sub(last)
	if lost < 0 {
		lost = 0
	}
	per := lost + ck.Save + ck.Restore + ck.CUDATeardown + ck.CUDACreate
	return per.Seconds() * float64(g.milli) / Milli
}

// tryPreempt looks for the cheapest set of whole gangs whose eviction admits g. It returns
// nothing when even evicting every eligible gang would not admit g.
func (s *Scheduler) tryPreempt(g *gangState, now time.Time) []Preemption {
	under := s.cfg.FairShareReclaim && g.q.ratio(s.c) < 1
	type vc struct {
		v      *gangState
		cost   float64
		reason string
	}
	var cands []vc
	for _, v := range s.gangs {
		if v.status != stRunning || v.req.NotPreemptible || v == g || now.Sub(v.start) < s.cfg.MinRunBeforePreempt {
			continue
		}
		switch {
		case v.req.Priority < g.req.Priority:
			cands = append(cands, vc{v, victimCost(v, now), "priority"})
		case under && v.q != g.q && v.q.ratio(s.c) > 1 && v.req.Priority <= g.req.Priority:
			cands = append(cands, vc{v, victimCost(v, now), "fair-share reclaim"})
		}
	}
	if len(cands) == 0 {
		return nil
	}
	if cand, _ := s.place(g, g.req.Min, nil); cand != nil {
		return nil // only a reservation holds g back: evicting would free nothing it needs
	}
	sort.Slice(cands, func(i, j int) bool {
		if cands[i].cost != cands[j].cost {
			return cands[i].cost < cands[j].cost
		}
		if cands[i].v.req.Priority != cands[j].v.req.Priority {
			return cands[i].v.req.Priority < cands[j].v.req.Priority
		}
		return cands[i].v.seq > cands[j].v.seq
	})
	if len(cands) > 256 {
		cands = cands[:256]
	}
	need := int64(g.req.Min) * int64(g.req.Member.TotalMilli())
	st := s.c.newStatement()
	defer st.discard()
	var chosen []vc
	var found *candidate
	tries := 0
	for _, c := range cands {
		for _, a := range c.v.allocs {
			st.release(a)
		}
		chosen = append(chosen, c)
		if s.c.totalMilli-s.c.usedMilli < need {
			continue
		}
		if tries++; tries > 48 {
			break
		}
		if cand, _ := s.place(g, g.req.Min, nil); cand != nil {
			found = cand
			break
		}
	}
	if found == nil {
		return nil // evicting would not admit g: no useless evictions
	}
	// Drop victims that turned out unnecessary, most expensive first.
	for i := len(chosen) - 1; i >= 0 && len(chosen) > 1; i-- {
		v := chosen[i].v
		sub := s.c.newStatement()
		fits := true
		for _, a := range v.allocs {
			if !s.canRetake(a) {
				fits = false
				break
			}
			sub.allocate(a)
		}
		if fits {
			if cand, _ := s.place(g, g.req.Min, nil); cand != nil {
				found = cand
				st.ops = append(st.ops, sub.ops...)
				sub.commit()
				chosen = append(chosen[:i], chosen[i+1:]...)
				continue
			}
		}
		sub.discard()
	}
	nodes := map[int]bool{}
	for _, a := range found.allocs {
		nodes[a.node] = true
	}
	var out []Preemption
	var latest time.Time
	for _, c := range chosen {
		c.v.status = stTerminating
		dl := now.Add(c.v.req.Checkpoint.Save + s.cfg.CheckpointGrace)
		if dl.After(latest) {
			latest = dl
		}
		out = append(out, Preemption{Victim: c.v.req.ID, For: g.req.ID, Deadline: dl, Cost: c.cost, Reason: c.reason})
	}
	s.resv = &reservation{gang: g.req.ID, start: latest, nodes: nodes, preemptor: true}
	return out
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

// reserve holds capacity for blocked gang g at the earliest time running gangs with known
// durations free enough of it (the shadow time), so backfill cannot delay it.
func (s *Scheduler) reserve(g *gangState, now time.Time) {
	var running []*gangState
	for _, v := range s.gangs {
		if v.status == stRunning && v.req.Duration > 0 {
			running = append(running, v)
		}
	}
	end := func(v *gangState) time.Time { return v.start.Add(v.req.Duration - v.progress) }
	if len(running) == 0 {
		return
	}
	// A heap, not a sort: the search usually stops after a few hundred of many thousands.
	h := &endHeap{gs: running, end: end}
	heap.Init(h)
	need := int64(g.req.Min) * int64(g.req.Member.TotalMilli())
	st := s.c.newStatement()
	defer st.discard()
	tries := 0
	for h.Len() > 0 {
		v := heap.Pop(h).(*gangState)
		for _, a := range v.allocs {
			st.release(a)
		}
		if s.c.totalMilli-s.c.usedMilli < need {
			continue
		}
		if tries++; tries > 32 {
			return
		}
		if cand, _ := s.place(g, g.req.Min, nil); cand != nil {
			nodes := map[int]bool{}
			for _, a := range cand.allocs {
				nodes[a.node] = true
			}
			start := end(v)
			if start.Before(now) {
				start = now
			}
			s.resv = &reservation{gang: g.req.ID, start: start, nodes: nodes}
			return
		}
	}
}

// endHeap orders running gangs by expected end, then arrival.
type endHeap struct {
	gs  []*gangState
	end func(*gangState) time.Time
}

func (h *endHeap) Len() int { return len(h.gs) }
func (h *endHeap) Less(i, j int) bool {
	ei, ej := h.end(h.gs[i]), h.end(h.gs[j])
	if !ei.Equal(ej) {
		return ei.Before(ej)
	}
	return h.gs[i].seq < h.gs[j].seq
}
func (h *endHeap) Swap(i, j int) { h.gs[i], h.gs[j] = h.gs[j], h.gs[i] }
func (h *endHeap) Push(x any)    { h.gs = append(h.gs, x.(*gangState)) }
func (h *endHeap) Pop() any {
	x := h.gs[len(h.gs)-1]
	h.gs = h.gs[:len(h.gs)-1]
	return x
}
