package head

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/atoll-run/atoll/runtime/api"
)

// Time limits. A gang with a TimeLimit (Slurm's --time) is held to it by the leader's
// sweep: its run time is the progress the scheduler kept across its stops plus the
// current run (the same measure the scheduler's backfill and run-time predictor use, so
// that a reservation made on the limit holds). One notice grace before the limit, a gang
// with JustInTime gets a NoticeTimeLimit (as Slurm's --signal warns a job): it may
// checkpoint and yield, and then stops. At the limit a gang still running fails, as
// Slurm's TIMEOUT.

// runTime is the run time a live gang used: its kept progress and, placed, the current
// run since its start (ok false: the scheduler does not hold it placed).
func (t *term) runTime(key string, now time.Time) (time.Duration, bool) {
	if t.sched == nil {
		return 0, false
	}
	r, err := t.sched.Record(key)
	if err != nil || r.Started.IsZero() {
		return 0, false
	}
	return r.Progress + max(0, now.Sub(r.Started)), true
}

// enforceTimeLimits warns the gangs whose time limit is within a notice grace and fails
// those past it.
func (c *Controller) enforceTimeLimits() {
	c.mu.Lock()
	t := c.t
	if t == nil {
		c.mu.Unlock()
		return
	}
	now := c.cfg.Clock()
	grace := time.Duration(t.conf.NoticeGrace)
	var work []commitFn
	for key, e := range t.gangs {
		limit := time.Duration(e.rec.Spec.TimeLimit)
		if limit <= 0 || (e.rec.State != api.GangStarting && e.rec.State != api.GangRunning) {
			continue
		}
		used, ok := t.runTime(key, now)
		if !ok {
			continue
		}
		switch left := limit - used; {
		case left <= 0:
			c.log.Warn("a gang reached its time limit; it fails", gangField(key), zap.Duration("limit", limit), zap.Duration("ran", used))
			work = append(work, t.fail(e, fmt.Sprintf("time limit of %v reached (ran %v)", limit, used.Round(time.Millisecond)), now))
		case left <= grace && e.rec.Spec.JustInTime && e.rec.Notice == nil:
			rec := e.rec
			rec.Notice = &api.Notice{Kind: api.NoticeTimeLimit, Issued: now, Deadline: now.Add(left),
				Reason: fmt.Sprintf("its time limit of %v ends in %v: checkpoint and yield to stop there", limit, left.Round(time.Millisecond))}
			rec.Updated = now
			work = append(work, t.gangCommit(e, rec, "time limit notice to "+key))
			c.log.Info("time limit notice", gangField(key), zap.Time("deadline", rec.Notice.Deadline))
		}
	}
	if len(work) == 0 {
		c.mu.Unlock()
		return
	}
	work = append(work, c.cycleLocked(t, now)...)
	ch := c.enqueueLocked(t, work)
	c.notifyLocked()
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := await(ctx, ch); err != nil {
		c.log.Warn("could not hold the gangs to their time limits", zap.Error(err))
	}
}
