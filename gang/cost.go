package gang

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"time"
)

// CostKind is one term of what stopping and restarting a gang costs.
type CostKind int

// Cost terms the model estimates. Checkpoint save and restore times are declared per gang
// (Request.Checkpoint); lost work follows from its checkpoints.
const (
	// CostCUDAContext is tearing down and re-creating the CUDA context of one member's
	// GPU. Members do it in parallel, so a gang pays it once in wall time, on every GPU.
	CostCUDAContext CostKind = iota + 1
	// CostCommunicator is setting up the gang's collective communicator (NCCL's
	// ncclCommInitRank, or Atoll's ring) for a given number of ranks; it grows with ranks.
	CostCommunicator
)

// String returns the kind's name.
func (k CostKind) String() string {
	switch k {
	case CostCUDAContext:
		return "cuda_context"
	case CostCommunicator:
		return "communicator"
	}
	return "unknown"
}

// CostModel estimates the hardware-dependent restart costs of a gang, per GPU model and
// gang size, and learns them from measurements.
//
// Defaults, from published figures:
//   - CUDA context: 1 s per GPU to tear down and re-create (the upper end of the 0.1–1 s
//     usually measured for cuCtxCreate with lazy module loading; without lazy loading it can
//     be several seconds);
//   - communicator set-up: 2 s + 36 ms per rank. NVIDIA/nccl#534 reports 16.3 s to create 8
//     communicators over 8 ranks (about 2 s each) and 130 s for 32 over 32 ranks (about 4 s
//     each); NVIDIA/nccl#1156 reports 2.5 minutes of initialisation at several thousand
//     GPUs (≈ 2 s + 36 ms × 4,096).
//
// The estimator: the default curve d(kind, ranks) times a correction factor learnt per
// (GPU model, kind) as an exponentially weighted moving average of measured/d(kind,
// ranks), weight Alpha per observation (the first observation sets the factor). One
// measurement on 8 ranks thus also corrects the estimate for 512 ranks, in proportion.
//
// A CostModel is not safe for concurrent use; the scheduler that owns it serialises calls.
type CostModel struct {
	// CUDAContext is the default per-GPU context teardown plus re-creation time.
	CUDAContext time.Duration
	// CommBase and CommPerRank give the default communicator set-up time
	// CommBase + CommPerRank × ranks.
	CommBase, CommPerRank time.Duration
	// Alpha is the weight of each new measurement in (0, 1].
	Alpha float64

	factor map[costKey]float64
	count  map[costKey]int
}

type costKey struct {
	model string
	kind  CostKind
}

// DefaultCostModel returns the model with the published defaults above.
func DefaultCostModel() *CostModel {
	return &CostModel{CUDAContext: time.Second, CommBase: 2 * time.Second, CommPerRank: 36 * time.Millisecond, Alpha: 0.3}
}

// maxMeasured bounds a measurement: anything longer is a fault, not a cost.
const maxMeasured = time.Hour

func (m *CostModel) base(kind CostKind, ranks int) time.Duration {
	switch kind {
	case CostCUDAContext:
		return m.CUDAContext
	case CostCommunicator:
		if ranks <= 1 {
			return 0
		}
		return m.CommBase + time.Duration(ranks)*m.CommPerRank
	}
	return 0
}

// Observe records a measured cost of kind for a gang of ranks members on GPUs of model.
func (m *CostModel) Observe(model string, ranks int, kind CostKind, measured time.Duration) error {
	if kind != CostCUDAContext && kind != CostCommunicator {
		return fmt.Errorf("gang: observe cost kind %d: %w", kind, ErrInvalidRequest)
	}
	if ranks < 1 || measured < 0 || measured > maxMeasured {
		return fmt.Errorf("gang: observe %s of %d ranks on %q: %s outside [0, %s] or ranks < 1: %w",
			kind, ranks, model, measured, maxMeasured, ErrInvalidRequest)
	}
	b := m.base(kind, ranks)
	if b <= 0 {
		return nil // nothing to correct (one rank needs no communicator)
	}
	if m.factor == nil {
		m.factor, m.count = map[costKey]float64{}, map[costKey]int{}
	}
	k := costKey{model, kind}
	r := float64(measured) / float64(b)
	if m.count[k] == 0 {
		m.factor[k] = r
	} else {
		m.factor[k] = (1-m.Alpha)*m.factor[k] + m.Alpha*r
	}
	m.count[k]++
	return nil
}

// Estimate returns the expected cost of kind for ranks members on GPUs of model.
func (m *CostModel) Estimate(model string, ranks int, kind CostKind) time.Duration {
	b := m.base(kind, ranks)
	if f, ok := m.factor[costKey{model, kind}]; ok {
		return time.Duration(math.Round(float64(b) * f))
	}
	return b
}

// Observations returns how many measurements of kind on model the estimate rests on.
func (m *CostModel) Observations(model string, kind CostKind) int {
	return m.count[costKey{model, kind}]
}

// LearnedCost is what a CostModel learned of one cost on one GPU model: the correction
// factor applied to the default curve and the measurements it rests on.
type LearnedCost struct {
	Model  string   `json:"model"`
	Kind   CostKind `json:"kind"`
	Factor float64  `json:"factor"`
	Count  int      `json:"count"`
}

// Learned returns what the model learned, ordered by GPU model and kind: with SetLearned
// it carries the model over to another scheduler (a new leader's) exactly.
func (m *CostModel) Learned() []LearnedCost {
	out := make([]LearnedCost, 0, len(m.factor))
	for k, f := range m.factor {
		out = append(out, LearnedCost{Model: k.model, Kind: k.kind, Factor: f, Count: m.count[k]})
	}
	slices.SortFunc(out, func(a, b LearnedCost) int {
		if c := cmp.Compare(a.Model, b.Model); c != 0 {
			return c
		}
		return cmp.Compare(a.Kind, b.Kind)
	})
	return out
}

// SetLearned sets what the model learned of a GPU model's cost (one entry of Learned),
// replacing what it had learned of it.
func (m *CostModel) SetLearned(l LearnedCost) error {
	if l.Kind != CostCUDAContext && l.Kind != CostCommunicator {
		return fmt.Errorf("gang: learned cost kind %d: %w", l.Kind, ErrInvalidRequest)
	}
	if !(l.Factor >= 0) || math.IsInf(l.Factor, 0) || l.Count < 1 {
		return fmt.Errorf("gang: learned cost %+v: want a finite factor >= 0 and a count >= 1: %w", l, ErrInvalidRequest)
	}
	if m.factor == nil {
		m.factor, m.count = map[costKey]float64{}, map[costKey]int{}
	}
	k := costKey{l.Model, l.Kind}
	m.factor[k], m.count[k] = l.Factor, l.Count
	return nil
}

func (m *CostModel) validate() error {
	if m.CUDAContext < 0 || m.CommBase < 0 || m.CommPerRank < 0 || !(m.Alpha > 0 && m.Alpha <= 1) {
		return fmt.Errorf("gang: cost model %+v: durations >= 0 and Alpha in (0, 1]: %w", *m, ErrInvalidConfig)
	}
	return nil
}

// EvictionCost breaks down what stopping a gang now and restarting it later costs, in wall
// time per GPU; GPUSeconds is the total over the gang's GPUs.
type EvictionCost struct {
	LostWork     time.Duration // progress since the last checkpoint that survives the stop
	Save         time.Duration // writing the just-in-time checkpoint
	Restore      time.Duration // reading it back
	CUDAContext  time.Duration // teardown and re-creation
	Communicator time.Duration // set-up of the communicator at restart
	GPUs         float64       // GPUs the gang holds
	GPUSeconds   float64       // (sum of the above) × GPUs
	// StopBy is the victim's deadline: after its just-in-time save (plus
	// Config.CheckpointGrace), at its next periodic checkpoint when that comes within the
	// grace, or at once.
	StopBy time.Time
	// Kept is the point of the run the victim's checkpoint will hold when it stops.
	Kept time.Time
}

// Total returns the sum of the terms, in wall time.
func (c EvictionCost) Total() time.Duration {
	return c.LostWork + c.Save + c.Restore + c.CUDAContext + c.Communicator
}

// ObserveCost feeds a measured restart cost into the scheduler's cost model (see
// CostModel.Observe): a worker's measured CUDA context creation, a gang's measured
// communicator set-up.
func (s *Scheduler) ObserveCost(model string, ranks int, kind CostKind, measured time.Duration) error {
	return s.costs.Observe(model, ranks, kind, measured)
}

// Costs returns the scheduler's cost model (read it; feed it through ObserveCost).
func (s *Scheduler) Costs() *CostModel { return s.costs }

// evictionCost is what stopping g at now costs. A gang that checkpoints on notice
// (Checkpoint.JustInTime) loses no work but pays the save; otherwise it loses the work
// since its last checkpoint (reported or, from Checkpoint.Interval, the last periodic one).
// CUDA terms declared in the request replace the model's.
func (s *Scheduler) evictionCost(g *gangState, now time.Time) EvictionCost {
	ck := g.req.Checkpoint
	c := EvictionCost{Restore: ck.Restore, GPUs: float64(g.milli) / Milli, StopBy: now, Kept: now}
	switch next := g.nextCheckpoint(now); {
	case ck.JustInTime:
		c.Save = ck.Save
		c.StopBy = now.Add(ck.Save + s.cfg.CheckpointGrace)
	case !next.IsZero() && next.Sub(now) <= s.cfg.CheckpointGrace:
		c.StopBy, c.Kept = next, next.Add(-ck.Save) // near a checkpoint: stop right after it
	default:
		c.LostWork = s.sinceCheckpoint(g, now)
		c.Kept = now.Add(-c.LostWork)
	}
	model := g.model()
	if ck.CUDATeardown > 0 || ck.CUDACreate > 0 {
		c.CUDAContext = ck.CUDATeardown + ck.CUDACreate
	} else if g.milli > 0 {
		c.CUDAContext = s.costs.Estimate(model, g.members, CostCUDAContext)
	}
	c.Communicator = s.costs.Estimate(model, ranks(g.members, g.milli), CostCommunicator)
	c.GPUSeconds = c.Total().Seconds() * c.GPUs
	return c
}

// ranks is the communicator size of a gang of members holding milli: one rank per card (a
// member with 8 cards runs 8 ranks), at least one per member.
func ranks(members int, milli int64) int {
	return max(members, int((milli+Milli-1)/Milli))
}

// sinceCheckpoint is the work g would lose if stopped at now without saving.
func (s *Scheduler) sinceCheckpoint(g *gangState, now time.Time) time.Duration {
	ck := g.req.Checkpoint
	last := g.start
	if g.lastCkpt.After(last) {
		last = g.lastCkpt
	} else if ck.Interval > 0 && now.After(g.start) {
		last = g.start.Add(now.Sub(g.start) / ck.Interval * ck.Interval)
	}
	return max(0, now.Sub(last))
}

// sinceStartToCheckpoint is the work of this run that g's last checkpoint holds.
func (s *Scheduler) sinceStartToCheckpoint(g *gangState, now time.Time) time.Duration {
	return max(0, now.Sub(g.start)-s.sinceCheckpoint(g, now))
}

// nextCheckpoint is when g's next periodic checkpoint completes (the periodic points are
// start + k × Interval; each completes Save later), or zero when it has none.
func (g *gangState) nextCheckpoint(now time.Time) time.Time {
	ck := g.req.Checkpoint
	if ck.Interval <= 0 || now.Before(g.start) {
		return time.Time{}
	}
	next := g.start.Add(now.Sub(g.start)/ck.Interval*ck.Interval + ck.Save)
	for !next.After(now) {
		next = next.Add(ck.Interval)
	}
	return next
}

// model is the GPU model of the gang's first card (for the cost model), or "".
func (g *gangState) model() string {
	if len(g.allocs) == 0 || len(g.allocs[0].gpus) == 0 {
		return ""
	}
	return g.gpuModel
}
