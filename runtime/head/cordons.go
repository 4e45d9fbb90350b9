package head

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/store/meta"
)

// Cordons and drains are operator intent (or the pools'), so they live in the log
// (api.Cordon under api.CordonsPrefix): they outlive leader changes and the machine's own
// restarts, and the status shows them with who placed them, why and when. A cordoned
// machine takes no new gangs; a drained one has also given its gangs drain notices.

// PoolsBy is the By of the cordons and drains the pools place.
const PoolsBy = "pools"

// Cordon stops (on) or resumes (off) placing new gangs on a machine: the pools drain a
// machine this way before removing it. Gangs already there keep running.
func (c *Controller) Cordon(ctx context.Context, name string, on bool) error {
	if !on {
		return c.Undrain(ctx, name, PoolsBy)
	}
	return c.cordon(ctx, name, api.Cordon{By: PoolsBy, Reason: "the pools drain it before removing it"}, false, time.Time{})
}

// Drain asks every gang with a member on a machine to checkpoint and stop by deadline
// (the same path as a preemption): a spot interruption, a scale-down (the pools). The
// machine takes no new gangs from now on (it is cordoned). Operators drain with DrainAs.
func (c *Controller) Drain(ctx context.Context, machine string, deadline time.Time, reason string) error {
	return c.cordon(ctx, machine, api.Cordon{By: PoolsBy, Reason: reason}, true, deadline)
}

// DrainAs is an operator's drain (atoll drain): as Drain, recorded as by by.
func (c *Controller) DrainAs(ctx context.Context, by string, d api.DrainRequest) error {
	if by == "" {
		by = "an operator"
	}
	return c.cordon(ctx, d.Machine, api.Cordon{By: by, Reason: d.Reason}, true, d.Deadline)
}

// cordon records a machine's cordon (and, for a drain, gives its gangs drain notices).
func (c *Controller) cordon(ctx context.Context, machine string, cd api.Cordon, drain bool, deadline time.Time) error {
	if len(cd.Reason) > 1024 || len(cd.By) > 256 {
		return fmt.Errorf("%w: a cordon's reason is at most 1 KiB and its author 256 bytes", api.ErrInvalid)
	}
	t, err := c.lockTerm()
	if err != nil {
		return err
	}
	if t.machines[machine] == nil {
		c.mu.Unlock()
		return fmt.Errorf("%w: machine %q", api.ErrNotFound, machine)
	}
	now := c.cfg.Clock()
	var work []commitFn
	old := t.cordons[machine]
	if old == nil || (drain && !old.Drain) {
		cd.Machine, cd.At, cd.Drain = machine, now, drain
		if old != nil && old.Drain {
			cd.Drain = true
		}
		key := api.CordonsPrefix + machine
		reason := "cordoned by " + cd.By
		if drain {
			reason = "drained by " + cd.By
		}
		if cd.Reason != "" {
			reason += ": " + cd.Reason
		}
		work = append(work, commitFn{what: "cordon of " + machine, ops: []meta.Op{putJSON(key, cd)},
			events: []api.Event{{Time: now, Kind: api.EventMachineCordoned, Machine: machine, Reason: reason}}})
		t.cordons[machine] = &cd
		t.cordonToCore(machine)
		c.log.Info("machine cordoned", zap.String("machine", machine), zap.String("by", cd.By), zap.String("reason", cd.Reason), zap.Bool("drain", drain))
	}
	if drain {
		if deadline.IsZero() || deadline.Before(now) {
			deadline = now.Add(time.Duration(t.conf.NoticeGrace))
		}
		why := cd.Reason
		if why == "" && old != nil {
			why = old.Reason
		}
		for _, e := range t.gangsOn(machine) {
			if n := e.rec.Notice; n != nil && (n.Kind == api.NoticeDrain || n.Kind == api.NoticePreempt) {
				continue
			}
			if e.rec.State != api.GangRunning && e.rec.State != api.GangStarting {
				work = append(work, t.evict(e, false, 0, "its machine "+machine+" is drained: "+why, now)...)
				continue
			}
			rec := e.rec
			rec.Notice = &api.Notice{Kind: api.NoticeDrain, Issued: now, Deadline: deadline, Reason: "machine " + machine + " is drained: " + why}
			rec.Updated = now
			work = append(work, t.gangCommit(e, rec, "drain notice to "+rec.Spec.Key()))
			c.armNoticeLocked(t, e)
		}
	}
	work = append(work, c.cycleLocked(t, now)...)
	ch := c.enqueueLocked(t, work)
	c.notifyLocked()
	c.mu.Unlock()
	return await(ctx, ch)
}

// Undrain lifts a machine's cordon or drain (atoll undrain): new gangs may be placed on
// it again. Drain notices already given stand (their gangs may be checkpointing).
func (c *Controller) Undrain(ctx context.Context, machine, by string) error {
	t, err := c.lockTerm()
	if err != nil {
		return err
	}
	old := t.cordons[machine]
	if old == nil {
		known := t.machines[machine] != nil
		c.mu.Unlock()
		if !known {
			return fmt.Errorf("%w: machine %q", api.ErrNotFound, machine)
		}
		return nil
	}
	now := c.cfg.Clock()
	if by == "" {
		by = "an operator"
	}
	key := api.CordonsPrefix + machine
	work := []commitFn{{what: "undrain of " + machine, ops: []meta.Op{{Type: meta.OpDelete, Key: key}},
		events: []api.Event{{Time: now, Kind: api.EventMachineUncordoned, Machine: machine, Reason: fmt.Sprintf("cordon lifted by %s (it was placed by %s)", by, old.By)}}}}
	delete(t.cordons, machine)
	t.cordonToCore(machine)
	c.log.Info("machine cordon lifted", zap.String("machine", machine), zap.String("by", by))
	work = append(work, c.cycleLocked(t, now)...)
	ch := c.enqueueLocked(t, work)
	c.notifyLocked()
	c.mu.Unlock()
	return await(ctx, ch)
}

// cordonToCore gives the scheduler a machine's cordon as it stands in the cache.
func (t *term) cordonToCore(machine string) {
	if t.sched == nil {
		return
	}
	if i, ok := t.index[machine]; ok {
		_ = t.sched.SetUnschedulable(i, t.cordons[machine] != nil)
	}
}
