package gang

import (
	"time"
)

// The scheduling framework. A cycle runs the extension points of kube-scheduler's
// framework, adapted to gangs:
//
//	QueueSort   orders the pending gangs (one plugin).
//	PreFilter   checks a gang before any placement search (queue quota).
//	Filter      checks one node for one member (the built-in fit test, the reservation
//	            hold, then any registered filters).
//	Score       rates each candidate placement (ScorePlugin, weighted by Config.Weights).
//	Permit      accepts the best placement, or holds the gang with Wait (topology wait).
//	PostFilter  runs when a gang found no placement: preemption and shrinking of elastic
//	            gangs that would admit it.
//	Reserve     holds capacity for a blocked or held gang (backfill reservations).
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
// plugins must treat it as read-only.
type QueuedGang struct {
	Request   *Request
	Seq       int       // arrival order (unique)
	Submitted time.Time // first submission
	Class     int       // priority class raised by aging (Config.AgingStep)
	Dynamic   float64   // α·(remaining/total) + β·(resource satisfaction) + γ·(queue sensitivity)
	// Attained is the GPU-seconds of service the gang received in earlier runs (before
	// evictions or shrinks): least-attained-service policies order by it.
	Attained float64
	// RemainingGPUSeconds is the expected GPU-seconds left at Min members, from
	// Request.Duration; 0 when the duration is unknown.
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
	// ExpectedEnd is when the gang should finish from its declared duration (zero when
	// unknown).
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

// QueueSortPlugin orders pending gangs: Less(a, b) is true when a goes first. It must be a
// strict weak order; the framework breaks ties by arrival.
type QueueSortPlugin interface {
	Plugin
	Less(a, b *QueuedGang) bool
}

// PreFilterPlugin checks a gang before its placement search.
type PreFilterPlugin interface {
	Plugin
	PreFilter(h Handle, g *QueuedGang, now time.Time) *Status
}

// FilterPlugin checks whether one member of g may go on node (index i in the snapshot,
// n its current state). It runs in the placement search's inner loop: keep it cheap.
type FilterPlugin interface {
	Plugin
	Filter(g *QueuedGang, i int, n *Node) *Status
}

// PermitPlugin accepts the chosen placement (nil) or holds the gang (Wait, with a reason).
type PermitPlugin interface {
	Plugin
	Permit(h Handle, g *QueuedGang, best *ScoreInput, now time.Time) *Status
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

// PostFilterPlugin runs for a gang that found no placement. It returns nil when it cannot
// or will not help (nothing is evicted then).
type PostFilterPlugin interface {
	Plugin
	PostFilter(h Handle, g *QueuedGang, now time.Time) *PostFilterResult
}

// ReservePlugin holds capacity for a gang that waits: a blocked gang (compact false) or a
// gang a Permit plugin holds for a compact placement (compact true). It returns the
// reservation or nil.
type ReservePlugin interface {
	Plugin
	Reserve(h Handle, g *QueuedGang, compact bool, now time.Time) *Reservation
}

// Handle is what plugins may use of the scheduler. Scheduler implements it.
type Handle interface {
	// Config returns the scheduler's configuration.
	Config() Config
	// RunningGangs returns the admitted gangs that are not already being stopped, in a
	// deterministic order (admission order, with removals filled from the end).
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
