package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/atoll-run/atoll/gang/sim"
	"github.com/atoll-run/atoll/pools"
	"github.com/atoll-run/atoll/pools/poolsim"
)

// runPoolsSim is `atoll sim --mode pools`: a trace replayed on autoscaling pools under
// each policy. It returns nil after printing a table (without --json).
func runPoolsSim(ctx context.Context, jobsPath, poolsPath string, maxJobs int, policies string, skipBad bool, sk *sim.Skipper, jsonOut bool) (any, error) {
	if jobsPath == "" {
		return nil, fmt.Errorf("sim: --mode pools needs --jobs (an ITP or Philly trace)")
	}
	set, err := poolsim.Builtin()
	if poolsPath != "" {
		set, err = pools.LoadFile(poolsPath)
	}
	if err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	jobs, format, err := sim.LoadJobs(jobsPath, skipBad, sk)
	if err != nil {
		return nil, err
	}
	if maxJobs > 0 && len(jobs) > maxJobs {
		jobs = jobs[:maxJobs]
	}
	var pj []poolsim.Job
	for _, j := range jobs {
		pj = append(pj, poolsim.Job{ID: j.ID, Submit: j.Submit, Duration: j.Duration, GPUs: j.GPUs})
	}
	opt := poolsim.DefaultOptions()
	if policies != "" {
		opt.Policies = strings.Split(policies, ",")
	}
	start := time.Now()
	res, err := poolsim.Run(ctx, pj, set, opt)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(os.Stderr, "pools: %d %s jobs on %d pools in %s\n", len(pj), format, len(set.Pools), time.Since(start).Round(time.Millisecond))
	if jsonOut {
		return map[string]any{"results": res}, nil
	}
	fmt.Printf("%-14s %12s %8s %9s %10s %10s %6s %9s %6s\n", "policy", "cost_usd", "vs_od%", "goodput%", "qdelay_s", "p99_s", "intr", "lost_gpuh", "spot%")
	for _, r := range res {
		fmt.Printf("%-14s %12.0f %8.1f %9.1f %10.0f %10.0f %6d %9.1f %6.1f\n", r.Policy, r.Cost, r.CostVsOnDemandPct, r.GoodputPct, r.QueueDelayMeanS, r.QueueDelayP99S, r.Interruptions, r.LostGPUHours, r.SpotShare)
	}
	return nil, nil
}
