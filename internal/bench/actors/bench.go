// Package actors benchmarks Atoll's call path against bare protoactor-go, in one process
// and between two processes (`atoll bench actors [--remote]`). It is a harness, not product
// code.
package actors

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/atoll-run/atoll/actors"
)

// Config configures Calls.
type Config struct {
	// Duration of each measured run. Default 1 s.
	Duration time.Duration
	// Rounds: each path is measured this many times, interleaved, and the median round kept.
	// Default 3.
	Rounds int
	// Pairs are the sender/actor counts measured (each sender calls its own actor). Default
	// {1, 8}.
	Pairs []int
	// Remote, when set, is the address of a peer process (Serve) hosting the actors; the
	// calls then cross processes. Token is the cluster token both sides present.
	Remote string
	Token  []byte
}

// Validate checks the config's numbers.
func (c Config) Validate() error {
	if c.Duration < 0 || c.Duration > time.Hour {
		return fmt.Errorf("bench actors: duration %v: want 0 (default) .. 1h", c.Duration)
	}
	if c.Rounds < 0 || c.Rounds > 100 {
		return fmt.Errorf("bench actors: rounds %d: want 0 (default) .. 100", c.Rounds)
	}
	for i, p := range c.Pairs {
		if p < 1 || p > 1024 {
			return fmt.Errorf("bench actors: pairs entry %d is %d: want 1..1024", i+1, p)
		}
	}
	return nil
}

// Case is one measured workload on one path.
type Case struct {
	Path       string  `json:"path"` // "atoll" or "protoactor"
	Pairs      int     `json:"pairs"`
	CallsPerS  float64 `json:"calls_per_s"`
	P50Micros  float64 `json:"p50_us"`
	P99Micros  float64 `json:"p99_us"`
	TotalCalls int     `json:"calls"`
}

// Report is Calls' result.
type Report struct {
	Remote bool   `json:"remote"`
	Cases  []Case `json:"cases"`
}

// echo answers every call with its message.
type echo struct{}

func (echo) Receive(_ *actors.Context, msg any) (any, error) { return msg, nil }

// bareEcho is the same actor written directly against protoactor-go.
type bareEcho struct{}

func (bareEcho) Receive(c actor.Context) {
	if m, ok := c.Message().(*wrapperspb.Int64Value); ok {
		c.Respond(m)
	}
}

// peer hosts the echo actors: name i is Atoll's "a<i>" and protoactor's "p<i>".
func host(s *actors.System, pairs int) error {
	if err := s.Register("bench-echo", func() actors.Handler { return echo{} }); err != nil {
		return err
	}
	for i := 0; i < pairs; i++ {
		if _, err := s.Spawn("bench-echo", fmt.Sprintf("a%d", i)); err != nil {
			return err
		}
		if _, err := s.Protoactor().Root.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return bareEcho{} }), fmt.Sprintf("p%d", i)); err != nil {
			return err
		}
	}
	return nil
}

// Serve runs the peer of a remote benchmark: it hosts pairs echo actors of each path,
// prints its address on out, and serves until in closes.
func Serve(in io.Reader, out io.Writer, token []byte, pairs int) error {
	s, err := actors.NewSystem(actors.Config{Remote: &actors.RemoteConfig{Token: token}})
	if err != nil {
		return err
	}
	defer s.Shutdown(context.Background())
	if err := host(s, pairs); err != nil {
		return err
	}
	fmt.Fprintln(out, s.Address())
	_, _ = io.Copy(io.Discard, in)
	return nil
}

// ReadAddress reads the address a peer printed.
func ReadAddress(r io.Reader) (string, error) {
	line, err := bufio.NewReader(r).ReadString('\n')
	return strings.TrimSpace(line), err
}

// Calls measures request/response calls through Atoll's call path (a Call on a Handler,
// through the codec's envelope) and through bare protoactor-go (RequestFuture on an actor
// that Responds), with the same small protobuf message and the same sender/actor counts,
// in one run: in one process, or to a peer process (Config.Remote).
func Calls(ctx context.Context, cfg Config) (Report, error) {
	if err := cfg.Validate(); err != nil {
		return Report{}, err
	}
	if cfg.Duration == 0 {
		cfg.Duration = time.Second
	}
	if cfg.Rounds == 0 {
		cfg.Rounds = 3
	}
	if len(cfg.Pairs) == 0 {
		cfg.Pairs = []int{1, 8}
	}
	sc := actors.Config{}
	if cfg.Remote != "" {
		sc.Remote = &actors.RemoteConfig{Token: cfg.Token}
	}
	s, err := actors.NewSystem(sc)
	if err != nil {
		return Report{}, err
	}
	defer func() { _ = s.Shutdown(context.WithoutCancel(ctx)) }()
	addr := s.Address()
	rep := Report{Remote: cfg.Remote != ""}
	if cfg.Remote != "" {
		addr = cfg.Remote
	} else if err := host(s, slices.Max(cfg.Pairs)); err != nil {
		return rep, err
	}
	for _, pairs := range cfg.Pairs {
		atollCall := func(i, n int) error {
			v, err := actors.Call[*wrapperspb.Int64Value](ctx, s, actors.NewRef(addr, fmt.Sprintf("a%d", i)), wrapperspb.Int64(int64(n)))
			if err == nil && v.GetValue() != int64(n) {
				err = fmt.Errorf("echo %d returned %d", n, v.GetValue())
			}
			return err
		}
		bareCall := func(i, n int) error {
			v, err := s.Protoactor().Root.RequestFuture(actor.NewPID(addr, fmt.Sprintf("p%d", i)), wrapperspb.Int64(int64(n)), actors.DefaultCallTimeout).Result()
			if err == nil {
				if m, ok := v.(*wrapperspb.Int64Value); !ok || m.GetValue() != int64(n) {
					err = fmt.Errorf("echo %d returned %v", n, v)
				}
			}
			return err
		}
		var atollRuns, bareRuns []Case
		for r := 0; r < cfg.Rounds; r++ {
			for _, p := range []struct {
				name string
				call func(i, n int) error
				out  *[]Case
			}{{"atoll", atollCall, &atollRuns}, {"protoactor", bareCall, &bareRuns}} {
				c, err := run(ctx, p.name, pairs, cfg.Duration, p.call)
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

func median(cs []Case) Case {
	slices.SortFunc(cs, func(a, b Case) int {
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

func run(ctx context.Context, path string, pairs int, d time.Duration, call func(i, n int) error) (Case, error) {
	for i := 0; i < pairs; i++ { // warm up
		for n := 0; n < 200; n++ {
			if err := call(i, n); err != nil {
				return Case{}, err
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
				// Every pair makes one call at least: on a loaded machine a goroutine can
				// first run after a short run's deadline (CI: 50 ms), and a run of no call
				// reported 0 calls a second, a figure of nothing.
				if ctx.Err() != nil || n > 0 && t0.After(deadline) {
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
			return Case{}, fmt.Errorf("bench actors %s: %w", path, errs[i])
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
	return Case{Path: path, Pairs: pairs, CallsPerS: float64(len(all)) / elapsed.Seconds(),
		P50Micros: pct(0.50), P99Micros: pct(0.99), TotalCalls: len(all)}, nil
}
