// Package local is Atoll's embedded default: three head replicas (the Paxos metadata log,
// fsync'd in a temporary directory) and one agent per simulated machine, all in this
// process, with the program's workers hosted here too. By default the machines are four
// simulated DGX H100s (sdk.DefaultSpec: each one NVLink island of 8); simulated GPUs are
// declared as such, never claimed as hardware.
//
// A program opts into it; one that only connects to clusters imports sdk alone and links
// no head, Paxos or agent:
//
//	c, err := local.Start(ctx, sdk.Tasks(square)) // ATOLL_ADDRESS set: connects; else embedded
//	c, err := local.Cluster(ctx, sdk.WithSpec("2xdgx-h100")) // always embedded
//	c, err := sdk.Start(ctx, local.Default(), ...)           // the same as local.Start
package local

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/atoll-run/atoll/runtime/agent"
	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/runtime/head"
	"github.com/atoll-run/atoll/runtime/objects"
	"github.com/atoll-run/atoll/sdk"
	"github.com/atoll-run/atoll/sdk/internal/embed"
	"github.com/atoll-run/atoll/store/paxos"
)

// Default is the option that makes the embedded default available to sdk.Start (used when
// no cluster address is given) and sdk.Local.
func Default() sdk.Option { return sdk.WithEmbedded(start) }

// Start is sdk.Start with the embedded default available: it connects to the cluster named
// by sdk.WithAddress or ATOLL_ADDRESS, and otherwise starts the embedded default.
func Start(ctx context.Context, opts ...sdk.Option) (*sdk.Cluster, error) {
	return sdk.Start(ctx, append(opts, Default())...)
}

// Cluster starts the embedded default whatever the environment says (sdk.Local).
func Cluster(ctx context.Context, opts ...sdk.Option) (*sdk.Cluster, error) {
	return sdk.Local(ctx, append(opts, Default())...)
}

// cluster is a whole cluster in this process: heads and agents.
type cluster struct {
	heads  []*head.Head
	agents []*agent.Agent
	urls   []string
	stores []embed.Store
}

var _ embed.Cluster = (*cluster)(nil)

func (c *cluster) Heads() []string       { return c.urls }
func (c *cluster) Stores() []embed.Store { return c.stores }

// launcher starts a gang's workers in this process, each on its machine's store.
type launcher struct {
	host   func(ctx context.Context, spec api.WorkerSpec, store *objects.Local) (embed.Handle, error)
	stores map[string]*objects.Local // machine name -> its store
	// procs start process gangs' members (their own commands, as processes), by machine.
	procs map[string]*agent.ExecLauncher
}

// Launch implements agent.Launcher.
func (l *launcher) Launch(ctx context.Context, spec api.WorkerSpec, job api.Job) (agent.Handle, error) {
	if spec.Process != nil {
		p := l.procs[spec.Machine]
		if p == nil {
			return nil, fmt.Errorf("local: no machine %s in this process", spec.Machine)
		}
		return p.Launch(ctx, spec, job)
	}
	st := l.stores[spec.Machine]
	if st == nil {
		return nil, fmt.Errorf("local: no machine %s in this process", spec.Machine)
	}
	return l.host(ctx, spec, st)
}

func start(ctx context.Context, cfg embed.Config) (embed.Cluster, error) {
	c := &cluster{}
	fail := func(err error) (embed.Cluster, error) {
		_ = c.Shutdown(context.WithoutCancel(ctx))
		return nil, err
	}
	net := paxos.NewMemNetwork(1)
	for id := uint64(1); id <= 3; id++ {
		h, err := head.Start(head.Config{ID: id, Initial: []uint64{1, 2, 3}, Transport: net.Transport(id),
			DataDir: filepath.Join(cfg.Dir, fmt.Sprintf("head-%d", id)), Token: []byte(cfg.Token), Logger: cfg.Logger})
		if err != nil {
			return fail(err)
		}
		c.heads = append(c.heads, h)
		c.urls = append(c.urls, h.Address())
	}
	var infos []api.HeadInfo
	for _, h := range c.heads {
		infos = append(infos, api.HeadInfo{ID: h.ID(), Address: h.Address()})
	}
	for _, h := range c.heads {
		h.SetHeads(infos)
	}
	l := &launcher{stores: map[string]*objects.Local{}, procs: map[string]*agent.ExecLauncher{}, host: cfg.Host}
	for _, m := range cfg.Topology.Machines {
		dir := filepath.Join(cfg.Dir, "agents", m.Name)
		l.procs[m.Name] = &agent.ExecLauncher{RunDir: filepath.Join(dir, "run"), LogDir: filepath.Join(dir, "logs")}
		a, err := agent.Start(ctx, agent.Config{Name: m.Name, Rack: m.Rack, Spec: m.Spec, Simulated: m.Simulated, Heads: c.urls,
			Token: []byte(cfg.Token), Dir: dir, ObjectCapacity: cfg.ObjectCapacity, Launcher: l, Logger: cfg.Logger})
		if err != nil {
			return fail(err)
		}
		c.agents = append(c.agents, a)
		l.stores[m.Name] = a.Objects()
		c.stores = append(c.stores, embed.Store{Machine: m.Name, Local: a.Objects()})
	}
	return c, nil
}

// Shutdown implements embed.Cluster.
func (c *cluster) Shutdown(ctx context.Context) error {
	var errs []error
	for _, a := range c.agents {
		errs = append(errs, a.Shutdown(ctx))
	}
	for _, h := range c.heads {
		errs = append(errs, h.Close())
	}
	c.agents, c.heads = nil, nil
	return errors.Join(errs...)
}
