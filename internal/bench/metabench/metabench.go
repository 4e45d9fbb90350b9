package metabench

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/atoll-run/atoll/internal/devcert"
	"github.com/atoll-run/atoll/store/meta"
	"github.com/atoll-run/atoll/store/meta/metaserver"
)

// Config configures a run.
type Config struct {
	// Dir is where the WALs, the baseline's data and the fsync probe live (default
	// os.TempDir()).
	Dir string
	// Duration of the concurrent phase, per system (default 10 s).
	Duration time.Duration
	// Clients is the number of concurrent writers (default 64).
	Clients int
	// SeqWrites is the number of sequential writes timed for latency (default 2000).
	SeqWrites int
	// ValueSize in bytes (default 128).
	ValueSize int
	// TLS also measures the same group with mutual TLS on every link (replicas and the
	// HTTP client API), with a throwaway CA: atoll_tls and atoll_http_tls.
	TLS bool
	// Baseline, when set, measures another system on the same machine in the same run
	// (etcdbaseline.Run); BaselineName names it in the report.
	Baseline     Baseline
	BaselineName string
	// Logger receives progress (default zap.NewNop()).
	Logger *zap.Logger
}

// Baseline runs another system's three-member group in dir and measures it with Measure.
type Baseline func(ctx context.Context, cfg Config, dir string) (Stats, error)

// DefaultConfig returns the settings: 128 B values, 64 clients for 10 s.
func DefaultConfig() Config {
	return Config{Dir: os.TempDir(), Duration: 10 * time.Second, Clients: 64, SeqWrites: 2000, ValueSize: 128, Logger: zap.NewNop()}
}

// flags binds the config's command-line flags.
func (c *Config) flags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.DurationVar(&c.Duration, "duration", c.Duration, "length of the concurrent phase, per system")
	f.IntVar(&c.Clients, "clients", c.Clients, "concurrent writers (1..4096)")
	f.IntVar(&c.SeqWrites, "seq-writes", c.SeqWrites, "sequential writes timed for latency (10..1000000)")
	f.IntVar(&c.ValueSize, "value-size", c.ValueSize, "value size in bytes (1..1048576)")
	f.StringVar(&c.Dir, "dir", c.Dir, "a directory `DIR` for WALs, baseline data and the fsync probe (must be on the disk to measure)")
	f.BoolVar(&c.TLS, "tls", c.TLS, "also measure the group with mutual TLS on every link (throwaway CA), against the same group in clear")
}

// Validate checks the config against its documented bounds.
func (c Config) Validate() error {
	switch {
	case c.Duration <= 0 || c.Duration > 24*time.Hour:
		return fmt.Errorf("metabench: duration %v must be in (0, 24h]", c.Duration)
	case c.Clients < 1 || c.Clients > 4096:
		return fmt.Errorf("metabench: clients %d must be in [1, 4096]", c.Clients)
	case c.SeqWrites < 10 || c.SeqWrites > 1000000:
		return fmt.Errorf("metabench: seq writes %d must be in [10, 1000000]", c.SeqWrites)
	case c.ValueSize < 1 || c.ValueSize > 1<<20:
		return fmt.Errorf("metabench: value size %d must be in [1, 1048576]", c.ValueSize)
	}
	return nil
}

// Stats are one system's figures.
type Stats struct {
	P50us      float64 `json:"p50_us"`
	P99us      float64 `json:"p99_us"`
	P999us     float64 `json:"p999_us"`
	WritesPerS float64 `json:"writes_per_s"`
}

// Floor is what the hardware allows: one fsync of a small append (median, and its p99
// for context), one loopback round trip (median).
type Floor struct {
	FsyncUs    float64 `json:"fsync_us"`
	RTTUs      float64 `json:"rtt_us"`
	FsyncP99Us float64 `json:"fsync_p99_us"`
}

// Result is the whole run. Atoll is the path the head's own scheduler uses: the writer
// runs in the leader's process (metaserver.LocalConn), while the replicas talk over loopback TCP.
// AtollHTTP is the same cluster written through the head's HTTP client API on loopback,
// the path of an external client (comparable to etcd's gRPC clients). The TLS figures are
// the same two paths with mutual TLS on the replica links and the client API (Config.TLS);
// Baseline is the other system's (Config.Baseline).
type Result struct {
	Atoll        Stats  `json:"atoll"`
	AtollHTTP    Stats  `json:"atoll_http"`
	AtollTLS     *Stats `json:"atoll_tls,omitempty"`
	AtollHTTPTLS *Stats `json:"atoll_http_tls,omitempty"`
	Baseline     *Stats `json:"baseline,omitempty"`
	BaselineName string `json:"baseline_name,omitempty"`
	Floor        Floor  `json:"floor"`
}

// Writer writes one key; Measure times it.
type Writer func(ctx context.Context, key string, val []byte) error

// Run measures the floor, then Atoll (each path in clear, then over TLS when asked), then
// the baseline when there is one.
func Run(ctx context.Context, cfg Config) (Result, error) {
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.Dir == "" {
		cfg.Dir = os.TempDir()
	}
	if err := cfg.Validate(); err != nil {
		return Result{}, err
	}
	dir, err := os.MkdirTemp(cfg.Dir, "atoll-bench-meta-")
	if err != nil {
		return Result{}, fmt.Errorf("metabench: temp dir in %s: %w", cfg.Dir, err)
	}
	defer os.RemoveAll(dir)
	log := cfg.Logger
	var res Result
	if res.Floor.FsyncUs, res.Floor.FsyncP99Us, err = fsyncFloor(dir, cfg.ValueSize); err != nil {
		return res, err
	}
	if res.Floor.RTTUs, err = rttFloor(cfg.ValueSize); err != nil {
		return res, err
	}
	log.Info("floor", zap.Float64("fsync_us", res.Floor.FsyncUs), zap.Float64("rtt_us", res.Floor.RTTUs))
	var ca *devcert.CA
	if cfg.TLS {
		if ca, err = devcert.NewCA("atoll-bench-meta"); err != nil {
			return res, err
		}
	}
	for i, run := range []struct {
		name     string
		overHTTP bool
		tls      bool
		out      func(Stats)
	}{
		{"atoll (in-process writer at the leader)", false, false, func(s Stats) { res.Atoll = s }},
		{"atoll over mutual TLS", false, true, func(s Stats) { res.AtollTLS = &s }},
		{"atoll (HTTP client API on loopback)", true, false, func(s Stats) { res.AtollHTTP = s }},
		{"atoll HTTP client API over mutual TLS", true, true, func(s Stats) { res.AtollHTTPTLS = &s }},
	} {
		if run.tls && !cfg.TLS {
			continue
		}
		var runCA *devcert.CA
		if run.tls {
			runCA = ca
		}
		st, err := runAtoll(ctx, cfg, filepath.Join(dir, fmt.Sprintf("atoll-%d", i)), run.overHTTP, runCA)
		if err != nil {
			return res, fmt.Errorf("metabench: %s: %w", run.name, err)
		}
		run.out(st)
		log.Info(run.name, zap.Any("stats", st))
	}
	if cfg.Baseline != nil {
		st, err := cfg.Baseline(ctx, cfg, filepath.Join(dir, "baseline"))
		if err != nil {
			return res, fmt.Errorf("metabench: baseline %s: %w", cfg.BaselineName, err)
		}
		res.Baseline, res.BaselineName = &st, cfg.BaselineName
		log.Info(cfg.BaselineName, zap.Any("stats", st))
	}
	return res, nil
}

func pct(d []time.Duration, p float64) float64 {
	if len(d) == 0 {
		return 0
	}
	i := int(float64(len(d)) * p)
	if i >= len(d) {
		i = len(d) - 1
	}
	return float64(d[i].Nanoseconds()) / 1e3
}

// Measure times cfg.SeqWrites sequential writes (after 50 to warm up), then counts the
// writes cfg.Clients concurrent writers complete in cfg.Duration. Keys are "warm/N",
// "seq/N" and "conc/C/N" (a writer may put them in its own namespace).
func Measure(ctx context.Context, cfg Config, w Writer) (Stats, error) {
	val := make([]byte, cfg.ValueSize)
	for i := range val {
		val[i] = byte('a' + i%26)
	}
	// warm up
	for i := 0; i < 50; i++ {
		if err := w(ctx, fmt.Sprintf("warm/%d", i), val); err != nil {
			return Stats{}, err
		}
	}
	lat := make([]time.Duration, 0, cfg.SeqWrites)
	for i := 0; i < cfg.SeqWrites; i++ {
		t0 := time.Now()
		if err := w(ctx, fmt.Sprintf("seq/%d", i), val); err != nil {
			return Stats{}, err
		}
		lat = append(lat, time.Since(t0))
	}
	slices.Sort(lat)
	st := Stats{P50us: pct(lat, 0.50), P99us: pct(lat, 0.99), P999us: pct(lat, 0.999)}
	var n, failed atomic.Int64
	var firstErr atomic.Value
	cctx, cancel := context.WithTimeout(ctx, cfg.Duration)
	defer cancel()
	var wg sync.WaitGroup
	start := time.Now()
	for c := 0; c < cfg.Clients; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			for i := 0; cctx.Err() == nil; i++ {
				if err := w(cctx, fmt.Sprintf("conc/%d/%d", c, i), val); err != nil {
					if cctx.Err() == nil {
						// A timed-out write is counted as failed, not as done, and retried.
						firstErr.CompareAndSwap(nil, err)
						failed.Add(1)
					}
					continue
				}
				n.Add(1)
			}
		}(c)
	}
	wg.Wait()
	if err, ok := firstErr.Load().(error); ok && err != nil {
		cfg.Logger.Warn("writes failed during the concurrent phase (not counted)", zap.Int64("failed", failed.Load()), zap.Error(err))
	}
	st.WritesPerS = float64(n.Load()) / time.Since(start).Seconds()
	return st, nil
}

func fsyncFloor(dir string, size int) (float64, float64, error) {
	f, err := os.Create(filepath.Join(dir, "fsync-probe"))
	if err != nil {
		return 0, 0, fmt.Errorf("metabench: fsync probe: %w", err)
	}
	defer f.Close()
	buf := make([]byte, size)
	var lat []time.Duration
	for i := 0; i < 1000; i++ {
		t0 := time.Now()
		if _, err := f.Write(buf); err != nil {
			return 0, 0, fmt.Errorf("metabench: fsync probe write: %w", err)
		}
		if err := f.Sync(); err != nil {
			return 0, 0, fmt.Errorf("metabench: fsync probe sync: %w", err)
		}
		lat = append(lat, time.Since(t0))
	}
	slices.Sort(lat)
	return pct(lat, 0.5), pct(lat, 0.99), nil
}

func rttFloor(size int) (float64, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("metabench: rtt listen: %w", err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.Copy(c, c)
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		return 0, fmt.Errorf("metabench: rtt dial: %w", err)
	}
	defer c.Close()
	buf := make([]byte, size)
	var lat []time.Duration
	for i := 0; i < 3000; i++ {
		t0 := time.Now()
		if _, err := c.Write(buf); err != nil {
			return 0, err
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			return 0, err
		}
		lat = append(lat, time.Since(t0))
	}
	slices.Sort(lat)
	return pct(lat, 0.5), nil
}

// runAtoll starts three replicas talking over loopback TCP with fsync'd WALs and writes
// through meta.Client: in process (LocalConn), or over the head's HTTP client API; with
// ca set, every link is mutual TLS with certificates of ca.
func runAtoll(ctx context.Context, cfg Config, dir string, overHTTP bool, ca *devcert.CA) (Stats, error) {
	cc := metaserver.DefaultClusterConfig()
	cc.Dir = dir
	cc.TCP = true
	cc.Logger = cfg.Logger.Named("atoll")
	var headTLS, clientTLS *tls.Config
	if ca != nil {
		var err error
		if headTLS, err = ca.MutualConfig("head", "127.0.0.1"); err != nil {
			return Stats{}, err
		}
		if clientTLS, err = ca.MutualConfig("bench-client"); err != nil {
			return Stats{}, err
		}
		cc.TLS = headTLS
	}
	cl, err := metaserver.StartCluster(cc)
	if err != nil {
		return Stats{}, err
	}
	defer cl.Close()
	const token = "bench-token"
	conns := cl.Conns()
	if overHTTP {
		conns = map[uint64]meta.Conn{}
		hc := meta.NewHTTPClient(clientTLS, 4*cfg.Clients)
		for id, r := range cl.Replicas {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				return Stats{}, err
			}
			srv := metaserver.NewHTTPServer(&metaserver.Handler{Replica: r, SM: cl.SMs[id], Token: token, Logger: cfg.Logger}, headTLS)
			scheme := "http"
			if headTLS != nil {
				scheme = "https"
				go srv.ServeTLS(ln, "", "")
			} else {
				go srv.Serve(ln)
			}
			defer srv.Close()
			conns[id] = meta.HTTPConn{BaseURL: scheme + "://" + ln.Addr().String(), Token: token, HTTP: hc}
		}
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := cl.WaitLeader(wctx); err != nil {
		return Stats{}, err
	}
	ccfg := meta.DefaultClientConfig()
	ccfg.AttemptTimeout = 5 * time.Second
	client, err := meta.NewClient(ccfg, conns)
	if err != nil {
		return Stats{}, err
	}
	return Measure(ctx, cfg, func(ctx context.Context, key string, val []byte) error {
		_, err := client.Put(ctx, meta.TableObjects.Key(key), val) // every key is in a table
		return err
	})
}
