package main

import (
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/atoll-run/atoll/internal/testtime"
	"github.com/atoll-run/atoll/sdk"
	"github.com/atoll-run/atoll/sdk/sdktest"
)

func TestMain(m *testing.M) {
	if sdk.InWorker() { // an agent started this test binary as a worker: serve it
		os.Exit(sdk.WorkerMain(kinds()...))
	}
	os.Exit(sdktest.Run(m))
}

// reference is the final parameters' hash of a run without failure, on the embedded
// default: run once, for both tests.
func reference(t *testing.T) string {
	t.Helper()
	ref.once.Do(func() {
		ctx, cancel := testtime.Context(t, 2*time.Minute)
		defer cancel()
		o := DefaultOptions()
		o.KillAt = -1
		o.Cluster = []sdk.Option{sdk.WithLogger(zaptest.NewLogger(t))}
		res, err := Run(ctx, o)
		switch {
		case err != nil:
			ref.err = err
		case res.Restarts != 0 || res.RestoredStep != -1:
			ref.err = fmt.Errorf("a run without failure restarted %d times", res.Restarts)
		}
		ref.sha = res.FinalSHA256
	})
	if ref.err != nil {
		t.Fatalf("the reference run: %v", ref.err)
	}
	return ref.sha
}

var ref struct {
	once sync.Once
	sha  string
	err  error
}

func check(t *testing.T, res Result, want string) {
	t.Helper()
	if res.Restarts != 1 || res.RestoredStep != 30 || res.RanksVerified != 16 {
		t.Errorf("%d restarts, restored step %d verified on %d ranks; want 1 restart from step 30, 16 ranks verified",
			res.Restarts, res.RestoredStep, res.RanksVerified)
	}
	if len(res.Machines) != 2 {
		t.Errorf("gang on machines %v, want two", res.Machines)
	}
	if res.FinalSHA256 != want {
		t.Errorf("final parameters %s after the failure, %s without: the recovery was not exact", res.FinalSHA256, want)
	}
	if res.Accuracy < 0.8 {
		t.Errorf("accuracy %.3f", res.Accuracy)
	}
}

func TestExactRecoveryOnTheEmbeddedDefault(t *testing.T) {
	want := reference(t)
	ctx, cancel := testtime.Context(t, 2*time.Minute)
	defer cancel()
	o := DefaultOptions()
	o.Cluster = []sdk.Option{sdk.WithLogger(zaptest.NewLogger(t))}
	res, err := Run(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	check(t, res, want)
}

// TestExactRecoveryOnAClusterOfProcesses runs the same program, unchanged, on a cluster of
// processes (atoll up): 16 worker processes on two machines, one SIGKILLed by its agent.
func TestExactRecoveryOnAClusterOfProcesses(t *testing.T) {
	cl := sdktest.Up(t, 2, "")
	want := reference(t)
	ctx, cancel := testtime.Context(t, 2*time.Minute)
	defer cancel()
	o := DefaultOptions()
	o.Cluster = []sdk.Option{sdk.WithLogger(zaptest.NewLogger(t)), sdk.WithAddress(cl.Address)}
	res, err := Run(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	check(t, res, want)
	pids := map[int]bool{}
	for _, p := range res.WorkerPIDs {
		pids[p] = true
	}
	if len(pids) != 16 || pids[os.Getpid()] {
		t.Errorf("worker pids %v: want 16 worker processes", res.WorkerPIDs)
	}
}
