package actors

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

// BenchConfig configures BenchCalls.
type BenchConfig struct {
	// Duration of each measured run. Default 1 s.
	Duration time.Duration
	// Rounds: each path is measured this many times, interleaved, and the median round kept.
	// Default 3.
	Rounds int
	// Pairs are the sender/actor counts measured (each sender calls its own actor). Default
	// {1, 8}.
	Pairs []int
}

// BenchCase is one measured workload on one path.
type BenchCase struct {
	Path       string  `json:"path"` // "atoll" or "protoactor"
	Pairs      int     `json:"pairs"`
	CallsPerS  float64 `json:"calls_per_s"`
	P50Micros  float64 `json:"p50_us"`
	P99Micros  float64 `json:"p99_us"`
	TotalCalls int     `json:"calls"`
}

// BenchReport is BenchCalls' result.
type BenchReport struct {
	Cases []BenchCase `json:"cases"`
}

// benchEcho answers every call with its message.
type benchEcho struct{}

func (benchEcho) Receive(_ *Context, msg any) (any, error) { return msg, nil }

// bareEcho is the same actor written directly against protoactor-go.
type bareEcho struct{}

func (bareEcho) Receive(c actor.Context) {
	if m, ok := c.Message().(int); ok {
		c.Respond(m)
	}
}

// BenchCalls measures request/response calls through Atoll's call path (Call on a Handler)
// and through bare protoactor-go (RequestFuture on an actor that Responds), with the same
// small message and the same sender/actor counts, in one run.
func BenchCalls(ctx context.Context, cfg BenchConfig) (BenchReport, error) {
	if cfg.Duration == 0 {
		cfg.Duration = time.Second
	}
	if cfg.Rounds == 0 {
		cfg.Rounds = 3
	}
	if len(cfg.Pairs) == 0 {
		cfg.Pairs = []int{1, 8}
	}
	if cfg.Duration < 0 || cfg.Rounds < 0 {
		return BenchReport{}, fmt.Errorf("actors: bench duration %v and rounds %d must be positive", cfg.Duration, cfg.Rounds)
	}
	s, err := NewSystem(Config{})
	if err != nil {
		return BenchReport{}, err
	}
	defer func() { _ = s.Shutdown(context.WithoutCancel(ctx)) }()
	if err := s.Register("bench-echo", func() Handler { return benchEcho{} }); err != nil {
		return BenchReport{}, err
	}
	var rep BenchReport
	for _, pairs := range cfg.Pairs {
		atollRefs := make([]Ref, pairs)
		barePIDs := make([]*actor.PID, pairs)
		for i := range atollRefs {
			if atollRefs[i], err = s.Spawn("bench-echo", ""); err != nil {
				return rep, err
			}
			barePIDs[i] = s.sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return bareEcho{} }))
		}
		atollCall := func(i, n int) error {
			v, err := Call[int](ctx, s, atollRefs[i], n)
			if err == nil && v != n {
				err = fmt.Errorf("echo %d returned %d", n, v)
			}
			return err
		}
		bareCall := func(i, n int) error {
			v, err := s.sys.Root.RequestFuture(barePIDs[i], n, DefaultCallTimeout).Result()
			if err == nil && v != n {
				err = fmt.Errorf("echo %d returned %v", n, v)
			}
			return err
		}
		var atollRuns, bareRuns []BenchCase
		for r := 0; r < cfg.Rounds; r++ {
			for _, p := range []struct {
				name string
				call func(i, n int) error
				out  *[]BenchCase
			}{{"atoll", atollCall, &atollRuns}, {"protoactor", bareCall, &bareRuns}} {
				c, err := runBench(ctx, p.name, pairs, cfg.Duration, p.call)
				if err != nil {
					return rep, err
				}
				*p.out = append(*p.out, c)
			}
		}
		rep.Cases = append(rep.Cases, median(atollRuns), median(bareRuns))
	}
	return rep, nil
}

func median(cs []BenchCase) BenchCase {
	slices.SortFunc(cs, func(a, b BenchCase) int {
		switch {
		case a.CallsPerS < b.CallsPerS:
			return -1
		case a.CallsPerS > b.CallsPerS:
			return 1
		}
		return 0
	})
	return cs[len(cs)/2]
}

func runBench(ctx context.Context, path string, pairs int, d time.Duration, call func(i, n int) error) (BenchCase, error) {
	// Warm up.
	for i := 0; i < pairs; i++ {
		for n := 0; n < 1000; n++ {
			if err := call(i, n); err != nil {
				return BenchCase{}, err
			}
		}
	}
	lat := make([][]time.Duration, pairs)
	errs := make([]error, pairs)
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(d)
	for i := 0; i < pairs; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			l := make([]time.Duration, 0, 1<<16)
			for n := 0; ; n++ {
				t0 := time.Now()
				if t0.After(deadline) || ctx.Err() != nil {
					break
				}
				if err := call(i, n); err != nil {
					errs[i] = err
					return
				}
				l = append(l, time.Since(t0))
			}
			lat[i] = l
		}(i)
	}
	wg.Wait()
	elapsed := time.Since(start)
	var all []time.Duration
	for i := range lat {
		if errs[i] != nil {
			return BenchCase{}, fmt.Errorf("actors: bench %s: %w", path, errs[i])
		}
		all = append(all, lat[i]...)
	}
	slices.Sort(all)
	pct := func(p float64) float64 {
		if len(all) == 0 {
			return 0
		}
		return float64(all[int(p*float64(len(all)-1))].Nanoseconds()) / 1e3
	}
	return BenchCase{Path: path, Pairs: pairs, CallsPerS: float64(len(all)) / elapsed.Seconds(),
		P50Micros: pct(0.50), P99Micros: pct(0.99), TotalCalls: len(all)}, nil
}
