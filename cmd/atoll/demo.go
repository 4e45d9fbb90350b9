package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/atoll-run/atoll/internal/digits"
	"github.com/atoll-run/atoll/sdk"
)

func newDemoCmd() *cobra.Command {
	o := digits.DefaultOptions()
	var asJSON, verbose, dashboard bool
	var clusterSpec, dir, address, advertise, scenario string
	var linger time.Duration
	so := digits.DefaultScenarioOptions()
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Train a small model on an embedded cluster of simulated GPU machines (the main job)",
		Long: `demo starts the embedded default cluster (4 simulated machines of 8 GPUs, each one NVLink
island), places a gang of 8 data-parallel workers inside one island, and trains an MLP on the
UCI handwritten digits data set: each step the workers compute gradients on their shards,
AllReduce them and apply them. Part-way through one worker is killed; the gang restarts
all-for-one from its newest checkpoint. The GPUs are simulated: no GPU is needed or used.

--scenario runs the scheduler's decisions on live training instead (--json prints its summary):
  preempt  a low-priority elastic gang trains on the whole cluster; a high-priority gang of one
           NVLink island arrives and must run now: the low one checkpoints just in time and
           shrinks (--victim-fixed: is stopped and queued again), then grows back
  elastic  a gang starts at its minimum, grows when another gang finishes, shrinks when a
           higher-priority gang arrives, without restarting its workers
  autoscale a gang of 16 arrives on pools with no machines: the autoscaler adds them, the gang
           trains, a spot interruption is injected at --arrive-at (the gang checkpoints, moves
           to a replacement machine and resumes), and the idle machines are removed. Without
           --dir it brings its own cluster: one head and the built-in pools (docs/pools.md:
           "h100-spot", spot, and "h100", on-demand, of 0..4 declared DGX H100 machines each,
           idle timeout 15 s) with the local provider; with --dir the cluster must run pools
           (atoll up --pools FILE)`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if sdk.InWorker() { // an agent started this binary as one of the demo's workers: serve it
				os.Exit(sdk.WorkerMain(digits.Kinds()...))
			}
			if !asJSON {
				o.Progress = cmd.ErrOrStderr()
			}
			if !cmd.Flags().Changed("kill-rank") && o.Workers >= 1 {
				o.KillRank = min(o.KillRank, o.Workers-1) // a small gang loses its last rank
			}
			if verbose {
				log, err := zap.NewDevelopment()
				if err != nil {
					return err
				}
				o.Logger = log
			}
			watch := &demoWatch{out: cmd.ErrOrStderr(), dashboard: dashboard, linger: linger}
			{
				if dir != "" || address != "" {
					if clusterSpec != "" {
						return errors.New("demo: --cluster declares the embedded default's machines; a running cluster (--dir, --address) has its own")
					}
					addr, _, err := clusterAddress(dir, address)
					if err != nil {
						return fmt.Errorf("demo: %w", err)
					}
					o.ClusterOptions = append(o.ClusterOptions, sdk.WithAddress(addr))
					if advertise != "" {
						o.ClusterOptions = append(o.ClusterOptions, sdk.WithAdvertise(advertise))
					}
				} else if clusterSpec != "" {
					o.ClusterOptions = append(o.ClusterOptions, sdk.WithSpec(clusterSpec))
				}
			}
			switch scenario {
			case "":
			case "preempt", "elastic":
				return runScenario(cmd, scenario, o, so, asJSON)
			case "autoscale":
				return runAutoscale(cmd, dir, address, o, so, asJSON)
			default:
				return fmt.Errorf("demo: --scenario %q: want preempt, elastic or autoscale", scenario)
			}
			o.Hooks = watch.hooks()
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
	f.IntVar(&o.KillRank, "kill-rank", o.KillRank, "the rank crashed (default 3, or the last rank of a smaller gang)")
	f.StringVar(&dir, "dir", "", "run on the cluster in `DIR`, as atoll up --dir DIR started it (default: the embedded default)")
	f.StringVar(&address, "address", "", "run on the cluster at `ADDRESS`, as atoll address prints it")
	f.StringVar(&advertise, "advertise", "", "host the cluster's machines reach this driver at (default 127.0.0.1; a container's name)")
	f.StringVar(&clusterSpec, "cluster", "", "simulated machines: a topology spec name, shorthand (e.g. 2xhgx-h200) or file (default "+sdk.DefaultSpec+")")
	f.Uint64Var(&o.Seed, "seed", o.Seed, "seed for the data split, weights and minibatches")
	f.BoolVar(&dashboard, "dashboard", false, "print the dashboard's address (with its login token) and keep the cluster up after training until Ctrl-C (or --linger)")
	f.DurationVar(&linger, "linger", 0, "with --dashboard: how long the cluster stays up after training (0: until Ctrl-C)")
	f.StringVar(&scenario, "scenario", "", "run a scheduling scenario on live training: preempt, elastic or autoscale")
	f.IntVar(&so.ArriveAt, "arrive-at", so.ArriveAt, "scenario: the step the high-priority gang arrives at")
	f.IntVar(&so.HighSteps, "high-steps", so.HighSteps, "scenario: the high-priority gang's training steps")
	f.BoolVar(&so.VictimFixed, "victim-fixed", false, "preempt scenario: the victim is a gang of fixed size (stopped whole, not shrunk)")
	return cmd
}

// runScenario runs `atoll demo --scenario`.
func runScenario(cmd *cobra.Command, name string, o digits.Options, so digits.ScenarioOptions, asJSON bool) error {
	if cmd.Flags().Changed("kill-at") || cmd.Flags().Changed("workers") {
		return errors.New("demo: --scenario sizes its gangs from the cluster and injects no crash: --workers and --kill-at do not apply")
	}
	if so.ArriveAt < 1 || so.ArriveAt >= o.Steps || so.HighSteps < 1 || so.HighSteps > 100000 {
		return fmt.Errorf("demo: --arrive-at %d (1..%d, before the run ends) and --high-steps %d (1..100000)", so.ArriveAt, o.Steps-1, so.HighSteps)
	}
	kept := so
	so.Options = o
	so.ArriveAt, so.HighSteps, so.VictimFixed = kept.ArriveAt, kept.HighSteps, kept.VictimFixed
	so.KillAtStep = -1
	var out any
	var err error
	if name == "preempt" {
		out, err = digits.RunPreempt(cmd.Context(), so)
	} else {
		out, err = digits.RunElastic(cmd.Context(), so)
	}
	if err != nil {
		return fmt.Errorf("demo --scenario %s: %w", name, err)
	}
	if asJSON {
		return json.NewEncoder(cmd.OutOrStdout()).Encode(out)
	}
	b, _ := json.MarshalIndent(out, "", "  ")
	fmt.Fprintf(cmd.OutOrStdout(), "\nsummary\n%s\n", b)
	return nil
}

func simulated(b bool) string {
	if b {
		return "simulated GPUs, declared as such"
	}
	return "real GPUs"
}
