package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/store/meta"
)

func newLogsCmd() *cobra.Command {
	var dir, address, gang string
	var rank, gen int
	var follow bool
	cmd := &cobra.Command{
		Use:   "logs JOB",
		Short: "Print (or follow) a worker's stdout and stderr, as its agent keeps them",
		Long: `logs prints the output of one worker of a job (--rank, default 0, of --gang, default the job's
only gang), streamed from the agent of the machine it runs on. Agents keep each generation's
log (<agent dir>/logs/<job>/<gang>.<rank>.g<generation>.log); --gen picks an older one on that
machine. With --follow it keeps printing as the worker writes, and when the gang restarts it
goes on with the next generation's log, wherever that generation runs. Workers of the embedded
default run inside the driver's process and have no log of their own.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			job := args[0]
			if err := api.CheckName("job", job); err != nil {
				return fmt.Errorf("logs: %w", err)
			}
			if rank < 0 {
				return fmt.Errorf("logs: --rank %d is negative", rank)
			}
			if gang != "" {
				if err := api.CheckName("gang", gang); err != nil {
					return fmt.Errorf("logs: --gang: %w", err)
				}
			}
			addr, _, err := clusterAddress(dir, address)
			if err != nil {
				return fmt.Errorf("logs: %w", err)
			}
			ctx := cmd.Context()
			dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
			defer cancel()
			c, err := dialCluster(dctx, addr)
			if err != nil {
				return fmt.Errorf("logs: %w", err)
			}
			if gang, err = jobGang(dctx, c.Client, job, gang); err != nil {
				return fmt.Errorf("logs: %w", err)
			}
			lr := &logReader{c: c.Client, token: c.token, hc: c.hc, job: job, gang: gang, rank: rank, out: cmd.OutOrStdout(), note: cmd.ErrOrStderr()}
			if !follow {
				g, _, err := c.Gang(dctx, job, gang)
				if err != nil {
					return fmt.Errorf("logs: %w", err)
				}
				return lr.print(dctx, g, gen, false)
			}
			return lr.follow(ctx, gen)
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "dir", "", dirUsage)
	f.StringVar(&address, "address", "", addressUsage)
	f.StringVar(&gang, "gang", "", "the gang (default: the job's only gang)")
	f.IntVar(&rank, "rank", 0, "the worker's rank")
	f.IntVar(&gen, "gen", -1, "the gang generation (default: the newest on the rank's machine)")
	f.BoolVarP(&follow, "follow", "f", false, "keep printing as the worker writes, through the gang's restarts")
	return cmd
}

// jobGang checks that a job has the gang named (and names the job's only gang for ""),
// saying what there is when it does not: no such job, or the gangs it has.
func jobGang(ctx context.Context, c *api.Client, job, gang string) (string, error) {
	prefix := api.TableGangs + job + "/"
	l, err := c.List(ctx, prefix)
	if err != nil {
		return "", err
	}
	var gangs []string
	for _, kv := range l.KVs {
		gangs = append(gangs, strings.TrimPrefix(kv.Key, prefix))
	}
	if len(gangs) == 0 {
		var j api.Job
		found, err := c.Get(ctx, api.TableJobs+job, &j)
		switch {
		case err != nil:
			return "", err
		case !found:
			return "", fmt.Errorf("no job %q on this cluster (atoll status lists the jobs' gangs)", job)
		}
		return "", fmt.Errorf("job %q has no gang: no worker of it ran", job)
	}
	switch {
	case gang == "" && len(gangs) == 1:
		return gangs[0], nil
	case gang == "":
		return "", fmt.Errorf("job %q has %d gangs (%s): name one with --gang", job, len(gangs), someNames(gangs))
	case !slices.Contains(gangs, gang):
		return "", fmt.Errorf("job %q has no gang %q (its gangs: %s)", job, gang, someNames(gangs))
	}
	return gang, nil
}

// someNames lists names, the first ten of a longer list.
func someNames(names []string) string {
	if len(names) > 10 {
		return strings.Join(names[:10], ", ") + fmt.Sprintf(" and %d more", len(names)-10)
	}
	return strings.Join(names, ", ")
}

// logReader streams one rank's log from its agent.
type logReader struct {
	c           *api.Client
	token       string
	hc          *http.Client // the agents' API (with this command's certificate)
	job, gang   string
	rank        int
	out, note   io.Writer
	lastMachine string
}

var errNoLogYet = errors.New("no log yet")

// print streams the rank's log of generation gen (-1: the newest the agent has) from the
// machine the gang's record places it on; with follow it keeps streaming until ctx ends.
func (l *logReader) print(ctx context.Context, g api.Gang, gen int, follow bool) error {
	if g.Placement == nil || l.rank >= len(g.Placement.Members) {
		return fmt.Errorf("logs: gang %s/%s has no placed rank %d (it is %s)", l.job, l.gang, l.rank, g.State)
	}
	machine := g.Placement.Members[l.rank].Machine
	var m api.Machine
	if ok, err := l.c.Get(ctx, api.TableMachines+machine, &m); err != nil || !ok {
		return fmt.Errorf("logs: machine %s of rank %d: found %v, %v", machine, l.rank, ok, err)
	}
	q := url.Values{"job": {l.job}, "gang": {l.gang}, "rank": {strconv.Itoa(l.rank)}}
	if gen >= 0 {
		q.Set("gen", strconv.Itoa(gen))
	}
	if follow {
		q.Set("follow", "1")
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, m.Agent.API+"/v1/logs?"+q.Encode(), nil)
	if err != nil {
		return fmt.Errorf("logs: agent of %s at %q: %w", machine, m.Agent.API, err)
	}
	req.Header.Set("Authorization", "Bearer "+l.token)
	resp, err := l.hc.Do(req)
	if err != nil {
		return fmt.Errorf("logs: agent of %s: %w", machine, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		var eb api.ErrorBody
		_ = json.NewDecoder(io.LimitReader(resp.Body, 4096)).Decode(&eb)
		return fmt.Errorf("logs: agent of %s: %s: %w", machine, eb.Error, errNoLogYet)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("logs: agent of %s: %s", machine, strings.TrimSpace(string(b)))
	}
	l.lastMachine = machine
	_, err = io.Copy(l.out, resp.Body)
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// follow streams the current generation's log and, when the gang's record moves to a new
// generation, the next one's, until ctx ends or the gang ends.
func (l *logReader) follow(ctx context.Context, gen int) error {
	type update struct {
		g   api.Gang
		ok  bool
		err error
	}
	updates := make(chan update, 16)
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go func() {
		err := l.c.Watch(wctx, api.TableGangs+l.job+"/"+l.gang, func(reset bool, ls api.Listing, evs []meta.Event) error {
			kvs := ls.KVs
			for _, ev := range evs {
				kvs = append(kvs, ev.KV)
			}
			for _, kv := range kvs {
				var g api.Gang
				if kv.Key != api.TableGangs+l.job+"/"+l.gang || json.Unmarshal(kv.Value, &g) != nil {
					continue
				}
				select {
				case updates <- update{g: g, ok: true}:
				case <-wctx.Done():
					return wctx.Err()
				}
			}
			return nil
		})
		select {
		case updates <- update{err: err}:
		case <-wctx.Done():
		}
	}()
	var cur api.Gang
	shown := -1
	var streamCancel context.CancelFunc = func() {}
	streamDone := make(chan error, 1)
	streaming := false
	defer func() { streamCancel() }()
	start := func(g api.Gang, gen int) {
		sctx, cancel := context.WithCancel(ctx)
		streamCancel, streaming = cancel, true
		go func() { streamDone <- l.print(sctx, g, gen, true) }()
	}
	retry := time.NewTimer(time.Hour)
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case u := <-updates:
			if u.err != nil {
				return fmt.Errorf("logs: watching gang %s/%s: %w", l.job, l.gang, u.err)
			}
			cur = u.g
			if !cur.State.Live() {
				streamCancel()
				fmt.Fprintf(l.note, "--- gang %s/%s is %s: %s\n", l.job, l.gang, cur.State, cur.Reason)
				return nil
			}
			if cur.Generation == shown || cur.Placement == nil || (cur.State != api.GangStarting && cur.State != api.GangRunning) {
				continue
			}
			if shown >= 0 {
				streamCancel()
				if streaming {
					<-streamDone
				}
				fmt.Fprintf(l.note, "--- gang %s/%s restarted: generation %d, rank %d on %s\n", l.job, l.gang, cur.Generation, l.rank, cur.Placement.Members[min(l.rank, len(cur.Placement.Members)-1)].Machine)
				gen = cur.Generation
			}
			shown = cur.Generation
			streaming = false
			start(cur, gen)
		case err := <-streamDone:
			streaming = false
			if errors.Is(err, errNoLogYet) { // the worker has not started yet: try again shortly
				retry.Reset(200 * time.Millisecond)
				continue
			}
			if err != nil && ctx.Err() == nil {
				return err
			}
		case <-retry.C:
			if !streaming && shown >= 0 {
				g := cur
				if gen < 0 {
					gen = g.Generation
				}
				start(g, gen)
			}
		}
	}
}
