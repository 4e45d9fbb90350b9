package gang

import (
	"fmt"
	"math"
	"time"
)

// classWeight is ClassWeight^priority.
func (c *Config) classWeight(priority int) float64 {
	return math.Pow(c.ClassWeight, float64(priority))
}

// starving says g is starving (Preempt.StarvationWait): of priority StarvationPriority
// or above, it has waited StarvationWait / ClassWeight^priority since it last queued.
func (c *Config) starving(g *QueuedGang) bool {
	sw := c.Preempt.StarvationWait
	return sw > 0 && c.Preemption && g.Request.Priority >= c.Preempt.StarvationPriority &&
		g.Waited.Seconds()*c.classWeight(g.Request.Priority) >= sw.Seconds()
}

// QueueConfig declares one queue. Queues form a tree by their slash-separated paths
// ("research/vision" is a child of "research"); parents not listed get weight 1.
type QueueConfig struct {
	Name   string
	Weight float64 // share of the parent's resources among active siblings (DRF)
	// Quota caps, in whole GPUs, what the queue may use while other queues wait
	// (0 = no cap beyond fair share). Above its fair share a queue only borrows idle capacity,
	// which under-share queues may reclaim by preemption.
	Quota int
	// Sensitivity in [0, 1] feeds the γ term of the dynamic priority (latency-sensitive queues).
	Sensitivity float64
}

// Weights are the placement score weights, one per score plugin. A zero weight disables it.
type Weights struct {
	Topology      float64 // fewest islands/machines/racks, shortest modeled AllReduce
	Fragmentation float64 // what the placement leaves usable for typical requests
	Load          float64 // measured node use
	Binpack       float64 // prefer fuller nodes (Volcano-style binpack)
}

// LoadWeights weigh a node's measured use into one figure.
type LoadWeights struct {
	CPU, GPU, Mem, Net float64
}

// PriorityWeights are α, β, γ of the dynamic priority
// α·(remaining/total) + β·(resource satisfaction) + γ·(queue sensitivity).
type PriorityWeights struct {
	Alpha, Beta, Gamma float64
}

// Config tunes the scheduler. Start from DefaultConfig.
type Config struct {
	Queues       []QueueConfig
	DefaultQueue string

	Weights     Weights
	LoadWeights LoadWeights
	Priority    PriorityWeights

	// TopologyAware turns on locality-first candidate domains (machine, island, rack). When
	// false, multi-node gangs are spread first-fit over node order (topology-blind baselines).
	TopologyAware bool
	// MaxCandidates bounds the candidate placements scored per gang (like kube-scheduler's
	// percentageOfNodesToScore): the index proposes at most this many, best-fit first; the
	// search looks at no more than 4× as many single machines and 2× as many islands or
	// racks, and a GPU-share member at no more than 8× as many nodes.
	MaxCandidates int
	// MaxGangsPerCycle bounds the gangs tried (searched for a placement) in one cycle, so
	// cycle latency stays bounded.
	MaxGangsPerCycle int
	// MaxScanFactor bounds the gangs looked at in one cycle to MaxScanFactor ×
	// MaxGangsPerCycle. Gangs skipped without a search (a gang of the same shape and no
	// more members already failed this cycle) do not count as tried, so that blocked large
	// gangs do not hide small ones; this bound keeps such skips from scanning a backlog of
	// hundreds of thousands. Default 16: 4,096 looks at the default 256 tries.
	MaxScanFactor int
	// MaxPreemptionSearches bounds the preemption (PostFilter) searches per priority class
	// per cycle (starving gangs have as many again, Preempt.StarvationWait). Each may try
	// MaxPreemptionTries placements; default 2 keeps a saturated cycle's preemption work
	// under ~100 placement searches a class.
	MaxPreemptionSearches int
	// MaxPreemptionVictims bounds the candidate victims one preemption search considers,
	// cheapest first (default 256: far more than any gang needs to free; the rest cost
	// more anyway).
	MaxPreemptionVictims int
	// MaxPreemptionTries bounds the placement attempts one preemption search makes while
	// adding victims (default 48: with victims of one machine each, enough to free 48
	// machines for one gang).
	MaxPreemptionTries int
	// MaxReservationTries bounds the placement attempts one reservation search makes
	// while releasing running gangs in end order (default 32: a reservation further out
	// than 32 completions is rarely worth holding, and each try is a placement search).
	MaxReservationTries int
	// MaxReservations bounds the reservations a cycle holds (a blocked gang's and those
	// of gangs waiting for a compact placement), and the compact reservation searches it
	// makes (default 4: each is a search of up to MaxReservationTries placements).
	MaxReservations int
	// MaxWaitingReported bounds Decisions.Waiting (default 64: enough to show the head of
	// the queue without building thousands of strings per cycle on a saturated cluster).
	MaxWaitingReported int
	// MaxPending is the backpressure bound: past it submissions are refused with
	// ErrSaturated and a retry hint (default 2,000, the design this project comes from).
	MaxPending int
	// AgingStep raises a waiting gang's effective priority by one class per AgingStep waited
	// (starvation freedom across classes). 0, the default, disables it: on an overloaded
	// cluster class aging lifts weeks-old low-priority gangs above fresh high-priority ones
	// (measured in BENCHMARKS.md).
	AgingStep time.Duration
	// RemainingAging discounts a waiting gang's expected remaining work in the "urgency"
	// order by 1 + waited/RemainingAging, so that long gangs are not passed over forever
	// by shorter ones of their class. 0 disables it.
	RemainingAging time.Duration
	// UnknownDuration is the run time per member the "urgency" order assumes for a gang
	// whose run time nothing tells (least attained service takes over once it has run
	// longer).
	UnknownDuration time.Duration
	// Predict learns run times from completed gangs (Scheduler.Complete) and predicts
	// those of gangs that declare no Duration (runtimes.go).
	Predict PredictConfig

	// Preemption enables evicting lower-priority or over-share gangs.
	Preemption bool
	// FairShareReclaim lets an under-share queue reclaim borrowed capacity by preemption.
	FairShareReclaim bool
	// TopologyWait lets a multi-GPU gang whose best placement now crosses more machines than
	// it must wait up to this long (divided by its class weight) for a compact one, as delay
	// scheduling does: a wait buys a much faster AllReduce for the rest of the run. It
	// counts only while a scattered placement was at hand (from the first cycle that found
	// one since the gang queued). Default 256 h (low priority; 32 h normal, 4 h high with
	// ClassWeight 8), of which all but TopologyWaitUnforeseen is spent only while a compact
	// placement can be foreseen within it. 0 disables it.
	TopologyWait time.Duration
	// TopologyWaitUnforeseen is how long (divided by the class weight) a gang waits for a
	// compact placement that cannot be foreseen: past it, it waits on only while running
	// gangs with declared durations will make compact room within TopologyWait (default
	// 1 h).
	TopologyWaitUnforeseen time.Duration
	// TopologyWaitFraction, when positive, also bounds that wait to this fraction of the
	// gang's declared duration: a short job gains too little from a faster AllReduce to
	// wait long for it.
	TopologyWaitFraction float64
	// MinRunBeforePreempt protects a gang that started less than this long ago from
	// eviction, so that a gang is not thrashed (evicted, restored, evicted again).
	MinRunBeforePreempt time.Duration
	// CheckpointGrace is added to a victim's just-in-time save time to form its deadline;
	// a victim without just-in-time checkpoints whose next periodic one comes within it
	// stops right after that one.
	CheckpointGrace time.Duration
	// StrictClasses orders the "urgency" queue by priority class first (Volcano's and
	// Kueue's semantics). Off by default: a class then weighs a gang's remaining work
	// (divided by ClassWeight^priority), so a high-priority gang still goes before a
	// low-priority one with up to ClassWeight² as much work left, and much shorter work
	// of lower classes is not held behind it (the mean completion time gains; measured in
	// BENCHMARKS.md).
	StrictClasses bool
	// HoldTimeout drops a preemptor's hold on the capacity freed for it once this long
	// past the victims' deadline (default 10 minutes): by then they have stopped, and a
	// preemptor that still does not fit must not keep nodes idle.
	HoldTimeout time.Duration
	// Preempt tunes when an eviction pays for itself (the in-tree preemption plugin).
	Preempt PreemptConfig
	// ClassWeight is what one priority class is worth relative to the one below: a gang of
	// priority p counts ClassWeight^p (default 8: one high-priority GPU-second of waiting is
	// worth eight normal ones and 64 low ones). It weighs the "urgency" order (unless
	// StrictClasses), a preemptor's gain against its victims' cost, and divides the
	// topology wait (a gang of priority p waits at most TopologyWait / ClassWeight^p for a
	// compact placement).
	ClassWeight float64
	// ElasticGrow lets running elastic gangs grow toward Max when capacity is free and no
	// pending gang waits for capacity (a grow pauses the gang for a communicator set-up, so
	// a gang of known duration grows only when the time saved exceeds it).
	ElasticGrow bool
	// Backfill enables Slurm-style backfill around one reservation for the blocked head gang.
	Backfill bool
	// BackfillAfter reserves capacity only for a blocked gang that has waited at least this
	// long (0: at once). A reservation idles the capacity it holds until its start; holding
	// it only for gangs that would otherwise starve keeps that idle time small (default a
	// week: on an overloaded cluster earlier reservations cost more mean completion time
	// than they save; measured in BENCHMARKS.md). Reservations for gangs waiting for a
	// compact placement (TopologyWait) are not delayed.
	BackfillAfter time.Duration
	// Growable says machines may be added to the cluster (autoscaling pools): a gang
	// larger than the cluster now is queued, not refused as never fitting (the pools judge
	// what no machine they can add would hold).
	Growable bool
	// QuotaAdmission admits a gang only while its queue is within its quota (Kueue-like).
	QuotaAdmission bool
	// StrictFIFO stops the cycle at the first gang that does not fit (FIFO baseline).
	StrictFIFO bool
	// DefaultAllReduceBytes is used when a request does not say (a 1 GiB gradient).
	DefaultAllReduceBytes int64

	// LASThreshold is the attained GPU-seconds that moves a gang from the first to the
	// second queue of the "las" QueueSort (Tiresias' two-queue example: 3,600).
	LASThreshold float64

	// Plugins names the plugins of each extension point (nil lists: the defaults the
	// switches above select).
	Plugins Plugins
	// Actions are the steps each pending gang goes through in a cycle, in order (see
	// Action): nil runs DefaultActions, enqueue, allocate, preempt, reclaim, backfill.
	// Leaving one out turns it off: without preempt and reclaim nothing is evicted,
	// without backfill nothing is reserved, without enqueue no PreFilter runs. Validate
	// refuses unknown or repeated actions, a list without allocate, enqueue after it, and
	// the others before it.
	Actions []Action
}

// DefaultConfig returns a configuration that runs: one default queue, the "urgency" queue
// order, every score plugin, cost-aware preemption, backfill and topology wait; load
// weights 0.4/0.3/0.2/0.1.
func DefaultConfig() Config {
	return Config{
		Queues:           []QueueConfig{{Name: "default", Weight: 1}},
		DefaultQueue:     "default",
		Weights:          Weights{Topology: 1, Fragmentation: 0.5, Load: 0.2, Binpack: 0.1},
		LoadWeights:      LoadWeights{CPU: 0.4, GPU: 0.3, Mem: 0.2, Net: 0.1},
		Priority:         PriorityWeights{Alpha: 0.2, Beta: 0.5, Gamma: 0.3},
		TopologyAware:    true,
		MaxCandidates:    16,
		MaxGangsPerCycle: 256,
		MaxScanFactor:    16,
		// Two preemption searches and one reservation search per cycle.
		MaxPreemptionSearches: 2,
		MaxPreemptionVictims:  256,
		MaxPreemptionTries:    48,
		MaxReservationTries:   32,
		MaxReservations:       4,
		MaxWaitingReported:    64,
		// The pending bound of the design this project comes from.
		MaxPending:       2000,
		RemainingAging:   24 * time.Hour,
		UnknownDuration:  time.Hour,
		Predict:          DefaultPredictConfig(),
		Preemption:       true,
		FairShareReclaim: true,
		CheckpointGrace:  30 * time.Second,
		Preempt:          DefaultPreemptConfig(),
		HoldTimeout:      10 * time.Minute,
		ClassWeight:      8,
		// A restore plus CUDA context re-creation costs about a minute; a 15-minute guard
		// keeps eviction overhead under ~10% of a victim's run.
		MinRunBeforePreempt: 15 * time.Minute,
		// Measured on the contended traces (BENCHMARKS.md): with the wait counted only
		// while a scattered placement is at hand, long waits cost little completion time
		// and halve the modeled AllReduce time.
		TopologyWait:           256 * time.Hour,
		TopologyWaitUnforeseen: time.Hour,
		Backfill:               true,
		ElasticGrow:            true,
		BackfillAfter:          7 * 24 * time.Hour,
		LASThreshold:           3600,
		// 1 GiB: a 500M-parameter model's fp16 gradients.
		DefaultAllReduceBytes: 1 << 30,
	}
}

// Validate checks the configuration, including cross-field rules.
func (c Config) Validate() error {
	if len(c.Queues) == 0 {
		return fmt.Errorf("gang: no queues: %w", ErrInvalidConfig)
	}
	seen := map[string]bool{}
	for _, q := range c.Queues {
		if q.Name == "" || q.Weight <= 0 || q.Quota < 0 || q.Sensitivity < 0 || q.Sensitivity > 1 {
			return fmt.Errorf("gang: queue %+v: need a name, weight > 0, quota >= 0, sensitivity in [0,1]: %w", q, ErrInvalidConfig)
		}
		if seen[q.Name] {
			return fmt.Errorf("gang: queue %q declared twice: %w", q.Name, ErrInvalidConfig)
		}
		seen[q.Name] = true
	}
	if !seen[c.DefaultQueue] {
		return fmt.Errorf("gang: default queue %q not declared: %w", c.DefaultQueue, ErrInvalidConfig)
	}
	w := c.Weights
	if w.Topology < 0 || w.Fragmentation < 0 || w.Load < 0 || w.Binpack < 0 {
		return fmt.Errorf("gang: negative score weight %+v: %w", w, ErrInvalidConfig)
	}
	lw := c.LoadWeights
	if lw.CPU < 0 || lw.GPU < 0 || lw.Mem < 0 || lw.Net < 0 {
		return fmt.Errorf("gang: negative load weight %+v: %w", lw, ErrInvalidConfig)
	}
	for _, b := range []struct {
		name string
		v    int
	}{
		{"MaxCandidates", c.MaxCandidates}, {"MaxGangsPerCycle", c.MaxGangsPerCycle}, {"MaxPending", c.MaxPending},
		{"MaxScanFactor", c.MaxScanFactor}, {"MaxPreemptionSearches", c.MaxPreemptionSearches},
		{"MaxPreemptionVictims", c.MaxPreemptionVictims}, {"MaxPreemptionTries", c.MaxPreemptionTries},
		{"MaxReservationTries", c.MaxReservationTries}, {"MaxReservations", c.MaxReservations},
	} {
		if b.v < 1 {
			return fmt.Errorf("gang: %s %d must be >= 1: %w", b.name, b.v, ErrInvalidConfig)
		}
	}
	if c.MaxWaitingReported < 0 {
		return fmt.Errorf("gang: MaxWaitingReported %d must be >= 0: %w", c.MaxWaitingReported, ErrInvalidConfig)
	}
	if c.AgingStep < 0 || c.RemainingAging < 0 || c.UnknownDuration < 0 || c.CheckpointGrace < 0 || c.MinRunBeforePreempt < 0 ||
		c.TopologyWait < 0 || c.DefaultAllReduceBytes < 0 || c.LASThreshold < 0 || c.TopologyWaitFraction < 0 || c.HoldTimeout < 0 || c.TopologyWaitUnforeseen < 0 {
		return fmt.Errorf("gang: negative AgingStep, RemainingAging, UnknownDuration, CheckpointGrace, MinRunBeforePreempt, TopologyWait, DefaultAllReduceBytes or LASThreshold: %w", ErrInvalidConfig)
	}
	if p := c.Preempt; p.GainRatio < 0 || p.MaxEvictions < 0 || p.StarvationWait < 0 || p.StarvationRetry < 0 || p.OwnClassAfter < 0 || !(c.ClassWeight >= 1) || math.IsInf(c.ClassWeight, 0) {
		return fmt.Errorf("gang: ClassWeight %v must be >= 1 and finite, Preempt %+v GainRatio, MaxEvictions, StarvationWait, StarvationRetry and OwnClassAfter >= 0: %w", c.ClassWeight, p, ErrInvalidConfig)
	}
	if p := c.Predict; p.Enabled && (p.Window < 1 || p.MinRuns < 0) {
		return fmt.Errorf("gang: Predict %+v: Window must be >= 1 and MinRuns >= 0: %w", p, ErrInvalidConfig)
	}
	if err := validateActions(c.Actions); err != nil {
		return err
	}
	if c.FairShareReclaim && !c.Preemption {
		return fmt.Errorf("gang: FairShareReclaim needs Preemption: %w", ErrInvalidConfig)
	}
	return nil
}
