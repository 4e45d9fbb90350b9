package gang

import (
	"fmt"
	"time"
)

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
	// percentageOfNodesToScore): the index proposes at most this many, best-fit first.
	MaxCandidates int
	// MaxGangsPerCycle bounds the gangs considered in one cycle, so cycle latency stays bounded.
	MaxGangsPerCycle int
	// MaxPending is the backpressure bound: beyond it submissions get QueuedSaturated.
	MaxPending int
	// AgingStep raises a waiting gang's effective priority by one class per AgingStep waited
	// (starvation freedom). 0 disables aging.
	AgingStep time.Duration

	// Preemption enables evicting lower-priority or over-share gangs.
	Preemption bool
	// FairShareReclaim lets an under-share queue reclaim borrowed capacity by preemption.
	FairShareReclaim bool
	// TopologyWait lets a multi-GPU gang whose best placement now crosses more machines than
	// it must wait up to this long (from submission) for a compact one, as delay scheduling
	// does: a short wait buys a much faster AllReduce for the rest of the run. 0 disables it.
	TopologyWait time.Duration
	// MinRunBeforePreempt protects a gang that started less than this long ago from
	// eviction, so that a gang is not thrashed (evicted, restored, evicted again).
	MinRunBeforePreempt time.Duration
	// CheckpointGrace is added to a victim's checkpoint save time to form its deadline.
	CheckpointGrace time.Duration
	// Backfill enables Slurm-style backfill around one reservation for the blocked head gang.
	Backfill bool
	// QuotaAdmission admits a gang only while its queue is within its quota (Kueue-like).
	QuotaAdmission bool
	// StrictFIFO stops the cycle at the first gang that does not fit (FIFO baseline).
	StrictFIFO bool
	// DefaultAllReduceBytes is used when a request does not say (a 1 GiB gradient).
	DefaultAllReduceBytes int64
}

// DefaultConfig returns a configuration that runs: one default queue, all plugins on,
// preemption, backfill and aging on, load weights 0.4/0.3/0.2/0.1.
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
		MaxPending:       100000,
		AgingStep:        72 * time.Hour,
		Preemption:       true,
		FairShareReclaim: true,
		CheckpointGrace:  30 * time.Second,
		// A restore plus CUDA context re-creation costs about a minute; a 15-minute guard
		// keeps eviction overhead under ~10% of a victim's run.
		MinRunBeforePreempt: 15 * time.Minute,
		TopologyWait:        time.Hour,
		Backfill:            true,
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
	if c.MaxCandidates < 1 || c.MaxGangsPerCycle < 1 || c.MaxPending < 1 {
		return fmt.Errorf("gang: MaxCandidates %d, MaxGangsPerCycle %d, MaxPending %d must be >= 1: %w",
			c.MaxCandidates, c.MaxGangsPerCycle, c.MaxPending, ErrInvalidConfig)
	}
	if c.AgingStep < 0 || c.CheckpointGrace < 0 || c.MinRunBeforePreempt < 0 || c.TopologyWait < 0 || c.DefaultAllReduceBytes < 0 {
		return fmt.Errorf("gang: negative AgingStep, CheckpointGrace or DefaultAllReduceBytes: %w", ErrInvalidConfig)
	}
	if c.FairShareReclaim && !c.Preemption {
		return fmt.Errorf("gang: FairShareReclaim needs Preemption: %w", ErrInvalidConfig)
	}
	return nil
}
