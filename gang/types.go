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
	Interval  time.Duration // time between checkpoints; 0 = none (all progress is lost)
	SizeBytes int64         // bytes of one checkpoint
	Save      time.Duration // time to write one checkpoint, including the CUDA state
	Restore   time.Duration // time to read it back
	// CUDATeardown and CUDACreate are the costs of destroying and re-creating the CUDA
	// context of each member (measured on real devices, declared in specs otherwise).
	CUDATeardown time.Duration
	CUDACreate   time.Duration
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
	// larger than the largest island).
	SameIsland bool
	// Duration is the expected run time when known (0 = unknown). Backfill and reservations use it.
	Duration time.Duration
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
	case m.GPUs < 0 || m.CPUMilli < 0 || m.MemMiB < 0 || m.GPUMilli < 0 || m.GPUMilli > Milli:
		return fmt.Errorf("gang: request %s member %+v has negative or out-of-range resources: %w", r.ID, m, ErrInvalidRequest)
	case m.GPUMilli > 0 && m.GPUMilli < Milli && m.GPUs != 1:
		return fmt.Errorf("gang: request %s asks a %d-milli share of %d cards (shares are of one card): %w", r.ID, m.GPUMilli, m.GPUs, ErrInvalidRequest)
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
	// QueuedSaturated: accepted, but the pending bound is passed; the gang waits in an
	// overflow queue the cycle does not scan until pending work drains below the bound.
	QueuedSaturated
	// Rejected: the request can never fit, or is invalid; Reason says why.
	Rejected
)

// String returns the state's name.
func (s SubmitState) String() string {
	switch s {
	case Queued:
		return "queued"
	case QueuedSaturated:
		return "queued, cluster saturated"
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

// Preemption asks a victim gang to checkpoint and stop before Deadline.
type Preemption struct {
	Victim   string
	For      string // the gang it makes room for
	Deadline time.Time
	// Cost is the GPU-seconds the eviction costs: work since the last checkpoint, checkpoint
	// save and restore, CUDA context teardown and re-creation, times the victim's GPUs.
	Cost   float64
	Reason string // "priority" or "fair-share reclaim"
}

// Reservation holds capacity for a blocked gang from Start on (Slurm-style backfill).
type Reservation struct {
	Gang  string
	Start time.Time
	Nodes []int
}

// Waiting explains why a pending gang was not placed in a cycle.
type Waiting struct {
	Gang   string
	Reason string
}

// Decisions is what one cycle decided. The caller carries them out: bind placements, ask
// victims to checkpoint and stop (then report Evicted).
type Decisions struct {
	Now         time.Time
	Placements  []Placement
	Preemptions []Preemption
	Reservation *Reservation
	Waiting     []Waiting
	Attempts    int // gangs considered
}
