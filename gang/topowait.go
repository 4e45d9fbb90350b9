package gang

import (
	"fmt"
	"time"
)

// topologyWait is the Permit of delay scheduling: a multi-GPU gang whose best placement now
// crosses more machines than it must waits for a compact one, up to Config.TopologyWait
// divided by its class weight. The wait counts from the first cycle that found it any
// placement since it last queued (as delay scheduling counts skipped chances, not time in
// the queue): a gang that spent days in a backlog still waits for a compact placement once
// its turn comes. Past TopologyWaitUnforeseen (also divided by the class weight) it waits on
// only while a compact placement can be foreseen within the wait: running gangs with
// declared durations, released in end order, make room for it (the backfill shadow
// search, compact). TopologyWaitFraction, when set, bounds the wait by that share of the
// gang's declared duration.
type topologyWait struct {
	at       time.Time // the cycle the searches below were counted in
	searches int       // shadow searches this cycle (at most Config.MaxReservations)
}

func (*topologyWait) Name() string { return PluginTopologyWait }

func (t *topologyWait) Permit(h Handle, state *CycleState, g *QueuedGang, c *Candidate, now time.Time) *Status {
	cfg := h.Config()
	best := c.Input
	wait := cfg.topologyWait(g.Request)
	held := now.Sub(g.FitSince)
	if wait <= 0 || best.Machines <= best.MinMachines || held >= wait {
		return nil
	}
	if held >= cfg.topologyWaitUnforeseen(g.Request.Priority) {
		if !t.at.Equal(now) {
			t.at, t.searches = now, 0
		}
		if t.searches < cfg.MaxReservations {
			t.searches++
			if start, ok := shadowStart(h, state, g, true, now); !ok || start.After(now.Add(wait-held)) {
				return nil // no compact placement in sight within the wait: take this one
			}
		}
	}
	st := NewStatus(Wait, WaitTopology, fmt.Sprintf("waiting up to %s for a placement on %d machine(s), best now crosses %d",
		wait, best.MinMachines, best.Machines))
	st.RetryAt = now.Add(wait - held)
	return st
}

// topologyWait is the longest a gang of r's class and duration waits for a compact
// placement; 0 for a gang whose strategy spreads it (compact is not what it wants).
func (c *Config) topologyWait(r *Request) time.Duration {
	if r.Strategy == StrategySpread || r.Strategy == StrategyStrictSpread {
		return 0
	}
	wait := time.Duration(float64(c.TopologyWait) / max(1, c.classWeight(r.Priority)))
	if f := c.TopologyWaitFraction; f > 0 && r.Duration > 0 {
		wait = min(wait, time.Duration(f*float64(r.Duration)))
	}
	return wait
}

// topologyWaitUnforeseen is how long a gang of the given priority waits for compact room it
// cannot foresee: TopologyWaitUnforeseen divided by its class weight.
func (c *Config) topologyWaitUnforeseen(priority int) time.Duration {
	return time.Duration(float64(c.TopologyWaitUnforeseen) / max(1, c.classWeight(priority)))
}
