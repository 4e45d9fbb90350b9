package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/atoll-run/atoll/internal/codec"

	"github.com/atoll-run/atoll/runtime/coll"
	"github.com/atoll-run/atoll/sdk"
)

// The cluster benchmarks drive a cluster of processes (a temporary one from `atoll up`, or
// --dir's): this program is then the job's program, and its workers are this same binary
// started by the agents with the same arguments, so each command first calls sdk.Start
// with the benchmark kinds (in a worker, sdk.WorkerMain serves instead).

// arReq asks a benchmark worker to AllReduce Floats float32s Iters times (after one warm-up).
type arReq struct{ Floats, Iters int }

// noop answers every call; arWorker runs AllReduces and reports their times (seconds).
type (
	noop     struct{}
	arWorker struct{}
)

func (noop) Receive(*sdk.Context, any) (any, error) { return nil, nil }

func (arWorker) Receive(c *sdk.Context, msg any) (any, error) {
	r := msg.(arReq)
	v := make([]float32, r.Floats)
	for i := range v {
		v[i] = float32(c.Rank())
	}
	out := make([]float64, 0, r.Iters)
	for k := -1; k < r.Iters; k++ {
		start := time.Now()
		if err := c.AllReduce(c, v); err != nil {
			return nil, err
		}
		if k >= 0 {
			out = append(out, time.Since(start).Seconds())
		}
	}
	// Every round sums the previous sums, so v[0] is rank-sum * n^(rounds-1).
	n := float64(c.Size())
	want := n * (n - 1) / 2 * math.Pow(n, float64(r.Iters))
	if got := float64(v[len(v)-1]); math.Abs(got-want) > 1e-3*want+1e-6 {
		return nil, fmt.Errorf("allreduce result %v, want %v", got, want)
	}
	return out, nil
}

// trainReq asks a benchmark worker for Steps training steps: an AllReduce of Floats
// float32s (the gradients), then Compute of device time (a sleep: the host waits on its
// GPU, simulated here). The answer is the number of steps done.
type trainReq struct {
	Floats, Steps int
	Compute       time.Duration
}

// trainWorker runs the training steps of `atoll bench controlplane`'s load.
type trainWorker struct{}

func (trainWorker) Receive(c *sdk.Context, msg any) (any, error) {
	r := msg.(trainReq)
	v := make([]float32, r.Floats)
	for i := 0; i < r.Steps; i++ {
		if err := c.AllReduce(c, v); err != nil {
			return i, err
		}
		select {
		case <-c.Done():
			return i, c.Err()
		case <-time.After(r.Compute):
		}
	}
	return r.Steps, nil
}

func benchKinds() []sdk.Option {
	return []sdk.Option{
		sdk.Kind("bench-noop", func() sdk.Actor { return noop{} }, struct{}{}),
		sdk.Kind("bench-allreduce", func() sdk.Actor { return arWorker{} }, arReq{}),
		sdk.Kind("bench-train", func() sdk.Actor { return trainWorker{} }, trainReq{}),
		sdk.Kind("bench-coll", func() sdk.Actor { return collWorker{} }, collReq{}),
		sdk.Kind("bench-put", func() sdk.Actor { return putWorker{} }, putReq{}),
	}
}

// benchWorkerMain serves a benchmark worker (this binary started by an agent), its CPU
// profiled as envProfile says (named after its process id).
func benchWorkerMain() int {
	if err := envProfile(fmt.Sprintf("worker-%d", os.Getpid())); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	return sdk.WorkerMain(benchKinds()...)
}

// clusterAddr is the SDK address of a cluster file: its heads, token file and CA.
func clusterAddr(cf *clusterFile) string {
	addr := cf.Address + ";token-file=" + cf.TokenFile
	if cf.CACert != "" {
		addr += ";ca=" + cf.CACert
	}
	return addr
}

// benchCluster connects to --dir's cluster, or starts a temporary one of agents machines
// (with mutual TLS unless insecure; with the options given, if any).
func benchCluster(ctx context.Context, dir string, agents int, machine string, insecure bool, opts ...upOptions) (c *sdk.Cluster, cf *clusterFile, cleanup func(), err error) {
	cleanup = func() {}
	if dir == "" {
		tmp, err := os.MkdirTemp("", "atoll-bench-")
		if err != nil {
			return nil, nil, nil, err
		}
		dir = filepath.Join(tmp, "cluster")
		var o upOptions
		if len(opts) > 0 {
			o = opts[0]
		}
		cf, _, err = startCluster(ctx, dir, 3, agents, machine, !insecure, time.Minute, o)
		if err != nil {
			_ = os.RemoveAll(tmp)
			return nil, nil, nil, err
		}
		cleanup = func() { stopProcs(cf, 5*time.Second); _ = os.RemoveAll(tmp) }
	} else if cf, err = readClusterFile(dir); err != nil {
		return nil, nil, nil, err
	}
	// The benchmarks' workers let sums follow the placement (coll.AlgoEnv), as a program
	// that does not need the same bits on every placement would.
	// The profiling settings (envProfile) go to them too.
	env := []string{coll.AlgoEnv + "=auto"}
	for _, k := range []string{"ATOLL_CPUPROFILE_DIR", "ATOLL_CPUPROFILE_AFTER", "ATOLL_CPUPROFILE_FOR"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	c, err = sdk.Connect(ctx, clusterAddr(cf), append(benchKinds(), sdk.WithEnv(env...))...)
	if err != nil {
		cleanup()
		return nil, nil, nil, err
	}
	prev := cleanup
	return c, cf, func() { _ = c.Shutdown(context.Background()); prev() }, nil
}

// benchGang starts (or connects to) a benchmark's cluster, as benchCluster does, with the
// agents declaring a trusted fabric when trusted, and spawns one gang of ranks workers of
// kind (job and kind share the name) spread over every machine, its AllReduce bytes
// declared. cleanup stops the job and the cluster.
func benchGang(ctx context.Context, dir string, agents int, insecure, trusted bool, kind string, ranks int, bytes float64) (*sdk.Cluster, *sdk.Gang, func(), error) {
	c, _, cleanup, err := benchCluster(ctx, dir, agents, "dgx-h100", insecure, upOptions{agent: agentOptions{trustedFabric: trusted}})
	if err != nil {
		return nil, nil, nil, err
	}
	job, err := c.Submit(ctx, sdk.JobSpec{Name: kind})
	if err != nil {
		cleanup()
		return nil, nil, nil, err
	}
	stop := func() { _ = job.Stop(context.Background()); cleanup() }
	perWorker := max(1, 8*agents/ranks) // spread the ranks over every machine
	g, err := job.SpawnGang(ctx, sdk.GangSpec{Name: "g", Kind: kind, Workers: ranks, GPUsPerWorker: perWorker, AllReduceBytes: int64(bytes)})
	if err != nil {
		stop()
		return nil, nil, nil, err
	}
	return c, g, stop, nil
}

func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[int(p*float64(len(s)-1)+0.5)]
}

func newBenchGangStartCmd() *cobra.Command {
	var dir string
	var workers, agents, runs int
	var asJSON, insecure bool
	cmd := &cobra.Command{
		Use:   "gangstart",
		Short: "Gang start latency on a cluster of processes: submission to every worker ready (its binary cached)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if sdk.InWorker() { // an agent started this binary as a benchmark worker: serve it
				os.Exit(benchWorkerMain())
			}
			if workers < 1 || workers > 1024 || agents < 1 || agents > 64 || runs < 1 || runs > 1000 {
				return fmt.Errorf("bench gangstart: --workers %d (1..1024), --agents %d (1..64), --runs %d (1..1000)", workers, agents, runs)
			}
			ctx := cmd.Context()
			c, _, cleanup, err := benchCluster(ctx, dir, agents, "dgx-h100", insecure)
			if err != nil {
				return err
			}
			defer cleanup()
			job, err := c.Submit(ctx, sdk.JobSpec{Name: "bench-gangstart"})
			if err != nil {
				return err
			}
			defer job.Stop(context.Background())
			spec := sdk.GangSpec{Kind: "bench-noop", Workers: workers, GPUsPerWorker: 1}
			// A first gang caches the binary on every agent: not measured.
			spec.Name = "warm"
			g, err := job.SpawnGang(ctx, spec)
			if err != nil {
				return err
			}
			machines := len(g.Placement().Machines)
			if err := g.Stop(ctx); err != nil {
				return err
			}
			var ms []float64
			for i := 0; i < runs; i++ {
				spec.Name = fmt.Sprintf("g%d", i)
				start := time.Now()
				g, err := job.SpawnGang(ctx, spec)
				if err != nil {
					return err
				}
				ms = append(ms, float64(time.Since(start).Microseconds())/1e3)
				if err := g.Stop(ctx); err != nil {
					return err
				}
			}
			out := map[string]any{"tls": !insecure, "workers": workers, "machines": machines, "runs": runs, "p50_ms": percentile(ms, 0.5),
				"p90_ms": percentile(ms, 0.9), "max_ms": slices.Max(ms), "samples_ms": ms, "target_ms": 1000}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(out)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "gang of %d worker processes on %d machines: p50 %.0f ms, p90 %.0f ms, max %.0f ms over %d runs (target p50 < 1000 ms)\n",
				workers, machines, out["p50_ms"], out["p90_ms"], out["max_ms"], runs)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "dir", "", "a running cluster's directory `DIR` (default: a temporary cluster)")
	f.IntVar(&workers, "workers", 16, "workers in the gang (one GPU each)")
	f.IntVar(&agents, "agents", 2, "agents of a temporary cluster (DGX H100, 8 simulated GPUs each)")
	f.IntVar(&runs, "runs", 10, "gangs started and measured")
	f.BoolVar(&insecure, "insecure-no-tls", false, "a temporary cluster without TLS (token only), to measure what TLS costs")
	f.BoolVar(&asJSON, "json", false, "print one JSON object")
	return cmd
}

func newBenchAllReduceCmd() *cobra.Command {
	var dir string
	var ranks, agents, iters int
	var mib float64
	var asJSON, insecure, trusted bool
	cmd := &cobra.Command{
		Use:   "allreduce",
		Short: "AllReduce between worker processes on two machines vs a bare-TCP ring of the same shape, in one run",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if sdk.InWorker() { // an agent started this binary as a benchmark worker: serve it
				os.Exit(benchWorkerMain())
			}
			if ranks < 2 || ranks > 64 || iters < 1 || iters > 1000 || !(mib > 0 && mib <= 4096) || agents < 1 || agents > 64 {
				return fmt.Errorf("bench allreduce: --ranks %d (2..64), --iters %d (1..1000), --mib %v (0..4096], --agents %d (1..64)", ranks, iters, mib, agents)
			}
			floats := int(mib * (1 << 20) / 4)
			bytes := float64(4 * floats)
			ctx := cmd.Context()
			// The baseline first: ranks processes in a ring over plain TCP.
			tcp, err := tcpRing(ctx, ranks, floats, iters)
			if err != nil {
				return fmt.Errorf("bench allreduce: the TCP ring: %w", err)
			}
			c, g, cleanup, err := benchGang(ctx, dir, agents, insecure, trusted, "bench-allreduce", ranks, bytes)
			if err != nil {
				return err
			}
			defer cleanup()
			fs := make([]*sdk.Future[[]float64], ranks)
			for r := range fs {
				fs[r] = sdk.CallAsync[[]float64](ctx, c, g.Worker(r), arReq{Floats: floats, Iters: iters})
			}
			slowest := make([]float64, iters)
			for r, f := range fs {
				ts, err := f.Await(ctx)
				if err != nil {
					return fmt.Errorf("bench allreduce: rank %d: %w", r, err)
				}
				for i, t := range ts {
					slowest[i] = max(slowest[i], t)
				}
			}
			atollS := percentile(slowest, 0.5)
			tcpS := percentile(tcp, 0.5)
			out := map[string]any{"tls": !insecure, "trusted_fabric": trusted, "ranks": ranks, "machines": len(g.Placement().Machines), "bytes": bytes,
				"atoll_s": atollS, "tcp_ring_s": tcpS, "atoll_gbps": bytes / atollS / 1e9, "tcp_ring_gbps": bytes / tcpS / 1e9,
				"ratio": tcpS / atollS, "target_ratio": 1.0, "atoll_samples_s": slowest, "tcp_samples_s": tcp}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(out)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "AllReduce of %.0f MiB over %d worker processes on %d machines: Atoll %.3f GB/s (%.1f ms), bare TCP ring %.3f GB/s (%.1f ms): ratio %.2f (target >= 1.0)\n",
				mib, ranks, len(g.Placement().Machines), out["atoll_gbps"], 1e3*atollS, out["tcp_ring_gbps"], 1e3*tcpS, out["ratio"])
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "dir", "", "a running cluster's directory `DIR` (default: a temporary cluster)")
	f.IntVar(&ranks, "ranks", 8, "worker processes")
	f.IntVar(&agents, "agents", 2, "agents of a temporary cluster (DGX H100, 8 simulated GPUs each)")
	f.IntVar(&iters, "iters", 5, "measured AllReduces (after one warm-up)")
	f.Float64Var(&mib, "mib", 64, "vector size in MiB")
	f.BoolVar(&insecure, "insecure-no-tls", false, "a temporary cluster without TLS (token only), to measure what TLS costs")
	f.BoolVar(&trusted, "trusted-fabric", false, "a temporary cluster whose agents declare the fabric trusted (--trusted-fabric): collective links without TLS, every other link mutual TLS")
	f.BoolVar(&asJSON, "json", false, "print one JSON object")
	return cmd
}

// tcpRing runs the baseline: n processes (`atoll bench ring-peer`) in a ring of plain TCP
// connections, each running the same ring AllReduce on its own vector; it returns the
// slowest rank's time of each iteration.
func tcpRing(ctx context.Context, n, floats, iters int) ([]float64, error) {
	slowest := make([]float64, iters)
	err := runPeers(ctx, n, func(r int) []string {
		return []string{"bench", "ring-peer", "--rank", fmt.Sprint(r), "--size", fmt.Sprint(n), "--floats", fmt.Sprint(floats), "--iters", fmt.Sprint(iters)}
	}, func(r int, line string) error {
		var ts []float64
		if err := json.Unmarshal([]byte(line), &ts); err != nil || len(ts) != iters {
			return fmt.Errorf("ring peer %d answered %q", r, line)
		}
		for i, t := range ts {
			slowest[i] = max(slowest[i], t)
		}
		return nil
	})
	return slowest, err
}

// runPeers runs a bare baseline of n processes of this binary (args(r): rank r's
// arguments): each prints its address, is given every rank's, runs, and prints one line of
// results, handed to result in rank order.
func runPeers(ctx context.Context, n int, args func(r int) []string, result func(r int, line string) error) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	type peer struct {
		cmd *exec.Cmd
		in  io.WriteCloser
		out *bufio.Reader
	}
	peers := make([]peer, n)
	addrs := make([]string, n)
	defer func() {
		for _, p := range peers {
			if p.cmd != nil && p.cmd.Process != nil {
				_ = p.cmd.Process.Kill()
				_ = p.cmd.Wait()
			}
		}
	}()
	for r := 0; r < n; r++ {
		cmd := exec.CommandContext(ctx, exe, args(r)...)
		in, _ := cmd.StdinPipe()
		outp, _ := cmd.StdoutPipe()
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			return err
		}
		peers[r] = peer{cmd, in, bufio.NewReader(outp)}
		line, err := peers[r].out.ReadString('\n')
		if err != nil {
			return fmt.Errorf("peer %d: %w", r, err)
		}
		addrs[r] = strings.TrimSpace(line)
	}
	for _, p := range peers {
		fmt.Fprintln(p.in, strings.Join(addrs, ","))
	}
	for r, p := range peers {
		line, err := p.out.ReadString('\n')
		if err != nil {
			return fmt.Errorf("peer %d: %w", r, err)
		}
		if err := result(r, line); err != nil {
			return err
		}
	}
	return nil
}

func newBenchRingPeerCmd() *cobra.Command {
	var rank, size, floats, iters int
	cmd := &cobra.Command{
		Use:    "ring-peer",
		Short:  "One rank of the bare-TCP ring baseline of `atoll bench allreduce`",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if size < 2 || rank < 0 || rank >= size || floats < size || iters < 1 {
				return fmt.Errorf("ring-peer: rank %d of %d, %d floats, %d iterations", rank, size, floats, iters)
			}
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				return err
			}
			defer ln.Close()
			fmt.Fprintln(cmd.OutOrStdout(), ln.Addr())
			var line string
			if _, err := fmt.Fscanln(os.Stdin, &line); err != nil {
				return err
			}
			addrs := strings.Split(line, ",")
			var right net.Conn
			var dialErr error
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				right, dialErr = net.Dial("tcp", addrs[(rank+1)%size])
			}()
			left, err := ln.Accept()
			if err != nil {
				return err
			}
			wg.Wait()
			if dialErr != nil {
				return dialErr
			}
			data := make([]float32, floats)
			buf := make([]byte, 4*(floats/size+1))
			send := make([]byte, 4*(floats/size+1))
			ts := make([]float64, 0, iters)
			for k := -1; k < iters; k++ {
				start := time.Now()
				if err := tcpAllReduce(left, right, rank, size, data, send, buf); err != nil {
					return err
				}
				if k >= 0 {
					ts = append(ts, time.Since(start).Seconds())
				}
			}
			b, _ := json.Marshal(ts)
			fmt.Fprintln(cmd.OutOrStdout(), string(b))
			_, _ = io.Copy(io.Discard, os.Stdin) // stay until the benchmark is done
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&rank, "rank", 0, "this rank")
	f.IntVar(&size, "size", 2, "ranks")
	f.IntVar(&floats, "floats", 1<<20, "vector length")
	f.IntVar(&iters, "iters", 5, "measured AllReduces")
	return cmd
}

// tcpAllReduce is the plain ring AllReduce: each step writes a chunk (the vector's own
// memory, no conversion) to the right neighbour while reading one from the left into a
// buffer, then adds it in (reduce-scatter) or reads it in place (all-gather).
func tcpAllReduce(left, right net.Conn, rank, n int, data []float32, _, buf []byte) error {
	mod := func(x int) int { return ((x % n) + n) % n }
	bounds := func(k int) (int, int) { return k * len(data) / n, (k + 1) * len(data) / n }
	raw := codec.F32View(data)
	for op := 0; op < 2; op++ {
		for s := 0; s < n-1; s++ {
			sendIdx, recvIdx := mod(rank-s), mod(rank-s-1)
			if op == 1 {
				sendIdx, recvIdx = mod(rank+1-s), mod(rank-s)
			}
			lo, hi := bounds(sendIdx)
			errc := make(chan error, 1)
			go func() { _, err := right.Write(raw[4*lo : 4*hi]); errc <- err }()
			rlo, rhi := bounds(recvIdx)
			if op == 1 {
				if _, err := io.ReadFull(left, raw[4*rlo:4*rhi]); err != nil {
					return err
				}
			} else {
				rb := buf[:4*(rhi-rlo)]
				if _, err := io.ReadFull(left, rb); err != nil {
					return err
				}
				for i, v := range codec.ViewF32(rb) {
					data[rlo+i] += v
				}
			}
			if err := <-errc; err != nil {
				return err
			}
		}
	}
	return nil
}

func newBenchFailoverCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "failover",
		Short: "Failover times on a cluster of processes: leader head SIGKILL -> scheduling again; agent SIGKILL -> its gang running elsewhere",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if sdk.InWorker() { // an agent started this binary as a benchmark worker: serve it
				os.Exit(benchWorkerMain())
			}
			ctx := cmd.Context()
			c, cf, cleanup, err := benchCluster(ctx, "", 3, "dgx-h100", false)
			if err != nil {
				return err
			}
			defer cleanup()
			job, err := c.Submit(ctx, sdk.JobSpec{Name: "bench-failover"})
			if err != nil {
				return err
			}
			g, err := job.SpawnGang(ctx, sdk.GangSpec{Name: "g", Kind: "bench-noop", Workers: 4, GPUsPerWorker: 1, SameIsland: true, MaxRestarts: 5})
			if err != nil {
				return err
			}
			st, err := c.Status(ctx)
			if err != nil {
				return err
			}
			// Leader: SIGKILL, then spawn a gang until the new leader places it.
			var leaderPID int
			for _, h := range cf.Heads {
				if h.ID == st.Leader {
					leaderPID = h.PID
				}
			}
			start := time.Now()
			if err := syscall.Kill(leaderPID, syscall.SIGKILL); err != nil {
				return err
			}
			if _, err := job.SpawnGang(ctx, sdk.GangSpec{Name: "after-leader", Kind: "bench-noop", Workers: 1, GPUsPerWorker: 1}); err != nil {
				return fmt.Errorf("bench failover: spawn after the leader died: %w", err)
			}
			leaderS := time.Since(start).Seconds()
			// Agent: SIGKILL the agent of the gang's machine; wait for the gang elsewhere.
			lost := g.Placement().Machines[0]
			var agentPID int
			for _, a := range cf.Agents {
				if a.Name == lost {
					agentPID = a.PID
				}
			}
			gen := g.Generation()
			start = time.Now()
			if err := syscall.Kill(agentPID, syscall.SIGKILL); err != nil {
				return err
			}
			if _, err := g.AwaitRunning(ctx, gen+1); err != nil {
				return err
			}
			agentS := time.Since(start).Seconds()
			out := map[string]any{"leader_failover_s": leaderS, "agent_failover_s": agentS, "leader_target_s": 3, "agent_target_s": 10,
				"moved_to": g.Placement().Machines, "lost_machine": lost}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(out)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "leader head SIGKILL -> the new leader placed a gang after %.2f s (target <= 3 s)\nagent SIGKILL -> its gang ran on %v after %.2f s (target <= 10 s)\n",
				leaderS, g.Placement().Machines, agentS)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object")
	return cmd
}
