package sim

import (
	"container/heap"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/atoll-run/atoll/gang"
)

// Strategies are the placement strategies DynamicOptions.Strategy takes.
var Strategies = []gang.Strategy{gang.StrategyPack, gang.StrategySpread, gang.StrategyStrictPack, gang.StrategyStrictSpread}

// DynamicPolicies are the policies of the dynamic mode, baselines first; "srtf" is the
// oracle reference (it is given every job's run time in every information setting).
var DynamicPolicies = []string{"fifo", "volcano", "kueue", "tiresias", "srtf", "atoll"}

// Priority classes assigned to traces without priorities.
const (
	PrioLow    = 0
	PrioNormal = 1
	PrioHigh   = 2
)

// Job is one trace job.
type Job struct {
	ID       string
	Submit   time.Duration // from the start of the trace
	Duration time.Duration // at GPUs
	// TimeLimit is the user's limit on the job's run time (at GPUs) in the estimate
	// setting (AssignTimeLimits); 0 otherwise.
	TimeLimit time.Duration
	GPUs      int
	// MinGPUs, when positive, makes the job elastic: it runs on MinGPUs..GPUs one-GPU
	// members, its work (Duration × GPUs GPU-seconds) scaling linearly with them.
	MinGPUs  int
	Priority int
	// Strategy spreads or packs its one-GPU members over machines (AssignStrategy).
	Strategy gang.Strategy
	Line     int
}

// LoadJobs reads an ITP (job_id,submission_time,duration,num_gpu) or Philly RFold
// (#job id,arrival time (sec),topology,shape,size,duration (sec)) job trace; the format is
// detected from the header.
func LoadJobs(path string, skipBad bool, sk *Skipper) ([]Job, string, error) {
	t, err := readTable(path, skipBad, sk.add)
	if err != nil {
		return nil, "", err
	}
	var format, idCol, subCol, durCol, gpuCol string
	switch {
	case has(t, "job_id", "submission_time", "duration", "num_gpu"):
		format, idCol, subCol, durCol, gpuCol = "itp", "job_id", "submission_time", "duration", "num_gpu"
	case has(t, "job id", "arrival time (sec)", "size", "duration (sec)"):
		format, idCol, subCol, durCol, gpuCol = "philly", "job id", "arrival time (sec)", "duration (sec)", "size"
	default:
		return nil, "", fmt.Errorf("sim: %s: header %v is neither ITP (job_id,submission_time,duration,num_gpu) nor Philly (#job id,arrival time (sec),topology,shape,size,duration (sec)): %w",
			path, t.header, ErrBadHeader)
	}
	var jobs []Job
	for i := range t.rows {
		sub, err1 := t.num(i, subCol, math.NaN())
		dur, err2 := t.num(i, durCol, math.NaN())
		g, err3 := t.num(i, gpuCol, math.NaN())
		err := firstErr(err1, err2, err3)
		if err == nil && (math.IsNaN(sub) || math.IsNaN(dur) || math.IsNaN(g)) {
			err = t.rowErr(i, subCol+"/"+durCol+"/"+gpuCol, strings.Join(t.rows[i], ","), "empty value")
		}
		if err == nil {
			err = firstErr(t.bounded(i, gpuCol, g, 1, MaxJobGPUs, true),
				t.bounded(i, subCol, sub, 0, MaxTraceSeconds, false),
				t.bounded(i, durCol, dur, 0, MaxTraceSeconds, false))
		}
		if err != nil {
			if skipBad {
				sk.add(err)
				continue
			}
			return nil, "", err
		}
		jobs = append(jobs, Job{ID: t.str(i, idCol), Submit: secs(sub), Duration: max(secs(dur), time.Second), GPUs: int(g), Line: t.lines[i]})
	}
	sort.SliceStable(jobs, func(i, j int) bool { return jobs[i].Submit < jobs[j].Submit })
	return jobs, format, nil
}

func has(t *table, cols ...string) bool {
	for _, c := range cols {
		if _, ok := t.col[c]; !ok {
			return false
		}
	}
	return true
}

func secs(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// AssignPriorities gives each job a priority class, seeded: 20% high, 50% normal, 30% low,
// independent of size and duration (the traces carry no priorities).
func AssignPriorities(jobs []Job, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 0xa5a5))
	for i := range jobs {
		switch u := rng.Float64(); {
		case u < 0.2:
			jobs[i].Priority = PrioHigh
		case u < 0.7:
			jobs[i].Priority = PrioNormal
		default:
			jobs[i].Priority = PrioLow
		}
	}
}

// MakeElastic makes a seeded share of the multi-GPU jobs elastic (MinGPUs = ceil(GPUs/2)).
func MakeElastic(jobs []Job, share float64, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 0xe1a5))
	for i := range jobs {
		if u := rng.Float64(); jobs[i].GPUs >= 2 && u < share {
			jobs[i].MinGPUs = (jobs[i].GPUs + 1) / 2
		}
	}
}

// AssignStrategy gives a seeded share of the multi-GPU jobs that are not elastic the
// placement strategy s.
func AssignStrategy(jobs []Job, s gang.Strategy, share float64, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 0x5b7ead))
	for i := range jobs {
		if u := rng.Float64(); jobs[i].GPUs >= 2 && jobs[i].MinGPUs == 0 && u < share {
			jobs[i].Strategy = s
		}
	}
}

// Saturate compresses the arrival times of jobs (sorted by submission) so that the work
// they offer over the arrival window is load times the cluster's GPU-time in it, and
// returns the compression factor (1 when the trace already offers that much).
func Saturate(jobs []Job, snap gang.Snapshot, load float64) float64 {
	gpus := 0
	for _, n := range snap.Nodes {
		gpus += len(n.GPUs)
	}
	if len(jobs) < 2 || gpus == 0 {
		return 1
	}
	span := (jobs[len(jobs)-1].Submit - jobs[0].Submit).Seconds()
	var work float64
	for _, j := range jobs {
		work += float64(j.GPUs) * j.Duration.Seconds()
	}
	if span <= 0 || work <= 0 {
		return 1
	}
	k := load * float64(gpus) * span / work
	if k <= 1 {
		return 1
	}
	compress(jobs, k)
	return k
}

// saturateUntilBusy compresses the arrivals so that the offered work is load times the
// cluster's (Saturate), then doubles the compression, at most twice, until a FIFO
// replay finds the queue empty during at most 1% of the arrival window.
func saturateUntilBusy(ctx context.Context, jobs []Job, snap gang.Snapshot, model gang.CollectiveModel, load float64) ([]Job, float64, error) {
	orig := append([]Job(nil), jobs...)
	k := Saturate(jobs, snap, load)
	for i := 0; ; i++ {
		r, err := runPolicy(ctx, "fifo", InfoBlind, jobs, snap, model)
		if err != nil {
			return nil, 0, err
		}
		if r.QueueEmptyPct <= 1 || i == 2 {
			break
		}
		k *= 2
		jobs = compress(append(jobs[:0:0], orig...), k)
	}
	return jobs, k, nil
}

// compress divides the arrival times (after the first) by k.
func compress(jobs []Job, k float64) []Job {
	first := jobs[0].Submit
	for i := range jobs {
		jobs[i].Submit = first + time.Duration(float64(jobs[i].Submit-first)/k)
	}
	return jobs
}

// DynamicOptions configure the dynamic mode.
type DynamicOptions struct {
	// Info is what every policy is told of run times: InfoBlind, InfoEstimate (the
	// default: "" reads as it) or InfoOracle (estimate.go).
	Info         string
	MaxJobs      int           // first N jobs (0 = all)
	Window       time.Duration // jobs submitted within Window of the first (0 = all)
	PrioritySeed uint64        // seeds the priority classes and the elastic jobs
	Policies     []string
	// ElasticShare makes that share of the multi-GPU jobs elastic (seeded): they run on
	// ceil(GPUs/2)..GPUs members, their work scaling linearly with the members.
	ElasticShare float64
	// Strategy is given to StrategyShare of the multi-GPU jobs that are not elastic
	// (seeded): their one-GPU members are spread or packed over machines by the core's
	// strategy plugins.
	Strategy      gang.Strategy
	StrategyShare float64
	// SaturateLoad, when positive, compresses the arrival times (never stretches them) so
	// that the work offered over the arrival window is SaturateLoad times what the
	// cluster can do in it, then further (doubling, at most twice) until a FIFO replay
	// finds the queue empty during at most 1% of the window: utilisation differences
	// between policies then show (result fields arrival_compression, queue_empty_pct).
	SaturateLoad float64
	// Weights, when set, replace the atoll policy's tunable weights (atoll tune).
	Weights *gang.SchedulerWeights
	// ClassOnly, when set ("high", "normal" or "low"), replays only the jobs of that
	// priority class after the seeded assignment: what the class alone asks of the cluster,
	// as if every other class gave way at no cost (a bound on the class's queueing under
	// any policy that does not time-slice it).
	ClassOnly string
}

// Bounds of the dynamic options and the trace values (checked by Validate and the
// parsers).
const (
	MaxTraceJobs     = 10_000_000 // rows of one trace
	MaxJobGPUs       = 100_000    // GPUs of one job
	MaxTraceSeconds  = 10 * 365 * 24 * 3600.0
	MaxSaturateLoad  = 100.0
	MaxClusterGPUs   = 1_000_000
	MaxMachineGPUs   = 64
	MaxMachineCPU    = 100_000_000 // milli-CPU of one machine (100,000 cores)
	MaxMachineMemMiB = 1 << 40     // MiB of one machine
)

// info is the information setting, InfoEstimate when none is given.
func (o DynamicOptions) info() string {
	if o.Info == "" {
		return InfoEstimate
	}
	return o.Info
}

// Validate checks the options against their bounds.
func (o DynamicOptions) Validate() error {
	switch {
	case o.Info != "" && !slices.Contains(Infos, o.Info):
		return fmt.Errorf("sim: info %q: want one of %s: %w", o.Info, strings.Join(Infos, ", "), ErrBadSpec)
	case o.MaxJobs < 0 || o.MaxJobs > MaxTraceJobs:
		return fmt.Errorf("sim: max jobs %d outside [0, %d]: %w", o.MaxJobs, MaxTraceJobs, ErrBadSpec)
	case o.Window < 0:
		return fmt.Errorf("sim: window %s is negative: %w", o.Window, ErrBadSpec)
	case !(o.ElasticShare >= 0 && o.ElasticShare <= 1):
		return fmt.Errorf("sim: elastic share %v outside [0, 1]: %w", o.ElasticShare, ErrBadSpec)
	case !(o.StrategyShare >= 0 && o.StrategyShare <= 1):
		return fmt.Errorf("sim: strategy share %v outside [0, 1]: %w", o.StrategyShare, ErrBadSpec)
	case o.StrategyShare > 0 && !slices.Contains(Strategies, o.Strategy):
		return fmt.Errorf("sim: strategy %q: want one of %q: %w", o.Strategy, Strategies, ErrBadSpec)
	case !(o.SaturateLoad >= 0 && o.SaturateLoad <= MaxSaturateLoad):
		return fmt.Errorf("sim: saturate load %v outside [0, %v]: %w", o.SaturateLoad, MaxSaturateLoad, ErrBadSpec)
	case o.ClassOnly != "" && !slices.Contains([]string{ClassName(PrioHigh), ClassName(PrioNormal), ClassName(PrioLow)}, o.ClassOnly):
		return fmt.Errorf("sim: class %q: want high, normal or low: %w", o.ClassOnly, ErrBadSpec)
	}
	for _, p := range o.Policies {
		if _, _, err := PolicyConfig(p); err != nil {
			return err
		}
	}
	if o.Weights != nil {
		return o.Weights.Validate()
	}
	return nil
}

// Stats are summary statistics in seconds.
type Stats struct {
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P99  float64 `json:"p99"`
}

// DynamicResult is one policy's outcome on a trace.
type DynamicResult struct {
	Policy string `json:"policy"`
	// Info is the information setting the run was given (InfoBlind, ...); "srtf" is
	// given true run times whatever it says.
	Info               string  `json:"info"`
	UtilPct            float64 `json:"util_pct"`
	QueueDelay         Stats   `json:"queue_delay_s"`
	HighPrioQueueDelay Stats   `json:"high_prio_queue_delay_s"`
	JCT                Stats   `json:"jct_s"`
	AllReduce          Stats   `json:"allreduce_time_s"`
	Preemptions        int     `json:"preemptions"`
	LostGPUHours       float64 `json:"lost_gpu_hours"`
	MakespanS          float64 `json:"makespan_s"`
	Jobs               int     `json:"jobs"`
	Rejected           int     `json:"rejected"`
	MultiGPUPlacements int     `json:"multi_gpu_placements"`
	MeanMachines       float64 `json:"mean_machines_per_multi_gpu_job"`

	// JCTByClass and QueueDelayByClass split jct_s and queue_delay_s by priority class
	// ("high", "normal", "low").
	JCTByClass        map[string]Stats `json:"jct_by_class_s"`
	QueueDelayByClass map[string]Stats `json:"queue_delay_by_class_s"`
	// PreemptionsByCause counts evictions by the preemption's reason.
	PreemptionsByCause map[string]int `json:"preemptions_by_cause"`
	// PreemptionRounds counts the preemption decisions (one preemptor in one cycle, with
	// one or more victims); PreemptorsStarted how many of them placed their preemptor on
	// the capacity freed for it.
	PreemptionRounds  int `json:"preemption_rounds"`
	PreemptorsStarted int `json:"preemptors_started"`
	// EvictedMoreThanOnce counts jobs preempted twice or more.
	EvictedMoreThanOnce int `json:"evicted_more_than_once"`
	// ArrivalCompression is the factor arrival times were divided by (saturated mode).
	ArrivalCompression float64 `json:"arrival_compression"`
	// QueueEmptyPct is the share of the arrival window with no job waiting.
	QueueEmptyPct float64 `json:"queue_empty_pct"`
	// LostPct is lost_gpu_hours over the GPU-hours allocated, in percent.
	LostPct float64 `json:"lost_pct"`
	// Grows and Shrinks count resizes of elastic jobs (DynamicOptions.ElasticShare).
	Grows   int `json:"grows"`
	Shrinks int `json:"shrinks"`
	// GoodputPct is the useful GPU-time (each job's trace duration times its GPUs) over the
	// GPU-time allocated from the first arrival to the last completion, in percent.
	GoodputPct float64 `json:"goodput_pct"`
	// WaitHoursByReason sums the job-hours spent waiting by the scheduler's reason
	// (gang.WaitKind names); HighPrioWaitHoursByReason the same for high-priority jobs.
	WaitHoursByReason         map[string]float64 `json:"wait_hours_by_reason"`
	HighPrioWaitHoursByReason map[string]float64 `json:"high_prio_wait_hours_by_reason"`
}

// ClassName names a priority class of the simulator.
func ClassName(p int) string {
	switch p {
	case PrioHigh:
		return "high"
	case PrioNormal:
		return "normal"
	case PrioLow:
		return "low"
	}
	return fmt.Sprintf("p%d", p)
}

// Declared per-member facts of trace jobs (the traces carry none): 4 cores and 32 GiB per
// GPU; checkpoints every 30 minutes and just in time when preempted (save 30 s, restore
// 60 s); CUDA context and communicator costs come from the scheduler's cost model.
var (
	jobCPUPerGPU = int64(4000)
	jobMemPerGPU = int64(32 << 10)
	jobCkpt      = gang.Checkpoint{Interval: 30 * time.Minute, Save: 30 * time.Second, Restore: 60 * time.Second, JustInTime: true}
)

// PolicyConfig returns the core configuration and blind policy of a dynamic-mode policy.
// The baselines are configurations of the same core:
//   - fifo: strict arrival order, first fit, no priorities, preemption or backfill;
//   - volcano: gang + priority classes + DRF order + binpack, topology-blind, no
//     reservation, no preemption;
//   - kueue: quota admission (BestEffortFIFO by priority), kube-scheduler-like spreading;
//   - tiresias: Tiresias' discretized two-queue least attained service (GPU-seconds,
//     threshold Config.LASThreshold) with its preemption (a gang of the first queue evicts
//     gangs demoted to the second), consolidated (binpack) placement, no job-size
//     knowledge, no priority classes;
//   - srtf: the oracle: shortest expected remaining GPU-time first, from the exact
//     durations, preempting gangs with more work left; no priority classes;
//   - atoll: the defaults (gang.DefaultConfig).
func PolicyConfig(policy string) (gang.Config, gang.BlindPolicy, error) {
	cfg := gang.DefaultConfig()
	blindBaseline := func() {
		cfg.Predict.Enabled = false // none of them learns run times
		cfg.TopologyAware = false
		cfg.Preemption, cfg.FairShareReclaim, cfg.Backfill = false, false, false
		cfg.AgingStep, cfg.RemainingAging = 0, 0
		cfg.Preempt.StarvationWait = 0
	}
	switch policy {
	case "atoll":
		return cfg, gang.BlindBinpack, nil
	case "fifo":
		blindBaseline()
		cfg.StrictFIFO = true
		cfg.Weights = gang.Weights{}
		return cfg, gang.BlindFirstFit, nil
	case "volcano":
		blindBaseline()
		cfg.Plugins.QueueSort = gang.PluginPriority
		cfg.Weights = gang.Weights{Binpack: 1}
		return cfg, gang.BlindBinpack, nil
	case "kueue":
		blindBaseline()
		cfg.Plugins.QueueSort = gang.PluginPriority
		cfg.QuotaAdmission = true
		cfg.Weights = gang.Weights{}
		return cfg, gang.BlindSpread, nil
	case "tiresias", "srtf":
		blindBaseline()
		cfg.Weights = gang.Weights{Binpack: 1}
		cfg.Preemption, cfg.MinRunBeforePreempt = true, 0
		cfg.Plugins.QueueSort, cfg.Plugins.PostFilter = gang.PluginLAS, []string{gang.PluginLASPreemption}
		if policy == "srtf" {
			cfg.Plugins.QueueSort, cfg.Plugins.PostFilter = gang.PluginSRTF, []string{gang.PluginSRTFPreemption}
		}
		return cfg, gang.BlindBinpack, nil
	}
	return cfg, 0, fmt.Errorf("sim: unknown dynamic policy %q (want one of %v): %w", policy, DynamicPolicies, ErrBadSpec)
}

// RunDynamicFiles loads a job trace and a cluster and runs every policy.
func RunDynamicFiles(ctx context.Context, jobsPath, clusterSpec string, skipBad bool, sk *Skipper, opt DynamicOptions) ([]DynamicResult, error) {
	jobs, _, err := LoadJobs(jobsPath, skipBad, sk)
	if err != nil {
		return nil, err
	}
	snap, model, _, err := LoadCluster(clusterSpec, skipBad, sk)
	if err != nil {
		return nil, err
	}
	return RunDynamic(ctx, jobs, snap, model, opt)
}

// RunDynamic replays jobs (arrivals and completions) on the cluster for each policy.
func RunDynamic(ctx context.Context, jobs []Job, snap gang.Snapshot, model gang.CollectiveModel, opt DynamicOptions) ([]DynamicResult, error) {
	jobs, compression, err := prepareJobs(ctx, jobs, snap, model, opt)
	if err != nil {
		return nil, err
	}
	pols := opt.Policies
	if pols == nil {
		pols = DynamicPolicies
	}
	var out []DynamicResult
	for _, p := range pols {
		cfg, blind, err := opt.policyConfig(p)
		if err != nil {
			return nil, err
		}
		r, err := runConfig(ctx, p, opt.info(), cfg, blind, jobs, snap, model)
		if err != nil {
			return nil, err
		}
		r.ArrivalCompression = round2(compression)
		out = append(out, r)
	}
	return out, nil
}

// policyConfig is PolicyConfig with the options' weights (Weights) set on the atoll
// policy.
func (o DynamicOptions) policyConfig(policy string) (gang.Config, gang.BlindPolicy, error) {
	cfg, blind, err := PolicyConfig(policy)
	if err == nil && policy == "atoll" && o.Weights != nil {
		o.Weights.Apply(&cfg)
	}
	return cfg, blind, err
}

// prepareJobs validates the options and returns the jobs as every policy replays them:
// the window and the first MaxJobs, priority classes, time limits (estimate setting),
// elastic jobs, placement strategies and the saturated arrivals, with the compression.
func prepareJobs(ctx context.Context, jobs []Job, snap gang.Snapshot, model gang.CollectiveModel, opt DynamicOptions) ([]Job, float64, error) {
	if err := opt.Validate(); err != nil {
		return nil, 0, err
	}
	if len(jobs) == 0 {
		return nil, 0, fmt.Errorf("sim: no jobs: %w", ErrBadSpec)
	}
	jobs = append([]Job(nil), jobs...)
	if opt.Window > 0 {
		end := jobs[0].Submit + opt.Window
		k := sort.Search(len(jobs), func(i int) bool { return jobs[i].Submit > end })
		jobs = jobs[:k]
	}
	if opt.MaxJobs > 0 && len(jobs) > opt.MaxJobs {
		jobs = jobs[:opt.MaxJobs]
	}
	AssignPriorities(jobs, opt.PrioritySeed)
	if opt.info() == InfoEstimate {
		if err := AssignTimeLimits(jobs, DefaultEstimateModel(), opt.PrioritySeed); err != nil {
			return nil, 0, err
		}
	}
	if opt.ElasticShare > 0 {
		MakeElastic(jobs, opt.ElasticShare, opt.PrioritySeed)
	}
	if opt.StrategyShare > 0 {
		AssignStrategy(jobs, opt.Strategy, opt.StrategyShare, opt.PrioritySeed)
	}
	if opt.ClassOnly != "" {
		jobs = slices.DeleteFunc(jobs, func(j Job) bool { return ClassName(j.Priority) != opt.ClassOnly })
		if len(jobs) == 0 {
			return nil, 0, fmt.Errorf("sim: no job of class %q in the slice: %w", opt.ClassOnly, ErrBadSpec)
		}
	}
	compression := 1.0
	if opt.SaturateLoad > 0 {
		var err error
		if jobs, compression, err = saturateUntilBusy(ctx, jobs, snap, model, opt.SaturateLoad); err != nil {
			return nil, 0, err
		}
	}
	return jobs, compression, nil
}

type evKind int

const (
	evArrive evKind = iota
	evWake
	evFinish
	evShrink
	evEvict
	evTick    // the service autoscaler's interval (mixed mode)
	evReady   // a service replica has loaded its model
	evDrained // a draining replica's batch is empty
	evSvcStop // a preempted replica stops
)

type event struct {
	at    time.Duration
	kind  evKind
	job   int
	gen   int
	seq   int
	to    int           // evShrink: the new size
	pause time.Duration // evShrink: the communicator set-up of the survivors
	rep   *replica      // evReady, evDrained, evSvcStop
}

type eventQ []event

func (q eventQ) Len() int { return len(q) }
func (q eventQ) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	if q[i].kind != q[j].kind {
		return q[i].kind > q[j].kind // finishes and evictions before arrivals at the same time
	}
	return q[i].seq < q[j].seq
}
func (q eventQ) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *eventQ) Push(x any)   { *q = append(*q, x.(event)) }
func (q *eventQ) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

type jobRun struct {
	kept      time.Duration // run time the pending eviction's checkpoint holds
	restart   time.Duration // restore, CUDA context and communicator time of the eviction
	started   bool
	firstRun  time.Duration
	start     time.Duration
	remaining time.Duration
	gen       int
	running   bool
	done      time.Duration
	rejected  bool
	gpus      int // members (one GPU each) now
	evictions int
	resizes   int
}

func runPolicy(ctx context.Context, policy, info string, jobs []Job, snap gang.Snapshot, model gang.CollectiveModel) (DynamicResult, error) {
	cfg, blind, err := PolicyConfig(policy)
	if err != nil {
		return DynamicResult{Policy: policy}, err
	}
	return runConfig(ctx, policy, info, cfg, blind, jobs, snap, model)
}

// runConfig replays jobs under cfg, telling the scheduler what the information setting
// allows (JobRequest).
func runConfig(ctx context.Context, policy, info string, cfg gang.Config, blind gang.BlindPolicy, jobs []Job, snap gang.Snapshot, model gang.CollectiveModel) (DynamicResult, error) {
	r, err := replayJobs(ctx, policy, info, cfg, blind, jobs, snap, model)
	if err != nil {
		return DynamicResult{Policy: policy}, err
	}
	return r.res, nil
}

// Start is one placement of a job in a replay: when, and on which cards.
type Start struct {
	Job     int           // index into the jobs replayed
	At      time.Duration // from the start of the trace (the jobs' Submit clock)
	Members []gang.MemberPlacement
}

// ReplayConfig replays jobs (priorities, time limits and shapes as given) on the cluster
// under the core configuration cfg, each request saying what info allows (JobRequest),
// and returns the result with every placement in the order the cycles made them: the
// way to run the live head's configuration through the simulator.
func ReplayConfig(ctx context.Context, cfg gang.Config, blind gang.BlindPolicy, info string, jobs []Job, snap gang.Snapshot, model gang.CollectiveModel) (DynamicResult, []Start, error) {
	r, err := replayJobs(ctx, "config", info, cfg, blind, jobs, snap, model)
	if err != nil {
		return DynamicResult{}, nil, err
	}
	return r.res, r.starts, nil
}

// replayJobs is runConfig, returning the whole replay (each job's outcome in st).
func replayJobs(ctx context.Context, policy, info string, cfg gang.Config, blind gang.BlindPolicy, jobs []Job, snap gang.Snapshot, model gang.CollectiveModel) (*replay, error) {
	return replayJobsSvc(ctx, policy, info, cfg, blind, jobs, snap, model, nil)
}

// replayJobsSvc is replayJobs with an inference service beside the jobs (nil: none).
func replayJobsSvc(ctx context.Context, policy, info string, cfg gang.Config, blind gang.BlindPolicy, jobs []Job, snap gang.Snapshot, model gang.CollectiveModel, svc *serviceSide) (*replay, error) {
	if !slices.Contains(Infos, info) {
		return nil, fmt.Errorf("sim: info %q: want one of %s: %w", info, strings.Join(Infos, ", "), ErrBadSpec)
	}
	if policy == "srtf" {
		info = InfoOracle // the oracle reference
	}
	r := &replay{res: DynamicResult{Policy: policy, Info: info, Jobs: len(jobs)}, jobs: jobs, info: info, epoch: time.Unix(0, 0), idx: map[string]int{}}
	for _, n := range snap.Nodes {
		r.total += len(n.GPUs)
	}
	if cfg.QuotaAdmission {
		cfg.Queues[0].Quota = r.total
	}
	// Every job of the trace is accepted: the replay measures queueing, not backpressure.
	cfg.MaxPending = max(cfg.MaxPending, len(jobs)+1)
	if svc != nil {
		cfg.MaxPending += svc.spec.MaxReplicas
	}
	s, err := gang.New(cfg, snap, gang.WithCollectiveModel(model), gang.WithBlindPolicy(blind))
	if err != nil {
		return nil, err
	}
	r.s = s
	r.svc = svc
	if err := r.run(ctx); err != nil {
		return nil, err
	}
	r.summarize()
	return r, nil
}

// replay is one policy's run over the trace.
type replay struct {
	s     *gang.Scheduler
	res   DynamicResult
	jobs  []Job
	info  string
	st    []jobRun
	idx   map[string]int
	epoch time.Time
	total int
	q     eventQ
	seq   int
	wake  time.Duration // the earliest wake-up pushed and not yet passed

	busy, allocAll, useful float64 // GPU-seconds: allocated in the arrival window, allocated, useful
	empty                  float64 // seconds of the arrival window with nothing pending
	used                   int     // GPUs allocated now
	last, windowEnd        time.Duration
	arTimes                []float64
	machines               int
	starts                 []Start // every placement, in order

	svc      *serviceSide        // the inference service (mixed mode); nil otherwise
	svcByID  map[string]*replica // its replicas' gangs
	svcStart time.Duration       // replicas placed then serve at once (deployed before the trace)
}

func (r *replay) push(e event) {
	r.seq++
	e.seq = r.seq
	heap.Push(&r.q, e)
}

// advance accounts allocated GPU-time up to `to`.
func (r *replay) advance(to time.Duration) {
	if to <= r.last {
		return
	}
	a, b := r.last, min(to, r.windowEnd)
	if b > a {
		r.busy += float64(r.used) * (b - a).Seconds()
		if r.s.Pending() == 0 {
			r.empty += (b - a).Seconds()
		}
	}
	r.allocAll += float64(r.used) * (to - r.last).Seconds()
	r.last = to
}

func (r *replay) run(ctx context.Context) error {
	r.st = make([]jobRun, len(r.jobs))
	r.res.PreemptionsByCause = map[string]int{}
	r.res.WaitHoursByReason = map[string]float64{}
	r.res.HighPrioWaitHoursByReason = map[string]float64{}
	for i, j := range r.jobs {
		r.idx[fmt.Sprintf("j%d", i)] = i
		r.st[i].remaining = j.Duration
		r.st[i].gpus = j.GPUs
		r.push(event{at: j.Submit, kind: evArrive, job: i})
	}
	r.last = r.jobs[0].Submit
	r.windowEnd = r.jobs[len(r.jobs)-1].Submit
	if r.svc != nil {
		if err := r.startService(); err != nil {
			return err
		}
	}
	steps := 0
	for r.q.Len() > 0 {
		if steps++; steps%4096 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		now := r.q[0].at
		r.advance(now)
		if r.svc != nil {
			r.svc.held(now)
			r.svc.serve(now)
		}
		for r.q.Len() > 0 && r.q[0].at == now {
			if err := r.handle(heap.Pop(&r.q).(event), now); err != nil {
				return err
			}
		}
		for c := 0; c < 8; c++ {
			d := r.s.Cycle(r.epoch.Add(now))
			r.apply(d, now)
			if len(d.Placements) == 0 || r.s.Pending() == 0 {
				break
			}
		}
	}
	if r.s.Pending() > 0 {
		return fmt.Errorf("sim: %s: %d gangs still pending after the last event", r.res.Policy, r.s.Pending())
	}
	return nil
}

// handle carries out one event.
func (r *replay) handle(e event, now time.Duration) error {
	j := &r.st[e.job]
	job := r.jobs[e.job]
	id := fmt.Sprintf("j%d", e.job)
	at := r.epoch.Add(now)
	switch e.kind {
	case evArrive:
		if sst, _ := r.s.Submit(JobRequest(id, job, r.info), at); sst.State == gang.Rejected {
			j.rejected = true
			r.res.Rejected++
		}
	case evFinish:
		if e.gen != j.gen || !j.running {
			return nil
		}
		j.running = false
		j.done = now
		r.used -= j.gpus
		r.useful += float64(job.GPUs) * job.Duration.Seconds()
		if err := r.addWaits(id, e.job); err != nil {
			return err
		}
		return r.s.Complete(id, at) // its run time is history now, for the run-time predictor
	case evEvict:
		if e.gen != j.gen || !j.running {
			return nil
		}
		j.running = false
		j.gen++
		j.evictions++
		r.used -= j.gpus
		// The GPUs were held from the start to now; the checkpoint keeps j.kept of it;
		// restarting costs j.restart before any new progress.
		j.remaining -= j.kept
		j.remaining += j.restart
		if j.remaining < time.Second {
			j.remaining = time.Second
		}
		lost := (now - j.start - j.kept) + j.restart
		r.res.LostGPUHours += float64(j.gpus) * lost.Hours()
		return r.s.Evicted(id, at, true)
	case evShrink:
		if e.gen != j.gen || !j.running {
			return nil
		}
		r.resize(e.job, e.to, e.pause, now)
		return r.s.ResizeDone(id, at)
	case evTick, evReady, evDrained, evSvcStop:
		return r.handleService(e, now)
	}
	return nil
}

// JobRequest is the gang request of a trace job under an information setting: one-GPU
// members (elastic from MinGPUs to GPUs), the declared checkpoint costs, and what the
// setting tells of its run time: nothing (InfoBlind), its time limit (InfoEstimate) or its
// run time (InfoOracle).
func JobRequest(id string, job Job, info string) gang.Request {
	req := gang.Request{ID: id, Priority: job.Priority, Min: job.GPUs,
		Member:     gang.Member{GPUs: 1, CPUMilli: jobCPUPerGPU, MemMiB: jobMemPerGPU},
		Checkpoint: jobCkpt, Strategy: job.Strategy}
	if job.MinGPUs > 0 {
		req.Min, req.Max = job.MinGPUs, job.GPUs
	}
	switch info {
	case InfoEstimate:
		req.TimeLimit = job.TimeLimit
	case InfoOracle:
		req.Duration = job.Duration
	}
	return req
}

// resize changes a running elastic job to `to` members at now: its work scales with its
// members, and the survivors pause for the communicator set-up.
func (r *replay) resize(k, to int, pause time.Duration, now time.Duration) {
	j := &r.st[k]
	left := j.remaining - (now - j.start)
	work := left.Seconds() * float64(j.gpus) // member-seconds
	r.used += to - j.gpus
	r.res.LostGPUHours += float64(to) * pause.Hours()
	j.gpus = to
	j.start = now
	j.remaining = time.Duration(work/float64(to)*float64(time.Second)) + pause
	j.gen++
	j.resizes++
	r.push(event{at: now + j.remaining, kind: evFinish, job: k, gen: j.gen})
}

// apply carries out a cycle's decisions.
func (r *replay) apply(d gang.Decisions, now time.Duration) {
	for _, p := range d.Placements {
		if rp, ok := r.svcByID[p.Gang]; ok {
			r.placedReplica(rp, now)
			continue
		}
		k := r.idx[p.Gang]
		j := &r.st[k]
		if !j.started {
			j.started = true
			j.firstRun = now
		}
		if n := len(p.Members); n != j.gpus {
			// An elastic job admitted below Max runs longer, in proportion.
			j.remaining = time.Duration(float64(j.remaining) * float64(j.gpus) / float64(n))
			j.gpus = n
		}
		j.running = true
		j.start = now
		j.gen++
		r.used += j.gpus
		r.starts = append(r.starts, Start{Job: k, At: now, Members: p.Members})
		r.push(event{at: now + j.remaining, kind: evFinish, job: k, gen: j.gen})
		if len(p.Members) > 1 {
			r.arTimes = append(r.arTimes, p.AllReduce.Seconds())
			r.machines += p.Machines
		}
		if p.Preemptor {
			r.res.PreemptorsStarted++
		}
	}
	rounds := map[string]bool{}
	for _, pr := range d.Preemptions {
		if rp, ok := r.svcByID[pr.Victim]; ok {
			r.res.Preemptions++
			r.res.PreemptionsByCause["service replica ("+pr.Reason+")"]++
			r.push(event{at: pr.Deadline.Sub(r.epoch), kind: evSvcStop, rep: rp})
			continue
		}
		k := r.idx[pr.Victim]
		r.res.Preemptions++
		r.res.PreemptionsByCause[pr.Reason]++
		rounds[pr.For] = true
		v := &r.st[k]
		v.kept = max(0, pr.Costs.Kept.Sub(r.epoch)-v.start)
		v.restart = pr.Costs.Restore + pr.Costs.CUDAContext + pr.Costs.Communicator
		r.push(event{at: pr.Deadline.Sub(r.epoch), kind: evEvict, job: k, gen: v.gen})
	}
	for _, rz := range d.Resizes {
		k := r.idx[rz.Gang]
		pause := rz.Cost.Communicator
		if len(rz.Add) > 0 {
			// A grow is bound at once: the new members start, everyone re-forms the ring.
			r.resize(k, rz.To, pause, now)
			r.res.Grows++
			continue
		}
		r.res.Shrinks++
		r.res.PreemptionsByCause["shrink ("+rz.Cause+")"]++
		rounds[rz.For] = true
		r.push(event{at: rz.Deadline.Sub(r.epoch), kind: evShrink, job: k, gen: r.st[k].gen, to: rz.To, pause: pause})
	}
	r.res.PreemptionRounds += len(rounds)
	if !d.NextCycle.IsZero() && (r.wake == 0 || d.NextCycle.Sub(r.epoch) < r.wake || r.wake <= now) {
		r.wake = d.NextCycle.Sub(r.epoch)
		r.push(event{at: r.wake, kind: evWake})
	}
}

func (r *replay) addWaits(id string, k int) error {
	gs, err := r.s.GangStatus(id)
	if err != nil {
		return err
	}
	for kind, d := range gs.WaitedByKind {
		r.res.WaitHoursByReason[kind.String()] += d.Hours()
		if r.jobs[k].Priority == PrioHigh {
			r.res.HighPrioWaitHoursByReason[kind.String()] += d.Hours()
		}
	}
	return nil
}

// summarize fills the result's statistics.
func (r *replay) summarize() {
	res, jobs := &r.res, r.jobs
	var qd, hq, jct []float64
	jctBy, qdBy := map[string][]float64{}, map[string][]float64{}
	var end time.Duration
	for i, j := range r.st {
		if j.rejected {
			continue
		}
		c := ClassName(jobs[i].Priority)
		q, t := (j.firstRun - jobs[i].Submit).Seconds(), (j.done - jobs[i].Submit).Seconds()
		qd = append(qd, q)
		qdBy[c] = append(qdBy[c], q)
		if jobs[i].Priority == PrioHigh {
			hq = append(hq, q)
		}
		jct = append(jct, t)
		jctBy[c] = append(jctBy[c], t)
		end = max(end, j.done)
		if j.evictions > 1 {
			res.EvictedMoreThanOnce++
		}
	}
	res.JCTByClass, res.QueueDelayByClass = map[string]Stats{}, map[string]Stats{}
	for c, xs := range jctBy {
		res.JCTByClass[c] = stats(xs)
		res.QueueDelayByClass[c] = stats(qdBy[c])
	}
	if r.allocAll > 0 {
		res.GoodputPct = round2(100 * r.useful / r.allocAll)
		res.LostPct = round2(100 * res.LostGPUHours * 3600 / r.allocAll)
	}
	for k, v := range res.WaitHoursByReason {
		res.WaitHoursByReason[k] = round2(v)
	}
	for k, v := range res.HighPrioWaitHoursByReason {
		res.HighPrioWaitHoursByReason[k] = round2(v)
	}
	res.QueueDelay = stats(qd)
	res.HighPrioQueueDelay = stats(hq)
	res.JCT = stats(jct)
	res.AllReduce = statsPrec(r.arTimes, 1e6) // microseconds: NVLink AllReduces take a few ms
	res.MultiGPUPlacements = len(r.arTimes)
	if len(r.arTimes) > 0 {
		res.MeanMachines = round2(float64(r.machines) / float64(len(r.arTimes)))
	}
	res.MakespanS = (end - jobs[0].Submit).Seconds()
	if w := (r.windowEnd - jobs[0].Submit).Seconds(); w > 0 && r.total > 0 {
		res.UtilPct = round2(100 * r.busy / (w * float64(r.total)))
		res.QueueEmptyPct = round2(100 * r.empty / w)
	}
	res.LostGPUHours = round2(res.LostGPUHours)
}

func stats(xs []float64) Stats { return statsPrec(xs, 1000) }

// statsPrec summarises xs, rounded to 1/prec.
func statsPrec(xs []float64, prec float64) Stats {
	if len(xs) == 0 {
		return Stats{}
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	var sum float64
	for _, x := range s {
		sum += x
	}
	pct := func(q float64) float64 { return s[int(q*float64(len(s)-1))] }
	r := func(x float64) float64 { return math.Round(x*prec) / prec }
	return Stats{Mean: r(sum / float64(len(s))), P50: r(pct(0.5)), P99: r(pct(0.99))}
}
