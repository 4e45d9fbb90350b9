package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/atoll-run/atoll/runtime/api"
)

func newSubmitCmd() *cobra.Command {
	var dir, address, name string
	var env []string
	var wait bool
	var pg processGangFlags
	cmd := &cobra.Command{
		Use:   "submit [flags] -- PROGRAM [ARGS...]",
		Short: "Run a driver program on the cluster (as `ray job submit` does), or any command as a process gang (--workers)",
		Long: `submit stores PROGRAM (an executable built for the cluster's machines, e.g. with go build) in
the cluster's object store, and the leader places it as a one-member driver gang: an agent runs
it with the cluster's address and token (ATOLL_ADDRESS, ATOLL_TOKEN_FILE), so its sdk.Start
connects, and its own jobs run their workers as usual. Its output is its agent's log: atoll
logs JOB --follow. The driver's gang completes when it exits with status 0, and fails
otherwise.

With --workers N, submit runs PROGRAM ARGS instead as a process gang of N members (any
executable: python3 train.py, a shell script), placed all-or-nothing like any gang, each
member with --gpus-per-worker GPUs and torchrun's environment (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT...; docs/process-gangs.md). Nothing is copied: PROGRAM must be on
every machine, and the members start in this directory where it exists there. The gang
completes when every member exits with status 0; a notice (a preemption, atoll drain)
reaches each member as --notice-signal plus the file $ATOLL_NOTICE_FILE, and members that
checkpoint and exit with --yield-exit-code yield: the gang queues again and starts the
command again when placed. Any other exit restarts the gang (--max-restarts).`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if name == "" {
				name = "submit-" + time.Now().UTC().Format("20060102-150405")
			}
			if err := api.CheckName("job", name); err != nil {
				return fmt.Errorf("submit: %w", err)
			}
			for _, e := range env {
				if k, _, ok := strings.Cut(e, "="); !ok || k == "" || strings.HasPrefix(k, "ATOLL_") {
					return fmt.Errorf("submit: --env %q: want NAME=value (and no ATOLL_ variable: the agent sets those)", e)
				}
			}
			if cmd.Flags().Changed("workers") {
				return submitProcessGang(cmd, dir, address, name, env, wait, pg, args)
			}
			if err := pg.unused(cmd); err != nil {
				return err
			}
			program, err := openProgram(args[0])
			if err != nil {
				return fmt.Errorf("submit: the program: %w", err)
			}
			defer program.Close()
			addr, _, err := clusterAddress(dir, address)
			if err != nil {
				return fmt.Errorf("submit: %w", err)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 5*time.Minute)
			defer cancel()
			c, err := dialCluster(ctx, addr)
			if err != nil {
				return fmt.Errorf("submit: %w", err)
			}
			bin, err := storeProgram(ctx, c, program, name)
			if err != nil {
				return fmt.Errorf("submit: %w", err)
			}
			if _, err := c.SubmitJob(ctx, api.Job{Name: name, Binary: bin, Args: args[1:], Env: env, Driver: "atoll submit"}); err != nil {
				return fmt.Errorf("submit: %w", err)
			}
			g, err := c.SpawnGang(ctx, api.GangSpec{Job: name, Name: "driver", Kind: "atoll$driver", Workers: 1, Driver: true,
				Resources: api.Resources{CPUMilli: 1000}})
			if err != nil {
				return fmt.Errorf("submit: %w", err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "submitted %s: its driver runs on %s\nfollow it: atoll logs %s --follow\n", name, g.Placement.Machines[0], name)
			if !wait {
				return nil
			}
			for {
				g, _, err := c.Gang(cmd.Context(), name, "driver")
				if err != nil {
					return err
				}
				switch g.State {
				case api.GangStopped:
					fmt.Fprintf(cmd.OutOrStdout(), "%s: %s\n", name, g.Reason)
					return nil
				case api.GangFailed:
					return fmt.Errorf("submit: %s failed: %s", name, g.Reason)
				}
				select {
				case <-cmd.Context().Done():
					return cmd.Context().Err()
				case <-time.After(200 * time.Millisecond):
				}
			}
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "dir", "", dirUsage)
	f.StringVar(&address, "address", "", addressUsage)
	f.StringVar(&name, "name", "", "the job's name (default submit-<time>)")
	f.StringArrayVar(&env, "env", nil, "NAME=value for the driver's environment (repeatable; never secrets: they are stored in the log)")
	f.BoolVar(&wait, "wait", false, "wait until the driver (or the process gang) finishes")
	pg.register(f)
	return cmd
}

// program is an executable to submit: a regular file, read as it is sent.
type program struct {
	*os.File
	size int64
}

// openProgram opens a program to submit, refusing what is not a regular file (a device
// such as /dev/zero, a pipe): it is streamed to an agent with its size declared, never
// read whole into memory.
func openProgram(path string) (*program, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !st.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%s is not a regular file (%v): submit an executable file", path, st.Mode().Type())
	}
	return &program{File: f, size: st.Size()}, nil
}

// storeProgram streams the program into an alive agent's object store (it outlives this
// command), hashing it on the way, and records it by content hash.
func storeProgram(ctx context.Context, c *dialed, prog *program, job string) (*api.Binary, error) {
	l, err := c.List(ctx, api.TableMachines)
	if err != nil {
		return nil, err
	}
	var agentURL string
	for _, kv := range l.KVs {
		var m api.Machine
		if json.Unmarshal(kv.Value, &m) == nil && m.Alive {
			agentURL = m.Agent.API
			break
		}
	}
	if agentURL == "" {
		return nil, errors.New("no machine is alive to keep the program")
	}
	h := sha256.New()
	body := io.TeeReader(io.LimitReader(prog, prog.size), h)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, agentURL+"/v1/objects/put?holder="+url.QueryEscape("submit/"+job), body)
	if err != nil {
		return nil, err
	}
	req.ContentLength = prog.size
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("store the program on %s: %s", agentURL, strings.TrimSpace(string(answer)))
	}
	var ref struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(answer, &ref); err != nil {
		return nil, err
	}
	b := &api.Binary{SHA256: hex.EncodeToString(h.Sum(nil)), Size: prog.size, Object: ref.ID}
	rec, _ := json.Marshal(b)
	if _, err := c.Meta().Put(ctx, api.TableBinaries+b.SHA256, rec); err != nil {
		return nil, err
	}
	return b, nil
}
