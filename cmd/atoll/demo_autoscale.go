package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/atoll-run/atoll/internal/digits"
	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/sdk"
)

// builtinPools is the pool set `atoll demo --scenario autoscale` brings when it starts its own
// cluster: declared DGX H100 machines (simulated GPUs) from the local provider, spot and
// on-demand. Prices: AWS p5.48xlarge on demand (98.32 USD/h, us-east-1, 2024) and a 60%
// spot discount (as the pools' cost study declares).
const builtinPools = `{"pools": [
  {"name": "h100-spot", "machine": "dgx-h100", "capacity": "spot", "min": 0, "max": 4, "price_per_hour": 39.33,
   "idle_timeout": "15s", "provider": {"type": "local"}},
  {"name": "h100", "machine": "dgx-h100", "min": 0, "max": 4, "price_per_hour": 98.32,
   "idle_timeout": "15s", "provider": {"type": "local"}}
]}`

// runAutoscale runs `atoll demo --scenario autoscale`: on the cluster of --dir/--address, or
// on one it starts (one head and the built-in pools) and stops.
func runAutoscale(cmd *cobra.Command, dir, address string, o digits.Options, so digits.ScenarioOptions, asJSON bool) error {
	if cmd.Flags().Changed("kill-at") || cmd.Flags().Changed("workers") {
		return fmt.Errorf("demo: --scenario autoscale sizes its gang itself and injects an interruption, not a crash: --workers and --kill-at do not apply")
	}
	if so.ArriveAt < 1 || so.ArriveAt >= o.Steps {
		return fmt.Errorf("demo: --arrive-at %d: want 1..%d (before the run ends)", so.ArriveAt, o.Steps-1)
	}
	ctx := cmd.Context()
	if dir == "" && address == "" {
		tmp, err := os.MkdirTemp("", "atoll-autoscale-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		self, err := os.Executable()
		if err != nil {
			return err
		}
		file := filepath.Join(tmp, "pools.json")
		if err := os.WriteFile(file, []byte(builtinPools), 0o600); err != nil {
			return err
		}
		dir = filepath.Join(tmp, "cluster")
		if out, err := exec.CommandContext(ctx, self, "up", "--dir", dir, "--heads", "1", "--agents", "0", "--pools", file).CombinedOutput(); err != nil {
			return fmt.Errorf("demo: starting a cluster with the built-in pools: %v\n%s", err, out)
		}
		defer func() {
			if out, err := exec.Command(self, "down", "--dir", dir, "--grace", "5s").CombinedOutput(); err != nil {
				fmt.Fprintf(cmd.ErrOrStderr(), "demo: stopping the scenario's cluster: %v\n%s", err, out)
			}
		}()
		if !asJSON {
			fmt.Fprintf(cmd.ErrOrStderr(), "a cluster of one head and the built-in pools (no machines yet) in %s\n", dir)
		}
	}
	addr, _, err := clusterAddress(dir, address)
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	c, err := dialCluster(dctx, addr)
	cancel()
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	so.Options = o
	so.KillAtStep = -1
	so.ClusterOptions = append(so.ClusterOptions, sdk.WithAddress(addr))
	hooks := digits.AutoscaleHooks{Interrupt: func(ctx context.Context, machine string, after time.Duration) error {
		return c.InjectInterruption(ctx, api.InterruptRequest{Machine: machine, After: api.Duration(after)})
	}}
	res, err := digits.RunAutoscale(ctx, so, hooks)
	if err != nil {
		return fmt.Errorf("demo --scenario autoscale: %w", err)
	}
	if asJSON {
		return json.NewEncoder(cmd.OutOrStdout()).Encode(res)
	}
	b, _ := json.MarshalIndent(res, "", "  ")
	fmt.Fprintf(cmd.OutOrStdout(), "\nsummary\n%s\n", b)
	return nil
}
