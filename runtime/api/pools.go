package api

import (
	"encoding/json"
	"time"
)

// PoolStatus is an autoscaling pool's line in the cluster status (issue 12).
type PoolStatus struct {
	Name            string        `json:"name"`
	Capacity        string        `json:"capacity"`
	Provider        string        `json:"provider"`
	Min             int           `json:"min"`
	Max             int           `json:"max"`
	PricePerHour    float64       `json:"price_per_hour"`
	Machines        []PoolMachine `json:"machines,omitempty"`
	Launching       int           `json:"launching"`
	CostUSD         float64       `json:"cost_usd"`
	SpotUnavailable bool          `json:"spot_unavailable,omitempty"`
}

// PoolMachine is one machine of a pool.
type PoolMachine struct {
	Name  string    `json:"name"`
	State string    `json:"state"`
	Since time.Time `json:"since"`
	// IdleFor is how long it has been idle (0 while it hosts gangs); IdleTimeout its pool's.
	IdleFor     Duration  `json:"idle_for,omitempty"`
	IdleTimeout Duration  `json:"idle_timeout,omitempty"`
	Notice      time.Time `json:"notice,omitempty"`
}

// PoolEvent says why a machine was added or removed, or why a gang gets no machines.
type PoolEvent struct {
	Time    time.Time `json:"time"`
	Kind    string    `json:"kind"` // launch, drain, remove, preempt, infeasible, launch-failed
	Pool    string    `json:"pool,omitempty"`
	Machine string    `json:"machine,omitempty"`
	Gang    string    `json:"gang,omitempty"`
	Reason  string    `json:"reason"`
}

// PoolsStatus is the autoscaler's part of the status.
type PoolsStatus struct {
	Pools  []PoolStatus `json:"pools"`
	Events []PoolEvent  `json:"events,omitempty"`
}

// MarshalJSON writes the pools as a list, [] when there are none (never null).
func (s PoolsStatus) MarshalJSON() ([]byte, error) {
	type plain PoolsStatus
	p := plain(s)
	p.Pools = orEmpty(p.Pools)
	return json.Marshal(p)
}

// InterruptRequest injects a spot interruption notice for a pool machine, due After from
// now (POST /v1/pools/interrupt): a drill of the notice path, for providers that can
// inject one (local, docker).
type InterruptRequest struct {
	Machine string   `json:"machine"`
	After   Duration `json:"after"`
}
