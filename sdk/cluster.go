package sdk

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
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
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/atoll-run/atoll/actors"
	"github.com/atoll-run/atoll/internal/codec"
	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/runtime/coll"
	"github.com/atoll-run/atoll/runtime/objects"
	"github.com/atoll-run/atoll/store/object"
	"github.com/atoll-run/atoll/store/transfer"
	"github.com/atoll-run/atoll/topology"
)

// Errors of the SDK. Check them with errors.Is; they keep their identity across processes.
var (
	// ErrStale: the gang incarnation a call or collective was for has ended (a member
	// failed and the gang restarts); retry against the new incarnation.
	ErrStale = actors.ErrStale
	// ErrNotInGang: a gang-only operation (AllReduce) on a standalone actor.
	ErrNotInGang = actors.ErrNotInGang
	// ErrActorDead: the actor is stopped, or its process is gone.
	ErrActorDead = actors.ErrActorDead
	// ErrActorFailed: the actor failed (panicked) while handling the call.
	ErrActorFailed = actors.ErrActorFailed
	// ErrUnknownKind: no actor kind of that name was given to Start/Local/Connect.
	ErrUnknownKind = actors.ErrUnknownKind
	// ErrUnserializable: a message, argument or object cannot cross a process boundary.
	ErrUnserializable = codec.ErrUnserializable
	// ErrInvalid: a malformed request (bad name, negative size, ...).
	ErrInvalid = api.ErrInvalid
	// ErrNeverFits: a gang that can never be placed on this cluster, even empty.
	ErrNeverFits = api.ErrNeverFits
	// ErrNoCapacity: a gang that does not fit now.
	ErrNoCapacity = api.ErrNoCapacity
	// ErrSaturated: the cluster's queue is full (past its bound of pending gangs); retry
	// later (the error's RetryAfter says when).
	ErrSaturated = api.ErrSaturated
	// ErrUnknownObject: no object with that id (never created, or freed).
	ErrUnknownObject = errors.New("sdk: unknown object")
	// ErrOwnerDied: the object's owner (the driver, worker incarnation or job that put it)
	// ended, and the object with it, as Ray's OwnerDiedError. The error matches
	// ErrUnknownObject too. Detached objects and checkpoints have no such owner.
	ErrOwnerDied = object.ErrOwnerDied
	// ErrObjectLost: no copy of the object is left (the machines that held it are gone).
	ErrObjectLost = object.ErrLost
	// ErrNotDurable: a checkpoint or a detached object could not be made durable on two
	// machines (or on one and the shared checkpoint directory): nothing was committed.
	ErrNotDurable = errors.New("sdk: not durable")
	// ErrGangFailed: the gang used up its restarts (or failed for good) and freed its GPUs.
	ErrGangFailed = errors.New("sdk: gang failed")
	// ErrStopped: the gang or placed actor was stopped (by its driver, or with its job).
	ErrStopped = errors.New("sdk: stopped")
	// ErrNotFound: no such job, gang, placed actor or checkpoint.
	ErrNotFound = api.ErrNotFound
	// ErrExists: a job, gang or placed actor of that name is already running.
	ErrExists = api.ErrExists
	// ErrForbidden: this process's credential does not allow it (a driver's of one job
	// acts within that job: docs/hardening.md has the table of role × action).
	ErrForbidden = api.ErrForbidden
	// ErrUnknownTask: no task of that name was given to Start/Local/Connect (with Tasks).
	ErrUnknownTask = errors.New("sdk: unknown task")
	// ErrNoCluster: no cluster address was given and no embedded cluster was made
	// available (package sdk/local).
	ErrNoCluster = errors.New("sdk: no cluster")
	// ErrInWorker: Start, Local or Connect was called in a worker process (one started by
	// an agent); such a process serves its worker with WorkerMain or ServeWorker instead.
	ErrInWorker = errors.New("sdk: this process is a worker")
)

// Cluster is a handle on an Atoll cluster: an embedded one (Local) or a running one
// (Connect). All methods are safe for concurrent use.
type Cluster struct {
	c        *conn
	embedded *embedded
	driver   *transfer.Node // a connected driver's own object store
	driverD  *tempDir
}

// conn is what a process (a driver, or a worker process) holds of the cluster: its client
// of the heads, its actor system, its collectives and its object store.
type conn struct {
	s      settings
	log    *zap.Logger
	client *api.Client
	sys    *actors.System
	plane  *coll.Plane
	token  string
	owner  string
	// principal is who this process is to the cluster (runtime/authz): its owner record
	// names it.
	principal string
	objects   objectHost // this process's machine's store, as this process uses it
	// ownStore: objects is a store of this process's own (a connected driver's), which
	// goes with it.
	ownStore bool
	// workerProc: this is a worker process an agent started, whose logger names its
	// worker (job, gang, rank, generation) in every line.
	workerProc bool
	// agentAnnounces: the agent that launched a worker hosted here reports it ready (a
	// WorkerHost's workers); otherwise host does, on this process's credential.
	agentAnnounces bool
	// agents is the client of the agents' APIs (with this process's certificate when the
	// cluster runs mutual TLS).
	agents *http.Client

	mu     sync.Mutex
	locals map[string]*objects.Local // stores in this process, by location (embedded machines)
	hosted map[string]*hosted        // workers hosted in this process, by job/gang/rank
	gangs  map[*Gang]bool            // gang handles following the log
	feeds  map[string]*jobFeed       // what the gang handles follow, by job
	pools  map[string]*taskPool      // task workers, by job
	jobs   []string                  // jobs this driver submitted (stopped at Shutdown)

	// life ends at Shutdown: the gang handles' watches derive from it.
	life    context.Context
	endLife context.CancelFunc
}

// init fills what every conn needs.
func (c *conn) init() {
	c.locals, c.hosted, c.gangs, c.pools = map[string]*objects.Local{}, map[string]*hosted{}, map[*Gang]bool{}, map[string]*taskPool{}
	c.feeds = map[string]*jobFeed{}
	if c.agents == nil {
		c.agents = http.DefaultClient
	}
	c.life, c.endLife = context.WithCancel(context.Background())
}

func (c *Cluster) conn() *conn       { return c.c }
func (c *Cluster) store() objectHost { return c.c.objects }
func (c *conn) conn() *conn          { return c }
func (c *conn) store() objectHost    { return c.objects }

func apply(opts []Option) (settings, error) {
	s := defaults()
	for _, o := range opts {
		if err := o(&s); err != nil {
			return s, err
		}
	}
	return s, nil
}

// InWorker reports whether this process is a worker started by an agent: the program
// then serves its worker (WorkerMain or ServeWorker) instead of driving a job.
func InWorker() bool { return os.Getenv(api.WorkerEnv) != "" }

// inWorker refuses to drive a cluster from a worker process, saying what to do instead.
func inWorker() error {
	if !InWorker() {
		return nil
	}
	return fmt.Errorf("%w (started by an agent, %s set): begin main with `if sdk.InWorker() { os.Exit(sdk.WorkerMain(opts...)) }`", ErrInWorker, api.WorkerEnv)
}

// Start connects to the cluster named by WithAddress or ATOLL_ADDRESS, and otherwise
// starts the embedded cluster that an option made available (local.Default(), or
// local.Start, from package sdk/local); without one it fails with ErrNoCluster. The same
// program runs unchanged on one process and on a cluster. In a worker process it fails
// with ErrInWorker: a program begins main with
//
//	if sdk.InWorker() {
//		os.Exit(sdk.WorkerMain(kinds...))
//	}
func Start(ctx context.Context, opts ...Option) (*Cluster, error) {
	if err := inWorker(); err != nil {
		return nil, err
	}
	s, err := apply(opts)
	if err != nil {
		return nil, err
	}
	addr := s.address
	if addr == "" {
		addr = envAddress()
	}
	if addr != "" {
		return connect(ctx, s, addr)
	}
	return startLocal(ctx, s)
}

// Local starts an embedded cluster in this process, made available by an option
// (local.Default() from package sdk/local, whose local.Cluster calls this): three head
// replicas (the Paxos metadata log, fsync'd in a temporary directory), one agent per
// machine with its object store, and workers hosted in this process. By default the
// machines are four simulated DGX H100s (each one NVLink island of 8); simulated GPUs are
// declared as such, never claimed as hardware.
func Local(ctx context.Context, opts ...Option) (*Cluster, error) {
	if err := inWorker(); err != nil {
		return nil, err
	}
	s, err := apply(opts)
	if err != nil {
		return nil, err
	}
	return startLocal(ctx, s)
}

// Connect connects to a running cluster: address lists its heads' URLs (as `atoll
// address` prints it, optionally followed by ";token-file=PATH").
func Connect(ctx context.Context, address string, opts ...Option) (*Cluster, error) {
	if err := inWorker(); err != nil {
		return nil, err
	}
	s, err := apply(opts)
	if err != nil {
		return nil, err
	}
	return connect(ctx, s, address)
}

// Address is a parsed cluster address: its heads' URLs, and the files of its token and of
// its CA's certificate (needed when the heads are https).
type Address struct {
	Heads     []string
	TokenFile string
	CAFile    string
}

// ParseClusterAddress parses an address: "URL,URL" optionally followed by
// ";token-file=PATH" and ";ca=PATH", or ";credentials=DIR" (a directory of `atoll token
// create`: DIR/token and DIR/ca.crt).
func ParseClusterAddress(address string) (Address, error) {
	var a Address
	main, opts, _ := strings.Cut(address, ";")
	for _, o := range strings.Split(opts, ";") {
		k, v, ok := strings.Cut(o, "=")
		switch {
		case ok && k == "token-file":
			a.TokenFile = v
		case ok && k == "ca":
			a.CAFile = v
		case ok && k == "credentials":
			a.TokenFile, a.CAFile = filepath.Join(v, "token"), filepath.Join(v, "ca.crt")
		case strings.TrimSpace(o) != "":
			return a, fmt.Errorf("%w: address option %q: token-file=PATH, ca=PATH and credentials=DIR are known", ErrInvalid, o)
		}
	}
	var err error
	a.Heads, err = api.ParseAddress(main)
	return a, err
}

// ParseAddress splits an address ("URL,URL;token-file=PATH;ca=PATH") into head URLs and
// the token file it names (if any).
func ParseAddress(address string) (heads []string, tokenFile string, err error) {
	a, err := ParseClusterAddress(address)
	return a.Heads, a.TokenFile, err
}

// ReadTokenFile reads a cluster token from a file that only its owner may read.
func ReadTokenFile(path string) ([]byte, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("sdk: token file: %w", err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("sdk: token file %s has mode %v: a cluster secret must be readable by its owner only (chmod 600)", path, st.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("sdk: token file: %w", err)
	}
	tok := []byte(strings.TrimSpace(string(b)))
	if len(tok) < 16 {
		return nil, fmt.Errorf("sdk: token file %s holds %d bytes, want at least 16", path, len(tok))
	}
	return tok, nil
}

func newToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// drivers counts the connections this process made: each owns objects under a name of its
// own.
var drivers atomic.Int64

// ownerName names this connection as an owner of objects: driver/<host>/<pid>, and
// driver/<host>/<pid>.<n> for the n-th connection of the process after its first (two
// drivers of one process, with credentials of different jobs, own different objects).
func ownerName() string {
	host, _ := os.Hostname()
	if n := drivers.Add(1); n > 1 {
		return fmt.Sprintf("driver/%s/%d.%d", host, os.Getpid(), n)
	}
	return fmt.Sprintf("driver/%s/%d", host, os.Getpid())
}

func connect(ctx context.Context, s settings, address string) (*Cluster, error) {
	addr, err := ParseClusterAddress(address)
	if err != nil {
		return nil, err
	}
	heads, tokenFile := addr.Heads, addr.TokenFile
	caPEM, err := readCA(addr.CAFile)
	if err != nil {
		return nil, err
	}
	if s.tokenFile != "" {
		tokenFile = s.tokenFile
	}
	if tokenFile == "" {
		tokenFile = os.Getenv("ATOLL_TOKEN_FILE")
	}
	token := s.token
	if len(token) == 0 && tokenFile != "" {
		if token, err = ReadTokenFile(tokenFile); err != nil {
			return nil, err
		}
	}
	if len(token) == 0 {
		if t := os.Getenv("ATOLL_TOKEN"); t != "" {
			token = []byte(t)
		}
	}
	if len(token) == 0 {
		return nil, fmt.Errorf("%w: no cluster token: give the address's token-file, ATOLL_TOKEN_FILE or ATOLL_TOKEN", ErrInvalid)
	}
	owner := ownerName()
	id, err := clusterIdentity(ctx, heads, string(token), caPEM, owner)
	if err != nil {
		return nil, err
	}
	cc := api.ClientConfig{Heads: heads, Token: string(token), Logger: s.log}
	secureLinks(id, &cc, nil, nil)
	client, err := api.NewClient(ctx, cc)
	if err != nil {
		return nil, err
	}
	// Who this driver is (admin with the cluster token, driver/<job> with a driver's
	// credential), and the key of the links between the cluster's processes.
	var who api.WhoAmI
	if err := client.Do(ctx, http.MethodGet, "/v1/whoami", nil, &who); err != nil {
		return nil, fmt.Errorf("sdk: who this driver is to the heads: %w", err)
	}
	link := []byte(who.LinkKey)
	host := s.advertise
	if host == "" {
		host = "127.0.0.1"
	}
	sys, err := actors.NewSystem(actors.Config{Logger: s.log, DefaultCallTimeout: s.callTimeout, Codec: s.codec, Errors: s.errors,
		Remote: remoteConfig(net.JoinHostPort(host, "0"), link, id, who.Principal, client)})
	if err != nil {
		return nil, err
	}
	c := &conn{s: s, log: s.log.Named("sdk"), client: client, sys: sys, token: string(token), owner: owner, principal: who.Principal, agents: httpClient(id)}
	c.init()
	c.followCA(id, api.Renewal{Heads: heads, Token: string(token), Name: owner})
	if c.plane, err = coll.NewPlane(sys, link, host, s.log); err != nil {
		_ = sys.Shutdown(ctx)
		return nil, err
	}
	secureLinks(id, nil, c.plane, nil)
	td, err := makeTempDir(tempPrefixDriver, s.log)
	if err != nil {
		_ = sys.Shutdown(ctx)
		return nil, err
	}
	dir := td.path
	nc := transfer.DefaultNodeConfig()
	nc.Name, nc.Dir, nc.Token, nc.Logger, nc.ListenAddr = "driver", filepath.Join(dir, "store"), link, s.log.Named("objects"), net.JoinHostPort(host, "0")
	nc.Store.Directory = objects.NewDirectory(client.Meta()).WriteBehind()
	secureLinks(id, nil, nil, &nc)
	if id != nil { // a driver of one job serves its store to that job's processes
		admit := linkAdmit(who.Principal, client)
		nc.Server.Authorize = func(_ context.Context, peer *x509.Certificate, _ object.ID) error { return admit(peer) }
	}
	nc.Store.Capacity = DefaultObjectStore
	if s.objectCap > 0 {
		nc.Store.Capacity = s.objectCap
	}
	node, err := transfer.StartNode(nc)
	if err != nil {
		_ = sys.Shutdown(ctx)
		_ = td.remove()
		return nil, fmt.Errorf("sdk: the driver's object store: %w", err)
	}
	local := objects.NewLocal(node)
	c.locals[node.Addr] = local
	c.objects, c.ownStore = localStore{l: local, holder: c.owner}, true
	if err := c.registerOwner(ctx, node.Addr); err != nil {
		c.endLife()
		_ = node.Shutdown(ctx)
		_ = sys.Shutdown(ctx)
		_ = td.remove()
		return nil, err
	}
	return &Cluster{c: c, driver: node, driverD: td}, nil
}

// Shutdown stops the embedded cluster (every job's workers, the agents, the heads), or
// disconnects from a running one: the jobs this driver submitted stop (their gangs, placed
// actors and task workers; detached actors live on), and its objects go with it.
func (c *Cluster) Shutdown(ctx context.Context) error {
	var errs []error
	if c.embedded == nil {
		c.c.mu.Lock()
		jobs := append([]string(nil), c.c.jobs...)
		c.c.mu.Unlock()
		for _, name := range jobs {
			sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			if err := (&Job{c: c.c, name: name}).Stop(sctx); err != nil && !errors.Is(err, ErrNotFound) {
				errs = append(errs, fmt.Errorf("stop job %s: %w", name, err))
			}
			cancel()
		}
	}
	c.c.mu.Lock()
	var pools []string
	for job := range c.c.pools {
		pools = append(pools, job)
	}
	c.c.mu.Unlock()
	for _, job := range pools { // tasks still waiting for a worker fail with ErrStopped
		c.c.closePool(job)
	}
	if c.embedded == nil { // this driver's objects end with it (an embedded cluster ends whole)
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if err := c.c.endOwner(sctx); err != nil {
			errs = append(errs, fmt.Errorf("end this driver's objects: %w", err))
		}
		cancel()
	}
	c.c.endLife()
	if c.embedded != nil {
		errs = append(errs, c.embedded.shutdown(ctx))
	}
	errs = append(errs, c.c.plane.Close(), c.c.sys.Shutdown(ctx))
	if c.driver != nil {
		errs = append(errs, c.driver.Shutdown(ctx), c.driverD.remove())
	}
	if c.embedded != nil {
		errs = append(errs, c.embedded.removeDir())
	}
	return errors.Join(errs...)
}

// Address is the cluster's address (its heads' URLs), for ATOLL_ADDRESS.
func (c *Cluster) Address() string { return api.FormatAddress(c.c.client.Heads()) }

// Embedded reports whether this is an embedded cluster (Local).
func (c *Cluster) Embedded() bool { return c.embedded != nil }

// Status asks the leader head for the cluster's status.
func (c *Cluster) Status(ctx context.Context) (Status, error) {
	st, err := c.c.client.Status(ctx)
	if err != nil {
		return Status{}, err
	}
	return fromAPIStatus(st), nil
}

// Machines lists the cluster's machines (alive or not), by name.
func (c *Cluster) Machines(ctx context.Context) ([]Machine, error) { return c.c.machines(ctx) }

func (c *conn) machines(ctx context.Context) ([]Machine, error) {
	l, err := c.client.List(ctx, api.TableMachines)
	if err != nil {
		return nil, err
	}
	var out []Machine
	for _, kv := range l.KVs {
		var m api.Machine
		if err := json.Unmarshal(kv.Value, &m); err != nil {
			return nil, fmt.Errorf("sdk: machine %s: %w", kv.Key, err)
		}
		out = append(out, fromAPIMachine(m))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Topology builds the topology model (machines, GPUs, NVLink islands, links) of the
// cluster's alive machines, as the scheduler sees them.
func (c *Cluster) Topology(ctx context.Context) (*topology.Cluster, error) {
	ms, err := c.Machines(ctx)
	if err != nil {
		return nil, err
	}
	var insts []topology.MachineInstance
	for _, m := range ms {
		if m.Alive && m.Spec != nil {
			insts = append(insts, topology.MachineInstance{Name: m.Name, Rack: m.Rack, Spec: m.Spec, Discovered: !m.Simulated})
		}
	}
	sort.SliceStable(insts, func(i, j int) bool { return insts[i].Rack < insts[j].Rack })
	if len(insts) == 0 {
		return nil, fmt.Errorf("%w: no machine is alive", ErrNoCapacity)
	}
	return topology.BuildMachines(insts, topology.NetworkSpec{})
}

// agentURL finds the agent API of the machine whose store is at a transfer address.
func (c *conn) agentURL(ctx context.Context, match func(api.Machine) bool) (string, error) {
	l, err := c.client.List(ctx, api.TableMachines)
	if err != nil {
		return "", err
	}
	for _, kv := range l.KVs {
		var m api.Machine
		if json.Unmarshal(kv.Value, &m) == nil && match(m) {
			return m.Agent.API, nil
		}
	}
	return "", fmt.Errorf("%w: no such machine", api.ErrNotFound)
}

// agentCall posts to an agent's API.
func (c *conn) agentCall(ctx context.Context, agentURL, path string, body any) error {
	return c.agentDo(ctx, agentURL, path, body, nil)
}

// agentDo posts to an agent's API and decodes its answer into out (when not nil).
func (c *conn) agentDo(ctx context.Context, agentURL, path string, body, out any) error {
	var rd *strings.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = strings.NewReader(string(b))
	} else {
		rd = strings.NewReader("")
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, agentURL+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := c.agents.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		var eb api.ErrorBody
		_ = json.NewDecoder(resp.Body).Decode(&eb)
		switch eb.Kind {
		case "not_found":
			return fmt.Errorf("%s: %w", eb.Error, api.ErrNotFound)
		case api.KindOwnerDied:
			return fmt.Errorf("%s: %w", eb.Error, object.ErrOwnerDied)
		case api.KindObjectLost:
			return fmt.Errorf("%s: %w", eb.Error, object.ErrLost)
		}
		return fmt.Errorf("sdk: agent %s%s: %d: %s", agentURL, path, resp.StatusCode, eb.Error)
	}
	if out != nil {
		return json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(out)
	}
	return nil
}

// freeEverywhere drops an object from every store that holds it.
// Its record may still be on its way (an owned object's is committed behind its put):
// this process's stores are flushed first, another's is waited for up to a second.
func (c *conn) freeEverywhere(ctx context.Context, own objectHost, id object.ID) error {
	if u, ok := own.(interface{ unwritten(object.ID) bool }); ok && u.unwritten(id) {
		// Put and freed before its record left the group-commit queue: this store's copy
		// is the only one, and the record is never written (Ray's put whose ref is dropped
		// at once costs no round of the log either). Should the record be proposed
		// meanwhile, the free waits for its commit and deletes it.
		return own.free(ctx, id)
	}
	c.flushDirectories(ctx)
	var rec objects.Record
	deadline := time.Now().Add(time.Second)
	for wait := time.Millisecond; ; wait = min(2*wait, 64*time.Millisecond) {
		found, err := c.client.Get(ctx, api.TableObjects+id.String(), &rec)
		if err != nil {
			return err
		}
		if found {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: %s", ErrUnknownObject, id)
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return fmt.Errorf("sdk: free %s: %w", id.Short(), ctx.Err())
		}
	}
	var errs []error
	for _, loc := range rec.Locations {
		errs = append(errs, c.dropAt(ctx, own, loc, id, nil))
	}
	return errors.Join(errs...)
}

// dropAt asks the store at a transfer address to let its copy of id go, refusing later
// gets with cause (nil: as a free; object.ErrOwnerDied: its owner ended). A store that is
// no alive machine's (a driver's, or gone) is left to its owner and to reconciliation.
func (c *conn) dropAt(ctx context.Context, own objectHost, loc string, id object.ID, cause error) error {
	switch {
	case loc == own.location() && cause == nil:
		return own.free(ctx, id)
	case c.local(loc) != nil:
		return c.local(loc).Drop(ctx, id, cause)
	}
	if dir, ok := strings.CutPrefix(loc, objects.SharedPrefix); ok { // a shared checkpoint directory
		u, err := c.agentURL(ctx, func(m api.Machine) bool { return m.Alive && m.Agent.CheckpointDir == dir })
		if err != nil {
			return nil
		}
		return c.agentCall(ctx, u, "/v1/objects/unexport", api.ObjectRef{ID: id.String()})
	}
	u, err := c.agentURL(ctx, func(m api.Machine) bool { return m.Alive && m.Agent.Transfer == loc })
	if err != nil {
		return nil
	}
	ref := api.ObjectRef{ID: id.String()}
	path := "/v1/objects/free"
	if cause != nil {
		ref.Cause, path = api.CauseOwnerDied, "/v1/objects/drop"
	}
	if err := c.agentCall(ctx, u, path, ref); err != nil && !errors.Is(err, api.ErrNotFound) {
		return err
	}
	return nil
}

func (c *conn) local(location string) *objects.Local {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.locals[location]
}

// JobSpec describes a job.
type JobSpec struct {
	// Name is unique in the cluster among running jobs: 1-63 characters of [A-Za-z0-9._-].
	Name string
}

// Submit creates a job: the root of its gangs and actors. On a cluster it stores this
// program's executable once in the object store (by content hash) so that agents can
// start its workers: they run this same program, with its arguments, in worker mode.
func (c *Cluster) Submit(ctx context.Context, spec JobSpec) (*Job, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := api.CheckName("job", spec.Name); err != nil {
		return nil, err
	}
	host, _ := os.Hostname()
	j := api.Job{Name: spec.Name, Driver: fmt.Sprintf("%s/%d", host, os.Getpid())}
	if c.embedded == nil {
		bin, err := c.c.uploadBinary(ctx)
		if err != nil {
			return nil, err
		}
		wd, _ := os.Getwd()
		j.Binary, j.Args, j.Env, j.Dir = bin, os.Args[1:], c.c.s.env, wd
	}
	rec, err := c.c.client.SubmitJob(ctx, j)
	if err != nil {
		return nil, err
	}
	c.c.mu.Lock()
	c.c.jobs = append(c.c.jobs, rec.Name)
	c.c.mu.Unlock()
	return &Job{c: c.c, name: rec.Name}, nil
}

// uploadBinary stores this program's executable in the object store by content hash, once.
func (c *conn) uploadBinary(ctx context.Context) (*api.Binary, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("sdk: this program's executable: %w", err)
	}
	data, err := os.ReadFile(exe)
	if err != nil {
		return nil, fmt.Errorf("sdk: read this program's executable: %w", err)
	}
	sum := sha256.Sum256(data)
	hash := hex.EncodeToString(sum[:])
	var known api.Binary
	if ok, err := c.client.Get(ctx, api.TableBinaries+hash, &known); err == nil && ok {
		var rec objects.Record
		if ok, err := c.client.Get(ctx, api.TableObjects+known.Object, &rec); err == nil && ok && rec.State == "" {
			live, err := c.liveStores(ctx)
			for _, l := range rec.Locations {
				if err == nil && live[l] { // a copy an alive machine serves
					return &known, nil
				}
			}
		}
	}
	id := object.ID(sum)
	ls, ok := c.objects.(localStore)
	if !ok {
		return nil, fmt.Errorf("sdk: this process has no store of its own to serve its executable from")
	}
	if err := ls.l.Node.Store.PutID(ctx, c.owner+"/binary", id, data); err != nil && !errors.Is(err, object.ErrExists) {
		return nil, fmt.Errorf("sdk: store this program's executable: %w", err)
	}
	b := api.Binary{SHA256: hash, Size: int64(len(data)), Object: id.String()}
	rec, _ := json.Marshal(b)
	if _, err := c.client.Meta().Put(ctx, api.TableBinaries+hash, rec); err != nil {
		return nil, err
	}
	c.log.Info("executable stored for the job's workers", zap.String("sha256", hash[:12]), zap.Int("bytes", len(data)))
	return &b, nil
}
