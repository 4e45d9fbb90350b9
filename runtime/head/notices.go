package head

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"time"

	"go.uber.org/zap"

	"github.com/atoll-run/atoll/gang"
	"github.com/atoll-run/atoll/runtime/api"
)

// The notice path: how the scheduler's decisions to stop, shrink or grow a running gang are
// carried out.
//
//  1. A cycle decides a preemption (or a shrink, or a grow); the leader commits the gang's
//     record with a Notice (kind, deadline, the gang it makes room for, the cost).
//  2. The gang's driver sees it (the SDK follows the record), takes it at a step boundary
//     and answers: after a just-in-time checkpoint for a stop (POST /v1/gangs/yield), with
//     the new world of members for a resize (POST /v1/gangs/world).
//  3. The leader carries it out: a stopped gang goes back to its queue (the next generation,
//     pending; it resumes from its newest checkpoint when placed again), a shrink marks the
//     dropped members removed (their agents stop them; the others keep their processes)
//     and frees their capacity; then a cycle places the gang the room was made for.
//  4. Past the deadline the leader acts alone: a stop loses the work since the newest
//     checkpoint, a shrink restarts the gang at its new size from it.
//
// Operators' drains and the pools' spot interruptions use the same path (NoticeDrain).

// noticeTimer names a gang's notice timer in term.timers.
func noticeTimer(key string) string { return "notice/" + key }

// armNoticeLocked arms the deadline of a gang's stop or shrink notice.
func (c *Controller) armNoticeLocked(t *term, e *gangEntry) {
	n := e.rec.Notice
	if n == nil || n.Kind == api.NoticeGrow || n.Kind == api.NoticeTimeLimit || n.Deadline.IsZero() {
		return // a time limit is the sweep's (timelimit.go)
	}
	key, uid, gen, issued := e.rec.Spec.Key(), e.rec.UID, e.rec.Generation, n.Issued
	name := noticeTimer(key)
	if tm := t.timers[name]; tm != nil {
		tm.Stop()
	}
	t.timers[name] = time.AfterFunc(max(0, n.Deadline.Sub(c.cfg.Clock())), func() { c.noticeExpired(t, key, uid, gen, issued) })
}

func (l *ledger) stopNoticeTimer(key string) {
	if tm := l.timers[noticeTimer(key)]; tm != nil {
		tm.Stop()
		delete(l.timers, noticeTimer(key))
	}
}

// noticeExpired acts on a notice whose deadline passed without an answer.
func (c *Controller) noticeExpired(t *term, key, uid string, gen int, issued time.Time) {
	c.mu.Lock()
	if c.t != t {
		c.mu.Unlock()
		return
	}
	delete(t.timers, noticeTimer(key))
	e := t.gangs[key]
	if e == nil || e.rec.UID != uid || e.rec.Generation != gen || e.rec.Notice == nil || !e.rec.Notice.Issued.Equal(issued) {
		c.mu.Unlock()
		return
	}
	now := c.cfg.Clock()
	var work []commitFn
	switch e.rec.Notice.Kind {
	case api.NoticeShrink:
		c.log.Warn("a shrink was not taken by its deadline; the gang restarts at its new size", gangField(key))
		work = t.forceShrink(e, now)
	default:
		ck := t.ckpt[key]
		checkpointed := !ck.at.IsZero() && ck.at.After(issued)
		c.log.Warn("a stop notice was not answered by its deadline; the gang stops", gangField(key), zap.Bool("checkpointed", checkpointed))
		work = t.evict(e, checkpointed, ck.step, "its deadline passed", now)
	}
	work = append(work, c.cycleLocked(t, now)...)
	ch := c.enqueueLocked(t, work)
	c.notifyLocked()
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := await(ctx, ch); err != nil {
		c.log.Warn("could not carry out an expired notice", gangField(key), zap.Error(err))
	}
}

// costsOf turns the scheduler's eviction cost into the record's.
func costsOf(ec gang.EvictionCost) *api.EvictionCosts {
	return &api.EvictionCosts{WorkLost: ec.LostWork.Seconds(), Checkpoint: ec.Save.Seconds(), Restore: ec.Restore.Seconds(),
		CUDAContext: ec.CUDAContext.Seconds(), Communicator: ec.Communicator.Seconds(), GPUSeconds: ec.GPUSeconds}
}

// preemptLocked gives a victim of the cycle its stop notice.
func (c *Controller) preemptLocked(t *term, p gang.Preemption, now time.Time) []commitFn {
	e := t.gangs[p.Victim]
	if e == nil || !e.rec.State.Live() {
		return nil
	}
	if n := e.rec.Notice; n != nil && (n.Kind == api.NoticePreempt || n.Kind == api.NoticeDrain) {
		return nil // asked already (a rebuilt scheduler decides it again)
	}
	reason := fmt.Sprintf("%s preemption for %s: its eviction costs %.0f GPU-seconds", p.Reason, p.For, p.Cost)
	if e.rec.State != api.GangRunning && e.rec.State != api.GangStarting {
		// Restarting (waiting for its backoff): nothing runs that could checkpoint.
		return t.evict(e, false, 0, reason, now)
	}
	rec := e.rec
	rec.Notice = &api.Notice{Kind: api.NoticePreempt, Issued: now, Deadline: p.Deadline, For: p.For, Reason: reason, Costs: costsOf(p.Costs)}
	rec.Updated = now
	w := t.gangCommit(e, rec, "preemption notice to "+p.Victim)
	c.armNoticeLocked(t, e)
	c.obs.preemptions.Inc()
	c.obs.preemptCost.Add(p.Costs.LostWork.Seconds() * p.Costs.GPUs)
	c.log.Info("preemption notice", gangField(p.Victim), zap.String("for", p.For), zap.Time("deadline", p.Deadline),
		zap.Float64("cost_gpu_s", p.Cost))
	return []commitFn{w}
}

// evict stops a gang that answered its stop notice (or whose deadline passed): it
// goes back to its queue as its next generation, and resumes from its newest checkpoint
// when placed again.
func (t *term) evict(e *gangEntry, checkpointed bool, step int64, why string, now time.Time) []commitFn {
	key := e.rec.Spec.Key()
	if t.sched != nil {
		if err := t.sched.Evicted(key, now, checkpointed); err != nil {
			// The scheduler did not hold it running: queue it again with its record.
			_ = t.sched.Finish(key, now)
			if req, err := t.coreRequest(e.rec.Spec); err == nil {
				r := t.coreRecord(e.rec)
				r.Queued, r.Started, r.Stopping, r.ShrinkTo, r.ShrinkIndex, r.Hold = now, time.Time{}, false, 0, nil, nil
				_ = t.sched.Restore(req, r, nil)
			}
		}
	}
	t.stopNoticeTimer(key)
	if tm := t.timers[key]; tm != nil {
		tm.Stop()
		delete(t.timers, key)
	}
	rec := e.rec
	kind, forGang := api.NoticePreempt, ""
	if rec.Notice != nil {
		kind, forGang = rec.Notice.Kind, rec.Notice.For
	}
	rec.Generation++
	rec.Preemptions++
	rec.State, rec.Placement, rec.World, rec.Notice, rec.RestartAt, rec.Updated = api.GangPending, nil, nil, nil, time.Time{}, now
	resume := "the newest checkpoint"
	if checkpointed && step > 0 {
		resume = fmt.Sprintf("its checkpoint of step %d, taken since the notice", step)
	} else if !checkpointed {
		resume = "its newest checkpoint (none was taken since the notice)"
	}
	rec.Reason = fmt.Sprintf("%s", kind)
	if forGang != "" {
		rec.Reason += " for " + forGang
	}
	rec.Reason += fmt.Sprintf(" (%s); queued again, resumes from %s", why, resume)
	e.ready = map[int]api.Worker{}
	t.log.Info("gang stopped on notice; queued again", gangField(key), zap.Bool("checkpointed", checkpointed), zap.Int("generation", rec.Generation))
	return []commitFn{t.gangCommit(e, rec, "eviction of "+key)}
}

// Yield carries out a driver's answer to a stop notice: the gang stops now and queues again.
func (c *Controller) Yield(ctx context.Context, y api.Yield) error {
	t, err := c.lockTerm()
	if err != nil {
		return err
	}
	key := y.Job + "/" + y.Gang
	e := t.gangs[key]
	switch {
	case e == nil:
		c.mu.Unlock()
		return fmt.Errorf("%w: gang %s", api.ErrNotFound, key)
	case e.rec.UID != y.UID || e.rec.Generation != y.Generation:
		c.mu.Unlock()
		return fmt.Errorf("%w: gang %s is in generation %d; the answer is of %d", api.ErrStale, key, e.rec.Generation, y.Generation)
	case e.rec.Notice == nil || (e.rec.Notice.Kind != api.NoticePreempt && e.rec.Notice.Kind != api.NoticeDrain && e.rec.Notice.Kind != api.NoticeTimeLimit):
		c.mu.Unlock()
		return fmt.Errorf("%w: gang %s has no stop notice to answer", api.ErrInvalid, key)
	}
	now := c.cfg.Clock()
	if e.rec.Notice.Kind == api.NoticeTimeLimit { // its time is up: it stops, not queued again
		why := fmt.Sprintf("stopped at its time limit of %v", time.Duration(e.rec.Spec.TimeLimit))
		if y.Checkpointed {
			why += fmt.Sprintf(", after its checkpoint of step %d", y.Step)
		}
		work := []commitFn{t.end(e, api.GangStopped, why, now)}
		work = append(work, c.cycleLocked(t, now)...)
		ch := c.enqueueLocked(t, work)
		c.notifyLocked()
		c.mu.Unlock()
		return await(ctx, ch)
	}
	if y.Checkpointed {
		ck := ckptInfo{at: now, step: y.Step, bytes: t.ckpt[key].bytes, save: t.ckpt[key].save}
		if m, ok := c.manifestLocked(y.Job, y.Gang, y.Step); ok {
			ck = m
		}
		t.ckpt[key] = ck
	}
	work := t.evict(e, y.Checkpointed, y.Step, "answered its notice", now)
	work = append(work, c.cycleLocked(t, now)...)
	ch := c.enqueueLocked(t, work)
	c.notifyLocked()
	c.mu.Unlock()
	return await(ctx, ch)
}

// resizeLocked records a cycle's resize of a running elastic gang: a grow's members are
// placed now (their agents start them) and its program is told; a shrink's program is
// asked to drop members by the deadline.
func (c *Controller) resizeLocked(t *term, r gang.Resize, now time.Time) []commitFn {
	e := t.gangs[r.Gang]
	if e == nil || e.rec.Placement == nil || !e.rec.State.Live() {
		return nil
	}
	rec := e.rec
	p := *rec.Placement
	p.Members = slices.Clone(p.Members)
	rec.Placement = &p
	rec.Updated = now
	key := r.Gang
	if len(r.Add) > 0 {
		if rec.World == nil || len(rec.World.Members) == 0 {
			// The program works with the members it has until it takes the grow.
			rec.World = &api.World{Members: rec.Active()}
		}
		added := t.placement(gang.Placement{Gang: key, Members: r.Add})
		var idx []int
		for _, m := range added.Members {
			idx = append(idx, len(p.Members))
			p.Members = append(p.Members, m)
			if !slices.Contains(p.Machines, m.Machine) {
				p.Machines = append(p.Machines, m.Machine)
			}
		}
		switch n := rec.Notice; {
		case n == nil:
			rec.Notice = &api.Notice{Kind: api.NoticeGrow, Issued: now, From: r.From, To: r.To, Add: idx, Reason: r.Reason}
		case n.Kind == api.NoticeGrow: // not taken yet: one grow, larger
			g := *n
			g.Add, g.To, g.Issued = append(slices.Clone(n.Add), idx...), r.To, now
			rec.Notice = &g
		default: // a stop or shrink is under way: the new members wait for the next world
			c.log.Info("a grow while another notice runs: the new members join at the next resize", gangField(key))
		}
		c.log.Info("elastic gang grows", gangField(key), zap.Int("from", r.From), zap.Int("to", r.To))
		return []commitFn{t.gangCommit(e, rec, "grow of "+key)}
	}
	if len(r.Remove) == 0 {
		return nil
	}
	if n := rec.Notice; n != nil && n.Kind != api.NoticeGrow {
		return nil // a stop or another shrink is under way
	}
	active := rec.Active()
	var remove []int
	for _, i := range r.RemoveIndex {
		if i >= 0 && i < len(active) {
			remove = append(remove, active[i])
		}
	}
	if len(remove) != len(r.RemoveIndex) {
		c.log.Error("a shrink names members the gang does not have", gangField(key), zap.Ints("remove", r.RemoveIndex), zap.Int("active", len(active)))
		return nil
	}
	reason := fmt.Sprintf("%s shrink for %s: %d -> %d members", r.Cause, r.For, r.From, r.To)
	rec.Notice = &api.Notice{Kind: api.NoticeShrink, Issued: now, Deadline: r.Deadline, For: r.For, Reason: reason,
		From: r.From, To: r.To, Remove: remove, Costs: costsOf(r.Cost)}
	w := t.gangCommit(e, rec, "shrink notice to "+key)
	c.armNoticeLocked(t, e)
	c.log.Info("elastic gang asked to shrink", gangField(key), zap.Int("from", r.From), zap.Int("to", r.To), zap.String("for", r.For))
	return []commitFn{w}
}

// TakeWorld carries out a driver taking a resize: after a shrink its program works without
// the removed members (their agents stop them, their capacity goes to the gang it was
// made for), after a grow with the new ones (every one of them ready).
func (c *Controller) TakeWorld(ctx context.Context, w api.WorldChange) error {
	t, err := c.lockTerm()
	if err != nil {
		return err
	}
	key := w.Job + "/" + w.Gang
	e := t.gangs[key]
	fail := func(err error) error { c.mu.Unlock(); return err }
	switch {
	case e == nil:
		return fail(fmt.Errorf("%w: gang %s", api.ErrNotFound, key))
	case e.rec.UID != w.UID || e.rec.Generation != w.Generation:
		return fail(fmt.Errorf("%w: gang %s is in generation %d; the world is of %d", api.ErrStale, key, e.rec.Generation, w.Generation))
	case e.rec.Notice == nil || (e.rec.Notice.Kind != api.NoticeShrink && e.rec.Notice.Kind != api.NoticeGrow):
		return fail(fmt.Errorf("%w: gang %s has no resize to take", api.ErrInvalid, key))
	}
	epoch := 0
	if e.rec.World != nil {
		epoch = e.rec.World.Epoch
	}
	if w.Epoch != epoch+1 {
		return fail(fmt.Errorf("%w: gang %s is at world epoch %d; the new world must be %d, not %d", api.ErrStale, key, epoch, epoch+1, w.Epoch))
	}
	n := e.rec.Notice
	now := c.cfg.Clock()
	rec := e.rec
	var want []int
	switch n.Kind {
	case api.NoticeShrink:
		for _, i := range rec.Active() {
			if !slices.Contains(n.Remove, i) {
				want = append(want, i)
			}
		}
	case api.NoticeGrow:
		want = rec.Active()
		for _, i := range n.Add {
			if _, ok := e.ready[i]; !ok {
				return fail(fmt.Errorf("%w: gang %s: new member %d is not ready yet", api.ErrUnavailable, key, i))
			}
		}
	}
	if !slices.Equal(w.Members, want) {
		return fail(fmt.Errorf("%w: gang %s: the new world %v is not the members %v", api.ErrInvalid, key, w.Members, want))
	}
	from := len(rec.Ranks())
	var work []commitFn
	if n.Kind == api.NoticeShrink {
		t.dropMembers(&rec, n.Remove, now)
		for _, i := range n.Remove {
			delete(e.ready, i)
		}
		c.obs.resizes.WithLabelValues("shrink").Inc()
	} else {
		c.obs.resizes.WithLabelValues("grow").Inc()
	}
	t.stopNoticeTimer(key)
	rec.World = &api.World{Epoch: w.Epoch, Members: slices.Clone(w.Members)}
	rec.Notice = nil
	rec.Resizes++
	rec.Reason = fmt.Sprintf("resized %d -> %d members (%s)", from, len(w.Members), n.Kind)
	rec.Updated = now
	work = append(work, t.gangCommit(e, rec, "world of "+key))
	work = append(work, c.cycleLocked(t, now)...)
	c.log.Info("elastic gang resized", gangField(key), zap.Int("from", from), zap.Int("to", len(w.Members)), zap.Int("epoch", w.Epoch))
	ch := c.enqueueLocked(t, work)
	c.notifyLocked()
	c.mu.Unlock()
	return await(ctx, ch)
}

// forceShrink carries out a shrink whose deadline passed: the removed members go and
// the gang restarts at its new size (its next generation, from its newest checkpoint).
func (t *term) forceShrink(e *gangEntry, now time.Time) []commitFn {
	key := e.rec.Spec.Key()
	n := e.rec.Notice
	rec := e.rec
	t.dropMembers(&rec, n.Remove, now)
	if tm := t.timers[key]; tm != nil {
		tm.Stop()
		delete(t.timers, key)
	}
	rec.Generation++
	rec.Restarts++
	rec.State, rec.World, rec.Notice, rec.Updated = api.GangStarting, nil, nil, now
	rec.Reason = fmt.Sprintf("shrink to %d members not taken by its deadline: restarted at that size", n.To)
	e.ready = map[int]api.Worker{}
	return []commitFn{t.gangCommit(e, rec, "forced shrink of "+key)}
}

// dropMembers marks a shrink's members removed in rec (a copy of the placement) and
// tells the scheduler the shrink is done: their capacity is free.
func (t *term) dropMembers(rec *api.Gang, remove []int, now time.Time) {
	p := *rec.Placement
	p.Members = slices.Clone(p.Members)
	rec.Placement = &p
	for _, i := range remove {
		if i >= 0 && i < len(p.Members) {
			p.Members[i].Removed = true
		}
	}
	if t.sched != nil {
		if err := t.sched.ResizeDone(rec.Spec.Key(), now); err != nil {
			t.log.Warn("the scheduler had no shrink of this gang pending (rebuilt since?)", gangField(rec.Spec.Key()), zap.Error(err))
		}
	}
}

// CheckpointReported records a gang's committed checkpoint: its eviction cost counts from
// here, and its size and save time feed the cost of later ones.
func (c *Controller) CheckpointReported(r api.CheckpointReport) error {
	t, err := c.lockTerm()
	if err != nil {
		return err
	}
	defer c.mu.Unlock()
	key := r.Job + "/" + r.Gang
	e := t.gangs[key]
	if e == nil || e.rec.UID != r.UID {
		return fmt.Errorf("%w: gang %s (uid %s)", api.ErrNotFound, key, r.UID)
	}
	ck := ckptInfo{at: r.At, step: r.Step, bytes: r.Bytes, save: time.Duration(r.Save)}
	if m, ok := c.manifestLocked(r.Job, r.Gang, r.Step); ok {
		// What the log says of it, as a new leader will read it.
		ck = m
	}
	if ck.at.IsZero() || ck.at.After(c.cfg.Clock()) {
		ck.at = c.cfg.Clock()
	}
	t.ckpt[key] = ck
	t.checkpointToCore(key)
	return nil
}

// manifestLocked is a gang's checkpoint of step as its manifest in the log has it.
func (c *Controller) manifestLocked(job, gang string, step int64) (ckptInfo, bool) {
	kv, ok := c.sm.Get(api.TableCheckpoints + api.CheckpointKey(job, gang, step))
	if !ok {
		return ckptInfo{}, false
	}
	var cp api.Checkpoint
	if json.Unmarshal(kv.Value, &cp) != nil {
		return ckptInfo{}, false
	}
	return ckptInfo{at: cp.Time, step: cp.Step, bytes: cp.Bytes, save: time.Duration(cp.Save)}, true
}

// ObserveCost feeds a worker's measurement (its CUDA context creation, its gang's
// communicator set-up) into the scheduler's cost model. What the model learns is
// committed per GPU model within ControllerConfig.CostFlush, every measurement of that
// time in one commit.
func (c *Controller) ObserveCost(r api.CostReport) error {
	kind, err := costKind(r.Kind)
	if err != nil {
		return err
	}
	if r.Ranks < 1 || r.Ranks > 100000 || r.Measured < 0 || r.Measured > api.Duration(time.Hour) || r.GPUModel == "" || len(r.GPUModel) > 128 {
		return fmt.Errorf("%w: cost report %+v: want ranks 1..100000, a measurement in [0, 1h] and a GPU model", api.ErrInvalid, r)
	}
	t, err := c.lockTerm()
	if err != nil {
		return err
	}
	defer c.mu.Unlock()
	if t.sched == nil {
		return nil
	}
	if err := t.sched.ObserveCost(r.GPUModel, r.Ranks, kind, time.Duration(r.Measured)); err != nil {
		return fmt.Errorf("%w: %v", api.ErrInvalid, err)
	}
	c.costsChangedLocked(t, r.GPUModel)
	c.log.Info("restart cost measured", zap.String("kind", r.Kind), zap.String("gpu_model", r.GPUModel), zap.Int("ranks", r.Ranks),
		zap.Duration("measured", time.Duration(r.Measured)), zap.String("machine", r.Machine))
	return nil
}

// costsChangedLocked marks a GPU model's learned costs to be committed within CostFlush.
func (c *Controller) costsChangedLocked(t *term, model string) {
	t.costsDirty[model] = true
	if t.costsTimer == nil {
		t.costsTimer = time.AfterFunc(c.cfg.CostFlush, func() { c.flushCosts(t) })
	}
}

// flushCosts commits the learned costs of the GPU models measured since the last flush.
func (c *Controller) flushCosts(t *term) {
	c.mu.Lock()
	if c.t != t {
		c.mu.Unlock()
		return
	}
	t.costsTimer = nil
	work := t.costsCommit()
	ch := c.enqueueLocked(t, work)
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := await(ctx, ch); err != nil {
		c.log.Warn("could not commit the learned restart costs", zap.Error(err))
	}
}

// costsCommit is the commit of the dirty GPU models' learned costs.
func (t *term) costsCommit() []commitFn {
	if t.sched == nil || len(t.costsDirty) == 0 {
		return nil
	}
	byModel := map[string]*api.LearnedCosts{}
	for _, l := range t.sched.Costs().Learned() {
		if !t.costsDirty[l.Model] {
			continue
		}
		lc := byModel[l.Model]
		if lc == nil {
			lc = &api.LearnedCosts{GPUModel: l.Model, Kinds: map[string]api.LearnedCost{}}
			byModel[l.Model] = lc
		}
		lc.Kinds[l.Kind.String()] = api.LearnedCost{Factor: l.Factor, Count: l.Count}
	}
	models := make([]string, 0, len(byModel))
	for m := range byModel {
		models = append(models, m)
	}
	sort.Strings(models)
	w := commitFn{what: fmt.Sprintf("learned costs of %v", models)}
	for _, m := range models {
		w.ops = append(w.ops, putJSON(costsKeyOf(m), byModel[m]))
	}
	t.costsDirty = map[string]bool{}
	return []commitFn{w}
}
