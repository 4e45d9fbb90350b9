package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/atoll-run/atoll/internal/jsonpos"
	"github.com/atoll-run/atoll/runtime/api"
)

// maxConfigFile bounds a scheduler configuration file (1,000 queues and 100 classes fit
// in far less).
const maxConfigFile = 4 << 20

func newQueuesCmd() *cobra.Command {
	var dir, address, set string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "queues",
		Short: "Show the scheduler's queues and priority classes, or set them from a file (--set FILE)",
		Long: `queues prints the operator's scheduler configuration of a cluster: its queues (weight, GPU
quota), the default queue, the priority classes, the notice grace a stopped or shrunk gang
gets to checkpoint, and the guard against preempting a gang that just started; with each
queue's gangs pending and running, the GPUs it holds and its share (use over fair share).

--set FILE replaces the configuration with the JSON in FILE (- reads standard input), for
example:

  {"queues": [{"name": "research", "weight": 2}, {"name": "prod", "weight": 1, "quota_gpus": 16}],
   "default_queue": "research",
   "priority_classes": [{"name": "low", "value": 0, "default": true}, {"name": "high", "value": 1}],
   "notice_grace": "30s",
   "max_job_workers": 10000, "max_cluster_workers": 100000}

max_job_workers and max_cluster_workers bound the workers of one job's live gangs, and of
all of them (0: the defaults shown); a gang past either is refused, naming the bound.
The leader commits it through the metadata log before it takes effect; a gang that names a
queue or class the new configuration lacks is refused at submission, and gangs already
queued keep their place.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var conf *api.SchedulerConfig
			if set != "" {
				c, err := readSchedulerConfig(cmd.InOrStdin(), set)
				if err != nil {
					return fmt.Errorf("queues: %w", err)
				}
				conf = &c
			}
			addr, _, err := clusterAddress(dir, address)
			if err != nil {
				return fmt.Errorf("queues: %w", err)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
			defer cancel()
			c, err := dialCluster(ctx, addr)
			if err != nil {
				return fmt.Errorf("queues: %w", err)
			}
			var got api.SchedulerConfig
			if conf != nil {
				got, err = c.SetSchedulerConfig(ctx, *conf)
			} else {
				got, err = c.SchedulerConfig(ctx)
			}
			if err != nil {
				return fmt.Errorf("queues: %w", err)
			}
			st, err := c.Status(ctx)
			if err != nil {
				return fmt.Errorf("queues: %w", err)
			}
			out := cmd.OutOrStdout()
			if asJSON {
				return json.NewEncoder(out).Encode(struct {
					Config api.SchedulerConfig `json:"config"`
					Queues []api.QueueStatus   `json:"queues"`
				}{got, st.Queues})
			}
			printSchedulerConfig(out, got, st.Queues)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "dir", "", dirUsage)
	f.StringVar(&address, "address", "", addressUsage)
	f.StringVar(&set, "set", "", "replace the configuration with this JSON file (- for standard input)")
	f.BoolVar(&asJSON, "json", false, `print {"config": ..., "queues": [...]} as JSON`)
	return cmd
}

// readSchedulerConfig reads and checks a configuration file: unknown fields and a
// configuration the head would refuse are errors that name the file.
func readSchedulerConfig(stdin io.Reader, path string) (api.SchedulerConfig, error) {
	var conf api.SchedulerConfig
	var r io.Reader = stdin
	name := "standard input"
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return conf, err
		}
		defer f.Close()
		r, name = f, path
	}
	b, err := io.ReadAll(io.LimitReader(r, maxConfigFile+1))
	if err != nil {
		return conf, fmt.Errorf("%s: %w", name, err)
	}
	if len(b) > maxConfigFile {
		return conf, fmt.Errorf("%s: larger than %d bytes", name, maxConfigFile)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&conf); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			line, col := jsonpos.LineCol(b, se.Offset)
			return conf, fmt.Errorf("%s:%d:%d: %w", name, line, col, err)
		}
		return conf, fmt.Errorf("%s: %w", name, err)
	}
	if dec.More() {
		return conf, fmt.Errorf("%s: more than one JSON value", name)
	}
	if err := conf.Validate(); err != nil {
		return conf, fmt.Errorf("%s: %w", name, err)
	}
	return conf, nil
}

func printSchedulerConfig(w io.Writer, conf api.SchedulerConfig, qs []api.QueueStatus) {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	defer tw.Flush()
	fmt.Fprintf(tw, "default queue %s · notice grace %s · min run before preempt %s · workers at most %d a job, %d in all\n",
		queueName(conf.DefaultQueue), time.Duration(conf.NoticeGrace), time.Duration(conf.MinRunBeforePreempt), conf.JobWorkersBound(), conf.ClusterWorkersBound())
	byName := map[string]api.QueueStatus{}
	for _, q := range qs {
		byName[q.Name] = q
	}
	fmt.Fprintln(tw, "\nQUEUE\tWEIGHT\tQUOTA GPUS\tPENDING\tRUNNING\tGPUS HELD\tSHARE")
	for _, q := range conf.Queues {
		s := byName[q.Name]
		quota := "-"
		if q.QuotaGPUs > 0 {
			quota = fmt.Sprint(q.QuotaGPUs)
		}
		fmt.Fprintf(tw, "%s\t%g\t%s\t%d\t%d\t%d\t%s\n", q.Name, q.Weight, quota, s.Pending, s.Running, s.GPUs, shareText(s.Share))
	}
	if len(conf.PriorityClasses) > 0 {
		fmt.Fprintln(tw, "\nPRIORITY CLASS\tVALUE\tDEFAULT")
		for _, p := range conf.PriorityClasses {
			fmt.Fprintf(tw, "%s\t%d\t%v\n", p.Name, p.Value, p.Default)
		}
	}
}

func newDrainCmd() *cobra.Command {
	var dir, address, reason string
	var within time.Duration
	cmd := &cobra.Command{
		Use:   "drain MACHINE",
		Short: "Drain a machine: its gangs checkpoint, stop and queue again elsewhere; nothing new lands on it",
		Long: `drain cordons a machine (the scheduler places nothing new on it) and gives every gang with a
member on it a drain notice: the gang's program checkpoints just in time, its workers stop,
its GPUs are freed and it queues again, to resume from that checkpoint on other machines.
A gang that does not answer by the deadline (--within, default the notice grace of
atoll queues) is stopped anyway and resumes from its newest committed checkpoint. The same
path serves spot interruptions and scale-downs of the pools.

The drain is recorded in the cluster's log with who asked, why and when: it holds across
changes of leader and restarts of the machine's agent until atoll undrain lifts it, and
atoll status shows it (cordoned, cordon_reason).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if within < 0 || within > 24*time.Hour {
				return fmt.Errorf("drain: --within %s: want 0 (the notice grace) to 24h", within)
			}
			if len(reason) > 200 {
				return fmt.Errorf("drain: --reason is %d bytes; at most 200", len(reason))
			}
			addr, _, err := clusterAddress(dir, address)
			if err != nil {
				return fmt.Errorf("drain: %w", err)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
			defer cancel()
			c, err := dialCluster(ctx, addr)
			if err != nil {
				return fmt.Errorf("drain: %w", err)
			}
			d := api.DrainRequest{Machine: args[0], Reason: reason, By: operator()}
			if within > 0 {
				d.Deadline = time.Now().Add(within)
			}
			if d.Reason == "" {
				d.Reason = "an operator's drain"
			}
			if err := c.Drain(ctx, d); err != nil {
				return fmt.Errorf("drain %s: %w", args[0], err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "machine %s drained: its gangs were given notice; nothing new is placed on it\n", args[0])
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "dir", "", dirUsage)
	f.StringVar(&address, "address", "", addressUsage)
	f.StringVar(&reason, "reason", "", "why (shown in the gangs' notices and the events)")
	f.DurationVar(&within, "within", 0, "the gangs' deadline to checkpoint and stop (0: the notice grace)")
	return cmd
}

func newUndrainCmd() *cobra.Command {
	var dir, address string
	cmd := &cobra.Command{
		Use:   "undrain MACHINE",
		Short: "Lift a machine's drain or cordon: new gangs may be placed on it again",
		Long: `undrain lifts what atoll drain (or the pools) placed on a machine: the scheduler may place
gangs on it again, at once if some wait for it. Gangs the drain already stopped stay where
they went; drain notices already given stand.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			addr, _, err := clusterAddress(dir, address)
			if err != nil {
				return fmt.Errorf("undrain: %w", err)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
			defer cancel()
			c, err := dialCluster(ctx, addr)
			if err != nil {
				return fmt.Errorf("undrain: %w", err)
			}
			if err := c.Undrain(ctx, api.UndrainRequest{Machine: args[0], By: operator()}); err != nil {
				return fmt.Errorf("undrain %s: %w", args[0], err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "machine %s undrained: gangs may be placed on it again\n", args[0])
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "dir", "", dirUsage)
	f.StringVar(&address, "address", "", addressUsage)
	return cmd
}

// operator names who runs this command, for the cluster's records: user@host.
func operator() string {
	name := "someone"
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	if h, err := os.Hostname(); err == nil && h != "" {
		name += "@" + h
	}
	return name
}
