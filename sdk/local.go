package sdk

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/atoll-run/atoll/actors"
	"github.com/atoll-run/atoll/runtime/agent"
	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/runtime/coll"
	"github.com/atoll-run/atoll/runtime/head"
	"github.com/atoll-run/atoll/runtime/objects"
	"github.com/atoll-run/atoll/store/paxos"
	"github.com/atoll-run/atoll/topology"
)

// DefaultSpec is the embedded default's machines: four simulated DGX H100 (8 GPUs joined
// by NVSwitch: one NVLink island of eight each) in one rack.
const DefaultSpec = "4xdgx-h100"

// DefaultObjectStore is the embedded default's object store per machine (they share one
// host's memory).
const DefaultObjectStore = 256 << 20

// embedded is a whole cluster in this process: heads, agents, and the workers hosted here.
type embedded struct {
	heads  []*head.Head
	agents []*agent.Agent
	dir    string
	own    *tempDir // the directory, when the cluster made it
}

// inprocLauncher starts a gang's workers in this process (the embedded default), each on
// its machine's store.
type inprocLauncher struct {
	c      *conn
	stores map[string]*objects.Local // machine name -> its store
}

// Launch implements agent.Launcher.
func (l *inprocLauncher) Launch(ctx context.Context, spec api.WorkerSpec, _ api.Job) (agent.Handle, error) {
	st := l.stores[spec.Machine]
	if st == nil {
		return nil, fmt.Errorf("sdk: no store for machine %s", spec.Machine)
	}
	h, err := l.c.host(ctx, spec, localStore{l: st, holder: spec.Holder})
	if err != nil {
		return nil, err
	}
	return h, nil
}

func startLocal(ctx context.Context, s settings) (*Cluster, error) {
	tc := s.topo
	if tc == nil {
		var err error
		if tc, err = topology.Load(DefaultSpec); err != nil {
			return nil, fmt.Errorf("sdk: the embedded default %q: %w", DefaultSpec, err)
		}
	}
	e := &embedded{dir: s.dataDir}
	if e.dir == "" {
		d, err := makeTempDir(tempPrefixLocal, s.log)
		if err != nil {
			return nil, fmt.Errorf("sdk: embedded cluster directory: %w", err)
		}
		e.dir, e.own = d.path, d
	}
	fail := func(err error) (*Cluster, error) {
		_ = e.shutdown(context.WithoutCancel(ctx))
		_ = e.removeDir()
		return nil, err
	}
	token := newToken()
	net := paxos.NewMemNetwork(1)
	var urls []string
	for id := uint64(1); id <= 3; id++ {
		h, err := head.Start(head.Config{ID: id, Initial: []uint64{1, 2, 3}, Transport: net.Transport(id),
			DataDir: filepath.Join(e.dir, fmt.Sprintf("head-%d", id)), Token: []byte(token), Logger: s.log})
		if err != nil {
			return fail(err)
		}
		e.heads = append(e.heads, h)
		urls = append(urls, h.Address())
	}
	var infos []api.HeadInfo
	for _, h := range e.heads {
		infos = append(infos, api.HeadInfo{ID: h.ID(), Address: h.Address()})
	}
	for _, h := range e.heads {
		h.SetHeads(infos)
	}
	client, err := api.NewClient(ctx, api.ClientConfig{Heads: urls, Token: token, Logger: s.log})
	if err != nil {
		return fail(err)
	}
	sys, err := actors.NewSystem(actors.Config{Logger: s.log, DefaultCallTimeout: s.callTimeout, Codec: s.codec})
	if err != nil {
		return fail(err)
	}
	c := &conn{s: s, log: s.log.Named("sdk"), client: client, sys: sys, token: token, owner: ownerName()}
	c.init()
	cl := &Cluster{c: c, embedded: e}
	if c.plane, err = coll.NewPlane(sys, []byte(token), "127.0.0.1", s.log); err != nil {
		_ = sys.Shutdown(ctx)
		return fail(err)
	}
	launcher := &inprocLauncher{c: c, stores: map[string]*objects.Local{}}
	capacity := s.objectCap
	if capacity == 0 {
		capacity = DefaultObjectStore
	}
	for _, m := range tc.Machines {
		a, err := agent.Start(ctx, agent.Config{Name: m.Name, Rack: m.Rack, Spec: m.Spec, Simulated: m.Simulated, Heads: urls,
			Token: []byte(token), Dir: filepath.Join(e.dir, "agents", m.Name), ObjectCapacity: capacity, Launcher: launcher, Logger: s.log})
		if err != nil {
			_ = cl.Shutdown(context.WithoutCancel(ctx))
			return nil, err
		}
		e.agents = append(e.agents, a)
		launcher.stores[m.Name] = a.Objects()
		c.locals[a.Objects().Node.Addr] = a.Objects()
	}
	c.objects = localStore{l: e.agents[0].Objects(), holder: c.owner}
	return cl, nil
}

func (e *embedded) shutdown(ctx context.Context) error {
	var errs []error
	for _, a := range e.agents {
		errs = append(errs, a.Shutdown(ctx))
	}
	for _, h := range e.heads {
		errs = append(errs, h.Close())
	}
	e.agents, e.heads = nil, nil
	return errors.Join(errs...)
}

func (e *embedded) removeDir() error { return e.own.remove() }
