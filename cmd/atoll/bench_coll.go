package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/atoll-run/atoll/internal/codec"
	"github.com/atoll-run/atoll/internal/pki"
	"github.com/atoll-run/atoll/runtime/coll"
	"github.com/atoll-run/atoll/sdk"
)

// benchCollectives are the collectives `atoll bench collectives` measures, in order.
var benchCollectives = []string{"allgather", "reducescatter", "broadcast"}

// collReq asks a benchmark worker to run each of benchCollectives on Floats float32s
// Iters times (after one warm-up each); the answer is each one's times in seconds.
type collReq struct{ Floats, Iters int }

type collWorker struct{}

func (collWorker) Receive(c *sdk.Context, msg any) (any, error) {
	r := msg.(collReq)
	n, rank := c.Size(), c.Rank()
	v := make([]float32, r.Floats)
	fill := func(x float32) {
		for i := range v {
			v[i] = x
		}
	}
	out := map[string][]float64{}
	for _, op := range benchCollectives {
		for k := -1; k < r.Iters; k++ {
			// The inputs, outside the time: AllGather's own shard (the rest garbage),
			// ReduceScatter's vector, Broadcast's root's vector.
			lo, hi := c.Shard(len(v), rank)
			switch op {
			case "allgather":
				fill(-1)
				for i := lo; i < hi; i++ {
					v[i] = float32(rank + 1)
				}
			case "reducescatter":
				fill(float32(rank + 1))
			case "broadcast":
				fill(0)
				if rank == 0 {
					fill(7)
				}
			}
			start := time.Now()
			var err error
			switch op {
			case "allgather":
				err = c.AllGather(c, v)
			case "reducescatter":
				err = c.ReduceScatter(c, v)
			case "broadcast":
				err = c.Broadcast(c, 0, v)
			}
			if err != nil {
				return nil, fmt.Errorf("%s: %w", op, err)
			}
			if k >= 0 {
				out[op] = append(out[op], time.Since(start).Seconds())
			}
		}
		// The last round's result, exactly.
		for r := 0; r < n; r++ {
			lo, hi := c.Shard(len(v), r)
			for i := lo; i < hi; i++ {
				want := float32(7)
				switch {
				case op == "allgather":
					want = float32(r + 1)
				case op == "reducescatter" && r != rank:
					continue
				case op == "reducescatter":
					want = float32(n * (n + 1) / 2)
				}
				if v[i] != want {
					return nil, fmt.Errorf("%s: [%d] = %v, want %v", op, i, v[i], want)
				}
			}
		}
	}
	return out, nil
}

func newBenchCollectivesCmd() *cobra.Command {
	var dir string
	var ranks, agents, iters, rounds int
	var mib float64
	var asJSON, insecure, trusted bool
	cmd := &cobra.Command{
		Use:   "collectives",
		Short: "AllGather, ReduceScatter and Broadcast between worker processes on two machines vs bare-TCP implementations of the same algorithms and shape, in one run",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if sdk.InWorker() { // an agent started this binary as a benchmark worker: serve it
				os.Exit(benchWorkerMain())
			}
			if ranks < 2 || ranks > 64 || iters < 1 || iters > 1000 || rounds < 1 || rounds > 100 || !(mib > 0 && mib <= 4096) || agents < 1 || agents > 64 {
				return fmt.Errorf("bench collectives: --ranks %d (2..64), --iters %d (1..1000), --rounds %d (1..100), --mib %v (0..4096], --agents %d (1..64)", ranks, iters, rounds, mib, agents)
			}
			floats := int(mib * (1 << 20) / 4)
			bytes := float64(4 * floats)
			ctx := cmd.Context()
			machines := min(agents, ranks)
			// The baselines: ranks processes in a ring of TCP connections, mutual TLS on
			// the links between machines (a throwaway CA), or all plain.
			tlsDir, err := os.MkdirTemp("", "atoll-bench-tls-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(tlsDir)
			if err := throwawayIdentity(tlsDir); err != nil {
				return err
			}
			c, g, cleanup, err := benchGang(ctx, dir, agents, insecure, trusted, "bench-coll", ranks, bytes)
			if err != nil {
				return err
			}
			defer cleanup()
			// Rounds alternate the three, so that a load that comes and goes on a shared
			// machine weighs on each alike: the ring with TLS between machines, the plain
			// ring, Atoll's gang (its cluster idles during the baselines' turns).
			base, plain, slowest := map[string][]float64{}, map[string][]float64{}, map[string][]float64{}
			for round := 0; round < rounds; round++ {
				b, err := collRing(ctx, ranks, machines, floats, iters, tlsDir)
				if err != nil {
					return fmt.Errorf("bench collectives: the TCP ring with TLS between machines: %w", err)
				}
				p, err := collRing(ctx, ranks, machines, floats, iters, "")
				if err != nil {
					return fmt.Errorf("bench collectives: the plain TCP ring: %w", err)
				}
				fs := make([]*sdk.Future[map[string][]float64], ranks)
				for r := range fs {
					fs[r] = sdk.CallAsync[map[string][]float64](ctx, c, g.Worker(r), collReq{Floats: floats, Iters: iters})
				}
				a := map[string][]float64{}
				for _, op := range benchCollectives {
					a[op] = make([]float64, iters)
				}
				for r, f := range fs {
					ts, err := f.Await(ctx)
					if err != nil {
						return fmt.Errorf("bench collectives: rank %d: %w", r, err)
					}
					for _, op := range benchCollectives {
						for i, t := range ts[op] {
							a[op][i] = max(a[op][i], t)
						}
					}
				}
				for _, op := range benchCollectives {
					base[op] = append(base[op], b[op]...)
					plain[op] = append(plain[op], p[op]...)
					slowest[op] = append(slowest[op], a[op]...)
				}
			}
			res := map[string]any{}
			for _, op := range benchCollectives {
				a, b, p := percentile(slowest[op], 0.5), percentile(base[op], 0.5), percentile(plain[op], 0.5)
				res[op] = map[string]any{"atoll_s": a, "tcp_s": b, "tcp_plain_s": p, "ratio": b / a, "ratio_plain": p / a,
					"atoll_samples_s": slowest[op], "tcp_samples_s": base[op], "tcp_plain_samples_s": plain[op]}
			}
			// The baselines place rank r on machine r*machines/ranks: say whether the gang's
			// placement has the same shape.
			pl := g.Placement()
			idx := map[string]int{}
			same := len(pl.Machines) == machines
			var machineOf []int
			for r, mem := range pl.Members {
				if _, ok := idx[mem.Machine]; !ok {
					idx[mem.Machine] = len(idx)
				}
				machineOf = append(machineOf, idx[mem.Machine])
				same = same && idx[mem.Machine] == r*machines/ranks
			}
			out := map[string]any{"tls": !insecure, "trusted_fabric": trusted, "ranks": ranks, "machines": len(pl.Machines), "bytes": bytes, "rounds": rounds, "iters": iters,
				"collectives": res, "target_ratio": 0.9, "machine_of_rank": machineOf, "same_shape_as_baseline": same}
			for _, op := range benchCollectives {
				out[op+"_ratio"] = res[op].(map[string]any)["ratio"]
			}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(out)
			}
			for _, op := range benchCollectives {
				r := res[op].(map[string]any)
				fmt.Fprintf(cmd.OutOrStdout(), "%-13s %.0f MiB over %d worker processes on %d machines: Atoll %.1f ms, bare TCP (TLS between machines) %.1f ms: ratio %.2f (target >= 0.9); all-plain TCP %.1f ms: %.2f\n",
					op, mib, ranks, len(g.Placement().Machines), 1e3*r["atoll_s"].(float64), 1e3*r["tcp_s"].(float64), r["ratio"], 1e3*r["tcp_plain_s"].(float64), r["ratio_plain"])
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "dir", "", "a running cluster's directory `DIR` (default: a temporary cluster)")
	f.IntVar(&ranks, "ranks", 8, "worker processes")
	f.IntVar(&agents, "agents", 2, "agents of a temporary cluster (DGX H100, 8 simulated GPUs each)")
	f.IntVar(&iters, "iters", 3, "measured runs of each collective in a round (after one warm-up)")
	f.IntVar(&rounds, "rounds", 3, "rounds, each running the two baselines and then Atoll")
	f.Float64Var(&mib, "mib", 64, "vector size in MiB (AllGather's result, ReduceScatter's input, Broadcast's vector)")
	f.BoolVar(&insecure, "insecure-no-tls", false, "a temporary cluster without TLS (token only), to measure what TLS costs")
	f.BoolVar(&trusted, "trusted-fabric", false, "a temporary cluster whose agents declare the fabric trusted (--trusted-fabric): collective links without TLS, every other link mutual TLS")
	f.BoolVar(&asJSON, "json", false, "print one JSON object")
	return cmd
}

// throwawayIdentity writes a CA of its own and one identity it signed into dir: the
// baseline's links between machines authenticate each other as the cluster's do.
func throwawayIdentity(dir string) error {
	ca, err := pki.NewCA("bench")
	if err != nil {
		return err
	}
	certPEM, keyPEM, err := ca.Issue("bench-peer")
	if err != nil {
		return err
	}
	return pki.WriteIdentity(dir, ca.CertPEM, certPEM, keyPEM)
}

// collRing runs a baseline: n processes (`atoll bench coll-peer`) in a ring of TCP
// connections, ranks placed on machines in order (rank r on machine r*machines/n), with
// mutual TLS on the links between machines when tlsDir holds an identity; each runs
// every collective. It returns the slowest rank's time of each iteration, by collective.
func collRing(ctx context.Context, n, machines, floats, iters int, tlsDir string) (map[string][]float64, error) {
	slowest := map[string][]float64{}
	for _, op := range benchCollectives {
		slowest[op] = make([]float64, iters)
	}
	err := runPeers(ctx, n, func(r int) []string {
		return []string{"bench", "coll-peer", "--rank", fmt.Sprint(r), "--size", fmt.Sprint(n),
			"--machines", fmt.Sprint(machines), "--floats", fmt.Sprint(floats), "--iters", fmt.Sprint(iters), "--tls-dir", tlsDir}
	}, func(r int, line string) error {
		var ts map[string][]float64
		if err := json.Unmarshal([]byte(line), &ts); err != nil {
			return fmt.Errorf("peer %d answered %q", r, line)
		}
		for _, op := range benchCollectives {
			if len(ts[op]) != iters {
				return fmt.Errorf("peer %d answered %q", r, line)
			}
			for i, t := range ts[op] {
				slowest[op][i] = max(slowest[op][i], t)
			}
		}
		return nil
	})
	return slowest, err
}

func newBenchCollPeerCmd() *cobra.Command {
	var rank, size, machines, floats, iters int
	var tlsDir string
	cmd := &cobra.Command{
		Use:    "coll-peer",
		Short:  "One rank of the bare-TCP baselines of `atoll bench collectives`",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if size < 2 || rank < 0 || rank >= size || machines < 1 || machines > size || floats < size || iters < 1 {
				return fmt.Errorf("coll-peer: rank %d of %d on %d machines, %d floats, %d iterations", rank, size, machines, floats, iters)
			}
			machineOf := func(r int) int { return r * machines / size }
			var srvTLS, cliTLS *tls.Config
			if tlsDir != "" {
				id, err := pki.LoadIdentity(filepath.Clean(tlsDir))
				if err != nil {
					return err
				}
				srvTLS, cliTLS = id.Server(), id.Client()
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
			rightRank, leftRank := (rank+1)%size, (rank+size-1)%size
			var right net.Conn
			var dialErr error
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				right, dialErr = net.Dial("tcp", addrs[rightRank])
				if dialErr == nil && cliTLS != nil && machineOf(rightRank) != machineOf(rank) {
					tc := tls.Client(right, cliTLS)
					dialErr, right = tc.HandshakeContext(cmd.Context()), tc
				}
			}()
			left, err := ln.Accept()
			if err != nil {
				return err
			}
			if srvTLS != nil && machineOf(leftRank) != machineOf(rank) {
				tc := tls.Server(left, srvTLS)
				if err := tc.HandshakeContext(cmd.Context()); err != nil {
					return err
				}
				left = tc
			}
			wg.Wait()
			if dialErr != nil {
				return dialErr
			}
			data := make([]float32, floats)
			buf := make([]byte, 4*(floats/size+1))
			out := map[string][]float64{}
			for _, op := range benchCollectives {
				for k := -1; k < iters; k++ {
					start := time.Now()
					var err error
					switch op {
					case "allgather":
						err = tcpAllGather(left, right, rank, size, data)
					case "reducescatter":
						err = tcpReduceScatter(left, right, rank, size, data, buf)
					case "broadcast":
						err = tcpBroadcast(left, right, rank, size, 0, data)
					}
					if err != nil {
						return fmt.Errorf("%s: %w", op, err)
					}
					if k >= 0 {
						out[op] = append(out[op], time.Since(start).Seconds())
					}
				}
			}
			b, _ := json.Marshal(out)
			fmt.Fprintln(cmd.OutOrStdout(), string(b))
			_, _ = io.Copy(io.Discard, os.Stdin) // stay until the benchmark is done
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&rank, "rank", 0, "this rank")
	f.IntVar(&size, "size", 2, "ranks")
	f.IntVar(&machines, "machines", 2, "machines the ranks are placed on, in order")
	f.IntVar(&floats, "floats", 1<<20, "vector length")
	f.IntVar(&iters, "iters", 5, "measured rounds of each collective")
	f.StringVar(&tlsDir, "tls-dir", "", "an identity `DIR` (ca.crt, cert.crt, cert.key): mutual TLS on the links between machines")
	return cmd
}

// ringStep writes out to right while reading len(in) bytes from left into in.
func ringStep(left, right net.Conn, out, in []byte) error {
	errc := make(chan error, 1)
	go func() { _, err := right.Write(out); errc <- err }()
	_, err := io.ReadFull(left, in)
	if werr := <-errc; err == nil {
		err = werr
	}
	return err
}

// tcpAllGather is the ring all-gather (coll's schedule): rank r owns shard r; step s
// forwards shard r-s to the right and reads shard r-s-1 from the left in place.
func tcpAllGather(left, right net.Conn, rank, n int, data []float32) error {
	mod := func(x int) int { return ((x % n) + n) % n }
	raw := codec.F32View(data)
	for s := 0; s < n-1; s++ {
		slo, shi := bounds(len(data), n, mod(rank-s))
		rlo, rhi := bounds(len(data), n, mod(rank-s-1))
		if err := ringStep(left, right, raw[4*slo:4*shi], raw[4*rlo:4*rhi]); err != nil {
			return err
		}
	}
	return nil
}

// tcpReduceScatter is the ring reduce-scatter (coll's schedule): step s sends the partial
// sum of shard r-s-1 and adds the left's partial sum of shard r-s-2; rank r ends with
// shard r summed.
func tcpReduceScatter(left, right net.Conn, rank, n int, data []float32, buf []byte) error {
	mod := func(x int) int { return ((x % n) + n) % n }
	raw := codec.F32View(data)
	for s := 0; s < n-1; s++ {
		slo, shi := bounds(len(data), n, mod(rank-s-1))
		rlo, rhi := bounds(len(data), n, mod(rank-s-2))
		rb := buf[:4*(rhi-rlo)]
		if err := ringStep(left, right, raw[4*slo:4*shi], rb); err != nil {
			return err
		}
		for i, v := range codec.ViewF32(rb) {
			data[rlo+i] += v
		}
	}
	return nil
}

// tcpBroadcast is the pipelined chain from root (coll's): pieces of about
// coll.BroadcastPiece bytes, each forwarded to the right (by a writer of its own) as
// soon as it was read from the left.
func tcpBroadcast(left, right net.Conn, rank, n, root int, data []float32) error {
	rel := ((rank-root)%n + n) % n
	raw := codec.F32View(data)
	pieces := max(1, min(len(data), (len(raw)+coll.BroadcastPiece-1)/coll.BroadcastPiece))
	fwd := make(chan []byte, pieces)
	errc := make(chan error, 1)
	go func() {
		var err error
		for b := range fwd {
			if err == nil && rel != n-1 {
				_, err = right.Write(b)
			}
		}
		errc <- err
	}()
	var err error
	for k := 0; k < pieces && err == nil; k++ {
		lo, hi := bounds(len(data), pieces, k)
		if rel != 0 {
			_, err = io.ReadFull(left, raw[4*lo:4*hi])
		}
		fwd <- raw[4*lo : 4*hi]
	}
	close(fwd)
	if werr := <-errc; err == nil {
		err = werr
	}
	return err
}

func bounds(length, n, k int) (int, int) { return k * length / n, (k + 1) * length / n }
