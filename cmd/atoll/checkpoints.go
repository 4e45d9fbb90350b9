package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/runtime/objects"
)

// checkpointEntry is one committed checkpoint in `atoll checkpoints --json`: readable_parts
// counts the parts of which a copy was read back whole just now and matched its checksum.
type checkpointEntry struct {
	Job           string `json:"job"`
	Gang          string `json:"gang"`
	Step          int64  `json:"step"`
	Parts         int    `json:"parts"`
	ReadableParts int    `json:"readable_parts"`
	Bytes         int64  `json:"bytes"`
}

func newCheckpointsCmd() *cobra.Command {
	var dir, address, job, gang string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "checkpoints",
		Short: "List the committed checkpoints and how many of their parts can be read back now, verified",
		Long: `checkpoints lists every committed checkpoint (of --job and --gang when given): its parts, its
bytes, and how many parts can be read back now. A part counts as readable when the store of an
alive machine reads one of its copies whole (from shared memory, or from its durable file on
disk, or from the shared checkpoint directory it mounts) and its checksum matches the one the
checkpoint recorded.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			addr, _, err := clusterAddress(dir, address)
			if err != nil {
				return fmt.Errorf("checkpoints: %w", err)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 10*time.Minute)
			defer cancel()
			c, err := dialCluster(ctx, addr)
			if err != nil {
				return fmt.Errorf("checkpoints: %w", err)
			}
			entries, err := listCheckpoints(ctx, c, job, gang)
			if err != nil {
				return fmt.Errorf("checkpoints: %w", err)
			}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(entries)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "JOB\tGANG\tSTEP\tPARTS\tREADABLE\tBYTES")
			for _, e := range entries {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\n", e.Job, e.Gang, e.Step, e.Parts, e.ReadableParts, e.Bytes)
			}
			return tw.Flush()
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "dir", "", dirUsage)
	f.StringVar(&address, "address", "", addressUsage)
	f.StringVar(&job, "job", "", "only this job's checkpoints")
	f.StringVar(&gang, "gang", "", "only this gang's checkpoints (with --job)")
	f.BoolVar(&asJSON, "json", false, "print a JSON array: {job, gang, step, parts, readable_parts, bytes} per checkpoint")
	return cmd
}

// listCheckpoints reads the committed checkpoints and verifies every part.
func listCheckpoints(ctx context.Context, c *dialed, job, gang string) ([]checkpointEntry, error) {
	prefix := api.TableCheckpoints
	if job != "" {
		prefix += job + "/"
		if gang != "" {
			prefix += gang + "/"
		}
	}
	kvs, err := c.Meta().Range(ctx, prefix)
	if err != nil {
		return nil, err
	}
	l, err := c.List(ctx, api.TableMachines)
	if err != nil {
		return nil, err
	}
	agents := map[string]string{} // location -> API of an alive machine's agent that reads it
	for _, kv := range l.KVs {
		var m api.Machine
		if json.Unmarshal(kv.Value, &m) == nil && m.Alive {
			agents[m.Agent.Transfer] = m.Agent.API
			if d := m.Agent.CheckpointDir; d != "" {
				agents[objects.SharedLocation(d)] = m.Agent.API
			}
		}
	}
	entries := make([]checkpointEntry, 0, len(kvs))
	for _, kv := range kvs {
		var cp api.Checkpoint
		if err := json.Unmarshal(kv.Value, &cp); err != nil {
			return nil, fmt.Errorf("%s: %w", kv.Key, err)
		}
		e := checkpointEntry{Job: cp.Job, Gang: cp.Gang, Step: cp.Step, Parts: len(cp.Objects)}
		readable := make([]bool, len(cp.Objects))
		sizes := make([]int64, len(cp.Objects))
		var wg sync.WaitGroup
		sem := make(chan struct{}, 4)
		for r, id := range cp.Objects {
			var want *api.CheckpointPart
			if r < len(cp.Parts) {
				want = &cp.Parts[r]
				sizes[r] = want.Size
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				sem <- struct{}{}
				defer func() { <-sem }()
				size, ok := verifyPart(ctx, c, agents, id, want)
				readable[r] = ok
				if sizes[r] == 0 {
					sizes[r] = size
				}
			}()
		}
		wg.Wait()
		for r := range readable {
			if readable[r] {
				e.ReadableParts++
			}
			e.Bytes += sizes[r]
		}
		entries = append(entries, e)
	}
	return entries, nil
}

// verifyPart asks the stores that hold a copy of a part (alive machines' agents, and for
// a copy in a shared checkpoint directory an agent that mounts it) to read it whole and
// check it, until one copy matches the checksum the checkpoint recorded (or,
// for a checkpoint that recorded none, the object's record). It returns the part's size.
func verifyPart(ctx context.Context, c *dialed, agents map[string]string, id string, want *api.CheckpointPart) (int64, bool) {
	var rec objects.Record
	found, err := c.Get(ctx, api.TableObjects+id, &rec)
	if err != nil || !found || rec.State != "" {
		return 0, false
	}
	wantFP, wantSize := rec.Fingerprint, rec.Size
	if want != nil {
		wantFP, wantSize = want.Fingerprint, want.Size
	}
	for _, loc := range rec.Locations {
		u, ok := agents[loc]
		if !ok {
			continue
		}
		in, err := agentVerify(ctx, c, u, id, strings.HasPrefix(loc, objects.SharedPrefix))
		if err == nil && in.Size == wantSize && (wantFP == 0 || in.Fingerprint == wantFP) {
			return wantSize, true
		}
	}
	return wantSize, false
}

func agentVerify(ctx context.Context, c *dialed, agentURL, id string, shared bool) (api.ObjectInfo, error) {
	b, _ := json.Marshal(api.ObjectRef{ID: id, Shared: shared})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, agentURL+"/v1/objects/verify", bytes.NewReader(b))
	if err != nil {
		return api.ObjectInfo{}, err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := c.hc.Do(req)
	if err != nil {
		return api.ObjectInfo{}, err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return api.ObjectInfo{}, errors.New(strings.TrimSpace(string(body)))
	}
	var in api.ObjectInfo
	return in, json.Unmarshal(body, &in)
}
