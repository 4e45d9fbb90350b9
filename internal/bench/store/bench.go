package store

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"time"
	"unsafe"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/atoll-run/atoll/store/object"
	"github.com/atoll-run/atoll/store/transfer"
)

// Config tunes a run.
type Config struct {
	// MinSize and MaxSize bound the object sizes (powers of 4 from MinSize). Default 1 MiB .. 1 GiB.
	MinSize, MaxSize int64
	// BytesPerSize is how many bytes each size moves per method, over all rounds (at
	// least 2 objects a round). Default 512 MiB.
	BytesPerSize int64
	// PullSize is the object pulled between processes. Default MaxSize.
	PullSize int64
	// Rounds: each size is measured this many times, methods interleaved; the best
	// round of each method counts. Default 3.
	Rounds int
	// PullRuns: this many pairs of a bare TCP copy and a pull run back to back
	// (after one unmeasured warm-up of each); pull_gbps and tcp_gbps are the
	// medians and pull_ratio the median pair ratio. Default 7.
	PullRuns int
	// ReadPairs is how many back-to-back pairs (plain read, get+read, in
	// alternating order) each size's read comparison times; the median pair ratio
	// counts. Default 15.
	ReadPairs int
	// SmallCount is the number of 1 KiB objects. Default 50000.
	SmallCount int
	// ServeCmd starts the serving process, which reads a ServeConfig line (the
	// token among it) from its stdin: nothing secret is on its command line.
	ServeCmd []string
	// ServeEnv is added to the serving process's environment.
	ServeEnv []string
	// Streams and Depth set the puller's connections and reads in flight per
	// connection (0: the transfer defaults).
	Streams, Depth int
	// Sendfile makes the serving process send chunks with sendfile(2).
	Sendfile bool
	// TLS also measures pulls over mutual TLS (a throwaway CA, certificates for
	// both sides), paired with plain pulls in the same run.
	TLS bool
	// SmallPulls is how many pulls of a SmallSize object are timed with pooled
	// connections and as many with a client that dials every pull, in
	// alternating blocks. Default 400.
	SmallPulls int
	// Dir holds the local store; default a temporary directory.
	Dir string
	// CkptBytes is the size of the checkpoint whose commit is timed, in CkptParts
	// parts, over CkptRuns pairs of a one-copy and a two-copy commit (alternating
	// order) and as many sends. Default 1 GiB in 8 parts, 3 runs; CkptRuns 0 skips it.
	CkptBytes int64
	CkptParts int
	CkptRuns  int
}

// DefaultConfig returns the sizes the issue names.
func DefaultConfig() Config {
	return Config{MinSize: 1 << 20, MaxSize: 1 << 30, BytesPerSize: 512 << 20, Rounds: 3, PullRuns: 7, ReadPairs: 15, SmallCount: 50000,
		SmallPulls: 400, CkptBytes: 1 << 30, CkptParts: 8, CkptRuns: 3}
}

// Validate reports the first bad field.
func (c Config) Validate() error {
	switch {
	case c.MinSize < 4096 || c.MaxSize < c.MinSize:
		return fmt.Errorf("benchstore: sizes %d..%d: want 4096 <= min <= max", c.MinSize, c.MaxSize)
	case c.BytesPerSize <= 0 || c.Rounds < 1 || c.PullRuns < 1 || c.SmallCount < 1 || c.ReadPairs < 1 || c.SmallPulls < 1:
		return fmt.Errorf("benchstore: BytesPerSize, Rounds, PullRuns, ReadPairs, SmallCount and SmallPulls must be positive")
	case c.PullSize < 0 || c.PullSize > 1<<40:
		return fmt.Errorf("benchstore: PullSize %d outside 0..2^40", c.PullSize)
	case c.MaxSize > 1<<40:
		return fmt.Errorf("benchstore: MaxSize %d above 2^40", c.MaxSize)
	case c.Streams < 0 || c.Depth < 0:
		return fmt.Errorf("benchstore: Streams %d and Depth %d must not be negative", c.Streams, c.Depth)
	case len(c.ServeCmd) == 0:
		return fmt.Errorf("benchstore: ServeCmd is empty")
	case c.CkptRuns < 0 || (c.CkptRuns > 0 && (c.CkptParts < 1 || c.CkptBytes < int64(c.CkptParts)*4096 || c.CkptBytes > 1<<40)):
		return fmt.Errorf("benchstore: checkpoint of %d bytes in %d parts over %d runs: want at least 4096 bytes a part, at most 2^40 in all",
			c.CkptBytes, c.CkptParts, c.CkptRuns)
	}
	return nil
}

// SizeResult is one size's figures.
type SizeResult struct {
	Size           int64   `json:"size"`
	MemcpyGBps     float64 `json:"memcpy_gbps"`
	PutGBps        float64 `json:"put_gbps"`
	MemcpyColdGBps float64 `json:"memcpy_cold_gbps"`
	PutColdGBps    float64 `json:"put_cold_gbps"`
	// PlainReadS and GetReadS are the median times of one sample (ReadsPerSample
	// reads of every byte) of the plain buffer and of get+read+release.
	PlainReadS float64 `json:"plain_read_s"`
	GetReadS   float64 `json:"get_read_s"`
	// GetReadRatio is the median over pairs of plain time / get time, each pair
	// timed back to back; Lo and Hi are the pairs' quartiles.
	GetReadRatio   float64 `json:"get_read_ratio"`
	GetReadRatioLo float64 `json:"get_read_ratio_q1"`
	GetReadRatioHi float64 `json:"get_read_ratio_q3"`
	ReadsPerSample int     `json:"reads_per_sample"`
}

// Result is what `atoll bench store --json` prints.
type Result struct {
	MemcpyGBps     float64 `json:"memcpy_gbps"`
	PutGBps        float64 `json:"put_gbps"`
	PutMemcpyRatio float64 `json:"put_memcpy_ratio"`
	MemcpyColdGBps float64 `json:"memcpy_cold_gbps"`
	PutColdGBps    float64 `json:"put_cold_gbps"`
	PutColdRatio   float64 `json:"put_cold_ratio"`
	GetReadRatio   float64 `json:"get_read_ratio"`
	GetReadPairs   int     `json:"get_read_pairs"`
	PullGBps       float64 `json:"pull_gbps"`
	TCPGBps        float64 `json:"tcp_gbps"`
	PullRatio      float64 `json:"pull_ratio"`
	PullRatioLo    float64 `json:"pull_ratio_q1"`
	PullRatioHi    float64 `json:"pull_ratio_q3"`
	PullBestGBps   float64 `json:"pull_best_gbps"`
	TCPBestGBps    float64 `json:"tcp_best_gbps"`
	PullFirstGBps  float64 `json:"pull_first_gbps"`
	// TCPCPUPerGB and PullCPUPerGB are the receiving process's CPU seconds per GB
	// (user + system, all threads): what each costs, independent of how much CPU
	// other processes leave it.
	TCPCPUPerGB  float64 `json:"tcp_cpu_s_per_gb"`
	PullCPUPerGB float64 `json:"pull_cpu_s_per_gb"`
	PullRuns     int     `json:"pull_runs"`
	PullBytes    int64   `json:"pull_bytes"`
	// Small pulls (SmallSize bytes): median latency of one pull (and release)
	// with pooled connections and with a client that dials every pull, pulls
	// per second each, and dial median / pooled median.
	SmallPullBytes     int64   `json:"small_pull_bytes"`
	SmallPulls         int     `json:"small_pulls"`
	SmallPullPooledUS  float64 `json:"small_pull_pooled_us"`
	SmallPullDialUS    float64 `json:"small_pull_dial_us"`
	SmallPullsPooledPS float64 `json:"small_pulls_pooled_per_s"`
	SmallPullsDialPS   float64 `json:"small_pulls_dial_per_s"`
	SmallPullSpeedup   float64 `json:"small_pull_speedup"`
	TLS                bool    `json:"tls"`
	PullTLSGBps        float64 `json:"pull_tls_gbps,omitempty"`
	PullPlainGBps      float64 `json:"pull_plain_gbps,omitempty"` // the plain pulls paired with the TLS ones
	// TLSRatio is the median over back-to-back pairs of plain pull time / TLS
	// pull time: TLS throughput relative to plain.
	TLSRatio             float64 `json:"tls_ratio,omitempty"`
	TLSRatioLo           float64 `json:"tls_ratio_q1,omitempty"`
	TLSRatioHi           float64 `json:"tls_ratio_q3,omitempty"`
	PullTLSCPUPerGB      float64 `json:"pull_tls_cpu_s_per_gb,omitempty"`
	SmallPullTLSPooledUS float64 `json:"small_pull_tls_pooled_us,omitempty"`
	SmallPullTLSDialUS   float64 `json:"small_pull_tls_dial_us,omitempty"`
	// The checkpoint commit (h): CkptBytes in CkptParts parts; the medians over CkptRuns of
	// a commit with one durable copy (every part persisted and fsync'd by this process's
	// store), with two (the same while a second process pulls every part over loopback
	// and persists it), and of sending the parts once (the second process pulls them
	// without persisting); CkptSecondCopyS is the median over pairs of two-copy minus
	// one-copy time, the cost of the second copy, and CkptSecondCopyVsSend that over the
	// send time (target < 1). CkptPersistGBps is the one-copy commit's bytes per second.
	CkptBytes            int64               `json:"ckpt_bytes,omitempty"`
	CkptParts            int                 `json:"ckpt_parts,omitempty"`
	CkptRuns             int                 `json:"ckpt_runs,omitempty"`
	CkptCommit1S         float64             `json:"ckpt_commit_1copy_s,omitempty"`
	CkptCommit2S         float64             `json:"ckpt_commit_2copy_s,omitempty"`
	CkptSendS            float64             `json:"ckpt_send_s,omitempty"`
	CkptSecondCopyS      float64             `json:"ckpt_second_copy_s,omitempty"`
	CkptSecondCopyVsSend float64             `json:"ckpt_second_copy_vs_send,omitempty"`
	CkptPersistGBps      float64             `json:"ckpt_persist_gbps,omitempty"`
	SmallPutsPerS        float64             `json:"small_puts_per_s"`
	SmallGetsPerS        float64             `json:"small_gets_per_s"`
	Sizes                []SizeResult        `json:"sizes"`
	Targets              map[string]float64  `json:"targets"`
	Met                  map[string]bool     `json:"met"`
	RDMA                 transfer.RDMAReport `json:"rdma"`
	CPUs                 int                 `json:"cpus"`
}

func gbps(bytes int64, d time.Duration) float64 { return float64(bytes) / d.Seconds() / 1e9 }

// Run runs the whole benchmark.
func Run(ctx context.Context, cfg Config, log *zap.Logger) (Result, error) {
	if err := cfg.Validate(); err != nil {
		return Result{}, err
	}
	if cfg.PullSize == 0 {
		cfg.PullSize = cfg.MaxSize
	}
	if log == nil {
		log = zap.NewNop()
	}
	dir := cfg.Dir
	if dir == "" {
		d, err := os.MkdirTemp("", "atoll-bench-store")
		if err != nil {
			return Result{}, err
		}
		defer os.RemoveAll(d)
		dir = d
	}
	res := Result{RDMA: transfer.DetectRDMA(), CPUs: runtime.NumCPU(),
		Targets: map[string]float64{"put_memcpy_ratio": 0.7, "get_read_ratio": 0.9, "pull_ratio": 0.8, "small_puts_per_s": 50000}}

	scfg := object.DefaultConfig()
	scfg.Capacity = max(2*cfg.MaxSize, 2*cfg.PullSize, 2*cfg.CkptBytes, 256<<20)
	st, err := object.Open(scfg, dir)
	if err != nil {
		return res, err
	}
	defer st.Close()

	var memB, putB, coldB int64
	var logRatio float64
	var memT, putT, memColdT, putColdT time.Duration
	for size := cfg.MinSize; size <= cfg.MaxSize; size *= 4 {
		log.Info("sizes", zap.Int64("size", size))
		reps := int(max(2, cfg.BytesPerSize/size/int64(cfg.Rounds)))
		src := pattern(int(size))
		dst := make([]byte, size)
		copy(dst, src) // fault the pages in: memcpy is measured into touched memory
		// Cold: into memory never touched before — fresh anonymous pages for
		// memcpy, a store that has never held an object of this size for put.
		mc, pc, err := coldPair(ctx, st, src)
		if err != nil {
			return res, err
		}
		// The object (c) reads, put first so that it does not take the memory the
		// warm-up put below leaves in the recycle pool.
		readID, err := st.Put(ctx, "bench", src)
		if err != nil {
			return res, err
		}
		// (b) put, steady state: each object is freed after its put, so the next
		// put reuses its recycled shared memory, as a training loop putting
		// same-sized gradients does. One unmeasured put first warms the pool.
		if id, err := st.Put(ctx, "bench", src); err == nil {
			_ = st.Release(ctx, id, "bench")
		}
		// Each round times every method once, in turn; the best round of each
		// counts, so a burst of load from other processes hits one round, not
		// one method.
		var mt, pt time.Duration
		best := func(cur *time.Duration, d time.Duration) {
			if *cur == 0 || d < *cur {
				*cur = d
			}
		}
		var sink uint64
		for range cfg.Rounds {
			t0 := time.Now()
			for range reps {
				copy(dst, src)
			}
			best(&mt, time.Since(t0))
			t0 = time.Now()
			for range reps {
				id, err := st.Put(ctx, "bench", src)
				if err != nil {
					return res, fmt.Errorf("benchstore: put %d bytes: %w", size, err)
				}
				if err := st.Release(ctx, id, "bench"); err != nil {
					return res, err
				}
			}
			best(&pt, time.Since(t0))
		}
		// (c) get and read every byte vs reading the plain buffer, in pairs.
		rr := measureRead(ctx, st, readID, dst, cfg.ReadPairs, &sink)
		if rr.err != nil {
			return res, rr.err
		}
		_ = st.Release(ctx, readID, "bench")
		if sink == 1 {
			fmt.Fprint(io.Discard, sink)
		}
		tot := int64(reps) * size
		memB += tot
		putB += tot
		memT += mt
		putT += pt
		coldB += size
		memColdT += mc
		putColdT += pc
		logRatio += math.Log(rr.ratio)
		res.Sizes = append(res.Sizes, SizeResult{Size: size, MemcpyGBps: gbps(tot, mt), PutGBps: gbps(tot, pt),
			MemcpyColdGBps: gbps(size, mc), PutColdGBps: gbps(size, pc),
			PlainReadS: rr.plain.Seconds(), GetReadS: rr.get.Seconds(), GetReadRatio: rr.ratio,
			GetReadRatioLo: rr.lo, GetReadRatioHi: rr.hi, ReadsPerSample: rr.reps})
	}
	res.MemcpyGBps = gbps(memB, memT)
	res.PutGBps = gbps(putB, putT)
	res.PutMemcpyRatio = res.PutGBps / res.MemcpyGBps
	res.MemcpyColdGBps = gbps(coldB, memColdT)
	res.PutColdGBps = gbps(coldB, putColdT)
	res.PutColdRatio = res.PutColdGBps / res.MemcpyColdGBps
	res.GetReadRatio = math.Exp(logRatio / float64(len(res.Sizes)))
	res.GetReadPairs = cfg.ReadPairs

	if err := runPull(ctx, cfg, st, &res, log); err != nil {
		return res, err
	}
	if err := runSmall(ctx, cfg, st, &res); err != nil {
		return res, err
	}
	res.Met = map[string]bool{
		"put_memcpy_ratio": res.PutMemcpyRatio >= 0.7,
		"get_read_ratio":   res.GetReadRatio >= 0.9,
		"pull_ratio":       res.PullRatio >= 0.8,
		"small_puts_per_s": res.SmallPutsPerS >= 50000,
	}
	if cfg.CkptRuns > 0 {
		if err := runCheckpoint(ctx, cfg, st, &res, log); err != nil {
			return res, err
		}
		res.Targets["ckpt_second_copy_vs_send"] = 1
		res.Met["ckpt_second_copy_vs_send"] = res.CkptSecondCopyVsSend < 1
	}
	return res, nil
}

type readResult struct {
	plain, get    time.Duration // median sample times
	ratio, lo, hi float64       // median and quartiles of plain/get over pairs
	reps          int
	err           error
}

// readSample is how many bytes one timed sample reads at least: long enough that
// timer and scheduling granularity do not matter, short enough that a burst of
// load from other processes hits both halves of a pair alike.
const readSample = 64 << 20

// measureRead compares reading every byte of the plain buffer with getting the
// object (a view over the store's mapping), reading every byte, and releasing the
// view. Both sides are read once first, so both sets of pages and page-table
// entries are warm; then pairs of samples are timed back to back, in alternating
// order, and the median of the pairs' ratios counts: a pair's halves run under
// the same load, so the ratio is robust where best-of-N absolute times are not.
func measureRead(ctx context.Context, st *object.Store, id object.ID, plain []byte, n int, sink *uint64) readResult {
	size := len(plain)
	reps := max(1, readSample/size)
	getRead := func() error {
		for range reps {
			v, err := st.Get(ctx, id)
			if err != nil {
				return err
			}
			*sink += sum(v.Bytes())
			v.Release()
		}
		return nil
	}
	plainRead := func() {
		for range reps {
			*sink += sum(plain)
		}
	}
	plainRead()
	if err := getRead(); err != nil {
		return readResult{err: err}
	}
	ps, err := pairs(n,
		func() (time.Duration, error) { t0 := time.Now(); plainRead(); return time.Since(t0), nil },
		func() (time.Duration, error) { t0 := time.Now(); err := getRead(); return time.Since(t0), err })
	if err != nil {
		return readResult{err: err}
	}
	return readResult{plain: ps.a, get: ps.b, ratio: ps.ratio, lo: ps.lo, hi: ps.hi, reps: reps}
}

// coldPair times one memcpy into fresh anonymous memory and one put into a fresh
// store (its own directory, so no recycled memory).
func coldPair(ctx context.Context, like *object.Store, src []byte) (memcpy, put time.Duration, err error) {
	t0 := time.Now()
	dst, err := unix.Mmap(-1, 0, len(src), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return 0, 0, err
	}
	copy(dst, src)
	memcpy = time.Since(t0)
	_ = unix.Munmap(dst)
	dir, err := os.MkdirTemp("", "atoll-bench-cold")
	if err != nil {
		return 0, 0, err
	}
	defer os.RemoveAll(dir)
	cfg := object.DefaultConfig()
	cfg.Capacity = like.Capacity()
	st, err := object.Open(cfg, dir)
	if err != nil {
		return 0, 0, err
	}
	defer st.Close()
	t0 = time.Now()
	if _, err := st.Put(ctx, "bench", src); err != nil {
		return 0, 0, err
	}
	return memcpy, time.Since(t0), nil
}

// sum reads every byte of b (as 64-bit words).
func sum(b []byte) uint64 {
	if len(b) < 8 {
		return 0
	}
	w := unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/8)
	var s0, s1, s2, s3 uint64
	i := 0
	for ; i+4 <= len(w); i += 4 {
		s0 += w[i]
		s1 += w[i+1]
		s2 += w[i+2]
		s3 += w[i+3]
	}
	for ; i < len(w); i++ {
		s0 += w[i]
	}
	return s0 + s1 + s2 + s3
}

// cpuTime is the CPU time (user and system) this process has used.
func cpuTime() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func runSmall(ctx context.Context, cfg Config, st *object.Store, res *Result) error {
	b := pattern(1024)
	ids := make([]object.ID, cfg.SmallCount)
	t0 := time.Now()
	for i := range ids {
		id, err := st.Put(ctx, "bench", b)
		if err != nil {
			return fmt.Errorf("benchstore: small put %d: %w", i, err)
		}
		ids[i] = id
	}
	res.SmallPutsPerS = float64(len(ids)) / time.Since(t0).Seconds()
	t0 = time.Now()
	for _, id := range ids {
		v, err := st.Get(ctx, id)
		if err != nil {
			return err
		}
		v.Release()
	}
	res.SmallGetsPerS = float64(len(ids)) / time.Since(t0).Seconds()
	for _, id := range ids {
		_ = st.Release(ctx, id, "bench")
	}
	return nil
}
