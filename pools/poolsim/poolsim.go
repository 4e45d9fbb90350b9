// Package poolsim replays a job trace on autoscaling pools and compares autoscaling
// policies by cost, goodput, queueing delay and interruptions (`atoll sim --mode pools`).
//
// The model: each trace job is a gang (up to 8 GPUs: one member of that many cards; more:
// members of 8 cards), tolerant of interruption, checkpointing every CheckpointEvery of
// progress. Machines are bought from pools (launch latency, price per hour, spot
// interruptions drawn from the pool's declared rate, each announced notice_seconds
// ahead). A simple placer puts pending gangs, in arrival order with backfill, on ready
// machines (best fit per member, all members or none). The policies differ in how they
// buy and release machines:
//
//   - static: every on-demand pool at its max, always on (the on-demand reference);
//   - ray: a model of Ray's autoscaler: reconcile every 5 s, launches per round limited by
//     upscaling_speed 1 (at most max(5, machines) new machines a round), 60 s idle timeout,
//     spot first, no notice handling (an interruption loses the work since the last
//     checkpoint);
//   - kueue: admission after provisioning with the cluster autoscaler: whole gangs provisioned
//     together (the pools core), scan every 10 s, 10 min scale-down-unneeded time, spot
//     first, no notice handling;
//   - atoll: the pools core every 10 s with the pools' idle timeouts, and notices turned into
//     a checkpoint before the machine goes (only the restore is lost);
//   - atoll-predict: atoll with the arrival forecaster pre-warming machines;
//   - atoll-on-demand: atoll on the on-demand pools only (what autoscaling alone saves,
//     without spot).
package poolsim

import (
	"container/heap"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
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

// Options configure a replay.
type Options struct {
	Policies []string
	// CheckpointEvery is the jobs' checkpoint interval (of progress); Restore the time a
	// restarted gang spends restoring (lost work).
	CheckpointEvery time.Duration
	Restore         time.Duration
	Seed            uint64
}

// DefaultOptions: every policy, 30 min checkpoints, 1 min restores.
func DefaultOptions() Options {
	return Options{Policies: Policies(), CheckpointEvery: 30 * time.Minute, Restore: time.Minute, Seed: 1}
}

// Policies lists the policies.
func Policies() []string {
	return []string{"static", "ray", "kueue", "atoll", "atoll-predict", "atoll-on-demand"}
}

// Result is one policy's figures.
type Result struct {
	Policy string  `json:"policy"`
	Jobs   int     `json:"jobs"`
	Cost   float64 `json:"cost_usd"`
	// CostVsOnDemandPct is the cost as a percentage of the static on-demand reference's
	// (100 = the same; 30 = 70% cheaper).
	CostVsOnDemandPct float64 `json:"cost_vs_on_demand_pct"`
	// GoodputPct is useful GPU-hours (the jobs' work) over paid GPU-hours.
	GoodputPct       float64 `json:"goodput_pct"`
	UsefulGPUHours   float64 `json:"useful_gpu_hours"`
	PaidGPUHours     float64 `json:"paid_gpu_hours"`
	QueueDelayMeanS  float64 `json:"queue_delay_s"`
	QueueDelayP99S   float64 `json:"queue_delay_p99_s"`
	Interruptions    int     `json:"interruptions"`
	LostGPUHours     float64 `json:"lost_gpu_hours"`
	MachinesLaunched int     `json:"machines_launched"`
	SpotShare        float64 `json:"spot_machine_hours_pct"`
	MakespanH        float64 `json:"makespan_h"`
	Unfinished       int     `json:"unfinished"`
}

// policy parameters.
type policy struct {
	name      string
	static    bool
	reconcile time.Duration
	idle      time.Duration // 0: the pools' own
	notices   bool
	predict   bool
	rayLimit  bool
	noSpot    bool
}

func policyOf(name string) (policy, error) {
	switch name {
	case "static":
		return policy{name: name, static: true, reconcile: time.Minute}, nil
	case "ray":
		return policy{name: name, reconcile: 5 * time.Second, idle: time.Minute, rayLimit: true}, nil
	case "kueue":
		return policy{name: name, reconcile: 10 * time.Second, idle: 10 * time.Minute}, nil
	case "atoll":
		return policy{name: name, reconcile: 10 * time.Second, notices: true}, nil
	case "atoll-predict":
		return policy{name: name, reconcile: 10 * time.Second, notices: true, predict: true}, nil
	case "atoll-on-demand":
		return policy{name: name, reconcile: 10 * time.Second, notices: true, noSpot: true}, nil
	}
	return policy{}, fmt.Errorf("poolsim: policy %q: want one of %v", name, Policies())
}

// Run replays the jobs on the pools under every policy.
func Run(ctx context.Context, jobs []Job, set *pools.Set, opt Options) ([]Result, error) {
	if len(jobs) == 0 {
		return nil, fmt.Errorf("poolsim: no jobs")
	}
	if opt.CheckpointEvery <= 0 {
		return nil, fmt.Errorf("poolsim: checkpoint interval %v: want > 0", opt.CheckpointEvery)
	}
	maxGPUs := 0
	for _, p := range set.Pools {
		maxGPUs = max(maxGPUs, p.Shape.GPUs*p.Spec.Max)
	}
	var out []Result
	var ref float64
	names := opt.Policies
	if len(names) == 0 {
		names = Policies()
	}
	if !slices.Contains(names, "static") {
		names = append([]string{"static"}, names...) // the reference
	}
	for _, name := range names {
		pol, err := policyOf(name)
		if err != nil {
			return nil, err
		}
		r, err := replay(ctx, jobs, set, opt, pol)
		if err != nil {
			return nil, err
		}
		if name == "static" {
			ref = r.Cost
		}
		out = append(out, r)
	}
	for i := range out {
		if ref > 0 {
			out[i].CostVsOnDemandPct = 100 * out[i].Cost / ref
		}
	}
	if !slices.Contains(opt.Policies, "static") && len(opt.Policies) > 0 {
		out = out[1:]
	}
	return out, nil
}

// --- the replay ---

type evKind int

const (
	evArrive evKind = iota
	evFinish
	evReady
	evNotice
	evInterrupt
	evReconcile
)

type event struct {
	at   time.Duration
	kind evKind
	ref  int
	gen  int
	seq  int
}

type queue []event

func (q queue) Len() int { return len(q) }
func (q queue) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].seq < q[j].seq
}
func (q queue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *queue) Push(x any)   { *q = append(*q, x.(event)) }
func (q *queue) Pop() any     { o := *q; e := o[len(o)-1]; *q = o[:len(o)-1]; return e }

type simJob struct {
	Job
	members, per int
	progress     time.Duration // work done when the current run started
	started      time.Duration // start of the current run (-1 when not running)
	firstStart   time.Duration
	gen          int
	on           map[int]int // machine -> members
	failedAt     int         // capacity version of its last failed placement (-1: never)
	done         bool
	pendingSince time.Duration
}

type simMachine struct {
	name      string
	pool      *pools.Pool
	spot      bool
	launched  time.Duration
	ready     bool
	readyAt   time.Duration
	gone      bool
	goneAt    time.Duration
	draining  bool
	drainedAt time.Duration
	free      int
	hosts     map[int]int
	idleSince time.Duration
	notice    time.Duration // 0: none
	counted   bool          // its interruption is counted
}

type world struct {
	opt      Options
	pol      policy
	set      *pools.Set
	core     *pools.Autoscaler
	fc       pools.Forecaster
	rng      *rand.Rand
	now      time.Duration
	q        queue
	seq      int
	jobs     []*simJob
	pending  []int
	machines []*simMachine
	res      Result
	lost     float64
	nextRec  time.Duration
	epoch    time.Time
	capVer   int // bumped whenever capacity frees up
	recAt    time.Duration
	dirty    bool // an event changed the world since the last decision
}

func (w *world) push(at time.Duration, k evKind, ref, gen int) {
	w.seq++
	heap.Push(&w.q, event{at: at, kind: k, ref: ref, gen: gen, seq: w.seq})
}

func replay(ctx context.Context, jobs []Job, set *pools.Set, opt Options, pol policy) (Result, error) {
	core, err := pools.New(pools.DefaultConfig())
	if err != nil {
		return Result{}, err
	}
	w := &world{opt: opt, pol: pol, set: set, core: core, rng: rand.New(rand.NewPCG(opt.Seed, 0x5eed)),
		epoch: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), res: Result{Policy: pol.name, Jobs: len(jobs)}}
	maxPer := 0
	for _, p := range set.Pools {
		maxPer = max(maxPer, p.Shape.GPUs)
	}
	for i, j := range jobs {
		sj := &simJob{Job: j, started: -1, firstStart: -1, on: map[int]int{}, failedAt: -1}
		if j.GPUs <= maxPer {
			sj.members, sj.per = 1, j.GPUs
		} else {
			sj.members, sj.per = (j.GPUs+maxPer-1)/maxPer, maxPer
		}
		w.jobs = append(w.jobs, sj)
		w.push(j.Submit, evArrive, i, 0)
	}
	if pol.static {
		for i := range set.Pools {
			p := &set.Pools[i]
			if p.Spec.Capacity != pools.OnDemand {
				continue
			}
			for k := 0; k < p.Spec.Max; k++ {
				m := w.launch(p, 0)
				m.ready, m.readyAt, m.idleSince = true, 0, 0
			}
		}
	}
	remaining := len(jobs)
	steps := 0
	for w.q.Len() > 0 && remaining > 0 {
		if steps++; steps%4096 == 0 && ctx.Err() != nil {
			return w.res, ctx.Err()
		}
		e := heap.Pop(&w.q).(event)
		w.now = e.at
		if e.kind != evReconcile {
			w.dirty = true
		}
		switch e.kind {
		case evArrive:
			j := w.jobs[e.ref]
			j.pendingSince = w.now
			w.pending = append(w.pending, e.ref)
			if pol.predict {
				w.fc.Observe(w.gangOf(e.ref), w.epoch.Add(w.now))
			}
		case evFinish:
			j := w.jobs[e.ref]
			if j.gen != e.gen || j.done {
				continue
			}
			j.progress = j.Duration
			j.done = true
			remaining--
			w.release(e.ref)
		case evReady:
			m := w.machines[e.ref]
			if m.gone {
				continue
			}
			m.ready, m.readyAt, m.idleSince = true, w.now, w.now
			w.capVer++
		case evNotice:
			m := w.machines[e.ref]
			if m.gone {
				continue
			}
			m.notice = w.now + time.Duration(m.pool.Spec.NoticeSeconds)*time.Second
			m.counted = true
			w.res.Interruptions++
		case evInterrupt:
			m := w.machines[e.ref]
			if m.gone {
				continue
			}
			if !m.counted {
				w.res.Interruptions++
			}
			hosted := make([]int, 0, len(m.hosts))
			for ji := range m.hosts {
				hosted = append(hosted, ji)
			}
			sort.Ints(hosted)
			for _, ji := range hosted {
				w.stop(ji, false)
			}
			w.remove(e.ref)
		case evReconcile:
		}
		w.place()
		if !pol.static && w.now >= w.nextRec {
			if err := w.reconcile(); err != nil {
				return w.res, err
			}
			w.dirty = false
			w.nextRec = w.now + pol.reconcile
		}
		if !pol.static && w.q.Len() > 0 {
			if at, ok := w.wake(); ok && (w.recAt <= w.now || at < w.recAt) {
				w.recAt = at
				w.push(at, evReconcile, 0, 0)
			}
		}
	}
	w.finish(remaining)
	return w.res, nil
}

// wake returns when the autoscaler next has something to do: at the next reconcile while
// gangs wait or machines drain or have notices, else when the first idle machine's timeout
// ends; false when nothing is due.
func (w *world) wake() (time.Duration, bool) {
	if len(w.pending) > 0 && w.dirty {
		// Something changed since the last decision; unchanged, the same snapshot would only
		// give the same decision until a timer below is due.
		return w.nextRec, true
	}
	best, ok := time.Duration(0), false
	for _, m := range w.machines {
		if m.gone {
			continue
		}
		var at time.Duration
		switch {
		case m.draining || m.notice > 0:
			at = w.nextRec
		case m.ready && len(m.hosts) == 0 && m.idleSince >= 0:
			idle := time.Duration(m.pool.Spec.IdleTimeout)
			if w.pol.idle > 0 {
				idle = w.pol.idle
			}
			at = max(w.nextRec, m.idleSince+idle)
		default:
			continue
		}
		if !ok || at < best {
			best, ok = at, true
		}
	}
	return best, ok
}

func (w *world) launch(p *pools.Pool, rack int) *simMachine {
	m := &simMachine{name: fmt.Sprintf("%s-%d", p.Spec.Name, len(w.machines)), pool: p, spot: p.Spec.Capacity == pools.Spot,
		launched: w.now, free: p.Shape.GPUs, hosts: map[int]int{}, idleSince: -1}
	idx := len(w.machines)
	w.machines = append(w.machines, m)
	w.res.MachinesLaunched++
	w.push(w.now+time.Duration(p.Spec.LaunchLatency), evReady, idx, 0)
	if m.spot && p.Spec.InterruptionsPerHour > 0 {
		after := time.Duration(w.rng.ExpFloat64() / p.Spec.InterruptionsPerHour * float64(time.Hour))
		at := w.now + time.Duration(p.Spec.LaunchLatency) + after
		if w.pol.notices {
			w.push(max(w.now, at-time.Duration(p.Spec.NoticeSeconds)*time.Second), evNotice, idx, 0)
		}
		w.push(at, evInterrupt, idx, 0)
	}
	return m
}

func (w *world) remove(i int) {
	m := w.machines[i]
	if m.gone {
		return
	}
	m.gone, m.goneAt = true, w.now
}

// release frees a job's machines.
func (w *world) release(ji int) {
	j := w.jobs[ji]
	for mi, n := range j.on {
		m := w.machines[mi]
		m.free += n * j.per
		delete(m.hosts, ji)
		if len(m.hosts) == 0 {
			m.idleSince = w.now
		}
	}
	j.on = map[int]int{}
	j.started = -1
	j.gen++
	w.capVer++
}

// stop ends a job's run: with a checkpoint (notice) it keeps all its progress; without, it
// keeps the progress of its last periodic checkpoint. Either way it pays the restore on
// its next run. It goes back to pending.
func (w *world) stop(ji int, checkpointed bool) {
	j := w.jobs[ji]
	if j.started < 0 || j.done {
		return
	}
	ran := w.now - j.started
	p := j.progress + ran
	kept := p
	if !checkpointed {
		kept = (p / w.opt.CheckpointEvery) * w.opt.CheckpointEvery
		if kept < j.progress { // a restore that had not finished: nothing new kept
			kept = j.progress
		}
	}
	lost := p - kept + w.opt.Restore
	w.lost += lost.Hours() * float64(j.GPUs)
	j.progress = kept - w.opt.Restore // the restore is paid on the next run
	if j.progress < 0 {
		j.progress = 0
	}
	w.release(ji)
	j.pendingSince = w.now
	w.pending = append(w.pending, ji)
}

// place puts pending jobs, in order, on ready machines: each member on the fullest machine
// it fits (best fit), all members or none; blocked jobs do not hold back others.
func (w *world) place() {
	if len(w.pending) == 0 {
		return
	}
	var ready []int
	for i, m := range w.machines {
		if m.ready && !m.gone && !m.draining && m.notice == 0 && m.free > 0 {
			ready = append(ready, i)
		}
	}
	if len(ready) == 0 {
		return
	}
	total := 0
	for _, mi := range ready {
		total += w.machines[mi].free
	}
	keep := w.pending[:0]
	for _, ji := range w.pending {
		j := w.jobs[ji]
		if j.failedAt == w.capVer || j.GPUs > total {
			// Nothing freed since it last failed, or not enough cards at all.
			if j.GPUs > total {
				j.failedAt = w.capVer
			}
			keep = append(keep, ji)
			continue
		}
		plan := map[int]int{}
		free := map[int]int{}
		ok := true
		for k := 0; k < j.members; k++ {
			best := -1
			for _, mi := range ready {
				f, seen := free[mi]
				if !seen {
					f = w.machines[mi].free
				}
				if f >= j.per && (best < 0 || f < free2(free, w.machines, best)) {
					best = mi
				}
			}
			if best < 0 {
				ok = false
				break
			}
			free[best] = free2(free, w.machines, best) - j.per
			plan[best]++
		}
		if !ok {
			j.failedAt = w.capVer
			keep = append(keep, ji)
			continue
		}
		total -= j.members * j.per
		for mi, n := range plan {
			m := w.machines[mi]
			m.free -= n * j.per
			m.hosts[ji] += n
			m.idleSince = -1
		}
		j.on = plan
		j.started = w.now
		if j.firstStart < 0 {
			j.firstStart = w.now
		}
		w.push(w.now+(j.Duration-j.progress), evFinish, ji, j.gen)
	}
	w.pending = keep
}

func free2(free map[int]int, ms []*simMachine, i int) int {
	if f, ok := free[i]; ok {
		return f
	}
	return ms[i].free
}

func (w *world) gangOf(ji int) pools.Gang {
	j := w.jobs[ji]
	return pools.Gang{ID: j.ID + "#" + fmt.Sprint(ji), Size: j.members, Member: pools.Member{GPUs: j.per}, Tolerant: true, Arrived: w.epoch.Add(j.Submit)}
}

// reconcile runs the policy's autoscaler once.
func (w *world) reconcile() error {
	now := w.epoch.Add(w.now)
	s := &pools.Snapshot{Now: now}
	for i := range w.set.Pools {
		p := &w.set.Pools[i]
		if w.pol.noSpot && p.Spec.Capacity == pools.Spot {
			continue
		}
		if w.pol.idle > 0 {
			cp := *p
			cp.Spec.IdleTimeout = pools.Duration(w.pol.idle)
			p = &cp
		}
		s.Pools = append(s.Pools, pools.PoolState{Pool: p})
	}
	byName := map[string]int{}
	for i, m := range w.machines {
		if m.gone {
			continue
		}
		byName[m.name] = i
		pm := pools.Machine{Name: m.name, Pool: m.pool.Spec.Name, State: pools.Ready, Since: w.epoch.Add(m.readyAt)}
		switch {
		case m.draining:
			pm.State, pm.Since = pools.Draining, w.epoch.Add(m.drainedAt)
		case !m.ready:
			pm.State, pm.Since = pools.Launching, w.epoch.Add(m.launched)
		}
		if m.idleSince >= 0 && len(m.hosts) == 0 {
			pm.IdleSince = w.epoch.Add(m.idleSince)
		}
		if w.pol.notices && m.notice > 0 {
			pm.Notice = w.epoch.Add(m.notice)
		}
		hosted := make([]int, 0, len(m.hosts))
		for ji := range m.hosts {
			hosted = append(hosted, ji)
		}
		sort.Ints(hosted)
		for _, ji := range hosted {
			pm.Gangs = append(pm.Gangs, pools.Hosted{Gang: w.gangOf(ji).ID, Members: m.hosts[ji]})
			s.Running = append(s.Running, w.gangOf(ji))
		}
		s.Machines = append(s.Machines, pm)
	}
	for _, ji := range w.pending {
		s.Pending = append(s.Pending, w.gangOf(ji))
	}
	if w.pol.predict {
		var horizon time.Duration
		for _, p := range w.set.Pools {
			horizon = max(horizon, time.Duration(p.Spec.LaunchLatency))
		}
		s.Forecast = w.fc.Forecast(now, max(horizon, time.Minute))
	}
	d, err := w.core.Decide(s)
	if err != nil {
		return err
	}
	// Ray's upscaling_speed: at most max(5, machines) new machines a round.
	budget := math.MaxInt
	if w.pol.rayLimit {
		budget = max(5, len(byName))
	}
	for _, l := range d.Launches {
		p, _ := w.set.ByName(l.Pool)
		n := min(l.Count, budget)
		budget -= n
		for k := 0; k < n; k++ {
			w.launch(p, l.Domain)
		}
	}
	for _, dr := range d.Drains {
		m := w.machines[byName[dr.Machine]]
		m.draining, m.drainedAt = true, w.now
	}
	for _, pr := range d.Preemptions {
		m := w.machines[byName[pr.Machine]]
		for ji := range m.hosts {
			if w.gangOf(ji).ID == pr.Gang {
				w.stop(ji, true) // checkpoint before the machine goes
			}
		}
	}
	for _, rm := range d.Removes {
		w.remove(byName[rm.Machine])
	}
	return nil
}

func (w *world) finish(unfinished int) {
	end := w.now
	var delays []float64
	useful := 0.0
	for _, j := range w.jobs {
		if j.done {
			useful += j.Duration.Hours() * float64(j.GPUs)
		}
		if j.firstStart >= 0 {
			delays = append(delays, (j.firstStart - j.Submit).Seconds())
		}
	}
	paid, spot, all := 0.0, 0.0, 0.0
	for _, m := range w.machines {
		to := end
		if m.gone {
			to = m.goneAt
		}
		h := (to - m.launched).Hours()
		w.res.Cost += h * m.pool.Spec.PricePerHour
		paid += h * float64(m.pool.Shape.GPUs)
		all += h
		if m.spot {
			spot += h
		}
	}
	w.res.UsefulGPUHours, w.res.PaidGPUHours = useful, paid
	if paid > 0 {
		w.res.GoodputPct = 100 * useful / paid
	}
	if all > 0 {
		w.res.SpotShare = 100 * spot / all
	}
	if len(delays) > 0 {
		sum := 0.0
		for _, d := range delays {
			sum += d
		}
		w.res.QueueDelayMeanS = sum / float64(len(delays))
		slices.Sort(delays)
		w.res.QueueDelayP99S = delays[min(len(delays)-1, len(delays)*99/100)]
	}
	w.res.LostGPUHours = w.lost
	w.res.MakespanH = end.Hours()
	w.res.Unfinished = unfinished
}
