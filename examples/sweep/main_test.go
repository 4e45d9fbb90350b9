package main

import (
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/atoll-run/atoll/internal/testtime"
	"github.com/atoll-run/atoll/sdk"
)

func TestMain(m *testing.M) {
	if sdk.InWorker() { // an agent started this test binary as a worker: serve it
		os.Exit(sdk.WorkerMain(sdk.Tasks(train)))
	}
	os.Exit(m.Run())
}

func TestSweepOnTasks(t *testing.T) {
	ctx, cancel := testtime.Context(t, 2*time.Minute)
	defer cancel()
	o := DefaultOptions()
	o.Cluster = []sdk.Option{sdk.WithLogger(zaptest.NewLogger(t))}
	res, err := Run(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Done) != 12 || res.Cancelled != 0 {
		t.Fatalf("%d trials done, %d cancelled; want all 12 done", len(res.Done), res.Cancelled)
	}
	if res.BestScore.Accuracy < 0.9 {
		t.Errorf("best trial (lr %g, hidden %d) reached %.3f", res.Best.LR, res.Best.Hidden, res.BestScore.Accuracy)
	}
	cards := map[string]bool{}
	for _, s := range res.Scores {
		if s.Milli != 250 || len(s.GPU) != 1 {
			t.Fatalf("a trial ran on %+v, want a quarter of one GPU", s)
		}
		cards[fmt.Sprint(s.Machine, s.GPU)] = true
	}
	if len(cards) > 12 {
		t.Fatalf("12 quarter-GPU trials used %d cards", len(cards))
	}
	// Seeded trials give the same scores again.
	again, err := Run(ctx, Options{LRs: []float32{res.Best.LR}, Hiddens: []int{res.Best.Hidden}, Steps: o.Steps,
		Cluster: o.Cluster})
	if err != nil {
		t.Fatal(err)
	}
	if again.BestScore.Accuracy != res.BestScore.Accuracy || again.BestScore.Loss != res.BestScore.Loss {
		t.Fatalf("the best trial again: %+v, first %+v", again.BestScore, res.BestScore)
	}
}

func TestSweepStopsAtItsTarget(t *testing.T) {
	ctx, cancel := testtime.Context(t, 2*time.Minute)
	defer cancel()
	o := DefaultOptions()
	o.Steps, o.Target = 3000, 0.5 // the first trial to finish reaches it; slower ones are cancelled
	o.LRs = append(o.LRs, 0.001, 0.002, 0.003, 0.004)
	o.Cluster = []sdk.Option{sdk.WithLogger(zaptest.NewLogger(t))}
	res, err := Run(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if res.BestScore.Accuracy < o.Target || len(res.Done)+res.Cancelled != 24 {
		t.Fatalf("best %.3f, %d done + %d cancelled of 24", res.BestScore.Accuracy, len(res.Done), res.Cancelled)
	}
	t.Logf("%d trials done, %d cancelled once one reached %.2f", len(res.Done), res.Cancelled, o.Target)
}
