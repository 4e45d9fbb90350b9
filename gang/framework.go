package gang

import (
	"time"
)

// The scheduling framework. A cycle takes the pending gangs in QueueSort order and runs
// each through the configured actions (Config.Actions, Volcano's actions; see actions.go),
// which call the extension points of kube-scheduler's framework, adapted to gangs:
//
//	QueueSort   orders the pending gangs (one plugin).
//	PreFilter   checks a gang before any placement search (queue quota). Action enqueue.
//	Filter      checks one node for the next member of a candidate placement (after the
//	            built-in fit test and the reservation holds). Action allocate.
//	Score       rates each candidate placement (weighted by Config.Weights and
//	            Plugins.Score). Action allocate.
//	Permit      accepts the best placement, or holds the gang with Wait (topology wait).
//	            Action allocate.
//	PostFilter  runs when a gang found no placement: preemption and shrinking of elastic
//	            gangs that would admit it. Actions preempt and reclaim.
//	Reserve     holds capacity for a blocked or held gang (backfill reservations). Action
//	            backfill.
//
// Each gang's attempt gets a fresh CycleState, which every plugin called for it receives:
// what one writes (PreFilter, say), later ones read (Filter, Score, PostFilter...).
//
// Plugins implement Plugin plus the interface of each extension point they serve, and are
// built by name from a Registry (see registry.go); Config.Plugins lists them per point.
// Every plugin is called from the one goroutine that runs Cycle; plugins must not keep
// the pointers they are given beyond the call.

// Code is the outcome of a plugin call. Success (a nil *Status) lets the gang go on;
// Unschedulable means "does not fit now" and the gang waits; Wait means "fits, but not
// yet" (a Permit hold); Error means the plugin broke, and the gang waits with the error
// as its reason. Rejected is not failed: only Error is a fault.
type Code int

// Status codes.
const (
	Success Code = iota
	Unschedulable
	Wait
	Error
)

// WaitKind classifies why a pending gang was not placed in a cycle.
type WaitKind int

// Kinds of waiting.
const (
	// WaitCapacity: fewer free GPUs (or CPU, memory) in the cluster than the gang needs.
	WaitCapacity WaitKind = iota + 1
	// WaitFragmented: enough free in total, but no set of nodes fits the gang's members
	// (per-machine card counts, GPU models, CPU or memory on the nodes with free cards).
	WaitFragmented
	// WaitQuota: the gang's queue is at its quota.
	WaitQuota
	// WaitTopology: a placement exists but crosses more machines than the gang must; it
	// waits (Config.TopologyWait) for a compact one.
	WaitTopology
	// WaitReserved: capacity the gang could use is held for another gang's reservation.
	WaitReserved
	// WaitPreempting: victims are stopping to make room for it.
	WaitPreempting
	// WaitNotReached: the cycle's bounds (MaxGangsPerCycle, MaxScanFactor) ended the cycle
	// before the gang was tried.
	WaitNotReached

	numWaitKinds = iota + 1
)

// String returns the kind's name, as reported in metrics.
func (k WaitKind) String() string {
	switch k {
	case WaitCapacity:
		return "capacity"
	case WaitFragmented:
		return "fragmented"
	case WaitQuota:
		return "quota"
	case WaitTopology:
		return "topology"
	case WaitReserved:
		return "reserved"
	case WaitPreempting:
		return "preempting"
	case WaitNotReached:
		return "not-reached"
	}
	return "unknown"
}

// Status is a plugin's verdict; a nil *Status is Success.
type Status struct {
	Code   Code
	Kind   WaitKind // why the gang waits (Unschedulable, Wait)
	Reason string   // specific: which resource, which constraint, the numbers
	Plugin string   // set by the framework
	// RetryAt, for Wait, is when the hold ends; the framework asks for a cycle then.
	RetryAt time.Time
}

// NewStatus returns a status with a reason.
func NewStatus(code Code, kind WaitKind, reason string) *Status {
	return &Status{Code: code, Kind: kind, Reason: reason}
}

// IsSuccess reports whether s is nil or Success.
func (s *Status) IsSuccess() bool { return s == nil || s.Code == Success }

// Plugin is the base of every plugin.
type Plugin interface {
	Name() string
}

// QueuedGang is what plugins see of a pending gang. The framework fills it once per cycle;
// plugins must treat it as read-only, and keep no pointer to it past the cycle: the next
// cycle reuses its memory for another gang's view.
type QueuedGang struct {
	Request   *Request
	Seq       int       // arrival order (unique)
	Submitted time.Time // first submission
	Class     int       // priority class raised by aging (Config.AgingStep)
	Dynamic   float64   // α·(remaining/total) + β·(resource satisfaction) + γ·(queue sensitivity)
	// Attained is the GPU-seconds of service the gang received in earlier runs (before
	// evictions or shrinks): least-attained-service policies order by it.
	Attained float64
	// RemainingGPUSeconds is the expected GPU-seconds left at Min members: from
	// Request.Duration, else the run-time predictor or Request.TimeLimit (runtimes.go);
	// 0 when nothing tells.
	RemainingGPUSeconds float64
	// Waited is how long the gang has waited since it last queued (submission, eviction).
	Waited time.Duration
	// FitSince is when, since it last queued, a placement search first found room for it
	// (zero until then): the time it has waited with a placement at hand.
	FitSince time.Time
	// Evictions counts how often the gang was preempted.
	Evictions int
	// UnderShare says its queue holds less than its fair share (DRF): within a priority
	// class such gangs are taken first, whatever the QueueSort.
	UnderShare bool

	g *gangState
	// sortKey is the QueueSort's key of the gang for this cycle when the QueueSort orders
	// by a key (keyedSort), computed once when the cycle views the pending gangs: the
	// heap compares gangs many times each (a cycle with 10,000 pending spent 70% of its
	// time recomputing keys).
	sortKey float64
	keyed   bool
}

// RunningGang is what plugins see of an admitted gang that is neither stopping nor
// shrinking.
type RunningGang struct {
	Request        *Request // read-only
	ID             string
	Queue          string
	Priority       int
	Seq            int
	Started        time.Time
	Members        int // current members
	Min, Max       int
	MilliGPU       int64 // GPUs held, in milli-GPU
	NotPreemptible bool
	// ExpectedEnd is when the gang is expected to finish: from its declared Duration,
	// else the run-time predictor at its age or its TimeLimit (runtimes.go); zero when
	// nothing tells.
	ExpectedEnd time.Time
	// QueueRatio is its queue's dominant share over its fair share (> 1: borrowing).
	QueueRatio float64
	// Evictions counts earlier preemptions; LastEvicted is the latest (zero when none).
	Evictions   int
	LastEvicted time.Time
	// LastResized is when it last grew or was asked to shrink (zero when never).
	LastResized time.Time
	// AttainedGPUSeconds is the GPU-seconds of service received so far, this run included.
	AttainedGPUSeconds float64

	g *gangState
	s *Scheduler
}

// MemberPlacements returns where r's members are, in member order.
func (r *RunningGang) MemberPlacements() []MemberPlacement {
	out := make([]MemberPlacement, len(r.g.allocs))
	for i, a := range r.g.allocs {
		out[i] = r.s.memberPlacement(r.g, a)
	}
	return out
}

// StateKey names an entry of a CycleState. Plugins prefix their keys with their name.
type StateKey string

// CycleState is the scratch space of one gang's scheduling attempt in a cycle
// (kube-scheduler's CycleState): created empty for each attempt and handed to every
// plugin called for it, so that what one extension point computes (PreFilter, say) later
// ones (Filter, Score, Permit, PostFilter, Reserve) read instead of computing again. It
// is not safe for concurrent use; values are the writer's to define and must be treated
// as read-only by others. A nil *CycleState reads as empty.
type CycleState struct {
	m map[StateKey]any
}

// NewCycleState returns an empty state.
func NewCycleState() *CycleState { return &CycleState{} }

// Write stores v under k, replacing what was there.
func (s *CycleState) Write(k StateKey, v any) {
	if s.m == nil {
		s.m = map[StateKey]any{}
	}
	s.m[k] = v
}

// Read returns what is stored under k.
func (s *CycleState) Read(k StateKey) (any, bool) {
	if s == nil {
		return nil, false
	}
	v, ok := s.m[k]
	return v, ok
}

// Delete removes k.
func (s *CycleState) Delete(k StateKey) {
	if s != nil {
		delete(s.m, k)
	}
}

// ReadState returns the value of type T stored under k; false when there is none or it
// has another type.
func ReadState[T any](s *CycleState, k StateKey) (T, bool) {
	v, ok := s.Read(k)
	t, isT := v.(T)
	return t, ok && isT
}

// Candidate is a placement of a gang's members as plugins see it: the members placed
// before it (the gang's running members when it grows; while a placement is being built,
// the members already in it) and the members it adds. Filter sees a candidate that adds
// nothing yet (the node in question is for the next member); Score and Permit see one
// that adds its members, with Input measured over them. Members are counted in order:
// those placed before first.
type Candidate struct {
	placed []alloc
	add    []alloc
	// Input is what the scheduler measured about the added members; nil in Filter.
	Input *ScoreInput
}

// Members returns the number of members, placed before and added.
func (c *Candidate) Members() int { return len(c.placed) + len(c.add) }

// Added returns the number of members the candidate adds (0 in Filter).
func (c *Candidate) Added() int { return len(c.add) }

// Node returns the node (snapshot index) of member k, 0 <= k < Members().
func (c *Candidate) Node(k int) int {
	if k < len(c.placed) {
		return c.placed[k].node
	}
	return c.add[k-len(c.placed)].node
}

// On returns the number of members on node.
func (c *Candidate) On(node int) int {
	n := 0
	for _, a := range c.placed {
		if a.node == node {
			n++
		}
	}
	for _, a := range c.add {
		if a.node == node {
			n++
		}
	}
	return n
}

// Machines returns the number of distinct nodes the members are on.
func (c *Candidate) Machines() int {
	n := 0
	for k := range c.Members() {
		node, first := c.Node(k), true
		for j := range k {
			if c.Node(j) == node {
				first = false
				break
			}
		}
		if first {
			n++
		}
	}
	return n
}

// QueueSortPlugin orders pending gangs: Less(a, b) is true when a goes first. It must be a
// strict weak order; the framework breaks ties by arrival.
type QueueSortPlugin interface {
	Plugin
	Less(a, b *QueuedGang) bool
}

// PreFilterPlugin checks a gang before its placement search (action enqueue).
type PreFilterPlugin interface {
	Plugin
	PreFilter(h Handle, state *CycleState, g *QueuedGang, now time.Time) *Status
}

// FilterPlugin checks whether the next member of g may go on node (index node in the
// snapshot, n its current state, which has room for the member) given the members the
// candidate placement c holds already. It runs in the placement search's inner loop, for
// every placement search of g (allocate, and the trials of preemption and reservations):
// keep it cheap.
type FilterPlugin interface {
	Plugin
	Filter(state *CycleState, g *QueuedGang, c *Candidate, node int, n *Node) *Status
}

// ScorePlugin scores a candidate placement of g for one concern. Score must be pure and
// return a value in [0, 1], higher meaning better.
type ScorePlugin interface {
	Plugin
	Score(state *CycleState, g *QueuedGang, c *Candidate) float64
}

// SkipPlugin is an optional interface of Filter and Score plugins (the Skip status of
// kube-scheduler's PreFilter and PreScore): Skip, asked once per attempt, reports that
// the plugin has nothing to say about g; its Filter is then not called for g, and its
// Score neither counted nor reported in g's placement.
type SkipPlugin interface {
	Skip(state *CycleState, g *QueuedGang) bool
}

// MemberwisePlugin is an optional interface of Score plugins that rate where each member
// goes relative to the gang's other members (spread). When Memberwise is true for g (and
// the plugin is not skipped), g's members are placed one at a time, each on the
// best-scored of up to Config.MaxCandidates nodes given the members before it (as GPU
// shares always are), instead of as whole placements proposed by topology domain.
type MemberwisePlugin interface {
	ScorePlugin
	Memberwise(state *CycleState, g *QueuedGang) bool
}

// PermitPlugin accepts the chosen placement (nil) or holds the gang (Wait, with a reason).
type PermitPlugin interface {
	Plugin
	Permit(h Handle, state *CycleState, g *QueuedGang, best *Candidate, now time.Time) *Status
}

// Victims says which running gangs a PostFilter search may stop or shrink: the preempt
// action asks for Priority, the reclaim action for Reclaim, both when they are adjacent
// in Config.Actions (one search then weighs every kind of victim together).
type Victims struct {
	// Priority: gangs that rank after the preemptor (a lower priority class; for the
	// size-based baselines, later in their order).
	Priority bool
	// Reclaim: gangs of queues over their fair share, for a gang whose queue is under its
	// own (Config.FairShareReclaim).
	Reclaim bool
}

// PostFilterResult is what a PostFilter plugin proposes to admit a blocked gang: victims to
// evict and elastic gangs to shrink. The framework marks them as stopping and holds Nodes
// for the gang.
type PostFilterResult struct {
	Preemptions []Preemption
	Resizes     []Resize // shrinks
	// Nodes are the nodes the preemptor will use once the victims stopped; the framework
	// holds them for it.
	Nodes []int
	// ReadyAt is when the freed capacity is expected (the latest victim deadline).
	ReadyAt time.Time
	// RetryAt, with no preemptions, is when the plugin expects an eviction to become
	// worthwhile; the framework asks for a cycle then (Decisions.NextCycle).
	RetryAt time.Time
	// SkipPermit lets the gang take the freed capacity without Permit (the topology wait):
	// set when the room made for it is not compact.
	SkipPermit bool
}

// PostFilterPlugin runs for a gang that found no placement (actions preempt and reclaim),
// taking only the victims may allows. It returns nil when it cannot or will not help
// (nothing is evicted then).
type PostFilterPlugin interface {
	Plugin
	PostFilter(h Handle, state *CycleState, g *QueuedGang, may Victims, now time.Time) *PostFilterResult
}

// ReservePlugin holds capacity for a gang that waits (action backfill): a blocked gang
// (compact false) or a gang a Permit plugin holds for a compact placement (compact true).
// It returns the reservation or nil.
type ReservePlugin interface {
	Plugin
	Reserve(h Handle, state *CycleState, g *QueuedGang, compact bool, now time.Time) *Reservation
}

// Handle is what plugins may use of the scheduler. Scheduler implements it.
type Handle interface {
	// Config returns the scheduler's configuration.
	Config() Config
	// RunningGangs returns the admitted gangs that are not already being stopped, in
	// arrival order (Seq): the same whatever order they were admitted, adopted or
	// restored in.
	RunningGangs(now time.Time) []RunningGang
	// NewTrial starts a tentative change of the cluster; it must be discarded.
	NewTrial() *Trial
	// QueueRatio returns a queue's dominant share over its fair share now (< 1: under its
	// share; > 1: borrowing).
	QueueRatio(queue string) float64
	// EvictionCost returns what stopping r at now costs, and when it will have stopped.
	EvictionCost(r *RunningGang, now time.Time) EvictionCost
	// ShrinkCost returns what shrinking r to `to` members at now costs.
	ShrinkCost(r *RunningGang, to int, now time.Time) EvictionCost
}
