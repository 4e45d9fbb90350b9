package head

import (
	"context"
	"fmt"
	"sort"
	"time"

	"go.uber.org/zap"

	"github.com/atoll-run/atoll/gang"
	"github.com/atoll-run/atoll/gang/topoadapt"
	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/store/meta"
	"github.com/atoll-run/atoll/topology"
)

// RegisterMachine records an agent's machine (alive, with a new incarnation) and gives it
// to the scheduler (a machine joining, or coming back). An agent that registers again
// without having been declared dead restarted: the workers of its previous incarnation
// are gone, and their gangs restart.
func (c *Controller) RegisterMachine(ctx context.Context, m api.Machine) (api.Machine, error) {
	if err := api.CheckName("machine", m.Name); err != nil {
		return api.Machine{}, err
	}
	if m.Spec == nil {
		return api.Machine{}, fmt.Errorf("%w: machine %q registered without a topology spec", api.ErrInvalid, m.Name)
	}
	if err := m.Spec.Validate(); err != nil {
		return api.Machine{}, fmt.Errorf("%w: machine %q: %v", api.ErrInvalid, m.Name, err)
	}
	if m.Rack < 0 || m.Rack > 1<<20 {
		return api.Machine{}, fmt.Errorf("%w: machine %q rack %d out of 0..%d", api.ErrInvalid, m.Name, m.Rack, 1<<20)
	}
	t, err := c.lockTerm()
	if err != nil {
		return api.Machine{}, err
	}
	now := c.cfg.Clock()
	e := t.machines[m.Name]
	var work []commitFn
	restarted := false
	if e == nil {
		e = &machineEntry{}
		t.machines[m.Name] = e
	} else {
		m.Incarnation = e.rec.Incarnation
		restarted = e.rec.Alive
	}
	m.Incarnation++
	m.Alive, m.Registered, m.Reason = true, now, ""
	key := api.TableMachines + m.Name
	up := api.Event{Time: now, Kind: api.EventMachineUp, Machine: m.Name, Reason: fmt.Sprintf("incarnation %d, %d GPUs", m.Incarnation, m.NumGPUs())}
	if restarted {
		up.Reason = fmt.Sprintf("its agent restarted (incarnation %d); its workers are gone", m.Incarnation)
	}
	work = append(work, commitFn{what: "machine " + m.Name, cmp: []meta.Compare{{Key: key, Version: e.ver}}, ops: []meta.Op{putJSON(key, m)}, events: []api.Event{up}})
	e.rec, e.ver = m, e.ver+1
	c.liveAlive(m.Name, m.Incarnation, now)
	if restarted {
		for _, g := range t.gangsOn(m.Name) {
			work = append(work, t.restart(g, fmt.Sprintf("the agent of %s restarted", m.Name), now)...)
		}
	}
	c.log.Info("machine registered", zap.String("machine", m.Name), zap.Uint64("incarnation", m.Incarnation),
		zap.Int("gpus", m.NumGPUs()), zap.Bool("simulated", m.Simulated))
	if t.sched == nil {
		// The term's first machine builds the scheduler at once: what reads it finds one.
		work = append(work, c.membershipLocked(t, now)...)
		work = append(work, c.cycleLocked(t, now)...)
	} else {
		// The scheduler takes the machine with the others that register meanwhile: one
		// reshape for a burst of registrations, at the next cycle or within membershipDelay.
		c.membershipSoonLocked(t)
	}
	ch := c.enqueueLocked(t, work)
	c.notifyLocked()
	c.mu.Unlock()
	return m, await(ctx, ch)
}

// membershipLocked gives the scheduler the machines as the cache has them now, as a
// delta: machines that joined are added, machines that left are removed (their gangs go
// back to their queues, with their records, and wait there when nothing else fits), a
// machine whose topology changed is replaced. The core is built only when the first
// machine of the term comes (from the records, as when the term started).
func (c *Controller) membershipLocked(t *term, now time.Time) []commitFn {
	t.membersDirty = false
	ms := t.desired()
	if t.sched == nil {
		if len(ms) == 0 {
			return nil
		}
		return c.buildCoreLocked(t, now)
	}
	tc, snap, specs, err := t.snapshot(ms)
	if err != nil {
		c.log.Error("the registered machines do not form a cluster; the scheduler keeps the machines it had", zap.Error(err))
		return nil
	}
	from := make([]int, len(ms))
	same := len(ms) == len(t.order)
	for i, m := range ms {
		from[i] = -1
		if j, ok := t.index[m.rec.Name]; ok && t.specs[j] == specs[i] {
			from[i] = j
		}
		same = same && from[i] == i
	}
	if same {
		return nil
	}
	lost, err := t.sched.Reshape(snap, from, now)
	if err != nil {
		c.log.Error("the scheduler refused the machines", zap.Error(err))
		return nil
	}
	t.topo, t.specs, t.order, t.index = tc, specs, nil, map[string]int{}
	for i, m := range ms {
		t.order = append(t.order, m.rec.Name)
		t.index[m.rec.Name] = i
	}
	if tc != nil {
		t.sched.SetCollectiveModel(topoadapt.NewModel(tc, topology.Best))
	} else {
		t.sched.SetCollectiveModel(gang.DefaultTieredModel())
	}
	for i, f := range from {
		if l, ok := c.liveLoad(ms[i].rec.Name); ok && f < 0 {
			_ = t.sched.UpdateLoad(i, gang.Load{CPU: l.Load.CPU, GPU: l.Load.GPU, Mem: l.Load.Mem, Net: l.Load.Net})
		}
	}
	var work []commitFn
	for _, key := range lost {
		e := t.gangs[key]
		if e == nil {
			continue
		}
		why := "its machines changed"
		if e.rec.Placement != nil {
			for _, name := range e.rec.Placement.Machines {
				if _, ok := t.index[name]; !ok {
					why = "machine " + name + " is gone"
					if m := t.machines[name]; m != nil && m.rec.Reason != "" {
						why += " (" + m.rec.Reason + ")"
					}
					break
				}
			}
		}
		work = append(work, t.lost(e, why, now)...)
	}
	c.log.Info("the scheduler's machines changed", zap.Int("machines", len(ms)), zap.Int("gangs_requeued", len(lost)))
	return work
}

// membershipDelay bounds how long a registration waits for the scheduler to take its
// machine when no cycle comes sooner: registrations within it share one reshape.
const membershipDelay = 100 * time.Millisecond

// membershipSoonLocked marks the scheduler's machines stale: the next cycle (cycleLocked)
// gives it the machines as they are then, and a timer runs one within membershipDelay.
// A burst of N registrations costs a few reshapes of O(N) each, not N of them.
func (c *Controller) membershipSoonLocked(t *term) {
	t.membersDirty = true
	if t.membersTimer != nil {
		return
	}
	t.membersTimer = time.AfterFunc(membershipDelay, func() {
		c.mu.Lock()
		if c.t != t {
			c.mu.Unlock()
			return
		}
		t.membersTimer = nil
		if !t.membersDirty {
			c.mu.Unlock()
			return
		}
		work := c.cycleLocked(t, c.cfg.Clock()) // takes the machines first
		ch := c.enqueueLocked(t, work)
		c.notifyLocked()
		c.mu.Unlock()
		go func() {
			if err := <-ch; err != nil {
				c.log.Warn("could not commit the scheduler's new machines' decisions", zap.Error(err))
			}
		}()
	})
}

// gangsOn lists the live, placed gangs with a member on a machine.
func (l *ledger) gangsOn(machine string) []*gangEntry {
	var out []*gangEntry
	for _, g := range l.gangs {
		if !g.rec.State.Live() || g.rec.Placement == nil {
			continue
		}
		for _, m := range g.rec.Placement.Members {
			if m.Machine == machine {
				out = append(out, g)
				break
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].rec.Spec.Key() < out[j].rec.Spec.Key() })
	return out
}

// restart restarts a gang in its next generation on its current GPUs, at once: its
// workers were lost with their agent, not failed by themselves, so it does not count
// against MaxRestarts.
func (t *term) restart(e *gangEntry, reason string, now time.Time) []commitFn {
	rec := e.rec
	rec.Generation++
	rec.Restarts++
	rec.State, rec.Reason, rec.Updated, rec.RestartAt = api.GangStarting, reason, now, time.Time{}
	e.ready = map[int]api.Worker{}
	return []commitFn{t.gangCommit(e, rec, "restart of "+rec.Spec.Key())}
}

// MachineDown declares a machine dead (its agent failed or left, as membership says): the
// scheduler loses it (a delta); its gangs restart elsewhere from their checkpoints, or
// wait in their queues for capacity.
func (c *Controller) MachineDown(ctx context.Context, name, reason string) error {
	t, err := c.lockTerm()
	if err != nil {
		return err
	}
	now := c.cfg.Clock()
	work := t.machineDown(name, reason, now)
	if len(work) == 0 {
		c.mu.Unlock()
		return nil
	}
	c.liveDead(name)
	work = append(work, c.membershipLocked(t, now)...)
	work = append(work, c.cycleLocked(t, now)...)
	ch := c.enqueueLocked(t, work)
	c.notifyLocked()
	c.mu.Unlock()
	return await(ctx, ch)
}

// machineDown marks a machine dead; the caller gives the scheduler the change
// (membershipLocked), which moves its gangs.
func (t *term) machineDown(name, reason string, now time.Time) []commitFn {
	e := t.machines[name]
	if e == nil || !e.rec.Alive {
		return nil
	}
	m := e.rec
	m.Alive, m.Reason = false, reason
	key := api.TableMachines + name
	w := commitFn{what: "machine " + name + " down", cmp: []meta.Compare{{Key: key, Version: e.ver}}, ops: []meta.Op{putJSON(key, m)},
		events: []api.Event{{Time: now, Kind: api.EventMachineDown, Machine: name, Reason: reason}}}
	e.rec, e.ver = m, e.ver+1
	t.log.Warn("machine declared dead", zap.String("machine", name), zap.String("reason", reason))
	return []commitFn{w}
}

// newDetector is a term's failure detector (detect.go), its grace period starting now.
func (c *Controller) newDetector(now time.Time) *failureDetector {
	return newFailureDetector(detectorConfig{silence: c.cfg.HeartbeatTimeout, confirm: c.cfg.GossipConfirm,
		pause: c.cfg.PauseThreshold, flapMemory: c.cfg.FlapMemory, startup: c.cfg.StartupGrace}, now)
}

// Machine returns a machine's record.
func (c *Controller) Machine(name string) (api.Machine, error) {
	t, err := c.lockTerm()
	if err != nil {
		return api.Machine{}, err
	}
	defer c.mu.Unlock()
	e := t.machines[name]
	if e == nil {
		return api.Machine{}, fmt.Errorf("%w: machine %q", api.ErrNotFound, name)
	}
	return e.rec, nil
}

// Status describes the machines and gangs as the leader sees them.
func (c *Controller) Status() (api.Status, error) {
	t, err := c.lockTerm()
	if err != nil {
		return api.Status{}, err
	}
	defer c.mu.Unlock()
	var st api.Status
	loads := c.liveLoads()
	used := map[string]int{}
	for _, g := range t.gangs {
		if g.rec.State == api.GangStarting || g.rec.State == api.GangRunning || g.rec.State == api.GangRestarting {
			for _, i := range g.rec.Active() {
				if m := g.rec.Placement.Members[i]; m.Milli == 0 || m.Milli == gang.Milli {
					used[m.Machine] += len(m.GPUs)
				}
			}
		}
	}
	for name, m := range t.machines {
		ms := api.MachineStatus{Name: name, GPUs: m.rec.NumGPUs(), Alive: m.rec.Alive, PID: m.rec.PID, Simulated: m.rec.Simulated,
			Rack: m.rec.Rack, Agent: m.rec.Agent.API}
		if cd := t.cordons[name]; cd != nil {
			ms.Cordoned, ms.CordonReason, ms.CordonedBy, ms.CordonedAt, ms.Drained = true, cd.Reason, cd.By, cd.At, cd.Drain
		}
		if m.rec.Alive {
			ms.FreeGPUs = ms.GPUs - used[name]
		}
		if l, ok := loads[name]; ok {
			ld := l.Load
			ms.Load = &ld
		}
		st.Machines = append(st.Machines, ms)
	}
	sort.Slice(st.Machines, func(i, j int) bool { return st.Machines[i].Name < st.Machines[j].Name })
	for _, g := range t.gangs {
		gs := api.GangStatus{Job: g.rec.Spec.Job, Name: g.rec.Spec.Name, State: g.rec.State, Workers: g.rec.Size(),
			Ready: g.rec.ReadyWorkers(func(m int) bool { _, ok := g.ready[m]; return ok }), Generation: g.rec.Generation,
			Restarts: g.rec.Restarts, Reason: g.rec.Reason, Preemptions: g.rec.Preemptions, Resizes: g.rec.Resizes, Notice: g.rec.Notice}
		if g.rec.Spec.Elastic() {
			gs.MinWorkers, gs.MaxWorkers = g.rec.Spec.MinWorkers, g.rec.Spec.Workers
		}
		if g.rec.Placement != nil {
			gs.Machines = g.rec.Placement.Machines
			if g.rec.State.Live() {
				gs.GPUs = g.rec.HeldGPUs()
			}
		}
		gs.Queue = t.conf.QueueOf(g.rec.Spec)
		gs.Priority, _ = t.conf.Priority(g.rec.Spec)
		st.Gangs = append(st.Gangs, gs)
	}
	sort.Slice(st.Gangs, func(i, j int) bool {
		if st.Gangs[i].Job != st.Gangs[j].Job {
			return st.Gangs[i].Job < st.Gangs[j].Job
		}
		return st.Gangs[i].Name < st.Gangs[j].Name
	})
	st.Queues = t.queueStatus()
	st.Services = c.serviceStatusLocked(t)
	st.Revision = c.sm.Revision()
	st.Term = t.id
	if c.poolStatus != nil {
		st.Pools = c.poolStatus()
	}
	return st, nil
}
