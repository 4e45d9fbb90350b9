package gang

import (
	"errors"
	"fmt"
	"time"
)

// Sentinel errors. Errors returned by this package wrap one of these; check with errors.Is.
var (
	// ErrNeverFits reports a request that no state of the cluster could ever admit (more GPUs on
	// one machine than any machine has, a MIG profile no GPU supports, ...). It is returned at
	// submission so that the request is not left pending forever.
	ErrNeverFits = errors.New("gang: request can never fit this cluster")
	// ErrInvalidRequest reports a malformed request (negative sizes, min > max, ...).
	ErrInvalidRequest = errors.New("gang: invalid request")
	// ErrDuplicate reports a request whose ID is already known to the scheduler.
	ErrDuplicate = errors.New("gang: duplicate gang id")
	// ErrUnknownGang reports an event about a gang the scheduler does not know.
	ErrUnknownGang = errors.New("gang: unknown gang")
	// ErrInvalidSnapshot reports a cluster snapshot that cannot be scheduled on.
	ErrInvalidSnapshot = errors.New("gang: invalid snapshot")
	// ErrInvalidConfig reports a configuration rejected by Config.Validate.
	ErrInvalidConfig = errors.New("gang: invalid config")
	// ErrUnknownQueue reports a request naming a queue that is not configured.
	ErrUnknownQueue = errors.New("gang: unknown queue")
	// ErrSaturated reports a submission refused because Config.MaxPending gangs are
	// pending; the *SaturatedError wrapping it says when to retry.
	ErrSaturated = errors.New("gang: cluster saturated")
	// ErrNoShrink reports ResizeDone for a gang with no shrink pending.
	ErrNoShrink = errors.New("gang: no shrink pending")
	// ErrDuplicatePlugin reports a plugin name registered twice.
	ErrDuplicatePlugin = errors.New("gang: duplicate plugin name")
	// ErrUnknownPlugin reports a plugin name that no registry entry provides.
	ErrUnknownPlugin = errors.New("gang: unknown plugin")
)

// Milli is one whole GPU in milli-GPU units.
const Milli = 1000

// MIGSlicesPerGPU is the number of compute slices of a MIG-capable GPU (A100, H100, H200).
const MIGSlicesPerGPU = 7

// MIGSlices returns the number of compute slices a MIG profile name ("1g.10gb", "3g.40gb",
// "7g.80gb", ...) occupies, and false when the name is not a MIG profile.
func MIGSlices(profile string) (int, bool) {
	if len(profile) < 3 || profile[1] != 'g' || profile[2] != '.' {
		return 0, false
	}
	switch profile[0] {
	case '1':
		return 1, true
	case '2':
		return 2, true
	case '3':
		return 3, true
	case '4':
		return 4, true
	case '7':
		return 7, true
	}
	return 0, false
}

// Member is what one member of a gang asks for. Exactly one GPU form applies:
//   - MIG != "": one MIG slice group of that profile on a MIG-enabled GPU;
//   - GPUs == 1 and GPUMilli in (0, 1000): a share of one card (the openb gpu_milli);
//   - GPUs >= 1 and GPUMilli == 1000 (or 0, read as 1000): that many whole cards on one machine;
//   - GPUs == 0: no GPU (CPU-only member).
type Member struct {
	GPUs     int    // whole cards on one machine, or 1 for a share / MIG slice
	GPUMilli int    // milli-GPU per card; 1000 = whole card
	MIG      string // MIG profile, e.g. "1g.10gb"; empty when not MIG
	CPUMilli int64  // CPU in milli-cores
	MemMiB   int64  // host memory in MiB
}

// gpuMilli returns the per-card milli-GPU of the member (1000 for whole cards).
func (m Member) gpuMilli() int {
	if m.GPUs == 0 {
		return 0
	}
	if m.GPUMilli <= 0 || m.GPUMilli > Milli {
		return Milli
	}
	return m.GPUMilli
}

// wholeGPUs returns the number of whole cards the member needs (0 for shares, MIG, CPU-only).
func (m Member) wholeGPUs() int {
	if m.MIG != "" || m.gpuMilli() < Milli {
		return 0
	}
	return m.GPUs
}

// describe names the member's request, e.g. "8 GPUs", "0.5 GPU", "MIG 3g.40gb", "CPU only".
func (m Member) describe() string {
	switch {
	case m.MIG != "":
		return "MIG " + m.MIG
	case m.GPUs == 0:
		return "CPU only"
	case m.gpuMilli() < Milli:
		return fmt.Sprintf("%s GPU", gpus(int64(m.GPUMilli)))
	case m.GPUs == 1:
		return "1 GPU"
	}
	return fmt.Sprintf("%d GPUs", m.GPUs)
}

// TotalMilli is the member's GPU demand in milli-GPU (a MIG slice group counts slices/7).
func (m Member) TotalMilli() int {
	if m.MIG != "" {
		s, _ := MIGSlices(m.MIG)
		return s * Milli / MIGSlicesPerGPU
	}
	return m.GPUs * m.gpuMilli()
}

// Checkpoint holds the facts preemption needs about a gang's checkpoints.
type Checkpoint struct {
	Interval  time.Duration // time between periodic checkpoints; 0 = none
	SizeBytes int64         // bytes of one checkpoint
	Save      time.Duration // time to write one checkpoint, including the CUDA state
	Restore   time.Duration // time to read it back
	// JustInTime says the gang saves a checkpoint of its current step when asked to stop
	// (the SDK's Checkpointer): an eviction then loses no work but costs Save. Otherwise
	// only its periodic checkpoints survive, and the work since the last one is lost.
	JustInTime bool
	// CUDATeardown and CUDACreate, when set, are the measured or declared costs of
	// destroying and re-creating the CUDA context of each member; unset, the scheduler's
	// CostModel estimates them.
	CUDATeardown time.Duration
	CUDACreate   time.Duration
}

// Strategy spreads or packs a gang's members over machines (Ray's placement group
// strategies). The in-tree plugins of the same names carry them out: a gang without one
// (or with StrategyPack) gets the topology-aware placement on as few machines, NVLink
// islands and racks as it can.
type Strategy string

// Placement strategies.
const (
	// StrategyPack is the default placement, on as few machines as can be.
	StrategyPack Strategy = "pack"
	// StrategySpread prefers a different machine for every member (the "spread" Score
	// plugin), more than one member per machine only when the candidates leave no other
	// choice.
	StrategySpread Strategy = "spread"
	// StrategyStrictPack puts every member on one machine, or the gang waits (the
	// "strict-pack" Filter plugin).
	StrategyStrictPack Strategy = "strict-pack"
	// StrategyStrictSpread puts every member on a different machine, or the gang waits
	// (the "strict-spread" Filter plugin).
	StrategyStrictSpread Strategy = "strict-spread"
)

func (s Strategy) valid() bool {
	switch s {
	case "", StrategyPack, StrategySpread, StrategyStrictPack, StrategyStrictSpread:
		return true
	}
	return false
}

// Request is a gang submission: Min..Max identical members admitted all-or-nothing.
type Request struct {
	ID        string
	Queue     string // leaf queue path, e.g. "research/vision"; "" = Config.DefaultQueue
	Priority  int    // larger is more important; classes are arbitrary integers
	Min, Max  int    // members; Max == 0 means Max = Min
	Member    Member
	GPUModels []string // allowed GPU models (gpu_spec); empty = any
	// SameIsland requires all members in one NVLink island (rejected at submission when
	// larger than the largest island): a placement across islands is refused and the gang
	// waits. Placements are proposed as the strategy makes them, so with StrategySpread
	// only an island that spans machines (an NVL72 rack) can hold it.
	SameIsland bool
	// Strategy spreads or packs the members over machines; empty: StrategyPack.
	Strategy Strategy
	// Machines, when set, pins the members to these nodes (by Node.Name): the "machines"
	// Filter refuses every other node, and a gang pinned to no node of the cluster can never
	// fit. Ray's hard node affinity.
	Machines []string
	// Duration is the expected run time when known (0 = unknown), taken as exact: the
	// queue order, Smith's rule, shadow times and backfill use it (runtimes.go).
	Duration time.Duration
	// TimeLimit is an upper bound on the run time that the user declares (Slurm's
	// --time; 0 = none): backfill relies on it, and the run-time predictor caps its
	// predictions by it and learns per limit (runtimes.go). The scheduler does not stop a
	// gang that runs past it.
	TimeLimit time.Duration
	// AllReduceBytes is the size of one gradient AllReduce, used to model collective time.
	AllReduceBytes int64
	Checkpoint     Checkpoint
	// NotPreemptible protects the gang from eviction.
	NotPreemptible bool
	// LatencySensitive marks interactive or latency-critical work (the γ term of the priority).
	LatencySensitive bool
}

func (r *Request) normalize(defQueue string) error {
	if r.ID == "" {
		return fmt.Errorf("gang: request with empty id: %w", ErrInvalidRequest)
	}
	if r.Queue == "" {
		r.Queue = defQueue
	}
	if r.Max == 0 {
		r.Max = r.Min
	}
	m := r.Member
	switch {
	case r.Min <= 0:
		return fmt.Errorf("gang: request %s min members %d: %w", r.ID, r.Min, ErrInvalidRequest)
	case r.Max < r.Min:
		return fmt.Errorf("gang: request %s max %d < min %d: %w", r.ID, r.Max, r.Min, ErrInvalidRequest)
	case r.Duration < 0 || r.TimeLimit < 0:
		return fmt.Errorf("gang: request %s duration %s or time limit %s is negative: %w", r.ID, r.Duration, r.TimeLimit, ErrInvalidRequest)
	case m.GPUs < 0 || m.CPUMilli < 0 || m.MemMiB < 0 || m.GPUMilli < 0 || m.GPUMilli > Milli:
		return fmt.Errorf("gang: request %s member %+v has negative or out-of-range resources: %w", r.ID, m, ErrInvalidRequest)
	case m.GPUMilli > 0 && m.GPUMilli < Milli && m.GPUs != 1:
		return fmt.Errorf("gang: request %s asks a %d-milli share of %d cards (shares are of one card): %w", r.ID, m.GPUMilli, m.GPUs, ErrInvalidRequest)
	case !r.Strategy.valid():
		return fmt.Errorf("gang: request %s strategy %q: want %q, %q, %q, %q or none: %w", r.ID, r.Strategy,
			StrategyPack, StrategySpread, StrategyStrictPack, StrategyStrictSpread, ErrInvalidRequest)
	case m.MIG != "":
		if _, ok := MIGSlices(m.MIG); !ok {
			return fmt.Errorf("gang: request %s MIG profile %q unknown: %w", r.ID, m.MIG, ErrInvalidRequest)
		}
		if m.GPUs > 1 {
			return fmt.Errorf("gang: request %s MIG profile on %d cards: %w", r.ID, m.GPUs, ErrInvalidRequest)
		}
		r.Member.GPUs = 1
	}
	if r.Member.GPUs > 0 && r.Member.GPUMilli == 0 {
		r.Member.GPUMilli = Milli
	}
	return nil
}

// Load is the measured use of a node, each in [0, 1].
type Load struct {
	CPU, GPU, Mem, Net float64
}

// GPU is one card in a snapshot.
type GPU struct {
	Model  string
	Island int // global NVLink island id (GPUs sharing an NVLink/NVSwitch fabric)
	// FreeMilli is the unallocated share of the card (1000 = idle). Ignored for MIG GPUs.
	FreeMilli int
	// MIG is true when the card is partitioned into MIG slices; it then serves only MIG requests.
	MIG bool
	// FreeSlices is the number of free MIG compute slices (of MIGSlicesPerGPU) when MIG is true.
	FreeSlices int
}

// Node is one machine in a snapshot.
type Node struct {
	Name     string
	Rack     int
	CPUMilli int64 // capacity
	MemMiB   int64 // capacity
	FreeCPU  int64 // unallocated CPU (milli)
	FreeMem  int64 // unallocated memory (MiB)
	GPUs     []GPU
	Load     Load
	// Unschedulable cordons the node (draining, failed health check).
	Unschedulable bool
}

// Snapshot is the cluster as the scheduler sees it when it starts. Later changes arrive as
// events (Finish, Evicted, UpdateLoad).
type Snapshot struct {
	Nodes []Node
}

// GPURef locates one GPU of a placement for the collective cost model.
type GPURef struct {
	Node, GPU    int // node index in the snapshot, card index on the node
	Island, Rack int
	Model        string
}

// CollectiveModel estimates the time of one AllReduce of bytes over the given GPUs. It is
// declared here, by its consumer; the topology package's bandwidth model is adapted to it in
// gang/sim, and TieredModel is the in-package default. Implementations must be pure and
// cheap: they are called for every candidate placement.
type CollectiveModel interface {
	AllReduceTime(gpus []GPURef, bytes int64) time.Duration
}

// SubmitState says what happened to a submission.
type SubmitState int

// Submission states.
const (
	// Queued: accepted and pending.
	Queued SubmitState = iota + 1
	// Saturated: refused for now, the pending bound (Config.MaxPending) is reached; retry
	// after the SaturatedError's RetryAfter.
	Saturated
	// Rejected: the request can never fit, or is invalid; Reason says why.
	Rejected
)

// String returns the state's name.
func (s SubmitState) String() string {
	switch s {
	case Queued:
		return "queued"
	case Saturated:
		return "cluster saturated"
	case Rejected:
		return "rejected"
	}
	return "unknown"
}

// SubmitStatus is the answer to Submit.
type SubmitStatus struct {
	State  SubmitState
	Reason string
}

// MemberPlacement is where one member was bound.
type MemberPlacement struct {
	Node     int
	NodeName string
	GPUs     []int // card indices on the node
	Milli    int   // milli-GPU per card (1000 = whole)
	MIG      string
	CPUMilli int64
	MemMiB   int64
}

// PluginScore is one plugin's contribution to a placement's score.
type PluginScore struct {
	Plugin string
	Score  float64 // in [0, 1], higher is better
	Weight float64
}

// Placement is a gang admitted in a cycle: bind all members, or none.
type Placement struct {
	Gang      string
	Members   []MemberPlacement
	Scores    []PluginScore
	Total     float64 // weighted sum of Scores
	Islands   int     // NVLink islands crossed
	Machines  int
	Racks     int
	AllReduce time.Duration // modeled AllReduce time of AllReduceBytes over the placement
	Backfill  bool          // placed into capacity held for a reserved gang
	Preemptor bool          // placed into capacity freed by preemption
}

// Preemption asks a victim gang to stop by Deadline: a gang that checkpoints on notice
// saves first; one that does not stops after its next periodic checkpoint when that comes
// before the deadline, at once otherwise.
type Preemption struct {
	Victim   string
	For      string // the gang it makes room for
	Deadline time.Time
	// Cost is the GPU-seconds the eviction costs (Costs.GPUSeconds): lost work or the
	// just-in-time save, restore, CUDA context teardown and re-creation, communicator
	// set-up, times the victim's GPUs.
	Cost   float64
	Costs  EvictionCost
	Reason string // "priority", "fair-share reclaim", "remaining" or "starvation" (PreemptConfig)
}

// Resize changes the size of a running elastic gang (Request.Min..Max). A grow is bound
// at once: start the Add members and re-form the gang's collective with the new world size.
// A shrink is the caller's to carry out: stop the Remove members before Deadline (the
// survivors keep their processes and CUDA contexts and re-form the collective), then call
// ResizeDone; their capacity is held until then.
type Resize struct {
	Gang     string
	From, To int
	Add      []MemberPlacement // grow: where the new members go
	Remove   []MemberPlacement // shrink: the members to stop, as they were placed
	// RemoveIndex are the Remove members' positions in the gang's member list (in the
	// order of its placement, then of earlier grows).
	RemoveIndex []int
	For         string    // shrink: the gang it makes room for
	Deadline    time.Time // shrink: when the removed members must have stopped
	// Cost is the pause: the communicator set-up for the new size (Cost.Communicator),
	// on every GPU of the gang.
	Cost   EvictionCost
	Cause  string // shrink: "priority" or "fair-share reclaim"
	Reason string
}

// Reservation holds capacity for a gang from Start on: the backfill reservation of the
// first blocked gang (Slurm-style), or a preemptor's hold on the nodes its victims free.
type Reservation struct {
	Gang      string
	Start     time.Time
	Nodes     []int
	Preemptor bool
}

// Waiting explains why a pending gang was not placed in a cycle.
type Waiting struct {
	Gang   string
	Kind   WaitKind
	Reason string // specific: which resource or constraint, with the numbers
}

// Decisions is what one cycle decided. The caller carries them out: bind placements, ask
// victims to checkpoint and stop (then report Evicted).
type Decisions struct {
	Now         time.Time
	Placements  []Placement
	Preemptions []Preemption
	// Resizes are grows of running elastic gangs and shrinks made for blocked gangs.
	Resizes []Resize
	// Reservations are the capacity held now: preemptors' holds, then the backfill one.
	Reservations []Reservation
	Waiting      []Waiting
	Attempts     int // gangs considered
	// NextCycle, when not zero, is when the scheduler wants a cycle even if no event comes
	// first: a preemption becomes worthwhile, a topology wait ends.
	NextCycle time.Time
}
