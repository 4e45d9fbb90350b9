package metabench

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/atoll-run/atoll/store/meta"
)

// Config configures a run.
type Config struct {
	// Dir is where the WALs, etcd data and the fsync probe live (default os.TempDir()).
	Dir string
	// Duration of the concurrent phase, per system (default 10 s).
	Duration time.Duration
	// Clients is the number of concurrent writers (default 64).
	Clients int
	// SeqWrites is the number of sequential writes timed for latency (default 2000).
	SeqWrites int
	// ValueSize in bytes (default 128).
	ValueSize int
	// Logger receives progress (default zap.NewNop()).
	Logger *zap.Logger
}

// DefaultConfig returns the settings: 128 B values, 64 clients for 10 s.
func DefaultConfig() Config {
	return Config{Dir: os.TempDir(), Duration: 10 * time.Second, Clients: 64, SeqWrites: 2000, ValueSize: 128, Logger: zap.NewNop()}
}

// Validate checks the config.
func (c Config) Validate() error {
	if c.Duration <= 0 || c.Clients < 1 || c.SeqWrites < 10 || c.ValueSize < 1 {
		return fmt.Errorf("metabench: config: duration %v, clients %d, seq writes %d (>= 10), value size %d must be positive",
			c.Duration, c.Clients, c.SeqWrites, c.ValueSize)
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
// runs in the leader's process (meta.LocalConn), while the replicas talk over loopback TCP.
// AtollHTTP is the same cluster written through the head's HTTP client API on loopback,
// the path of an external client (comparable to etcd's gRPC clients).
type Result struct {
	Atoll     Stats `json:"atoll"`
	AtollHTTP Stats `json:"atoll_http"`
	Etcd      Stats `json:"etcd"`
	Floor     Floor `json:"floor"`
}

type writer func(ctx context.Context, key string, val []byte) error

// Run measures the floor, then Atoll, then etcd.
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
	if res.Atoll, err = runAtoll(ctx, cfg, filepath.Join(dir, "atoll"), false); err != nil {
		return res, err
	}
	log.Info("atoll (in-process writer at the leader)", zap.Any("stats", res.Atoll))
	if res.AtollHTTP, err = runAtoll(ctx, cfg, filepath.Join(dir, "atoll-http"), true); err != nil {
		return res, err
	}
	log.Info("atoll (HTTP client API on loopback)", zap.Any("stats", res.AtollHTTP))
	if res.Etcd, err = runEtcd(ctx, cfg, filepath.Join(dir, "etcd")); err != nil {
		return res, err
	}
	log.Info("etcd", zap.Any("stats", res.Etcd))
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

func measure(ctx context.Context, cfg Config, w writer) (Stats, error) {
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
// through meta.Client: in process (LocalConn), or over the head's HTTP client API.
func runAtoll(ctx context.Context, cfg Config, dir string, overHTTP bool) (Stats, error) {
	cc := meta.DefaultClusterConfig()
	cc.Dir = dir
	cc.TCP = true
	cc.Logger = cfg.Logger.Named("atoll")
	cl, err := meta.StartCluster(cc)
	if err != nil {
		return Stats{}, err
	}
	defer cl.Close()
	const token = "bench-token"
	conns := map[uint64]meta.Conn{}
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4 * cfg.Clients, MaxConnsPerHost: 0}}
	for id, r := range cl.Replicas {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return Stats{}, err
		}
		srv := &http.Server{Handler: &meta.Handler{Replica: r, SM: cl.SMs[id], Token: token, Logger: cfg.Logger}}
		go srv.Serve(ln)
		defer srv.Close()
		conns[id] = meta.HTTPConn{BaseURL: "http://" + ln.Addr().String(), Token: token, HTTP: hc}
	}
	if !overHTTP {
		conns = cl.Conns()
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
	return measure(ctx, cfg, func(ctx context.Context, key string, val []byte) error {
		_, err := client.Put(ctx, key, val)
		return err
	})
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// runEtcd starts an embedded three-member etcd cluster with its defaults (fsync on) on
// loopback and writes through clientv3.
func runEtcd(ctx context.Context, cfg Config, dir string) (Stats, error) {
	type member struct {
		name         string
		peer, client url.URL
	}
	var ms []member
	initial := ""
	for i := 1; i <= 3; i++ {
		pp, err := freePort()
		if err != nil {
			return Stats{}, err
		}
		cp, err := freePort()
		if err != nil {
			return Stats{}, err
		}
		m := member{name: fmt.Sprintf("e%d", i)}
		m.peer = url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", pp)}
		m.client = url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", cp)}
		ms = append(ms, m)
		if initial != "" {
			initial += ","
		}
		initial += m.name + "=" + m.peer.String()
	}
	var servers []*embed.Etcd
	defer func() {
		for _, e := range servers {
			e.Close()
		}
	}()
	for _, m := range ms {
		ec := embed.NewConfig()
		ec.Name = m.name
		ec.Dir = filepath.Join(dir, m.name)
		ec.ListenPeerUrls = []url.URL{m.peer}
		ec.AdvertisePeerUrls = []url.URL{m.peer}
		ec.ListenClientUrls = []url.URL{m.client}
		ec.AdvertiseClientUrls = []url.URL{m.client}
		ec.InitialCluster = initial
		ec.InitialClusterToken = "atoll-bench"
		ec.ClusterState = embed.ClusterStateFlagNew
		ec.LogLevel = "error"
		e, err := embed.StartEtcd(ec)
		if err != nil {
			return Stats{}, fmt.Errorf("metabench: start etcd %s: %w", m.name, err)
		}
		servers = append(servers, e)
	}
	for _, e := range servers {
		select {
		case <-e.Server.ReadyNotify():
		case <-time.After(60 * time.Second):
			return Stats{}, fmt.Errorf("metabench: etcd not ready after 60s")
		case <-ctx.Done():
			return Stats{}, ctx.Err()
		}
	}
	var eps []string
	for _, m := range ms {
		eps = append(eps, m.client.String())
	}
	// One client per 8 writers, as etcd's own benchmark tool shares connections.
	nc := max(1, cfg.Clients/8)
	var clients []*clientv3.Client
	for i := 0; i < nc; i++ {
		c, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			return Stats{}, fmt.Errorf("metabench: etcd client: %w", err)
		}
		defer c.Close()
		clients = append(clients, c)
	}
	var rr atomic.Uint64
	return measure(ctx, cfg, func(ctx context.Context, key string, val []byte) error {
		c := clients[int(rr.Add(1))%len(clients)]
		_, err := c.Put(ctx, key, string(val))
		return err
	})
}
