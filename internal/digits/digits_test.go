package digits

import (
	"bytes"
	"compress/gzip"
	"context"
	"strings"
	"testing"

	"go.uber.org/zap/zaptest"
)

func TestTrainingSurvivesAWorkerCrash(t *testing.T) {
	o := DefaultOptions()
	o.Steps, o.CheckpointEvery, o.KillAtStep = 120, 10, 47
	o.Logger = zaptest.NewLogger(t)
	res, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if res.Restarts != 1 {
		t.Errorf("restarts = %d, want exactly 1 gang restart", res.Restarts)
	}
	if res.RestoredStep != 40 || res.StepsReplayed != 7 {
		t.Errorf("restored from step %d replaying %d; want the checkpoint at 40, replaying 7", res.RestoredStep, res.StepsReplayed)
	}
	if res.IslandsUsed != 1 || len(res.Islands) != 1 || len(res.Islands[0]) != 8 {
		t.Errorf("gang on islands %v; want one island of 8", res.Islands)
	}
	if res.GPUsTotal != 32 || res.GangSize != 8 || !res.SimulatedGPUs {
		t.Errorf("cluster %d GPUs (simulated %v), gang %d", res.GPUsTotal, res.SimulatedGPUs, res.GangSize)
	}
	if !(res.FinalLoss < res.InitialLoss/4) {
		t.Errorf("loss %.3f -> %.3f did not fall", res.InitialLoss, res.FinalLoss)
	}
	if res.Accuracy < 0.85 {
		t.Errorf("test accuracy %.3f < 0.85", res.Accuracy)
	}
}

func TestDeterministicWithoutCrash(t *testing.T) {
	o := DefaultOptions()
	o.Steps, o.KillAtStep = 30, -1
	a, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if a.FinalLoss != b.FinalLoss || a.Restarts != 0 {
		t.Fatalf("two seeded runs differ: %v vs %v (restarts %d)", a.FinalLoss, b.FinalLoss, a.Restarts)
	}
}

func TestLoadSplitsTheRealData(t *testing.T) {
	train, test, err := Load(1, 0.2)
	if err != nil {
		t.Fatal(err)
	}
	if train.Len()+test.Len() != 1797 || test.Len() != 359 {
		t.Fatalf("split %d + %d", train.Len(), test.Len())
	}
}

func TestParseRejectsBadRows(t *testing.T) {
	row := strings.Repeat("0,", Features)
	for _, tc := range []struct{ csv, want string }{
		{row + "3\n" + row + "11\n", "line 2: class \"11\""},
		{row + "3\n" + strings.Replace(row, "0", "17", 1) + "1\n", "line 2 column 1: \"17\""},
		{row + "3\n1,2\n", "wrong number of fields"},
	} {
		var b bytes.Buffer
		zw := gzip.NewWriter(&b)
		_, _ = zw.Write([]byte(tc.csv))
		_ = zw.Close()
		if _, err := parse(&b); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("parse: %v, want %q", err, tc.want)
		}
	}
}
