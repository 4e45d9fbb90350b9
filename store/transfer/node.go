package transfer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/atoll-run/atoll/store/object"
)

// NodeConfig configures a Node: one machine's store, its transfer server and its
// client. Token is required; the rest have defaults.
type NodeConfig struct {
	// Name labels this node's counters (node="Name") so that several nodes can
	// share one registry (the embedded default runs several in one process).
	Name string
	// Dir holds the store's spill files.
	Dir string
	// ListenAddr is where the transfer server listens. Default "127.0.0.1:0".
	ListenAddr string
	// Advertise, when set, is the host others reach this node at (a container's name when
	// it listens on 0.0.0.0): the store's Location is Advertise:<bound port>.
	Advertise string
	// Token is the shared cluster secret.
	Token []byte
	// Store configures the store; its Location is set to the bound address, and its
	// Registerer and Logger to the node's.
	Store  object.Config
	Server ServerConfig
	Client ClientConfig
	// LeaseReapInterval is how often the node expires the leases of holders that
	// stopped renewing (Store.StartLeaseReaper), releasing a dead reader's
	// references and mappings. Default 1s; negative turns the reaper off.
	LeaseReapInterval time.Duration
	// Registerer receives all counters; nil registers nothing.
	Registerer prometheus.Registerer
	Logger     *zap.Logger
}

// DefaultNodeConfig returns defaults for everything but Token and Dir.
func DefaultNodeConfig() NodeConfig {
	return NodeConfig{ListenAddr: "127.0.0.1:0", Store: object.DefaultConfig(), Server: DefaultServerConfig(), Client: DefaultClientConfig(),
		LeaseReapInterval: time.Second}
}

// Node is a machine's object store served on the transfer plane.
type Node struct {
	Store   *object.Store
	Server  *Server
	Client  *Client
	Metrics *Metrics
	// Addr is the transfer address, also the store's Location in the directory.
	Addr string

	stopReaper func()
}

// StartNode listens, opens the store with its location set to the bound address,
// and starts serving it.
func StartNode(cfg NodeConfig) (*Node, error) {
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.ListenAddr == "" {
		cfg.ListenAddr = "127.0.0.1:0"
	}
	reg := cfg.Registerer
	if reg != nil && cfg.Name != "" {
		reg = prometheus.WrapRegistererWith(prometheus.Labels{"node": cfg.Name}, reg)
	}
	log := cfg.Logger
	if cfg.Name != "" {
		log = log.With(zap.String("node", cfg.Name))
	}
	m, err := NewMetrics(reg)
	if err != nil {
		return nil, fmt.Errorf("transfer: start node %s: %w", cfg.Name, err)
	}
	ln, err := net.Listen("tcp", cfg.ListenAddr)
	if err != nil {
		return nil, fmt.Errorf("transfer: start node %s: listen %s: %w", cfg.Name, cfg.ListenAddr, err)
	}
	cfg.Store.Location = ln.Addr().String()
	if cfg.Advertise != "" {
		cfg.Store.Location = net.JoinHostPort(cfg.Advertise, strconv.Itoa(ln.Addr().(*net.TCPAddr).Port))
	}
	cfg.Store.Registerer = reg
	cfg.Store.Logger = log
	st, err := object.Open(cfg.Store, cfg.Dir)
	if err != nil {
		ln.Close()
		return nil, err
	}
	cfg.Server.Token, cfg.Server.Logger, cfg.Server.Metrics = cfg.Token, log, m
	srv, err := NewServer(cfg.Server, StoreSource{Store: st})
	if err != nil {
		ln.Close()
		st.Close()
		return nil, err
	}
	cfg.Client.Token, cfg.Client.Logger, cfg.Client.Metrics = cfg.Token, log, m
	cl, err := NewClient(cfg.Client)
	if err != nil {
		ln.Close()
		st.Close()
		return nil, err
	}
	go func() { _ = srv.Serve(ln) }()
	n := &Node{Store: st, Server: srv, Client: cl, Metrics: m, Addr: cfg.Store.Location, stopReaper: func() {}}
	if cfg.LeaseReapInterval >= 0 {
		iv := cfg.LeaseReapInterval
		if iv == 0 {
			iv = time.Second
		}
		n.stopReaper = st.StartLeaseReaper(context.Background(), iv)
	}
	return n, nil
}

// Get returns a view of id, pulling it first from the locations the store's
// directory lists if this node does not hold it. The caller releases the view.
// When the object was not here (Get pulled it, or waited for a concurrent pull of
// it into this store, which Get joins rather than repeats), owner gets one
// reference to the local copy, which stays until owner releases it; when it was
// here already, no reference is added.
func (n *Node) Get(ctx context.Context, id object.ID, owner string) (*object.View, error) {
	v, err := n.Store.Get(ctx, id)
	if err == nil || !errors.Is(err, object.ErrNotFound) {
		return v, err
	}
	meta, err := n.Store.Directory().Lookup(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("transfer: get %s: %w", id.Short(), err)
	}
	if _, err := n.Client.pull(ctx, n.Store, id, meta.Locations, PullOptions{Owner: owner}, true); err != nil {
		return nil, err
	}
	// owner's reference keeps the copy from being freed; Get restores it if it was
	// spilled meanwhile.
	return n.Store.Get(ctx, id)
}

// Shutdown stops serving and closes the store.
func (n *Node) Shutdown(ctx context.Context) error {
	n.stopReaper()
	err := n.Server.Shutdown(ctx)
	return errors.Join(err, n.Client.Close(), n.Store.Close())
}
