package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/atoll-run/atoll/gang"
	"github.com/atoll-run/atoll/gang/sim"
)

// newTuneCmd builds `atoll tune`: searches the atoll policy's weights on job traces and
// writes them to a file `atoll sim --weights` and `atoll head --scheduler-weights` load.
func newTuneCmd() *cobra.Command {
	var (
		jobsList, holdoutList, clusterSpec, outPath string
		jsonOut, skipBad                            bool
	)
	opt := sim.DefaultTuneOptions()
	cmd := &cobra.Command{
		Use:   "tune",
		Short: "Tune the atoll scheduler's weights on job traces (successive halving) and check them on a held-out trace",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if jobsList == "" || clusterSpec == "" || outPath == "" {
				return fmt.Errorf("tune: needs --jobs, --cluster and --out")
			}
			if err := opt.Validate(); err != nil {
				return fmt.Errorf("%w (flags --budget, --rungs, --eta, --max-jobs, --info, --saturate, --elastic-share)", err)
			}
			sk := &sim.Skipper{}
			defer func() {
				for _, e := range sk.Errors {
					fmt.Fprintln(os.Stderr, "skipped:", e)
				}
			}()
			load := func(list string) ([]sim.TuneTrace, error) {
				var out []sim.TuneTrace
				for _, p := range strings.Split(list, ",") {
					p = strings.TrimSpace(p)
					jobs, _, err := sim.LoadJobs(p, skipBad, sk)
					if err != nil {
						return nil, err
					}
					out = append(out, sim.TuneTrace{Name: filepath.Base(p), Jobs: jobs})
				}
				return out, nil
			}
			tuneOn, err := load(jobsList)
			if err != nil {
				return err
			}
			var holdout []sim.TuneTrace
			if holdoutList == "" {
				// No holdout trace: each tuning trace's jobs after the ones tuned on.
				for _, t := range tuneOn {
					if len(t.Jobs) <= 2*opt.MaxJobs {
						return fmt.Errorf("tune: %s has %d jobs, too few to hold out the %d after the %d tuned on: give --holdout", t.Name, len(t.Jobs), opt.MaxJobs, opt.MaxJobs)
					}
					holdout = append(holdout, sim.TuneTrace{Name: fmt.Sprintf("%s jobs %d-%d", t.Name, opt.MaxJobs+1, 2*opt.MaxJobs), Jobs: t.Jobs[opt.MaxJobs:]})
				}
			} else {
				for _, h := range strings.Split(holdoutList, ",") {
					if slices.Contains(strings.Split(jobsList, ","), h) {
						return fmt.Errorf("tune: --holdout %s is also in --jobs: the holdout must be a trace the weights were not tuned on", h)
					}
				}
				if holdout, err = load(holdoutList); err != nil {
					return err
				}
			}
			snap, model, _, err := sim.LoadCluster(clusterSpec, skipBad, sk)
			if err != nil {
				return err
			}
			start := time.Now()
			res, err := sim.Tune(cmd.Context(), tuneOn, holdout, snap, model, opt)
			if err != nil {
				return err
			}
			var names []string
			for _, t := range tuneOn {
				names = append(names, t.Name)
			}
			if err := gang.WriteWeightsFile(outPath, gang.WeightsFile{Weights: res.Tuned, TunedOn: names,
				Method: fmt.Sprintf("%s: %d candidates, %d rungs, eta %d, %d jobs per trace at the last rung, seed %d, cluster %s, info %s, saturate %v",
					res.Method, opt.Budget, opt.Rungs, opt.Eta, opt.MaxJobs, opt.Seed, clusterSpec, opt.Training.Info, opt.Training.SaturateLoad)}); err != nil {
				return fmt.Errorf("tune: --out %s: %w", outPath, err)
			}
			fmt.Fprintf(os.Stderr, "tune: %d replays in %s; weights written to %s\n", res.Evaluations, time.Since(start).Round(time.Millisecond), outPath)
			if jsonOut {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(map[string]any{"out": outPath, "result": res})
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "%-10s %-28s %12s %12s %12s %12s %9s\n", "set", "trace", "jct hand", "jct tuned", "hi-q hand", "hi-q tuned", "objective")
			for _, set := range []struct {
				name string
				cs   []sim.TuneComparison
			}{{"tuned-on", res.TunedOn}, {"holdout", res.Holdout}} {
				for _, c := range set.cs {
					fmt.Fprintf(w, "%-10s %-28s %12.0f %12.0f %12.0f %12.0f %9.4f\n", set.name, c.Trace, c.Hand.JCTMean, c.Tuned.JCTMean, c.Hand.HighPrio, c.Tuned.HighPrio, c.Objective)
				}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&jobsList, "jobs", "", "job traces to tune on, comma-separated (ITP or Philly CSV)")
	f.StringVar(&holdoutList, "holdout", "", "job traces to evaluate the tuned weights on, comma-separated; none of --jobs (default: each --jobs trace's next --max-jobs jobs, never tuned on)")
	f.StringVar(&clusterSpec, "cluster", "", "cluster spec file or shorthand COUNTxMACHINE/RACK, e.g. 16xdgx-h100/8")
	f.StringVar(&outPath, "out", "", "file to write the tuned weights to (JSON; atoll sim --weights, atoll head --scheduler-weights)")
	f.IntVar(&opt.Budget, "budget", opt.Budget, "candidate weight sets at the first rung, the hand-set ones among them (1-10000)")
	f.IntVar(&opt.Rungs, "rungs", opt.Rungs, "successive-halving rungs (1-8)")
	f.IntVar(&opt.Eta, "eta", opt.Eta, "each rung keeps 1/eta of the candidates on eta times the jobs (2-16)")
	f.IntVar(&opt.MaxJobs, "max-jobs", opt.MaxJobs, "jobs per trace at the last rung and in the comparisons (first N)")
	f.Uint64Var(&opt.Seed, "seed", opt.Seed, "seed of the candidate draws")
	f.StringVar(&opt.Training.Info, "info", opt.Training.Info, "what the policy is told of run times: blind, estimate or oracle")
	f.Float64Var(&opt.Training.SaturateLoad, "saturate", opt.Training.SaturateLoad, "compress arrivals to this load (atoll sim --saturate; 0 = off)")
	f.Float64Var(&opt.Training.ElasticShare, "elastic-share", opt.Training.ElasticShare, "share (0-1) of multi-GPU jobs made elastic")
	f.BoolVar(&jsonOut, "json", false, "print one JSON object on stdout")
	f.BoolVar(&skipBad, "skip-bad-rows", false, "skip unparsable trace rows (reported on stderr) instead of failing")
	return cmd
}
