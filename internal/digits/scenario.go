package digits

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"go.uber.org/zap"

	"github.com/atoll-run/atoll/sdk"
	"github.com/atoll-run/atoll/sdk/local"
)

// The scenarios of `atoll demo --scenario`: the scheduler's decisions carried out on a
// running cluster, with real training.
//
//   - preempt: a low-priority elastic gang trains on the whole cluster; a high-priority gang
//     of one NVLink island arrives and must run now. The low one is asked to shrink (or,
//     with VictimFixed, to stop): it checkpoints just in time, gives up the island, trains
//     on; the high one trains; when it ends, the low one grows back.
//   - elastic: a gang starts at its minimum (another gang holds the rest of the cluster),
//     grows when that gang finishes, shrinks when a higher-priority gang arrives; none of
//     this restarts its workers.

// ScenarioOptions configure a scenario run.
type ScenarioOptions struct {
	Options
	// ArriveAt is the step of the victim (preempt) or of the elastic gang's run after its
	// grow (elastic) at which the high-priority gang arrives.
	ArriveAt int
	// HighSteps is how long the high-priority gang trains.
	HighSteps int
	// VictimFixed makes the preempt scenario's victim a gang of fixed size: it is stopped
	// whole (and queued again) instead of shrunk.
	VictimFixed bool
}

// DefaultScenarioOptions: 300 steps for the victim, the high-priority gang at step 60 for
// 150 steps, checkpoints every 25 steps.
func DefaultScenarioOptions() ScenarioOptions {
	o := DefaultOptions()
	o.KillAtStep = -1
	return ScenarioOptions{Options: o, ArriveAt: 60, HighSteps: 150}
}

// ResizeRecord is one resize an elastic gang took: sizes, and the seconds from the notice
// to the gang training at its new size.
type ResizeRecord struct {
	From    int     `json:"from"`
	To      int     `json:"to"`
	Seconds float64 `json:"seconds"`
	Kind    string  `json:"kind"`
}

// Costs is what the scheduler estimated a stop of the victim costs, in seconds.
type Costs struct {
	WorkLost     float64 `json:"work_lost"`
	Checkpoint   float64 `json:"checkpoint"`
	Restore      float64 `json:"restore"`
	CUDAContext  float64 `json:"cuda_context"`
	Communicator float64 `json:"communicator"`
	GPUSeconds   float64 `json:"gpu_seconds"`
}

// GangResult is one gang's run in a scenario.
type GangResult struct {
	Workers     int            `json:"workers"`
	Steps       int64          `json:"steps"`
	FinalLoss   float64        `json:"final_loss"`
	TestLoss    float64        `json:"test_loss"`
	Accuracy    float64        `json:"accuracy"`
	Restarts    int            `json:"restarts"`
	Preemptions int            `json:"preemptions"`
	Resizes     []ResizeRecord `json:"resizes"`
	StepsLost   int64          `json:"steps_lost"`
	Machines    []string       `json:"machines"`
}

// PreemptResult is `atoll demo --scenario preempt --json`.
type PreemptResult struct {
	Scenario string `json:"scenario"`
	Embedded bool   `json:"embedded"`
	GPUs     int    `json:"gpus_total"`
	// HighPrioWaitS is the high-priority gang's wait from submission to every worker ready.
	HighPrioWaitS float64 `json:"high_prio_wait_s"`
	// VictimCheckpointed: the victim's just-in-time checkpoint was committed before its
	// deadline (before it gave up its GPUs).
	VictimCheckpointed bool `json:"victim_checkpointed"`
	// VictimStepsLost: steps the victim had to do again.
	VictimStepsLost int64 `json:"victim_steps_lost"`
	// VictimShrunkTo: its size after the shrink, or null when it was stopped whole.
	VictimShrunkTo *int `json:"victim_shrunk_to"`
	// VictimResumed: it trained on after the notice (shrunk, or placed again).
	VictimResumed bool   `json:"victim_resumed"`
	Notice        string `json:"notice"`
	CostS         Costs  `json:"cost_s"`
	// The final loss and accuracy of both gangs (also in Victim and High).
	VictimFinalLoss float64    `json:"victim_final_loss"`
	VictimAccuracy  float64    `json:"victim_accuracy"`
	HighFinalLoss   float64    `json:"high_final_loss"`
	HighAccuracy    float64    `json:"high_accuracy"`
	Victim          GangResult `json:"victim"`
	High            GangResult `json:"high"`
	WallSeconds     float64    `json:"wall_s"`
}

// ElasticResult is `atoll demo --scenario elastic --json`.
type ElasticResult struct {
	Scenario  string         `json:"scenario"`
	Embedded  bool           `json:"embedded"`
	GPUs      int            `json:"gpus_total"`
	Resizes   []ResizeRecord `json:"resizes"`
	Restarts  int            `json:"restarts"`
	FinalLoss float64        `json:"final_loss"`
	TestLoss  float64        `json:"test_loss"`
	Accuracy  float64        `json:"accuracy"`
	// MinWorkers..MaxWorkers is the elastic gang's range; Sizes the sizes it trained at.
	MinWorkers  int        `json:"min_workers"`
	MaxWorkers  int        `json:"max_workers"`
	Sizes       []int      `json:"sizes"`
	Steps       int64      `json:"steps"`
	StepsLost   int64      `json:"steps_lost"`
	Elastic     GangResult `json:"elastic"`
	WallSeconds float64    `json:"wall_s"`
}

// trainer drives one gang's training: its steps, periodic checkpoints, and the notices the
// cluster gives it, taken at step boundaries (a just-in-time checkpoint before a stop or a
// shrink, a resize with the workers kept).
type trainer struct {
	c     *sdk.Cluster
	g     *sdk.Gang
	o     Options
	steps int64
	step  int64
	live  *progressLine
	name  string

	// onStep, if set, runs after each step (the scenario's script).
	onStep func(step int64) error

	loss    float64   // the last step's training loss
	samples int64     // samples trained on
	began   time.Time // when run began

	res          GangResult
	checkpointed bool
	shrunkTo     *int
	resumed      bool
	notice       string
	costs        *sdk.EvictionCosts
	sizes        []int
}

func (t *trainer) run(ctx context.Context) error {
	failed := 0
	t.began = time.Now()
	t.sizes = append(t.sizes, t.g.Size())
	for t.step < t.steps {
		select {
		case n := <-t.g.Notices():
			if err := t.take(ctx, n); err != nil {
				return err
			}
			continue
		default:
		}
		loss, n, err := trainStep(ctx, t.c, t.g, t.step)
		if err != nil {
			failed++
			if failed > t.o.MaxFailedSteps {
				return fmt.Errorf("digits: %s: %d steps in a row failed; the last at step %d: %w", t.name, failed, t.step, err)
			}
			before := t.step
			recovered, rerr := resync(ctx, t.c, t.g)
			if rerr != nil {
				return fmt.Errorf("digits: %s: step %d failed (%v) and the gang did not recover: %w", t.name, t.step, err, rerr)
			}
			t.res.StepsLost += max(0, before-recovered)
			t.step = recovered
			continue
		}
		failed = 0
		t.loss, t.samples = loss, t.samples+int64(n)
		t.step++
		if t.step%int64(t.o.CheckpointEvery) == 0 {
			if err := t.g.Checkpoint(ctx, t.step); err != nil {
				t.live.note(fmt.Sprintf("%s: checkpoint at step %d failed: %v", t.name, t.step, err))
			}
		}
		if t.onStep != nil {
			if err := t.onStep(t.step); err != nil {
				return err
			}
		}
	}
	return nil
}

// take carries out a notice at a step boundary.
func (t *trainer) take(ctx context.Context, n sdk.Notice) error {
	start := n.Issued
	if start.IsZero() {
		start = time.Now()
	}
	text := string(n.Kind) + ": " + n.Reason
	if t.notice == "" && n.Kind != sdk.NoticeGrow {
		t.notice = text // the first notice that took something away
	}
	t.live.note(fmt.Sprintf("%s: notice %s", t.name, text))
	switch n.Kind {
	case sdk.NoticePreempt, sdk.NoticeDrain:
		t.costs = n.Costs
		at := t.step
		err := t.g.Checkpoint(ctx, t.step) // just in time: nothing is lost
		t.checkpointed = err == nil && (n.Deadline.IsZero() || time.Now().Before(n.Deadline))
		if err := t.g.Yield(ctx, n); err != nil {
			if !errors.Is(err, sdk.ErrStale) {
				return err
			}
			// Past its deadline the leader stopped the gang itself; it is queued again
			// all the same.
			t.live.note(fmt.Sprintf("%s: the stop was carried out before the notice was taken (%v)", t.name, err))
		}
		t.live.note(fmt.Sprintf("%s: stopped and queued again (checkpoint of step %d taken on notice: %v); waiting to be placed", t.name, at, t.checkpointed))
		if _, err := t.g.AwaitRunning(ctx, n.Generation+1); err != nil {
			return err
		}
		step, err := resync(ctx, t.c, t.g)
		if err != nil {
			return err
		}
		t.res.StepsLost += max(0, at-step)
		t.step, t.resumed = step, true
		t.res.Preemptions++
		t.live.note(fmt.Sprintf("%s: placed again, resumed at step %d", t.name, step))
	case sdk.NoticeShrink:
		t.costs = n.Costs
		err := t.g.Checkpoint(ctx, t.step) // the state is durable before members go
		t.checkpointed = err == nil && (n.Deadline.IsZero() || time.Now().Before(n.Deadline))
		if err := t.g.Yield(ctx, n); err != nil {
			if !errors.Is(err, sdk.ErrStale) {
				return err
			}
			// Past its deadline the leader carried the shrink out itself: the gang restarts
			// at its new size from its newest checkpoint. Follow it there.
			if err := t.followRestart(ctx, n); err != nil {
				return err
			}
		}
		to := t.g.Size()
		t.shrunkTo, t.resumed = &to, true
		t.record(n, start)
	case sdk.NoticeGrow:
		if err := t.g.Yield(ctx, n); err != nil {
			if !errors.Is(err, sdk.ErrStale) {
				return err
			}
			if err := t.followRestart(ctx, n); err != nil { // the gang restarted meanwhile
				return err
			}
		}
		t.record(n, start)
	}
	return nil
}

// followRestart follows a gang whose notice ended with its generation (the leader acted
// alone past the deadline, or the gang failed meanwhile): it waits for the next
// generation and resumes from the step its workers restored.
func (t *trainer) followRestart(ctx context.Context, n sdk.Notice) error {
	at := t.step
	if _, err := t.g.AwaitRunning(ctx, n.Generation+1); err != nil {
		return err
	}
	step, err := resync(ctx, t.c, t.g)
	if err != nil {
		return err
	}
	t.res.StepsLost += max(0, at-step)
	t.step = step
	t.live.note(fmt.Sprintf("%s: %s notice carried out by the leader past its deadline; resumed at step %d with %d workers", t.name, n.Kind, step, t.g.Size()))
	return nil
}

// progress shows the run on the live line.
func (t *trainer) progress(step int64) {
	rate := 0.0
	if d := time.Since(t.began).Seconds(); d > 0 {
		rate = float64(t.samples) / d
	}
	t.live.update(step, t.loss, rate, t.g.Restarts())
}

func (t *trainer) record(n sdk.Notice, start time.Time) {
	r := ResizeRecord{From: n.From, To: t.g.Size(), Seconds: time.Since(start).Seconds(), Kind: string(n.Kind)}
	t.res.Resizes = append(t.res.Resizes, r)
	t.sizes = append(t.sizes, r.To)
	t.live.note(fmt.Sprintf("%s: %s %d -> %d workers in %.3f s (no worker restarted)", t.name, n.Kind, r.From, r.To, r.Seconds))
}

// finish evaluates the gang's model.
func (t *trainer) finish(ctx context.Context) error {
	last, err := sdk.Call[evalReply](ctx, t.c, t.g.Worker(0), evalReq{})
	if err != nil {
		return err
	}
	t.res.FinalLoss, t.res.TestLoss, t.res.Accuracy = last.TrainLoss, last.TestLoss, last.TestAccuracy
	t.res.Steps, t.res.Restarts, t.res.Workers = t.step, t.g.Restarts(), t.g.Size()
	t.res.Machines = t.g.Placement().Machines
	if t.res.Resizes == nil {
		t.res.Resizes = []ResizeRecord{}
	}
	return nil
}

// scenarioCluster starts or connects to the cluster and loads the data.
func scenarioCluster(ctx context.Context, o Options) (*sdk.Cluster, sdk.Ref[[2]Dataset], int, error) {
	var none sdk.Ref[[2]Dataset]
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	c, err := local.Start(ctx, append(append([]sdk.Option{sdk.WithLogger(o.Logger)}, Kinds()...), o.ClusterOptions...)...)
	if err != nil {
		return nil, none, 0, err
	}
	train, test, err := Load(o.Seed, 0.2)
	if err != nil {
		_ = c.Shutdown(context.WithoutCancel(ctx))
		return nil, none, 0, err
	}
	sets, err := sdk.Put(ctx, c, [2]Dataset{train, test})
	if err != nil {
		_ = c.Shutdown(context.WithoutCancel(ctx))
		return nil, none, 0, err
	}
	topo, err := c.Topology(ctx)
	if err != nil {
		_ = c.Shutdown(context.WithoutCancel(ctx))
		return nil, none, 0, err
	}
	return c, sets, topo.NumGPUs(), nil
}

func (o Options) args(sets sdk.Ref[[2]Dataset]) workerArgs {
	return workerArgs{Data: sets, Hidden: o.Hidden, Batch: o.Batch, LR: o.LR, Momentum: o.Momentum, Seed: o.Seed}
}

// spawn submits a job and spawns its gang "dp".
func spawn(ctx context.Context, c *sdk.Cluster, job string, spec sdk.GangSpec) (*sdk.Job, *sdk.Gang, error) {
	j, err := c.Submit(ctx, sdk.JobSpec{Name: job})
	if err != nil {
		return nil, nil, err
	}
	g, err := j.SpawnGang(ctx, spec)
	if err != nil {
		_ = j.Stop(context.WithoutCancel(ctx))
		return nil, nil, err
	}
	return j, g, nil
}

// highGang trains the high-priority gang (one island) to its end and stops it.
func highGang(ctx context.Context, c *sdk.Cluster, o ScenarioOptions, sets sdk.Ref[[2]Dataset], live *progressLine) (GangResult, float64, error) {
	submitted := time.Now()
	job, g, err := spawn(ctx, c, "digits-high", sdk.GangSpec{Name: "dp", Kind: "digits-worker", Args: o.args(sets), Workers: 8, GPUsPerWorker: 1,
		SameIsland: true, Priority: 1, NotPreemptible: true, MaxRestarts: 3, Backoff: 20 * time.Millisecond, AllReduceBytes: int64(4 * NumParams(o.Hidden))})
	if err != nil {
		return GangResult{}, 0, fmt.Errorf("digits: the high-priority gang: %w", err)
	}
	wait := time.Since(submitted).Seconds()
	live.note(fmt.Sprintf("high-priority gang running %.3f s after it arrived, on %v", wait, g.Placement().Machines))
	t := &trainer{c: c, g: g, o: o.Options, steps: int64(o.HighSteps), live: live, name: "high"}
	err = t.run(ctx)
	if err == nil {
		err = t.finish(ctx)
	}
	_ = job.Stop(context.WithoutCancel(ctx)) // its GPUs go back
	return t.res, wait, err
}

// openScenario checks the options, starts or connects to the cluster (which must have two
// islands of 8 GPUs) and loads the data.
func openScenario(ctx context.Context, o *ScenarioOptions, name string) (*sdk.Cluster, sdk.Ref[[2]Dataset], int, *progressLine, error) {
	var none sdk.Ref[[2]Dataset]
	o.KillAtStep = -1
	if err := o.check(); err != nil {
		return nil, none, 0, nil, err
	}
	live := newProgressLine(progressOf(o.Options), o.Steps)
	c, sets, gpus, err := scenarioCluster(ctx, o.Options)
	if err != nil {
		return nil, none, 0, nil, err
	}
	if gpus < 16 {
		_ = c.Shutdown(context.WithoutCancel(ctx))
		return nil, none, 0, nil, fmt.Errorf("digits: the %s scenario needs at least 16 GPUs (two islands of 8); the cluster has %d", name, gpus)
	}
	return c, sets, gpus, live, nil
}

// highDone is the high-priority gang's run: its result and its wait.
type highDone struct {
	res  GangResult
	wait float64
	err  error
}

// arriveHigh submits the high-priority gang and trains it in the background.
func arriveHigh(ctx context.Context, c *sdk.Cluster, o ScenarioOptions, sets sdk.Ref[[2]Dataset], live *progressLine) <-chan highDone {
	done := make(chan highDone, 1)
	go func() {
		r, w, err := highGang(ctx, c, o, sets, live)
		done <- highDone{r, w, err}
	}()
	return done
}

// RunPreempt runs the preempt scenario.
func RunPreempt(ctx context.Context, o ScenarioOptions) (PreemptResult, error) {
	start := time.Now()
	res := PreemptResult{Scenario: "preempt"}
	c, sets, gpus, live, err := openScenario(ctx, &o, "preempt")
	if err != nil {
		return res, err
	}
	defer func() { _ = c.Shutdown(context.WithoutCancel(ctx)) }()
	res.Embedded, res.GPUs = c.Embedded(), gpus
	spec := sdk.GangSpec{Name: "dp", Kind: "digits-worker", Args: o.args(sets), Workers: gpus, GPUsPerWorker: 1, Priority: 0,
		CheckpointOnNotice: true, CheckpointEvery: time.Duration(o.CheckpointEvery) * 10 * time.Millisecond, MaxRestarts: 3,
		Backoff: 20 * time.Millisecond, AllReduceBytes: int64(4 * NumParams(o.Hidden))}
	if !o.VictimFixed {
		spec.MinWorkers = gpus / 4
	}
	job, g, err := spawn(ctx, c, "digits-low", spec)
	if err != nil {
		return res, fmt.Errorf("digits: the low-priority gang: %w", err)
	}
	defer func() { _ = job.Stop(context.WithoutCancel(ctx)) }()
	live.note(fmt.Sprintf("low-priority gang of %d workers trains on the whole cluster (%d GPUs)", g.Size(), gpus))
	victim := &trainer{c: c, g: g, o: o.Options, steps: int64(o.Steps), live: live, name: "low"}
	var high <-chan highDone
	victim.onStep = func(step int64) error {
		victim.progress(step)
		if step == int64(o.ArriveAt) {
			live.note(fmt.Sprintf("a high-priority gang of 8 GPUs (one island) arrives at the low gang's step %d", step))
			high = arriveHigh(ctx, c, o, sets, live)
		}
		return nil
	}
	if err := victim.run(ctx); err != nil {
		return res, err
	}
	if err := victim.finish(ctx); err != nil {
		return res, err
	}
	_ = job.Stop(ctx) // its GPUs go back before it waits for the other gang
	var hd highDone
	select {
	case hd = <-high:
	case <-ctx.Done():
		return res, ctx.Err()
	}
	if hd.err != nil {
		return res, hd.err
	}
	live.done()
	res.HighPrioWaitS, res.High = hd.wait, hd.res
	res.Victim = victim.res
	res.VictimCheckpointed, res.VictimStepsLost, res.VictimShrunkTo, res.VictimResumed = victim.checkpointed, victim.res.StepsLost, victim.shrunkTo, victim.resumed
	res.Notice = victim.notice
	if victim.costs != nil {
		k := victim.costs
		res.CostS = Costs{WorkLost: k.WorkLost, Checkpoint: k.Checkpoint, Restore: k.Restore, CUDAContext: k.CUDAContext, Communicator: k.Communicator, GPUSeconds: k.GPUSeconds}
	}
	res.VictimFinalLoss, res.VictimAccuracy = victim.res.FinalLoss, victim.res.Accuracy
	res.HighFinalLoss, res.HighAccuracy = hd.res.FinalLoss, hd.res.Accuracy
	res.WallSeconds = time.Since(start).Seconds()
	return res, nil
}

// RunElastic runs the elastic scenario.
func RunElastic(ctx context.Context, o ScenarioOptions) (ElasticResult, error) {
	start := time.Now()
	res := ElasticResult{Scenario: "elastic"}
	c, sets, gpus, live, err := openScenario(ctx, &o, "elastic")
	if err != nil {
		return res, err
	}
	defer func() { _ = c.Shutdown(context.WithoutCancel(ctx)) }()
	res.Embedded, res.GPUs = c.Embedded(), gpus
	min := 8
	// A blocker holds all but min GPUs: the elastic gang starts at its minimum.
	blockJob, blocker, err := spawn(ctx, c, "digits-blocker", sdk.GangSpec{Name: "dp", Kind: "digits-worker", Args: o.args(sets), Workers: gpus - min,
		GPUsPerWorker: 1, NotPreemptible: true, MaxRestarts: 3, Backoff: 20 * time.Millisecond})
	if err != nil {
		return res, fmt.Errorf("digits: the blocking gang: %w", err)
	}
	defer func() { _ = blockJob.Stop(context.WithoutCancel(ctx)) }()
	job, g, err := spawn(ctx, c, "digits-elastic", sdk.GangSpec{Name: "dp", Kind: "digits-worker", Args: o.args(sets), Workers: gpus, MinWorkers: min,
		GPUsPerWorker: 1, CheckpointOnNotice: true, MaxRestarts: 3, Backoff: 20 * time.Millisecond, AllReduceBytes: int64(4 * NumParams(o.Hidden))})
	if err != nil {
		return res, fmt.Errorf("digits: the elastic gang: %w", err)
	}
	defer func() { _ = job.Stop(context.WithoutCancel(ctx)) }()
	res.MinWorkers, res.MaxWorkers = min, gpus
	live.note(fmt.Sprintf("elastic gang (%d..%d workers) starts with %d: another gang holds %d GPUs", min, gpus, g.Size(), blocker.Size()))
	t := &trainer{c: c, g: g, o: o.Options, steps: int64(o.Steps), live: live, name: "elastic"}
	var high <-chan highDone
	freedAt, arrived := int64(-1), false
	t.onStep = func(step int64) error {
		t.progress(step)
		switch {
		case freedAt < 0 && step == int64(o.ArriveAt)/2:
			live.note(fmt.Sprintf("the other gang finishes at step %d: its %d GPUs free", step, blocker.Size()))
			freedAt = step
			return blockJob.Stop(ctx)
		case !arrived && freedAt >= 0 && g.Size() > min && step >= freedAt+int64(o.ArriveAt)/2:
			arrived = true
			live.note(fmt.Sprintf("a high-priority gang of 8 GPUs arrives at step %d", step))
			high = arriveHigh(ctx, c, o, sets, live)
		}
		return nil
	}
	if err := t.run(ctx); err != nil {
		return res, err
	}
	if err := t.finish(ctx); err != nil {
		return res, err
	}
	if arrived {
		var hd highDone
		select {
		case hd = <-high:
		case <-ctx.Done():
			return res, ctx.Err()
		}
		if hd.err != nil {
			return res, hd.err
		}
	}
	live.done()
	res.Elastic = t.res
	res.Resizes, res.Restarts, res.Sizes, res.Steps, res.StepsLost = t.res.Resizes, t.res.Restarts, t.sizes, t.step, t.res.StepsLost
	res.FinalLoss, res.TestLoss, res.Accuracy = t.res.FinalLoss, t.res.TestLoss, t.res.Accuracy
	res.WallSeconds = time.Since(start).Seconds()
	return res, nil
}

func (o ScenarioOptions) check() error {
	switch {
	case o.Steps <= 0 || o.Batch <= 0 || o.Hidden <= 0 || o.CheckpointEvery <= 0:
		return fmt.Errorf("digits: steps %d, batch %d, hidden %d, checkpoint every %d: all must be positive", o.Steps, o.Batch, o.Hidden, o.CheckpointEvery)
	case o.ArriveAt <= 0 || o.ArriveAt >= o.Steps:
		return fmt.Errorf("digits: the high-priority gang arrives at step %d: want 1..%d (before the run ends)", o.ArriveAt, o.Steps-1)
	case o.HighSteps <= 0:
		return errors.New("digits: the high-priority gang's steps must be positive")
	}
	return nil
}

func progressOf(o Options) io.Writer {
	if o.Progress == nil {
		return io.Discard
	}
	return o.Progress
}
