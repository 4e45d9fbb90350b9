package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/atoll-run/atoll/gang/sim"
	"github.com/atoll-run/atoll/pools"
	"github.com/atoll-run/atoll/pools/poolsim"
)

// poolsSimArgs are the flags of `atoll sim --mode pools`.
type poolsSimArgs struct {
	jobsPath, poolsPath, policies, discounts string
	maxJobs, seeds                           int
	ckptGBPerGPU, storageGBps                float64
	ckptSet, storageSet                      bool
	skipBad, jsonOut                         bool
}

// runPoolsSim is `atoll sim --mode pools`: a trace replayed on autoscaling pools under
// each policy, once per spot discount and seed asked for. It returns nil after printing a
// table on out (without --json).
func runPoolsSim(ctx context.Context, out io.Writer, a poolsSimArgs, sk *sim.Skipper) (any, error) {
	if a.jobsPath == "" {
		return nil, fmt.Errorf("sim: --mode pools needs --jobs (an ITP or Philly trace)")
	}
	set, err := poolsim.Builtin()
	if a.poolsPath != "" {
		set, err = pools.LoadFile(a.poolsPath)
	}
	if err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	sets := []*pools.Set{set}
	if a.discounts != "" {
		sets = nil
		for _, f := range strings.Split(a.discounts, ",") {
			v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
			if err != nil {
				return nil, fmt.Errorf("sim: --spot-discount %q: want percentages in [0, 100) like 40,60,90", f)
			}
			s, err := poolsim.WithSpotDiscount(set, v)
			if err != nil {
				return nil, fmt.Errorf("sim: --spot-discount: %w", err)
			}
			sets = append(sets, s)
		}
	}
	jobs, format, err := sim.LoadJobs(a.jobsPath, a.skipBad, sk)
	if err != nil {
		return nil, err
	}
	if a.maxJobs > 0 && len(jobs) > a.maxJobs {
		jobs = jobs[:a.maxJobs]
	}
	var pj []poolsim.Job
	for _, j := range jobs {
		pj = append(pj, poolsim.Job{ID: j.ID, Submit: j.Submit, Duration: j.Duration, GPUs: j.GPUs})
	}
	opt := poolsim.DefaultOptions()
	if a.policies != "" {
		opt.Policies = strings.Split(a.policies, ",")
	}
	if a.ckptSet {
		opt.Checkpoint.GBPerGPU = a.ckptGBPerGPU
	}
	if a.storageSet {
		opt.Checkpoint.StorageGBps = a.storageGBps
	}
	if err := opt.Validate(); err != nil {
		return nil, fmt.Errorf("sim: %w (flags --policies, --checkpoint-gb-per-gpu, --storage-gbps)", err)
	}
	if a.seeds < 1 || a.seeds > 1000 {
		return nil, fmt.Errorf("sim: --seeds %d: want 1-1000", a.seeds)
	}
	start := time.Now()
	var res []poolsim.Result
	for _, s := range sets {
		for seed := 1; seed <= a.seeds; seed++ {
			opt.Seed = uint64(seed)
			r, err := poolsim.Run(ctx, pj, s, opt)
			if err != nil {
				return nil, err
			}
			res = append(res, r...)
		}
	}
	fmt.Fprintf(os.Stderr, "pools: %d %s jobs on %d pools, %d discount(s), %d seed(s), in %s\n", len(pj), format, len(set.Pools), len(sets), a.seeds, time.Since(start).Round(time.Millisecond))
	if a.jsonOut {
		return map[string]any{"results": res}, nil
	}
	fmt.Fprintf(out, "%-6s %-4s %-16s %12s %8s %8s %8s %8s %9s %9s %10s %6s %9s\n", "disc%", "seed", "policy", "cost_usd", "vs_od%", "saving%", "max%", "of_max%", "goodput%", "bound%", "qdelay_s", "intr", "lost_gpuh")
	for _, r := range res {
		fmt.Fprintf(out, "%-6.0f %-4d %-16s %12.0f %8.1f %8.1f %8.1f %8.1f %9.1f %9.1f %10.0f %6d %9.1f\n", r.SpotDiscountPct, r.Seed, r.Policy, r.Cost, r.CostVsOnDemandPct,
			r.SavingPct, r.MaxSavingPct, r.SavingOfMaxPct, r.GoodputPct, r.GoodputBoundPct, r.QueueDelayMeanS, r.Interruptions, r.LostGPUHours)
	}
	return nil, nil
}
