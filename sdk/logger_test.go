package sdk_test

import (
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/atoll-run/atoll/sdk"
)

// logStep asks a logging actor to log a step.
type logStep struct{ Step int64 }

// logging logs each step it is asked for.
type logging struct{}

func (logging) Receive(c *sdk.Context, msg any) (any, error) {
	c.Logger().Info("stepped", zap.Int64("step", msg.(logStep).Step))
	return true, nil
}

// TestWorkerLoggerNamesTheWorker checks that a gang worker's Context.Logger names its job,
// gang, rank and generation once in every line, in the embedded default where every
// worker shares the driver's logger (a worker process's logger names its one worker).
func TestWorkerLoggerNamesTheWorker(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	c := newCluster(t, sdk.WithLogger(zap.New(core)))
	ctx := testContext(t)
	job, err := c.Submit(ctx, sdk.JobSpec{Name: "logjob"})
	if err != nil {
		t.Fatal(err)
	}
	g, err := job.SpawnGang(ctx, sdk.GangSpec{Name: "g", Kind: "logging", Workers: 2, MaxRestarts: 1})
	if err != nil {
		t.Fatal(err)
	}
	for rank := range 2 {
		if _, err := sdk.Call[bool](ctx, c, g.Worker(rank), logStep{Step: int64(10 + rank)}); err != nil {
			t.Fatal(err)
		}
	}
	lines := logs.FilterMessage("stepped").All()
	if len(lines) != 2 {
		t.Fatalf("%d lines logged by the workers, want 2: %v", len(lines), lines)
	}
	for _, l := range lines {
		seen := map[string]int{}
		for _, f := range l.Context {
			seen[f.Key]++
		}
		m := l.ContextMap()
		rank, _ := m["rank"].(int64)
		if m["job"] != "logjob" || m["gang"] != "g" || m["generation"] != int64(0) || m["step"] != 10+rank {
			t.Errorf("a worker's line: %v", m)
		}
		for _, k := range []string{"job", "gang", "rank", "generation"} {
			if seen[k] != 1 {
				t.Errorf("a worker's line names %s %d times: %v", k, seen[k], l.Context)
			}
		}
	}
}
