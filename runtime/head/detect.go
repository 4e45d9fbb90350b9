package head

import (
	"fmt"
	"sort"
	"time"
)

// Failure detection. The leader declares a machine dead on two kinds of evidence: its
// agent's heartbeats (load reports) stop reaching the leader, and gossip (serf) says its
// agent failed or left. Either can be wrong on its own, and so can the leader: a leader
// that was paused (SIGSTOP, a stalled VM, a starved process) or that has just taken office
// has heard nothing for a while through no fault of the machines. The rules:
//
//   - silence is counted from the later of the last heartbeat and the leader's grace
//     start: when its term began, or when it last resumed from a pause (a gap between two
//     of its sweeps longer than PauseThreshold). A leader never holds against a machine
//     the time it could not have heard it;
//   - heartbeats alone: silent for HeartbeatTimeout; a machine not heard at all yet this
//     term, for StartupGrace (twice HeartbeatTimeout by default) from the term's start
//     or the end of the last pause: after a failover every agent must find the new
//     leader, shake hands with it through a bounded gate and report at its paced period,
//     and at 2,000 machines the last 50 of them had not done so 10 s after it took office
//     (their gangs all moved). A machine that died with the old leader is still found
//     by gossip within GossipConfirm;
//   - gossip and heartbeats agree: gossip has the agent failed or left, and it has been
//     silent for GossipConfirm. Gossip alone never kills: a machine whose heartbeats still
//     arrive is alive, whatever a gossip partition says;
//   - flapping is damped: a machine gossip had failed that comes back before it was
//     declared dead is not lost, and each such comeback doubles its GossipConfirm (up to
//     HeartbeatTimeout) until it has stayed up for FlapMemory;
//   - a leader that hears from less than half of a large cluster (disruptionMin machines
//     or more) holds the verdicts of silence: the trouble is more likely its own (2,000
//     agents reconnecting to a new leader after a failover were 1,021 machines declared
//     dead 10 s after it took office, and their gangs all moved), as Kubernetes' node
//     lifecycle controller stops evicting in a zone that is wholly disrupted. Gossip's
//     confirmed failures are still declared; the silent ones are once fewer than half are;
//   - verdicts of silence alone are paced (silenceBudget): a burst of max(10, 2%) of the
//     machines at once, then max(0.5, 0.2% of them) a second, the longest silent first,
//     as Kubernetes' node lifecycle controller paces its evictions (--node-eviction-rate).
//     A rack that loses its power is declared at once; a leader overwhelmed after a
//     failover, whose machines' reports time out in its queues, no longer kills hundreds
//     at once (583 at 2,000 machines, each death more work for the leader: their gangs
//     moved, committed and placed again), and a machine whose report gets through before
//     its turn is saved. Gossip's confirmed failures are not paced.
//
// failureDetector holds that evidence for one term. It is pure: time is an argument, and
// it decides nothing by itself (the controller asks it at each sweep and commits).
type failureDetector struct {
	cfg detectorConfig
	// interval is the report period the leader asks of the agents (reportInterval): a
	// machine gossip has down is given one and a half of it to report.
	interval  time.Duration
	graceFrom time.Time // the term's start or the end of the last pause
	lastSweep time.Time
	m         map[string]*machineWatch
	// held is how many verdicts of silence the last sweep held (a disruption).
	held int
	// tokens are the verdicts of silence alone the detector may give now (silenceBudget),
	// as of tokensAt (zero: the bucket is full); deferred is how many the last sweep
	// deferred for want of them.
	tokens   float64
	tokensAt time.Time
	deferred int
}

// silenceBudget is the pace of verdicts of silence alone among n machines: burst at once,
// then rate a second.
func silenceBudget(n int) (burst, rate float64) {
	return max(10, float64(n)/50), max(0.5, float64(n)/500)
}

// disruptionMin is the smallest cluster in which the leader holds its verdicts of silence
// when it hears from less than half the machines (Kubernetes' large-cluster-size-threshold
// is 50 nodes).
const disruptionMin = 50

// detectorConfig are the detector's thresholds (ControllerConfig's).
type detectorConfig struct {
	silence, confirm, pause, flapMemory time.Duration
	// startup is the silence allowed a machine not heard yet this term (at least silence).
	startup time.Duration
}

// machineWatch is the evidence about one machine.
type machineWatch struct {
	heard      time.Time // its last heartbeat (zero: none this term)
	gossipDown time.Time // when gossip said it failed or left (zero: gossip has it alive)
	gossipKind string    // "failed" or "left"
	flaps      int       // comebacks after gossip had it down, within FlapMemory
	flapAt     time.Time // the last comeback
	// judged: a verdict of silence alone was given and took its share of the pace; it is
	// given again at every sweep, unpaced, until the machine is declared or heard.
	judged bool
}

// verdict is a machine the detector finds dead, with the evidence.
type verdict struct {
	machine, reason string
	silent          time.Duration // how long it was silent (the pace's order)
}

func newFailureDetector(cfg detectorConfig, now time.Time) *failureDetector {
	return &failureDetector{cfg: cfg, graceFrom: now, lastSweep: now, m: map[string]*machineWatch{}}
}

func (d *failureDetector) watch(name string) *machineWatch {
	w := d.m[name]
	if w == nil {
		w = &machineWatch{}
		d.m[name] = w
	}
	return w
}

// heard records a heartbeat (or a registration) of a machine.
func (d *failureDetector) heard(name string, now time.Time) {
	w := d.watch(name)
	if now.After(w.heard) {
		w.heard = now
	}
	w.judged = false
}

// gossip records what membership says of a machine's agent: "failed" or "left" (down),
// "join" or "update" (alive: a member gossip had down that joins again came back).
func (d *failureDetector) gossip(name, kind string, now time.Time) {
	w := d.watch(name)
	switch kind {
	case "failed", "left":
		if w.gossipDown.IsZero() {
			w.gossipDown, w.gossipKind = now, kind
		}
	case "join", "update":
		if w.gossipDown.IsZero() {
			return
		}
		w.gossipDown, w.gossipKind = time.Time{}, ""
		if !w.flapAt.IsZero() && now.Sub(w.flapAt) > d.cfg.flapMemory {
			w.flaps = 0
		}
		w.flaps++
		w.flapAt = now
	}
}

// declared forgets the evidence of a machine declared dead (it starts anew if it
// registers again) but remembers its flaps.
func (d *failureDetector) declared(name string) {
	if w := d.m[name]; w != nil {
		d.m[name] = &machineWatch{flaps: w.flaps, flapAt: w.flapAt}
	}
}

// confirmFor is how long a machine gossip has down must also be silent.
func (d *failureDetector) confirmFor(w *machineWatch, now time.Time) time.Duration {
	if w.flaps > 0 && now.Sub(w.flapAt) > d.cfg.flapMemory {
		w.flaps = 0
	}
	c := max(d.cfg.confirm, d.interval*3/2)
	for i := 0; i < w.flaps && c < d.cfg.silence; i++ {
		c *= 2
	}
	return min(c, d.cfg.silence)
}

// sweep is called at every turn of the controller's loop with the machines it has alive.
// It reports how long the leader was paused when the gap since the last sweep exceeds
// the pause threshold (0 otherwise: then every silence is counted from now), and the
// machines the evidence finds dead, in name order.
func (d *failureDetector) sweep(now time.Time, alive []string) (paused time.Duration, dead []verdict) {
	if gap := now.Sub(d.lastSweep); gap > d.cfg.pause {
		paused = gap
		d.graceFrom = now
	}
	if now.After(d.lastSweep) {
		d.lastSweep = now
	}
	// The machines are judged in map order and only the verdicts sorted: the sweep holds
	// the liveness lock, which every load report takes, and sorting 2,000 names every
	// 200 ms made the reports queue behind it.
	var silentOnes, judged []verdict // the verdicts of silence alone: new ones, given before
	for _, name := range alive {
		w := d.watch(name)
		since := w.heard
		if since.Before(d.graceFrom) {
			since = d.graceFrom
		}
		silent, limit := now.Sub(since), d.cfg.silence
		if w.heard.IsZero() {
			limit = max(limit, d.cfg.startup)
		}
		switch {
		case !w.gossipDown.IsZero() && silent >= d.confirmFor(w, now):
			dead = append(dead, verdict{name, fmt.Sprintf("its agent %s (gossip) and sent no heartbeat for %v", w.gossipKind, silent.Round(time.Millisecond)), silent})
		case silent > limit:
			reason := fmt.Sprintf("no heartbeat for %v", silent.Round(time.Millisecond))
			if w.heard.IsZero() {
				reason = fmt.Sprintf("no heartbeat to this leader in the %v since it took office or resumed", silent.Round(time.Millisecond))
			}
			if w.judged {
				judged = append(judged, verdict{name, reason, silent})
			} else {
				silentOnes = append(silentOnes, verdict{name, reason, silent})
			}
		}
	}
	burst, rate := silenceBudget(len(alive))
	if d.tokensAt.IsZero() {
		d.tokens = burst
	} else if now.After(d.tokensAt) {
		d.tokens = min(burst, d.tokens+now.Sub(d.tokensAt).Seconds()*rate)
	}
	d.tokensAt = now
	d.held, d.deferred = 0, 0
	if n := len(silentOnes) + len(judged); len(alive) >= disruptionMin && 2*n > len(alive) {
		d.held = n
		for _, v := range judged {
			d.m[v.machine].judged = false // given again at its turn when the hold ends
		}
	} else {
		if k := int(d.tokens); len(silentOnes) > k {
			sort.Slice(silentOnes, func(i, j int) bool { return silentOnes[i].silent > silentOnes[j].silent })
			d.deferred = len(silentOnes) - k
			silentOnes = silentOnes[:k]
		}
		d.tokens -= float64(len(silentOnes))
		for _, v := range silentOnes {
			d.m[v.machine].judged = true
		}
		dead = append(append(dead, judged...), silentOnes...)
	}
	sort.Slice(dead, func(i, j int) bool { return dead[i].machine < dead[j].machine })
	return paused, dead
}
