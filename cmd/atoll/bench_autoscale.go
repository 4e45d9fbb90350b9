package main

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/atoll-run/atoll/internal/bench/autoscale"
)

// newBenchAutoscaleCmd builds `atoll bench autoscale`: the pools autoscaler's decision time.
func newBenchAutoscaleCmd() *cobra.Command {
	opt := autoscale.DefaultOptions()
	var jsonOut bool
	cmd := &cobra.Command{
		Use:   "autoscale",
		Short: "Time one autoscaler decision over many machines and pending gangs, against a per-gang loop",
		Args:  noSubcommand,
		RunE: func(cmd *cobra.Command, _ []string) error {
			res, err := autoscale.Run(cmd.Context(), opt)
			if err != nil {
				return fmt.Errorf("bench autoscale: %w", err)
			}
			if jsonOut {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(res)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%d machines, %d pending gangs: decision p50 %.1f ms, p99 %.1f ms (%d reps); %d machines launched, %d gangs infeasible, %d waiting, %d drains\n",
				res.Machines, res.PendingGangs, res.DecisionP50ms, res.DecisionP99ms, res.Reps, res.MachinesLaunched, res.Infeasible, res.Waiting, res.Drains)
			if opt.Baseline {
				fmt.Fprintf(cmd.OutOrStdout(), "per-gang loop baseline: %.1f ms for the same gangs (%d machines launched): x%.1f\n",
					res.BaselinePerGangMs, res.BaselineLaunched, res.SpeedupVsPerGang)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&opt.Machines, "machines", opt.Machines, "machines in the snapshot (four pools, every state)")
	f.IntVar(&opt.Gangs, "gangs", opt.Gangs, "pending gangs of mixed shapes")
	f.IntVar(&opt.Reps, "reps", opt.Reps, "timed decisions")
	f.BoolVar(&opt.Baseline, "baseline", opt.Baseline, "also time the per-gang loop once")
	f.Uint64Var(&opt.Seed, "seed", opt.Seed, "workload seed")
	f.BoolVar(&jsonOut, "json", false, "print one JSON object on stdout")
	return cmd
}
