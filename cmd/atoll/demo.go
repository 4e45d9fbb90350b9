package main

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/atoll-run/atoll/examples/digits"
	"github.com/atoll-run/atoll/runtime"
	"github.com/atoll-run/atoll/sdk"
)

func newDemoCmd() *cobra.Command {
	o := digits.DefaultOptions()
	var asJSON, verbose bool
	var clusterSpec string
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Train a small model on an embedded cluster of simulated GPU machines (the main job)",
		Long: `demo starts the embedded default cluster (4 simulated machines of 8 GPUs, each one NVLink
island), places a gang of 8 data-parallel workers inside one island, and trains an MLP on the
UCI handwritten digits data set: each step the workers compute gradients on their shards,
AllReduce them and apply them. Part-way through one worker is killed; the gang restarts
all-for-one from its newest checkpoint. The GPUs are simulated: no GPU is needed or used.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !asJSON {
				o.Progress = cmd.ErrOrStderr()
			}
			if verbose {
				log, err := zap.NewDevelopment()
				if err != nil {
					return err
				}
				o.Logger = log
			}
			if clusterSpec != "" {
				o.ClusterOptions = append(o.ClusterOptions, sdk.WithSpec(clusterSpec))
			}
			res, err := digits.Run(cmd.Context(), o)
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				return enc.Encode(res)
			}
			fmt.Fprintf(cmd.OutOrStdout(), `
summary
  gang of %d on %d island(s) of %d GPUs (%s)
  loss %.4f -> %.4f, test accuracy %.2f%% on %d held-out digits
  %d restart(s): restored from step %d, %d step(s) replayed; %d checkpoints
  %d steps, %.0f samples/s, %.2f s wall
`, res.GangSize, res.IslandsUsed, res.GPUsTotal, simulated(res.SimulatedGPUs),
				res.InitialLoss, res.FinalLoss, 100*res.Accuracy, res.TestExamples,
				res.Restarts, res.RestoredStep, res.StepsReplayed, res.Checkpoints,
				res.Steps, res.SamplesPerSec, res.WallSeconds)
			return nil
		},
	}
	f := cmd.Flags()
	f.BoolVar(&asJSON, "json", false, "print only a JSON summary on stdout")
	f.BoolVarP(&verbose, "verbose", "v", false, "log the runtime's events to stderr")
	f.IntVar(&o.Steps, "steps", o.Steps, "training steps")
	f.IntVar(&o.Workers, "workers", o.Workers, "workers in the gang (one GPU each)")
	f.IntVar(&o.KillAtStep, "kill-at", o.KillAtStep, "crash one worker before this step (-1: never)")
	f.StringVar(&clusterSpec, "cluster", "", "simulated machines: a topology spec name, shorthand (e.g. 2xhgx-h200) or file (default "+runtime.DefaultClusterSpec+")")
	f.Uint64Var(&o.Seed, "seed", o.Seed, "seed for the data split, weights and minibatches")
	return cmd
}

func simulated(b bool) string {
	if b {
		return "simulated GPUs, declared as such"
	}
	return "real GPUs"
}
