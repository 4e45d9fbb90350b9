// Command atoll-benchmeta is the metadata benchmark with its etcd baseline: `atoll bench
// meta` plus an embedded three-member etcd cluster measured on the same machine in the same
// run. It is its own binary so that the atoll binary links no etcd server.
//
//	go -C cmd/atoll-benchmeta run . --json [--tls] [--duration 10s] [--clients 64] [--dir DIR]
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/atoll-run/atoll/cmd/atoll-benchmeta/etcdbaseline"
	"github.com/atoll-run/atoll/internal/bench/metabench"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cmd := metabench.Command("atoll-benchmeta",
		"Metadata writes: 3 Atoll Paxos replicas vs a 3-member embedded etcd, with the fsync and RTT floor", etcdbaseline.Run, "etcd")
	cmd.SilenceUsage = true
	if err := cmd.ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "atoll-benchmeta:", err)
		os.Exit(1)
	}
}
