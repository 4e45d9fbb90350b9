package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/atoll-run/atoll/runtime/api"
)

// processGangFlags are atoll submit's flags of a process gang (--workers and the rest).
type processGangFlags struct {
	gang                                  string
	workers, minWorkers, gpus, priority   int
	maxRestarts, yieldCode                int
	queue, priorityClass, signal, pinnedS string
	strategy, image                       string
	mounts                                []string
	notPreemptible, checkpointOnNotice    bool
}

// processOnly are the flags that mean something only with --workers.
var processOnly = []string{"gang", "min-workers", "gpus-per-worker", "priority", "priority-class", "queue", "max-restarts",
	"yield-exit-code", "notice-signal", "strategy", "machines", "not-preemptible", "checkpoint-on-notice", "image", "mount"}

func (p *processGangFlags) register(f *pflag.FlagSet) {
	f.IntVar(&p.workers, "workers", 0, "run PROGRAM ARGS as a process gang of this many members (not a driver): see above")
	f.StringVar(&p.gang, "gang", "main", "the process gang's name (with --workers)")
	f.IntVar(&p.minWorkers, "min-workers", 0, "make the process gang elastic: start with as few as this when only that fits (with --workers)")
	f.IntVar(&p.gpus, "gpus-per-worker", 0, "whole GPUs of each member, on one machine (with --workers)")
	f.IntVar(&p.priority, "priority", 0, "the process gang's priority: higher preempts lower (with --workers)")
	f.StringVar(&p.priorityClass, "priority-class", "", "one of the operator's priority classes (with --workers; atoll queues)")
	f.StringVar(&p.queue, "queue", "", "the operator's queue it waits in (with --workers; default: the default queue)")
	f.IntVar(&p.maxRestarts, "max-restarts", 3, "restarts after failures within a minute before the gang fails (with --workers)")
	f.IntVar(&p.yieldCode, "yield-exit-code", api.DefaultYieldExitCode, "the exit status by which a member yields after a notice (with --workers)")
	f.StringVar(&p.signal, "notice-signal", api.DefaultNoticeSignal, "the signal a notice is given by: SIGUSR1, SIGUSR2, SIGTERM, SIGINT or SIGHUP (with --workers)")
	f.StringVar(&p.strategy, "strategy", "", "pack, spread, strict-pack or strict-spread (with --workers; default: topology-aware packing)")
	f.StringVar(&p.pinnedS, "machines", "", "comma-separated machine names the members go on alone (with --workers)")
	f.BoolVar(&p.notPreemptible, "not-preemptible", false, "keep the process gang from being preempted or shrunk (with --workers)")
	f.BoolVar(&p.checkpointOnNotice, "checkpoint-on-notice", false, "declare that the program checkpoints when given a notice (with --workers)")
	f.StringVar(&p.image, "image", "", "run each member in a container of this `IMAGE` through its machine's Docker Engine (with --workers; PROGRAM is run in the image)")
	f.StringArrayVar(&p.mounts, "mount", nil, "give a container member a host path, `MOUNT` as HOST:CONTAINER or HOST:CONTAINER:ro with absolute paths (with --image; repeatable)")
}

// unused refuses the process gang's flags without --workers: a driver takes none of them.
func (p *processGangFlags) unused(cmd *cobra.Command) error {
	for _, n := range processOnly {
		if cmd.Flags().Changed(n) {
			return fmt.Errorf("submit: --%s is a process gang's flag: give --workers too, or drop it to submit a driver", n)
		}
	}
	return nil
}

// submitProcessGang submits a job whose one gang runs args as a process gang.
func submitProcessGang(cmd *cobra.Command, dir, address, name string, env []string, wait bool, p processGangFlags, args []string) error {
	if p.workers < 1 {
		return fmt.Errorf("submit: --workers %d: want at least 1 member", p.workers)
	}
	wd, err := os.Getwd()
	if err != nil {
		return fmt.Errorf("submit: the working directory: %w", err)
	}
	var machines []string
	if p.pinnedS != "" {
		machines = strings.Split(p.pinnedS, ",")
	}
	spec := api.GangSpec{Job: name, Name: p.gang, Workers: p.workers, MinWorkers: p.minWorkers, Resources: api.Resources{GPUs: p.gpus},
		Strategy: api.Strategy(p.strategy), Machines: machines, Priority: p.priority, PriorityClass: p.priorityClass, Queue: p.queue,
		NotPreemptible: p.notPreemptible, JustInTime: p.checkpointOnNotice, MaxRestarts: p.maxRestarts,
		Process: &api.ProcessSpec{Command: args, Env: env, NoticeSignal: p.signal, YieldExitCode: p.yieldCode, Image: p.image, Mounts: p.mounts}}
	if p.yieldCode == 0 {
		return fmt.Errorf("submit: --yield-exit-code 0: status 0 means a member completed; want 1..255 (default %d)", api.DefaultYieldExitCode)
	}
	if p.gpus < 0 {
		return fmt.Errorf("submit: --gpus-per-worker %d is negative", p.gpus)
	}
	if p.gpus == 0 {
		spec.Resources.CPUMilli = 1000
	}
	if err := spec.Normalize(); err != nil {
		return fmt.Errorf("submit: %w", err)
	}
	addr, _, err := clusterAddress(dir, address)
	if err != nil {
		return fmt.Errorf("submit: %w", err)
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), time.Minute)
	defer cancel()
	c, err := dialCluster(ctx, addr)
	if err != nil {
		return fmt.Errorf("submit: %w", err)
	}
	if _, err := c.SubmitJob(ctx, api.Job{Name: name, Driver: "atoll submit --workers", Dir: wd, EndsWithGangs: true}); err != nil {
		return fmt.Errorf("submit: %w", err)
	}
	g, err := c.SpawnGang(ctx, spec)
	if err != nil {
		_ = c.StopJob(context.WithoutCancel(ctx), name)
		return fmt.Errorf("submit: %w", err)
	}
	where := "waits in its queue: " + g.Reason
	if g.Placement != nil {
		where = "runs on " + strings.Join(g.Placement.Machines, ", ")
	}
	fmt.Fprintf(cmd.OutOrStdout(), "submitted %s: process gang %s of %d members %s\nfollow rank 0: atoll logs %s --follow (--rank R for the others)\n",
		name, p.gang, p.workers, where, name)
	if !wait {
		return nil
	}
	return waitGang(cmd, c, name, p.gang)
}

// waitGang waits until a submitted gang ends: nil when it stopped (completed), an error
// when it failed.
func waitGang(cmd *cobra.Command, c *dialed, job, gang string) error {
	for {
		g, _, err := c.Gang(cmd.Context(), job, gang)
		if err != nil {
			return err
		}
		switch g.State {
		case api.GangStopped:
			fmt.Fprintf(cmd.OutOrStdout(), "%s: %s\n", job, g.Reason)
			return nil
		case api.GangFailed:
			return fmt.Errorf("submit: %s failed: %s", job, g.Reason)
		}
		select {
		case <-cmd.Context().Done():
			return cmd.Context().Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}
