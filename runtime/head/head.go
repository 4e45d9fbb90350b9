package head

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"golang.org/x/net/netutil"

	"github.com/atoll-run/atoll/internal/pki"
	"github.com/atoll-run/atoll/internal/tlsgate"
	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/runtime/member"
	"github.com/atoll-run/atoll/store/meta/metaserver"
	"github.com/atoll-run/atoll/store/paxos"
)

// Paxos timing of a head by default: ten timer wake-ups a second, an election after 1-2 s
// of the leader's silence. On a loaded machine a 10 ms tick and a 100-200 ms timeout made
// leaders change several times a minute with no fault; these hold.
const (
	DefaultTick            = 100 * time.Millisecond
	DefaultElectionTimeout = 10 * DefaultTick
)

// Config configures one head: a replica of the Paxos metadata log, its control plane, and
// its HTTP API.
type Config struct {
	// ID is this replica's id; Peers are the replicas' Paxos addresses by id (this one's
	// included), used by the TCP transport; Initial the first configuration's members
	// (default: every id of Peers); Join marks a replica added to a running group.
	ID      uint64
	Peers   map[uint64]string
	Initial []uint64
	Join    bool
	// Transport carries Paxos messages. Default: TCP with the token handshake on
	// Peers[ID].
	Transport paxos.Transport
	// DataDir holds the WAL. NoSync turns fsync off (tests only).
	DataDir string
	NoSync  bool
	// Tick is the Paxos tick (default DefaultTick) and ElectionTimeout the shortest silence
	// of the leader after which a follower asks for an election (default ten ticks: 1 s at
	// the default tick; at least paxos.MinElectionTicks ticks). Heartbeats go out five
	// times per election timeout. See paxos.ReplicaConfig.SetTiming.
	Tick            time.Duration
	ElectionTimeout time.Duration
	// APIListen is the HTTP API's address. Default 127.0.0.1:0.
	APIListen string
	// MaxAPIConns bounds the API's open connections (further ones wait in the kernel's
	// backlog until one closes). Default: half of the process's open-file limit, at least
	// 256, so that a storm of reconnecting clients (every agent of a large cluster, when a
	// leader dies) cannot take the descriptors the Paxos links and the log need: at 1,000
	// machines one head ran out of its 20,000 (BENCHMARKS.md, "Scale envelope"; no leader
	// was elected then, nor in the runs with this bound, which did not run out: that is
	// another cause, still open).
	MaxAPIConns int
	// MaxInflight bounds the API's requests served at once, long polls aside (0: no bound;
	// DefaultMaxInflight(GOMAXPROCS) is the figure tried at 2,000 machines); the machines'
	// load reports have as many slots again of their own. One over the bound waits up to
	// a second for a slot, then is answered 503 with a retry hint; one that waits for a
	// commit gives its slot back meanwhile. The waiting requests are blocked, not
	// runnable: at 2,000 machines on two shared cores the leader had up to 1,950 runnable
	// goroutines at once, and its Paxos replica's waited behind them until its followers
	// elected another. Not on by default: with 32 slots held for whole requests the
	// scenario tests' clusters ran three times slower (workers' requests queued behind
	// submissions waiting on commits), and it has not been measured since they give
	// their slots back.
	MaxInflight int
	// HTTP2 offers HTTP/2 on the API (apiTLS; HTTP/1.1 is served either way). Not on by
	// default: it has run the 2,000-machine bench only, whose heads it kept from their
	// connection bound, at about twice HTTP/1.1's CPU per request on the leader.
	HTTP2 bool
	// MaxHandshakes bounds the API's TLS handshakes in progress (default GOMAXPROCS);
	// further connections wait for a slot without using CPU (internal/tlsgate). Without
	// it, every agent reconnecting to a new leader shakes hands at once, and the head's
	// Paxos replica waits its turn behind them: in BenchmarkReconnectStorm (1,000 clients
	// at once, two cores) a 2 ms ticker ran up to 30-49 ms late, 7-17 ms with the bound,
	// and the storm took 28-47% longer.
	MaxHandshakes int
	// APIAdvertise is the API's base URL as others reach it (default http://<listen address>).
	APIAdvertise string
	// CA, when set, turns mutual TLS on: the head issues itself a certificate of the
	// cluster CA, its Paxos links and its API are mutual TLS, and it signs the certificates
	// of the processes that hold the token (POST /v1/certs). Nil: token only, in clear.
	CA *pki.CA
	// CADir, with CA, is the directory CA was read from: the head reads it again every
	// CAReload (default 2 s) and follows a rotation of the cluster CA there (pki.Rotate*):
	// it trusts what the directory trusts, signs with what signs there, renews its own
	// certificate, and tells processes at GET /v1/trust. "": the CA stays as given.
	CADir    string
	CAReload time.Duration
	// Token is the cluster secret: Paxos peers and API callers prove they hold it.
	Token []byte
	// Controller configures the control plane.
	Controller ControllerConfig
	// Heads lists every head of the group, for the cluster status (this one's address is
	// filled in). Optional.
	Heads []api.HeadInfo
	// Gossip, when set, is the address (host:port) this head gossips on with the agents
	// (hashicorp/serf): the leader learns from it within seconds that an agent failed or
	// left. GossipJoin are other heads' gossip addresses.
	Gossip     string
	GossipJoin []string
	// GossipAdvertise is the gossip address others use, when it differs from Gossip.
	GossipAdvertise string
	// GossipProbe is how often gossip probes a member (member.Config.ProbeInterval): the
	// speed of failure detection, and how long a starved host may go unanswered before
	// it is taken for failed. Default 500 ms.
	GossipProbe time.Duration
	// Registry receives the head's Prometheus metrics, served on /metrics (default: a
	// registry of its own).
	Registry *prometheus.Registry
	// Logger (default no-op).
	Logger *zap.Logger
}

// Head is a running head.
type Head struct {
	cfg  Config
	log  *zap.Logger
	rep  *paxos.Replica
	sm   *metaserver.StateMachine
	ctl  *Controller
	api  *API
	srv  *http.Server
	ln   net.Listener
	tr   paxos.Transport
	ownT bool
	addr string
	// cancelRequests ends the requests in flight (long watches) when the head closes.
	cancelRequests context.CancelFunc
	gossip         *member.Member
	id             *pki.Identity // this head's certificate (nil without TLS)
	au             *authority    // the cluster CA as this head follows it (nil without TLS)
	stopCA         chan struct{} // closed by Close: followCA returns
	stopCAOnce     sync.Once
	agents         agentClient // to agents' APIs (CallAgent)
	obs            *observer   // the dashboard and /metrics (dashboard.go)
	// headsMu guards cfg.Heads, which SetHeads may change while the status is read.
	headsMu sync.Mutex
}

// maxAPIConns is Config.MaxAPIConns, or its default from the open-file limit.
func maxAPIConns(n int) int {
	if n > 0 {
		return n
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil || lim.Cur > 1<<30 {
		return 1 << 14
	}
	return max(256, int(lim.Cur/2))
}

// apiTLS is the API listener's TLS configuration: the identity's, offering HTTP/2 first
// when http2 is set (Config.HTTP2).
// Over HTTP/1.1 a process holds a connection per request in flight: at 2,000 machines
// each agent held 2 to 5 to each head (its watch's long poll, its reports, its reads),
// every head reached its bound on connections (maxAPIConns: 10,000 at 20,000 files)
// and new ones waited in the accept queue while load reports timed out; a request
// given up also closed its connection, and the next paid a handshake. Over HTTP/2 a
// client's requests share one connection per head, and one given up resets its stream
// only.
func apiTLS(id *pki.Identity, http2 bool) *tls.Config {
	c := id.BootstrapServer()
	if http2 {
		c.NextProtos = []string{"h2", "http/1.1"}
	}
	return c
}

// maxHandshakes is Config.MaxHandshakes, or its default, GOMAXPROCS.
func maxHandshakes(n int) int {
	if n > 0 {
		return n
	}
	return runtime.GOMAXPROCS(0)
}

// Start starts a head: it opens the WAL, starts the replica, the controller and the API.
func Start(cfg Config) (*Head, error) {
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	log := cfg.Logger.Named("head").With(zap.Uint64("replica", cfg.ID))
	if cfg.ID == 0 {
		return nil, fmt.Errorf("%w: head id 0: ids start at 1", api.ErrInvalid)
	}
	if len(cfg.Token) < 16 {
		return nil, fmt.Errorf("%w: the cluster token has %d bytes, want at least 16", api.ErrInvalid, len(cfg.Token))
	}
	if cfg.DataDir == "" {
		return nil, fmt.Errorf("%w: head %d has no data directory", api.ErrInvalid, cfg.ID)
	}
	if cfg.Tick == 0 {
		cfg.Tick = DefaultTick
	}
	if cfg.ElectionTimeout == 0 {
		cfg.ElectionTimeout = 10 * cfg.Tick
	}
	ids := cfg.Initial
	if len(ids) == 0 {
		for id := range cfg.Peers {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	if len(ids) == 0 {
		ids = []uint64{cfg.ID}
	}
	rc := paxos.DefaultReplicaConfig(cfg.ID, ids)
	rc.Node.Join = cfg.Join
	if err := rc.SetTiming(cfg.Tick, cfg.ElectionTimeout); err != nil {
		return nil, fmt.Errorf("%w: head %d: %v", api.ErrInvalid, cfg.ID, err)
	}
	h := &Head{cfg: cfg, log: log}
	if cfg.CA != nil {
		au, err := newAuthority(cfg.CA, cfg.CADir, log)
		if err != nil {
			return nil, fmt.Errorf("head %d: --ca-dir: %w", cfg.ID, err)
		}
		h.au = au
		if h.id, err = h.issueOwn(); err != nil {
			return nil, err
		}
		if err := h.id.SetTrust(au.bundle()); err != nil {
			return nil, fmt.Errorf("head %d: the trust bundle: %w", cfg.ID, err)
		}
	}
	h.tr = cfg.Transport
	if h.tr == nil {
		listen, ok := cfg.Peers[cfg.ID]
		if !ok {
			return nil, fmt.Errorf("%w: head %d is not among the peers %v", api.ErrInvalid, cfg.ID, cfg.Peers)
		}
		tc := paxos.TCPConfig{ID: cfg.ID, Listen: listen, Peers: cfg.Peers, Token: cfg.Token, Logger: cfg.Logger}
		if h.id != nil {
			tc.TLS = h.id.Server()
		}
		tr, err := paxos.NewTCPTransport(tc)
		if err != nil {
			return nil, fmt.Errorf("head %d: paxos transport: %w", cfg.ID, err)
		}
		h.tr, h.ownT = tr, true
	}
	w, err := paxos.OpenWAL(cfg.DataDir, paxos.WALOptions{NoSync: cfg.NoSync, Logger: cfg.Logger})
	if err != nil {
		h.closeTransport()
		return nil, fmt.Errorf("head %d: %w", cfg.ID, err)
	}
	rc.Logger = cfg.Logger
	h.sm = metaserver.NewStateMachine(0)
	h.rep, err = paxos.StartReplica(rc, w, h.tr, h.sm)
	if err != nil {
		_ = w.Close()
		h.closeTransport()
		return nil, fmt.Errorf("head %d: %w", cfg.ID, err)
	}
	listen := cfg.APIListen
	if listen == "" {
		listen = "127.0.0.1:0"
	}
	h.ln, err = net.Listen("tcp", listen)
	if err != nil {
		_ = h.rep.Close()
		h.closeTransport()
		return nil, fmt.Errorf("head %d: API listen %s: %w", cfg.ID, listen, err)
	}
	h.ln = netutil.LimitListener(h.ln, maxAPIConns(cfg.MaxAPIConns))
	scheme := "http"
	if h.id != nil {
		hlog := log.Named("http")
		// A handshake has 5 s once it has its slot, as net/http gives it (the server's
		// ReadHeaderTimeout below) when it shakes hands itself.
		h.ln = tlsgate.New(h.ln, tlsgate.Config{TLS: apiTLS(h.id, cfg.HTTP2), Limit: maxHandshakes(cfg.MaxHandshakes), Timeout: 5 * time.Second,
			OnError: func(remote net.Addr, err error) {
				hlog.Debug("TLS handshake failed", zap.Stringer("remote", remote), zap.Error(err))
			}})
		scheme = "https"
	}
	h.addr = cfg.APIAdvertise
	if h.addr == "" {
		h.addr = scheme + "://" + h.ln.Addr().String()
	}
	if cfg.Controller.Logger == nil {
		cfg.Controller.Logger = log
	}
	h.ctl = NewController(cfg.Controller, h.rep, h.sm)
	apiH := NewAPI(h.ctl, h.rep, h.sm, string(cfg.Token), h.groupHeads, log)
	h.api = apiH
	if h.au != nil {
		apiH.au = h.au
	}
	if n := cfg.MaxInflight; n > 0 {
		apiH.inflight, apiH.reportSlots, apiH.inflightWait = make(chan struct{}, n), make(chan struct{}, n), time.Second
	}
	base, cancelBase := context.WithCancel(context.Background())
	h.cancelRequests = cancelBase
	apiH.hub = newPlacedHub(h.sm)
	go apiH.hub.run(base)
	h.srv = &http.Server{Handler: apiH, ReadHeaderTimeout: 5 * time.Second, ErrorLog: zap.NewStdLog(log.Named("http")),
		BaseContext: func(net.Listener) context.Context { return base }}
	if cfg.Gossip != "" {
		h.gossip, err = member.Start(member.Config{Name: fmt.Sprintf("head-%d", cfg.ID), Role: member.RoleHead, Bind: cfg.Gossip, Advertise: cfg.GossipAdvertise,
			Secret: cfg.Token, Tags: map[string]string{"api": h.addr}, ProbeInterval: cfg.GossipProbe, Logger: cfg.Logger})
		if err != nil {
			_ = h.ln.Close()
			_ = h.rep.Close()
			h.closeTransport()
			return nil, fmt.Errorf("head %d: %w", cfg.ID, err)
		}
		if err := h.gossip.Join(cfg.GossipJoin); err != nil {
			log.Warn("could not join the other heads' gossip yet", zap.Error(err))
		}
		h.gossip.OnEvent(func(e member.Event) {
			if e.Role == member.RoleAgent {
				h.ctl.GossipEvent(e.Name, e.Kind) // weighed with the heartbeats: detect.go
			}
		})
		h.ctl.SetMembership(func() map[string]bool { return h.gossip.Dead(member.RoleAgent) })
	}
	h.obs = newObserver(h, cfg.Registry)
	h.srv.Handler, apiH.dashboard = h.obs.routes(apiH), h.obs.dashboardURL
	go func() { _ = h.srv.Serve(h.ln) }()
	go h.ctl.Run()
	h.stopCA = make(chan struct{})
	if h.au != nil && cfg.CADir != "" {
		every := cfg.CAReload
		if every <= 0 {
			every = 2 * time.Second
		}
		go h.followCA(every, h.stopCA)
	}
	log.Info("head running", zap.String("api", h.addr), zap.String("data_dir", cfg.DataDir), zap.Bool("fsync", !cfg.NoSync))
	return h, nil
}

// apiHosts are the hosts a browser may reach the head's API at, for its certificate: the
// loopback names, the listen host (unless unspecified) and the advertised one.
func apiHosts(cfg Config) []string {
	hosts := []string{"localhost", "127.0.0.1", "::1"}
	if h, _, err := net.SplitHostPort(cfg.APIListen); err == nil && h != "" {
		if ip := net.ParseIP(h); ip == nil || !ip.IsUnspecified() {
			hosts = append(hosts, h)
		}
	}
	if u, err := url.Parse(cfg.APIAdvertise); err == nil && u.Hostname() != "" {
		hosts = append(hosts, u.Hostname())
	}
	return hosts
}

func (h *Head) heads() []api.HeadInfo {
	h.headsMu.Lock()
	out := append([]api.HeadInfo(nil), h.cfg.Heads...)
	h.headsMu.Unlock()
	found := false
	gossip := ""
	if h.gossip != nil {
		gossip = h.gossip.Address()
	}
	for i := range out {
		if out[i].ID == h.cfg.ID {
			out[i].Address, out[i].PID, found = h.addr, os.Getpid(), true
			if gossip != "" {
				out[i].Serf = gossip
			}
		}
	}
	if !found {
		out = append(out, api.HeadInfo{ID: h.cfg.ID, Address: h.addr, PID: os.Getpid(), Serf: gossip})
	}
	if err := h.rep.Err(); err != nil {
		for i := range out {
			if out[i].ID == h.cfg.ID {
				out[i].DiskFull, out[i].Error = errors.Is(err, paxos.ErrDiskFull), err.Error()
			}
		}
	}
	return out
}

// groupHeads lists every head of the group, by id: those configured (SetHeads) and this
// one, those gossip announces (with their API address), and the voting members of the
// current Paxos configuration (by id alone while gossip has not announced them).
func (h *Head) groupHeads() []api.HeadInfo {
	out := h.heads()
	has := func(id uint64) bool { return slices.ContainsFunc(out, func(x api.HeadInfo) bool { return x.ID == id }) }
	if h.gossip != nil {
		for name, tags := range h.gossip.Tags(member.RoleHead) {
			id, err := strconv.ParseUint(strings.TrimPrefix(name, "head-"), 10, 64)
			if err != nil || has(id) {
				continue
			}
			out = append(out, api.HeadInfo{ID: id, Address: tags["api"]})
		}
	}
	for _, id := range h.rep.Status().Members {
		if !has(id) {
			out = append(out, api.HeadInfo{ID: id})
		}
	}
	slices.SortFunc(out, func(a, b api.HeadInfo) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// SetHeads sets the group's heads for the cluster status.
func (h *Head) SetHeads(heads []api.HeadInfo) {
	h.headsMu.Lock()
	h.cfg.Heads = append([]api.HeadInfo(nil), heads...)
	h.headsMu.Unlock()
}

// Address is the API's base URL.
func (h *Head) Address() string { return h.addr }

// ID is the replica id.
func (h *Head) ID() uint64 { return h.cfg.ID }

// Controller is the head's control plane.
func (h *Head) Controller() *Controller { return h.ctl }

// Replica is the head's Paxos replica.
func (h *Head) Replica() *paxos.Replica { return h.rep }

// StateMachine is the head's metadata state machine.
func (h *Head) StateMachine() *metaserver.StateMachine { return h.sm }

func (h *Head) closeTransport() {
	if h.ownT && h.tr != nil {
		_ = h.tr.Close()
	}
}

// Close stops the API, the controller, the replica and its transport.
func (h *Head) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	h.cancelRequests()
	h.stopCAOnce.Do(func() { close(h.stopCA) })
	if h.gossip != nil {
		_ = h.gossip.Leave()
	}
	err := h.srv.Shutdown(ctx)
	if errors.Is(err, context.DeadlineExceeded) {
		err = h.srv.Close()
	}
	h.ctl.Stop()
	h.obs.close()
	err = errors.Join(err, h.rep.Close())
	h.closeTransport()
	return err
}
