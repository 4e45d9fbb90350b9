package sdk

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/atoll-run/atoll/actors"
	"github.com/atoll-run/atoll/runtime"
)

// Job is a submitted job: the root of an actor tree.
type Job struct {
	c         *Cluster
	j         *actors.Job
	spec      JobSpec
	submitted time.Time
}

// Name is the job's name.
func (j *Job) Name() string { return j.spec.Name }

// GangSpec describes a gang of workers placed all-or-nothing.
type GangSpec struct {
	// Name is unique within the job.
	Name string
	// Kind is the registered actor kind of every worker.
	Kind string
	// Workers is the gang's size.
	Workers int
	// GPUsPerWorker is how many whole GPUs each worker gets, on one machine.
	GPUsPerWorker int
	// SameIsland keeps the whole gang inside one NVLink island (for AllReduce on NVLink).
	SameIsland bool
	// Priority orders gangs for the scheduler (higher first).
	Priority int
	// AllReduceBytes is the size of the gang's gradients, for the scheduler's modeled
	// AllReduce time of each candidate placement. Zero: the scheduler's default.
	AllReduceBytes int64
	// MaxRestarts bounds gang restarts within RestartWindow (default window 1 minute); past it
	// the gang fails.
	MaxRestarts int
	// RestartWindow, Backoff: see actors.GangSpec. Zero values take its defaults.
	RestartWindow, Backoff time.Duration
	// KeepCheckpoints is how many complete checkpoints to keep (default 2).
	KeepCheckpoints int
}

// Gang is a running gang of workers.
type Gang struct {
	job  *Job
	g    *actors.Gang
	env  *gangEnv
	spec GangSpec
}

// SpawnGang asks the scheduler for the gang's GPUs (all members or none), then starts the
// workers and waits until every one has started. A gang that can never fit on the cluster is
// rejected with runtime.ErrNeverFits; one that does not fit now with runtime.ErrNoCapacity.
func (j *Job) SpawnGang(ctx context.Context, spec GangSpec) (*Gang, error) {
	if spec.KeepCheckpoints == 0 {
		spec.KeepCheckpoints = 2
	}
	if spec.KeepCheckpoints < 0 {
		return nil, fmt.Errorf("%w: gang %q KeepCheckpoints %d is negative", runtime.ErrInvalidRequest, spec.Name, spec.KeepCheckpoints)
	}
	req := runtime.GangRequest{Job: j.spec.Name, Gang: spec.Name, Members: spec.Workers, GPUsPerMember: spec.GPUsPerWorker,
		SameIsland: spec.SameIsland, Priority: spec.Priority, AllReduceBytes: spec.AllReduceBytes}
	head := j.c.local.Head
	p, err := head.Admit(ctx, req)
	if err != nil {
		return nil, err
	}
	env := &gangEnv{local: j.c.local, job: j.spec.Name, gang: spec.Name, size: spec.Workers, placement: p, rings: map[int]*runtime.Ring{}}
	ag, err := j.j.SpawnGang(ctx, actors.GangSpec{
		Name: spec.Name, Kind: spec.Kind, Size: spec.Workers, MaxRestarts: spec.MaxRestarts,
		RestartWindow: spec.RestartWindow, Backoff: spec.Backoff, Data: env,
		OnFailure: func(f actors.Failure) { env.endGeneration(f.Generation + 1) },
	})
	if err != nil {
		_ = head.Release(context.WithoutCancel(ctx), j.spec.Name, spec.Name)
		return nil, err
	}
	return &Gang{job: j, g: ag, env: env, spec: spec}, nil
}

// Stop stops the job's actors and releases its gangs' GPUs.
func (j *Job) Stop(ctx context.Context) error {
	err := j.j.Stop(ctx)
	if cerr := j.c.local.Head.CommitJob(ctx, runtime.JobRecord{Name: j.spec.Name, Submitted: j.submitted, State: "stopped"}); cerr != nil {
		err = errors.Join(err, cerr)
	}
	placed, lerr := j.c.local.Head.Meta().List(ctx, runtime.TablePlacements, j.spec.Name+"/")
	err = errors.Join(err, lerr)
	for _, kv := range placed {
		name := kv.Key[len(j.spec.Name)+1:]
		if rerr := j.c.local.Head.Release(ctx, j.spec.Name, name); rerr != nil {
			err = errors.Join(err, rerr)
		}
	}
	return err
}

// Name is the gang's name.
func (g *Gang) Name() string { return g.spec.Name }

// Size is the number of workers.
func (g *Gang) Size() int { return g.spec.Workers }

// Worker is the address of the worker with the given rank.
func (g *Gang) Worker(rank int) ActorRef { return ActorRef{ref: g.g.Worker(rank)} }

// Placement is where the scheduler put the gang.
func (g *Gang) Placement() runtime.Placement { return g.env.placement }

// Restarts counts gang restarts so far.
func (g *Gang) Restarts() int { return g.g.Restarts() }

// Generation is the gang's current incarnation (0, then +1 per restart).
func (g *Gang) Generation() int { return g.g.Generation() }

// Err is non-nil once the gang has failed for good.
func (g *Gang) Err() error { return g.g.Err() }

// AwaitRunning waits until the gang runs in generation minGen or later (every worker started
// and restored), and returns that generation.
func (g *Gang) AwaitRunning(ctx context.Context, minGen int) (int, error) {
	return g.g.AwaitRunning(ctx, minGen)
}

// Kill crashes one worker, as if its process died: the gang restarts all-for-one from its
// newest checkpoint. For tests and demonstrations.
func (g *Gang) Kill(rank int, reason string) error { return g.g.InjectFailure(rank, reason) }

// Checkpoint asks every worker for its state (Checkpointer.Checkpoint), stores each in its
// machine's object store, and commits them as one checkpoint at step: only a checkpoint whose
// every part is stored is ever restored from. Older checkpoints beyond KeepCheckpoints are freed.
func (g *Gang) Checkpoint(ctx context.Context, step int64) error {
	c := g.job.c
	futures := make([]Future[runtime.ObjectID], g.Size())
	for r := range futures {
		futures[r] = CallAsync[runtime.ObjectID](c, g.Worker(r), checkpointReq{step: step})
	}
	ids := make([]runtime.ObjectID, g.Size())
	var errs []error
	for r, f := range futures {
		id, err := f.Await(ctx)
		if err != nil {
			errs = append(errs, fmt.Errorf("rank %d: %w", r, err))
		}
		ids[r] = id
	}
	if err := errors.Join(errs...); err != nil {
		for _, id := range ids {
			if id != "" {
				_ = c.local.FreeObject(context.WithoutCancel(ctx), id)
			}
		}
		return fmt.Errorf("sdk: checkpoint of gang %q at step %d: %w", g.spec.Name, step, err)
	}
	l := c.local
	if err := l.CommitCheckpoint(ctx, runtime.Checkpoint{Job: g.job.spec.Name, Gang: g.spec.Name, Step: step, Objects: ids, Time: time.Now()}); err != nil {
		return err
	}
	return l.PruneCheckpoints(ctx, g.job.spec.Name, g.spec.Name, g.spec.KeepCheckpoints)
}

// LatestCheckpoint is the step of the gang's newest complete checkpoint.
func (g *Gang) LatestCheckpoint(ctx context.Context) (int64, bool, error) {
	cp, ok, err := g.job.c.local.LatestCheckpoint(ctx, g.job.spec.Name, g.spec.Name)
	return cp.Step, ok, err
}
