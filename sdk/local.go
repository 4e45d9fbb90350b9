package sdk

import (
	"context"
	"fmt"

	"github.com/atoll-run/atoll/actors"
	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/runtime/authz"
	"github.com/atoll-run/atoll/runtime/coll"
	"github.com/atoll-run/atoll/runtime/objects"
	"github.com/atoll-run/atoll/sdk/internal/embed"
	"github.com/atoll-run/atoll/topology"
)

// DefaultSpec is the embedded default's machines: four simulated DGX H100 (8 GPUs joined
// by NVSwitch: one NVLink island of eight each) in one rack.
const DefaultSpec = "4xdgx-h100"

// DefaultObjectStore is the embedded default's object store per machine (they share one
// host's memory; shared memory is taken as objects fill it, not reserved), and a driver's
// own store on a cluster. 1 GiB holds a
// put of Ray's microbenchmark (800 MB) whole: at 256 MiB it went in parts, spilled and
// compressed to disk as it came, at 0.6 GB/s.
const DefaultObjectStore = 1 << 30

// WithEmbedded makes an embedded cluster available to Start (when no address is given) and
// Local. Pass local.Default() from package sdk/local: the embedded default is opt-in, so
// that a program that only connects to clusters links no head, Paxos or agent.
func WithEmbedded(start embed.Starter) Option {
	return func(s *settings) error {
		s.embed = start
		return nil
	}
}

// embedded is a whole cluster in this process: heads, agents, and the workers hosted here.
type embedded struct {
	cluster embed.Cluster
	dir     string
	own     *tempDir // the directory, when the cluster made it
}

func startLocal(ctx context.Context, s settings) (*Cluster, error) {
	if s.embed == nil {
		return nil, fmt.Errorf("%w: no cluster address (WithAddress or ATOLL_ADDRESS) and no embedded cluster: "+
			"start with local.Start, or pass local.Default(), from github.com/atoll-run/atoll/sdk/local", ErrNoCluster)
	}
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
	capacity := s.objectCap
	if capacity == 0 {
		capacity = DefaultObjectStore
	}
	// The agents host their workers here, through the conn made once the heads answer:
	// a worker placed before then (a data directory with running gangs) waits for it.
	gate := make(chan struct{})
	var hc *conn // set before gate closes; nil if the start failed
	opened := false
	open := func(c *conn) {
		if !opened {
			hc, opened = c, true
			close(gate)
		}
	}
	defer open(nil)
	host := func(ctx context.Context, spec api.WorkerSpec, st *objects.Local) (embed.Handle, error) {
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if hc == nil {
			return nil, fmt.Errorf("sdk: the embedded cluster did not start")
		}
		h, err := hc.host(ctx, spec, localStore{l: st, holder: spec.Holder})
		if err != nil {
			return nil, err // not a nil *hosted in a non-nil Handle
		}
		return h, nil
	}
	token := newToken()
	cl, err := s.embed(ctx, embed.Config{Topology: tc, Dir: e.dir, Token: token, ObjectCapacity: capacity, Logger: s.log, Host: host})
	if err != nil {
		return fail(err)
	}
	e.cluster = cl
	client, err := api.NewClient(ctx, api.ClientConfig{Heads: cl.Heads(), Token: token, Logger: s.log})
	if err != nil {
		return fail(err)
	}
	sys, err := actors.NewSystem(actors.Config{Logger: s.log, DefaultCallTimeout: s.callTimeout, Codec: s.codec, Errors: s.errors})
	if err != nil {
		return fail(err)
	}
	c := &conn{s: s, log: s.log.Named("sdk"), client: client, sys: sys, token: token, owner: ownerName(), principal: authz.Admin().String()}
	c.init()
	if c.plane, err = coll.NewPlane(sys, authz.LinkKey([]byte(token)), "127.0.0.1", s.log); err != nil {
		_ = sys.Shutdown(ctx)
		return fail(err)
	}
	stores := cl.Stores()
	if len(stores) == 0 {
		_ = c.plane.Close()
		_ = sys.Shutdown(ctx)
		return fail(fmt.Errorf("%w: the embedded cluster has no machine", ErrInvalid))
	}
	for _, st := range stores {
		c.locals[st.Local.Node.Addr] = st.Local
	}
	c.objects = localStore{l: stores[0].Local, holder: c.owner}
	if err := c.registerOwner(ctx, ""); err != nil {
		_ = c.plane.Close()
		_ = sys.Shutdown(ctx)
		return fail(err)
	}
	open(c)
	return &Cluster{c: c, embedded: e}, nil
}

func (e *embedded) shutdown(ctx context.Context) error {
	if e.cluster == nil {
		return nil
	}
	err := e.cluster.Shutdown(ctx)
	e.cluster = nil
	return err
}

func (e *embedded) removeDir() error { return e.own.remove() }
