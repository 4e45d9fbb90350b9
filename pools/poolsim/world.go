package poolsim

import (
	"container/heap"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"time"

	"github.com/atoll-run/atoll/pools"
)

// The world every policy runs in: machines bought from the pools, jobs placed on them by one
// placer, interruptions drawn from the pools' rates, and one checkpoint model. A policy (a
// scaler) only buys, drains and removes machines, and stops jobs through the world's
// methods; everything it reads is in the world, the same for every policy.

type evKind int

const (
	evArrive evKind = iota
	evFinish
	evReady
	evNotice
	evInterrupt
	evCkptDone
	evKill
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

// simJob is a trace job in the replay.
type simJob struct {
	Job
	members, per int
	// progress is the work kept: done when the current run started, or now when the job
	// is not running. hasCkpt says a checkpoint holds it (a restart restores it).
	progress time.Duration
	hasCkpt  bool
	// started is the start of the current run (-1 when not running); runRestore the
	// restore paid at its beginning.
	started    time.Duration
	runRestore time.Duration
	firstStart time.Duration
	// gen changes whenever a run ends or its finish moves (a checkpoint pauses it): events
	// of an older generation are stale.
	gen int
	on  map[int]int // machine -> members
	// failedAt is the capacity version of its last failed placement (-1: never).
	failedAt int
	done     bool
	// stopping: asked to stop (checkpointing, or killed at a deadline); ckpt: writing a
	// checkpoint of ckptProgress, training paused.
	stopping     bool
	ckpt         bool
	ckptProgress time.Duration
	// pool restricts placement to one pool (a Kueue flavor); nil: any.
	pool *pools.Pool
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
	idleSince time.Duration // -1 while it hosts a job (or before it is ready)
	changed   time.Duration // when a job last came onto or left it
	// notice is when the provider takes it back, once a notice-taking policy was told
	// (0: no notice).
	notice  time.Duration
	counted bool // its interruption is counted
}

type world struct {
	opt Options
	set *pools.Set
	sc  scaler
	adm admitter // nil: every pending job may be placed
	// rngs draw interruptions, one stream per pool: the k-th machine of a pool gets the same
	// draw under every policy (common random numbers), whatever other pools did.
	rngs     map[*pools.Pool]*rand.Rand
	now      time.Duration
	q        queue
	seq      int
	jobs     []*simJob
	pending  []int
	machines []*simMachine
	res      Result
	epoch    time.Time
	capVer   int // bumped whenever capacity frees up or a placement gate opens
	nextRec  time.Duration
	recAt    time.Duration // the reconcile event in the queue (-1: none)
	dirty    bool          // an event changed the world since the last reconcile
	left     int           // jobs not done
	held     float64       // GPU-hours held by jobs
	// idleH and partH integrate the cards of ready machines that no job holds: on machines
	// hosting nothing, and on machines hosting some job; lastAcc is when they were last
	// brought up to date.
	idleH, partH float64
	lastAcc      time.Duration
	maxPer       int
}

func (w *world) push(at time.Duration, k evKind, ref, gen int) {
	w.seq++
	heap.Push(&w.q, event{at: at, kind: k, ref: ref, gen: gen, seq: w.seq})
}

func newWorld(jobs []Job, set *pools.Set, opt Options, sc scaler) *world {
	w := &world{opt: opt, set: set, sc: sc, rngs: map[*pools.Pool]*rand.Rand{}, recAt: -1,
		epoch: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), res: Result{Policy: sc.name(), Jobs: len(jobs)}}
	w.adm, _ = sc.(admitter)
	for i := range set.Pools {
		p := &set.Pools[i]
		w.maxPer = max(w.maxPer, p.Shape.GPUs)
		w.rngs[p] = rand.New(rand.NewPCG(opt.Seed, 0x5eed+uint64(i)))
	}
	for i, j := range jobs {
		sj := &simJob{Job: j, started: -1, firstStart: -1, on: map[int]int{}, failedAt: -1}
		sj.members, sj.per = shapeOf(j.GPUs, w.maxPer)
		w.jobs = append(w.jobs, sj)
		w.push(j.Submit, evArrive, i, 0)
	}
	w.left = len(jobs)
	return w
}

// shapeOf is a job's gang: up to maxPer GPUs one member of that many cards; more, members of
// maxPer cards.
func shapeOf(gpus, maxPer int) (members, per int) {
	if gpus <= maxPer {
		return 1, gpus
	}
	return (gpus + maxPer - 1) / maxPer, maxPer
}

// run replays the trace to its end.
func (w *world) run(ctx context.Context) error {
	if err := w.sc.start(w); err != nil {
		return err
	}
	return w.loop(ctx, -1)
}

// loop processes events until the trace ends, or (until ≥ 0) until the next event comes
// after until.
func (w *world) loop(ctx context.Context, until time.Duration) error {
	_, takesNotices := w.sc.(noticeTaker)
	steps := 0
	for w.q.Len() > 0 && w.left > 0 {
		if steps++; steps%4096 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		if until >= 0 && w.q[0].at > until {
			return nil
		}
		e := heap.Pop(&w.q).(event)
		w.accrue(e.at)
		w.now = e.at
		if e.kind != evReconcile {
			w.dirty = true
		} else if e.at == w.recAt {
			w.recAt = -1
		}
		switch e.kind {
		case evArrive:
			w.pending = append(w.pending, e.ref)
			if o, ok := w.sc.(arrivalWatcher); ok {
				o.arrived(w, e.ref)
			}
		case evFinish:
			j := w.jobs[e.ref]
			if j.gen != e.gen || j.done || j.started < 0 {
				continue
			}
			j.progress = j.Duration
			j.done = true
			w.left--
			w.release(e.ref)
			if o, ok := w.sc.(stopWatcher); ok {
				o.stopped(w, e.ref, true)
			}
		case evReady:
			m := w.machines[e.ref]
			if m.gone || m.ready {
				continue
			}
			m.ready, m.readyAt, m.idleSince, m.changed = true, w.now, w.now, w.now
			w.capVer++
		case evNotice:
			m := w.machines[e.ref]
			if m.gone || !takesNotices {
				continue
			}
			m.notice = e.at + time.Duration(m.pool.Spec.NoticeSeconds)*time.Second
			m.counted = true
			w.res.Interruptions++
			w.sc.(noticeTaker).notice(w, e.ref)
		case evInterrupt:
			m := w.machines[e.ref]
			if m.gone {
				continue
			}
			if !m.counted {
				w.res.Interruptions++
			}
			w.terminate(e.ref)
		case evCkptDone:
			j := w.jobs[e.ref]
			if j.gen != e.gen || !j.ckpt {
				continue
			}
			j.progress, j.hasCkpt = j.ckptProgress, true
			w.res.CheckpointsSaved++
			w.requeue(e.ref)
		case evKill:
			j := w.jobs[e.ref]
			if j.gen != e.gen || j.started < 0 {
				continue
			}
			w.kill(e.ref)
		case evReconcile:
		}
		w.place()
		if w.now >= w.nextRec && (w.dirty || e.kind == evReconcile) {
			if err := w.sc.reconcile(w); err != nil {
				return err
			}
			w.dirty = false
			w.nextRec = w.now + w.sc.interval()
			w.place()
		}
		if w.q.Len() == 0 || w.left == 0 {
			continue
		}
		at, ok := w.nextRec, w.dirty
		if !ok {
			at, ok = w.sc.wake(w)
			at = max(at, w.nextRec)
		}
		if ok && (w.recAt < 0 || at < w.recAt) {
			w.recAt = at
			w.push(at, evReconcile, 0, 0)
		}
	}
	return nil
}

// accrue integrates the unused cards of ready machines up to t.
func (w *world) accrue(t time.Duration) {
	dt := (t - w.lastAcc).Hours()
	w.lastAcc = t
	if dt <= 0 {
		return
	}
	for _, m := range w.machines {
		if m.gone || !m.ready {
			continue
		}
		if len(m.hosts) == 0 {
			w.idleH += float64(m.pool.Shape.GPUs) * dt
		} else {
			w.partH += float64(m.free) * dt
		}
	}
}

// launch buys a machine of the pool: it is paid from now and ready after the pool's launch
// latency. A spot machine's interruption is drawn now from the pool's rate.
func (w *world) launch(p *pools.Pool) int {
	idx := len(w.machines)
	m := &simMachine{name: fmt.Sprintf("%s-%d", p.Spec.Name, idx), pool: p, spot: p.Spec.Capacity == pools.Spot,
		launched: w.now, free: p.Shape.GPUs, hosts: map[int]int{}, idleSince: -1}
	w.machines = append(w.machines, m)
	w.res.MachinesLaunched++
	lat := time.Duration(p.Spec.LaunchLatency)
	w.push(w.now+lat, evReady, idx, 0)
	if m.spot && p.Spec.InterruptionsPerHour > 0 {
		after := time.Duration(w.rngs[p].ExpFloat64() / p.Spec.InterruptionsPerHour * float64(time.Hour))
		at := w.now + lat + after
		w.push(max(w.now, at-time.Duration(p.Spec.NoticeSeconds)*time.Second), evNotice, idx, 0)
		w.push(at, evInterrupt, idx, 0)
	}
	return idx
}

// terminate gives a machine back (or records that its provider took it): the jobs on it
// lose what their last checkpoint does not hold.
func (w *world) terminate(i int) {
	m := w.machines[i]
	if m.gone {
		return
	}
	hosted := make([]int, 0, len(m.hosts))
	for ji := range m.hosts {
		hosted = append(hosted, ji)
	}
	sort.Ints(hosted)
	for _, ji := range hosted {
		w.kill(ji)
	}
	m.gone, m.goneAt = true, w.now
}

// drain stops a machine from taking jobs.
func (w *world) drain(i int) {
	m := w.machines[i]
	if !m.draining {
		m.draining, m.drainedAt = true, w.now
	}
}

// release frees a job's machines and accounts the GPU time it held.
func (w *world) release(ji int) {
	j := w.jobs[ji]
	if j.started >= 0 {
		w.held += (w.now - j.started).Hours() * float64(j.GPUs)
	}
	for mi, n := range j.on {
		m := w.machines[mi]
		m.free += n * j.per
		delete(m.hosts, ji)
		m.changed = w.now
		if len(m.hosts) == 0 {
			m.idleSince = w.now
		}
	}
	j.on = map[int]int{}
	j.started = -1
	j.runRestore = 0
	j.stopping, j.ckpt = false, false
	j.gen++
	w.capVer++
}

// requeue ends a job's run and puts it back in the queue.
func (w *world) requeue(ji int) {
	w.release(ji)
	w.pending = append(w.pending, ji)
	if o, ok := w.sc.(stopWatcher); ok {
		o.stopped(w, ji, false)
	}
}

// progressAt is the work a job has done now (not necessarily kept).
func (w *world) progressAt(j *simJob) time.Duration {
	if j.ckpt {
		return j.ckptProgress
	}
	if j.started < 0 {
		return j.progress
	}
	run := w.now - j.started - j.runRestore
	if run < 0 {
		return j.progress
	}
	return min(j.Duration, j.progress+run)
}

// kill ends a job's run without a checkpoint (its machine is gone, or a deadline passed): it
// keeps what its last checkpoint holds, the newest periodic one (every CheckpointEvery of
// progress) or the one it started from, and goes back to the queue.
func (w *world) kill(ji int) {
	j := w.jobs[ji]
	if j.started < 0 || j.done {
		return
	}
	p := w.progressAt(j)
	if every := w.opt.CheckpointEvery; p/every*every > j.progress {
		j.progress, j.hasCkpt = p/every*every, true
	}
	w.requeue(ji)
}

// ckptTime is how long the job takes to write (or read) its checkpoint: its state, the same
// size on every GPU, at each GPU's share of its machine's storage bandwidth. The share is
// that of the largest machine the job is on (or could be on, when it runs nowhere).
func (w *world) ckptTime(j *simJob) time.Duration {
	gpus := 0
	for mi := range j.on {
		gpus = max(gpus, w.machines[mi].pool.Shape.GPUs)
	}
	if gpus == 0 {
		gpus = w.maxPer
	}
	return w.opt.Checkpoint.time(gpus)
}

// checkpointStop asks a job to checkpoint and stop by deadline (a spot notice, an eviction's
// grace, a preemption's deadline): it stops training and writes its checkpoint, which takes
// ckptTime. If that ends by the deadline, the job keeps all its work and goes back to the
// queue when the checkpoint is written; if not, the checkpoint is lost: the job is killed at
// the deadline and keeps what its last checkpoint holds. A job with nothing new since its
// last checkpoint stops at once.
func (w *world) checkpointStop(ji int, deadline time.Duration) {
	j := w.jobs[ji]
	if j.started < 0 || j.done || j.stopping {
		return
	}
	j.stopping = true
	p := w.progressAt(j)
	if p <= j.progress {
		w.requeue(ji)
		return
	}
	t := w.ckptTime(j)
	if w.now+t > deadline {
		w.res.CheckpointsMissed++
		w.push(max(deadline, w.now), evKill, ji, j.gen)
		return
	}
	j.ckpt, j.ckptProgress = true, p
	j.gen++ // its finish moves: the run is paused
	w.push(w.now+t, evCkptDone, ji, j.gen)
}

// place puts pending jobs, in order, on ready machines: each member on the fullest machine
// it fits (best fit), all members or none; blocked jobs do not hold back others. A policy
// that admits jobs (Kueue) gates them and may restrict them to one pool.
func (w *world) place() {
	if len(w.pending) == 0 {
		return
	}
	var ready []int
	total := 0
	for i, m := range w.machines {
		if m.ready && !m.gone && !m.draining && m.notice == 0 && m.free > 0 {
			ready = append(ready, i)
			total += m.free
		}
	}
	if len(ready) == 0 {
		return
	}
	keep := w.pending[:0]
	free := map[int]int{}
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
		if w.adm != nil {
			ok, pool := w.adm.admits(w, ji)
			if !ok {
				keep = append(keep, ji)
				continue
			}
			j.pool = pool
		}
		clear(free)
		freeOf := func(mi int) int {
			if f, ok := free[mi]; ok {
				return f
			}
			return w.machines[mi].free
		}
		plan := map[int]int{}
		ok := true
		for k := 0; k < j.members; k++ {
			best := -1
			for _, mi := range ready {
				if j.pool != nil && w.machines[mi].pool != j.pool {
					continue
				}
				if f := freeOf(mi); f >= j.per && (best < 0 || f < freeOf(best)) {
					best = mi
				}
			}
			if best < 0 {
				ok = false
				break
			}
			free[best] = freeOf(best) - j.per
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
			m.changed = w.now
		}
		j.on = plan
		j.started = w.now
		if j.hasCkpt {
			j.runRestore = w.opt.Restore + w.ckptTime(j)
		}
		if j.firstStart < 0 {
			j.firstStart = w.now
		}
		w.push(w.now+j.runRestore+(j.Duration-j.progress), evFinish, ji, j.gen)
		if o, ok := w.sc.(placeWatcher); ok {
			o.placed(w, ji)
		}
	}
	w.pending = keep
}

// alive returns the machines not gone, in launch order.
func (w *world) alive() []int {
	var out []int
	for i, m := range w.machines {
		if !m.gone {
			out = append(out, i)
		}
	}
	return out
}

// finish computes the figures once the replay ends.
func (w *world) finish() {
	end := w.now
	var delays []float64
	useful := 0.0
	for _, j := range w.jobs {
		if j.done {
			useful += j.Duration.Hours() * float64(j.GPUs)
		} else if j.started >= 0 {
			w.held += (end - j.started).Hours() * float64(j.GPUs)
		}
		if j.firstStart >= 0 {
			delays = append(delays, (j.firstStart - j.Submit).Seconds())
		}
	}
	paid, launching, spot, all := 0.0, 0.0, 0.0, 0.0
	for _, m := range w.machines {
		to := end
		if m.gone {
			to = m.goneAt
		}
		h := (to - m.launched).Hours()
		w.res.Cost += h * m.pool.Spec.PricePerHour
		paid += h * float64(m.pool.Shape.GPUs)
		up := to
		if m.ready {
			up = min(to, m.readyAt)
		}
		launching += (up - m.launched).Hours() * float64(m.pool.Shape.GPUs)
		all += h
		if m.spot {
			spot += h
		}
	}
	r := &w.res
	r.UsefulGPUHours, r.PaidGPUHours = useful, paid
	r.LaunchingGPUHours = launching
	r.LostGPUHours = max(0, w.held-useful)
	r.UnusedGPUHours = max(0, paid-launching-w.held)
	r.IdleGPUHours, r.FreeCardGPUHours = w.idleH, w.partH
	if paid > 0 {
		r.GoodputPct = 100 * useful / paid
	}
	if all > 0 {
		r.SpotShare = 100 * spot / all
	}
	if len(delays) > 0 {
		sum := 0.0
		for _, d := range delays {
			sum += d
		}
		r.QueueDelayMeanS = sum / float64(len(delays))
		slices.Sort(delays)
		r.QueueDelayP99S = delays[min(len(delays)-1, len(delays)*99/100)]
	}
	r.MakespanH = end.Hours()
	r.Unfinished = w.left
}
