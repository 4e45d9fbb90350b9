package poolsim

import (
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/atoll-run/atoll/pools"
)

// scaler is one policy: how machines are bought, drained and removed. The world calls start
// once, then reconcile every interval while anything changed, and otherwise at the time
// wake gives (false: nothing due). What a scaler reads of the world is the same for every
// policy; the opt-in interfaces below are what a system hears of beyond that.
type scaler interface {
	name() string
	interval() time.Duration
	start(w *world) error
	reconcile(w *world) error
	wake(w *world) (time.Duration, bool)
}

// noticeTaker is a policy told of spot interruption notices (the world sets the machine's
// notice first). Policies without it learn of an interruption when the machine is gone.
type noticeTaker interface {
	notice(w *world, mi int)
}

// admitter gates placement: a pending job is placed only once admitted, and only on the
// pool returned (nil: any).
type admitter interface {
	admits(w *world, ji int) (bool, *pools.Pool)
}

// stopWatcher hears of a run that ended: done, or back in the queue.
type stopWatcher interface {
	stopped(w *world, ji int, done bool)
}

// placeWatcher hears of a job placed.
type placeWatcher interface {
	placed(w *world, ji int)
}

// arrivalWatcher hears of a job submitted.
type arrivalWatcher interface {
	arrived(w *world, ji int)
}

var (
	_ scaler      = (*staticScaler)(nil)
	_ scaler      = (*atollScaler)(nil)
	_ noticeTaker = (*atollScaler)(nil)
)

// staticScaler is the on-demand reference: every on-demand pool at its max, bought at the
// start, ready at once, never released.
type staticScaler struct{}

func (staticScaler) name() string                      { return "static" }
func (staticScaler) interval() time.Duration           { return time.Duration(math.MaxInt64 / 4) }
func (staticScaler) reconcile(*world) error            { return nil }
func (staticScaler) wake(*world) (time.Duration, bool) { return 0, false }
func (s staticScaler) start(w *world) error {
	for i := range w.set.Pools {
		p := &w.set.Pools[i]
		if p.Spec.Capacity != pools.OnDemand {
			continue
		}
		for k := 0; k < p.Spec.Max; k++ {
			m := w.machines[w.launch(p)]
			m.ready, m.readyAt, m.idleSince = true, 0, 0
		}
	}
	w.capVer++
	return nil
}

// atollScaler runs the pools core (pools.Autoscaler), as the leader head does: every
// reconcile it builds a snapshot of the pools, machines and gangs and carries out the
// decision. Notices reach it as the machine's notice; its preemptions are checkpoint-and-stop
// requests with the decision's deadline.
type atollScaler struct {
	pol     string
	core    *pools.Autoscaler
	every   time.Duration
	predict bool
	noSpot  bool
	cfg     pools.Config
	fc      pools.Forecaster
}

func newAtoll(name string, cfg pools.Config, predict, noSpot bool) (*atollScaler, error) {
	core, err := pools.New(cfg)
	if err != nil {
		return nil, err
	}
	return &atollScaler{pol: name, core: core, every: 10 * time.Second, predict: predict, noSpot: noSpot, cfg: cfg}, nil
}

func (a *atollScaler) name() string            { return a.pol }
func (a *atollScaler) interval() time.Duration { return a.every }
func (a *atollScaler) start(*world) error      { return nil }
func (a *atollScaler) notice(*world, int)      {}
func (a *atollScaler) arrived(w *world, ji int) {
	if a.predict {
		a.fc.Observe(a.gangOf(w, ji), w.epoch.Add(w.now))
	}
}

// wake: a draining machine's grace end, an idle machine's timeout, and (with consolidation)
// when a busy machine's gangs will have been unchanged for its pool's idle timeout. Times
// already past were decided on.
func (a *atollScaler) wake(w *world) (time.Duration, bool) {
	best, ok := time.Duration(0), false
	consider := func(at time.Duration) {
		if at > w.now && (!ok || at < best) {
			best, ok = at, true
		}
	}
	for _, mi := range w.alive() {
		m := w.machines[mi]
		idle := time.Duration(m.pool.Spec.IdleTimeout)
		switch {
		case m.draining:
			consider(m.drainedAt + a.cfg.DrainGrace)
		case m.ready && len(m.hosts) == 0 && m.idleSince >= 0:
			consider(m.idleSince + idle)
		case m.ready && a.cfg.Consolidate && len(w.pending) == 0:
			consider(m.changed + idle)
		}
	}
	return best, ok
}

// gangOf is the job as the core sees it; its move cost is the checkpoint model's (write,
// restart, read back), which a job declares.
func (a *atollScaler) gangOf(w *world, ji int) pools.Gang {
	j := w.jobs[ji]
	return pools.Gang{ID: fmt.Sprintf("%s#%d", j.ID, ji), Size: j.members, Member: pools.Member{GPUs: j.per}, Tolerant: true, Arrived: w.epoch.Add(j.Submit),
		MoveCost: w.opt.Restore + 2*w.ckptTime(j)}
}

// reconcile runs the core once and carries out its decision.
func (a *atollScaler) reconcile(w *world) error {
	now := w.epoch.Add(w.now)
	s := &pools.Snapshot{Now: now}
	for i := range w.set.Pools {
		p := &w.set.Pools[i]
		if a.noSpot && p.Spec.Capacity == pools.Spot {
			continue
		}
		s.Pools = append(s.Pools, pools.PoolState{Pool: p})
	}
	byName := map[string]int{}
	gangJob := map[string]int{}
	for _, mi := range w.alive() {
		m := w.machines[mi]
		byName[m.name] = mi
		pm := pools.Machine{Name: m.name, Pool: m.pool.Spec.Name, State: pools.Ready, Since: w.epoch.Add(m.readyAt)}
		switch {
		case m.draining:
			pm.State, pm.Since = pools.Draining, w.epoch.Add(m.drainedAt)
		case !m.ready:
			pm.State, pm.Since = pools.Launching, w.epoch.Add(m.launched)
		}
		if m.ready {
			pm.Changed = w.epoch.Add(m.changed)
		}
		if m.idleSince >= 0 && len(m.hosts) == 0 {
			pm.IdleSince = w.epoch.Add(m.idleSince)
		}
		if m.notice > 0 {
			pm.Notice = w.epoch.Add(m.notice)
		}
		hosted := make([]int, 0, len(m.hosts))
		for ji := range m.hosts {
			hosted = append(hosted, ji)
		}
		sort.Ints(hosted)
		for _, ji := range hosted {
			g := a.gangOf(w, ji)
			pm.Gangs = append(pm.Gangs, pools.Hosted{Gang: g.ID, Members: m.hosts[ji], Stopping: w.jobs[ji].stopping})
			if _, seen := gangJob[g.ID]; !seen {
				gangJob[g.ID] = ji
				s.Running = append(s.Running, g)
			}
		}
		s.Machines = append(s.Machines, pm)
	}
	for _, ji := range w.pending {
		s.Pending = append(s.Pending, a.gangOf(w, ji))
	}
	if a.predict {
		var horizon time.Duration
		for _, p := range w.set.Pools {
			horizon = max(horizon, time.Duration(p.Spec.LaunchLatency))
		}
		s.Forecast = a.fc.Forecast(now, max(horizon, time.Minute))
	}
	d, err := a.core.Decide(s)
	if err != nil {
		return err
	}
	for _, l := range d.Launches {
		p, _ := w.set.ByName(l.Pool)
		for k := 0; k < l.Count; k++ {
			w.launch(p)
		}
	}
	for _, dr := range d.Drains {
		w.drain(byName[dr.Machine])
	}
	for _, pr := range d.Preemptions {
		if ji, ok := gangJob[pr.Gang]; ok {
			w.checkpointStop(ji, pr.Deadline.Sub(w.epoch))
		}
	}
	for _, rm := range d.Removes {
		w.terminate(byName[rm.Machine])
	}
	return nil
}
