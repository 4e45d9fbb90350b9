package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/atoll-run/atoll/pools"
	"github.com/atoll-run/atoll/pools/provider"
	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/runtime/authz"
	"github.com/atoll-run/atoll/runtime/autoscale"
)

// poolsOptions are a head's --pools flags.
type poolsOptions struct {
	file    string // the pool file
	dir     string // where local agents keep their directories and logs
	join    string // the heads' API URLs as agents reach them
	predict bool
}

func (o *poolsOptions) flags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&o.file, "pools", "", "a pool file: run the pools autoscaler on the leader (docs/pools.md)")
	f.StringVar(&o.dir, "pools-dir", "", "directory of the local provider's agents (default: <data-dir>/pools)")
	f.StringVar(&o.join, "pools-join", "", "the heads' API URLs as launched agents reach them, comma-separated (default: this head's)")
	f.BoolVar(&o.predict, "pools-predict", false, "pre-warm machines for forecast gang arrivals")
}

// localSettings are the local provider's settings in a pool file (none yet: it runs
// `atoll agent --machine TYPE` processes of this executable).
type localSettings struct{}

// dockerSettings are the docker provider's settings in a pool file.
type dockerSettings struct {
	Socket  string   `json:"socket,omitempty"`
	Image   string   `json:"image"`
	Network string   `json:"network,omitempty"`
	Join    string   `json:"join,omitempty"`
	Binds   []string `json:"binds,omitempty"`
	// Discover: the agents discover their machine (NVML image) and get the host's GPUs
	// (GPUs of them; 0: all) as a device request, instead of declaring the pool's machine.
	Discover bool `json:"discover,omitempty"`
	GPUs     int  `json:"gpus,omitempty"`
}

func decodeSettings(raw json.RawMessage, v any) error {
	if len(raw) == 0 {
		return nil
	}
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

// buildProviders makes one provider per pool (pools sharing a provider type share it).
func buildProviders(set *pools.Set, o poolsOptions, cluster string, cred func(machine string) (string, error)) (map[string]autoscale.Provider, error) {
	out := map[string]autoscale.Provider{}
	var local *provider.Local
	for _, p := range set.Pools {
		where := fmt.Sprintf("%s: pool %s: provider %s", o.file, p.Spec.Name, p.Spec.Provider.Type)
		switch p.Spec.Provider.Type {
		case "local":
			var s localSettings
			if err := decodeSettings(p.Spec.Provider.Settings, &s); err != nil {
				return nil, fmt.Errorf("%s: settings: %w", where, err)
			}
			if local == nil {
				l, err := provider.NewLocal(provider.LocalConfig{Join: o.join, Dir: o.dir, Credential: cred})
				if err != nil {
					return nil, fmt.Errorf("%s: %w", where, err)
				}
				local = l
			}
			out[p.Spec.Name] = local
		case "docker":
			var s dockerSettings
			if err := decodeSettings(p.Spec.Provider.Settings, &s); err != nil {
				return nil, fmt.Errorf("%s: settings: %w", where, err)
			}
			join := s.Join
			if join == "" {
				join = o.join
			}
			d, err := provider.NewDocker(provider.DockerConfig{Socket: s.Socket, Image: s.Image, Cluster: cluster, Join: join, Network: s.Network, Binds: s.Binds,
				Env: tokenEnv(), Credential: cred, Discover: s.Discover, GPUs: s.GPUs})
			if err != nil {
				return nil, fmt.Errorf("%s: %w", where, err)
			}
			out[p.Spec.Name] = d
		case "kubernetes":
			k, err := provider.NewExec(provider.ExecConfig{Command: []string{kubernetesProgram()}, Settings: p.Spec.Provider.Settings,
				Cluster: cluster, Join: o.join})
			if err != nil {
				return nil, fmt.Errorf("%s: %w", where, err)
			}
			out[p.Spec.Name] = k
		default:
			return nil, fmt.Errorf("%s: a head runs real machines: the %q provider is for `atoll sim`", where, p.Spec.Provider.Type)
		}
	}
	return out, nil
}

// tokenEnv passes the cluster token to docker agents (the Engine keeps it in the
// container's config; mount a token file with binds where that matters).
func tokenEnv() []string {
	if t := os.Getenv("ATOLL_TOKEN"); t != "" {
		return []string{"ATOLL_TOKEN=" + t}
	}
	if f := os.Getenv("ATOLL_TOKEN_FILE"); f != "" {
		if b, err := os.ReadFile(f); err == nil {
			return []string{"ATOLL_TOKEN=" + strings.TrimSpace(string(b))}
		}
	}
	return nil
}

// agentCaller posts to an agent's API as the head (head.Head.CallAgent).
type agentCaller func(ctx context.Context, agentAPI, path string, body any) error

// poolController is what startPools needs of the head's controller.
type poolController interface {
	autoscale.Controller
	SetPoolStatus(func() *api.PoolsStatus)
	SetPoolInterrupt(func(machine string, after time.Duration) error)
}

// startPools loads the pool file and runs the autoscaler beside the controller until ctx
// ends. dataDir and address default the pools directory and join address.
func startPools(ctx context.Context, ctl poolController, o poolsOptions, dataDir, address string, token []byte, callAgent agentCaller, logger *zap.Logger) error {
	if o.file == "" {
		return nil
	}
	set, err := pools.LoadFile(o.file)
	if err != nil {
		return err
	}
	if o.dir == "" {
		o.dir = filepath.Join(dataDir, "pools")
	}
	if o.join == "" {
		o.join = address
	}
	abs, _ := filepath.Abs(o.dir)
	// Each machine's agent gets a credential of its own, not the cluster token.
	cred := func(machine string) (string, error) {
		tok, _, err := authz.NewToken(token, authz.Claims{Principal: authz.Agent(machine).String()})
		return tok, err
	}
	provs, err := buildProviders(set, o, "atoll-"+shortHash(abs), cred)
	if err != nil {
		return err
	}
	replicate := func(ctx context.Context, agentAPI, id, holder string) error {
		return callAgent(ctx, agentAPI, "/v1/objects/replicate", map[string]string{"id": id, "holder": holder})
	}
	r, err := autoscale.New(autoscale.Config{Pools: set, Providers: provs, Predict: o.predict, Replicate: replicate, Logger: logger}, ctl)
	if err != nil {
		return err
	}
	ctl.SetPoolStatus(r.Status)
	ctl.SetPoolInterrupt(r.Interrupt)
	go r.Run(ctx)
	return nil
}

func shortHash(s string) string {
	h := uint32(2166136261)
	for i := 0; i < len(s); i++ {
		h = (h ^ uint32(s[i])) * 16777619
	}
	return fmt.Sprintf("%08x", h)
}

// printPools writes the pools' part of `atoll status`.
func printPools(w io.Writer, ps *api.PoolsStatus) {
	if ps == nil {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "\nPOOL\tCAPACITY\tPROVIDER\tMACHINES\tLAUNCHING\tMIN..MAX\tUSD/H\tCOST SO FAR")
	for _, p := range ps.Pools {
		capacity := p.Capacity
		if p.SpotUnavailable {
			capacity += " (unavailable)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d..%d\t%.2f\t%.2f USD\n", p.Name, capacity, p.Provider, len(p.Machines), p.Launching, p.Min, p.Max, p.PricePerHour, p.CostUSD)
	}
	fmt.Fprintln(tw, "\nPOOL MACHINE\tSTATE\tSINCE\tIDLE\tNOTICE")
	for _, p := range ps.Pools {
		for _, m := range p.Machines {
			idle, notice := "-", "-"
			if m.IdleFor > 0 {
				idle = fmt.Sprintf("%v of %v", time.Duration(m.IdleFor).Round(time.Second), time.Duration(m.IdleTimeout))
			}
			if !m.Notice.IsZero() {
				notice = m.Notice.Format(time.TimeOnly)
			}
			fmt.Fprintf(tw, "%s/%s\t%s\t%s\t%s\t%s\n", p.Name, m.Name, m.State, m.Since.Format(time.TimeOnly), idle, notice)
		}
	}
	_ = tw.Flush()
	if n := len(ps.Events); n > 0 {
		fmt.Fprintln(w, "\nPOOL EVENTS (newest last)")
		for _, e := range ps.Events[max(0, n-10):] {
			what := e.Machine
			if what == "" {
				what = e.Gang
			}
			fmt.Fprintf(w, "%s %-13s %s %s: %s\n", e.Time.Format(time.TimeOnly), e.Kind, e.Pool, what, e.Reason)
		}
	}
}

// kubernetesProgram is the Kubernetes provider's program: ATOLL_PROVIDER_KUBERNETES, or
// atoll-provider-kubernetes in PATH (built from its own module, pools/provider/kubernetes,
// so that the atoll binary links no client-go).
func kubernetesProgram() string {
	if p := os.Getenv("ATOLL_PROVIDER_KUBERNETES"); p != "" {
		return p
	}
	return "atoll-provider-kubernetes"
}

// poolHeadArgs are the head flags `atoll up --pools` passes: the pool file, the local
// agents' directory in the cluster's, and every head's address for them to join.
func poolHeadArgs(file, clusterDir, address string) []string {
	abs, err := filepath.Abs(file)
	if err != nil {
		abs = file
	}
	return []string{"--pools", abs, "--pools-dir", filepath.Join(clusterDir, "pools"), "--pools-join", address}
}

// poolAgents lists the agents the local pool provider started in a cluster directory
// (from their pid files), for `atoll down`: a pid file holds a pid alone, so an agent is
// known by its command line naming its directory (procInfo.running).
func poolAgents(dir string) []procInfo {
	files, _ := filepath.Glob(filepath.Join(dir, "heads", "*", "pools", "pids", "*.pid"))
	more, _ := filepath.Glob(filepath.Join(dir, "pools", "pids", "*.pid"))
	var out []procInfo
	for _, f := range append(files, more...) {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 0 {
			continue
		}
		name := strings.TrimSuffix(filepath.Base(f), ".pid")
		out = append(out, procInfo{Name: name, PID: pid, Dir: filepath.Join(filepath.Dir(filepath.Dir(f)), "agents", name)})
	}
	return out
}
