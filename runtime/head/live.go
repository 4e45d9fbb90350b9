package head

import (
	"context"
	"fmt"
	"math"
	"sort"
	"time"

	"go.uber.org/zap"

	"github.com/atoll-run/atoll/gang"
	"github.com/atoll-run/atoll/runtime/api"
)

// Liveness off the scheduling lock. The machines' load reports (their heartbeats), gossip's
// news and the failure detector live in the leader's memory under a lock of their own
// (Controller.liveMu), as Kubernetes keeps node leases apart from scheduling and Ray's GCS
// keeps its resource view: a report takes only that lock, and the sweep that judges the
// machines takes only that lock, so a long scheduling cycle, a burst of admissions or a slow
// commit cannot make the leader miss a report or count against a machine the time it
// spent waiting for the controller's lock. Only declaring a machine dead (a commit, and the
// scheduler losing it) takes the controller's lock; it runs on a goroutine of its own
// (declareLoop), and a machine that reported while its verdict waited for that lock is not
// declared dead.
//
// Lock order: Controller.mu before liveMu, never the reverse.

// liveView is a term's liveness state.
type liveView struct {
	detect *failureDetector
	inc    map[string]uint64         // the machines alive, by name: their incarnation
	loads  map[string]api.LoadReport // their latest load reports
	fresh  map[string]bool           // reports the scheduler has not taken yet (takeLoadsLocked)
	held   bool                      // the last sweep held verdicts of silence (a disruption)
	// deferred is how many verdicts of silence the last sweep deferred (their pace).
	deferred int
	// verdicts are the machines the detector found dead, waiting for declareLoop.
	verdicts map[string]liveVerdict
}

// liveVerdict is a machine found dead, with what the detector knew of it then.
type liveVerdict struct {
	verdict
	inc   uint64
	heard time.Time // its last heartbeat when judged: a later one saves it
}

func newLiveView(d *failureDetector) *liveView {
	return &liveView{detect: d, inc: map[string]uint64{}, loads: map[string]api.LoadReport{}, fresh: map[string]bool{},
		verdicts: map[string]liveVerdict{}}
}

// setLive installs a term's liveness view (nil when the term ends).
func (c *Controller) setLive(v *liveView) {
	c.liveMu.Lock()
	c.live = v
	c.liveMu.Unlock()
}

// liveAlive records, under the controller's lock, that a machine registered in an
// incarnation (it is heard now).
func (c *Controller) liveAlive(name string, inc uint64, now time.Time) {
	c.liveMu.Lock()
	defer c.liveMu.Unlock()
	if v := c.live; v != nil {
		v.inc[name] = inc
		delete(v.verdicts, name)
		v.detect.heard(name, now)
	}
}

// liveDead forgets a machine declared dead (under the controller's lock).
func (c *Controller) liveDead(name string) {
	c.liveMu.Lock()
	defer c.liveMu.Unlock()
	if v := c.live; v != nil {
		delete(v.inc, name)
		delete(v.loads, name)
		delete(v.fresh, name)
		delete(v.verdicts, name)
		v.detect.declared(name)
	}
}

// liveLoad returns a machine's latest load report.
func (c *Controller) liveLoad(name string) (api.LoadReport, bool) {
	c.liveMu.Lock()
	defer c.liveMu.Unlock()
	if c.live == nil {
		return api.LoadReport{}, false
	}
	l, ok := c.live.loads[name]
	return l, ok
}

// liveLoads copies the machines' latest load reports.
func (c *Controller) liveLoads() map[string]api.LoadReport {
	c.liveMu.Lock()
	defer c.liveMu.Unlock()
	out := map[string]api.LoadReport{}
	if c.live != nil {
		for k, l := range c.live.loads {
			out[k] = l
		}
	}
	return out
}

// takeLoadsLocked gives the scheduler the load reports that came since it last took them
// (under the controller's lock, before a cycle).
func (c *Controller) takeLoadsLocked(t *term) {
	if t.sched == nil {
		return
	}
	c.liveMu.Lock()
	defer c.liveMu.Unlock()
	if c.live == nil {
		return
	}
	for name := range c.live.fresh {
		if i, ok := t.index[name]; ok {
			l := c.live.loads[name].Load
			_ = t.sched.UpdateLoad(i, gang.Load{CPU: l.CPU, GPU: l.GPU, Mem: l.Mem, Net: l.Net})
		}
		delete(c.live.fresh, name)
	}
}

// DefaultReportRate is ControllerConfig.ReportRate's default: the load reports a second
// the leader takes in all. An idle leader of 1,100 machines reporting every second used
// 0.40 cores (bench scale), at most 0.36 ms a report (TLS, HTTP, JSON): 500 a second is
// at most a fifth of a core, at any size.
const DefaultReportRate = 500

// reportInterval is the report period the leader asks of every agent when machines are
// alive: none (0: the agents keep their own) up to rate machines, then machines/rate in
// whole seconds (rounded up: the period changes at every rate machines, not at each one),
// up to a third of the heartbeat timeout, so that a machine misses two reports before it
// is declared dead for its silence.
func reportInterval(machines int, rate float64, timeout time.Duration) time.Duration {
	if rate <= 0 || float64(machines) <= rate {
		return 0
	}
	iv := time.Duration(math.Ceil(float64(machines)/rate)) * time.Second
	return min(iv, (timeout / 3).Truncate(time.Millisecond))
}

// ReportLoad records an agent's load sample (its heartbeat) for the failure detector and
// the scheduler's load plugin, which takes it at its next cycle, and answers with the
// report period the leader asks (reportInterval). Samples are not committed: only the
// leader uses them, and a new leader gets fresh ones within a period. It takes only the
// liveness lock, never the controller's.
func (c *Controller) ReportLoad(r api.LoadReport) (api.LoadAnswer, error) {
	// The lock is taken once: at 2,000 machines hundreds of reports queued on it at once,
	// and each taking of a contended lock hands it over through the run queue.
	leading := c.rep.Leading()
	now := c.cfg.Clock()
	c.liveMu.Lock()
	v := c.live
	if v == nil {
		c.liveMu.Unlock()
		return api.LoadAnswer{}, c.notLeader()
	}
	defer c.liveMu.Unlock()
	inc, ok := v.inc[r.Machine]
	if !leading {
		// A report of the machine's current incarnation is a heartbeat all the same, and
		// it is kept: a leader whose lease ran out while it was busy (its followers'
		// acknowledgments came late) refused 558 reports in 10 s at 2,000 machines and
		// then counted their silence against those machines. It answers that it cannot
		// confirm its leadership, and nothing else: a head that may be deposed tells no
		// agent to register again.
		if ok && r.Incarnation == inc {
			v.detect.heard(r.Machine, now)
		}
		return api.LoadAnswer{}, fmt.Errorf("%w: the leader cannot confirm its leadership (its lease ran out)", api.ErrUnavailable)
	}
	if !ok {
		return api.LoadAnswer{}, fmt.Errorf("%w: machine %q is not registered (register again)", api.ErrNotFound, r.Machine)
	}
	if r.Incarnation != inc {
		return api.LoadAnswer{}, fmt.Errorf("%w: machine %q is in incarnation %d, the report is of %d (register again)", api.ErrStale, r.Machine, inc, r.Incarnation)
	}
	for _, f := range []float64{r.Load.CPU, r.Load.GPU, r.Load.Mem, r.Load.Net} {
		if !(f >= 0 && f <= 1) {
			return api.LoadAnswer{}, fmt.Errorf("%w: machine %q load %+v: every figure must be in [0, 1]", api.ErrInvalid, r.Machine, r.Load)
		}
	}
	v.loads[r.Machine] = r
	v.fresh[r.Machine] = true
	v.detect.heard(r.Machine, now)
	iv := reportInterval(len(v.inc), c.cfg.ReportRate, c.cfg.HeartbeatTimeout)
	v.detect.interval = iv
	return api.LoadAnswer{Interval: api.Duration(iv)}, nil
}

// heardShed records a heartbeat of a machine alive in this term whose load report the
// API shed (http.go): its agent is alive, whatever its load now.
func (c *Controller) heardShed(machine string) {
	now := c.cfg.Clock()
	c.liveMu.Lock()
	defer c.liveMu.Unlock()
	if v := c.live; v != nil {
		if _, ok := v.inc[machine]; ok {
			v.detect.heard(machine, now)
		}
	}
}

// GossipEvent tells the leader what membership (serf) says of a machine's agent: "failed"
// or "left", "join" or "update". Gossip alone declares no machine dead: the next sweep
// weighs it with the machine's heartbeats (detect.go). Called from membership's
// goroutine; it does not block on the controller. A follower ignores it (a new leader asks
// membership).
func (c *Controller) GossipEvent(machine, kind string) {
	c.liveMu.Lock()
	if c.live != nil {
		c.live.detect.gossip(machine, kind, c.cfg.Clock())
	}
	c.liveMu.Unlock()
	select {
	case c.poke <- struct{}{}:
	default:
	}
}

// sweep judges the machines on their evidence. It runs on Run's goroutine only and takes
// only the liveness lock: a gap between two sweeps is the leader's own pause (detect.go),
// never a wait for the controller. Verdicts go to declareLoop, which also enforces the
// gangs' time limits.
func (c *Controller) sweep() {
	c.liveMu.Lock()
	v := c.live
	if v == nil {
		c.liveMu.Unlock()
		return
	}
	now := c.cfg.Clock()
	alive := make([]string, 0, len(v.inc))
	for name := range v.inc {
		alive = append(alive, name)
	}
	paused, dead := v.detect.sweep(now, alive)
	for _, d := range dead {
		v.verdicts[d.machine] = liveVerdict{verdict: d, inc: v.inc[d.machine], heard: v.detect.watch(d.machine).heard}
	}
	held, wasHeld := v.detect.held, v.held
	v.held = held > 0
	deferred, wasDeferred := v.detect.deferred, v.deferred
	v.deferred = deferred
	c.liveMu.Unlock()
	if deferred > 0 && wasDeferred == 0 {
		c.log.Warn("machines silent past the timeout are found dead at a pace: the longest silent first, and one heard meanwhile is saved",
			zap.Int("deferred", deferred), zap.Int("machines", len(alive)))
	}
	if held > 0 && !wasHeld {
		c.log.Warn("most machines are silent at once: their deaths are held while this leader hears from less than half of them (a disruption of its own, not theirs)",
			zap.Int("silent", held), zap.Int("machines", len(alive)))
	} else if held == 0 && wasHeld {
		c.log.Info("the machines are heard again: verdicts of silence resume", zap.Int("machines", len(alive)))
	}
	worst, over := c.schedLat.since()
	if paused > 0 {
		c.obs.pauses.Inc()
		// The scheduler's figures tell a starved process (its goroutines waited to run)
		// from a blocked one.
		c.log.Warn("this leader was paused or starved; every machine gets a fresh grace period",
			zap.Duration("gap", paused), zap.Int("machines", len(alive)),
			zap.Duration("worst_run_wait", worst), zap.Uint64("run_waits_over_100ms", over))
	}
	select {
	case c.declare <- struct{}{}:
	default:
	}
}

// declareLoop declares dead the machines the sweeps found dead and enforces the gangs'
// time limits, each time a sweep asks, until stop. It is the part of the sweep that needs
// the controller's lock.
func (c *Controller) declareLoop() {
	for {
		select {
		case <-c.stop:
			return
		case <-c.declare:
		}
		c.liveMu.Lock()
		var vs []liveVerdict
		if c.live != nil {
			for _, v := range c.live.verdicts {
				vs = append(vs, v)
			}
			clear(c.live.verdicts)
		}
		c.liveMu.Unlock()
		sort.Slice(vs, func(i, j int) bool { return vs[i].machine < vs[j].machine })
		if len(vs) > 0 {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err := c.declareDead(ctx, vs)
			cancel()
			if err != nil {
				c.log.Warn("could not declare machines dead", zap.Int("machines", len(vs)), zap.String("first", vs[0].machine), zap.Error(err))
			}
		}
		c.enforceTimeLimits() // timelimit.go
	}
}

// declareDead declares machines dead on a sweep's verdicts, but not one that registered
// again or reported since; the scheduler loses them together (one reshape for a batch).
func (c *Controller) declareDead(ctx context.Context, vs []liveVerdict) error {
	t, err := c.lockTerm()
	if err != nil {
		return err
	}
	now := c.cfg.Clock()
	var work []commitFn
	for _, v := range vs {
		if e := t.machines[v.machine]; e == nil || !e.rec.Alive || e.rec.Incarnation != v.inc {
			continue
		}
		c.liveMu.Lock()
		saved := c.live == nil || c.live.detect.watch(v.machine).heard.After(v.heard)
		c.liveMu.Unlock()
		if saved {
			continue
		}
		work = append(work, t.machineDown(v.machine, v.reason, now)...)
		c.liveDead(v.machine)
	}
	if len(work) == 0 {
		c.mu.Unlock()
		return nil
	}
	work = append(work, c.membershipLocked(t, now)...)
	work = append(work, c.cycleLocked(t, now)...)
	ch := c.enqueueLocked(t, work)
	c.notifyLocked()
	c.mu.Unlock()
	return await(ctx, ch)
}
