package main

import (
	"os"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/atoll-run/atoll/internal/testtime"
	"github.com/atoll-run/atoll/sdk"
)

func TestMain(m *testing.M) {
	if sdk.InWorker() { // an agent started this test binary as a worker: serve it
		os.Exit(sdk.WorkerMain(kinds()...))
	}
	os.Exit(m.Run())
}

func TestParameterServerTrains(t *testing.T) {
	ctx, cancel := testtime.Context(t, 2*time.Minute)
	defer cancel()
	o := DefaultOptions()
	o.Rounds = 4
	o.Cluster = []sdk.Option{sdk.WithLogger(zaptest.NewLogger(t))}
	res, err := Run(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if res.Updates != int64(o.Workers*o.Rounds*o.StepsPerRound) {
		t.Errorf("%d updates, want one per worker step: %d", res.Updates, o.Workers*o.Rounds*o.StepsPerRound)
	}
	if !(res.FinalLoss < res.InitialLoss/3) || res.Accuracy < 0.85 {
		t.Errorf("test loss %.3f -> %.3f, accuracy %.3f: the model did not learn", res.InitialLoss, res.FinalLoss, res.Accuracy)
	}
	if len(res.Machines) != o.Workers {
		t.Errorf("spread workers on machines %v, want %d machines", res.Machines, o.Workers)
	}
}
