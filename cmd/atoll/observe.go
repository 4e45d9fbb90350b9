package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/atoll-run/atoll/internal/pki"
	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/runtime/events"
	"github.com/atoll-run/atoll/store/meta"
)

func newEventsCmd() *cobra.Command {
	var dir, address, job string
	var follow, asJSON, audit bool
	var limit int
	cmd := &cobra.Command{
		Use:   "events",
		Short: "Print the control plane's events (placements, restarts, failures, machines joining and lost), with their reasons",
		Long: `events prints the cluster's event log: every decision of the leader head (a gang placed, with
its machines, islands and scores; refused for lack of capacity; running; restarting after a
worker failed; waiting for capacity after its machine was lost; failed; stopped), machines
joining and declared dead, jobs submitted and stopped; and the audit: every request refused for
its caller's role (refused: by whom, the action, what it would have touched), every write only
admin may make (admin_write), every credential revoked. The leader commits each event with its
decision, so every head keeps the same log (the newest 2000 events). --follow keeps printing
new events as they are committed; --audit prints the audit events only.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if job != "" {
				if err := api.CheckName("job", job); err != nil {
					return fmt.Errorf("events: --job: %w", err)
				}
			}
			if limit < 0 {
				return fmt.Errorf("events: --limit %d is negative", limit)
			}
			addr, _, err := clusterAddress(dir, address)
			if err != nil {
				return fmt.Errorf("events: %w", err)
			}
			ctx := cmd.Context()
			dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
			defer cancel()
			c, err := dialCluster(dctx, addr)
			if err != nil {
				return fmt.Errorf("events: %w", err)
			}
			out := cmd.OutOrStdout()
			var last int64
			show := func(evs []api.Event) error {
				for _, e := range events.Filter(evs, job) {
					if e.Seq <= last {
						continue
					}
					if audit && e.Kind != api.EventRefused && e.Kind != api.EventAdminWrite && e.Kind != api.EventCredentialRevoked {
						last = e.Seq
						continue
					}
					last = e.Seq
					if err := printEvent(out, e, asJSON); err != nil {
						return err
					}
				}
				return nil
			}
			evs, _, err := c.Events(dctx, 0, 0)
			if err != nil {
				return fmt.Errorf("events: %w", err)
			}
			evs = events.Filter(evs, job)
			if limit > 0 && len(evs) > limit {
				evs = evs[len(evs)-limit:]
			}
			if err := show(evs); err != nil || !follow {
				return err
			}
			err = c.Watch(ctx, api.TableEvents, func(reset bool, l api.Listing, mevs []meta.Event) error {
				kvs := l.KVs
				for _, ev := range mevs {
					if ev.Type == meta.EventPut {
						kvs = append(kvs, ev.KV)
					}
				}
				evs, err := api.DecodeEvents(kvs, last)
				if err != nil {
					return err
				}
				sort.Slice(evs, func(i, j int) bool { return evs[i].Seq < evs[j].Seq })
				return show(evs)
			})
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("events: %w", err)
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "dir", "", dirUsage)
	f.StringVar(&address, "address", "", addressUsage)
	f.StringVar(&job, "job", "", "only this job's events")
	f.BoolVarP(&follow, "follow", "f", false, "keep printing new events")
	f.BoolVar(&asJSON, "json", false, "one JSON object per line")
	f.IntVar(&limit, "limit", 0, "print only the newest N (0: all the log keeps)")
	f.BoolVar(&audit, "audit", false, "only the audit events (refused, admin_write, credential_revoked)")
	return cmd
}

func printEvent(w io.Writer, e api.Event, asJSON bool) error {
	if asJSON {
		return json.NewEncoder(w).Encode(e)
	}
	_, err := fmt.Fprintf(w, "%6d  %s\n", e.Seq, e.String())
	return err
}

func newDashboardCmd() *cobra.Command {
	var dir, address string
	var tokenOnly, prom bool
	cmd := &cobra.Command{
		Use:   "dashboard",
		Short: "Print the web dashboard's address with its login token (or the token alone, or a Prometheus scrape configuration)",
		Long: `dashboard prints the address of the cluster's web dashboard, served by every head under /ui/,
with its login token in it: open it in a browser. The token is derived from the cluster secret
(HMAC-SHA256) and opens the dashboard's read endpoints and /metrics only, never the control API.
--token prints the token alone (for Prometheus' credentials_file); --prometheus prints a
scrape configuration for the heads' and agents' /metrics.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if tokenOnly && prom {
				return fmt.Errorf("dashboard: give --token or --prometheus, not both")
			}
			addr, _, err := clusterAddress(dir, address)
			if err != nil {
				return fmt.Errorf("dashboard: %w", err)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 15*time.Second)
			defer cancel()
			c, err := dialCluster(ctx, addr)
			if err != nil {
				return fmt.Errorf("dashboard: %w", err)
			}
			out := cmd.OutOrStdout()
			if tokenOnly {
				_, err := fmt.Fprintln(out, api.DashboardToken([]byte(c.token)))
				return err
			}
			st, err := c.Status(ctx)
			if err != nil {
				return fmt.Errorf("dashboard: %w", err)
			}
			if !prom {
				if st.Dashboard == "" {
					return fmt.Errorf("dashboard: the leader head serves no dashboard (an older version?)")
				}
				_, err := fmt.Fprintln(out, st.Dashboard)
				return err
			}
			return printScrapeConfig(out, c.Heads(), st)
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "dir", "", dirUsage)
	f.StringVar(&address, "address", "", addressUsage)
	f.BoolVar(&tokenOnly, "token", false, "print only the dashboard's token (read-only: the dashboard and /metrics)")
	f.BoolVar(&prom, "prometheus", false, "print a Prometheus scrape configuration for the heads and agents")
	return cmd
}

// printScrapeConfig prints Prometheus scrape jobs for the heads' and agents' /metrics,
// authenticated with the dashboard token in a credentials file.
func printScrapeConfig(w io.Writer, heads []string, st api.Status) error {
	hostsOf := func(urls []string) (scheme string, hosts []string) {
		scheme = "http"
		for _, s := range urls {
			u, err := url.Parse(s)
			if err != nil || u.Host == "" {
				continue
			}
			scheme = u.Scheme
			hosts = append(hosts, u.Host)
		}
		return scheme, hosts
	}
	var agents []string
	for _, m := range st.Machines {
		if m.Agent != "" {
			agents = append(agents, m.Agent)
		}
	}
	hs, hh := hostsOf(heads)
	as, ah := hostsOf(agents)
	var b strings.Builder
	b.WriteString("# Prometheus scrape jobs for this Atoll cluster. Put the dashboard token in the\n")
	b.WriteString("# credentials file first: atoll dashboard --token > /etc/prometheus/atoll-token\n")
	b.WriteString("# (and, for https, the cluster CA's certificate in /etc/prometheus/atoll-ca.crt)\n")
	b.WriteString("scrape_configs:\n")
	for _, j := range []struct {
		name, scheme string
		hosts        []string
	}{{"atoll-heads", hs, hh}, {"atoll-agents", as, ah}} {
		fmt.Fprintf(&b, "  - job_name: %s\n    scheme: %s\n    metrics_path: /metrics\n    authorization:\n      type: Bearer\n      credentials_file: /etc/prometheus/atoll-token\n",
			j.name, j.scheme)
		if j.scheme == "https" { // the cluster's own CA; every certificate names pki.ServerName
			fmt.Fprintf(&b, "    tls_config:\n      ca_file: /etc/prometheus/atoll-ca.crt\n      server_name: %s\n", pki.ServerName)
		}
		fmt.Fprintf(&b, "    static_configs:\n      - targets: [%s]\n", quoteList(j.hosts))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func quoteList(xs []string) string {
	q := make([]string, len(xs))
	for i, x := range xs {
		q[i] = fmt.Sprintf("%q", x)
	}
	return strings.Join(q, ", ")
}

func queueName(q string) string {
	if q == "" {
		return "default"
	}
	return q
}

// shareText prints a queue's share (its use over its fair share: 1.00 is its share, above
// borrows): "-" for a figure that is no ratio (a head before QueueShare reported 1e9 for
// a queue whose fair share it had not computed).
func shareText(v float64) string {
	if math.IsNaN(v) || v < 0 || v >= 1e6 {
		return "-"
	}
	return fmt.Sprintf("%.2f", v)
}

// printQueues adds the queues' table to `atoll status`: gangs pending and holding GPUs,
// with each queue's weight and share when the head reports its queues.
func printQueues(w io.Writer, st api.Status) {
	if len(st.Queues) > 0 {
		fmt.Fprintln(w, "\nQUEUE\tWEIGHT\tPENDING\tRUNNING\tGPUS HELD\tSHARE")
		for _, q := range st.Queues {
			fmt.Fprintf(w, "%s\t%g\t%d\t%d\t%d\t%s\n", q.Name, q.Weight, q.Pending, q.Running, q.GPUs, shareText(q.Share))
		}
		return
	}
	type queue struct{ pending, running, gpus int }
	qs := map[string]*queue{}
	var names []string
	for _, g := range st.Gangs {
		n := queueName(g.Queue)
		q := qs[n]
		if q == nil {
			q = &queue{}
			qs[n] = q
			names = append(names, n)
		}
		switch g.State {
		case api.GangPending:
			q.pending++
		case api.GangStarting, api.GangRunning, api.GangRestarting:
			q.running++
			q.gpus += g.GPUs
		}
	}
	if len(names) == 0 {
		return
	}
	sort.Strings(names)
	fmt.Fprintln(w, "\nQUEUE\tPENDING\tRUNNING\tGPUS HELD")
	for _, n := range names {
		q := qs[n]
		fmt.Fprintf(w, "%s\t%d\t%d\t%d\n", n, q.pending, q.running, q.gpus)
	}
}
