package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/atoll-run/atoll/gang/sim"
)

// newBenchSchedCmd builds `atoll bench sched`: gang scheduler throughput and cycle latency.
func newBenchSchedCmd() *cobra.Command {
	var opt sim.BenchOptions
	var jsonOut bool
	cmd := &cobra.Command{
		Use:   "sched",
		Short: "Measure gang placements per second and cycle latency on a synthetic cluster",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := opt.Validate(); err != nil {
				return fmt.Errorf("%w (flags --nodes, --gangs, --churn-cycles, --baseline-gangs)", err)
			}
			res, err := sim.RunSchedBench(cmd.Context(), opt)
			if err != nil {
				return err
			}
			if jsonOut {
				return json.NewEncoder(os.Stdout).Encode(res)
			}
			fmt.Printf("members/s %.0f (full-scan baseline %.0f, x%.1f)  cycle p50 %.2f ms  p99 %.2f ms  (%d cycles, %d members, %d gangs)\n",
				res.MembersPerS, res.BaselineMPS, res.SpeedupVsScan, res.CycleP50ms, res.CycleP99ms, res.Cycles, res.Members, res.GangsPlaced)
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&opt.Nodes, "nodes", 10000, "machines of 8 GPUs (racks of 8), 1-100,000")
	f.IntVar(&opt.Gangs, "gangs", 10000, "pending gangs of 1-64 one-GPU members, 1-1,000,000")
	f.IntVar(&opt.ChurnCycles, "churn-cycles", 50, "steady-state cycles after the fill, 2% of gangs replaced each, 0-100,000")
	f.IntVar(&opt.BaselineGangs, "baseline-gangs", 100, "gangs placed by the full-scan baseline in the same run, 0-1,000,000")
	f.Uint64Var(&opt.Seed, "seed", 1, "workload seed")
	f.BoolVar(&jsonOut, "json", false, "print one JSON object on stdout")
	return cmd
}
