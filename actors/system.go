package actors

import (
	"context"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
	"go.uber.org/zap"
	"go.uber.org/zap/exp/zapslog"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/atoll-run/atoll/internal/codec"
	"github.com/atoll-run/atoll/internal/freeport"
	"github.com/atoll-run/atoll/internal/pki"
)

// Errors returned by this package. Check them with errors.Is. The ones a caller can get
// from another process (ErrActorDead, ErrActorFailed, ErrUnknownKind, ErrShutdown) cross
// the process boundary as codes, so errors.Is works on them there too.
var (
	// ErrUnknownKind: no actor kind of that name is registered on the System.
	ErrUnknownKind = errors.New("actors: unknown actor kind")
	// ErrDuplicateKind: a kind of that name is already registered.
	ErrDuplicateKind = errors.New("actors: actor kind already registered")
	// ErrActorDead: the target actor is stopped (or never existed at that address), or its
	// process is gone.
	ErrActorDead = errors.New("actors: target actor is dead")
	// ErrNotDelivered: the call never reached its actor's handler (the actor had stopped
	// first, or stopped with the call in its mailbox), so sending it again runs it at most
	// once. It wraps ErrActorDead.
	ErrNotDelivered = fmt.Errorf("actors: not delivered: %w", ErrActorDead)
	// ErrActorFailed: the actor failed (panicked) while handling the call.
	ErrActorFailed = errors.New("actors: actor failed while handling the call")
	// ErrAnswererFailed: the actor that answered the call failed handling it (it panicked,
	// or was killed), so that actor has ended; it comes with ErrActorFailed. Unlike
	// ErrActorFailed it never crosses as part of an error an actor forwards: it is about the
	// actor called, not about the calls that actor made.
	ErrAnswererFailed = errors.New("actors: the actor that answered failed")
	// ErrUnknownActor: a name or ref that does not resolve to any actor.
	ErrUnknownActor = errors.New("actors: unknown actor")
	// ErrShutdown: the System is shut down.
	ErrShutdown = errors.New("actors: system shut down")
	// ErrInvalidSpec: a group, job or system spec is malformed.
	ErrInvalidSpec = errors.New("actors: invalid spec")
)

// Producer makes a fresh Handler for one actor incarnation.
type Producer func() Handler

// Config configures a System. The zero value works: an in-process system whose calls
// still pass every message through the codec, with a 30 s default call deadline.
type Config struct {
	// Logger receives the System's logs and protoactor-go's own (through slog). Default: no-op.
	Logger *zap.Logger
	// ProtoactorLevel is the least level of protoactor-go's own logs that Logger gets
	// (its remote logs every connection it opens and closes at info). Default: info.
	ProtoactorLevel zapcore.Level
	// DefaultCallTimeout bounds calls whose context has no deadline, so that nothing waits
	// forever. Default 30 s.
	DefaultCallTimeout time.Duration
	// Codec encodes messages and replies. Default: codec.New().
	Codec *codec.Codec
	// Errors are the program's own errors that keep their identity across processes (their
	// types registered with Codec). Default: none (a handler's error crosses as its text,
	// unless it wraps one of the runtime's sentinels).
	Errors *Errors
	// Remote, when set, makes the system reachable from other processes (protoactor-go
	// remote over gRPC).
	Remote *RemoteConfig
}

// RemoteConfig configures protoactor-go remote for a System.
type RemoteConfig struct {
	// Listen is host:port to listen on. Default 127.0.0.1:0 (loopback, a free port).
	Listen string
	// Advertise is the address other processes use to reach this one, when it differs
	// from the listening address (NAT, containers). Default: the listening address.
	Advertise string
	// ServerTLS and ClientTLS, when set, make every remote link mutually authenticated and
	// encrypted: ServerTLS should require and verify client certificates.
	ServerTLS, ClientTLS *tls.Config
	// Token, when set, is the cluster secret every remote link must carry: a process that
	// does not hold it cannot deliver a message to any actor here (it is refused before the
	// message is decoded), and this system presents it to the others.
	Token []byte
	// Admit, when set, decides each remote link by the peer's verified client certificate
	// (nil without TLS): an error refuses the link (PermissionDenied) before any message
	// of it is decoded. protoactor-go remote carries the messages of every sender of a
	// process over that process's one link and delivers them without naming their sender,
	// so a link, not a message, is what can be decided: per process, not per actor.
	Admit func(peer *x509.Certificate) error
}

// DefaultCallTimeout is used when Config.DefaultCallTimeout is zero.
const DefaultCallTimeout = 30 * time.Second

// CancellerID is the id of the process that takes Cancel messages on every System.
const CancellerID = "atoll$cancel"

// System owns one protoactor-go ActorSystem, the registry of actor kinds, the codec and
// the jobs hosted here. All methods are safe for concurrent use.
type System struct {
	sys     *actor.ActorSystem
	rem     *remote.Remote
	log     *zap.Logger
	timeout time.Duration
	codec   *codec.Codec
	errors  *Errors
	calls   *inflight
	remotes remoteCalls

	// answered are the other processes' addresses this system's actors have answered
	// calls of, for Flush.
	answeredMu sync.Mutex
	answered   map[string]bool

	mu    sync.RWMutex
	kinds map[string]Producer
	jobs  map[string]*Job
	down  bool
}

// NewSystem starts an actor system (and its remote listener when cfg.Remote is set).
func NewSystem(cfg Config) (*System, error) {
	if cfg.DefaultCallTimeout < 0 {
		return nil, fmt.Errorf("%w: DefaultCallTimeout %v is negative", ErrInvalidSpec, cfg.DefaultCallTimeout)
	}
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	log = log.Named("actors")
	timeout := cfg.DefaultCallTimeout
	if timeout == 0 {
		timeout = DefaultCallTimeout
	}
	if cfg.Codec == nil {
		cfg.Codec = codec.New()
	}
	paLog := log.Named("protoactor")
	if cfg.ProtoactorLevel > zapcore.InfoLevel {
		paLog = paLog.WithOptions(zap.IncreaseLevel(cfg.ProtoactorLevel))
	}
	handler := zapslog.NewHandler(paLog.Core())
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(handler)
	}))
	s := &System{
		sys:     sys,
		log:     log,
		timeout: timeout,
		codec:   cfg.Codec,
		errors:  cfg.Errors,
		calls:   newInflight(),
		kinds:   map[string]Producer{},
		jobs:    map[string]*Job{},
	}
	if err := s.AddProcess(CancellerID, &cancelProcess{s: s}); err != nil {
		return nil, err
	}
	if cfg.Remote != nil {
		if err := s.startRemote(*cfg.Remote); err != nil {
			sys.Shutdown()
			return nil, err
		}
	}
	return s, nil
}

func (s *System) startRemote(rc RemoteConfig) error {
	if rc.Listen == "" {
		rc.Listen = "127.0.0.1:0"
	}
	host, portS, err := net.SplitHostPort(rc.Listen)
	if err != nil {
		return fmt.Errorf("%w: remote listen address %q: %v", ErrInvalidSpec, rc.Listen, err)
	}
	port, err := strconv.Atoi(portS)
	if err != nil || port < 0 || port > 65535 {
		return fmt.Errorf("%w: remote listen port %q", ErrInvalidSpec, portS)
	}
	// protoactor listens inside Start and panics when it cannot, so a free port is picked
	// here first (below the ephemeral range, where an outgoing connection cannot take it in
	// between: internal/freeport) and, when another process binds it first all the same,
	// another one is tried.
	pick := port == 0
	opts := []remote.ConfigOption{}
	if rc.Advertise != "" {
		opts = append(opts, remote.WithAdvertisedHost(rc.Advertise))
	}
	var serverOpts []grpc.ServerOption
	dialOpts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if rc.ServerTLS != nil {
		serverOpts = append(serverOpts, grpc.Creds(credentials.NewTLS(rc.ServerTLS)))
	}
	if rc.ClientTLS != nil {
		dialOpts = []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(rc.ClientTLS))}
	}
	if len(rc.Token) > 0 || rc.Admit != nil {
		want := "Bearer " + string(rc.Token)
		check := func(ctx context.Context) error {
			md, _ := metadata.FromIncomingContext(ctx)
			got := ""
			if v := md.Get("authorization"); len(v) == 1 {
				got = v[0]
			}
			if len(rc.Token) > 0 && subtle.ConstantTimeCompare([]byte(got), []byte(want)) != 1 {
				s.log.Warn("unauthenticated remote link refused")
				return status.Error(codes.Unauthenticated, "actors: the cluster token is required")
			}
			if rc.Admit != nil {
				var cert *x509.Certificate
				if p, ok := peer.FromContext(ctx); ok {
					if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok {
						cert = pki.PeerCert(&ti.State)
					}
				}
				if err := rc.Admit(cert); err != nil {
					s.log.Warn("remote link refused", zap.Error(err))
					return status.Error(codes.PermissionDenied, "actors: "+err.Error())
				}
			}
			return nil
		}
		serverOpts = append(serverOpts,
			grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
				if err := check(ss.Context()); err != nil {
					return err
				}
				return h(srv, ss)
			}),
			grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
				if err := check(ctx); err != nil {
					return nil, err
				}
				return h(ctx, req)
			}))
		if len(rc.Token) > 0 {
			dialOpts = append(dialOpts, grpc.WithPerRPCCredentials(tokenCreds(want)))
		}
	}
	if len(serverOpts) > 0 {
		opts = append(opts, remote.WithServerOptions(serverOpts...))
	}
	opts = append(opts, remote.WithDialOptions(dialOpts...))
	var r *remote.Remote
	for try := 1; ; try++ {
		if pick {
			if port, err = pickPort(host); err != nil {
				return fmt.Errorf("actors: remote listen %s: %w", rc.Listen, err)
			}
		}
		rcfg := remote.Configure(host, port, opts...)
		// A process that is gone is reported by the runtime (its agent saw it exit); one
		// failed connection attempt (then protoactor's fixed 2 s pause) is enough before its
		// messages are answered as dead letters.
		rcfg.MaxRetryCount = 1
		r = remote.NewRemote(s.sys, rcfg)
		err := startRemote(r, host, port)
		if err == nil {
			break
		}
		if !pick || try == listenTries {
			return err
		}
		s.log.Info("the picked remote port was taken before it was bound; picking another", zap.Error(err))
	}
	s.rem = r
	s.sys.EventStream.Subscribe(func(evt any) {
		if e, ok := evt.(*remote.EndpointTerminatedEvent); ok {
			s.remotes.failAll(e.Address)
		}
	})
	s.log.Info("remote listening", zap.String("address", s.sys.Address()))
	return nil
}

// pickPort picks the port of a remote listener asked for on port 0 (a test's hook).
var pickPort = freeport.Port

// listenTries is how many free ports a system picks before it gives up listening.
const listenTries = 5

// startRemote starts r, whose listen failure protoactor reports by panicking (before it
// changes any state), as an error.
func startRemote(r *remote.Remote, host string, port int) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("actors: remote listen %s:%d: %v", host, port, p)
		}
	}()
	r.Start()
	return nil
}

// tokenCreds presents the cluster token on every remote call.
type tokenCreds string

func (t tokenCreds) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": string(t)}, nil
}

func (tokenCreds) RequireTransportSecurity() bool { return false }

// Address is the system's address: host:port when it is remote, "nonhost" otherwise.
func (s *System) Address() string { return s.sys.Address() }

// Remote reports whether other processes can reach this system.
func (s *System) Remote() bool { return s.rem != nil }

// Codec is the system's codec (register message types on it).
func (s *System) Codec() *codec.Codec { return s.codec }

// Register adds an actor kind by name. Names are unique per System.
func (s *System) Register(kind string, p Producer) error {
	if kind == "" {
		return fmt.Errorf("%w: empty kind name", ErrInvalidSpec)
	}
	if p == nil {
		return fmt.Errorf("%w: kind %q has a nil producer", ErrInvalidSpec, kind)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.kinds[kind]; ok {
		return fmt.Errorf("%w: %q", ErrDuplicateKind, kind)
	}
	s.kinds[kind] = p
	return nil
}

// Kinds lists the registered kind names, sorted.
func (s *System) Kinds() []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]string, 0, len(s.kinds))
	for k := range s.kinds {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Producer returns the producer of a registered kind.
func (s *System) Producer(kind string) (Producer, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.down {
		return nil, ErrShutdown
	}
	p, ok := s.kinds[kind]
	if !ok {
		known := make([]string, 0, len(s.kinds))
		for k := range s.kinds {
			known = append(known, k)
		}
		sort.Strings(known)
		return nil, fmt.Errorf("%w: %q (registered: %v)", ErrUnknownKind, kind, known)
	}
	return p, nil
}

// Spawn starts a single actor of the given kind under the system's root, named name
// (empty: a generated name).
func (s *System) Spawn(kind, name string) (Ref, error) {
	p, err := s.Producer(kind)
	if err != nil {
		return Ref{}, err
	}
	props := cellProps(s, p, nil, -1, name)
	if name == "" {
		return Ref{pid: s.sys.Root.Spawn(props), kind: kind}, nil
	}
	pid, err := s.sys.Root.SpawnNamed(props, name)
	if err != nil {
		return Ref{}, fmt.Errorf("actors: spawn %q of kind %q: %w", name, kind, err)
	}
	return Ref{pid: pid, kind: kind}, nil
}

// Stop stops an actor of this system and waits until it has stopped or ctx ends.
func (s *System) Stop(ctx context.Context, r Ref) error {
	if r.pid == nil {
		return fmt.Errorf("%w: empty ref", ErrUnknownActor)
	}
	return waitFuture(ctx, s.sys.Root.StopFuture(r.pid))
}

// Lookup resolves an actor of this system by its id (Ref.ID).
func (s *System) Lookup(id string) (Ref, error) {
	if _, ok := s.sys.ProcessRegistry.GetLocal(id); !ok {
		return Ref{}, fmt.Errorf("%w: %q", ErrUnknownActor, id)
	}
	return Ref{pid: actor.NewPID(s.sys.Address(), id)}, nil
}

// AddProcess registers a raw protoactor process under id: Atoll's routers (cancellation,
// collectives), which must take messages while the actors they serve are busy.
func (s *System) AddProcess(id string, p actor.Process) error {
	if _, ok := s.sys.ProcessRegistry.Add(p, id); !ok {
		return fmt.Errorf("%w: a process %q is already registered", ErrInvalidSpec, id)
	}
	return nil
}

// Tell sends a protobuf message as is (no codec envelope) to the process id of the system
// at address: a router's message.
func (s *System) Tell(address, id string, msg proto.Message) {
	s.sys.Root.Send(actor.NewPID(address, id), msg)
}

// Protoactor is the protoactor-go ActorSystem underneath, for tools that compare with it
// (the benchmarks). Atoll's own code goes through System's methods.
func (s *System) Protoactor() *actor.ActorSystem { return s.sys }

// Logger is the System's logger.
func (s *System) Logger() *zap.Logger { return s.log }

// flushID is an id no actor has: a request to it comes back as a dead letter.
const flushID = "atoll$flush"

// noteAnswered records that an actor answered a call of the process at addr.
func (s *System) noteAnswered(addr string) {
	if s.rem == nil || addr == s.sys.Address() {
		return
	}
	s.answeredMu.Lock()
	if s.answered == nil {
		s.answered = map[string]bool{}
	}
	s.answered[addr] = true
	s.answeredMu.Unlock()
}

// Flush waits, within ctx, until the answers this system's actors sent to other processes
// have reached them: a process about to exit (its worker failed) flushes, so that its
// callers get the failure's answer (ErrActorFailed, with the panic's message) rather than
// learning that it went away. It sends each of those processes a request for an actor that
// does not exist: the dead letter that comes back on the same ordered link follows every
// answer sent before it.
func (s *System) Flush(ctx context.Context) error {
	s.answeredMu.Lock()
	addrs := make([]string, 0, len(s.answered))
	for a := range s.answered {
		addrs = append(addrs, a)
	}
	s.answeredMu.Unlock()
	var wg sync.WaitGroup
	for _, a := range addrs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = Call[struct{}](ctx, s, NewRef(a, flushID), struct{}{})
		}()
	}
	wg.Wait()
	return ctx.Err()
}

// Shutdown stops every job and the actor system (and its remote). It is idempotent.
func (s *System) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	if s.down {
		s.mu.Unlock()
		return nil
	}
	s.down = true
	jobs := make([]*Job, 0, len(s.jobs))
	for _, j := range s.jobs {
		jobs = append(jobs, j)
	}
	s.mu.Unlock()
	var errs []error
	for _, j := range jobs {
		if err := j.Stop(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	s.calls.cancelAll()
	if s.rem != nil {
		s.rem.Shutdown(false)
	}
	s.sys.Shutdown()
	return errors.Join(errs...)
}

// waitFuture waits for a protoactor future within ctx.
func waitFuture(ctx context.Context, f *actor.Future) error {
	done := make(chan error, 1)
	go func() { done <- f.Wait() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}
