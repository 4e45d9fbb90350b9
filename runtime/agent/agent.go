// Package agent is the process that runs on every machine: it registers the machine's
// topology with the heads, samples its load, runs its object store and transfer server,
// and starts and supervises the worker processes of the gangs placed on it. It learns what
// to run only from the metadata log (it watches the gangs table), so it acts only on
// decisions the leader has committed, and it reports what it sees (a worker that exited)
// back to the leader, which decides what restarts.
package agent

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/atoll-run/atoll/internal/dockerapi"
	"github.com/atoll-run/atoll/internal/pki"
	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/runtime/authz"
	"github.com/atoll-run/atoll/runtime/member"
	"github.com/atoll-run/atoll/runtime/objects"
	"github.com/atoll-run/atoll/store/meta"
	"github.com/atoll-run/atoll/store/object"
	"github.com/atoll-run/atoll/store/transfer"
	"github.com/atoll-run/atoll/topology"
)

// Config configures an agent.
type Config struct {
	// Name is the machine's name in the cluster; Rack its rack.
	Name string
	Rack int
	// Spec is the machine's topology (discovered, or a declared spec); Simulated says its
	// GPUs are declared, not real.
	Spec      *topology.MachineSpec
	Simulated bool
	// Heads are the heads' API URLs; Token the cluster secret.
	Heads []string
	Token []byte
	// CACert is the cluster CA's certificate (PEM), required when the heads are https:
	// the agent then gets a certificate of its own from the heads (with the token), and
	// its API, its object store's transfer plane and its workers' links are mutual TLS.
	CACert []byte
	// TrustPoll is how often the agent asks the heads whether the cluster CA rotated
	// (default api.TrustPoll) until its load reports' answers carry the heads' trust tag;
	// from then on it asks when the tag changes, and every api.TrustHintedPoll (or
	// TrustPoll, if longer) all the same.
	TrustPoll time.Duration
	// Dir is the agent's own directory: its object store's spill files, the jobs'
	// executables, the workers' spec files and logs.
	Dir string
	// Listen is the agent API's address (default 127.0.0.1:0); TransferListen the object
	// store's (default 127.0.0.1:0). Advertise, when set, is the host other machines reach
	// this one at (when it listens on 0.0.0.0): its API, store and gossip are advertised
	// there, and its workers listen there.
	Listen, TransferListen string
	Advertise              string
	// ObjectCapacity bounds the store's shared-memory tier (0: the store's default share of
	// RAM); ShmDir is the shared-memory filesystem (default /dev/shm).
	ObjectCapacity int64
	ShmDir         string
	// MaxObjectSize bounds one object in the store (a put over it is refused with 413,
	// naming the limit). Default: the store's capacity.
	MaxObjectSize int64
	// ReconcileInterval is how often the reconciling agent (the alive machine whose name
	// sorts first) checks the objects table against the live stores and owners. Default 10 s;
	// longer after a pass that took more than a twentieth of it (a large table).
	ReconcileInterval time.Duration
	// DeadObjectKeep is how long the record of a lost object, or of one whose owner ended,
	// is kept (so a reader learns why it is gone) before it is collected. Default 10 min.
	DeadObjectKeep time.Duration
	// CheckpointDir is a shared checkpoint directory (the same path on every machine that
	// mounts it, as clusters mount one over NFS or a parallel file system): a durable copy
	// of a checkpoint's part or a detached object written there counts as its second copy,
	// and any machine that mounts it reads from it what it cannot pull. "": none.
	CheckpointDir string
	// TrustedFabric declares the network between machines trusted and isolated, as NCCL
	// and MPI fabrics are: the collective links of this machine's workers run without
	// TLS (the link key's challenge/response still authenticates every link, and every
	// chunk is still checksummed); everything else keeps mutual TLS. Every machine of a
	// cluster must say the same. Never on by default (docs/hardening.md).
	TrustedFabric bool
	// Launcher starts workers. Default: an ExecLauncher (one process per worker). A
	// launcher that is a ReadyReporter (HollowLauncher) has the agent report its workers
	// ready as they are launched.
	Launcher Launcher
	// Load, when set, is the machine's load in place of the host's /proc (a hollow
	// machine's: HollowLoad); the GPU figure is filled in by the agent either way.
	Load func() api.Load
	// LoadInterval is how often the agent samples and reports its load; each report is also
	// the machine's heartbeat to the leader. Default 1 s (the leader's failure detection
	// counts in seconds; a report every 200 ms cost the heads more than everything else
	// of an idle cluster).
	LoadInterval time.Duration
	// StopGrace is how long a stopped worker has before it is killed. Default 2 s.
	StopGrace time.Duration
	// MaxLaunches bounds the launches in flight at once (default 16): the members of a
	// large gang wait their turn, and those whose gang ended meanwhile are never started.
	MaxLaunches int
	// Gossip, when set, is the address (host:port) the agent gossips on (hashicorp/serf):
	// it joins the heads' gossip, so that they learn within seconds when it fails.
	Gossip string
	// GossipProbe is how often gossip probes a member (the heads' GossipProbe). Default
	// 500 ms.
	GossipProbe time.Duration
	// Registry receives the agent's Prometheus metrics (its store's and transfer plane's
	// included), served on /metrics (default: a registry of its own).
	Registry *prometheus.Registry
	// Logger (default no-op).
	Logger *zap.Logger
}

// warmEvery is how often an agent asks each head but the leader for its status, to keep a
// connection to it open (api.Client.KeepWarm): a new leader is reached without a TLS
// handshake.
const warmEvery = 30 * time.Second

// Agent is a running agent.
type Agent struct {
	cfg    Config
	period atomic.Int64 // the load reports' period now (a time.Duration): the leader's or the agent's own
	// trust carries the heads' trust tag from the load reports' answers to the goroutine
	// that follows the cluster CA (api.FollowIdentity): it asks for the CAs when the tag
	// changes, not every TrustPoll.
	trust  chan string
	id     *pki.Identity // the agent's certificate (nil without TLS)
	log    *zap.Logger
	client *api.Client
	node   *transfer.Node
	local  *objects.Local
	dir    *objects.Directory
	hc     *http.Client // to other agents' APIs (with the agent's certificate under TLS)
	srv    *http.Server
	ln     net.Listener
	addr   string
	sample *loadSampler
	gossip *member.Member
	obs    *agentObs // metrics.go

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu          sync.Mutex
	incarnation uint64
	gangs       map[string]api.Gang   // the log's gangs table, as watched
	workers     map[string]*worker    // by job/gang/rank
	exited      map[string]bool       // api.WorkerSpec.Key()s that exited by themselves
	ended       map[string]bool       // gang incarnations (incarnation) known over, ahead of the watch
	changed     chan struct{}         // closed at every change of workers or gangs (tests)
	slots       chan struct{}         // launches in flight (Config.MaxLaunches)
	binaries    map[string]*sync.Once // by sha256
	binErr      map[string]error
	// lastReconcile is the last pass of the objects table this agent ran.
	lastReconcile *objects.Report
	// authn authenticates the API's requests, state answers what its decisions read
	// (authz.go).
	authn   *authz.Authenticator
	state   *agentState
	keys    keys    // credential.go
	reviews reviews // the heads' token reviews, with a scoped credential
	// reports bounds the refusals being reported to the heads at once.
	reports chan struct{}
	// relist ends the current watch of the gangs table, which then lists again.
	relist context.CancelFunc
}

// Identity is the agent's certificate (nil without TLS).
func (a *Agent) Identity() *pki.Identity { return a.id }

// trustPEM is the cluster CAs this agent trusts now (what its workers are given): its
// configuration's until a rotation of the cluster CA changes them.
func (a *Agent) trustPEM() []byte {
	if a.id != nil {
		return a.id.TrustPEM()
	}
	return a.cfg.CACert
}

type worker struct {
	spec     api.WorkerSpec
	h        Handle // nil while launching
	stopping bool
	// noticed is the issue time of the newest notice given to a process gang's member.
	noticed time.Time
}

// Start starts an agent: its object store and API, then it registers the machine and
// follows the gangs placed on it.
func Start(ctx context.Context, cfg Config) (*Agent, error) {
	if err := api.CheckName("machine", cfg.Name); err != nil {
		return nil, err
	}
	if cfg.Spec == nil {
		return nil, fmt.Errorf("%w: agent %s has no machine spec", api.ErrInvalid, cfg.Name)
	}
	if cfg.Dir == "" {
		return nil, fmt.Errorf("%w: agent %s has no directory", api.ErrInvalid, cfg.Name)
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.LoadInterval == 0 {
		cfg.LoadInterval = time.Second
	}
	if cfg.StopGrace == 0 {
		cfg.StopGrace = 2 * time.Second
	}
	if cfg.ReconcileInterval == 0 {
		cfg.ReconcileInterval = 10 * time.Second
	}
	if cfg.DeadObjectKeep == 0 {
		cfg.DeadObjectKeep = 10 * time.Minute
	}
	if cfg.MaxLaunches <= 0 {
		cfg.MaxLaunches = 16
	}
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	if cfg.TransferListen == "" {
		cfg.TransferListen = "127.0.0.1:0"
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("agent %s: %w", cfg.Name, err)
	}
	if cfg.CheckpointDir != "" {
		abs, err := filepath.Abs(cfg.CheckpointDir)
		if err != nil {
			return nil, fmt.Errorf("agent %s: checkpoint directory: %w", cfg.Name, err)
		}
		if err := os.MkdirAll(abs, 0o700); err != nil {
			return nil, fmt.Errorf("agent %s: checkpoint directory: %w", cfg.Name, err)
		}
		cfg.CheckpointDir = abs
	}
	log := cfg.Logger.Named("agent").With(zap.String("machine", cfg.Name))
	secure, err := api.Secure(cfg.Heads)
	if err != nil {
		return nil, fmt.Errorf("agent %s: %w", cfg.Name, err)
	}
	var id *pki.Identity
	if secure {
		if len(cfg.CACert) == 0 {
			return nil, fmt.Errorf("%w: agent %s: the heads are https but the agent has no cluster CA certificate (--ca-cert)", api.ErrInvalid, cfg.Name)
		}
		id, err = api.RequestIdentityAs(ctx, cfg.Heads, string(cfg.Token), cfg.CACert, "agent/"+cfg.Name, authz.Agent(cfg.Name).String(), serverHosts(cfg)...)
		if err != nil {
			return nil, fmt.Errorf("agent %s: its certificate: %w", cfg.Name, err)
		}
	}
	cc := api.ClientConfig{Heads: cfg.Heads, Token: string(cfg.Token), Logger: log, MaxConnsPerHead: api.AgentConnsPerHead}
	if id != nil {
		cc.TLS = id.Client()
	}
	client, err := api.NewClient(ctx, cc)
	if err != nil {
		return nil, fmt.Errorf("agent %s: %w", cfg.Name, err)
	}
	ks, err := agentKeys(ctx, cfg, client)
	if err != nil {
		return nil, fmt.Errorf("agent %s: %w", cfg.Name, err)
	}
	nc := transfer.DefaultNodeConfig()
	nc.Name, nc.Dir, nc.Token, nc.Logger, nc.ListenAddr = cfg.Name, filepath.Join(cfg.Dir, "store"), ks.link, log.Named("objects"), cfg.TransferListen
	var self atomic.Pointer[Agent] // the agent, once made: it decides what peers may pull
	if id != nil {
		nc.Server.TLS, nc.Client.TLS = id.Server(), id.Client()
		nc.Server.Authorize = func(ctx context.Context, peer *x509.Certificate, oid object.ID) error {
			a := self.Load()
			if a == nil {
				return fmt.Errorf("%w: agent %s is starting", authz.ErrForbidden, cfg.Name)
			}
			return a.authorizePull(ctx, peer, oid)
		}
	}
	nc.Advertise = cfg.Advertise
	obs := newAgentObs(cfg.Registry)
	nc.Registerer = obs.reg
	dir := objects.NewDirectory(client.Meta()).WriteBehind()
	nc.Store.Directory = dir
	if cfg.ObjectCapacity > 0 {
		nc.Store.Capacity = cfg.ObjectCapacity
	}
	nc.Store.MaxObjectSize = cfg.MaxObjectSize
	// An agent restarted right after its predecessor was killed waits for the kernel to
	// release the dead one's lock on the store (its teardown of large mappings takes time).
	nc.Store.LockWait = 30 * time.Second
	if cfg.ShmDir != "" {
		nc.Store.ShmDir = cfg.ShmDir
	}
	node, err := transfer.StartNode(nc)
	if err != nil {
		return nil, fmt.Errorf("agent %s: object store: %w", cfg.Name, err)
	}
	hc := &http.Client{}
	if id != nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.TLSClientConfig = id.Client()
		hc.Transport = tr
	}
	local := objects.NewLocal(node)
	local.SharedDir = cfg.CheckpointDir
	a := &Agent{cfg: cfg, keys: ks, log: log, client: client, node: node, local: local, dir: dir, hc: hc, sample: newLoadSampler(), obs: obs,
		gangs: map[string]api.Gang{}, workers: map[string]*worker{}, exited: map[string]bool{}, ended: map[string]bool{},
		changed: make(chan struct{}), slots: make(chan struct{}, cfg.MaxLaunches), binaries: map[string]*sync.Once{}, binErr: map[string]error{}}
	a.state = newAgentState(a)
	a.reports = make(chan struct{}, 8)
	self.Store(a)
	a.registerMetrics()
	if a.cfg.Launcher == nil {
		runDir := filepath.Join(cfg.Dir, "run")
		// What an earlier run of this agent left there (its workers died with it) goes:
		// no credential file outlives the process it was made for.
		if n := removeRunFiles(runDir); n > 0 {
			log.Info("removed the spec and credential files an earlier run left", zap.Int("files", n))
		}
		owner, _ := filepath.Abs(cfg.Dir)
		el := &ExecLauncher{RunDir: runDir, LogDir: filepath.Join(cfg.Dir, "logs"), Binary: a.binary, Credential: a.credential, Owner: owner}
		if _, err := os.Stat(dockerapi.DefaultSocket); err == nil { // and the containers it left
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			if n := el.removeContainers(cctx); n > 0 {
				log.Info("removed the member containers an earlier run left", zap.Int("containers", n))
			}
			cancel()
		}
		a.cfg.Launcher = el
	}
	a.ln, err = net.Listen("tcp", cfg.Listen)
	if err != nil {
		_ = node.Shutdown(context.Background())
		return nil, fmt.Errorf("agent %s: API listen %s: %w", cfg.Name, cfg.Listen, err)
	}
	scheme := "http://"
	if id != nil {
		// A client certificate is required of every request but /metrics (a Prometheus
		// server scrapes it with the dashboard's read-only token): see apiHandler.
		a.ln = tls.NewListener(a.ln, id.BootstrapServer())
		scheme = "https://"
	}
	a.id = id
	a.addr = scheme + a.ln.Addr().String()
	if cfg.Advertise != "" {
		a.addr = scheme + net.JoinHostPort(cfg.Advertise, strconv.Itoa(a.ln.Addr().(*net.TCPAddr).Port))
	}
	a.ctx, a.cancel = context.WithCancel(context.Background())
	a.srv = &http.Server{Handler: a.apiHandler(), ReadHeaderTimeout: 5 * time.Second, ErrorLog: zap.NewStdLog(log.Named("http")),
		BaseContext: func(net.Listener) context.Context { return a.ctx }} // requests (log follows) end with the agent
	go func() { _ = a.srv.Serve(a.ln) }()
	if err := a.register(ctx); err != nil {
		_ = a.Shutdown(context.Background())
		return nil, err
	}
	a.readoptStore(ctx)
	if cfg.Gossip != "" {
		if err := a.joinGossip(ctx); err != nil {
			_ = a.Shutdown(context.Background())
			return nil, err
		}
	}
	a.trust = make(chan string, 1)
	a.wg.Add(4)
	go func() { defer a.wg.Done(); client.KeepWarm(a.ctx, warmEvery) }()
	go a.loadLoop()
	go a.watchLoop()
	go a.reconcileLoop()
	if id != nil { // follow a rotation of the cluster CA
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			api.FollowIdentity(a.ctx, client, id, api.Renewal{Heads: cfg.Heads, Token: string(cfg.Token), Name: "agent/" + cfg.Name,
				Principal: authz.Agent(cfg.Name).String(), Hosts: serverHosts(cfg)}, cfg.TrustPoll, a.trust, log)
		}()
	}
	return a, nil
}

// Name is the machine's name.
func (a *Agent) Name() string { return a.cfg.Name }

// Address is the agent API's base URL.
func (a *Agent) Address() string { return a.addr }

// Objects is the machine's object store, as its processes use it.
func (a *Agent) Objects() *objects.Local { return a.local }

// Client is the agent's client of the heads.
func (a *Agent) Client() *api.Client { return a.client }

// register registers the machine, retrying until it succeeds or ctx ends.
func (a *Agent) register(ctx context.Context) error {
	host, _ := os.Hostname()
	m := api.Machine{Name: a.cfg.Name, Rack: a.cfg.Rack, Spec: a.cfg.Spec, Simulated: a.cfg.Simulated, PID: os.Getpid(), Host: host,
		Agent: api.AgentAddrs{API: a.addr, Transfer: a.node.Addr, CheckpointDir: a.cfg.CheckpointDir}}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	got, err := a.client.RegisterMachine(rctx, m)
	if err != nil {
		return fmt.Errorf("agent %s: register: %w", a.cfg.Name, err)
	}
	a.mu.Lock()
	a.incarnation = got.Incarnation
	a.mu.Unlock()
	a.log.Info("machine registered", zap.Uint64("incarnation", got.Incarnation), zap.String("api", a.addr), zap.String("transfer", a.node.Addr))
	if a.cfg.TrustedFabric {
		a.log.Warn("trusted fabric declared (--trusted-fabric): this machine's workers run their collective links without TLS; only for a network between machines that is trusted and isolated")
	}
	return nil
}

// joinGossip starts gossiping and joins the heads.
func (a *Agent) joinGossip(ctx context.Context) error {
	adv := ""
	if a.cfg.Advertise != "" {
		if _, port, err := net.SplitHostPort(a.cfg.Gossip); err == nil && port != "0" {
			adv = net.JoinHostPort(a.cfg.Advertise, port)
		}
	}
	g, err := member.Start(member.Config{Name: a.cfg.Name, Role: member.RoleAgent, Bind: a.cfg.Gossip, Advertise: adv, Key: a.keys.gossip,
		Tags: map[string]string{"api": a.addr}, ProbeInterval: a.cfg.GossipProbe, Logger: a.cfg.Logger})
	if err != nil {
		return fmt.Errorf("agent %s: %w", a.cfg.Name, err)
	}
	a.gossip = g
	st, err := a.client.Status(ctx)
	if err != nil {
		return fmt.Errorf("agent %s: the heads' gossip addresses: %w", a.cfg.Name, err)
	}
	var addrs []string
	for _, h := range st.Heads {
		if h.Serf != "" {
			addrs = append(addrs, h.Serf)
		}
	}
	if len(addrs) == 0 {
		a.log.Warn("the heads do not gossip: this machine's failure is found by its missing heartbeats only")
		return nil
	}
	if err := g.Join(addrs); err != nil {
		return fmt.Errorf("agent %s: %w", a.cfg.Name, err)
	}
	a.log.Info("joined the cluster's gossip", zap.Strings("heads", addrs), zap.String("gossip", g.Address()))
	return nil
}

// loadLoop samples the machine's load and reports it to the leader; a leader that does not
// know this machine (it was declared dead, or the log lost nothing but the leader is new
// and the machine never registered with it) gets a new registration.
func (a *Agent) loadLoop() {
	defer a.wg.Done()
	every := a.cfg.LoadInterval
	a.period.Store(int64(every))
	t := time.NewTicker(every)
	defer t.Stop()
	var failing reportFailures
	for {
		select {
		case <-a.ctx.Done():
			return
		case <-t.C:
		}
		var l api.Load
		if a.cfg.Load != nil {
			l = a.cfg.Load()
		} else {
			l = a.sample.sample()
		}
		a.mu.Lock()
		inc := a.incarnation
		// GPU use: measuring it needs NVML's utilization counters on real GPUs, which this
		// agent does not read yet; the share of GPUs held by running workers stands in, and
		// the report says so (GPUMeasured false).
		l.GPU = heldShare(a.heldGPUsLocked(), len(a.cfg.Spec.GPUs))
		a.obs.last = l
		a.mu.Unlock()
		// A report that waits is still a heartbeat when it arrives; one given up closes its
		// connection, and the next pays a TLS handshake: under load that spirals.
		ctx, cancel := context.WithTimeout(a.ctx, max(5*time.Second, 2*every))
		sent := time.Now()
		ans, err := a.client.ReportLoad(ctx, api.LoadReport{Machine: a.cfg.Name, Incarnation: inc, Load: l, At: sent, Store: a.storeUsage()})
		cancel()
		failing.note(a.log, sent, err)
		if err == nil && ans.Trust != "" {
			select { // the follower is busy: it reads the CAs then, or takes the next one
			case a.trust <- ans.Trust:
			default:
			}
		}
		// The leader paces a large cluster's reports: this machine's period is the one it
		// asks, or the agent's own if that is longer.
		if next := max(a.cfg.LoadInterval, time.Duration(ans.Interval)); err == nil && next != every {
			a.log.Info("report period", zap.Duration("from", every), zap.Duration("to", next))
			every = next
			t.Reset(every)
			a.period.Store(int64(every))
		}
		if errors.Is(err, api.ErrNotFound) || errors.Is(err, api.ErrStale) {
			a.log.Warn("the leader does not know this machine as alive; registering again", zap.Error(err))
			if err := a.register(a.ctx); err != nil {
				a.log.Warn("registration failed", zap.Error(err))
			} else {
				// The watch of this machine's gangs lists again: a gang moved away while
				// the machine was counted lost left no record that concerns it.
				a.mu.Lock()
				relist := a.relist
				a.mu.Unlock()
				if relist != nil {
					relist()
				}
			}
		}
	}
}

// reportFailures tells the operator when this machine's heartbeats stop reaching the
// leader and when they reach it again: the leader declares a machine dead on its silence,
// and without these lines the agent's side of that silence (a report that waited, timed
// out or was refused) left no trace.
type reportFailures struct {
	since time.Time // the first report that failed in a row (zero: the last one arrived)
	n     int       // the reports that failed in a row
	took  time.Duration
}

// note records one report's outcome: sent is when it was sent.
func (f *reportFailures) note(log *zap.Logger, sent time.Time, err error) {
	took := time.Since(sent)
	if err == nil {
		if f.n > 0 {
			log.Info("load reports reach the leader again", zap.Int("failed", f.n), zap.Duration("after", time.Since(f.since)),
				zap.Duration("longest_attempt", f.took))
		}
		*f = reportFailures{}
		return
	}
	if f.n == 0 {
		f.since = sent
		log.Warn("a load report failed: the leader declares a machine dead after a long enough silence", zap.Duration("took", took), zap.Error(err))
	}
	f.n++
	f.took = max(f.took, took)
}

// heldGPUsLocked counts the cards held by the workers this agent runs (started or starting).
func (a *Agent) heldGPUsLocked() int {
	held := 0
	for _, w := range a.workers {
		held += len(w.spec.Member.GPUs)
	}
	return held
}

// heldShare is the share of a machine's n cards that are held, in [0, 1] (0 without cards).
func heldShare(held, n int) float64 {
	if n <= 0 {
		return 0
	}
	return min(1, float64(held)/float64(n))
}

// watchLoop follows the gangs table as this machine needs it (api.GangConcerns: the gangs
// placed here, those requeued or ended; not every gang's every change) and reconciles the
// workers after every change.
func (a *Agent) watchLoop() {
	defer a.wg.Done()
	for a.ctx.Err() == nil {
		wctx, cancel := context.WithCancel(a.ctx)
		a.mu.Lock()
		a.relist = cancel
		a.mu.Unlock()
		err := a.client.WatchPlaced(wctx, a.cfg.Name, func(reset bool, l api.Listing, evs []meta.Event) error {
			a.mu.Lock()
			a.gangs = applyGangs(a.gangs, reset, l, evs)
			a.notifyLocked()
			a.mu.Unlock()
			a.reconcile()
			return nil
		})
		cancel()
		if a.ctx.Err() == nil && wctx.Err() != nil {
			continue // relist (registered again)
		}
		if a.ctx.Err() == nil {
			a.log.Warn("watching the gangs table failed; retrying", zap.Error(err))
			select {
			case <-a.ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
}

// applyGangs applies what a watch of the gangs table saw to gangs (by job/gang) and
// returns it: a reset replaces it with the listing, events put and delete records.
// Records that do not decode are skipped. A gang that ended (stopped or failed: neither
// runs again, a later gang of the same names has another UID) is dropped as a deleted one
// is: the table keeps every gang that ever ran, and the agent goes over what it holds at
// every change.
func applyGangs(gangs map[string]api.Gang, reset bool, l api.Listing, evs []meta.Event) map[string]api.Gang {
	if reset {
		gangs = map[string]api.Gang{}
		for _, kv := range l.KVs {
			var g api.Gang
			if json.Unmarshal(kv.Value, &g) == nil && g.State.Live() {
				gangs[g.Spec.Key()] = g
			}
		}
	}
	for _, ev := range evs {
		k := ev.KV.Key[len(api.TableGangs):]
		if ev.Type == meta.EventDelete {
			delete(gangs, k)
			continue
		}
		var g api.Gang
		if json.Unmarshal(ev.KV.Value, &g) != nil {
			continue
		}
		if !g.State.Live() {
			delete(gangs, k)
		} else {
			gangs[k] = g
		}
	}
	return gangs
}

// desiredLocked computes the workers this machine should run, by job/gang/rank.
func (a *Agent) desiredLocked() map[string]api.WorkerSpec {
	base := api.WorkerSpec{Machine: a.cfg.Name, Simulated: a.cfg.Simulated, TrustedFabric: a.cfg.TrustedFabric, Heads: a.client.Heads(), LinkKey: string(a.keys.link),
		CACert: string(a.trustPEM()), Agent: a.addr, Transfer: a.node.Addr}
	return desired(withoutEnded(a.gangs, a.ended), a.exited, base)
}

// withoutEnded is gangs without the incarnations known ended ahead of the watch (a launch
// found their job stopped).
func withoutEnded(gangs map[string]api.Gang, ended map[string]bool) map[string]api.Gang {
	if len(ended) == 0 {
		return gangs
	}
	out := make(map[string]api.Gang, len(gangs))
	for k, g := range gangs {
		if !ended[incarnation(g.UID, g.Generation)] {
			out[k] = g
		}
	}
	return out
}

// forgetEnded forgets the ended incarnations the watch has caught up with (it shows them
// ended, or another incarnation): only those it still shows starting or running matter.
func forgetEnded(ended map[string]bool, gangs map[string]api.Gang) {
	if len(ended) == 0 {
		return // the common case: a reconcile runs at every change of the whole table
	}
	current := map[string]bool{}
	for _, g := range gangs {
		if g.State == api.GangStarting || g.State == api.GangRunning {
			current[incarnation(g.UID, g.Generation)] = true
		}
	}
	for k := range ended {
		if !current[k] {
			delete(ended, k)
		}
	}
}

// desired computes the workers the machine base.Machine should run, by job/gang/rank: its
// members (not removed) of the gangs starting or running, each a copy of base (what is
// the same for every worker of the machine) with the member's part filled in, but those
// that exited by themselves (exited, by exitKey).
func desired(gangs map[string]api.Gang, exited map[string]bool, base api.WorkerSpec) map[string]api.WorkerSpec {
	out := map[string]api.WorkerSpec{}
	for _, g := range gangs {
		if (g.State != api.GangStarting && g.State != api.GangRunning) || g.Placement == nil {
			continue
		}
		world := g.Ranks()
		epoch := 0
		if g.World != nil {
			epoch = g.World.Epoch
		}
		for rank, m := range g.Placement.Members {
			if m.Machine != base.Machine || m.Removed {
				continue
			}
			s := base
			s.Heads = slices.Clone(base.Heads)
			s.Job, s.Gang, s.Rank, s.Generation, s.GangUID, s.Kind, s.Args = g.Spec.Job, g.Spec.Name, rank, g.Generation, g.UID, g.Spec.Kind, g.Spec.Args
			s.Member, s.Placement, s.World, s.Epoch, s.Driver, s.Service = m, *g.Placement, world, epoch, g.Spec.Driver, g.Spec.Service
			s.Holder = "worker/" + s.Key()
			if s.Process = g.Spec.Process; s.Process != nil && !slices.Contains(world, rank) {
				// A process gang's member added by a grow starts with the gang's next
				// generation, at the new world size (torchrun's elastic contract).
				continue
			}
			if exited[exitKey(s)] {
				continue // it exited by itself: the leader decides what comes next
			}
			out[fmt.Sprintf("%s/%s/%d", s.Job, s.Gang, s.Rank)] = s
		}
	}
	return out
}

// incarnation names one generation of one gang (its UID tells it from an earlier gang of
// the same names).
func incarnation(uid string, gen int) string { return fmt.Sprintf("%s/g%d", uid, gen) }

// exitKey names a worker incarnation of a gang incarnation: its exit is remembered under it
// until that gang generation is over.
func exitKey(s api.WorkerSpec) string { return s.GangUID + "/" + s.Key() }

// forgetExits drops the exits remembered of gangs that are no longer in the table (by UID
// and names).
func forgetExits(exited map[string]bool, gangs map[string]api.Gang) {
	// Looked up one remembered exit at a time: the table holds every gang that ever ran
	// (ended ones too), and a reconcile runs at every change of it.
	for k := range exited {
		uid, rest, ok := strings.Cut(k, "/") // a UID is hex: the first slash ends it
		i := strings.LastIndexByte(rest, '/')
		if !ok || i < 0 {
			delete(exited, k)
			continue
		}
		if g, live := gangs[rest[:i]]; !live || g.UID != uid {
			delete(exited, k)
		}
	}
}

// reconcilePlan compares the workers there are with those wanted (both by job/gang/rank):
// it returns those to stop (not wanted, or wanted in another generation; not stopping
// already) and the keys of those to start, sorted. A worker still there, stopping or
// not, is not started again: the reconcile after it stopped starts its successor.
func reconcilePlan(workers map[string]*worker, want map[string]api.WorkerSpec) (stop []*worker, start []string) {
	for k, w := range workers {
		d, ok := want[k]
		if ok && d.Generation == w.spec.Generation {
			continue
		}
		if !w.stopping {
			stop = append(stop, w)
		}
	}
	for k := range want {
		if _, ok := workers[k]; !ok {
			start = append(start, k)
		}
	}
	sort.Strings(start)
	return stop, start
}

// reconcile stops the workers that should not run and starts those missing.
func (a *Agent) reconcile() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.ctx.Err() != nil {
		return
	}
	forgetExits(a.exited, a.gangs)
	forgetEnded(a.ended, a.gangs)
	want := a.desiredLocked()
	stop, start := reconcilePlan(a.workers, want)
	for _, w := range a.workers {
		a.noticeLocked(w)
	}
	for _, w := range stop {
		w.stopping = true
		go a.stopWorker(w)
	}
	for _, k := range start {
		w := &worker{spec: want[k]}
		a.workers[k] = w
		go a.launch(k, w)
	}
}

func (a *Agent) notifyLocked() {
	close(a.changed)
	a.changed = make(chan struct{})
}

// job reads a job's record. It is read at every launch, not cached: a job name is reused
// by a later submission (with another executable and arguments).
func (a *Agent) job(ctx context.Context, name string) (api.Job, error) {
	var j api.Job
	found, err := a.client.Get(ctx, api.TableJobs+name, &j)
	if err != nil {
		return api.Job{}, err
	}
	if !found {
		return api.Job{}, fmt.Errorf("%w: job %q", api.ErrNotFound, name)
	}
	return j, nil
}

// launch starts a worker when its turn comes (Config.MaxLaunches), unless it is no longer
// wanted by then, and supervises it until it stops.
func (a *Agent) launch(key string, w *worker) {
	var h Handle
	var started bool
	var err error
	if w.spec.Process != nil {
		// Every member of a process gang gets rank 0's rendezvous address before it starts.
		var master string
		if master, err = a.rendezvous(w); err == nil && master == "" {
			err = errNotWanted
		}
		a.mu.Lock()
		w.spec.Master = master
		a.mu.Unlock()
	}
	if errors.Is(err, errNotWanted) {
		err = nil // dropped below, as a worker not wanted any more
	} else if err == nil {
		select {
		case a.slots <- struct{}{}:
			h, started, err = a.start(w)
			<-a.slots
		case <-a.ctx.Done():
		}
	}
	if !started && err == nil {
		// Not wanted any more (stopped, or its gang or job ended before its turn): it was
		// never started, so there is nothing to report; a later incarnation may take the key.
		a.mu.Lock()
		if a.workers[key] == w {
			delete(a.workers, key)
		}
		a.notifyLocked()
		a.mu.Unlock()
		a.reconcile()
		return
	}
	a.mu.Lock()
	if err != nil {
		delete(a.workers, key)
		a.exited[exitKey(w.spec)] = true
		a.notifyLocked()
		a.mu.Unlock()
		a.log.Warn("worker did not start", workerField(w.spec), zap.Error(err))
		a.reportExit(w.spec, fmt.Sprintf("did not start: %v", err), isPermanent(err), false)
		return
	}
	w.h = h
	stop := w.stopping
	a.obs.starts.Inc()
	a.notifyLocked()
	a.mu.Unlock()
	a.log.Info("worker started", workerField(w.spec), zap.Int("pid", h.PID()), zap.Ints("gpus", w.spec.Member.GPUs))
	if stop {
		go a.stopWorker(w)
	}
	if rr, ok := a.cfg.Launcher.(ReadyReporter); w.spec.Driver || w.spec.Process != nil || ok && rr.AgentReportsReady() {
		// A submitted driver, a process gang's member or a hollow worker hosts no actor to
		// announce (a hollow launcher's hosted worker announces its own): it is ready once
		// it runs. A process member's Address is its gang's rendezvous address
		// (rank 0's announces it to the others).
		go func() {
			s := w.spec
			ready := api.Worker{Job: s.Job, Gang: s.Gang, Rank: s.Rank, Generation: s.Generation,
				GangUID: s.GangUID, Machine: a.cfg.Name, Address: s.Master, PID: h.PID(), Started: time.Now()}
			if an, ok := h.(Announcer); ok { // a hosted worker's actor answers calls
				ready.Address, ready.ActorID = an.Announce()
			}
			tries, err := retryUnavailable(a.ctx, h.Done(), 500*time.Millisecond, 10*time.Second, func(ctx context.Context) error {
				ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				return a.client.WorkerReady(ctx, ready)
			})
			switch {
			case err != nil:
				a.log.Warn("could not report the worker running", workerField(s), zap.Int("tries", tries), zap.Error(err))
			case tries > 1:
				a.log.Info("reported the worker running", workerField(s), zap.Int("tries", tries))
			}
		}()
	}
	if w.spec.Process != nil {
		a.mu.Lock()
		a.noticeLocked(w) // a notice given while it was starting
		a.mu.Unlock()
	}
	<-h.Done()
	a.mu.Lock()
	if a.workers[key] == w {
		delete(a.workers, key)
	}
	stopping := w.stopping
	if !stopping {
		a.exited[exitKey(w.spec)] = true
	}
	a.notifyLocked()
	a.mu.Unlock()
	_ = a.local.ReleaseHolder(context.Background(), w.spec.Holder)
	ectx, ecancel := context.WithTimeout(context.Background(), 30*time.Second)
	a.endOwner(ectx, w.spec.Holder) // what the worker owned ends with it
	ecancel()
	if !stopping && a.ctx.Err() == nil {
		done := (w.spec.Driver || w.spec.Process != nil) && errors.Is(h.Err(), ErrExitedZero)
		var es ExitStatusError
		yielded := w.spec.Process != nil && errors.As(h.Err(), &es) && es.Status == w.spec.Process.YieldExitCode
		a.obs.exits.WithLabelValues(strconv.FormatBool(isPermanent(h.Err()))).Inc()
		if !done && !yielded {
			a.log.Warn("worker exited", workerField(w.spec), zap.Error(h.Err()))
		}
		a.reportExitOf(w.spec, h.Err().Error(), isPermanent(h.Err()), done, yielded)
	}
	a.reconcile()
}

// start launches a worker if it is still wanted: its job's and its gang's records (read at
// every launch, from the leader) must say the job runs and this generation of the gang
// starts or runs, and the agent must still want it. A launch for a stopped job or an
// ended gang generation is refused, and that gang incarnation is remembered as ended so
// that no reconcile starts its members again, whatever the watch still shows. It returns
// started false with no error when the worker was dropped.
func (a *Agent) start(w *worker) (Handle, bool, error) {
	if !a.wanted(w) {
		return nil, false, nil
	}
	ctx, cancel := context.WithTimeout(a.ctx, time.Minute)
	defer cancel()
	var job api.Job
	var g api.Gang
	var found bool
	var err error
	// The two reads are retried while the minute lasts: a read the heads could not answer
	// in time (a busy leader, an election) is no failure of the worker, and reporting it
	// as one restarted or failed its gang (atoll bench scale, 100 machines).
	for backoff := 100 * time.Millisecond; ; backoff = min(2*backoff, 5*time.Second) {
		if job, err = a.job(ctx, w.spec.Job); err == nil {
			found, err = a.client.Get(ctx, api.TableGangs+w.spec.Job+"/"+w.spec.Gang, &g)
		}
		if err == nil || errors.Is(err, api.ErrNotFound) || ctx.Err() != nil || !a.wanted(w) {
			break
		}
		a.log.Warn("the records of a worker to launch could not be read; retrying", workerField(w.spec), zap.Duration("in", backoff), zap.Error(err))
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
	}
	if err != nil && !a.wanted(w) {
		return nil, false, nil // dropped meanwhile: nothing to report
	}
	if err != nil {
		return nil, false, err
	}
	why := ""
	switch {
	case job.State != api.JobRunning:
		why = "its job is stopped"
	case !found || g.UID != w.spec.GangUID || g.Generation != w.spec.Generation:
		why = "its gang generation is over"
	case g.State != api.GangStarting && g.State != api.GangRunning:
		why = "its gang is " + string(g.State)
	}
	if why != "" {
		a.mu.Lock()
		a.ended[incarnation(w.spec.GangUID, w.spec.Generation)] = true
		a.mu.Unlock()
		a.log.Info("launch refused: "+why, workerField(w.spec))
		return nil, false, nil
	}
	if !a.wanted(w) {
		return nil, false, nil
	}
	h, err := a.cfg.Launcher.Launch(ctx, w.spec, job)
	return h, err == nil, err
}

// wanted reports whether a worker not yet started should still start: it is not stopping,
// and its gang incarnation is not known to be over.
func (a *Agent) wanted(w *worker) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.ctx.Err() == nil && !w.stopping && !a.ended[incarnation(w.spec.GangUID, w.spec.Generation)]
}

// Permanent is implemented by launch and exit errors that a restart cannot cure.
type Permanent interface{ Permanent() bool }

// retryUnavailable calls try until it succeeds, fails other than unavailable (the heads
// refused it for good: the gang moved or ended), ctx ends or stop closes, waiting from
// first, doubled up to most, between tries; it returns the tries made and the last error.
// A worker's ready report was tried once: lost to a leader that was overloaded (its
// attempts timed out), it left the gang starting for ever (244 gangs at 2,000 machines).
func retryUnavailable(ctx context.Context, stop <-chan struct{}, first, most time.Duration, try func(context.Context) error) (int, error) {
	wait := first
	for n := 1; ; n++ {
		err := try(ctx)
		if err == nil || !errors.Is(err, api.ErrUnavailable) {
			return n, err
		}
		select {
		case <-ctx.Done():
			return n, err
		case <-stop:
			return n, err
		case <-time.After(wait):
		}
		wait = min(2*wait, most)
	}
}

func isPermanent(err error) bool {
	var p Permanent
	return errors.As(err, &p) && p.Permanent()
}

func (a *Agent) stopWorker(w *worker) {
	a.mu.Lock()
	h := w.h
	a.mu.Unlock()
	if h == nil {
		return // still launching: launch stops it once started
	}
	ctx, cancel := context.WithTimeout(context.Background(), a.cfg.StopGrace+5*time.Second)
	defer cancel()
	if err := h.Stop(ctx, a.cfg.StopGrace); err != nil {
		a.log.Warn("worker did not stop", workerField(w.spec), zap.Error(err))
	}
}

// reportExit tells the leader a worker exited by itself, retrying until it is heard.
func (a *Agent) reportExit(s api.WorkerSpec, reason string, permanent, completed bool) {
	a.reportExitOf(s, reason, permanent, completed, false)
}

// reportExitOf is reportExit with a process gang member's yield (its yield exit code).
func (a *Agent) reportExitOf(s api.WorkerSpec, reason string, permanent, completed, yielded bool) {
	x := api.WorkerExit{Job: s.Job, Gang: s.Gang, Rank: s.Rank, Generation: s.Generation, Machine: a.cfg.Name, Reason: api.TruncateReason(reason),
		Permanent: permanent, Completed: completed, Yielded: yielded}
	backoff := 100 * time.Millisecond
	for a.ctx.Err() == nil {
		ctx, cancel := context.WithTimeout(a.ctx, 10*time.Second)
		err := a.client.WorkerExited(ctx, x)
		cancel()
		if err == nil || errors.Is(err, api.ErrNotFound) || errors.Is(err, api.ErrInvalid) {
			return
		}
		if errors.Is(err, api.ErrForbidden) || errors.Is(err, api.ErrStale) {
			// The leader no longer places that worker here (its gang moved on, or this
			// machine was declared dead and registered again): the report is refused for
			// good, and retrying it at once was a storm of refusals (and audit events) at
			// scale (atoll bench scale).
			a.log.Info("a worker exit the leader refuses: not reported", workerField(s), zap.Error(err))
			return
		}
		a.log.Warn("could not report a worker exit; retrying", workerField(s), zap.Duration("in", backoff), zap.Error(err))
		select {
		case <-a.ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// binary returns the path of a job's executable, fetching it by content hash from the
// object store the first time and checking its hash.
func (a *Agent) binary(ctx context.Context, job api.Job) (string, error) {
	if job.Binary == nil {
		return "", permanentErr{fmt.Errorf("job %q has no executable: its workers run inside its driver's process", job.Name)}
	}
	b := *job.Binary
	if len(b.SHA256) != 64 {
		return "", permanentErr{fmt.Errorf("job %q executable hash %q is not a sha256", job.Name, b.SHA256)}
	}
	path := filepath.Join(a.cfg.Dir, "bin", b.SHA256)
	a.mu.Lock()
	once := a.binaries[b.SHA256]
	if once == nil {
		once = &sync.Once{}
		a.binaries[b.SHA256] = once
	}
	a.mu.Unlock()
	once.Do(func() {
		err := a.fetchBinary(ctx, b, path)
		a.mu.Lock()
		a.binErr[b.SHA256] = err
		if err != nil {
			delete(a.binaries, b.SHA256) // a later launch tries again
		}
		a.mu.Unlock()
	})
	a.mu.Lock()
	err := a.binErr[b.SHA256]
	a.mu.Unlock()
	return path, err
}

func (a *Agent) fetchBinary(ctx context.Context, b api.Binary, path string) error {
	if st, err := os.Stat(path); err == nil && st.Size() == b.Size {
		if sum, err := fileSHA256(path); err == nil && sum == b.SHA256 {
			return nil
		}
	}
	id, err := object.ParseID(b.Object)
	if err != nil {
		return permanentErr{fmt.Errorf("executable object %q: %v", b.Object, err)}
	}
	v, err := a.local.Get(ctx, id, "agent/binaries")
	if err != nil {
		return fmt.Errorf("fetch executable %s: %w", b.SHA256[:12], err)
	}
	defer v.Release()
	sum := sha256.Sum256(v.Bytes())
	if hex.EncodeToString(sum[:]) != b.SHA256 || int64(len(v.Bytes())) != b.Size {
		return permanentErr{fmt.Errorf("executable object %s does not match its hash %s", b.Object, b.SHA256)}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".fetch-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(v.Bytes()); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o700); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// permanentErr marks an error a restart cannot cure.
type permanentErr struct{ error }

func (permanentErr) Permanent() bool { return true }
func (e permanentErr) Unwrap() error { return e.error }

// Workers lists the workers this agent runs (started or starting), by job/gang/rank.
func (a *Agent) Workers() map[string]api.WorkerSpec {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := map[string]api.WorkerSpec{}
	for k, w := range a.workers {
		out[k] = w.spec
	}
	return out
}

// KillWorker kills a worker as a crash would (tests and demonstrations): its exit is then
// reported like any other.
func (a *Agent) KillWorker(job, gang string, rank int) (int, error) {
	a.mu.Lock()
	w := a.workers[fmt.Sprintf("%s/%s/%d", job, gang, rank)]
	a.mu.Unlock()
	if w == nil || w.h == nil {
		return 0, fmt.Errorf("%w: no running worker %s/%s/%d on %s", api.ErrNotFound, job, gang, rank, a.cfg.Name)
	}
	return w.h.PID(), w.h.Kill()
}

// Shutdown stops the agent's workers, its API and its object store.
func (a *Agent) Shutdown(ctx context.Context) error {
	if a.cancel != nil {
		a.cancel()
	}
	a.wg.Wait()
	if a.gossip != nil {
		_ = a.gossip.Leave()
	}
	a.mu.Lock()
	var ws []*worker
	for _, w := range a.workers {
		w.stopping = true
		ws = append(ws, w)
	}
	a.mu.Unlock()
	var wg sync.WaitGroup
	for _, w := range ws {
		wg.Add(1)
		go func() { defer wg.Done(); a.stopWorker(w) }()
	}
	wg.Wait()
	sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	err := a.srv.Shutdown(sctx)
	if errors.Is(err, context.DeadlineExceeded) {
		err = a.srv.Close()
	}
	return errors.Join(err, a.node.Shutdown(ctx))
}

// serverHosts are the hosts the agent's certificate names, for clients that check the
// host they dialed (curl --cacert DIR/tls/ca.crt https://127.0.0.1:PORT/...): the loopback
// names, its API's and object store's listen hosts (unless unspecified) and the host it
// advertises.
func serverHosts(cfg Config) []string {
	hosts := []string{"localhost", "127.0.0.1", "::1"}
	add := func(h string) {
		if h == "" || slices.Contains(hosts, h) {
			return
		}
		if ip := net.ParseIP(h); ip != nil && ip.IsUnspecified() {
			return
		}
		hosts = append(hosts, h)
	}
	for _, l := range []string{cfg.Listen, cfg.TransferListen} {
		if h, _, err := net.SplitHostPort(l); err == nil {
			add(h)
		}
	}
	add(cfg.Advertise)
	return hosts
}
