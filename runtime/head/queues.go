package head

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"time"

	"go.uber.org/zap"

	"github.com/atoll-run/atoll/gang"
	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/store/meta"
)

// SchedulerConfig returns the operator's scheduler configuration (queues, priority
// classes, notice grace) as the leader applies it.
func (c *Controller) SchedulerConfig() (api.SchedulerConfig, error) {
	t, err := c.lockTerm()
	if err != nil {
		return api.SchedulerConfig{}, err
	}
	defer c.mu.Unlock()
	return t.conf, nil
}

// SetSchedulerConfig validates and commits a new scheduler configuration, then rebuilds the
// scheduler with it (running gangs keep running; pending ones queue again under the new
// queues). A configuration that drops a queue or a priority class that a live gang names
// is refused, with the gangs.
func (c *Controller) SetSchedulerConfig(ctx context.Context, conf api.SchedulerConfig) (api.SchedulerConfig, error) {
	if err := conf.Validate(); err != nil {
		return api.SchedulerConfig{}, err
	}
	t, err := c.lockTerm()
	if err != nil {
		return api.SchedulerConfig{}, err
	}
	queues, classes := map[string]bool{}, map[string]bool{}
	for _, q := range conf.Queues {
		queues[q.Name] = true
	}
	for _, p := range conf.PriorityClasses {
		classes[p.Name] = true
	}
	var orphans []string
	for key, e := range t.gangs {
		if !e.rec.State.Live() {
			continue
		}
		if q := e.rec.Spec.Queue; q != "" && !queues[q] {
			orphans = append(orphans, fmt.Sprintf("%s (queue %s)", key, q))
		}
		if pc := e.rec.Spec.PriorityClass; pc != "" && !classes[pc] {
			orphans = append(orphans, fmt.Sprintf("%s (priority class %s)", key, pc))
		}
	}
	ver := t.confVer
	c.mu.Unlock()
	if len(orphans) > 0 {
		sort.Strings(orphans)
		return api.SchedulerConfig{}, fmt.Errorf("%w: the new configuration drops what live gangs name: %v", api.ErrInvalid, orphans)
	}
	if err := c.logw.commit(ctx, []meta.Compare{{Key: api.SchedulerConfigKey, Version: ver}}, []meta.Op{putJSON(api.SchedulerConfigKey, conf)}); err != nil {
		return api.SchedulerConfig{}, err
	}
	t, err = c.lockTerm()
	if err != nil {
		return conf, nil // committed; the next leader applies it
	}
	if t.confVer != ver {
		c.mu.Unlock()
		return conf, nil
	}
	t.conf, t.confVer = conf, ver+1
	now := c.cfg.Clock()
	work := c.reconfigureLocked(t, now)
	work = append(work, c.cycleLocked(t, now)...)
	ch := c.enqueueLocked(t, work)
	c.notifyLocked()
	c.mu.Unlock()
	c.log.Info("scheduler configuration set", zap.Int("queues", len(conf.Queues)), zap.Int("priority_classes", len(conf.PriorityClasses)))
	return conf, await(ctx, ch)
}

// reconfigureLocked gives the scheduler the operator's configuration as it stands in the
// cache (queues, priority classes, guards; whether the pools may grow the cluster), as a
// delta: every gang keeps its state and placement and moves to its queue and priority
// under it. A gang the configuration leaves no queue fails (SetSchedulerConfig refuses
// such a configuration while a gang is live; this is a log written otherwise).
func (c *Controller) reconfigureLocked(t *term, now time.Time) []commitFn {
	if t.sched == nil {
		return nil
	}
	moves := map[string]gang.Requeue{}
	var work []commitFn
	keys := make([]string, 0, len(t.gangs))
	for k := range t.gangs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		e := t.gangs[k]
		if _, err := t.sched.GangStatus(k); err != nil {
			continue
		}
		req, err := t.coreRequest(e.rec.Spec)
		if err == nil && !slices.ContainsFunc(t.conf.Queues, func(q api.QueueSpec) bool { return q.Name == req.Queue }) {
			err = fmt.Errorf("queue %q is not configured", req.Queue)
		}
		if err != nil {
			work = append(work, t.fail(e, "can never be placed under the new configuration: "+err.Error(), now))
			continue
		}
		moves[k] = gang.Requeue{Queue: req.Queue, Priority: req.Priority}
	}
	if err := t.sched.Reconfigure(c.schedulerConfig(t.conf), moves); err != nil {
		c.log.Error("the scheduler refused the configuration; it keeps the one it had", zap.Error(err))
	}
	return work
}

// queueStatus is every queue's line for the cluster status (counted as the dashboard
// counts them, api.SchedulerConfig.QueueLines), with the scheduler's share of each.
func (t *term) queueStatus() []api.QueueStatus {
	keys := make([]string, 0, len(t.gangs))
	for k := range t.gangs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	gangs := make([]api.Gang, 0, len(keys))
	for _, k := range keys {
		gangs = append(gangs, t.gangs[k].rec)
	}
	out := t.conf.QueueLines(gangs)
	if t.sched != nil {
		for i := range out {
			out[i].Share = t.sched.QueueShare(out[i].Name)
		}
	}
	return out
}
