package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"go.uber.org/zap"
	"go.uber.org/zap/exp/zapslog"
)

// Errors returned by this package. Check them with errors.Is.
var (
	// ErrUnknownKind: no actor kind of that name is registered on the System.
	ErrUnknownKind = errors.New("actors: unknown actor kind")
	// ErrDuplicateKind: a kind of that name is already registered.
	ErrDuplicateKind = errors.New("actors: actor kind already registered")
	// ErrActorDead: the target actor is stopped (or never existed at that address).
	ErrActorDead = errors.New("actors: target actor is dead")
	// ErrUnknownActor: a name that does not resolve to any actor.
	ErrUnknownActor = errors.New("actors: unknown actor")
	// ErrGangFailed: the gang used up its restarts and was stopped.
	ErrGangFailed = errors.New("actors: gang failed")
	// ErrShutdown: the System is shut down.
	ErrShutdown = errors.New("actors: system shut down")
	// ErrInvalidSpec: a gang or job spec is malformed.
	ErrInvalidSpec = errors.New("actors: invalid spec")
)

// Producer makes a fresh Handler for one actor incarnation; it is called again on restart.
type Producer func() Handler

// Config configures a System. The zero value works: calls without a context deadline get
// DefaultCallTimeout, and logs go nowhere.
type Config struct {
	// Logger receives the System's logs and protoactor-go's own (through slog). Default: no-op.
	Logger *zap.Logger
	// DefaultCallTimeout bounds calls whose context has no deadline, so that nothing waits
	// forever. Default 30 s.
	DefaultCallTimeout time.Duration
}

// DefaultCallTimeout is used when Config.DefaultCallTimeout is zero.
const DefaultCallTimeout = 30 * time.Second

// System owns one protoactor-go ActorSystem, the registry of actor kinds and the jobs.
// All methods are safe for concurrent use.
type System struct {
	sys     *actor.ActorSystem
	log     *zap.Logger
	timeout time.Duration

	mu    sync.RWMutex
	kinds map[string]Producer
	jobs  map[string]*Job
	down  bool
}

// NewSystem starts an actor system.
func NewSystem(cfg Config) (*System, error) {
	if cfg.DefaultCallTimeout < 0 {
		return nil, fmt.Errorf("actors: DefaultCallTimeout %v is negative", cfg.DefaultCallTimeout)
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
	handler := zapslog.NewHandler(log.Named("protoactor").Core())
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(handler)
	}))
	return &System{
		sys:     sys,
		log:     log,
		timeout: timeout,
		kinds:   map[string]Producer{},
		jobs:    map[string]*Job{},
	}, nil
}

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

func (s *System) producer(kind string) (Producer, error) {
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
	p, err := s.producer(kind)
	if err != nil {
		return Ref{}, err
	}
	props := actor.PropsFromProducer(func() actor.Actor { return newCell(s, p, nil, -1) })
	if name == "" {
		return Ref{pid: s.sys.Root.Spawn(props), kind: kind}, nil
	}
	pid, err := s.sys.Root.SpawnNamed(props, name)
	if err != nil {
		return Ref{}, fmt.Errorf("actors: spawn %q of kind %q: %w", name, kind, err)
	}
	return Ref{pid: pid, kind: kind}, nil
}

// Stop stops an actor and waits until it has stopped or ctx ends.
func (s *System) Stop(ctx context.Context, r Ref) error {
	if r.pid == nil {
		return fmt.Errorf("%w: empty ref", ErrUnknownActor)
	}
	f := s.sys.Root.StopFuture(r.pid)
	return waitFuture(ctx, f)
}

// Lookup resolves an actor by its id (Ref.ID) on this system.
func (s *System) Lookup(id string) (Ref, error) {
	if _, ok := s.sys.ProcessRegistry.GetLocal(id); !ok {
		return Ref{}, fmt.Errorf("%w: %q", ErrUnknownActor, id)
	}
	return Ref{pid: actor.NewPID(s.sys.Address(), id)}, nil
}

// Logger is the System's logger.
func (s *System) Logger() *zap.Logger { return s.log }

// Shutdown stops every job and the actor system. It is idempotent.
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
