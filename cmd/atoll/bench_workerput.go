package main

import (
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"time"

	"github.com/spf13/cobra"

	"github.com/atoll-run/atoll/sdk"
)

// putReq asks a bench-put worker to time, Iters times each (after one warm-up), a copy of
// Bytes bytes into memory it already touched (memcpy), the same copy into memory fresh
// from the OS (cold memcpy), and sdk.Put of the bytes from the worker process, freeing
// each object after.
type putReq struct{ Bytes, Iters int }

type putTimes struct {
	Memcpy, ColdMemcpy, Put []float64
}

type putWorker struct{}

func (putWorker) Receive(c *sdk.Context, msg any) (any, error) {
	r := msg.(putReq)
	src := make([]byte, r.Bytes)
	for i := range src {
		src[i] = byte(i * 7)
	}
	dst := make([]byte, r.Bytes)
	copy(dst, src)
	var out putTimes
	for k := -1; k < r.Iters; k++ {
		// Memory it never touched first; then its 256 MiB collected (untimed), so that
		// the garbage collector's and the kernel's work on it runs in neither of the
		// two figures compared, which follow each other in the same state.
		t := time.Now()
		cold := make([]byte, r.Bytes)
		copy(cold, src)
		coldS := time.Since(t).Seconds()
		cold = nil
		runtime.GC()
		t = time.Now()
		copy(dst, src)
		memcpy := time.Since(t).Seconds()
		t = time.Now()
		ref, err := sdk.Put(c, c, src)
		if err != nil {
			return nil, err
		}
		putS := time.Since(t).Seconds()
		if err := sdk.Free(c, c, ref); err != nil {
			return nil, err
		}
		if k >= 0 {
			out.Memcpy = append(out.Memcpy, memcpy)
			out.ColdMemcpy = append(out.ColdMemcpy, coldS)
			out.Put = append(out.Put, putS)
		}
	}
	return out, nil
}

// newBenchWorkerPutCmd measures a worker process's put of a large object against memcpy
// in that process, in the same run (issue 27's "a worker's put of 256 MiB: >= 0.8x
// memcpy"): through the SDK on a cluster of processes, as a training program's checkpoint
// writes its state.
func newBenchWorkerPutCmd() *cobra.Command {
	var dir string
	var iters int
	var mib float64
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "workerput",
		Short: "A worker process's sdk.Put of a large object vs memcpy in that process, in one run",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if sdk.InWorker() { // an agent started this binary as a benchmark worker: serve it
				os.Exit(benchWorkerMain())
			}
			if iters < 1 || iters > 1000 || !(mib > 0 && mib <= 4096) {
				return fmt.Errorf("bench workerput: --iters %d (1..1000), --mib %v (0..4096]", iters, mib)
			}
			ctx := cmd.Context()
			c, _, cleanup, err := benchCluster(ctx, dir, 1, "dgx-h100", false)
			if err != nil {
				return err
			}
			defer cleanup()
			job, err := c.Submit(ctx, sdk.JobSpec{Name: "bench-workerput"})
			if err != nil {
				return err
			}
			defer job.Stop(ctx)
			g, err := job.SpawnGang(ctx, sdk.GangSpec{Name: "put", Kind: "bench-put", Workers: 1, GPUsPerWorker: 1})
			if err != nil {
				return err
			}
			bytes := int(mib * (1 << 20))
			ts, err := sdk.Call[putTimes](ctx, c, g.Worker(0), putReq{Bytes: bytes, Iters: iters})
			if err != nil {
				return fmt.Errorf("bench workerput: %w", err)
			}
			memcpy, cold, put := percentile(ts.Memcpy, 0.5), percentile(ts.ColdMemcpy, 0.5), percentile(ts.Put, 0.5)
			gbps := func(s float64) float64 { return float64(bytes) / s / 1e9 }
			out := map[string]any{"bytes": bytes, "iters": iters,
				"memcpy_gbps": gbps(memcpy), "cold_memcpy_gbps": gbps(cold), "put_gbps": gbps(put),
				"ratio": memcpy / put, "cold_ratio": cold / put, "target_ratio": 0.8,
				"memcpy_samples_s": ts.Memcpy, "cold_memcpy_samples_s": ts.ColdMemcpy, "put_samples_s": ts.Put}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(out)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "a worker process's put of %.0f MiB: %.2f GB/s; memcpy %.2f GB/s (ratio %.2f, target >= 0.8); into fresh memory %.2f GB/s (ratio %.2f)\n",
				mib, gbps(put), gbps(memcpy), out["ratio"], gbps(cold), out["cold_ratio"])
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "dir", "", "a running cluster's directory `DIR` (default: a temporary cluster of one agent)")
	f.IntVar(&iters, "iters", 9, "measured puts (after one warm-up)")
	f.Float64Var(&mib, "mib", 256, "object size in MiB")
	f.BoolVar(&asJSON, "json", false, "print one JSON object")
	return cmd
}
