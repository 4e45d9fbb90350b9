package sdk

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/atoll-run/atoll/actors"
	"github.com/atoll-run/atoll/runtime"
)

// Cluster is a handle on an Atoll cluster. All methods are safe for concurrent use.
type Cluster struct {
	local *runtime.Local
	log   *zap.Logger
}

// Option configures Local.
type Option func(*runtime.Config) error

// WithLogger sends the cluster's logs to log.
func WithLogger(log *zap.Logger) Option {
	return func(c *runtime.Config) error { c.Logger = log; return nil }
}

// WithCluster uses the given machines instead of the embedded default.
func WithCluster(cl *runtime.Cluster) Option {
	return func(c *runtime.Config) error {
		if cl == nil {
			return fmt.Errorf("sdk: WithCluster(nil)")
		}
		if err := cl.Validate(); err != nil {
			return fmt.Errorf("sdk: WithCluster: %w", err)
		}
		c.Cluster = cl
		return nil
	}
}

// WithSpec builds the cluster's simulated machines from a topology spec: a built-in machine
// name ("dgx-h100"), a shorthand ("4xdgx-h100", "16xdgx-a100/4") or a spec file. A malformed
// spec is an error naming the file and line.
func WithSpec(spec string) Option {
	return func(c *runtime.Config) error {
		cl, err := runtime.LoadCluster(spec)
		if err != nil {
			return fmt.Errorf("sdk: WithSpec(%q): %w", spec, err)
		}
		c.Cluster = cl
		return nil
	}
}

// WithPlacer places gangs with p instead of the default placer.
func WithPlacer(p runtime.Placer) Option {
	return func(c *runtime.Config) error { c.Placer = p; return nil }
}

// WithCallTimeout bounds calls whose context has no deadline (default 30 s).
func WithCallTimeout(d time.Duration) Option {
	return func(c *runtime.Config) error {
		if d <= 0 {
			return fmt.Errorf("sdk: WithCallTimeout(%v): want a positive duration", d)
		}
		c.CallTimeout = d
		return nil
	}
}

// Local starts an embedded cluster in this process: a head and one agent per machine. By
// default the machines are four simulated DGX H100s (runtime.DefaultClusterSpec), each one
// NVLink island of 8;
// simulated GPUs are declared as such (Machine.Simulated), never claimed as hardware.
func Local(ctx context.Context, opts ...Option) (*Cluster, error) {
	cfg := runtime.DefaultConfig()
	for _, o := range opts {
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	l, err := runtime.StartLocal(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return &Cluster{local: l, log: cfg.Logger.Named("sdk")}, nil
}

// Shutdown stops every job and the cluster.
func (c *Cluster) Shutdown(ctx context.Context) error { return c.local.Shutdown(ctx) }

// Machines describes the cluster's machines.
func (c *Cluster) Machines() []runtime.Machine { return c.local.Head.Cluster().Machines }

// Topology is the head's picture of the cluster (machines, GPUs, islands).
func (c *Cluster) Topology() *runtime.Cluster { return c.local.Head.Cluster() }

// FreeGPUs counts GPUs not held by any gang.
func (c *Cluster) FreeGPUs() int { return c.local.Head.FreeGPUs() }

// Runtime exposes the embedded runtime, for tools and tests.
func (c *Cluster) Runtime() *runtime.Local { return c.local }

// Register adds an actor kind. newActor is called for every incarnation of an actor of that
// kind (again after each restart).
func (c *Cluster) Register(kind string, newActor func() Actor) error {
	if newActor == nil {
		return fmt.Errorf("sdk: Register(%q): nil constructor", kind)
	}
	return c.local.Actors.Register(kind, func() actors.Handler {
		return &cell{user: newActor(), cluster: c}
	})
}

// Spawn starts one standalone actor of a registered kind on the driver's machine.
func (c *Cluster) Spawn(kind, name string) (ActorRef, error) {
	r, err := c.local.Actors.Spawn(kind, name)
	return ActorRef{ref: r}, err
}

// Actor resolves an actor by id (ActorRef.ID).
func (c *Cluster) Actor(id string) (ActorRef, error) {
	r, err := c.local.Actors.Lookup(id)
	return ActorRef{ref: r}, err
}

// JobSpec describes a job.
type JobSpec struct {
	// Name is unique in the cluster.
	Name string
}

// Submit creates a job: the root of an actor tree that gangs hang off.
func (c *Cluster) Submit(ctx context.Context, spec JobSpec) (*Job, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	j, err := c.local.Actors.NewJob(spec.Name)
	if err != nil {
		return nil, err
	}
	if err := c.local.Head.CommitJob(ctx, runtime.JobRecord{Name: spec.Name, Submitted: time.Now(), State: "running"}); err != nil {
		_ = j.Stop(ctx)
		return nil, err
	}
	return &Job{c: c, j: j, spec: spec, submitted: time.Now()}, nil
}
