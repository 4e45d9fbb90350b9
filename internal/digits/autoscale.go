package digits

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/atoll-run/atoll/sdk"
	"github.com/atoll-run/atoll/sdk/local"
)

// The autoscale scenario of `atoll demo --scenario autoscale`: a gang of 16 workers arrives
// on pools with no machines; the autoscaler adds two (spot, for a gang that checkpoints);
// the gang trains; a spot interruption is injected mid-run: the gang gets a drain notice,
// checkpoints just in time, stops and is placed again on a replacement machine, resuming
// from that checkpoint; it finishes, and the pools remove the idle machines.

// AutoscaleHooks are what the scenario needs beyond the SDK (the CLI gives them).
type AutoscaleHooks struct {
	// Interrupt injects a spot interruption notice for a machine, due after the delay.
	Interrupt func(ctx context.Context, machine string, after time.Duration) error
	// InterruptAfter is the notice's lead time (default 60 s).
	InterruptAfter time.Duration
	// IdleWait bounds the wait, after training, for the pools to remove their machines
	// (default 2 minutes).
	IdleWait time.Duration
}

// AutoscaleResult is `atoll demo --scenario autoscale --json`.
type AutoscaleResult struct {
	Scenario string `json:"scenario"`
	// ScaleUpS is from the gang's submission to every worker ready, machines launched.
	ScaleUpS        float64 `json:"scale_up_s"`
	MachinesAdded   int     `json:"machines_added"`
	MachinesRemoved int     `json:"machines_removed"`
	Interruptions   int     `json:"interruptions"`
	StepsLost       int64   `json:"steps_lost"`
	FinalLoss       float64 `json:"final_loss"`
	TestLoss        float64 `json:"test_loss"`
	Accuracy        float64 `json:"accuracy"`
	Workers         int     `json:"workers"`
	// InterruptedMachine is the machine the notice was for; Checkpointed says the gang's
	// just-in-time checkpoint was committed before its deadline; ResumedOn where it
	// trained after.
	InterruptedMachine string   `json:"interrupted_machine"`
	Checkpointed       bool     `json:"checkpointed"`
	ResumedOn          []string `json:"resumed_on"`
	// MachinesLeft is how many pool machines remained when the scenario ended (0 when the
	// idle machines were removed within IdleWait).
	MachinesLeft int      `json:"machines_left"`
	CostUSD      float64  `json:"cost_usd"`
	Events       []string `json:"events"`
	WallSeconds  float64  `json:"wall_s"`
}

// RunAutoscale runs the autoscale scenario on a cluster whose heads run pools (atoll up
// --pools FILE) with no machines up.
func RunAutoscale(ctx context.Context, o ScenarioOptions, h AutoscaleHooks) (AutoscaleResult, error) {
	start := time.Now()
	res := AutoscaleResult{Scenario: "autoscale"}
	o.KillAtStep = -1
	if err := o.check(); err != nil {
		return res, err
	}
	if h.Interrupt == nil {
		return res, errors.New("digits: the autoscale scenario needs a way to inject an interruption (a cluster with pools)")
	}
	if h.InterruptAfter <= 0 {
		h.InterruptAfter = time.Minute
	}
	if h.IdleWait <= 0 {
		h.IdleWait = 2 * time.Minute
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	live := newProgressLine(progressOf(o.Options), o.Steps)
	c, err := local.Start(ctx, append(append([]sdk.Option{sdk.WithLogger(o.Logger)}, Kinds()...), o.ClusterOptions...)...)
	if err != nil {
		return res, err
	}
	defer func() { _ = c.Shutdown(context.WithoutCancel(ctx)) }()
	if c.Embedded() {
		return res, errors.New("digits: the autoscale scenario runs on a cluster with pools (atoll up --pools FILE), not the embedded default")
	}
	st, err := c.Status(ctx)
	if err != nil {
		return res, err
	}
	if st.Pools == nil || len(st.Pools.Pools) == 0 {
		return res, errors.New("digits: the cluster runs no pools: start it with atoll up --pools FILE")
	}
	train, test, err := Load(o.Seed, 0.2)
	if err != nil {
		return res, err
	}
	sets, err := sdk.Put(ctx, c, [2]Dataset{train, test})
	if err != nil {
		return res, err
	}
	const workers = 16
	live.note(fmt.Sprintf("a gang of %d workers arrives; the pools have %d machines", workers, poolMachines(st)))
	submitted := time.Now()
	job, g, err := spawn(ctx, c, "digits-autoscale", sdk.GangSpec{Name: "dp", Kind: "digits-worker", Args: o.args(sets), Workers: workers, GPUsPerWorker: 1,
		CheckpointOnNotice: true, MaxRestarts: 3, Backoff: 20 * time.Millisecond, AllReduceBytes: int64(4 * NumParams(o.Hidden))})
	if err != nil {
		return res, fmt.Errorf("digits: the gang: %w", err)
	}
	defer func() { _ = job.Stop(context.WithoutCancel(ctx)) }()
	res.ScaleUpS = time.Since(submitted).Seconds()
	live.note(fmt.Sprintf("machines added and the gang running %.1f s after it arrived, on %v", res.ScaleUpS, g.Placement().Machines))
	t := &trainer{c: c, g: g, o: o.Options, steps: int64(o.Steps), live: live, name: "autoscale"}
	interrupted := false
	t.onStep = func(step int64) error {
		t.progress(step)
		if !interrupted && step == int64(o.ArriveAt) {
			interrupted = true
			res.InterruptedMachine = g.Placement().Machines[0]
			live.note(fmt.Sprintf("spot interruption injected: %s goes in %s", res.InterruptedMachine, h.InterruptAfter))
			return h.Interrupt(ctx, res.InterruptedMachine, h.InterruptAfter)
		}
		return nil
	}
	if err := t.run(ctx); err != nil {
		return res, err
	}
	if err := t.finish(ctx); err != nil {
		return res, err
	}
	live.done()
	res.StepsLost, res.Checkpointed, res.Workers = t.res.StepsLost, t.checkpointed, t.res.Workers
	res.FinalLoss, res.TestLoss, res.Accuracy = t.res.FinalLoss, t.res.TestLoss, t.res.Accuracy
	res.ResumedOn = t.res.Machines
	// Its work done, the gang's checkpoints go: their durable copies would otherwise keep
	// the machines that hold them (the pools remove no machine with the last copy of an
	// object).
	if err := g.DropCheckpoints(ctx); err != nil {
		live.note(fmt.Sprintf("autoscale: its checkpoints were not all dropped: %v", err))
	}
	_ = job.Stop(ctx)
	// The machines idle out and are removed.
	deadline := time.Now().Add(h.IdleWait)
	for {
		if st, err = c.Status(ctx); err != nil {
			return res, err
		}
		if res.MachinesLeft = poolMachines(st); res.MachinesLeft == 0 || time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
	for _, p := range st.Pools.Pools {
		res.CostUSD += p.CostUSD
	}
	for _, e := range st.Pools.Events {
		switch e.Kind {
		case "launch":
			res.MachinesAdded++
		case "remove":
			res.MachinesRemoved++
		case "notice":
			res.Interruptions++
		}
		res.Events = append(res.Events, fmt.Sprintf("%s %s %s: %s", e.Kind, e.Pool, e.Machine, e.Reason))
	}
	res.WallSeconds = time.Since(start).Seconds()
	return res, nil
}

func poolMachines(st sdk.Status) int {
	n := 0
	if st.Pools != nil {
		for _, p := range st.Pools.Pools {
			n += len(p.Machines)
		}
	}
	return n
}
