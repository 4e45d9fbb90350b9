package main

import (
	"encoding/json"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/atoll-run/atoll/actors"
)

func newBenchActorsCmd() *cobra.Command {
	var cfg actors.BenchConfig
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "actors",
		Short: "Request/response calls: Atoll's call path vs bare protoactor-go, in one run",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rep, err := actors.BenchCalls(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			byKey := map[string]actors.BenchCase{}
			for _, c := range rep.Cases {
				byKey[fmt.Sprintf("%s/%d", c.Path, c.Pairs)] = c
			}
			first := cfg.Pairs[0]
			a, p := byKey[fmt.Sprintf("atoll/%d", first)], byKey[fmt.Sprintf("protoactor/%d", first)]
			out := map[string]any{
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
	f.DurationVar(&cfg.Duration, "duration", time.Second, "length of each measured run")
	f.IntVar(&cfg.Rounds, "rounds", 3, "interleaved rounds per path (the median is kept)")
	f.IntSliceVar(&cfg.Pairs, "pairs", []int{1, 8}, "sender/actor counts to measure; the first gives `ratio`")
	return cmd
}
