package sdk

import (
	"context"
	"fmt"
	"net"
	"net/http"

	"github.com/atoll-run/atoll/actors"
	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/runtime/coll"
	"github.com/atoll-run/atoll/runtime/objects"
)

// WorkerHost hosts workers of this program in this process for agents that run in it,
// against a cluster reached over the network: the hollow agents of `atoll bench scale`,
// whose task workers must answer calls. A hosted worker is the actor a worker process
// would host (made, restored, supervised, called over this process's one mutually
// authenticated actor link), without a process of its own: the agent that launched it
// reports it ready with its address (HostedActor.Announce), on the agent's own
// credential, as it reports a hollow worker.
//
// Every worker hosted here shares one actor system, whose certificate is the
// credential's (an agent's): unlike a worker process, which admits the links of its own
// job only, it admits every authenticated link. It is a measuring instrument, not a way
// to run jobs.
type WorkerHost struct {
	c *conn
}

// HostConfig is where a WorkerHost's workers live.
type HostConfig struct {
	// Heads are the heads' API URLs.
	Heads []string
	// Token is the credential of the process's actor system (an agent's token: it gets
	// the certificate of its links and the links' key from the heads).
	Token string
	// CACert is the cluster CA's certificate (PEM), needed when the heads are https.
	CACert []byte
	// Listen is the host the actor system listens on (default 127.0.0.1).
	Listen string
}

// NewWorkerHost starts the actor system that hosts workers; opts are the program's kinds
// and tasks, as for Connect. Close it when done.
func NewWorkerHost(ctx context.Context, cfg HostConfig, opts ...Option) (*WorkerHost, error) {
	s, err := apply(opts)
	if err != nil {
		return nil, err
	}
	if len(cfg.Heads) == 0 || cfg.Token == "" {
		return nil, fmt.Errorf("%w: a worker host needs the heads and a token", ErrInvalid)
	}
	host := cfg.Listen
	if host == "" {
		host = "127.0.0.1"
	}
	id, err := clusterIdentity(ctx, cfg.Heads, cfg.Token, cfg.CACert, "host")
	if err != nil {
		return nil, fmt.Errorf("sdk: worker host: no certificate from the heads: %w", err)
	}
	cc := api.ClientConfig{Heads: cfg.Heads, Token: cfg.Token, Logger: s.log}
	secureLinks(id, &cc, nil, nil)
	client, err := api.NewClient(ctx, cc)
	if err != nil {
		return nil, fmt.Errorf("sdk: worker host: cannot reach the heads: %w", err)
	}
	var who api.WhoAmI
	if err := client.Do(ctx, http.MethodGet, "/v1/whoami", nil, &who); err != nil {
		return nil, fmt.Errorf("sdk: worker host: who it is to the heads: %w", err)
	}
	link := []byte(who.LinkKey)
	sys, err := actors.NewSystem(actors.Config{Logger: s.log, DefaultCallTimeout: s.callTimeout, Codec: s.codec, Errors: s.errors,
		Remote: remoteConfig(net.JoinHostPort(host, "0"), link, id, who.Principal, client)})
	if err != nil {
		return nil, fmt.Errorf("sdk: worker host: actor system: %w", err)
	}
	c := &conn{s: s, log: s.log.Named("host"), client: client, sys: sys, token: cfg.Token, principal: who.Principal,
		agents: httpClient(id), agentAnnounces: true}
	c.init()
	c.followCA(id, api.Renewal{Heads: cfg.Heads, Token: cfg.Token, Name: "host"})
	if c.plane, err = coll.NewPlane(sys, link, host, s.log); err != nil {
		c.endLife()
		_ = sys.Shutdown(ctx)
		return nil, fmt.Errorf("sdk: worker host: collectives: %w", err)
	}
	secureLinks(id, nil, c.plane, nil)
	return &WorkerHost{c: c}, nil
}

// HostsWorker reports whether the program has the worker's kind (a task worker's is built in).
func (w *WorkerHost) HostsWorker(spec api.WorkerSpec) bool { return w.c.s.kinds[spec.Kind] != nil }

// HostWorker starts the worker on its machine's store (the launching agent's) and returns once
// its actor runs.
func (w *WorkerHost) HostWorker(ctx context.Context, spec api.WorkerSpec, store *objects.Local) (*HostedActor, error) {
	h, err := w.c.host(ctx, spec, localStore{l: store, holder: spec.Holder})
	if err != nil {
		return nil, err
	}
	return &HostedActor{h}, nil
}

// HostedActor is a worker hosted by a WorkerHost.
type HostedActor struct{ *hosted }

// Announce is where calls reach the worker: its actor system's address and its actor's id.
func (a *HostedActor) Announce() (address, actorID string) {
	return a.c.sys.Address(), a.ref.ID()
}

// Close stops every worker hosted here and the actor system.
func (w *WorkerHost) Close(ctx context.Context) error {
	w.c.mu.Lock()
	hs := make([]*hosted, 0, len(w.c.hosted))
	for _, h := range w.c.hosted {
		hs = append(hs, h)
	}
	w.c.mu.Unlock()
	for _, h := range hs {
		h.stop()
	}
	w.c.endLife()
	_ = w.c.plane.Close()
	return w.c.sys.Shutdown(ctx)
}
