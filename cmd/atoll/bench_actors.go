package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	bench "github.com/atoll-run/atoll/internal/bench/actors"
)

func newBenchActorsCmd() *cobra.Command {
	var cfg bench.Config
	var asJSON, remote bool
	cmd := &cobra.Command{
		Use:   "actors",
		Short: "Request/response calls: Atoll's call path vs bare protoactor-go, in one run (--remote: between two processes)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cfg.Validate(); err != nil {
				return err
			}
			if remote {
				stop, addr, token, err := startActorsPeer(cmd.Context(), cfg.Pairs)
				if err != nil {
					return err
				}
				defer stop()
				cfg.Remote, cfg.Token = addr, token
			}
			rep, err := bench.Calls(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			byKey := map[string]bench.Case{}
			for _, c := range rep.Cases {
				byKey[fmt.Sprintf("%s/%d", c.Path, c.Pairs)] = c
			}
			first := cfg.Pairs[0]
			a, p := byKey[fmt.Sprintf("atoll/%d", first)], byKey[fmt.Sprintf("protoactor/%d", first)]
			out := map[string]any{
				"remote":                 remote,
				"atoll_calls_per_s":      a.CallsPerS,
				"protoactor_calls_per_s": p.CallsPerS,
				"ratio":                  a.CallsPerS / p.CallsPerS,
				"atoll_p50_us":           a.P50Micros,
				"atoll_p99_us":           a.P99Micros,
				"protoactor_p50_us":      p.P50Micros,
				"protoactor_p99_us":      p.P99Micros,
				"cases":                  rep.Cases,
			}
			if len(cfg.Pairs) > 1 {
				last := cfg.Pairs[len(cfg.Pairs)-1]
				a8, p8 := byKey[fmt.Sprintf("atoll/%d", last)], byKey[fmt.Sprintf("protoactor/%d", last)]
				out["ratio_concurrent"] = a8.CallsPerS / p8.CallsPerS
				out["concurrent_pairs"] = last
			}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(out)
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', tabwriter.AlignRight)
			fmt.Fprintln(w, "path\tsenders x actors\tcalls/s\tp50 µs\tp99 µs\t")
			for _, c := range rep.Cases {
				fmt.Fprintf(w, "%s\t%d x %d\t%.0f\t%.1f\t%.1f\t\n", c.Path, c.Pairs, c.Pairs, c.CallsPerS, c.P50Micros, c.P99Micros)
			}
			_ = w.Flush()
			fmt.Fprintf(cmd.OutOrStdout(), "ratio atoll/protoactor (1:1): %.3f (target >= 0.8)\n", out["ratio"])
			if r, ok := out["ratio_concurrent"]; ok {
				fmt.Fprintf(cmd.OutOrStdout(), "ratio atoll/protoactor (%d:%d): %.3f\n", out["concurrent_pairs"], out["concurrent_pairs"], r)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.BoolVar(&asJSON, "json", false, "print one JSON object")
	f.BoolVar(&remote, "remote", false, "call actors in a second process (protoactor remote) instead of this one")
	f.DurationVar(&cfg.Duration, "duration", time.Second, "length of each measured run")
	f.IntVar(&cfg.Rounds, "rounds", 3, "interleaved rounds per path (the median is kept)")
	f.IntSliceVar(&cfg.Pairs, "pairs", []int{1, 8}, "sender/actor counts to measure, each 1..1024; the first gives \"ratio\"")
	return cmd
}

// startActorsPeer starts `atoll bench actors-peer` and returns its address; the token goes
// on its stdin, never its command line.
func startActorsPeer(ctx context.Context, pairs []int) (stop func(), addr string, token []byte, err error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, "", nil, err
	}
	token = []byte(newSecret())
	most := 1
	for _, p := range pairs {
		most = max(most, p)
	}
	cmd := exec.CommandContext(ctx, exe, "bench", "actors-peer", "--pairs", fmt.Sprint(most))
	cmd.Env = append(os.Environ(), "ATOLL_TOKEN="+string(token))
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, "", nil, err
	}
	stop = func() { _ = stdin.Close(); _ = cmd.Wait() }
	addr, err = bench.ReadAddress(stdout)
	if err != nil {
		stop()
		return nil, "", nil, fmt.Errorf("bench actors: peer: %w", err)
	}
	return stop, addr, token, nil
}

func newBenchActorsPeerCmd() *cobra.Command {
	var pairs int
	cmd := &cobra.Command{
		Use:    "actors-peer",
		Short:  "The peer process of `atoll bench actors --remote` (hosts the echo actors until stdin closes)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			token, err := readToken("")
			if err != nil {
				return err
			}
			if pairs < 1 || pairs > 1024 {
				return fmt.Errorf("--pairs %d: want 1..1024", pairs)
			}
			return bench.Serve(os.Stdin, cmd.OutOrStdout(), token, pairs)
		},
	}
	cmd.Flags().IntVar(&pairs, "pairs", 8, "echo actors of each path to host")
	return cmd
}
