package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	benchstore "github.com/atoll-run/atoll/internal/bench/store"
)

// newBenchStoreCmd is `atoll bench store`: the object store and transfer plane
// against memcpy, plain reads and bare loopback TCP, measured in the same run.
func newBenchStoreCmd() *cobra.Command {
	cfg := benchstore.DefaultConfig()
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "store",
		Short: "Benchmark object store puts/gets and a two-process pull against memcpy and bare TCP",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			exe, err := os.Executable()
			if err != nil {
				return err
			}
			cfg.ServeCmd = []string{exe, "store-serve"}
			res, err := benchstore.Run(cmd.Context(), cfg, zap.NewNop())
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				return json.NewEncoder(out).Encode(res)
			}
			fmt.Fprintf(out, "memcpy            %8.2f GB/s\n", res.MemcpyGBps)
			fmt.Fprintf(out, "put               %8.2f GB/s  (%.2f x memcpy, target >= 0.7)\n", res.PutGBps, res.PutMemcpyRatio)
			fmt.Fprintf(out, "cold memcpy       %8.2f GB/s  (into never-touched memory)\n", res.MemcpyColdGBps)
			fmt.Fprintf(out, "cold put          %8.2f GB/s  (%.2f x cold memcpy; first put into a fresh store)\n", res.PutColdGBps, res.PutColdRatio)
			fmt.Fprintf(out, "get+read ratio    %8.2f       (plain read time / store get-and-read time, median of %d pairs per size, target >= 0.9)\n", res.GetReadRatio, res.GetReadPairs)
			fmt.Fprintf(out, "pull              %8.2f GB/s  (%d bytes, two processes, loopback, median of %d; best %.2f)\n", res.PullGBps, res.PullBytes, res.PullRuns, res.PullBestGBps)
			fmt.Fprintf(out, "first pull        %8.2f GB/s  (the serving side hashes every chunk; later pulls reuse its fingerprints)\n", res.PullFirstGBps)
			fmt.Fprintf(out, "bare tcp          %8.2f GB/s  (median; best %.2f)\n", res.TCPGBps, res.TCPBestGBps)
			fmt.Fprintf(out, "pull ratio        %8.2f       (median of pairs [q1 %.2f, q3 %.2f], target >= 0.8)\n", res.PullRatio, res.PullRatioLo, res.PullRatioHi)
			fmt.Fprintf(out, "receiver cpu      %8.3f s/GB pull, %.3f s/GB bare tcp\n", res.PullCPUPerGB, res.TCPCPUPerGB)
			fmt.Fprintf(out, "4 KiB pull        %8.0f us    pooled connections, median of %d (%.0f pulls/s)\n", res.SmallPullPooledUS, res.SmallPulls, res.SmallPullsPooledPS)
			fmt.Fprintf(out, "4 KiB pull, dial  %8.0f us    a new connection per pull (%.0f pulls/s); pooling is %.1fx faster\n", res.SmallPullDialUS, res.SmallPullsDialPS, res.SmallPullSpeedup)
			if res.TLS {
				fmt.Fprintf(out, "pull, mutual TLS  %8.2f GB/s  (plain %.2f GB/s in the same pairs; tls/plain %.2f [q1 %.2f, q3 %.2f]; receiver cpu %.3f s/GB)\n",
					res.PullTLSGBps, res.PullPlainGBps, res.TLSRatio, res.TLSRatioLo, res.TLSRatioHi, res.PullTLSCPUPerGB)
				fmt.Fprintf(out, "4 KiB pull, TLS   %8.0f us    pooled; %.0f us dialing (and handshaking) every pull\n", res.SmallPullTLSPooledUS, res.SmallPullTLSDialUS)
			}
			if res.CkptRuns > 0 {
				fmt.Fprintf(out, "checkpoint commit %8.3f s     one durable copy of %d bytes in %d parts (persisted, fsync'd: %.2f GB/s), median of %d\n",
					res.CkptCommit1S, res.CkptBytes, res.CkptParts, res.CkptPersistGBps, res.CkptRuns)
				fmt.Fprintf(out, "  two copies      %8.3f s     the second pulled by another process over loopback and persisted there\n", res.CkptCommit2S)
				fmt.Fprintf(out, "  second copy     %8.3f s     added (median of pairs); sending the parts once takes %.3f s: %.2fx (target < 1)\n",
					res.CkptSecondCopyS, res.CkptSendS, res.CkptSecondCopyVsSend)
			}
			fmt.Fprintf(out, "1 KiB puts        %8.0f /s    (target >= 50000)\n", res.SmallPutsPerS)
			fmt.Fprintf(out, "1 KiB gets        %8.0f /s\n", res.SmallGetsPerS)
			for _, s := range res.Sizes {
				fmt.Fprintf(out, "  %10d B  memcpy %6.2f GB/s  put %6.2f GB/s  cold memcpy %6.2f  cold put %6.2f  read plain %.4fs  get+read %.4fs (x%d)  ratio %.3f [%.3f, %.3f]\n",
					s.Size, s.MemcpyGBps, s.PutGBps, s.MemcpyColdGBps, s.PutColdGBps, s.PlainReadS, s.GetReadS, s.ReadsPerSample, s.GetReadRatio, s.GetReadRatioLo, s.GetReadRatioHi)
			}
			fmt.Fprintf(out, "rdma: %d devices, backend %s (%s)\n", len(res.RDMA.Devices), res.RDMA.Backend, res.RDMA.Note)
			return nil
		},
	}
	f := cmd.Flags()
	f.BoolVar(&asJSON, "json", false, "print one JSON object")
	f.Int64Var(&cfg.MinSize, "min-size", cfg.MinSize, "smallest object size in bytes (sizes grow by 4x)")
	f.Int64Var(&cfg.MaxSize, "max-size", cfg.MaxSize, "largest object size in bytes")
	f.Int64Var(&cfg.BytesPerSize, "bytes-per-size", cfg.BytesPerSize, "bytes moved per size and measurement")
	f.Int64Var(&cfg.PullSize, "pull-size", 0, "bytes pulled between processes (default max-size)")
	f.IntVar(&cfg.Rounds, "rounds", cfg.Rounds, "rounds per size, methods interleaved; the best of each counts")
	f.IntVar(&cfg.ReadPairs, "read-pairs", cfg.ReadPairs, "back-to-back plain/get read pairs per size; the median pair ratio counts")
	f.IntVar(&cfg.PullRuns, "pull-runs", cfg.PullRuns, "back-to-back tcp/pull pairs; the median pair ratio counts")
	f.IntVar(&cfg.Streams, "streams", 0, "puller connections (default: the transfer default)")
	f.IntVar(&cfg.Depth, "depth", 0, "chunk reads in flight per connection (default: the transfer default)")
	f.BoolVar(&cfg.Sendfile, "sendfile", false, "the serving process sends chunks with sendfile(2) instead of writev")
	f.BoolVar(&cfg.TLS, "tls", false, "also pull over mutual TLS (throwaway CA), paired with plain pulls")
	f.IntVar(&cfg.SmallPulls, "small-pulls", cfg.SmallPulls, "4 KiB pulls timed with pooled connections, and as many dialing every pull")
	f.IntVar(&cfg.SmallCount, "small-count", cfg.SmallCount, "number of 1 KiB objects")
	f.Int64Var(&cfg.CkptBytes, "ckpt-bytes", cfg.CkptBytes, "bytes of the checkpoint whose durable commit is timed with one copy and with two")
	f.IntVar(&cfg.CkptParts, "ckpt-parts", cfg.CkptParts, "parts of that checkpoint")
	f.IntVar(&cfg.CkptRuns, "ckpt-runs", cfg.CkptRuns, "pairs of a one-copy and a two-copy commit (0: skip the measurement)")
	return cmd
}

// newStoreServeCmd is the hidden serving side of the benchmark's pulls. Its
// configuration, the token among it, comes as one JSON line on stdin: a secret
// on the command line would show in ps.
func newStoreServeCmd() *cobra.Command {
	return &cobra.Command{
		Use:    "store-serve",
		Short:  "Serve objects from a fresh store until stdin closes (used by bench store; configured on stdin)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return benchstore.Serve(cmd.Context(), os.Stdin, cmd.OutOrStdout(), zap.NewNop())
		},
	}
}
