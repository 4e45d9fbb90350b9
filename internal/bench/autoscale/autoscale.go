// Package autoscale measures the pools autoscaler's decision time: a snapshot of many
// machines and pending gangs in, one scale decision out (`atoll bench autoscale`). The
// baseline, measured in the same run, is the per-gang loop: one decision per pending gang,
// each seeing the machines launched for the gangs before it as taken (how an autoscaler
// that sizes one request at a time, without packing requests together, does the work).
package autoscale

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/atoll-run/atoll/pools"
)

// Options size the benchmark.
type Options struct {
	Machines int    // machines in the snapshot, over four pools
	Gangs    int    // pending gangs
	Reps     int    // timed decisions
	Baseline bool   // also time the per-gang loop once
	Seed     uint64 // workload seed
}

// DefaultOptions is the figure: 1,000 machines, 10,000 pending gangs.
func DefaultOptions() Options {
	return Options{Machines: 1000, Gangs: 10000, Reps: 30, Baseline: true, Seed: 1}
}

// Result is what `atoll bench autoscale --json` prints.
type Result struct {
	Machines         int     `json:"machines"`
	PendingGangs     int     `json:"pending_gangs"`
	Reps             int     `json:"reps"`
	DecisionP50ms    float64 `json:"decision_p50_ms"`
	DecisionP99ms    float64 `json:"decision_p99_ms"`
	MachinesLaunched int     `json:"machines_launched"`
	Infeasible       int     `json:"infeasible"`
	Waiting          int     `json:"waiting"`
	Drains           int     `json:"drains"`
	// BaselinePerGangMs is the per-gang loop's total time for the same snapshot, and
	// SpeedupVsPerGang its ratio to the one decision's p50.
	BaselinePerGangMs float64 `json:"baseline_per_gang_ms,omitempty"`
	BaselineLaunched  int     `json:"baseline_machines_launched,omitempty"`
	SpeedupVsPerGang  float64 `json:"speedup_vs_per_gang,omitempty"`
}

// Snapshot builds the benchmark's snapshot: four pools (DGX H100 on-demand and spot, GB200
// NVL72, 8-card PCIe L40S boxes) holding the machines in every state, and pending gangs of
// mixed shapes (a share same-island, half tolerant of interruption, a few infeasible).
func Snapshot(opt Options) (*pools.Snapshot, error) {
	if opt.Machines < 0 || opt.Gangs < 0 || opt.Machines > 1_000_000 || opt.Gangs > 1_000_000 {
		return nil, fmt.Errorf("autoscale bench: %d machines, %d gangs: want 0..1000000 each", opt.Machines, opt.Gangs)
	}
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	type def struct {
		name, machine string
		capacity      pools.Capacity
		price         float64
	}
	defs := []def{{"h100", "dgx-h100", pools.OnDemand, 98.32}, {"h100-spot", "dgx-h100", pools.Spot, 39.33},
		{"gb200", "gb200-nvl72", pools.OnDemand, 42}, {"l40s", "pcie-l40s-8", pools.OnDemand, 15}}
	s := &pools.Snapshot{Now: now}
	for _, d := range defs {
		ms, sh, err := pools.LoadShape(d.machine, "")
		if err != nil {
			return nil, err
		}
		p := &pools.Pool{Spec: pools.PoolSpec{Name: d.name, Machine: d.machine, Max: opt.Machines + 20*opt.Gangs + 1, Capacity: d.capacity,
			PricePerHour: d.price, IdleTimeout: pools.Duration(10 * time.Minute), Provider: pools.ProviderSpec{Type: "sim"}}, Shape: sh, MachineSpec: ms}
		s.Pools = append(s.Pools, pools.PoolState{Pool: p})
	}
	rng := rand.New(rand.NewPCG(opt.Seed, opt.Seed^0x9e3779b97f4a7c15))
	for i := 0; i < opt.Machines; i++ {
		p := s.Pools[i%len(s.Pools)].Pool
		m := pools.Machine{Name: fmt.Sprintf("%s-%d", p.Spec.Name, i), Pool: p.Spec.Name, State: pools.Ready, Since: now.Add(-time.Hour),
			Domain: i / (len(s.Pools) * max(1, p.Shape.DomainMachines))}
		switch r := rng.IntN(100); {
		case r < 10:
			m.State = pools.Launching
		case r < 15:
			m.State, m.Gangs = pools.Draining, []pools.Hosted{{Gang: fmt.Sprintf("run-%d", i), Members: 1}}
		case r < 30:
			m.IdleSince = now.Add(-time.Duration(rng.IntN(20)) * time.Minute)
			m.LastCopies = rng.IntN(3)
		default:
			m.Gangs = []pools.Hosted{{Gang: fmt.Sprintf("run-%d", i), Members: 1}}
		}
		s.Machines = append(s.Machines, m)
	}
	for i := 0; i < opt.Gangs; i++ {
		g := pools.Gang{ID: fmt.Sprintf("job-%d/g", i), Arrived: now.Add(-time.Duration(rng.IntN(3600)) * time.Second), Priority: rng.IntN(3)}
		g.Member.GPUs = []int{1, 1, 2, 4, 8}[rng.IntN(5)]
		g.Member.CPUMilli = int64(g.Member.GPUs) * 8000
		g.Member.MemMiB = int64(g.Member.GPUs) * 32 << 10
		g.Size = []int{1, 1, 2, 4, 8, 16}[rng.IntN(6)]
		g.SameIsland = rng.IntN(5) == 0
		g.Tolerant = rng.IntN(2) == 0
		if rng.IntN(100) == 0 {
			g.Member.GPUs = 16 // never fits: no machine has 16 cards
		}
		s.Pending = append(s.Pending, g)
	}
	return s, nil
}

// Run builds the snapshot and times the decisions.
func Run(ctx context.Context, opt Options) (Result, error) {
	if opt.Reps <= 0 {
		opt.Reps = 1
	}
	s, err := Snapshot(opt)
	if err != nil {
		return Result{}, err
	}
	a, err := pools.New(pools.DefaultConfig())
	if err != nil {
		return Result{}, err
	}
	res := Result{Machines: opt.Machines, PendingGangs: opt.Gangs, Reps: opt.Reps}
	var times []float64
	for i := 0; i < opt.Reps; i++ {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		start := time.Now()
		d, err := a.Decide(s)
		el := time.Since(start)
		if err != nil {
			return res, err
		}
		times = append(times, float64(el)/float64(time.Millisecond))
		res.MachinesLaunched, res.Infeasible, res.Waiting, res.Drains = d.Machines(), len(d.Infeasible), len(d.Waiting), len(d.Drains)
	}
	slices.Sort(times)
	res.DecisionP50ms = times[len(times)/2]
	res.DecisionP99ms = times[min(len(times)-1, (len(times)*99)/100)]
	if opt.Baseline {
		start := time.Now()
		n, err := perGang(ctx, a, s)
		if err != nil {
			return res, err
		}
		res.BaselinePerGangMs = float64(time.Since(start)) / float64(time.Millisecond)
		res.BaselineLaunched = n
		if res.DecisionP50ms > 0 {
			res.SpeedupVsPerGang = res.BaselinePerGangMs / res.DecisionP50ms
		}
	}
	return res, nil
}

// perGang is the baseline: one decision per pending gang, in the same order. Each sees the
// machines launched for the gangs before it as taken by them (no packing of gangs onto
// shared new machines), and the gangs still waiting for capacity in flight as pending, so
// that capacity is not handed out twice.
func perGang(ctx context.Context, a *pools.Autoscaler, s *pools.Snapshot) (int, error) {
	one := *s
	one.Machines = slices.Clone(s.Machines)
	byID := make(map[string]pools.Gang, len(s.Pending))
	for _, g := range s.Pending {
		byID[g.ID] = g
	}
	var waiting []pools.Gang
	launched := 0
	for i := range s.Pending {
		if i%256 == 0 && ctx.Err() != nil {
			return launched, ctx.Err()
		}
		one.Pending = append(slices.Clone(waiting), s.Pending[i])
		d, err := a.Decide(&one)
		if err != nil {
			return launched, err
		}
		waiting = waiting[:0]
		for _, v := range d.Waiting {
			if strings.HasPrefix(v.Reason, "waits for machines launching") {
				waiting = append(waiting, byID[v.Gang])
			}
		}
		for _, l := range d.Launches {
			owner := ""
			if len(l.Gangs) > 0 {
				owner = l.Gangs[0]
			}
			for k := 0; k < l.Count; k++ {
				one.Machines = append(one.Machines, pools.Machine{Name: fmt.Sprintf("new-%d", launched), Pool: l.Pool, State: pools.Ready,
					Domain: l.Domain, Since: s.Now, Gangs: []pools.Hosted{{Gang: owner, Members: 1}}})
				launched++
			}
		}
	}
	return launched, nil
}
