package main

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/atoll-run/atoll/sdk"
	"github.com/atoll-run/atoll/sdk/local"
)

func TestMain(m *testing.M) {
	if sdk.InWorker() {
		os.Exit(sdk.WorkerMain(kinds()...))
	}
	os.Exit(m.Run())
}

// The program runs on any cluster; the test gives it the embedded default (the binary
// itself links none).
func TestSquaresSumOnACluster(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sum, err := Run(ctx, 20, local.Default(), sdk.WithLogger(zaptest.NewLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	if want := 19 * 20 * 39 / 6; sum != want {
		t.Fatalf("sum %d, want %d", sum, want)
	}
}

// Without an address and without the embedded default, the program is told there is no
// cluster (and main says how to name one).
func TestNoClusterIsSaid(t *testing.T) {
	t.Setenv("ATOLL_ADDRESS", "")
	_, err := Run(context.Background(), 1)
	if !errors.Is(err, sdk.ErrNoCluster) {
		t.Fatalf("err %v, want sdk.ErrNoCluster", err)
	}
}
