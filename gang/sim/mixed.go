package sim

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/atoll-run/atoll/gang"
)

// MixedPolicies are the policies of the mixed mode (training beside an inference
// service), baselines first:
//   - static: dedicated inference machines sized for the peak (the fewest replicas that
//     meet the SLO target on the whole inference replay alone), training on the rest under
//     the atoll configuration;
//   - volcano: the service's replicas are a higher priority class on the shared cluster,
//     scaled by the autoscaler; preemption as Volcano's preempt and reclaim actions do it
//     (docs/scheduler.md): lower-priority work is evicted whenever that frees room, with
//     no weighing of what the eviction costs and no guard for young gangs;
//   - atoll: the same autoscaler and priority class under the atoll configuration:
//     elastic training is shrunk before anyone is evicted, evictions are checkpointed and
//     must pay for themselves (the live head's cost model), and scale-down gives the GPUs
//     back to the training queue.
var MixedPolicies = []string{"static", "volcano", "atoll"}

// PrioService is the priority class of inference replicas: above every training class.
const PrioService = PrioHigh + 1

// MixedOptions configure the mixed mode.
type MixedOptions struct {
	// Training is the training side's options (information setting, slice, elastic
	// share, saturation, weights); its Policies are ignored.
	Training  DynamicOptions
	Policies  []string // default MixedPolicies
	Service   ServiceSpec
	Model     ReplicaModel
	Autoscale AutoscaleConfig
	Load      InferenceLoad
	// SLOTargetPct sizes the static split: the fewest replicas whose SLO attainment on
	// the inference replay alone reaches it (default 99.9).
	SLOTargetPct float64
}

// DefaultMixedOptions returns the options docs/scheduler.md states.
func DefaultMixedOptions() MixedOptions {
	return MixedOptions{Service: DefaultServiceSpec(), Model: DefaultReplicaModel(), Autoscale: DefaultAutoscaleConfig(),
		Load: InferenceLoad{Scale: 10, Diurnal: 0.5, Seed: 1}, SLOTargetPct: 99.9}
}

// Validate checks the options.
func (o MixedOptions) Validate() error {
	t := o.Training
	t.Policies = nil
	if err := t.Validate(); err != nil {
		return err
	}
	for _, p := range o.Policies {
		if !slices.Contains(MixedPolicies, p) {
			return fmt.Errorf("sim: unknown mixed policy %q (want one of %s): %w", p, strings.Join(MixedPolicies, ", "), ErrBadSpec)
		}
	}
	if !(o.SLOTargetPct > 0 && o.SLOTargetPct <= 100) {
		return fmt.Errorf("sim: SLO target %v%% outside (0, 100]: %w", o.SLOTargetPct, ErrBadSpec)
	}
	for _, err := range []error{o.Service.Validate(), o.Model.Validate(), o.Autoscale.Validate(), o.Load.Validate()} {
		if err != nil {
			return err
		}
	}
	return nil
}

// MixedResult is one policy's outcome on the training trace and the inference service.
type MixedResult struct {
	Policy string `json:"policy"`
	Info   string `json:"info"`
	// InferenceSLOAttainmentPct is the share of requests whose time to first token was
	// within the service's latency SLO.
	InferenceSLOAttainmentPct float64 `json:"inference_slo_attainment_pct"`
	TrainingJCT               Stats   `json:"training_jct_s"`
	HighPrioQueueDelay        Stats   `json:"high_prio_queue_delay_s"`
	// UtilisationPct is the GPU-time doing work over the cluster's, in the training
	// trace's arrival window: training gangs' allocations, and replicas' GPUs times the
	// share of their batch slots in use (a replica serving a full batch does its GPUs'
	// full work; one serving a single request does 1/Batch of it).
	UtilisationPct float64 `json:"utilisation_pct"`
	// AllocatedPct counts replicas' GPUs whenever they are held, serving or not;
	// BusyAnyPct whenever they serve at least one request.
	AllocatedPct       float64        `json:"allocated_pct"`
	BusyAnyPct         float64        `json:"busy_any_pct"`
	TrainingUtilPct    float64        `json:"training_util_pct"`
	InferenceWorkPct   float64        `json:"inference_work_pct"`
	Requests           int            `json:"requests"`
	TTFTP99            float64        `json:"ttft_p99_s"`
	E2EMax             float64        `json:"e2e_latency_max_s"`
	DedicatedGPUs      int            `json:"dedicated_inference_gpus"`
	PeakReplicas       int            `json:"peak_replicas"`
	ScaleUps           int            `json:"scale_ups"`
	ScaleDowns         int            `json:"scale_downs"`
	ScaleUpDelay       Stats          `json:"scale_up_delay_s"`
	Preemptions        int            `json:"preemptions"`
	PreemptionsByCause map[string]int `json:"preemptions_by_cause"`
	Shrinks            int            `json:"shrinks"`
	LostGPUHours       float64        `json:"lost_gpu_hours"`
	ArrivalCompression float64        `json:"arrival_compression"`
	// UtilisationGainBoundPts is the run's bound on any policy's utilisation gain over the
	// static split, 100 minus the static split's UtilisationPct (every policy serves the
	// same inference work, so a gain can only fill what the split leaves idle: its
	// replicas' free batch slots and its training partition's unallocated GPUs); the same
	// in every result, and absent when the static policy did not run.
	UtilisationGainBoundPts *float64 `json:"utilisation_gain_bound_pts,omitempty"`
	Jobs                    int      `json:"jobs"`
}

// RunMixed replays jobs beside the inference service driven by reqs (mapped onto the
// training trace's arrival window by opt.Load) for each policy.
func RunMixed(ctx context.Context, jobs []Job, reqs []InferenceRequest, snap gang.Snapshot, model gang.CollectiveModel, opt MixedOptions) ([]MixedResult, error) {
	if err := opt.Validate(); err != nil {
		return nil, err
	}
	if len(reqs) == 0 {
		return nil, fmt.Errorf("sim: no inference requests: %w", ErrBadSpec)
	}
	if err := machinesHold(snap, opt.Service); err != nil {
		return nil, err
	}
	topt := opt.Training
	topt.Policies = nil
	jobs, compression, err := prepareJobs(ctx, jobs, snap, model, topt)
	if err != nil {
		return nil, err
	}
	from, until := jobs[0].Submit, jobs[len(jobs)-1].Submit
	pols := opt.Policies
	if pols == nil {
		pols = MixedPolicies
	}
	var out []MixedResult
	for _, p := range pols {
		var res MixedResult
		switch p {
		case "static":
			res, err = runStatic(ctx, jobs, reqs, snap, model, opt, from, until)
		default:
			cfg, blind, perr := topt.policyConfig(p)
			if perr != nil {
				return nil, perr
			}
			if p == "volcano" {
				volcanoPreemption(&cfg)
			}
			res, err = runShared(ctx, p, cfg, blind, jobs, reqs, snap, model, opt, from, until)
		}
		if err != nil {
			return nil, err
		}
		res.ArrivalCompression = round2(compression)
		out = append(out, res)
	}
	for _, r := range out {
		if r.Policy == "static" {
			b := round2(100 - r.UtilisationPct)
			for i := range out {
				out[i].UtilisationGainBoundPts = &b
			}
		}
	}
	return out, nil
}

// volcanoPreemption turns on preemption as Volcano's preempt and reclaim actions do it:
// a pending task of a higher priority evicts lower-priority tasks (and a queue under its
// deserved share reclaims from queues over theirs) whenever that frees room for it; no
// cost test, no eviction budget or back-off, no guard for recently started gangs. Gangs
// keep their minimum (Volcano's gang plugin lets only tasks above minAvailable go), so
// elastic gangs may lose their surplus members first, as in Volcano.
func volcanoPreemption(cfg *gang.Config) {
	cfg.Preemption, cfg.FairShareReclaim = true, true
	cfg.MinRunBeforePreempt = 0
	cfg.Preempt = gang.PreemptConfig{GainRatio: 0, RetryResolution: time.Second}
}

// machinesHold checks that a replica fits on a machine of the cluster.
func machinesHold(snap gang.Snapshot, spec ServiceSpec) error {
	for _, n := range snap.Nodes {
		if len(n.GPUs) >= spec.GPUsPerReplica {
			return nil
		}
	}
	return fmt.Errorf("sim: no machine of the cluster holds a replica of %d GPUs: %w", spec.GPUsPerReplica, ErrBadSpec)
}

// serviceRequest is the gang request of one replica: GPUsPerReplica one-GPU members on one
// machine, above every training class, latency-sensitive, with no run time (it serves
// until scaled down) and nothing to checkpoint.
func serviceRequest(id string, spec ServiceSpec) gang.Request {
	return gang.Request{ID: id, Priority: PrioService, Min: spec.GPUsPerReplica, LatencySensitive: true,
		Member: gang.Member{GPUs: 1, CPUMilli: jobCPUPerGPU, MemMiB: jobMemPerGPU}, Strategy: gang.StrategyStrictPack}
}

// runShared replays the training jobs and the service on the whole cluster under cfg.
func runShared(ctx context.Context, policy string, cfg gang.Config, blind gang.BlindPolicy, jobs []Job, reqs []InferenceRequest, snap gang.Snapshot, model gang.CollectiveModel, opt MixedOptions, from, until time.Duration) (MixedResult, error) {
	svc := newServiceSide(opt.Service, opt.Model, opt.Autoscale, newArrivals(reqs, opt.Load, from, until), until)
	r, err := replayJobsSvc(ctx, policy, opt.Training.info(), cfg, blind, jobs, snap, model, svc)
	if err != nil {
		return MixedResult{Policy: policy}, err
	}
	return mixedResult(r.res, svc, r.total, r.busy, until-from, 0), nil
}

// runStatic sizes the dedicated replicas, takes their machines out of the cluster and
// replays the training jobs on the rest.
func runStatic(ctx context.Context, jobs []Job, reqs []InferenceRequest, snap gang.Snapshot, model gang.CollectiveModel, opt MixedOptions, from, until time.Duration) (MixedResult, error) {
	var svc *serviceSide
	n := opt.Service.MinReplicas
	for ; ; n++ {
		if err := ctx.Err(); err != nil {
			return MixedResult{}, err
		}
		svc = fixedService(reqs, opt, from, until, n)
		if 100*float64(svc.within) >= opt.SLOTargetPct*float64(svc.served) || n == opt.Service.MaxReplicas {
			break
		}
	}
	rest, dedicated, err := withoutMachines(snap, n, opt.Service.GPUsPerReplica)
	if err != nil {
		return MixedResult{Policy: "static"}, err
	}
	cfg, blind, err := opt.Training.policyConfig("atoll")
	if err != nil {
		return MixedResult{}, err
	}
	r, err := replayJobsSvc(ctx, "static", opt.Training.info(), cfg, blind, jobs, rest, model, nil)
	if err != nil {
		return MixedResult{Policy: "static"}, err
	}
	res := mixedResult(r.res, svc, r.total+dedicated, r.busy, until-from, dedicated)
	res.PeakReplicas = n
	return res, nil
}

// fixedService serves the requests on n replicas ready throughout.
func fixedService(reqs []InferenceRequest, opt MixedOptions, from, until time.Duration, n int) *serviceSide {
	svc := newServiceSide(opt.Service, opt.Model, opt.Autoscale, newArrivals(reqs, opt.Load, from, until), until)
	svc.lastHeld = from
	for range n {
		rp := svc.newReplica(from)
		svc.ready(rp, from)
	}
	svc.upDelays = nil
	svc.serve(until + time.Nanosecond)
	svc.held(until)
	return svc
}

// withoutMachines returns the cluster without the machines that hold n replicas of g GPUs
// (first fit over the machines in order) and the GPUs taken out.
func withoutMachines(snap gang.Snapshot, n, g int) (gang.Snapshot, int, error) {
	out := snap
	out.Nodes = nil
	taken := 0
	for _, node := range snap.Nodes {
		if k := len(node.GPUs) / g; n > 0 && k > 0 {
			n -= min(n, k)
			taken += len(node.GPUs)
			continue
		}
		out.Nodes = append(out.Nodes, node)
	}
	if n > 0 || len(out.Nodes) == 0 {
		return gang.Snapshot{}, 0, fmt.Errorf("sim: the cluster cannot hold the dedicated replicas and training besides: %w", ErrBadSpec)
	}
	return out, taken, nil
}

// mixedResult fills the result from the training replay and the service's accounts.
func mixedResult(d DynamicResult, svc *serviceSide, total int, trainBusy float64, window time.Duration, dedicated int) MixedResult {
	res := MixedResult{Policy: d.Policy, Info: d.Info, TrainingJCT: d.JCT, HighPrioQueueDelay: d.HighPrioQueueDelay,
		Requests: svc.served, TTFTP99: svc.ttftP99(), E2EMax: round2(svc.e2eMax.Seconds()), DedicatedGPUs: dedicated,
		PeakReplicas: svc.peakReplicas, ScaleUps: svc.scaleUps, ScaleDowns: svc.scaleDowns, ScaleUpDelay: stats(svc.upDelays),
		Preemptions: d.Preemptions, PreemptionsByCause: d.PreemptionsByCause, Shrinks: d.Shrinks, LostGPUHours: d.LostGPUHours, Jobs: d.Jobs}
	if svc.served > 0 {
		res.InferenceSLOAttainmentPct = math.Floor(1e4*float64(svc.within)/float64(svc.served)) / 100
	}
	if cap := window.Seconds() * float64(total); cap > 0 {
		res.TrainingUtilPct = round2(100 * trainBusy / cap)
		res.InferenceWorkPct = round2(100 * svc.workGPUSeconds / cap)
		res.UtilisationPct = round2(100 * (trainBusy + svc.workGPUSeconds) / cap)
		res.BusyAnyPct = round2(100 * (trainBusy + svc.busyGPUSeconds) / cap)
		res.AllocatedPct = round2(100 * (trainBusy + svc.heldGPUSeconds) / cap)
	}
	return res
}

// startService submits the service's minimum replicas at the first arrival (they serve
// from then: the service was deployed before the trace) and the autoscaler's first tick.
func (r *replay) startService() error {
	start := r.jobs[0].Submit
	r.svcStart = start
	r.svcByID = map[string]*replica{}
	r.svc.lastHeld = start
	for range r.svc.spec.MinReplicas {
		if err := r.submitReplica(start); err != nil {
			return err
		}
	}
	r.push(event{at: start + r.svc.as.Interval, kind: evTick})
	return nil
}

func (r *replay) submitReplica(now time.Duration) error {
	rp := r.svc.newReplica(now)
	r.svcByID[rp.id] = rp
	st, err := r.s.Submit(serviceRequest(rp.id, r.svc.spec), r.epoch.Add(now))
	if err != nil {
		return fmt.Errorf("sim: service replica %s: %w", rp.id, err)
	}
	if st.State == gang.Rejected {
		return fmt.Errorf("sim: service replica %s rejected (%s): %w", rp.id, st.Reason, ErrBadSpec)
	}
	return nil
}

// placedReplica starts a replica's model load (or serves at once at the start).
func (r *replay) placedReplica(rp *replica, now time.Duration) {
	if rp.state != repPending {
		return
	}
	rp.state = repStarting
	r.svc.peakReplicas = max(r.svc.peakReplicas, r.svc.placed())
	if now == r.svcStart {
		r.svc.ready(rp, now)
		r.svc.upDelays = r.svc.upDelays[:len(r.svc.upDelays)-1] // deployed before the trace
		return
	}
	r.push(event{at: now + r.svc.model.Startup, kind: evReady, rep: rp})
}

// handleService carries out the service's events.
func (r *replay) handleService(e event, now time.Duration) error {
	svc, at := r.svc, r.epoch.Add(now)
	switch e.kind {
	case evTick:
		want := svc.desired(now)
		for n := svc.active(); n < want; n++ {
			if err := r.submitReplica(now); err != nil {
				return err
			}
			svc.scaleUps++
		}
		for n := svc.active(); n > want; n-- {
			r.scaleDown(now)
			svc.scaleDowns++
		}
		if now < r.windowEnd {
			r.push(event{at: now + svc.as.Interval, kind: evTick})
		}
	case evReady:
		if e.rep.state == repStarting {
			svc.ready(e.rep, now)
		}
	case evDrained:
		if _, ok := r.svcByID[e.rep.id]; ok && e.rep.state == repDraining && e.gen == e.rep.drainGen {
			if at := e.rep.drainAt(); at > now { // (cannot happen: drained replicas take no requests)
				r.push(event{at: at, kind: evDrained, rep: e.rep, gen: e.rep.drainGen})
				return nil
			}
			svc.remove(e.rep)
			delete(r.svcByID, e.rep.id)
			return r.s.Finish(e.rep.id, at)
		}
	case evSvcStop:
		if _, ok := r.svcByID[e.rep.id]; ok {
			svc.remove(e.rep)
			delete(r.svcByID, e.rep.id)
			return r.s.Finish(e.rep.id, at)
		}
	}
	return nil
}

// scaleDown takes one replica away: one not yet placed, else one loading, else the ready
// one whose batch empties first (it drains: no new requests, released when empty).
func (r *replay) scaleDown(now time.Duration) {
	svc := r.svc
	pick := func(state int) *replica {
		var best *replica
		for _, rp := range svc.reps {
			if rp.state == state && (best == nil || rp.drainAt() < best.drainAt()) {
				best = rp
			}
		}
		return best
	}
	for _, st := range []int{repPending, repStarting} {
		if rp := pick(st); rp != nil {
			svc.remove(rp)
			delete(r.svcByID, rp.id)
			_ = r.s.Finish(rp.id, r.epoch.Add(now)) // known to the scheduler: cannot fail
			return
		}
	}
	if rp := pick(repReady); rp != nil {
		rp.state = repDraining
		rp.drainGen++
		r.push(event{at: max(now, rp.drainAt()), kind: evDrained, rep: rp, gen: rp.drainGen})
	}
}
