package main

import (
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/atoll-run/atoll/store/meta/metabench"
)

// newBenchMetaCmd is `atoll bench meta`: Atoll's Paxos metadata log against embedded etcd.
func newBenchMetaCmd() *cobra.Command {
	cfg := metabench.DefaultConfig()
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "meta",
		Short: "Metadata writes: 3 Atoll Paxos replicas vs a 3-member embedded etcd, with the fsync and RTT floor",
		RunE: func(cmd *cobra.Command, _ []string) error {
			logger, err := zap.NewDevelopment()
			if err != nil {
				return err
			}
			defer logger.Sync()
			cfg.Logger = logger.WithOptions(zap.IncreaseLevel(zap.InfoLevel))
			fmt.Fprintf(os.Stderr, "bench meta: dir=%s duration=%v clients=%d seq-writes=%d value=%dB (fsync on for both)\n",
				cfg.Dir, cfg.Duration, cfg.Clients, cfg.SeqWrites, cfg.ValueSize)
			res, err := metabench.Run(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(os.Stdout).Encode(res)
			}
			floor := res.Floor.FsyncUs + res.Floor.RTTUs
			fmt.Printf("floor: fsync %.0f us (p99 %.0f us), loopback rtt %.0f us (fsync+rtt %.0f us)\n", res.Floor.FsyncUs, res.Floor.FsyncP99Us, res.Floor.RTTUs, floor)
			fmt.Printf("%-10s %10s %10s %10s %12s\n", "system", "p50_us", "p99_us", "p999_us", "writes/s")
			for _, r := range []struct {
				name string
				s    metabench.Stats
			}{{"atoll", res.Atoll}, {"atoll_http", res.AtollHTTP}, {"etcd", res.Etcd}} {
				fmt.Printf("%-10s %10.0f %10.0f %10.0f %12.0f\n", r.name, r.s.P50us, r.s.P99us, r.s.P999us, r.s.WritesPerS)
			}
			fmt.Printf("atoll p50 / (fsync+rtt) = %.2f (target <= 2)\n", res.Atoll.P50us/floor)
			fmt.Printf("atoll p99 = %.0f us (target <= 1000)\n", res.Atoll.P99us)
			if res.Etcd.WritesPerS > 0 {
				fmt.Printf("atoll / etcd writes/s at %d clients = %.2f (target >= 2); over HTTP %.2f\n", cfg.Clients,
					res.Atoll.WritesPerS/res.Etcd.WritesPerS, res.AtollHTTP.WritesPerS/res.Etcd.WritesPerS)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.BoolVar(&asJSON, "json", false, "print one JSON object on stdout")
	f.DurationVar(&cfg.Duration, "duration", 10*time.Second, "length of the concurrent phase, per system")
	f.IntVar(&cfg.Clients, "clients", cfg.Clients, "concurrent writers")
	f.IntVar(&cfg.SeqWrites, "seq-writes", cfg.SeqWrites, "sequential writes timed for latency")
	f.IntVar(&cfg.ValueSize, "value-size", cfg.ValueSize, "value size in bytes")
	f.StringVar(&cfg.Dir, "dir", cfg.Dir, "directory for WALs, etcd data and the fsync probe (must be on the disk to measure)")
	return cmd
}
