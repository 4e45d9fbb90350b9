// Package poolsim replays a job trace on autoscaling pools and compares autoscaling
// policies by cost, goodput, queueing delay and interruptions (`atoll sim --mode pools`).
//
// The model: each trace job is a gang (up to 8 GPUs: one member of that many cards; more:
// members of 8 cards) that tolerates interruption. Machines are bought from pools (launch
// latency, price per hour, spot interruptions drawn from the pool's declared rate, each
// announced notice_seconds ahead), paid from launch to removal. One placer puts pending
// jobs, in queue order with backfill, on ready machines (best fit per member, all members
// or none); the policies decide what to buy, drain and remove, and which jobs to stop.
//
// The checkpoint model is the same for every policy. A job writes a periodic checkpoint every
// CheckpointEvery of progress, in the background (its cost is in the trace's durations). A
// checkpoint on request (a spot notice, an eviction, a preemption) stops training and takes
// Checkpoint.Time: the job's state (Checkpoint.GBPerGPU on each GPU) at each GPU's share of
// its machine's storage bandwidth (Checkpoint.StorageGBps). If it is written before the
// deadline (the interruption, the eviction's grace), the job keeps all its work; if not, it is
// lost, and the job keeps only its last periodic checkpoint. A restart from a checkpoint
// pays Restore (process and framework start) plus reading the checkpoint back at the same
// bandwidth. A job killed without a checkpoint (its machine lost) keeps its last periodic
// one.
//
// The policies (each documented where it is written):
//
//   - static: every on-demand pool at its max, always on (the on-demand reference);
//   - ray: a model of Ray's autoscaler v2 (ray.go): resource-demand bin-packing of pending
//     placement groups onto node types, upscaling_speed bounding requests per reconcile,
//     idle_timeout_minutes; no notice handling (an interruption is a lost node);
//   - kueue: a model of Kueue with the ProvisioningRequest admission check and the
//     cluster-autoscaler (kueue.go): ClusterQueue quota over spot then on-demand
//     ResourceFlavors, one atomic scale-up per workload, CA's scale-down of unneeded nodes;
//     a node termination handler drains a node on its spot notice;
//   - atoll: the pools core (pools.Autoscaler) every 10 s with the pools' idle timeouts,
//     notices turned into checkpoint-then-stop, and consolidation of partly used machines;
//   - atoll-predict: atoll with the arrival forecaster pre-warming machines;
//   - atoll-on-demand: atoll on the on-demand pools only (what autoscaling alone saves,
//     without spot).
//
// Every policy sees the same world: the trace's jobs as they arrive (no durations), the
// machines and what runs on them, and, for the policies that listen, the interruption
// notices, which providers publish to everyone. None gets a job's duration.
//
// Besides each policy's figures, a run computes two bounds from the trace and the pools
// (bounds.go): the cost of the work at the cheapest price per GPU-hour it may run at
// (oracle_cost_usd, hence max_saving_pct), and the best goodput of any policy that starts
// every job when it arrives (goodput_bound_pct).
package poolsim

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/atoll-run/atoll/pools"
)

// Job is one trace job.
type Job struct {
	ID       string
	Submit   time.Duration
	Duration time.Duration
	GPUs     int
}

// Checkpoint is what a checkpoint on request costs.
type Checkpoint struct {
	// GBPerGPU is a job's checkpoint state per GPU, in GB. Default 10: the mixed-precision
	// Adam state of a 7-billion-parameter model (12 bytes a parameter: fp32 weights and two
	// moments) sharded over 8 GPUs.
	GBPerGPU float64
	// StorageGBps is a machine's bandwidth to checkpoint storage, in GB/s, shared by its
	// GPUs. Default 2.
	StorageGBps float64
}

// Time is how long a job on a machine of gpus cards takes to write (or read) its
// checkpoint: its state per GPU at one GPU's share of the machine's bandwidth. With the
// defaults, 40 s on an 8-GPU machine.
func (c Checkpoint) Time(gpus int) time.Duration {
	return time.Duration(c.GBPerGPU * float64(gpus) / c.StorageGBps * float64(time.Second))
}

func (c Checkpoint) time(gpus int) time.Duration { return c.Time(gpus) }

// Options configure a replay.
type Options struct {
	Policies []string
	// CheckpointEvery is the jobs' periodic checkpoint interval, in progress.
	CheckpointEvery time.Duration
	// Restore is what a restart from a checkpoint costs before it reads the checkpoint
	// (process and framework start).
	Restore    time.Duration
	Checkpoint Checkpoint
	Seed       uint64
	// Ray and Kueue configure the baselines' models; Atoll the pools core of the atoll
	// policies.
	Ray   RayConfig
	Kueue KueueConfig
	Atoll pools.Config
}

// DefaultOptions: every policy, 30 min periodic checkpoints, 1 min restarts, 10 GB per
// GPU at 2 GB/s per machine, the baselines with their systems' defaults, and the pools core
// with consolidation on.
func DefaultOptions() Options {
	atoll := pools.DefaultConfig()
	atoll.Consolidate = true
	return Options{Policies: Policies(), CheckpointEvery: 30 * time.Minute, Restore: time.Minute,
		Checkpoint: Checkpoint{GBPerGPU: 10, StorageGBps: 2}, Seed: 1,
		Ray: DefaultRayConfig(), Kueue: DefaultKueueConfig(), Atoll: atoll}
}

// Validate rejects options the replay cannot run with.
func (o Options) Validate() error {
	switch {
	case o.CheckpointEvery <= 0:
		return fmt.Errorf("poolsim: checkpoint interval %v: want > 0", o.CheckpointEvery)
	case o.Restore < 0:
		return fmt.Errorf("poolsim: restore %v: want ≥ 0", o.Restore)
	case !(o.Checkpoint.GBPerGPU >= 0) || math.IsInf(o.Checkpoint.GBPerGPU, 0) || !(o.Checkpoint.StorageGBps > 0) || math.IsInf(o.Checkpoint.StorageGBps, 0):
		return fmt.Errorf("poolsim: checkpoint %+v: want GB per GPU ≥ 0 and storage bandwidth > 0", o.Checkpoint)
	}
	for _, p := range o.Policies {
		if !slices.Contains(Policies(), p) {
			return fmt.Errorf("poolsim: policy %q: want one of %v", p, Policies())
		}
	}
	if err := o.Ray.Validate(); err != nil {
		return err
	}
	if err := o.Kueue.Validate(); err != nil {
		return err
	}
	return o.Atoll.Validate()
}

// Policies lists the policies.
func Policies() []string {
	return []string{"static", "ray", "kueue", "atoll", "atoll-predict", "atoll-on-demand"}
}

// Result is one policy's figures. The bounds (spot discount, on-demand work, oracle cost,
// max saving, goodput bound) are the run's, the same in every result.
type Result struct {
	Policy string `json:"policy"`
	// Seed drew the spot interruptions.
	Seed uint64 `json:"seed"`
	// SpotDiscountPct is the spot pools' discount on the on-demand price of the same
	// machine, in percent (0 without spot pools).
	SpotDiscountPct float64 `json:"spot_discount_pct"`
	Jobs            int     `json:"jobs"`
	Cost            float64 `json:"cost_usd"`
	// CostVsOnDemandPct is the cost as a percentage of the static on-demand reference's
	// (100 = the same; 30 = 70% cheaper).
	CostVsOnDemandPct float64 `json:"cost_vs_on_demand_pct"`
	// OnDemandWorkUSD is the trace's work (GPU-hours) at the cheapest on-demand price per
	// GPU-hour of a pool that holds it: what a perfect on-demand autoscaler would pay.
	OnDemandWorkUSD float64 `json:"on_demand_work_usd"`
	// OracleCostUSD is the trace's work at the cheapest price per GPU-hour of a pool that
	// holds it, spot included: no policy pays less (no launch, idle card, interruption or
	// restore is paid; jobs may wait as long as it takes to fill whole machines).
	OracleCostUSD float64 `json:"oracle_cost_usd"`
	// SavingPct is the saving against OnDemandWorkUSD; MaxSavingPct the oracle's, the best
	// saving any policy could reach with perfect knowledge; SavingOfMaxPct the first as a
	// percentage of the second.
	SavingPct      float64 `json:"saving_pct"`
	MaxSavingPct   float64 `json:"max_saving_pct"`
	SavingOfMaxPct float64 `json:"saving_of_max_pct"`
	// NoDelayOracleUSD adds to the oracle what whole machines cost a policy that starts every
	// job on arrival (GoodputBoundPct's rounding, at the cheapest price per GPU-hour);
	// MaxSavingNoDelayPct is its saving against OnDemandWorkUSD, SavingOfNoDelayMaxPct
	// SavingPct as a percentage of it.
	NoDelayOracleUSD      float64 `json:"no_delay_oracle_usd"`
	MaxSavingNoDelayPct   float64 `json:"max_saving_no_delay_pct"`
	SavingOfNoDelayMaxPct float64 `json:"saving_of_no_delay_max_pct"`
	// GoodputPct is useful GPU-hours (the jobs' work) over paid GPU-hours.
	GoodputPct float64 `json:"goodput_pct"`
	// GoodputBoundPct is the best goodput of any policy that starts every job when it
	// arrives: whole machines, no launch paid, no idle machine, free moves.
	GoodputBoundPct float64 `json:"goodput_bound_pct"`
	UsefulGPUHours  float64 `json:"useful_gpu_hours"`
	PaidGPUHours    float64 `json:"paid_gpu_hours"`
	// Paid GPU-hours that are not useful, by cause: machines launching (paid before they are
	// ready), cards on ready machines that no job held (idle machines and free cards of busy
	// ones), and cards jobs held without keeping the work (lost progress, checkpoints
	// written on request, restores).
	LaunchingGPUHours float64 `json:"launching_gpu_hours"`
	UnusedGPUHours    float64 `json:"unused_gpu_hours"`
	// Of the unused GPU-hours: on machines hosting no job (idle, draining or noticed), and
	// the free cards of machines hosting some.
	IdleGPUHours     float64 `json:"idle_gpu_hours"`
	FreeCardGPUHours float64 `json:"free_card_gpu_hours"`
	LostGPUHours     float64 `json:"lost_gpu_hours"`
	QueueDelayMeanS  float64 `json:"queue_delay_s"`
	QueueDelayP99S   float64 `json:"queue_delay_p99_s"`
	Interruptions    int     `json:"interruptions"`
	// CheckpointsSaved counts checkpoints on request written in time; CheckpointsMissed
	// those that did not fit their deadline (the job fell back to its last periodic one).
	CheckpointsSaved  int     `json:"checkpoints_saved"`
	CheckpointsMissed int     `json:"checkpoints_missed"`
	MachinesLaunched  int     `json:"machines_launched"`
	SpotShare         float64 `json:"spot_machine_hours_pct"`
	MakespanH         float64 `json:"makespan_h"`
	Unfinished        int     `json:"unfinished"`
}

// newScaler builds a policy.
func newScaler(name string, set *pools.Set, opt Options) (scaler, error) {
	switch name {
	case "static":
		return staticScaler{}, nil
	case "ray":
		return &rayScaler{cfg: opt.Ray}, nil
	case "kueue":
		return newKueue(opt.Kueue, set), nil
	case "atoll":
		return newAtoll(name, opt.Atoll, false, false)
	case "atoll-predict":
		return newAtoll(name, opt.Atoll, true, false)
	case "atoll-on-demand":
		return newAtoll(name, opt.Atoll, false, true)
	}
	return nil, fmt.Errorf("poolsim: policy %q: want one of %v", name, Policies())
}

// Run replays the jobs on the pools under every policy (the static reference always runs;
// it is returned only when asked for or when Policies is empty).
func Run(ctx context.Context, jobs []Job, set *pools.Set, opt Options) ([]Result, error) {
	if len(jobs) == 0 {
		return nil, fmt.Errorf("poolsim: no jobs")
	}
	if err := opt.Validate(); err != nil {
		return nil, err
	}
	b, err := boundsOf(jobs, set)
	if err != nil {
		return nil, err
	}
	names := opt.Policies
	if len(names) == 0 {
		names = Policies()
	}
	if !slices.Contains(names, "static") {
		names = append([]string{"static"}, names...) // the reference
	}
	var out []Result
	var ref float64
	for _, name := range names {
		r, err := replay(ctx, jobs, set, opt, name)
		if err != nil {
			return nil, err
		}
		if name == "static" {
			ref = r.Cost
		}
		out = append(out, r)
	}
	for i := range out {
		r := &out[i]
		if ref > 0 {
			r.CostVsOnDemandPct = 100 * r.Cost / ref
		}
		b.fill(r)
		r.Seed = opt.Seed
	}
	if !slices.Contains(opt.Policies, "static") && len(opt.Policies) > 0 {
		out = out[1:]
	}
	return out, nil
}

func replay(ctx context.Context, jobs []Job, set *pools.Set, opt Options, name string) (Result, error) {
	sc, err := newScaler(name, set, opt)
	if err != nil {
		return Result{}, err
	}
	w := newWorld(jobs, set, opt, sc)
	if err := w.run(ctx); err != nil {
		return w.res, err
	}
	w.finish()
	return w.res, nil
}
