package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/atoll-run/atoll/internal/topoview"
	"github.com/atoll-run/atoll/topology"
)

// topologyJSON is what `atoll topology --format json` prints: the cluster summary, plus the
// discovery report with --discover.
type topologyJSON struct {
	topoview.Summary
	Discovery *topology.DiscoveryReport `json:"discovery,omitempty"`
}

func newTopologyCmd() *cobra.Command {
	var (
		spec     string
		discover bool
		format   string
		asJSON   bool
		sysRoot  string
		timeout  time.Duration
		limit    int
		list     bool
		verbose  bool
		gangIDs  string
		size     string
	)
	cmd := &cobra.Command{
		Use:   "topology (--spec NAME|FILE|SHORTHAND | --discover) [--format text|json|dot]",
		Short: "Print a machine or cluster map: GPUs, NVLink islands, NIC affinity, link tiers, AllReduce estimates",
		Long: `Print the topology of a declared cluster (--spec) or of this machine (--discover).

--spec takes a built-in machine type (` + strings.Join(topology.BuiltinNames(), ", ") + `),
a shorthand ("64xdgx-h100/8" = 64 DGX H100 in racks of 8; "16xdgx-h100/8+8xpcie-l40s-8";
counts are machines, so for gb200-nvl72 they are trays: "gb200-nvl72" alone is one 18-tray
NVL72 rack, "36xgb200-nvl72" two),
or a JSON spec file (one machine or a cluster; see docs/topology.md).

--discover reads this machine through NVML, sysfs and rdmamap. NVML is compiled in only by
"go build -tags nvml" (with cgo), the build for GPU machines; without it, or without an NVIDIA
driver, it says so in one line and prints the CPU/NUMA/NIC part.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := cmd.OutOrStdout()
			if list {
				for _, n := range topology.BuiltinNames() {
					m, _ := topology.BuiltinMachine(n)
					fmt.Fprintf(out, "%-24s %s\n", n, m.Description)
				}
				return nil
			}
			if asJSON {
				format = "json"
			}
			if limit < 0 {
				return fmt.Errorf("topology: --limit %d: want 0 (the default) or a positive number", limit)
			}
			if discover && timeout <= 0 {
				return fmt.Errorf("topology: --timeout %v: want a positive duration", timeout)
			}
			switch format {
			case "text", "json", "dot":
			default:
				return fmt.Errorf("topology: --format %q: want text, json or dot", format)
			}
			if (spec == "") == !discover {
				return errors.New("topology: give exactly one of --spec NAME|FILE|SHORTHAND or --discover (built-in types: " +
					strings.Join(topology.BuiltinNames(), ", ") + ")")
			}
			var (
				c   *topology.Cluster
				rep *topology.DiscoveryReport
				err error
			)
			if discover {
				logger := zap.NewNop()
				if verbose {
					if l, err := zap.NewDevelopment(); err == nil { // logs to stderr
						logger = l
					}
				}
				opts := topology.DefaultDiscoverOptions()
				opts.Logger = logger
				if sysRoot != "" {
					opts.SysRoot = sysRoot
					opts.RDMA = topology.SysfsRDMA{Root: sysRoot}
				}
				ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
				defer cancel()
				c, rep, err = topology.DiscoverCluster(ctx, opts)
				if err != nil {
					if rep != nil {
						for _, l := range rep.Lines() {
							fmt.Fprintln(cmd.ErrOrStderr(), l)
						}
					}
					return err
				}
			} else {
				c, err = topology.Load(spec)
				if err != nil {
					return err
				}
			}
			if gangIDs != "" {
				return printPlacement(out, c, gangIDs, size, format)
			}
			return printTopology(out, c, rep, format, limit)
		},
	}
	f := cmd.Flags()
	f.StringVar(&spec, "spec", "", "built-in machine type, shorthand (64xdgx-h100/8) or JSON spec file")
	f.BoolVar(&discover, "discover", false, "discover this machine (NVML, sysfs, rdmamap)")
	f.StringVar(&format, "format", "text", "output format: text, json or dot")
	f.BoolVar(&asJSON, "json", false, "same as --format json: print one JSON object")
	f.StringVar(&sysRoot, "sys-root", "", "sysfs root for --discover (default /sys)")
	f.DurationVar(&timeout, "timeout", 30*time.Second, "deadline for --discover")
	f.IntVar(&limit, "limit", 0, "list at most this many islands (text) or machines (dot); 0 = default")
	f.BoolVar(&list, "list", false, "list the built-in machine types and exit")
	f.BoolVar(&verbose, "verbose", false, "log discovery steps to stderr")
	f.StringVar(&gangIDs, "allreduce", "", "estimate an AllReduce over these global GPU ids instead (\"0-7,16-23\")")
	f.StringVar(&size, "bytes", "1GiB", "message size for --allreduce (e.g. 64MiB, 1GiB, 4096)")
	return cmd
}

func printTopology(w io.Writer, c *topology.Cluster, rep *topology.DiscoveryReport, format string, limit int) error {
	switch format {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(topologyJSON{Summary: topoview.Summarize(c), Discovery: rep})
	case "dot":
		return topoview.WriteDOT(w, c, limit)
	}
	if rep != nil {
		for _, l := range rep.Lines() {
			if _, err := fmt.Fprintln(w, l); err != nil {
				return err
			}
		}
		fmt.Fprintln(w)
	}
	return topoview.WriteText(w, c, limit)
}

// placementJSON is what `atoll topology --allreduce ... --json` prints.
type placementJSON struct {
	GPUs      []int                        `json:"gpus"`
	Islands   [][]int                      `json:"islands"`
	Placement string                       `json:"placement"`
	Estimates []topology.AllReduceEstimate `json:"allreduce"`
}

func printPlacement(w io.Writer, c *topology.Cluster, idList, size, format string) error {
	ids, err := parseIDList(idList)
	if err != nil {
		return err
	}
	if err := c.CheckGPUs(ids); err != nil {
		return err
	}
	bytes, err := parseBytes(size)
	if err != nil {
		return err
	}
	var ests []topology.AllReduceEstimate
	for _, a := range append(topology.Algos(), topology.Best) {
		ests = append(ests, c.AllReduce(ids, bytes, a))
	}
	if format == "json" {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(placementJSON{GPUs: ids, Islands: c.IslandsOf(ids), Placement: c.DescribePlacement(ids), Estimates: ests})
	}
	fmt.Fprintln(w, c.DescribePlacement(ids))
	fmt.Fprintf(w, "AllReduce of %s:\n", size)
	for _, e := range ests {
		name := e.Algo.String()
		if e.Requested == topology.Best {
			name = "best=" + name
		}
		if e.Time == topology.Unreachable {
			fmt.Fprintf(w, "  %-18s not applicable\n", e.Requested)
			continue
		}
		fmt.Fprintf(w, "  %-18s %12s  busbw %7.1f GB/s  bottleneck %s\n", name, e.Time.Round(100*time.Nanosecond), e.BusBWGBps, e.Bottleneck)
	}
	return nil
}

// parseIDList reads "0-7,16,18-19": at most topology.MaxGPUs ids in all.
func parseIDList(s string) ([]int, error) {
	var ids []int
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return nil, fmt.Errorf("topology: --allreduce %q: %q is not a GPU id or range", s, part)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return nil, fmt.Errorf("topology: --allreduce %q: %q is not a range low-high", s, part)
			}
		}
		if b-a >= topology.MaxGPUs-len(ids) {
			return nil, fmt.Errorf("topology: --allreduce %.64q: more than %d GPU ids (at %q)", s, topology.MaxGPUs, part)
		}
		for i := a; i <= b; i++ {
			ids = append(ids, i)
		}
	}
	return ids, nil
}

// parseBytes reads "4096", "64KiB", "64MiB", "1GiB".
func parseBytes(s string) (int64, error) {
	mult := int64(1)
	num := s
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}} {
		if strings.HasSuffix(s, u.suffix) {
			num, mult = strings.TrimSuffix(s, u.suffix), u.mult
			break
		}
	}
	const maxBytes = 1 << 50 // 1 PiB: estimates stay far from time.Duration's limit
	n, err := strconv.ParseInt(strings.TrimSpace(num), 10, 64)
	if err != nil || n <= 0 || n > maxBytes/mult {
		return 0, fmt.Errorf("topology: --bytes %q: want a positive size up to 1PiB, like 4096, 64MiB or 1GiB", s)
	}
	return n * mult, nil
}
