package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/atoll-run/atoll/internal/pki"
	"github.com/atoll-run/atoll/runtime/agent"
	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/sdk"
)

// hollowName is the name of hollow machine i.
func hollowName(i int) string { return fmt.Sprintf("hollow-%05d", i) }

// hollowConfig is one process of hollow agents (`atoll bench hollow-agents`).
type hollowConfig struct {
	join, machine, dir, caCert string
	first, count               int
	// gossip is how many of this process's agents run a serf member of their own (the
	// first ones); the others are judged by their load reports alone.
	gossip      int
	gossipProbe time.Duration
	concurrency int
	objectStore int64
	// host: the process hosts the task workers (and the tasks' count actor) of `bench
	// scale --tasks` as real actors that answer calls (sdk.WorkerHost).
	host bool
}

func (c hollowConfig) validate() error {
	switch {
	case c.join == "":
		return errors.New("--join is required")
	case c.dir == "":
		return errors.New("--dir is required (it holds agents/<name>/credential of each machine)")
	case c.first < 0 || c.count < 1 || c.count > 20_000:
		return fmt.Errorf("--first %d --count %d: want first ≥ 0 and count in 1..20000", c.first, c.count)
	case c.gossip < 0:
		return fmt.Errorf("--gossip %d is negative", c.gossip)
	case c.concurrency < 1 || c.concurrency > 256:
		return fmt.Errorf("--concurrency %d: want 1..256", c.concurrency)
	case c.objectStore < 1<<20:
		return fmt.Errorf("--object-store %d: want at least 1 MiB", c.objectStore)
	}
	return nil
}

// newBenchHollowAgentsCmd is one process of hollow agents: `atoll bench scale` starts a
// few of them.
func newBenchHollowAgentsCmd() *cobra.Command {
	cfg := hollowConfig{machine: "dgx-h100", concurrency: 8, objectStore: 4 << 20, gossipProbe: 500 * time.Millisecond}
	cmd := &cobra.Command{
		Use:   "hollow-agents",
		Short: "Hollow agents of `atoll bench scale`: the real agent with hollow workers, many per process, each with its own credential",
		Long: `hollow-agents runs --count agents in this process, machines hollow-<first>..., each the real
agent (runtime/agent) of a declared --machine with a hollow launcher: its workers are reported
ready and stopped as processes would be, without processes. Each reads its own credential from
DIR/agents/<name>/credential (a scoped agent token, as atoll up makes them) and gets its own
certificate from the heads. The first --gossip of them run a serf member each; the others
are watched by their load reports alone. With --host, the workers of the kinds this program
has (the task workers and the count actor of bench scale --tasks) are hosted in this process
as real actors that answer calls (one actor system for all). It prints "hollow: N registered" once all are up and
runs until SIGTERM.`,
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cfg.validate(); err != nil {
				return fmt.Errorf("hollow-agents: %w", err)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return runHollowAgents(ctx, cfg, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.join, "join", "", "the heads' API `URLS`, comma-separated")
	f.StringVar(&cfg.machine, "machine", cfg.machine, "the machine each hollow agent declares")
	f.StringVar(&cfg.dir, "dir", "", "the directory `DIR` holding agents/<name>/ of each machine (its credential, its store)")
	f.StringVar(&cfg.caCert, "ca-cert", "", "the cluster CA's certificate (default $ATOLL_CA_CERT)")
	f.IntVar(&cfg.first, "first", 0, "the number of the first machine (hollow-NNNNN)")
	f.IntVar(&cfg.count, "count", 1, "how many hollow agents this process runs")
	f.IntVar(&cfg.gossip, "gossip", 0, "how many of them (the first) run a serf member")
	f.DurationVar(&cfg.gossipProbe, "gossip-probe", cfg.gossipProbe, gossipProbeUsage)
	f.IntVar(&cfg.concurrency, "concurrency", cfg.concurrency, "agents starting at once")
	f.Int64Var(&cfg.objectStore, "object-store", cfg.objectStore, "bytes of each agent's object store")
	f.BoolVar(&cfg.host, "host", false, "host the task workers of bench scale --tasks as actors that answer calls")
	return cmd
}

// runHollowAgents starts the agents, reports, and runs until ctx ends.
func runHollowAgents(ctx context.Context, cfg hollowConfig, out interface{ Write([]byte) (int, error) }) error {
	if err := envProfile(fmt.Sprintf("hollow-%d", cfg.first)); err != nil {
		return fmt.Errorf("hollow-agents: %w", err)
	}
	heads, err := api.ParseAddress(cfg.join)
	if err != nil {
		return fmt.Errorf("hollow-agents: --join: %w", err)
	}
	if cfg.caCert == "" {
		cfg.caCert = os.Getenv(api.CACertEnv)
	}
	var caPEM []byte
	if cfg.caCert != "" {
		if caPEM, err = pki.ReadCACert(cfg.caCert); err != nil {
			return fmt.Errorf("hollow-agents: --ca-cert: %w", err)
		}
	}
	spec, _, err := machineSpec(ctx, cfg.machine)
	if err != nil {
		return fmt.Errorf("hollow-agents: %w", err)
	}
	lc := zap.NewProductionConfig()
	lc.Level = zap.NewAtomicLevelAt(zapcore.WarnLevel) // thousands of agents: their warnings only
	logger, err := lc.Build()
	if err != nil {
		return err
	}
	defer logger.Sync()
	var wh *sdk.WorkerHost
	if cfg.host {
		// Its links' certificate is the first machine's agent's.
		token, err := sdk.ReadTokenFile(filepath.Join(cfg.dir, "agents", hollowName(cfg.first), agentCredentialFile))
		if err != nil {
			return fmt.Errorf("hollow-agents: --host: %w", err)
		}
		hctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		wh, err = sdk.NewWorkerHost(hctx, sdk.HostConfig{Heads: heads, Token: string(token), CACert: caPEM},
			append(scaleTaskKinds(), sdk.WithLogger(logger))...)
		cancel()
		if err != nil {
			return fmt.Errorf("hollow-agents: --host: %w", err)
		}
		defer wh.Close(context.Background())
	}
	agents := make([]*agent.Agent, cfg.count)
	errs := make([]error, cfg.count)
	sem := make(chan struct{}, cfg.concurrency)
	var wg sync.WaitGroup
	began := time.Now()
	for i := range cfg.count {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			name := hollowName(cfg.first + i)
			dir := filepath.Join(cfg.dir, "agents", name)
			token, err := sdk.ReadTokenFile(filepath.Join(dir, agentCredentialFile))
			if err != nil {
				errs[i] = fmt.Errorf("hollow agent %s: its credential: %w", name, err)
				return
			}
			shm := filepath.Join(dir, "shm") // its store's hot tier: files on disk, nothing is put
			if err := os.MkdirAll(shm, 0o700); err != nil {
				errs[i] = fmt.Errorf("hollow agent %s: %w", name, err)
				return
			}
			gossip := ""
			if i < cfg.gossip {
				gossip = "127.0.0.1:0"
			}
			sctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
			defer cancel()
			l := &agent.HollowLauncher{}
			var hosted *hostOn
			if wh != nil {
				hosted = &hostOn{wh: wh, started: make(chan struct{})}
				l.Host = hosted
			}
			agents[i], errs[i] = agent.Start(sctx, agent.Config{Name: name, Rack: (cfg.first + i) / 32, Spec: spec, Simulated: true,
				Heads: heads, Token: token, CACert: caPEM, Dir: dir, ObjectCapacity: cfg.objectStore, ShmDir: shm,
				Launcher: l, Load: agent.HollowLoad, Gossip: gossip, GossipProbe: cfg.gossipProbe,
				Logger: logger.With(zap.String("hollow", name))})
			if hosted != nil {
				hosted.a = agents[i]
				close(hosted.started)
			}
		}()
	}
	wg.Wait()
	shutdown := func() {
		var sw sync.WaitGroup
		for _, a := range agents {
			if a == nil {
				continue
			}
			sw.Add(1)
			go func() {
				defer sw.Done()
				sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				_ = a.Shutdown(sctx)
			}()
		}
		sw.Wait()
	}
	if err := errors.Join(errs...); err != nil {
		shutdown()
		return fmt.Errorf("hollow-agents: %w", err)
	}
	fmt.Fprintf(out, "hollow: %d registered in %.1f s\n", cfg.count, time.Since(began).Seconds())
	<-ctx.Done()
	shutdown()
	return nil
}

// hostOn hosts one hollow agent's workers of the program's kinds in the process's
// WorkerHost, on that agent's object store.
type hostOn struct {
	wh      *sdk.WorkerHost
	started chan struct{} // closed once agent.Start returned (a is nil if it failed)
	a       *agent.Agent
}

func (h *hostOn) Hosts(spec api.WorkerSpec) bool { return h.wh.HostsWorker(spec) }

func (h *hostOn) Host(ctx context.Context, spec api.WorkerSpec) (agent.Handle, error) {
	select {
	case <-h.started:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if h.a == nil {
		return nil, errors.New("hollow agent did not start")
	}
	w, err := h.wh.HostWorker(ctx, spec, h.a.Objects())
	if err != nil {
		return nil, err // not a nil *HostedActor in a non-nil Handle
	}
	return w, nil
}
