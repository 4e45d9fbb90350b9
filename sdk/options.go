package sdk

import (
	"fmt"
	"os"
	"time"

	"go.uber.org/zap"

	"github.com/atoll-run/atoll/actors"
	"github.com/atoll-run/atoll/internal/codec"
	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/sdk/internal/embed"
	"github.com/atoll-run/atoll/topology"
)

// Option configures Start, Local and Connect.
type Option func(*settings) error

type settings struct {
	log         *zap.Logger
	logSet      bool
	kinds       map[string]*kindDef
	codec       *codec.Codec
	errors      *actors.Errors
	spec        string
	topo        *topology.Cluster
	callTimeout time.Duration
	address     string
	tokenFile   string
	token       []byte
	dataDir     string
	objectCap   int64
	advertise   string
	env         []string
	noBinary    bool
	tasks       map[string]*taskEntry
	taskIdle    time.Duration
	embed       embed.Starter
}

func defaults() settings {
	c := codec.New()
	_ = c.Register(checkpointReq{})
	_ = c.Register(worldReq{})
	s := settings{log: zap.NewNop(), kinds: map[string]*kindDef{}, codec: c, errors: actors.NewErrors(), callTimeout: 30 * time.Second,
		tasks: map[string]*taskEntry{}, taskIdle: 5 * time.Second}
	s.kinds[taskKind] = &kindDef{name: taskKind, make: func(*api.Payload) (Actor, error) { return taskRunner{}, nil }}
	return s
}

// kindDef is a registered actor kind: how to make its actors from encoded arguments.
type kindDef struct {
	name string
	make func(args *api.Payload) (Actor, error)
}

// Kind registers an actor kind. newActor makes a fresh actor for every incarnation (again
// after each restart). messages are the types of the messages the kind receives (a value
// of each): a worker in another process must know them to decode them, so a message type
// that was not registered is refused, by name, where it arrives — in the embedded default
// too. Replies need no registration (the caller names their type).
//
// Kinds are given to Start, Local or Connect, before the cluster starts, because a worker
// process runs this same program and must know its kinds before it serves them.
func Kind(name string, newActor func() Actor, messages ...any) Option {
	return KindOf(name, func(struct{}) Actor { return newActor() }, messages...)
}

// KindOf registers an actor kind whose actors take constructor arguments of type A: a
// gang's GangSpec.Args (or a spawned actor's). The runtime keeps them, encoded, and gives
// them again to every incarnation, so a restarted worker starts from the same inputs.
func KindOf[A any](name string, newActor func(args A) Actor, messages ...any) Option {
	return func(s *settings) error {
		if name == "" || newActor == nil {
			return fmt.Errorf("sdk: Kind(%q): a kind needs a name and a constructor", name)
		}
		if _, dup := s.kinds[name]; dup {
			return fmt.Errorf("sdk: Kind(%q) registered twice", name)
		}
		var zero A
		if err := s.codec.Register(zero); err != nil {
			return fmt.Errorf("sdk: Kind(%q) arguments: %w", name, err)
		}
		for _, m := range messages {
			if err := s.codec.Register(m); err != nil {
				return fmt.Errorf("sdk: Kind(%q) message %T: %w", name, m, err)
			}
		}
		s.kinds[name] = &kindDef{name: name, make: func(p *api.Payload) (Actor, error) {
			var args A
			if p != nil {
				if err := decodePayload(p, &args); err != nil {
					return nil, fmt.Errorf("sdk: kind %q arguments: %w", name, err)
				}
			}
			return newActor(args), nil
		}}
		return nil
	}
}

// Messages registers more message types (values of them) that actors of this program
// receive.
func Messages(values ...any) Option {
	return func(s *settings) error {
		for _, v := range values {
			if err := s.codec.Register(v); err != nil {
				return fmt.Errorf("sdk: Messages(%T): %w", v, err)
			}
		}
		return nil
	}
}

// Errors registers the program's own sentinel errors (package-level variables, as
// ErrQuota = errors.New("quota exceeded")), so that they keep their identity across
// processes: when a task's function or an actor's Receive returns an error that wraps one,
// errors.Is finds that same sentinel in the error its caller gets, wherever it ran. An
// unregistered error crosses as its text only. A sentinel crosses by its text: two
// registered sentinels must read differently. Give the same errors to the driver and the
// workers (the same options, as for Kind and Tasks).
func Errors(sentinels ...error) Option {
	return func(s *settings) error {
		for _, e := range sentinels {
			if err := s.errors.AddSentinel(e); err != nil {
				return fmt.Errorf("sdk: Errors: %w", err)
			}
		}
		return nil
	}
}

// ErrorTypes registers the program's own error types, by a value of each (a zero value
// will do: &QuotaError{} for the type *QuotaError), so that their values keep their type
// and fields across processes: errors.As finds a copy of the value a task's function or an
// actor's Receive wrapped in the error its caller gets. The types must cross processes as
// messages do (exported fields; see Put).
func ErrorTypes(values ...error) Option {
	return func(s *settings) error {
		for _, v := range values {
			if err := s.errors.AddType(s.codec, v); err != nil {
				return fmt.Errorf("sdk: ErrorTypes(%T): %w", v, err)
			}
		}
		return nil
	}
}

// WithLogger sends the cluster's logs to log.
func WithLogger(log *zap.Logger) Option {
	return func(s *settings) error {
		if log == nil {
			return fmt.Errorf("sdk: WithLogger(nil)")
		}
		s.log, s.logSet = log, true
		return nil
	}
}

// WithSpec builds the embedded cluster's simulated machines from a topology spec: a
// built-in machine name ("dgx-h100"), a shorthand ("4xdgx-h100", "16xdgx-a100/4") or a
// spec file. A malformed spec is an error naming the file and line. Local only.
func WithSpec(spec string) Option {
	return func(s *settings) error {
		tc, err := topology.Load(spec)
		if err != nil {
			return fmt.Errorf("sdk: WithSpec(%q): %w", spec, err)
		}
		s.spec, s.topo = spec, tc
		return nil
	}
}

// WithTopology uses the given machines (declared, simulated) for the embedded cluster.
func WithTopology(tc *topology.Cluster) Option {
	return func(s *settings) error {
		if tc == nil || len(tc.Machines) == 0 {
			return fmt.Errorf("sdk: WithTopology: no machines")
		}
		s.topo = tc
		return nil
	}
}

// WithCallTimeout bounds calls whose context has no deadline (default 30 s).
func WithCallTimeout(d time.Duration) Option {
	return func(s *settings) error {
		if d <= 0 {
			return fmt.Errorf("sdk: WithCallTimeout(%v): want a positive duration", d)
		}
		s.callTimeout = d
		return nil
	}
}

// WithObjectStore sizes each machine's object store (shared-memory tier) of the embedded
// cluster, or the driver's own store on a cluster. Default: DefaultObjectStore (1 GiB) each.
func WithObjectStore(bytes int64) Option {
	return func(s *settings) error {
		if bytes <= 0 {
			return fmt.Errorf("sdk: WithObjectStore(%d): want a positive size", bytes)
		}
		s.objectCap = bytes
		return nil
	}
}

// WithTaskIdle is how long a task worker waits idle for the next task before it stops and
// frees its resources (default 5 s).
func WithTaskIdle(d time.Duration) Option {
	return func(s *settings) error {
		if d <= 0 {
			return fmt.Errorf("sdk: WithTaskIdle(%v): want a positive duration", d)
		}
		s.taskIdle = d
		return nil
	}
}

// WithDataDir keeps the embedded cluster's state (its heads' write-ahead logs, the machines'
// spill files) in dir instead of a temporary directory removed at Shutdown.
func WithDataDir(dir string) Option {
	return func(s *settings) error { s.dataDir = dir; return nil }
}

// WithAddress connects to the cluster at address (heads' URLs, comma-separated, as
// `atoll address` prints) instead of starting one; ATOLL_ADDRESS does the same.
func WithAddress(address string) Option {
	return func(s *settings) error { s.address = address; return nil }
}

// WithTokenFile reads the cluster token from a file (mode 0600). Default: ATOLL_TOKEN_FILE,
// or the token file beside a cluster directory named by the address.
func WithTokenFile(path string) Option {
	return func(s *settings) error { s.tokenFile = path; return nil }
}

// WithAdvertise is the host (IP or name) the agents and workers of a cluster use to reach
// this driver (its objects and its actors). Default 127.0.0.1 (a cluster on this machine).
func WithAdvertise(host string) Option {
	return func(s *settings) error { s.advertise = host; return nil }
}

// WithEnv passes environment variables ("NAME=value") of the driver to its job's worker
// processes. Never pass secrets this way: they would be stored in the metadata log.
func WithEnv(vars ...string) Option {
	return func(s *settings) error {
		for _, v := range vars {
			if _, _, ok := cut(v, '='); !ok {
				return fmt.Errorf("sdk: WithEnv(%q): want NAME=value", v)
			}
		}
		s.env = append(s.env, vars...)
		return nil
	}
}

func cut(s string, c byte) (string, string, bool) {
	for i := 0; i < len(s); i++ {
		if s[i] == c {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

// envAddress is the address a program connects to when it is given none.
func envAddress() string { return os.Getenv("ATOLL_ADDRESS") }
