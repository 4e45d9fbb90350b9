package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/sdk"
)

// The tasks of `atoll bench scale --tasks N`, as Ray's many_tasks release test runs them:
// N tasks of one CPU each that hold their worker, submitted at once from one driver
// through the SDK (this process). Each task worker is a gang of one worker, placed on a
// hollow machine and hosted by its hollow agents' process (`hollow-agents --host`): a real
// actor behind a real mutually authenticated link, which the driver calls as it calls any
// task worker. Each task tells a count actor (hosted the same way) that it runs, then holds
// until the driver releases it: the count is what the tasks themselves say, not what the
// driver believes.

// scaleCountKind is the count actor's kind.
const scaleCountKind = "scale-count"

// scaleStarted tells the count actor a task runs; scaleCount asks it how many did.
type (
	scaleStarted struct{}
	scaleCount   struct{}
)

// scaleCounter counts the tasks that told it they run.
type scaleCounter struct{ n int }

func (c *scaleCounter) Receive(_ *sdk.Context, msg any) (any, error) {
	switch msg.(type) {
	case scaleStarted:
		c.n++
	case scaleCount:
	default:
		return nil, fmt.Errorf("scale count: %T", msg)
	}
	return c.n, nil
}

// scaleHoldArgs are a held task's: the count actor, and when it ends at the latest.
type scaleHoldArgs struct {
	Counter sdk.ActorRef
	Until   time.Time
}

// scaleHoldTask tells the count actor it runs, then holds its worker until its caller
// releases it (cancels it) or Until passes.
var scaleHoldTask = sdk.Task("scale.hold", func(ctx *sdk.Context, a scaleHoldArgs) (bool, error) {
	if _, err := sdk.Call[int](ctx, ctx, a.Counter, scaleStarted{}); err != nil {
		return false, fmt.Errorf("tell the count actor: %w", err)
	}
	t := time.NewTimer(time.Until(a.Until))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return true, nil
	case <-t.C:
		return false, nil
	}
})

// scaleTaskKinds are what the driver and the hollow agents' hosts both register.
func scaleTaskKinds() []sdk.Option {
	return []sdk.Option{
		sdk.Tasks(scaleHoldTask),
		sdk.Kind(scaleCountKind, func() sdk.Actor { return &scaleCounter{} }, scaleStarted{}, scaleCount{}),
	}
}

// tasks runs the --tasks phase: it submits the tasks, waits until the count actor says
// all of them run (or --setup-timeout runs out), records running_tasks (the count then)
// and queued_tasks (those submitted that had neither started nor failed), then releases
// them and stops their job, whose task workers stop with it (tasks_stopped_s).
func (b *scaleBench) tasks(ctx context.Context) (err error) {
	n := b.cfg.tasks
	cctx, ccancel := context.WithTimeout(ctx, b.cfg.setupTimeout)
	c, err := sdk.Connect(cctx, clusterAddr(b.cf), scaleTaskKinds()...)
	ccancel()
	if err != nil {
		return fmt.Errorf("tasks: connect: %w", err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		defer cancel()
		err = errors.Join(err, c.Shutdown(sctx))
	}()
	job, err := c.Submit(ctx, sdk.JobSpec{Name: scaleTasksJob})
	if err != nil {
		return fmt.Errorf("tasks: submit the job: %w", err)
	}
	counter, err := job.SpawnActor(ctx, sdk.ActorSpec{Name: "count", Kind: scaleCountKind})
	if err != nil {
		return fmt.Errorf("tasks: the count actor: %w", err)
	}
	b.say("tasks: submitting %d tasks that hold their workers", n)
	if b.cfg.tasksProfile != "" {
		defer b.profileHeads(ctx, "tasks-cpuprofile", b.cfg.tasksProfile, b.cfg.tasksProfileFor, 0)()
	}
	start := time.Now()
	tctx, release := context.WithCancel(ctx)
	defer release()
	args := scaleHoldArgs{Counter: counter, Until: start.Add(b.cfg.setupTimeout + time.Minute)}
	fs := make([]*sdk.Future[bool], n)
	for i := range fs {
		fs[i] = scaleHoldTask.Remote(tctx, job, args)
	}
	wctx, cancel := context.WithTimeout(ctx, b.cfg.setupTimeout)
	defer cancel()
	running, last := 0, -1
	for running < n {
		if err := sleepCtx(wctx, time.Second); err != nil {
			b.res.Notes = append(b.res.Notes, fmt.Sprintf("running_tasks: counted when --setup-timeout %v ran out, before all %d tasks ran", b.cfg.setupTimeout, n))
			break
		}
		v, err := sdk.Call[int](wctx, c, counter, scaleCount{})
		if err != nil {
			continue
		}
		running = v
		if running/1000 != last/1000 {
			b.say("tasks: %d of %d run after %.1f s", running, n, time.Since(start).Seconds())
			last = running
		}
	}
	ended := 0
	for _, f := range fs {
		select {
		case <-f.Done():
			ended++
		default:
		}
	}
	queued := max(0, n-running-ended)
	s := round2(time.Since(start).Seconds())
	b.res.RunningTasks, b.res.QueuedTasks, b.res.TasksS, b.res.TasksEnded = &running, &queued, &s, ended
	b.say("tasks: %d run at once after %.1f s (%d queued, %d ended early); releasing them", running, s, queued, ended)
	released := time.Now()
	release()
	for _, f := range fs {
		_, _ = f.Await(ctx)
	}
	sctx, scancel := context.WithTimeout(ctx, b.cfg.setupTimeout)
	defer scancel()
	if err := job.Stop(sctx); err != nil {
		b.res.Notes = append(b.res.Notes, fmt.Sprintf("tasks_stopped_s: the tasks' job did not stop: %v", err))
		return nil
	}
	// How long until the leader has none of their workers live.
	for {
		st, err := b.d.Status(sctx)
		if err == nil {
			left := 0
			for _, g := range st.Gangs {
				if g.Job == scaleTasksJob && g.State != api.GangStopped && g.State != api.GangFailed {
					left++
				}
			}
			if left == 0 {
				break
			}
		}
		if err := sleepCtx(sctx, time.Second); err != nil {
			b.res.Notes = append(b.res.Notes, fmt.Sprintf("tasks_stopped_s: not every task worker had stopped %v after the release", b.cfg.setupTimeout))
			return nil
		}
	}
	st := round2(time.Since(released).Seconds())
	b.res.TasksStoppedS = &st
	b.say("tasks: their workers stopped %.1f s after the release", st)
	return nil
}
