package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/atoll-run/atoll/topology"
)

// topologyJSON is what `atoll topology --format json` prints: the cluster summary, plus the
// discovery report with --discover.
type topologyJSON struct {
	topology.Summary
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
	)
	cmd := &cobra.Command{
		Use:   "topology (--spec NAME|FILE|SHORTHAND | --discover) [--format text|json|dot]",
		Short: "Print a machine or cluster map: GPUs, NVLink islands, NIC affinity, link tiers, AllReduce estimates",
		Long: `Print the topology of a declared cluster (--spec) or of this machine (--discover).

--spec takes a built-in machine type (` + strings.Join(topology.BuiltinNames(), ", ") + `),
a shorthand ("64xdgx-h100/8" = 64 DGX H100 in racks of 8; "16xdgx-h100/8+8xpcie-l40s-8"),
or a JSON spec file (one machine or a cluster; see docs/topology.md).

--discover reads this machine through NVML, sysfs and rdmamap. Without an NVIDIA driver (or
in a CGO_ENABLED=0 build) it says so in one line and prints the CPU/NUMA/NIC part.`,
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
	return cmd
}

func printTopology(w io.Writer, c *topology.Cluster, rep *topology.DiscoveryReport, format string, limit int) error {
	switch format {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(topologyJSON{Summary: c.Summary(), Discovery: rep})
	case "dot":
		return c.WriteDOT(w, limit)
	}
	if rep != nil {
		for _, l := range rep.Lines() {
			if _, err := fmt.Fprintln(w, l); err != nil {
				return err
			}
		}
		fmt.Fprintln(w)
	}
	return c.WriteText(w, limit)
}
