package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/atoll-run/atoll/internal/pki"
	"github.com/atoll-run/atoll/runtime/agent"
	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/topology"
)

// newAgentCmd is `atoll agent`: the agent of one machine.
func newAgentCmd() *cobra.Command {
	var (
		join, name, machine, dir, tokenFile string
		listen, transfer, gossip, advertise string
		gossipProbe                         time.Duration
		caCert, checkpointDir               string
		trustedFabric                       bool
		rack                                int
		objectStore, maxObject              int64
		loadInterval, reconcileInterval     time.Duration
		deadObjectKeep                      time.Duration
	)
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "Run the agent of this machine: register its GPUs, run its object store and the workers placed on it",
		Long: `agent joins the cluster whose heads --join names, registers this machine's topology (discovered
with NVML in a build with -tags nvml, PCIe and NUMA from sysfs, RDMA NICs with rdmamap; or a
declared machine with --machine SPEC, whose GPUs are simulated and declared as such), samples
its load every 200 ms, runs its object store and transfer server, and starts and supervises the
worker processes of the gangs placed on it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			token, err := readToken(tokenFile)
			if err != nil {
				return fmt.Errorf("agent: %w", err)
			}
			heads, err := api.ParseAddress(join)
			if err != nil {
				return fmt.Errorf("agent: --join: %w", err)
			}
			if caCert == "" {
				caCert = os.Getenv(api.CACertEnv)
			}
			var caPEM []byte
			if caCert != "" {
				if caPEM, err = pki.ReadCACert(caCert); err != nil {
					return fmt.Errorf("agent: --ca-cert: %w", err)
				}
			}
			if dir == "" {
				return errors.New("agent: --dir is required (the agent's store, executables and worker logs)")
			}
			if rack < 0 || rack > 1<<20 {
				return fmt.Errorf("agent: --rack %d out of 0..%d", rack, 1<<20)
			}
			if objectStore < 0 {
				return fmt.Errorf("agent: --object-store %d is negative", objectStore)
			}
			if loadInterval < 10*time.Millisecond || loadInterval > time.Minute {
				return fmt.Errorf("agent: --load-interval %v: want 10ms..1m", loadInterval)
			}
			if reconcileInterval < 100*time.Millisecond || reconcileInterval > time.Hour {
				return fmt.Errorf("agent: --reconcile-interval %v: want 100ms..1h", reconcileInterval)
			}
			if deadObjectKeep < time.Second {
				return fmt.Errorf("agent: --dead-object-keep %v: want 1s or more", deadObjectKeep)
			}
			if maxObject < 0 {
				return fmt.Errorf("agent: --max-object-size %d is negative", maxObject)
			}
			logger, err := zap.NewProduction()
			if err != nil {
				return err
			}
			defer logger.Sync()
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			spec, simulated, err := machineSpec(ctx, machine)
			if err != nil {
				return fmt.Errorf("agent: %w", err)
			}
			if name == "" {
				if name, err = os.Hostname(); err != nil {
					return fmt.Errorf("agent: --name not given and no host name: %w", err)
				}
			}
			if gossip == "none" {
				gossip = ""
			}
			sctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			a, err := agent.Start(sctx, agent.Config{Name: name, Rack: rack, Spec: spec, Simulated: simulated, Heads: heads, Token: token, CACert: caPEM,
				Dir: dir, Listen: listen, TransferListen: transfer, Advertise: advertise, ObjectCapacity: objectStore, LoadInterval: loadInterval,
				MaxObjectSize: maxObject, ReconcileInterval: reconcileInterval, DeadObjectKeep: deadObjectKeep, CheckpointDir: checkpointDir, TrustedFabric: trustedFabric,
				Gossip: gossip, GossipProbe: gossipProbe, Logger: logger})
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "agent %s %s\n", name, a.Address())
			<-ctx.Done()
			sd, cancel2 := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel2()
			return a.Shutdown(sd)
		},
	}
	f := cmd.Flags()
	f.StringVar(&join, "join", "", "the heads' API `URLS`, comma-separated (as atoll address prints them)")
	f.StringVar(&name, "name", "", "this machine's name in the cluster (default the host name)")
	f.StringVar(&machine, "machine", "", "declare this machine instead of discovering it: a built-in machine (dgx-h100, ...) or a spec file with one machine; its GPUs are simulated")
	f.IntVar(&rack, "rack", 0, "the machine's rack")
	f.StringVar(&dir, "dir", "", "the agent's directory `DIR`: object store spill files, executables, worker specs and logs")
	f.StringVar(&tokenFile, "token-file", "", "file holding the cluster token, mode 0600 (default $ATOLL_TOKEN_FILE, or $ATOLL_TOKEN)")
	f.StringVar(&caCert, "ca-cert", "", "the cluster CA's certificate (ca.crt), needed when the heads are https: the agent gets its own certificate from them (default $ATOLL_CA_CERT)")
	f.StringVar(&listen, "listen", "127.0.0.1:0", "address of the agent API")
	f.StringVar(&transfer, "transfer-listen", "127.0.0.1:0", "address of the object store's transfer server")
	f.StringVar(&advertise, "advertise", "", "host the other machines reach this one at, when it listens on 0.0.0.0 (a container's name); its workers listen there too")
	f.StringVar(&gossip, "gossip", "127.0.0.1:0", "address to gossip on (serf membership); \"none\" turns it off")
	f.DurationVar(&gossipProbe, "gossip-probe", 500*time.Millisecond, gossipProbeUsage)
	f.Int64Var(&objectStore, "object-store", 0, "bytes of the object store's shared-memory tier (0: the store's default share of RAM)")
	f.DurationVar(&loadInterval, "load-interval", time.Second, "how often the machine's load is sampled and reported (the report is its heartbeat to the leader)")
	f.BoolVar(&trustedFabric, "trusted-fabric", false, "the network between machines is trusted and isolated (as NCCL and MPI fabrics are): collective links between worker processes run without TLS (peers still authenticate; chunks still checksummed); every other link keeps mutual TLS; give it on every machine of the cluster or none")
	f.StringVar(&checkpointDir, "checkpoint-dir", "", "a shared checkpoint directory (the same path on every machine that mounts it): the second durable copy of checkpoints and detached objects goes there instead of to another machine")
	f.Int64Var(&maxObject, "max-object-size", 0, "bytes of the largest object the store takes (a larger put is refused with 413; 0: the store's capacity)")
	f.DurationVar(&reconcileInterval, "reconcile-interval", 10*time.Second, "how often the object directory is reconciled with the live stores and owners (by the alive machine whose name sorts first)")
	f.DurationVar(&deadObjectKeep, "dead-object-keep", 10*time.Minute, "how long the record of a lost object, or of one whose owner ended, is kept before it is collected")
	return cmd
}

// machineSpec declares a machine (simulated GPUs) or discovers this one.
func machineSpec(ctx context.Context, declared string) (*topology.MachineSpec, bool, error) {
	if declared != "" {
		tc, err := topology.Load(declared)
		if err != nil {
			return nil, false, fmt.Errorf("--machine %q: %w", declared, err)
		}
		if len(tc.Machines) != 1 {
			return nil, false, fmt.Errorf("--machine %q declares %d machines; an agent runs one", declared, len(tc.Machines))
		}
		return tc.Machines[0].Spec, true, nil
	}
	spec, rep, err := topology.DiscoverSpec(ctx, topology.DefaultDiscoverOptions())
	if err != nil {
		return nil, false, fmt.Errorf("discover this machine (or declare it with --machine SPEC): %w", err)
	}
	for _, l := range rep.Lines() {
		fmt.Fprintln(os.Stderr, "discovery:", l)
	}
	return spec, false, nil
}
