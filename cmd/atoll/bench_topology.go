package main

import (
	"encoding/json"
	"fmt"
	"runtime"
	"time"

	"github.com/spf13/cobra"

	"github.com/atoll-run/atoll/topology"
)

// benchTopologyResult is what `atoll bench topology --json` prints.
type benchTopologyResult struct {
	Spec              string  `json:"spec"`
	GPUs              int     `json:"gpus"`
	BuildMs           float64 `json:"buildMs"`
	HeapMiB           float64 `json:"heapMiB"`
	LinkNsBaseline    float64 `json:"linkNsBaseline"`
	LinkNs            float64 `json:"linkNs"`
	LinkRatio         float64 `json:"linkRatio"`
	AllReduceGang     int     `json:"allreduceGang"`
	AllReduceUsBase   float64 `json:"allreduceUsBaseline"`
	AllReduceUs       float64 `json:"allreduceUs"`
	AllReducePerSec   float64 `json:"allreducePerSec"`
	TargetPerSec      float64 `json:"targetPerSec"`
	MeetsTarget       bool    `json:"meetsTarget"`
	IslandsComputed   int     `json:"islands"`
	BaselineSpec      string  `json:"baselineSpec"`
	BaselineGPUs      int     `json:"baselineGpus"`
	MeasuredIterLink  int     `json:"linkCalls"`
	MeasuredIterAllRd int     `json:"allreduceCalls"`
}

func newBenchTopologyCmd() *cobra.Command {
	var (
		spec   string
		gang   int
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "topology",
		Short: "Cost of Link and AllReduce estimates on a large cluster, against an 8-GPU cluster measured in the same run",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			const baseSpec = "dgx-h100"
			base, err := topology.Load(baseSpec)
			if err != nil {
				return err
			}
			var before runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			start := time.Now()
			big, err := topology.Load(spec)
			if err != nil {
				return err
			}
			buildMs := float64(time.Since(start).Microseconds()) / 1000
			var after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&after)
			if gang < 2 || gang > big.NumGPUs() {
				return fmt.Errorf("bench topology: --gang %d: want 2..%d (the GPUs of %s)", gang, big.NumGPUs(), spec)
			}
			const linkCalls = 2_000_000
			linkNs := func(c *topology.Cluster) float64 {
				n := c.NumGPUs()
				var sink float64
				t := time.Now()
				for i := 0; i < linkCalls; i++ {
					sink += c.Link((i*7919)%n, (i*104729+13)%n).GBps
				}
				_ = sink
				return float64(time.Since(t).Nanoseconds()) / linkCalls
			}
			const arCalls = 2000
			arUs := func(c *topology.Cluster, g int) float64 {
				// A gang spread over machines in the middle of the cluster.
				first := (c.NumGPUs() - g) / 2
				ids := make([]int, g)
				for i := range ids {
					ids[i] = first + i
				}
				t := time.Now()
				for i := 0; i < arCalls; i++ {
					_ = c.AllReduceTime(ids, 1<<30, topology.Best)
				}
				return float64(time.Since(t).Microseconds()) / arCalls
			}
			r := benchTopologyResult{
				Spec: spec, GPUs: big.NumGPUs(), BuildMs: buildMs,
				HeapMiB:         float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / (1 << 20),
				LinkNsBaseline:  linkNs(base),
				LinkNs:          linkNs(big),
				AllReduceGang:   gang,
				AllReduceUsBase: arUs(base, 8),
				AllReduceUs:     arUs(big, gang),
				TargetPerSec:    1000,
				IslandsComputed: len(big.Islands()),
				BaselineSpec:    baseSpec, BaselineGPUs: base.NumGPUs(),
				MeasuredIterLink: linkCalls, MeasuredIterAllRd: arCalls,
			}
			r.LinkRatio = r.LinkNs / r.LinkNsBaseline
			r.AllReducePerSec = 1e6 / r.AllReduceUs
			r.MeetsTarget = r.AllReducePerSec >= r.TargetPerSec
			out := cmd.OutOrStdout()
			if asJSON {
				return json.NewEncoder(out).Encode(r)
			}
			fmt.Fprintf(out, "cluster %s: %d GPUs, %d islands, built in %.1f ms, ~%.1f MiB heap\n", r.Spec, r.GPUs, r.IslandsComputed, r.BuildMs, r.HeapMiB)
			fmt.Fprintf(out, "Link:      %.0f ns/call on %d GPUs vs %.0f ns/call on %s (%d GPUs): ratio %.2fx (O(1): no pairwise tables)\n",
				r.LinkNs, r.GPUs, r.LinkNsBaseline, baseSpec, r.BaselineGPUs, r.LinkRatio)
			fmt.Fprintf(out, "AllReduce: %.1f us/call for a %d-GPU gang (Best of 4 algorithms) vs %.1f us for 8 GPUs: %.0f calls/s (target >= %.0f/s: %v)\n",
				r.AllReduceUs, gang, r.AllReduceUsBase, r.AllReducePerSec, r.TargetPerSec, r.MeetsTarget)
			return nil
		},
	}
	cmd.Flags().StringVar(&spec, "spec", "10000xdgx-h100/32", "cluster to measure (80,000 GPUs by default)")
	cmd.Flags().IntVar(&gang, "gang", 256, "GPUs in the AllReduce gang")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object")
	return cmd
}
