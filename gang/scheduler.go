package gang

import (
	"cmp"
	"fmt"
	"slices"
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

// WithCostModel sets the restart cost model (default DefaultCostModel()).
func WithCostModel(m *CostModel) Option { return func(s *Scheduler) { s.costs = m } }

// WithRegistry adds out-of-tree plugins to the in-tree registry (a name already taken is
// refused by New with ErrDuplicatePlugin); Config.Plugins names them at their extension
// points.
func WithRegistry(r Registry) Option { return func(s *Scheduler) { s.extra = r } }

type gangStatus int

const (
	stPending gangStatus = iota
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
	// restoreEstimated: its restore time is taken from a measured save
	// (CheckpointMeasured), not declared.
	restoreEstimated bool
	milli            int64
	cpu, mem         int64

	queued    time.Time // when it last entered the pending queue
	attained  float64   // GPU-seconds of service in earlier runs
	evictions int
	lastEvict time.Time
	runIdx    int    // position in Scheduler.running while admitted
	gpuModel  string // model of the cards it holds (cost model)
	// keptUntil is, for a gang asked to stop, the point its checkpoint will hold.
	keptUntil time.Time
	// A pending shrink: down to shrinkTo members, stopping members shrinkIdx.
	shrinkTo   int
	shrinkIdx  []int
	resizes    int
	lastResize time.Time
	attainedAt time.Time // attained is up to date until then

	// Why it waits: the reason of the latest cycle (wait, set in cycle waitCycle), since
	// waitSeen; waited sums the time spent waiting for each kind.
	wait      Waiting
	waitSeen  time.Time
	waitCycle int
	waited    [numWaitKinds]time.Duration
	fitSince  time.Time // first cycle, since it queued, that found it a placement
	// starveFruitless: its last search from its class's starving budget found no victims
	// then (zero: none, or one found some); PreemptConfig.StarvationRetry counts from it.
	starveFruitless time.Time
	pred            predCache // its latest run-time prediction
	// placeIn is what, beside its member, decides where the gang may go (placeInputs),
	// computed at its first cycle: the request does not change it afterwards.
	placeIn    string
	placeInSet bool
}

// placeInputs returns what of the gang's request, beside its member, strategy and
// minimum, its placement search depends on: the GPU models it allows, the machines it is
// pinned to, and whether it needs one NVLink island. A cycle that found no placement for
// one gang skips the gangs whose shape (these, the member and the strategy) is the same;
// a gang pinned to a full machine must not make an unpinned one of its size wait.
func (g *gangState) placeInputs() string {
	if !g.placeInSet {
		var b strings.Builder
		b.WriteString(strings.Join(g.req.GPUModels, "|"))
		b.WriteByte(0)
		b.WriteString(strings.Join(g.req.Machines, "|"))
		if g.req.SameIsland {
			b.WriteString("\x00island")
		}
		g.placeIn, g.placeInSet = b.String(), true
	}
	return g.placeIn
}

// accountWait adds the time since the gang's last look to its latest reason.
func (g *gangState) accountWait(now time.Time) {
	if now.After(g.waitSeen) {
		g.waited[g.wait.Kind] += now.Sub(g.waitSeen)
		g.waitSeen = now
	}
}

type reservation struct {
	gang       string
	start      time.Time
	nodes      map[int]bool
	preemptor  bool
	skipPermit bool // a preemptor whose freed room is not compact takes it anyway
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
	extra         Registry
	prof          *profile
	steps         []step // Config.Actions compiled
	costs         *CostModel
	runtimes      runtimeLearner // run times of completed gangs (Config.Predict)

	c      *cluster
	queues *queueTree
	gangs  map[string]*gangState
	seq    int

	pending  []*gangState            // in arrival order (seq), so that a cycle's heap starts the same whatever the history
	overflow []*gangState            // FIFO beyond MaxPending
	running  []*gangState            // admitted gangs (running or stopping), unordered
	resvs    []*reservation          // this cycle's reservations (backfill, compact)
	now      time.Time               // the current cycle's time
	holds    map[string]*reservation // preemptors' holds, by gang, until placed

	maxIslandGPUs, maxRackGPUs int
	compactOnly                bool // place: accept only placements on the fewest machines
	// viewBuf and heapBuf are the cycle's pending views and heap entries, reused from
	// cycle to cycle (sortPending).
	viewBuf            []QueuedGang
	heapBuf            []heapEntry
	att                *attempt // the gang whose placement is searched, with its plugins
	caps               map[string]*capStats
	maxCPU, maxMem     int64
	totalCPU, totalMem int64     // every node's, for gangs over the whole cluster
	cycles             int       // cycles run
	rate               float64   // placements per second (EWMA), for RetryAfter
	rateSince          time.Time // start of the current rate window
	rateCount          int       // placements in it
}

// New builds a scheduler over a snapshot of the cluster.
func New(cfg Config, snap Snapshot, opts ...Option) (*Scheduler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if len(snap.Nodes) == 0 {
		return nil, fmt.Errorf("gang: snapshot has no nodes: %w", ErrInvalidSnapshot)
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
		holds:   map[string]*reservation{},
		fragOpt: FragOptions{Memory: true},
		costs:   DefaultCostModel(),
	}
	for _, o := range opts {
		o(s)
	}
	if s.costs == nil {
		s.costs = DefaultCostModel()
	}
	if err := s.costs.validate(); err != nil {
		return nil, err
	}
	reg := InTreeRegistry()
	if err := reg.Merge(s.extra); err != nil {
		return nil, err
	}
	if s.prof, err = buildProfile(cfg, reg, s); err != nil {
		return nil, err
	}
	s.steps = cfg.steps()
	s.nodesChanged()
	return s, nil
}

// nodesChanged recomputes what the scheduler derives from its nodes' capacity.
func (s *Scheduler) nodesChanged() {
	s.maxIslandGPUs, s.maxRackGPUs = 0, 0
	for _, n := range s.c.islandGPUs {
		s.maxIslandGPUs = max(s.maxIslandGPUs, n)
	}
	for _, n := range s.c.rackGPUs {
		s.maxRackGPUs = max(s.maxRackGPUs, n)
	}
	s.maxCPU, s.maxMem = 0, 0
	s.buildCapStats()
	s.frag = nil
}

// Pending returns the number of gangs waiting.
func (s *Scheduler) Pending() int { return len(s.pending) }

// SaturatedError refuses a submission past Config.MaxPending. It wraps ErrSaturated.
type SaturatedError struct {
	Pending, Bound int
	// RetryAfter is when the queue is expected to have room: the gangs over the bound
	// divided by the recent placement rate, between 1 s and 10 min (30 s before any
	// rate is known).
	RetryAfter time.Duration
}

func (e *SaturatedError) Error() string {
	return fmt.Sprintf("gang: cluster saturated: %d gangs pending, bound %d; retry in %s", e.Pending, e.Bound, e.RetryAfter)
}

// Unwrap returns ErrSaturated.
func (e *SaturatedError) Unwrap() error { return ErrSaturated }

// retryAfter estimates when excess more gangs will have left the queue.
func (s *Scheduler) retryAfter(excess int) time.Duration {
	if s.rate <= 0 {
		return 30 * time.Second
	}
	d := time.Duration(float64(excess) / s.rate * float64(time.Second))
	return min(max(d, time.Second), 10*time.Minute).Round(time.Second)
}

// notePlacements keeps an exponentially weighted placement rate (per second, over windows
// of at least a minute) for the saturation retry hint.
func (s *Scheduler) notePlacements(n int, now time.Time) {
	if s.rateSince.IsZero() {
		s.rateSince = now
	}
	s.rateCount += n
	if dt := now.Sub(s.rateSince); dt >= time.Minute {
		r := float64(s.rateCount) / dt.Seconds()
		if s.rate == 0 {
			s.rate = r
		} else {
			s.rate = 0.7*s.rate + 0.3*r
		}
		s.rateSince, s.rateCount = now, 0
	}
}

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
// and the numbers (an error wrapping ErrNeverFits). Past Config.MaxPending the request is
// refused with State Saturated and a *SaturatedError (wrapping ErrSaturated) that says
// when to retry; nothing already queued is dropped (evicted gangs always queue again).
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
	reason := s.neverFits(&req)
	if reason == "" {
		reason = s.strategyNeverFits(&req)
	}
	if reason != "" && !s.cfg.Growable {
		err := fmt.Errorf("gang: submit %s: %s: %w", req.ID, reason, ErrNeverFits)
		return SubmitStatus{State: Rejected, Reason: reason}, err
	}
	if len(s.pending) >= s.cfg.MaxPending {
		err := &SaturatedError{Pending: len(s.pending), Bound: s.cfg.MaxPending, RetryAfter: s.retryAfter(len(s.pending) - s.cfg.MaxPending + 1)}
		return SubmitStatus{State: Saturated, Reason: err.Error()}, err
	}
	if req.AllReduceBytes == 0 {
		req.AllReduceBytes = s.cfg.DefaultAllReduceBytes
	}
	s.seq++
	g := &gangState{req: req, q: q, seq: s.seq, submit: now}
	s.gangs[req.ID] = g
	s.learner.observe(req.Member, req.Min)
	s.addPending(g, now)
	return SubmitStatus{State: Queued}, nil
}

func (s *Scheduler) addPending(g *gangState, now time.Time) {
	g.status = stPending
	if g.queued.IsZero() {
		g.queued = g.submit
	}
	g.wait = Waiting{Gang: g.req.ID, Kind: WaitNotReached, Reason: "not tried yet"}
	g.waitSeen = now
	g.fitSince = time.Time{}
	i, _ := slices.BinarySearchFunc(s.pending, g.seq, func(p *gangState, seq int) int { return cmp.Compare(p.seq, seq) })
	s.pending = slices.Insert(s.pending, i, g)
	s.queues.addPending(g.q, 1)
}

func (s *Scheduler) removePending(g *gangState) {
	if i, ok := slices.BinarySearchFunc(s.pending, g.seq, func(p *gangState, seq int) int { return cmp.Compare(p.seq, seq) }); ok && s.pending[i] == g {
		s.pending = slices.Delete(s.pending, i, i+1)
		s.queues.addPending(g.q, -1)
	}
}

// capStats summarises, per GPU model, the static capacity that submission checks use.
type capStats struct {
	maxNode, total, maxIsland int
	mig                       bool
}

func (s *Scheduler) buildCapStats() {
	s.caps = map[string]*capStats{}
	s.maxCPU, s.maxMem, s.totalCPU, s.totalMem = 0, 0, 0, 0
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
		s.totalCPU += n.CPUMilli
		s.totalMem += n.MemMiB
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
		if !ModelAllowed(r.GPUModels, model) {
			continue
		}
		bestNode = max(bestNode, cs.maxNode)
		bestIsland = max(bestIsland, cs.maxIsland)
		total += cs.total
		mig = mig || cs.mig
	}
	of := ""
	if len(r.GPUModels) > 0 {
		of = fmt.Sprintf(" of models %v", r.GPUModels)
	}
	switch {
	case m.CPUMilli > s.maxCPU:
		return fmt.Sprintf("member asks %d milli-CPU, the largest node has %d", m.CPUMilli, s.maxCPU)
	case m.MemMiB > s.maxMem:
		return fmt.Sprintf("member asks %d MiB, the largest node has %d", m.MemMiB, s.maxMem)
	case int64(r.Min)*m.CPUMilli > s.totalCPU:
		return fmt.Sprintf("gang asks %d milli-CPU (%d members × %d), the cluster has %d", int64(r.Min)*m.CPUMilli, r.Min, m.CPUMilli, s.totalCPU)
	case int64(r.Min)*m.MemMiB > s.totalMem:
		return fmt.Sprintf("gang asks %d MiB (%d members × %d), the cluster has %d", int64(r.Min)*m.MemMiB, r.Min, m.MemMiB, s.totalMem)
	case m.MIG != "":
		if !mig {
			return fmt.Sprintf("no MIG-enabled GPU%s can host profile %s", of, m.MIG)
		}
	case m.GPUs > 0 && bestNode == 0:
		return fmt.Sprintf("no GPU%s in the cluster", of)
	case m.GPUs > 0 && m.gpuMilli() == Milli && m.GPUs > bestNode:
		return fmt.Sprintf("member asks %d GPUs on one machine, the largest machine has %d%s", m.GPUs, bestNode, of)
	case m.GPUs > 0 && m.gpuMilli() == Milli && r.Min*m.GPUs > total:
		return fmt.Sprintf("gang asks %d GPUs (%d members × %d), the cluster has %d%s", r.Min*m.GPUs, r.Min, m.GPUs, total, of)
	case r.SameIsland && m.GPUs > 0 && r.Min*m.GPUs > bestIsland:
		return fmt.Sprintf("gang asks %d GPUs (%d members × %d) in one NVLink island, the largest island has %d%s", r.Min*m.GPUs, r.Min, m.GPUs, bestIsland, of)
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
	case stRunning, stTerminating:
		s.unbind(g, now)
	}
	delete(s.gangs, id)
	s.dropReservation(id)
	delete(s.holds, id)
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

// CheckpointMeasured feeds a measured checkpoint of gang id into its eviction cost: the
// time its save took and its size. A gang whose request declared no restore time is taken
// to read the checkpoint back as fast as it wrote it (the same bytes over the same path).
// Zero values leave the figures as they are.
func (s *Scheduler) CheckpointMeasured(id string, save time.Duration, bytes int64) error {
	g, ok := s.gangs[id]
	if !ok {
		return fmt.Errorf("gang: checkpoint measured %s: %w", id, ErrUnknownGang)
	}
	ck := &g.req.Checkpoint
	if save > 0 {
		ck.Save = save
		if ck.Restore == 0 || g.restoreEstimated {
			ck.Restore, g.restoreEstimated = save, true
		}
	}
	if bytes > 0 {
		ck.SizeBytes = bytes
	}
	return nil
}

// Evicted reports that a preempted (or otherwise stopped) gang has stopped: its resources
// are released and it queues again. checkpointed says whether it saved its state as
// asked (a just-in-time checkpoint at the notice, or the periodic one it was let run to);
// otherwise the work since its last checkpoint is lost.
func (s *Scheduler) Evicted(id string, now time.Time, checkpointed bool) error {
	g, ok := s.gangs[id]
	if !ok {
		return fmt.Errorf("gang: evicted %s: %w", id, ErrUnknownGang)
	}
	if g.status != stRunning && g.status != stTerminating {
		return fmt.Errorf("gang: evicted %s while not running: %w", id, ErrUnknownGang)
	}
	switch {
	case checkpointed && !g.keptUntil.IsZero() && !g.keptUntil.After(now):
		g.progress += max(0, g.keptUntil.Sub(g.start))
	case checkpointed:
		g.progress += now.Sub(g.start)
	default:
		g.progress += max(0, s.sinceStartToCheckpoint(g, now))
	}
	g.keptUntil = time.Time{}
	g.evictions++
	g.lastEvict = now
	s.unbind(g, now)
	g.queued = now
	s.addPending(g, now)
	return nil
}

// UpdateLoad records a node's measured load, as the caller measured it (the runtime's
// agents do not report load yet; until they do, every node scores as unloaded).
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
	g.attainedAt = now
	g.shrinkTo, g.shrinkIdx = 0, nil
	g.lastCkpt = time.Time{}
	g.milli, g.cpu, g.mem = 0, 0, 0
	g.gpuModel = ""
	for _, a := range allocs {
		if g.gpuModel == "" && len(a.gpus) > 0 {
			g.gpuModel = s.c.nodes[a.node].GPUs[a.gpus[0]].Model
		}
		g.milli += int64(a.totalMilli())
		g.cpu += a.cpu
		g.mem += a.mem
	}
	s.queues.charge(g.q, g.milli, g.cpu, g.mem, 1)
	g.runIdx = len(s.running)
	s.running = append(s.running, g)
}

func (s *Scheduler) unbind(g *gangState, now time.Time) {
	st := s.c.newStatement()
	for i := len(g.allocs) - 1; i >= 0; i-- {
		st.release(g.allocs[i])
	}
	st.commit()
	s.queues.charge(g.q, g.milli, g.cpu, g.mem, -1)
	s.accountAttained(g, now)
	g.shrinkTo, g.shrinkIdx = 0, nil
	g.allocs = nil
	g.milli, g.cpu, g.mem = 0, 0, 0
	s.dropRunning(g)
}

// Config implements Handle.
func (s *Scheduler) Config() Config { return s.cfg }

// QueueRatio implements Handle.
func (s *Scheduler) QueueRatio(queue string) float64 {
	q, ok := s.queues.byName[queue]
	if !ok {
		return 0
	}
	return q.ratio(s.c)
}

// QueueShare returns a queue's dominant share over its fair share as they stand now (0
// for a queue that holds nothing or is not configured): what a status shows. QueueRatio
// is the scheduling cycle's figure, against the fair shares the last cycle computed, which
// go stale while no cycle runs (a gang adopted by a new leader, moved by a
// reconfiguration).
func (s *Scheduler) QueueShare(queue string) float64 {
	q, ok := s.queues.byName[queue]
	if !ok {
		return 0
	}
	ds := q.dominantShare(s.c)
	fair := s.queues.fairNow(q)
	if ds == 0 || fair <= 0 {
		return 0
	}
	return ds / fair
}

// RunningGangs implements Handle. The gangs come in arrival order (Seq), whatever order
// they were admitted or adopted in.
func (s *Scheduler) RunningGangs(now time.Time) []RunningGang {
	out := make([]RunningGang, 0, len(s.running))
	for _, g := range s.running {
		if g.status != stRunning || g.shrinkTo != 0 {
			continue // stopping, or stopping some members
		}
		out = append(out, s.runningView(g, now))
	}
	slices.SortFunc(out, func(a, b RunningGang) int { return cmp.Compare(a.Seq, b.Seq) })
	return out
}

func (s *Scheduler) runningView(g *gangState, now time.Time) RunningGang {
	r := RunningGang{
		Request: &g.req, ID: g.req.ID, Queue: g.req.Queue, Priority: g.req.Priority, Seq: g.seq,
		Started: g.start, Members: g.members, Min: g.req.Min, Max: g.req.Max, MilliGPU: g.milli,
		NotPreemptible: g.req.NotPreemptible, QueueRatio: g.q.ratio(s.c),
		Evictions: g.evictions, LastEvicted: g.lastEvict, AttainedGPUSeconds: g.attained,
		LastResized: g.lastResize, g: g, s: s,
	}
	if left, ok := s.expectedLeft(g, now); ok {
		r.ExpectedEnd = now.Add(left)
	}
	if now.After(g.attainedAt) {
		r.AttainedGPUSeconds += now.Sub(g.attainedAt).Seconds() * float64(g.milli) / Milli
	}
	return r
}

// attempt is one gang's scheduling attempt: its view, its CycleState, and the Filter and
// Score plugins that apply to it (those not skipped).
type attempt struct {
	g          *QueuedGang
	state      *CycleState
	filters    []FilterPlugin
	scores     []weightedPlugin
	memberwise bool    // a Score plugin asks that members be placed one at a time
	base       []alloc // the gang's running members (a grow)
	cand       Candidate
	rejected   *Status // the latest Filter refusal, for the reason it waits
}

// newAttempt starts an attempt for g with state (nil: a fresh one); base are members it
// holds already (a grow).
func (s *Scheduler) newAttempt(g *QueuedGang, state *CycleState, base []alloc) *attempt {
	if state == nil {
		state = NewCycleState()
	}
	a := &attempt{g: g, state: state, base: base}
	skip := func(p any) bool {
		sp, ok := p.(SkipPlugin)
		return ok && sp.Skip(state, g)
	}
	for _, f := range s.prof.filter {
		if !skip(f) {
			a.filters = append(a.filters, f)
		}
	}
	a.scores = make([]weightedPlugin, 0, len(s.prof.score))
	for _, w := range s.prof.score {
		if skip(w.p) {
			continue
		}
		if mp, ok := w.p.(MemberwisePlugin); ok && mp.Memberwise(state, g) {
			a.memberwise = true
		}
		a.scores = append(a.scores, w)
	}
	return a
}

// fit is the built-in fit test of one member on node n, then the Filter plugins that
// apply to the gang being placed, given the members placed before (placed).
func (s *Scheduler) fit(n int, m Member, models []string, placed []alloc) (alloc, string) {
	a, why := s.c.fitMember(n, m, models)
	if why != "" || s.att == nil || len(s.att.filters) == 0 {
		return a, why
	}
	at := s.att
	at.cand.placed, at.cand.add, at.cand.Input = placed, nil, nil
	if len(at.base) > 0 {
		at.cand.placed = append(at.base[:len(at.base):len(at.base)], placed...)
	}
	for _, p := range at.filters {
		if st := p.Filter(at.state, at.g, &at.cand, n, &s.c.nodes[n]); !st.IsSuccess() {
			st.Plugin = p.Name()
			at.rejected = st
			return alloc{}, "filtered"
		}
	}
	return a, ""
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
// to do (1 when unknown or fresh; from what expectedLeft knows); resource satisfaction is 1 - min(1, dominant share /
// fair share) of its queue (under-served queues first); queue sensitivity is the queue's
// declared sensitivity, or 1 for a latency-sensitive request.
func (s *Scheduler) dynamicPriority(g *gangState, now time.Time) float64 {
	age := s.age(g, now)
	left, ok := s.expectedLeftAt(g, age)
	return s.dynamicPriorityOf(g, age, left, ok, g.q.ratio(s.c))
}

// dynamicPriorityOf is dynamicPriority from g's age, its expected time left (when known)
// and its queue's share ratio.
func (s *Scheduler) dynamicPriorityOf(g *gangState, age, left time.Duration, known bool, ratio float64) float64 {
	rem := 1.0
	if known {
		if total := age + left; total > 0 {
			rem = clamp01(float64(left) / float64(total))
		}
	}
	sat := 1 - min(1, ratio)
	sens := g.q.sens
	if g.req.LatencySensitive {
		sens = 1
	}
	w := s.cfg.Priority
	return w.Alpha*rem + w.Beta*sat + w.Gamma*sens
}

// GangState is where a gang stands.
type GangState int

// Gang states.
const (
	GangPending  GangState = iota + 1 // waiting in its queue
	GangRunning                       // admitted and bound
	GangStopping                      // preempted: asked to checkpoint and stop
)

// String returns the state's name.
func (s GangState) String() string {
	switch s {
	case GangPending:
		return "pending"
	case GangRunning:
		return "running"
	case GangStopping:
		return "stopping"
	}
	return "unknown"
}

// GangStatus is what the scheduler knows about one gang, for status displays and metrics.
type GangStatus struct {
	ID      string
	State   GangState
	Members int // bound members (0 while pending)
	// Waiting is why a pending gang waits: the reason found by the latest cycle.
	Waiting Waiting
	// WaitedByKind sums, over the gang's life, the time it spent waiting for each reason.
	WaitedByKind       map[WaitKind]time.Duration
	Evictions          int
	AttainedGPUSeconds float64
}

// GangStatus returns the status of gang id.
func (s *Scheduler) GangStatus(id string) (GangStatus, error) {
	g, ok := s.gangs[id]
	if !ok {
		return GangStatus{}, fmt.Errorf("gang: status of %s: %w", id, ErrUnknownGang)
	}
	st := GangStatus{ID: id, Members: g.members, Evictions: g.evictions, AttainedGPUSeconds: g.attained, WaitedByKind: map[WaitKind]time.Duration{}}
	switch g.status {
	case stPending:
		st.State, st.Members, st.Waiting = GangPending, 0, g.wait
	case stRunning:
		st.State = GangRunning
	case stTerminating:
		st.State = GangStopping
	}
	for k, d := range g.waited {
		if d > 0 {
			st.WaitedByKind[WaitKind(k)] = d
		}
	}
	return st, nil
}
