package metabench

import (
	"fmt"
	"io"
)

// WriteReport prints a run as a table with its ratios against the floor, the targets, the
// same paths in clear (TLS) and the baseline.
func WriteReport(w io.Writer, cfg Config, res Result) {
	floor := res.Floor.FsyncUs + res.Floor.RTTUs
	fmt.Fprintf(w, "floor: fsync %.0f us (p99 %.0f us), loopback rtt %.0f us (fsync+rtt %.0f us)\n", res.Floor.FsyncUs, res.Floor.FsyncP99Us, res.Floor.RTTUs, floor)
	fmt.Fprintf(w, "%-15s %10s %10s %10s %12s\n", "system", "p50_us", "p99_us", "p999_us", "writes/s")
	row := func(name string, s *Stats) {
		if s != nil {
			fmt.Fprintf(w, "%-15s %10.0f %10.0f %10.0f %12.0f\n", name, s.P50us, s.P99us, s.P999us, s.WritesPerS)
		}
	}
	row("atoll", &res.Atoll)
	row("atoll_tls", res.AtollTLS)
	row("atoll_http", &res.AtollHTTP)
	row("atoll_http_tls", res.AtollHTTPTLS)
	row(res.BaselineName, res.Baseline)
	fmt.Fprintf(w, "atoll p50 / (fsync+rtt) = %.2f (target <= 2)\n", res.Atoll.P50us/floor)
	fmt.Fprintf(w, "atoll p99 = %.0f us (target <= 1000)\n", res.Atoll.P99us)
	tls := func(name string, clear Stats, t *Stats) {
		if t != nil && clear.P50us > 0 && clear.WritesPerS > 0 {
			fmt.Fprintf(w, "%s over mutual TLS / in clear: p50 %.2fx, p99 %.2fx, writes/s %.2fx\n", name,
				t.P50us/clear.P50us, t.P99us/clear.P99us, t.WritesPerS/clear.WritesPerS)
		}
	}
	tls("atoll", res.Atoll, res.AtollTLS)
	tls("atoll_http", res.AtollHTTP, res.AtollHTTPTLS)
	if b := res.Baseline; b != nil && b.WritesPerS > 0 {
		fmt.Fprintf(w, "atoll / %s writes/s at %d clients = %.2f (target >= 2); over HTTP %.2f\n", res.BaselineName, cfg.Clients,
			res.Atoll.WritesPerS/b.WritesPerS, res.AtollHTTP.WritesPerS/b.WritesPerS)
	} else {
		fmt.Fprintln(w, "no baseline in this build: the etcd comparison is `go run ./cmd/atoll-benchmeta`")
	}
}
