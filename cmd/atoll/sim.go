package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/atoll-run/atoll/gang"
	"github.com/atoll-run/atoll/gang/sim"
)

// newSimCmd builds `atoll sim`: the trace-driven scheduler simulator.
func newSimCmd() *cobra.Command {
	var (
		mode, nodesPath, podsPath, loadsStr, jobsPath, clusterSpec, policies string
		poolsPath, strategy, info, spotDiscounts                             string
		seeds, maxJobs                                                       int
		jsonOut, skipBad                                                     bool
		window                                                               time.Duration
		prioSeed                                                             uint64
		cpuStrand, elasticShare, saturate, strategyShare                     float64
		ckptGBPerGPU, storageGBps                                            float64
		weightsPath, inferencePath, classOnly                                string
		mixed                                                                = sim.DefaultMixedOptions()
	)
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "Replay GPU cluster traces through the gang scheduler (FGD packing or dynamic arrivals)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			sk := &sim.Skipper{}
			defer func() {
				for _, e := range sk.Errors {
					fmt.Fprintln(os.Stderr, "skipped:", e)
				}
			}()
			var weights *gang.SchedulerWeights
			if weightsPath != "" {
				if mode != "dynamic" && mode != "mixed" {
					return fmt.Errorf("sim: --weights applies to the atoll policy of --mode dynamic or mixed, not %q", mode)
				}
				w, err := gang.ReadWeightsFile(weightsPath)
				if err != nil {
					return fmt.Errorf("%w (flag --weights)", err)
				}
				weights = &w
			}
			var out any
			switch mode {
			case "fgd":
				if nodesPath == "" || podsPath == "" {
					return fmt.Errorf("sim: --mode fgd needs --nodes and --pods")
				}
				var loads []float64
				for _, f := range strings.Split(loadsStr, ",") {
					v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
					if err != nil || !(v > 0 && v <= sim.MaxFGDLoad) {
						return fmt.Errorf("sim: --load %q: want numbers in (0, %v] like 1.0,1.3", f, sim.MaxFGDLoad)
					}
					loads = append(loads, v)
				}
				opt := sim.FGDOptions{Loads: loads, Seeds: seeds, CPUStrandFactor: cpuStrand}
				if policies != "" {
					opt.Policies = strings.Split(policies, ",")
				}
				if err := opt.Validate(); err != nil {
					return fmt.Errorf("%w (flags --load, --seeds, --cpu-strand, --policies)", err)
				}
				nodes, err := sim.LoadOpenbNodes(nodesPath, skipBad, sk)
				if err != nil {
					return err
				}
				pods, err := sim.LoadOpenbPods(podsPath, skipBad, sk)
				if err != nil {
					return err
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
				opt := sim.DynamicOptions{Info: info, MaxJobs: maxJobs, Window: window, PrioritySeed: prioSeed, ElasticShare: elasticShare, SaturateLoad: saturate,
					Strategy: gang.Strategy(strategy), StrategyShare: strategyShare, Weights: weights, ClassOnly: classOnly}
				if policies != "" {
					opt.Policies = strings.Split(policies, ",")
				}
				if err := opt.Validate(); err != nil {
					return fmt.Errorf("%w (flags --info, --max-jobs, --window, --elastic-share, --strategy, --strategy-share, --saturate, --policies, --class-only)", err)
				}
				start := time.Now()
				res, err := sim.RunDynamicFiles(ctx, jobsPath, clusterSpec, skipBad, sk, opt)
				if err != nil {
					return err
				}
				fmt.Fprintf(os.Stderr, "dynamic: done in %s\n", time.Since(start).Round(time.Millisecond))
				out = map[string]any{"info": opt.Info, "results": res}
				if !jsonOut {
					fmt.Printf("information: %s (srtf: oracle)\n", opt.Info)
					fmt.Printf("%-8s %6s %10s %10s %10s %10s %10s %10s %10s %9s %6s %6s %7s\n", "policy", "util%", "qdelay", "hi-qdelay", "hi-q p50", "jct", "jct high", "jct norm", "jct low", "allred ms", "preem", "lost%", "goodp%")
					for _, r := range res {
						c := r.JCTByClass
						fmt.Printf("%-8s %6.1f %10.0f %10.0f %10.0f %10.0f %10.0f %10.0f %10.0f %9.2f %6d %6.2f %7.2f\n", r.Policy, r.UtilPct, r.QueueDelay.Mean, r.HighPrioQueueDelay.Mean, r.HighPrioQueueDelay.P50,
							r.JCT.Mean, c["high"].Mean, c["normal"].Mean, c["low"].Mean, r.AllReduce.Mean*1000, r.Preemptions, r.LostPct, r.GoodputPct)
					}
					return nil
				}
			case "mixed":
				if jobsPath == "" || clusterSpec == "" || inferencePath == "" {
					return fmt.Errorf("sim: --mode mixed needs --jobs, --inference and --cluster")
				}
				if !cmd.Flags().Changed("elastic-share") {
					elasticShare = 0.5
				}
				mixed.Training = sim.DynamicOptions{Info: info, MaxJobs: maxJobs, Window: window, PrioritySeed: prioSeed, ElasticShare: elasticShare, SaturateLoad: saturate,
					Strategy: gang.Strategy(strategy), StrategyShare: strategyShare, Weights: weights}
				mixed.Load.Seed = prioSeed
				if policies != "" {
					mixed.Policies = strings.Split(policies, ",")
				}
				if err := mixed.Validate(); err != nil {
					return fmt.Errorf("%w (flags --info, --max-jobs, --window, --elastic-share, --saturate, --policies, --inference-scale, --diurnal, --service-*)", err)
				}
				jobs, _, err := sim.LoadJobs(jobsPath, skipBad, sk)
				if err != nil {
					return err
				}
				reqs, err := sim.LoadInference(inferencePath, skipBad, sk)
				if err != nil {
					return err
				}
				snap, model, _, err := sim.LoadCluster(clusterSpec, skipBad, sk)
				if err != nil {
					return err
				}
				start := time.Now()
				res, err := sim.RunMixed(ctx, jobs, reqs, snap, model, mixed)
				if err != nil {
					return err
				}
				fmt.Fprintf(os.Stderr, "mixed: done in %s\n", time.Since(start).Round(time.Millisecond))
				out = map[string]any{"info": mixed.Training.Info, "service": mixed.Service, "replica_model": mixed.Model, "autoscale": mixed.Autoscale,
					"inference_load": mixed.Load, "results": res}
				if !jsonOut {
					fmt.Printf("%-8s %8s %10s %10s %10s %7s %7s %8s %6s %8s %6s %7s\n", "policy", "slo%", "ttft p99", "jct", "jct p99", "util%", "alloc%", "hi-q", "ded.", "peak rep", "preem", "lost h")
					for _, r := range res {
						fmt.Printf("%-8s %8.2f %10.3f %10.0f %10.0f %7.1f %7.1f %8.0f %6d %8d %6d %7.1f\n", r.Policy, r.InferenceSLOAttainmentPct, r.TTFTP99, r.TrainingJCT.Mean, r.TrainingJCT.P99,
							r.UtilisationPct, r.AllocatedPct, r.HighPrioQueueDelay.Mean, r.DedicatedGPUs, r.PeakReplicas, r.Preemptions, r.LostGPUHours)
					}
					return nil
				}
			case "pools":
				a := poolsSimArgs{jobsPath: jobsPath, poolsPath: poolsPath, maxJobs: maxJobs, policies: policies,
					discounts: spotDiscounts, ckptGBPerGPU: ckptGBPerGPU, storageGBps: storageGBps, ckptSet: cmd.Flags().Changed("checkpoint-gb-per-gpu"),
					storageSet: cmd.Flags().Changed("storage-gbps"), seeds: 1, skipBad: skipBad, jsonOut: jsonOut}
				if cmd.Flags().Changed("seeds") {
					a.seeds = seeds
				}
				res, err := runPoolsSim(ctx, cmd.OutOrStdout(), a, sk)
				if err != nil || res == nil {
					return err
				}
				out = res
			default:
				return fmt.Errorf("sim: --mode %q: want fgd, dynamic, mixed or pools", mode)
			}
			enc := json.NewEncoder(cmd.OutOrStdout())
			return enc.Encode(out)
		},
	}
	f := cmd.Flags()
	f.StringVar(&mode, "mode", "fgd", "fgd (static packing, FGD ATC'23 protocol), dynamic (arrivals and departures), mixed (training beside an inference service) or pools")
	f.StringVar(&weightsPath, "weights", "", "scheduler weights file written by atoll tune, for the atoll policy (dynamic and mixed modes)")
	f.StringVar(&inferencePath, "inference", "", "Azure LLM inference trace CSV (TIMESTAMP,ContextTokens,GeneratedTokens) driving the service (mixed mode)")
	f.Float64Var(&mixed.Load.Scale, "inference-scale", mixed.Load.Scale, "the service's mean arrival rate as a multiple of the inference trace's, in (0, 1000] (mixed mode)")
	f.Float64Var(&mixed.Load.Diurnal, "diurnal", mixed.Load.Diurnal, "amplitude in [0, 1) of the daily cycle scaling the inference rate: scale × (1 − a·cos(2πt/24h)) (mixed mode)")
	f.IntVar(&mixed.Service.MinReplicas, "service-min-replicas", mixed.Service.MinReplicas, "the service's MinReplicas (mixed mode)")
	f.IntVar(&mixed.Service.MaxReplicas, "service-max-replicas", mixed.Service.MaxReplicas, "the service's MaxReplicas (mixed mode)")
	f.IntVar(&mixed.Service.GPUsPerReplica, "service-gpus-per-replica", mixed.Service.GPUsPerReplica, "the service's GPUsPerReplica, on one machine (mixed mode)")
	f.Float64Var(&mixed.Autoscale.TargetUtil, "autoscale-target", mixed.Autoscale.TargetUtil, "share (0, 1] of the replicas' batch slots the autoscaler aims to keep in use (mixed mode)")
	f.DurationVar(&mixed.Service.LatencySLO, "service-latency-slo", mixed.Service.LatencySLO, "the service's LatencySLO on a request's time to first token (mixed mode)")
	f.StringVar(&nodesPath, "nodes", "", "openb node list CSV (fgd mode)")
	f.StringVar(&podsPath, "pods", "", "openb pod list CSV (fgd mode)")
	f.StringVar(&loadsStr, "load", "1.0,1.3", "arrived GPU requests as a share of cluster GPUs, comma-separated, each in (0, 10] (fgd mode)")
	f.IntVar(&seeds, "seeds", 10, "seeds per policy, 1-1000 (fgd mode: seeds 42, 43, ...; pools mode: the spot interruptions' seeds 1, 2, ..., default 1)")
	f.StringVar(&poolsPath, "pools", "", "pool file (pools mode; default: built-in on-demand and spot DGX H100 pools, docs/pools.md)")
	f.StringVar(&spotDiscounts, "spot-discount", "", "comma-separated spot discounts in percent, each in [0, 100), e.g. 40,50,60,70,80,90: the replay runs once per discount with every spot pool priced that far below its on-demand pool (pools mode; default: the pool file's prices)")
	f.Float64Var(&ckptGBPerGPU, "checkpoint-gb-per-gpu", 10, "a job's checkpoint state per GPU in GB, written on a notice or eviction and read back on restart (pools mode)")
	f.Float64Var(&storageGBps, "storage-gbps", 2, "a machine's bandwidth to checkpoint storage in GB/s, shared by its GPUs (pools mode)")
	f.StringVar(&jobsPath, "jobs", "", "job trace CSV, ITP or Philly, detected from the header (dynamic mode)")
	f.StringVar(&clusterSpec, "cluster", "", "cluster spec file or shorthand COUNTxMACHINE/RACK, e.g. 64xdgx-h100/8 (dynamic mode)")
	f.IntVar(&maxJobs, "max-jobs", 0, "replay at most this many jobs from the start of the trace (0 = all; at most 10,000,000)")
	f.DurationVar(&window, "window", 0, "replay only jobs submitted within this time from the first (0 = all; not negative)")
	f.StringVar(&info, "info", sim.InfoEstimate, "what every policy is told of run times: blind (nothing), estimate (a user's time limit, modelled as docs/scheduler.md states) or oracle (the true run time); srtf is always the oracle (dynamic mode)")
	f.Float64Var(&elasticShare, "elastic-share", 0, "make this share (0-1) of the multi-GPU jobs elastic: ceil(GPUs/2)..GPUs members, work scaling linearly (dynamic mode)")
	f.StringVar(&strategy, "strategy", "", "placement strategy of --strategy-share of the multi-GPU jobs that are not elastic: pack, spread, strict-pack or strict-spread (dynamic mode)")
	f.Float64Var(&strategyShare, "strategy-share", 0, "share (0-1) of the multi-GPU jobs that are not elastic given --strategy (dynamic mode)")
	f.Float64Var(&saturate, "saturate", 0, "compress arrivals so the work offered is this many times what the cluster can do in the arrival window (0 = off, at most 100; dynamic mode)")
	f.Uint64Var(&prioSeed, "priority-seed", 1, "seed of the priority-class assignment for traces without priorities")
	f.StringVar(&classOnly, "class-only", "", "replay only the jobs of this priority class (high, normal or low) after the seeded assignment: what the class alone asks of the cluster (dynamic mode)")
	f.Float64Var(&cpuStrand, "cpu-strand", 0, "scale of the atoll policy's CPU-stranding ratio, times the CPU per GPU of the GPU pods seen so far, within ±1000 (fgd mode; 0 = default 1, negative = off)")
	f.StringVar(&policies, "policies", "", "comma-separated policies (default: all of the mode)")
	f.BoolVar(&jsonOut, "json", false, "print one JSON object on stdout")
	f.BoolVar(&skipBad, "skip-bad-rows", false, "skip unparsable trace rows (reported on stderr) instead of failing")
	return cmd
}
