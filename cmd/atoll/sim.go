package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/atoll-run/atoll/gang/sim"
)

// newSimCmd builds `atoll sim`: the trace-driven scheduler simulator.
func newSimCmd() *cobra.Command {
	var (
		mode, nodesPath, podsPath, loadsStr, jobsPath, clusterSpec, policies string
		seeds, maxJobs                                                       int
		jsonOut, skipBad                                                     bool
		window                                                               time.Duration
		prioSeed                                                             uint64
		cpuStrand                                                            float64
	)
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "Replay GPU cluster traces through the gang scheduler (FGD packing or dynamic arrivals)",
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			sk := &sim.Skipper{}
			defer func() {
				for _, e := range sk.Errors {
					fmt.Fprintln(os.Stderr, "skipped:", e)
				}
			}()
			var out any
			switch mode {
			case "fgd":
				if nodesPath == "" || podsPath == "" {
					return fmt.Errorf("sim: --mode fgd needs --nodes and --pods")
				}
				var loads []float64
				for _, f := range strings.Split(loadsStr, ",") {
					v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
					if err != nil || v <= 0 {
						return fmt.Errorf("sim: --load %q: want positive numbers like 1.0,1.3", f)
					}
					loads = append(loads, v)
				}
				nodes, err := sim.LoadOpenbNodes(nodesPath, skipBad, sk)
				if err != nil {
					return err
				}
				pods, err := sim.LoadOpenbPods(podsPath, skipBad, sk)
				if err != nil {
					return err
				}
				opt := sim.FGDOptions{Loads: loads, Seeds: seeds, CPUStrandFactor: cpuStrand}
				if policies != "" {
					opt.Policies = strings.Split(policies, ",")
				}
				start := time.Now()
				res, err := sim.RunFGD(ctx, nodes, pods, opt)
				if err != nil {
					return err
				}
				fmt.Fprintf(os.Stderr, "fgd: %d nodes, %d pods, %d seeds in %s\n", len(nodes), len(pods), seeds, time.Since(start).Round(time.Millisecond))
				out = map[string]any{"results": res}
				if !jsonOut {
					fmt.Printf("%-6s %-11s %8s %6s %9s\n", "load", "policy", "alloc%", "sd", "unalloc%")
					for _, r := range res {
						fmt.Printf("%-6.2f %-11s %8.2f %6.2f %9.2f\n", r.Load, r.Policy, r.AllocPctMean, r.AllocPctSD, r.UnallocPctMean)
					}
					return nil
				}
			case "dynamic":
				if jobsPath == "" || clusterSpec == "" {
					return fmt.Errorf("sim: --mode dynamic needs --jobs and --cluster")
				}
				opt := sim.DynamicOptions{MaxJobs: maxJobs, Window: window, PrioritySeed: prioSeed}
				if policies != "" {
					opt.Policies = strings.Split(policies, ",")
				}
				start := time.Now()
				res, err := sim.RunDynamicFiles(ctx, jobsPath, clusterSpec, skipBad, sk, opt)
				if err != nil {
					return err
				}
				fmt.Fprintf(os.Stderr, "dynamic: done in %s\n", time.Since(start).Round(time.Millisecond))
				out = map[string]any{"results": res}
				if !jsonOut {
					fmt.Printf("%-8s %6s %10s %10s %10s %12s %10s %12s %6s %8s\n", "policy", "util%", "qdelay", "p50", "p99", "hi-qdelay", "jct", "allreduce", "preem", "lostGPUh")
					for _, r := range res {
						fmt.Printf("%-8s %6.1f %10.0f %10.0f %10.0f %12.0f %10.0f %12.4f %6d %8.1f\n", r.Policy, r.UtilPct, r.QueueDelay.Mean, r.QueueDelay.P50, r.QueueDelay.P99, r.HighPrioQueueDelay.Mean, r.JCT.Mean, r.AllReduce.Mean, r.Preemptions, r.LostGPUHours)
					}
					return nil
				}
			default:
				return fmt.Errorf("sim: --mode %q: want fgd or dynamic", mode)
			}
			enc := json.NewEncoder(os.Stdout)
			return enc.Encode(out)
		},
	}
	f := cmd.Flags()
	f.StringVar(&mode, "mode", "fgd", "fgd (static packing, FGD ATC'23 protocol) or dynamic (arrivals and departures)")
	f.StringVar(&nodesPath, "nodes", "", "openb node list CSV (fgd mode)")
	f.StringVar(&podsPath, "pods", "", "openb pod list CSV (fgd mode)")
	f.StringVar(&loadsStr, "load", "1.0,1.3", "arrived GPU requests as a share of cluster GPUs, comma-separated (fgd mode)")
	f.IntVar(&seeds, "seeds", 10, "seeds per policy (fgd mode; seeds 42, 43, ...)")
	f.StringVar(&jobsPath, "jobs", "", "job trace CSV, ITP or Philly, detected from the header (dynamic mode)")
	f.StringVar(&clusterSpec, "cluster", "", "cluster spec file or shorthand COUNTxMACHINE/RACK, e.g. 64xdgx-h100/8 (dynamic mode)")
	f.IntVar(&maxJobs, "max-jobs", 0, "replay at most this many jobs from the start of the trace (0 = all)")
	f.DurationVar(&window, "window", 0, "replay only jobs submitted within this time from the first (0 = all)")
	f.Uint64Var(&prioSeed, "priority-seed", 1, "seed of the priority-class assignment for traces without priorities")
	f.Float64Var(&cpuStrand, "cpu-strand", 0, "scale of the atoll policy's CPU-stranding ratio, times the CPU per GPU of the GPU pods seen so far (fgd mode; 0 = default 1, negative = off)")
	f.StringVar(&policies, "policies", "", "comma-separated policies (default: all of the mode)")
	f.BoolVar(&jsonOut, "json", false, "print one JSON object on stdout")
	f.BoolVar(&skipBad, "skip-bad-rows", false, "skip unparsable trace rows (reported on stderr) instead of failing")
	return cmd
}
