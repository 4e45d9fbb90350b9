package store

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/atoll-run/atoll/store/object"
	"github.com/atoll-run/atoll/store/transfer"
)

// pairStats is what pairs measured: each side's median time and the median
// (and quartiles) over pairs of a's time / b's time.
type pairStats struct {
	a, b          time.Duration // medians
	aBest, bBest  time.Duration
	ratio, lo, hi float64
	aCPU, bCPU    time.Duration // this process's CPU time, summed
}

// pairs times n pairs of a and b back to back, in alternating order: a pair's
// halves run under the same load from other processes, so the median of the
// pairs' ratios is robust where best-of-N absolute times are not.
func pairs(n int, a, b func() (time.Duration, error)) (pairStats, error) {
	var as, bs []time.Duration
	var ratios []float64
	var st pairStats
	for i := range n {
		var ta, tb time.Duration
		for j := range 2 {
			c0 := cpuTime()
			if (i+j)%2 == 0 {
				d, err := a()
				if err != nil {
					return st, err
				}
				ta = d
				st.aCPU += cpuTime() - c0
			} else {
				d, err := b()
				if err != nil {
					return st, err
				}
				tb = d
				st.bCPU += cpuTime() - c0
			}
		}
		as, bs = append(as, ta), append(bs, tb)
		ratios = append(ratios, float64(ta)/float64(tb))
	}
	slices.Sort(as)
	slices.Sort(bs)
	slices.Sort(ratios)
	q := func(f float64) float64 { return ratios[int(f*float64(len(ratios)-1)+0.5)] }
	st.a, st.b, st.aBest, st.bBest = as[len(as)/2], bs[len(bs)/2], as[0], bs[0]
	st.ratio, st.lo, st.hi = q(0.5), q(0.25), q(0.75)
	return st, nil
}

// server is the serving process, started and told its config.
type server struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Reader
	info  ServeInfo
	mu    sync.Mutex // one command at a time
}

func (s *server) stop() { s.stdin.Close(); _ = s.cmd.Wait() }

// startServer starts cfg.ServeCmd and hands it sc on its stdin.
func startServer(ctx context.Context, cfg Config, sc ServeConfig) (*server, error) {
	cmd := exec.CommandContext(ctx, cfg.ServeCmd[0], cfg.ServeCmd[1:]...)
	cmd.Env = append(os.Environ(), cfg.ServeEnv...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("benchstore: start %v: %w", cfg.ServeCmd, err)
	}
	s := &server{cmd: cmd, stdin: stdin, out: bufio.NewReader(stdout)}
	line, _ := json.Marshal(sc)
	if _, err := stdin.Write(append(line, '\n')); err != nil {
		s.stop()
		return nil, fmt.Errorf("benchstore: configure the serving process: %w", err)
	}
	out, err := s.out.ReadBytes('\n')
	if err != nil {
		s.stop()
		return nil, fmt.Errorf("benchstore: serving process said nothing: %w", err)
	}
	if err := json.Unmarshal(out, &s.info); err != nil {
		s.stop()
		return nil, fmt.Errorf("benchstore: serving process said %q: %w", out, err)
	}
	return s, nil
}

// runPull measures pulls from a second process over loopback: a large object
// against a bare TCP copy of the same bytes (and over TLS against plain, with
// cfg.TLS), and a small object with pooled connections against a client that
// dials every pull.
func runPull(ctx context.Context, cfg Config, st *object.Store, res *Result, log *zap.Logger) error {
	tok := make([]byte, 32)
	_, _ = rand.Read(tok)
	sc := ServeConfig{Token: hex.EncodeToString(tok), Size: cfg.PullSize, Sendfile: cfg.Sendfile}
	var clientPEM TLSPEM
	if cfg.TLS {
		srvPEM, cliPEM, err := benchCA()
		if err != nil {
			return err
		}
		sc.TLS, clientPEM = &srvPEM, cliPEM
	}
	srv, err := startServer(ctx, cfg, sc)
	if err != nil {
		return err
	}
	defer srv.stop()
	info := srv.info
	id, err := object.ParseID(info.ID)
	if err != nil {
		return err
	}
	small, err := object.ParseID(info.SmallID)
	if err != nil {
		return err
	}
	newClient := func(tlsOn bool, maxIdle int) (*transfer.Client, error) {
		ccfg := transfer.DefaultClientConfig()
		ccfg.Token, ccfg.Logger = tok, log
		if cfg.Streams > 0 {
			ccfg.Streams = cfg.Streams
		}
		if cfg.Depth > 0 {
			ccfg.Depth = cfg.Depth
		}
		if maxIdle != 0 {
			ccfg.MaxIdlePerPeer = maxIdle
		}
		if tlsOn {
			tc, err := clientPEM.config()
			if err != nil {
				return nil, err
			}
			ccfg.TLS = tc
		}
		return transfer.NewClient(ccfg)
	}
	cl, err := newClient(false, 0)
	if err != nil {
		return err
	}
	defer cl.Close()

	buf := make([]byte, info.Size)
	copy(buf, pattern(int(info.Size))) // touched, as the store's pages are
	tcpCopy := func() (time.Duration, error) {
		t0 := time.Now()
		c, err := net.Dial("tcp", info.TCPAddr)
		if err != nil {
			return 0, err
		}
		_, err = io.ReadFull(c, buf)
		c.Close()
		if err != nil {
			return 0, fmt.Errorf("benchstore: bare tcp copy: %w", err)
		}
		return time.Since(t0), nil
	}
	// pullWith pulls oid from addr with c and releases it again, returning the
	// time of the pull alone.
	pullWith := func(c *transfer.Client, addr string, oid object.ID, size int64) func() (time.Duration, error) {
		return func() (time.Duration, error) {
			t0 := time.Now()
			if err := c.Pull(ctx, st, oid, []string{addr}, transfer.PullOptions{Owner: "bench"}); err != nil {
				return 0, err
			}
			d := time.Since(t0)
			v, err := st.Get(ctx, oid)
			if err != nil {
				return 0, err
			}
			same := v.Size() == size && v.Fingerprint(ctx) != 0
			v.Release()
			if !same {
				return 0, fmt.Errorf("benchstore: pulled object has size %d, want %d", v.Size(), size)
			}
			return d, st.Release(ctx, oid, "bench")
		}
	}
	pull := pullWith(cl, info.Addr, id, info.Size)
	// Warm-up: one unmeasured bare copy and one pull, so that both sides'
	// memory is touched (the pull then lands in recycled shared memory) and the
	// server has remembered its chunk fingerprints. The first pull is reported
	// on its own as pull_first_gbps.
	if _, err := tcpCopy(); err != nil {
		return err
	}
	firstPull, err := pull()
	if err != nil {
		return err
	}
	ps, err := pairs(cfg.PullRuns, tcpCopy, pull)
	if err != nil {
		return err
	}
	res.PullBytes = info.Size
	res.TCPGBps, res.PullGBps = gbps(info.Size, ps.a), gbps(info.Size, ps.b)
	res.PullRatio, res.PullRatioLo, res.PullRatioHi = ps.ratio, ps.lo, ps.hi
	res.TCPBestGBps, res.PullBestGBps = gbps(info.Size, ps.aBest), gbps(info.Size, ps.bBest)
	res.PullFirstGBps = gbps(info.Size, firstPull)
	res.PullRuns = cfg.PullRuns
	gb := float64(info.Size) * float64(cfg.PullRuns) / 1e9
	res.TCPCPUPerGB, res.PullCPUPerGB = ps.aCPU.Seconds()/gb, ps.bCPU.Seconds()/gb

	dial, err := newClient(false, -1)
	if err != nil {
		return err
	}
	defer dial.Close()
	sp, err := smallPulls(cfg.SmallPulls, pullWith(cl, info.Addr, small, SmallSize), pullWith(dial, info.Addr, small, SmallSize))
	if err != nil {
		return err
	}
	res.SmallPullBytes, res.SmallPulls = SmallSize, cfg.SmallPulls
	res.SmallPullPooledUS, res.SmallPullDialUS = sp.pooled.Seconds()*1e6, sp.dial.Seconds()*1e6
	res.SmallPullsPooledPS, res.SmallPullsDialPS = sp.pooledPS, sp.dialPS
	res.SmallPullSpeedup = float64(sp.dial) / float64(sp.pooled)

	if !cfg.TLS {
		return nil
	}
	res.TLS = true
	tcl, err := newClient(true, 0)
	if err != nil {
		return err
	}
	defer tcl.Close()
	tpull := pullWith(tcl, info.TLSAddr, id, info.Size)
	if _, err := tpull(); err != nil { // warm-up
		return fmt.Errorf("benchstore: pull over TLS: %w", err)
	}
	ts, err := pairs(cfg.PullRuns, pull, tpull)
	if err != nil {
		return err
	}
	res.PullPlainGBps, res.PullTLSGBps = gbps(info.Size, ts.a), gbps(info.Size, ts.b)
	res.TLSRatio, res.TLSRatioLo, res.TLSRatioHi = ts.ratio, ts.lo, ts.hi
	res.PullTLSCPUPerGB = ts.bCPU.Seconds() / gb
	tdial, err := newClient(true, -1)
	if err != nil {
		return err
	}
	defer tdial.Close()
	tsp, err := smallPulls(cfg.SmallPulls, pullWith(tcl, info.TLSAddr, small, SmallSize), pullWith(tdial, info.TLSAddr, small, SmallSize))
	if err != nil {
		return err
	}
	res.SmallPullTLSPooledUS, res.SmallPullTLSDialUS = tsp.pooled.Seconds()*1e6, tsp.dial.Seconds()*1e6
	return nil
}

type smallStats struct {
	pooled, dial     time.Duration // median latency
	pooledPS, dialPS float64       // pulls per second
}

// smallPulls times n pulls each way, in alternating blocks (so that load from
// other processes hits both alike), after a few unmeasured ones of each.
func smallPulls(n int, pooled, dial func() (time.Duration, error)) (smallStats, error) {
	const block = 20
	for range 3 {
		for _, f := range []func() (time.Duration, error){pooled, dial} {
			if _, err := f(); err != nil {
				return smallStats{}, err
			}
		}
	}
	var ps, ds []time.Duration
	var pt, dt time.Duration
	for len(ps) < n {
		for _, side := range []struct {
			f   func() (time.Duration, error)
			out *[]time.Duration
			tot *time.Duration
		}{{pooled, &ps, &pt}, {dial, &ds, &dt}} {
			t0 := time.Now()
			for range min(block, n-len(*side.out)) {
				d, err := side.f()
				if err != nil {
					return smallStats{}, err
				}
				*side.out = append(*side.out, d)
			}
			*side.tot += time.Since(t0)
		}
	}
	slices.Sort(ps)
	slices.Sort(ds)
	return smallStats{pooled: ps[len(ps)/2], dial: ds[len(ds)/2],
		pooledPS: float64(len(ps)) / pt.Seconds(), dialPS: float64(len(ds)) / dt.Seconds()}, nil
}
