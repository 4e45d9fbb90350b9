package head

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"go.uber.org/zap"

	"github.com/atoll-run/atoll/gang"
	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/store/meta"
)

// SubmitJob creates a job (or reuses the name of a stopped one).
func (c *Controller) SubmitJob(ctx context.Context, j api.Job) (api.Job, error) {
	if err := j.CheckBounds(); err != nil {
		return api.Job{}, err
	}
	t, err := c.lockTerm()
	if err != nil {
		return api.Job{}, err
	}
	e := t.jobs[j.Name]
	if e != nil && e.rec.State == api.JobRunning {
		c.mu.Unlock()
		return api.Job{}, fmt.Errorf("%w: job %q is running (stop it first, or pick another name)", api.ErrExists, j.Name)
	}
	if e == nil {
		e = &jobEntry{}
		t.jobs[j.Name] = e
	}
	j.State, j.Submitted, j.Stopped = api.JobRunning, c.cfg.Clock(), time.Time{}
	w := commitFn{what: "job " + j.Name, cmp: []meta.Compare{{Key: api.TableJobs + j.Name, Version: e.ver}}, ops: []meta.Op{putJSON(api.TableJobs+j.Name, j)},
		events: []api.Event{{Time: j.Submitted, Kind: api.EventJobSubmitted, Job: j.Name, Reason: j.Driver}}}
	e.rec, e.ver = j, e.ver+1
	ch := c.enqueueLocked(t, []commitFn{w})
	c.notifyLocked()
	c.mu.Unlock()
	return j, await(ctx, ch)
}

// StopJob stops a job's gangs (freeing their GPUs) and the job.
func (c *Controller) StopJob(ctx context.Context, name string) error {
	t, err := c.lockTerm()
	if err != nil {
		return err
	}
	e := t.jobs[name]
	if e == nil {
		c.mu.Unlock()
		return fmt.Errorf("%w: job %q", api.ErrNotFound, name)
	}
	now := c.cfg.Clock()
	var work []commitFn
	for _, g := range t.gangsOf(name) {
		if g.rec.State.Live() {
			work = append(work, t.end(g, api.GangStopped, "its job stopped", now))
		}
	}
	if e.rec.State == api.JobRunning {
		work = append(work, t.stopJob(e, now))
	}
	work = append(work, c.cycleLocked(t, now)...)
	ch := c.enqueueLocked(t, work)
	c.notifyLocked()
	c.mu.Unlock()
	return await(ctx, ch)
}

// stopJob is the commit of a running job's stop.
func (l *ledger) stopJob(e *jobEntry, now time.Time) commitFn {
	j := e.rec
	j.State, j.Stopped = api.JobStopped, now
	fn := commitFn{what: "job " + j.Name + " stopped", cmp: []meta.Compare{{Key: api.TableJobs + j.Name, Version: e.ver}}, ops: []meta.Op{putJSON(api.TableJobs+j.Name, j)},
		events: []api.Event{{Time: now, Kind: api.EventJobStopped, Job: j.Name}}}
	e.rec, e.ver = j, e.ver+1
	return fn
}

// jobEndsWith stops a job that ends with its gangs (api.Job.EndsWithGangs) when ending
// the gang ended leaves it none live.
func (l *ledger) jobEndsWith(ended *gangEntry, now time.Time) []commitFn {
	e := l.jobs[ended.rec.Spec.Job]
	if e == nil || !e.rec.EndsWithGangs || e.rec.State != api.JobRunning {
		return nil
	}
	for _, g := range l.gangsOf(e.rec.Name) {
		if g != ended && g.rec.State.Live() {
			return nil
		}
	}
	return []commitFn{l.stopJob(e, now)}
}

func (l *ledger) gangsOf(job string) []*gangEntry {
	var out []*gangEntry
	for _, g := range l.gangs {
		if g.rec.Spec.Job == job {
			out = append(out, g)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].rec.Spec.Name < out[j].rec.Spec.Name })
	return out
}

// SpawnGang admits a gang: it is committed pending in its queue and placed all-or-nothing
// as soon as the scheduler finds it room (at once when it fits now: the answer then says
// starting, with the placement). A gang that can never fit fails with api.ErrNeverFits; a
// submission past the pending bound with api.ErrSaturated and a retry hint (nothing queued
// is dropped); one naming an unknown queue or priority class with api.ErrInvalid.
func (c *Controller) SpawnGang(ctx context.Context, spec api.GangSpec) (api.Gang, error) {
	if err := spec.Normalize(); err != nil {
		return api.Gang{}, err
	}
	t, err := c.lockTerm()
	if err != nil {
		return api.Gang{}, err
	}
	// The scheduler takes the machines registered since its last cycle first: the gang
	// may be pinned to one of them. Their decisions are committed whatever the answer.
	var pre []commitFn
	if t.membersDirty {
		pre = c.membershipLocked(t, c.cfg.Clock())
	}
	unlockOnly := func() {
		if len(pre) > 0 {
			_ = c.enqueueLocked(t, pre)
			c.notifyLocked()
		}
		c.mu.Unlock()
	}
	unlock := func(err error) (api.Gang, error) { unlockOnly(); return api.Gang{}, err }
	job := t.jobs[spec.Job]
	if job == nil || job.rec.State != api.JobRunning {
		return unlock(fmt.Errorf("%w: job %q is not running", api.ErrNotFound, spec.Job))
	}
	key := spec.Key()
	old := t.gangs[key]
	if old != nil && old.rec.State.Live() {
		return unlock(fmt.Errorf("%w: gang %s is %s", api.ErrExists, key, old.rec.State))
	}
	if err := t.checkWorkerBounds(spec); err != nil {
		return unlock(err)
	}
	req, err := t.coreRequest(spec)
	if err != nil {
		return unlock(err)
	}
	now := c.cfg.Clock()
	var st gang.SubmitStatus
	switch {
	case t.sched != nil:
		st, err = t.sched.Submit(req, now)
	case c.poolStatus == nil:
		return unlock(fmt.Errorf("%w: gang %s: no machine has registered yet", api.ErrNoCapacity, key))
	case !slices.ContainsFunc(t.conf.Queues, func(q api.QueueSpec) bool { return q.Name == req.Queue || req.Queue == "" }):
		err = fmt.Errorf("gang: submit %s to queue %q: %w", key, req.Queue, gang.ErrUnknownQueue)
	default:
		// No machine yet: the pools add them, and the scheduler takes the gang then.
		st.Reason = "no machine yet: waiting for the pools to add machines"
	}
	if err != nil {
		var se *gang.SaturatedError
		switch {
		case errors.As(err, &se):
			msg := fmt.Sprintf("gang %s: cluster saturated: %d gangs wait, the bound is %d; retry in %v", key, se.Pending, se.Bound, se.RetryAfter.Round(time.Second))
			unlockOnly()
			c.obs.saturated()
			return api.Gang{}, &api.SaturatedError{Msg: msg, RetryAfter: se.RetryAfter}
		case errors.Is(err, gang.ErrNeverFits):
			return unlock(fmt.Errorf("%w: gang %s: %s", api.ErrNeverFits, key, st.Reason))
		case errors.Is(err, gang.ErrUnknownQueue):
			names := make([]string, 0, len(t.conf.Queues))
			for _, q := range t.conf.Queues {
				names = append(names, q.Name)
			}
			return unlock(fmt.Errorf("%w: gang %s: queue %q is not configured (queues: %v)", api.ErrInvalid, key, req.Queue, names))
		}
		return unlock(fmt.Errorf("%w: gang %s: %v", api.ErrInvalid, key, err))
	}
	rec := api.Gang{Spec: spec, UID: newUID(), State: api.GangPending, Reason: st.Reason, Created: now, Updated: now}
	var learned []meta.Op
	if t.sched != nil {
		// The core gave it the next sequence; the workload it learned from it goes in the
		// same transaction as the admission.
		if r, err := t.sched.Record(key); err == nil {
			t.seq = max(t.seq, int64(r.Seq))
		}
		learned = append(learned, putJSON(api.WorkloadKey, t.sched.LearnedWorkload()))
	} else {
		t.seq++
		rec.Sched = &api.GangSched{Seq: t.seq, Queued: now}
	}
	e := &gangEntry{ready: map[int]api.Worker{}}
	if old != nil {
		// A gang spawned again under the name of an ended one starts a generation after the
		// old one's: agents must not take the old workers (perhaps still stopping) for the
		// new ones, nor drivers the old workers' records.
		e.ver = old.ver
		rec.Generation = old.rec.Generation + 1
	}
	t.putGang(key, e)
	// The gang is committed pending first, then the cycle (which may place it at once).
	work := []commitFn{t.gangCommit(e, rec, "admission of "+key, learned...)}
	work = append(work, pre...)
	work = append(work, c.cycleLocked(t, now)...)
	if e.rec.State == api.GangPending && len(work[0].ops) > 0 {
		// The cycle said why it waits: the admission records it.
		work[0].ops[0] = putJSON(api.TableGangs+key, e.rec)
		for i := range work[0].events {
			work[0].events[i].Reason = e.rec.Reason
		}
		c.log.Info("gang waits", gangField(key), zap.String("reason", e.rec.Reason))
	} else {
		work[0].events = nil // placed at once: its placement is the event
	}
	rec = e.rec
	ch := c.enqueueLocked(t, work)
	c.notifyLocked()
	c.mu.Unlock()
	if err := await(ctx, ch); err != nil {
		return api.Gang{}, err
	}
	return rec, nil
}

func newUID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// StopGang stops a gang and frees its GPUs.
func (c *Controller) StopGang(ctx context.Context, job, name string) error {
	t, err := c.lockTerm()
	if err != nil {
		return err
	}
	e := t.gangs[job+"/"+name]
	if e == nil {
		c.mu.Unlock()
		return fmt.Errorf("%w: gang %s/%s", api.ErrNotFound, job, name)
	}
	if !e.rec.State.Live() {
		c.mu.Unlock()
		return nil
	}
	now := c.cfg.Clock()
	work := []commitFn{t.end(e, api.GangStopped, "stopped by its driver", now)}
	work = append(work, c.cycleLocked(t, now)...)
	ch := c.enqueueLocked(t, work)
	c.notifyLocked()
	c.mu.Unlock()
	return await(ctx, ch)
}

// end ends a gang (stopped or failed): the scheduler forgets it, its GPUs are free, and
// the run time of a gang that ran feeds the core's run-time predictor; what the predictor
// learned goes in the same commit as the end.
func (t *term) end(e *gangEntry, state api.GangState, reason string, now time.Time) commitFn {
	key := e.rec.Spec.Key()
	var learned []meta.Op
	if t.sched != nil {
		before := t.sched.LearnedRuntimes().Updates
		_ = t.sched.Complete(key, now)
		if r := t.sched.LearnedRuntimes(); r.Updates != before {
			learned = append(learned, putJSON(api.RuntimesKey, r))
		}
	}
	t.stopGangTimers(key)
	rec := e.rec
	rec.State, rec.Reason, rec.Updated, rec.RestartAt, rec.Notice = state, reason, now, time.Time{}, nil
	e.ready = map[int]api.Worker{}
	t.log.Info("gang ended", gangField(key), zap.String("state", string(state)), zap.String("reason", reason))
	return t.gangCommit(e, rec, fmt.Sprintf("gang %s %s", key, state), learned...)
}

func (t *term) fail(e *gangEntry, reason string, now time.Time) commitFn {
	return t.end(e, api.GangFailed, reason, now)
}

// restartPolicy decides, from a gang's failures within its window, whether it restarts and
// after which backoff (the first restart after Backoff, doubling up to MaxBackoff).
func restartPolicy(s api.GangSpec, failures []time.Time, now time.Time) (ok bool, backoff time.Duration, kept []time.Time) {
	window := time.Duration(s.RestartWindow)
	for _, f := range failures {
		if now.Sub(f) < window {
			kept = append(kept, f)
		}
	}
	kept = append(kept, now)
	n := len(kept)
	if n > s.MaxRestarts {
		return false, 0, kept
	}
	backoff = time.Duration(s.Backoff) << (n - 1)
	if backoff > time.Duration(s.MaxBackoff) || backoff <= 0 {
		backoff = time.Duration(s.MaxBackoff)
	}
	return true, backoff, kept
}

// WorkerReady records a worker of the gang's current generation; once every member is
// ready the gang is running.
func (c *Controller) WorkerReady(ctx context.Context, w api.Worker) error {
	t, err := c.lockTerm()
	if err != nil {
		return err
	}
	key := w.Job + "/" + w.Gang
	e := t.gangs[key]
	switch {
	case e == nil:
		c.mu.Unlock()
		return fmt.Errorf("%w: gang %s", api.ErrNotFound, key)
	case e.rec.Generation != w.Generation || (w.GangUID != "" && w.GangUID != e.rec.UID) ||
		(e.rec.State != api.GangStarting && e.rec.State != api.GangRunning):
		err := fmt.Errorf("%w: gang %s is %s in generation %d; worker %d is of generation %d", api.ErrStale, key, e.rec.State, e.rec.Generation, w.Rank, w.Generation)
		c.mu.Unlock()
		return err
	case e.rec.Placement == nil || w.Rank < 0 || w.Rank >= len(e.rec.Placement.Members) || e.rec.Placement.Members[w.Rank].Removed:
		c.mu.Unlock()
		return fmt.Errorf("%w: gang %s has no member %d", api.ErrInvalid, key, w.Rank)
	}
	e.ready[w.Rank] = w
	ops := []meta.Op{putJSON(api.TableWorkers+api.WorkerKey(w.Job, w.Gang, w.Rank), w)}
	work := []commitFn{{what: fmt.Sprintf("worker %s/%d", key, w.Rank), ops: ops}}
	if e.rec.State == api.GangStarting && allReady(e) {
		rec := e.rec
		rec.State, rec.Updated, rec.Reason = api.GangRunning, c.cfg.Clock(), ""
		work = []commitFn{t.gangCommit(e, rec, "gang "+key+" running", ops...)}
		c.log.Info("gang running", gangField(key), zap.Int("generation", rec.Generation))
	}
	ch := c.enqueueLocked(t, work)
	c.notifyLocked()
	c.mu.Unlock()
	return await(ctx, ch)
}

// WorkerExited handles a worker that stopped without being asked to: its gang restarts
// all-for-one (the next generation on the same GPUs, after a backoff), or fails once out of
// restarts (or at once for a permanent error) and frees its GPUs.
func (c *Controller) WorkerExited(ctx context.Context, x api.WorkerExit) error {
	t, err := c.lockTerm()
	if err != nil {
		return err
	}
	key := x.Job + "/" + x.Gang
	e := t.gangs[key]
	if e == nil || e.rec.Generation != x.Generation || (e.rec.State != api.GangStarting && e.rec.State != api.GangRunning) {
		c.mu.Unlock()
		return nil // an exit of an ended generation: its restart is already decided
	}
	now := c.cfg.Clock()
	reason := fmt.Sprintf("worker %d on %s exited: %s", x.Rank, x.Machine, x.Reason)
	if p := e.rec.Spec.Process; p != nil && x.Yielded && !stopOrResize(e.rec.Notice) {
		x.Yielded = false // the yield code without a notice to answer: a failure
		reason = fmt.Sprintf("worker %d on %s exited with its yield code %d with no notice to answer", x.Rank, x.Machine, p.YieldExitCode)
	}
	if e.rec.Spec.Process != nil && (x.Completed || x.Yielded) {
		work := c.processExitLocked(t, e, x, now)
		ch := c.enqueueLocked(t, work)
		c.notifyLocked()
		c.mu.Unlock()
		return await(ctx, ch)
	}
	var work []commitFn
	ok, backoff, kept := restartPolicy(e.rec.Spec, e.rec.Failures, now)
	switch {
	case x.Completed && e.rec.Spec.Driver:
		work = append(work, t.end(e, api.GangStopped, "completed: the driver exited with status 0", now))
		work = append(work, c.cycleLocked(t, now)...)
	case x.Permanent:
		work = append(work, t.fail(e, reason+" (permanent: a restart cannot help)", now))
		work = append(work, t.jobEndsWith(e, now)...)
		work = append(work, c.cycleLocked(t, now)...)
	case !ok:
		work = append(work, t.fail(e, fmt.Sprintf("%s, after %d restarts within %v", reason, e.rec.Spec.MaxRestarts, time.Duration(e.rec.Spec.RestartWindow)), now))
		work = append(work, t.jobEndsWith(e, now)...)
		work = append(work, c.cycleLocked(t, now)...)
	case e.rec.Notice != nil && (e.rec.Notice.Kind == api.NoticePreempt || e.rec.Notice.Kind == api.NoticeDrain):
		// It was to stop anyway: it stops now and queues again.
		ck := t.ckpt[key]
		work = append(work, t.evict(e, !ck.at.IsZero() && ck.at.After(e.rec.Notice.Issued), ck.step, reason, now)...)
		work = append(work, c.cycleLocked(t, now)...)
	default:
		t.stopNoticeTimer(key)
		rec := e.rec
		if n := rec.Notice; n != nil && n.Kind == api.NoticeShrink {
			t.dropMembers(&rec, n.Remove, now) // the restart takes the shrink
		}
		rec.Generation++
		rec.Restarts++
		rec.Failures = kept
		rec.World, rec.Notice = nil, nil
		rec.State, rec.Reason, rec.Updated = api.GangRestarting, reason, now
		rec.RestartAt = now.Add(backoff)
		e.ready = map[int]api.Worker{}
		work = append(work, t.gangCommit(e, rec, "restart of "+key))
		c.armRestartLocked(t, key, rec.Generation, rec.RestartAt)
		c.log.Warn("worker exited; the gang restarts all-for-one", gangField(key), zap.Int("rank", x.Rank),
			zap.String("reason", x.Reason), zap.Int("generation", rec.Generation), zap.Duration("backoff", backoff))
	}
	ch := c.enqueueLocked(t, work)
	c.notifyLocked()
	c.mu.Unlock()
	return await(ctx, ch)
}

// allReady reports whether every member of the gang's world is ready.
func allReady(e *gangEntry) bool {
	for _, i := range e.rec.Ranks() {
		if _, ok := e.ready[i]; !ok {
			return false
		}
	}
	return true
}

// armRestartLocked starts generation gen of a restarting gang at a time.
func (c *Controller) armRestartLocked(t *term, key string, gen int, at time.Time) {
	if tm := t.timers[key]; tm != nil {
		tm.Stop()
	}
	t.timers[key] = time.AfterFunc(max(0, at.Sub(c.cfg.Clock())), func() { c.startGeneration(t, key, gen) })
}

func (c *Controller) startGeneration(t *term, key string, gen int) {
	c.mu.Lock()
	if c.t != t {
		c.mu.Unlock()
		return
	}
	delete(t.timers, key)
	e := t.gangs[key]
	if e == nil || e.rec.State != api.GangRestarting || e.rec.Generation != gen {
		c.mu.Unlock()
		return
	}
	rec := e.rec
	rec.State, rec.RestartAt, rec.Updated = api.GangStarting, time.Time{}, c.cfg.Clock()
	w := t.gangCommit(e, rec, fmt.Sprintf("generation %d of %s", gen, key))
	ch := c.enqueueLocked(t, []commitFn{w})
	c.notifyLocked()
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := await(ctx, ch); err != nil {
		c.log.Warn("could not start the next generation", gangField(key), zap.Error(err))
	}
}

// lost handles a gang that lost members with their machine: it restarts in the next
// generation wherever the scheduler places it, and waits in its queue, with its reason,
// while nothing fits: a lost machine never fails a gang (it keeps its place in the queue
// order, its aging and its attained service). It is not the gang's failure either: it does
// not count against MaxRestarts, which stops a program that keeps crashing. The caller
// runs the cycle that places it.
func (t *term) lost(e *gangEntry, reason string, now time.Time) []commitFn {
	key := e.rec.Spec.Key()
	t.stopGangTimers(key)
	rec := e.rec
	rec.Generation++
	rec.Restarts++
	rec.State, rec.Placement, rec.RestartAt, rec.Updated = api.GangPending, nil, time.Time{}, now
	rec.Reason = "restarting elsewhere: " + reason
	rec.World, rec.Notice = nil, nil
	e.ready = map[int]api.Worker{}
	if t.sched != nil {
		st, err := t.sched.GangStatus(key)
		if err == nil && st.State != gang.GangPending {
			_ = t.sched.Finish(key, now)
		}
		if err != nil || st.State != gang.GangPending {
			// Not requeued by the scheduler (it was never adopted): queued again with its
			// record, from now.
			req, rerr := t.coreRequest(rec.Spec)
			if rerr == nil {
				r := t.coreRecord(rec)
				r.Queued, r.Started, r.Stopping, r.ShrinkTo, r.ShrinkIndex, r.Hold = now, time.Time{}, false, 0, nil, nil
				rerr = t.sched.Restore(req, r, nil)
			}
			if rerr != nil {
				return []commitFn{t.fail(e, "lost its machine and can never be placed: "+rerr.Error(), now)}
			}
			t.checkpointToCore(key)
		}
	}
	t.log.Warn("gang lost members with their machine; it restarts elsewhere", gangField(key), zap.String("reason", reason), zap.Int("generation", rec.Generation))
	return []commitFn{t.gangCommit(e, rec, "re-placement of "+key)}
}
