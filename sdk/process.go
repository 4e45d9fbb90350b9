package sdk

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/atoll-run/atoll/runtime/api"
)

// ProcessGangSpec describes a process gang: Workers members placed all-or-nothing like
// any gang, each running Command (any executable: a Python program, torchrun's worker,
// an MPI rank) instead of this program as an SDK worker. Each member gets torchrun's
// environment (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR,
// MASTER_PORT), CUDA_VISIBLE_DEVICES with its GPUs, and ATOLL_JOB, ATOLL_GANG, ATOLL_RANK,
// ATOLL_GENERATION, ATOLL_NOTICE_FILE (docs/process-gangs.md).
//
// Its members say how it ends by how they exit: status 0 of every member completes it; a
// notice (a preemption, a drain, a resize) reaches each member as NoticeSignal with a
// JSON notice file, and members that checkpoint and exit with YieldExitCode yield (a
// stop queues the gang again and its next generation starts the command again, to
// continue from the program's own checkpoint); any other exit is a failure, and the gang
// restarts all-for-one within MaxRestarts.
type ProcessGangSpec struct {
	// Name is unique within the job: 1-63 characters of [A-Za-z0-9._-].
	Name string
	// Command is the executable and its arguments: a bare name is looked up in the agents'
	// PATH, a relative path from the driver's working directory. It is not copied: it must
	// be on every machine.
	Command []string
	// Env is more of the members' environment (never secrets: it is stored in the log).
	// Atoll's and torchrun's variables are the agent's to set.
	Env map[string]string
	// Workers, MinWorkers, GPUsPerWorker, Resources, SameIsland, Strategy, Machines,
	// Priority, PriorityClass, Queue, NotPreemptible, CheckpointEvery, Duration,
	// TimeLimit, MaxRestarts, RestartWindow and Backoff are as in GangSpec. An elastic
	// process gang (MinWorkers) takes a resize by yielding: it restarts at the new size.
	Workers, MinWorkers, GPUsPerWorker int
	Resources                          Resources
	SameIsland                         bool
	Strategy                           Strategy
	Machines                           []string
	Priority                           int
	PriorityClass, Queue               string
	NotPreemptible                     bool
	CheckpointEvery, Duration          time.Duration
	TimeLimit                          time.Duration
	MaxRestarts                        int
	RestartWindow, Backoff             time.Duration
	// CheckpointOnNotice declares that the program checkpoints when given a notice (and
	// exits with YieldExitCode): the scheduler counts the save, not the lost work, in what
	// evicting it costs.
	CheckpointOnNotice bool
	// NoticeSignal is the signal the members' process groups get with a notice: SIGUSR1
	// (the default), SIGUSR2, SIGTERM, SIGINT or SIGHUP.
	NoticeSignal string
	// YieldExitCode is the status a member exits with to yield after a notice (1..255, not
	// 78; default 75).
	YieldExitCode int
	// Image, when set, runs each member in a container of this image through its
	// machine's Docker Engine: the host's network, the same environment, the placed GPUs
	// as device requests where they are real; Command runs in the image. Mounts gives the
	// containers host paths (HOST:CONTAINER or HOST:CONTAINER:ro, absolute).
	Image  string
	Mounts []string
}

// SpawnProcessGang starts a process gang (ProcessGangSpec) and waits until every member
// runs, as SpawnGang does: it queues, preempts and is preempted like any gang. The Gang
// returned follows it (State, Placement, Restarts, AwaitRunning, Stop); it has no actors
// to call, and no checkpoints of the SDK's (the program keeps its own).
func (j *Job) SpawnProcessGang(ctx context.Context, spec ProcessGangSpec) (*Gang, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("sdk: spawn process gang %q: %w", spec.Name, err)
	}
	c := j.c
	res := spec.Resources
	if res == (Resources{}) {
		res.GPUs = spec.GPUsPerWorker
	}
	names := make([]string, 0, len(spec.Env))
	for k := range spec.Env {
		names = append(names, k)
	}
	sort.Strings(names)
	env := make([]string, 0, len(names))
	for _, k := range names {
		env = append(env, k+"="+spec.Env[k])
	}
	as := api.GangSpec{Job: j.name, Name: spec.Name, Workers: spec.Workers, MinWorkers: spec.MinWorkers, Resources: api.Resources(res),
		SameIsland: spec.SameIsland, Strategy: api.Strategy(spec.Strategy), Machines: spec.Machines, Priority: spec.Priority,
		PriorityClass: spec.PriorityClass, Queue: spec.Queue, NotPreemptible: spec.NotPreemptible, JustInTime: spec.CheckpointOnNotice,
		CheckpointEvery: api.Duration(spec.CheckpointEvery), Duration: api.Duration(spec.Duration), TimeLimit: api.Duration(spec.TimeLimit),
		MaxRestarts: spec.MaxRestarts, RestartWindow: api.Duration(spec.RestartWindow), Backoff: api.Duration(spec.Backoff),
		Process: &api.ProcessSpec{Command: append([]string(nil), spec.Command...), Env: env, NoticeSignal: spec.NoticeSignal, YieldExitCode: spec.YieldExitCode,
			Image: spec.Image, Mounts: append([]string(nil), spec.Mounts...)}}
	if err := as.Normalize(); err != nil {
		return nil, err
	}
	rec, err := c.client.SpawnGang(ctx, as)
	if err != nil {
		if ctx.Err() != nil { // the answer may have been lost after the admission: withdraw
			_ = c.client.StopGang(context.WithoutCancel(ctx), j.name, spec.Name)
		}
		return nil, err
	}
	g := c.newGang(j.name, spec.Name, spec.Workers, 0, rec)
	if _, err := g.AwaitRunning(ctx, rec.Generation); err != nil {
		if ctx.Err() != nil {
			_ = c.client.StopGang(context.WithoutCancel(ctx), j.name, spec.Name) // free its GPUs
		}
		g.stop()
		return nil, fmt.Errorf("sdk: process gang %q did not start: %w", spec.Name, err)
	}
	return g, nil
}
