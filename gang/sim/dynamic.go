package sim

import (
	"container/heap"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"strings"
	"time"

	"github.com/atoll-run/atoll/gang"
)

// DynamicPolicies are the policies of the dynamic mode, baselines first.
var DynamicPolicies = []string{"fifo", "volcano", "kueue", "atoll"}

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
	Duration time.Duration
	GPUs     int
	Priority int
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
		if err == nil && (g < 1 || g != math.Trunc(g)) {
			err = t.rowErr(i, gpuCol, t.str(i, gpuCol), "want a positive whole number of GPUs")
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

// DynamicOptions configure the dynamic mode.
type DynamicOptions struct {
	MaxJobs      int           // first N jobs (0 = all)
	Window       time.Duration // jobs submitted within Window of the first (0 = all)
	PrioritySeed uint64
	Policies     []string
}

// Stats are summary statistics in seconds.
type Stats struct {
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P99  float64 `json:"p99"`
}

// DynamicResult is one policy's outcome on a trace.
type DynamicResult struct {
	Policy             string  `json:"policy"`
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
}

// Declared per-member facts of trace jobs (the traces carry none).
var (
	jobCPUPerGPU = int64(4000)
	jobMemPerGPU = int64(32 << 10)
	jobCkpt      = gang.Checkpoint{Interval: 30 * time.Minute, Save: 30 * time.Second, Restore: 60 * time.Second, CUDATeardown: 5 * time.Second, CUDACreate: 10 * time.Second}
)

// PolicyConfig returns the core configuration and blind policy of a dynamic-mode policy.
func PolicyConfig(policy string) (gang.Config, gang.BlindPolicy, error) {
	cfg := gang.DefaultConfig()
	switch policy {
	case "atoll":
		return cfg, gang.BlindBinpack, nil
	case "fifo": // first-fit, strict arrival order, no priorities, preemption or backfill
		cfg.TopologyAware, cfg.StrictFIFO = false, true
		cfg.Preemption, cfg.FairShareReclaim, cfg.Backfill = false, false, false
		cfg.Weights = gang.Weights{}
		cfg.AgingStep = 0
		return cfg, gang.BlindFirstFit, nil
	case "volcano": // gang + priority + DRF order + binpack, topology-blind, no reservation
		cfg.TopologyAware = false
		cfg.Preemption, cfg.FairShareReclaim, cfg.Backfill = false, false, false
		cfg.Weights = gang.Weights{Binpack: 1}
		cfg.AgingStep = 0
		return cfg, gang.BlindBinpack, nil
	case "kueue": // quota admission (BestEffortFIFO by priority), kube-scheduler spreading placement
		cfg.TopologyAware = false
		cfg.Preemption, cfg.FairShareReclaim, cfg.Backfill = false, false, false
		cfg.QuotaAdmission = true
		cfg.Weights = gang.Weights{}
		cfg.AgingStep = 0
		return cfg, gang.BlindSpread, nil
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
	if len(jobs) == 0 {
		return nil, fmt.Errorf("sim: no jobs: %w", ErrBadSpec)
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
	pols := opt.Policies
	if pols == nil {
		pols = DynamicPolicies
	}
	var out []DynamicResult
	for _, p := range pols {
		r, err := runPolicy(ctx, p, jobs, snap, model)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

type evKind int

const (
	evArrive evKind = iota
	evFinish
	evEvict
)

type event struct {
	at   time.Duration
	kind evKind
	job  int
	gen  int
	seq  int
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
	started   bool
	firstRun  time.Duration
	start     time.Duration
	remaining time.Duration
	gen       int
	running   bool
	done      time.Duration
	rejected  bool
	gpus      int
}

func runPolicy(ctx context.Context, policy string, jobs []Job, snap gang.Snapshot, model gang.CollectiveModel) (DynamicResult, error) {
	cfg, blind, err := PolicyConfig(policy)
	if err != nil {
		return DynamicResult{Policy: policy}, err
	}
	return runConfig(ctx, policy, cfg, blind, jobs, snap, model)
}

func runConfig(ctx context.Context, policy string, cfg gang.Config, blind gang.BlindPolicy, jobs []Job, snap gang.Snapshot, model gang.CollectiveModel) (DynamicResult, error) {
	res := DynamicResult{Policy: policy, Jobs: len(jobs)}
	total := 0
	for _, n := range snap.Nodes {
		total += len(n.GPUs)
	}
	if cfg.QuotaAdmission {
		cfg.Queues[0].Quota = total
	}
	s, err := gang.New(cfg, snap, gang.WithCollectiveModel(model), gang.WithBlindPolicy(blind))
	if err != nil {
		return res, err
	}
	epoch := time.Unix(0, 0)
	idx := map[string]int{}
	st := make([]jobRun, len(jobs))
	q := &eventQ{}
	seq := 0
	push := func(e event) {
		seq++
		e.seq = seq
		heap.Push(q, e)
	}
	for i, j := range jobs {
		id := fmt.Sprintf("j%d", i)
		idx[id] = i
		st[i].remaining = j.Duration
		st[i].gpus = j.GPUs
		push(event{at: j.Submit, kind: evArrive, job: i})
	}
	var busy float64 // GPU-seconds allocated within the arrival window
	var used int
	last := jobs[0].Submit
	windowEnd := jobs[len(jobs)-1].Submit
	var arTimes []float64
	var machines int
	advance := func(to time.Duration) {
		if to > last {
			a, b := last, min(to, windowEnd)
			if b > a {
				busy += float64(used) * (b - a).Seconds()
			}
			last = to
		}
	}
	steps := 0
	for q.Len() > 0 {
		if steps++; steps%4096 == 0 {
			if err := ctx.Err(); err != nil {
				return res, err
			}
		}
		now := (*q)[0].at
		advance(now)
		for q.Len() > 0 && (*q)[0].at == now {
			e := heap.Pop(q).(event)
			j := &st[e.job]
			id := fmt.Sprintf("j%d", e.job)
			switch e.kind {
			case evArrive:
				r := gang.Request{ID: id, Priority: jobs[e.job].Priority, Min: jobs[e.job].GPUs,
					Member:   gang.Member{GPUs: 1, CPUMilli: jobCPUPerGPU, MemMiB: jobMemPerGPU},
					Duration: jobs[e.job].Duration, Checkpoint: jobCkpt}
				if sst, _ := s.Submit(r, epoch.Add(now)); sst.State == gang.Rejected {
					j.rejected = true
					res.Rejected++
				}
			case evFinish:
				if e.gen != j.gen || !j.running {
					continue
				}
				j.running = false
				j.done = now
				used -= j.gpus
				if err := s.Finish(id, epoch.Add(now)); err != nil {
					return res, err
				}
			case evEvict:
				if e.gen != j.gen || !j.running {
					continue
				}
				j.running = false
				j.gen++
				used -= j.gpus
				ran := now - j.start - jobCkpt.Save
				if ran < 0 {
					ran = 0
				}
				j.remaining -= ran
				j.remaining += jobCkpt.Restore + jobCkpt.CUDACreate
				if j.remaining < time.Second {
					j.remaining = time.Second
				}
				lost := jobCkpt.Save + jobCkpt.Restore + jobCkpt.CUDATeardown + jobCkpt.CUDACreate
				res.LostGPUHours += float64(j.gpus) * lost.Hours()
				if err := s.Evicted(id, epoch.Add(now), true); err != nil {
					return res, err
				}
			}
		}
		for c := 0; c < 8; c++ {
			d := s.Cycle(epoch.Add(now))
			for _, p := range d.Placements {
				k := idx[p.Gang]
				j := &st[k]
				if !j.started {
					j.started = true
					j.firstRun = now
				}
				j.running = true
				j.start = now
				j.gen++
				used += j.gpus
				push(event{at: now + j.remaining, kind: evFinish, job: k, gen: j.gen})
				if len(p.Members) > 1 {
					arTimes = append(arTimes, p.AllReduce.Seconds())
					machines += p.Machines
				}
			}
			for _, pr := range d.Preemptions {
				k := idx[pr.Victim]
				res.Preemptions++
				push(event{at: pr.Deadline.Sub(epoch), kind: evEvict, job: k, gen: st[k].gen})
			}
			if len(d.Placements) == 0 || s.Pending() == 0 {
				break
			}
		}
	}
	if s.Pending() > 0 {
		return res, fmt.Errorf("sim: %s: %d gangs still pending after the last event", policy, s.Pending())
	}
	var qd, hq, jct []float64
	var end time.Duration
	for i, j := range st {
		if j.rejected {
			continue
		}
		qd = append(qd, (j.firstRun - jobs[i].Submit).Seconds())
		if jobs[i].Priority == PrioHigh {
			hq = append(hq, (j.firstRun - jobs[i].Submit).Seconds())
		}
		jct = append(jct, (j.done - jobs[i].Submit).Seconds())
		end = max(end, j.done)
	}
	res.QueueDelay = stats(qd)
	res.HighPrioQueueDelay = stats(hq)
	res.JCT = stats(jct)
	res.AllReduce = statsPrec(arTimes, 1e6) // microseconds: NVLink AllReduces take a few ms
	res.MultiGPUPlacements = len(arTimes)
	if len(arTimes) > 0 {
		res.MeanMachines = round2(float64(machines) / float64(len(arTimes)))
	}
	res.MakespanS = (end - jobs[0].Submit).Seconds()
	if w := (windowEnd - jobs[0].Submit).Seconds(); w > 0 && total > 0 {
		res.UtilPct = round2(100 * busy / (w * float64(total)))
	}
	res.LostGPUHours = round2(res.LostGPUHours)
	return res, nil
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
