package sdk

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"go.uber.org/zap"

	"github.com/atoll-run/atoll/actors"
	"github.com/atoll-run/atoll/runtime"
)

// Errors of the SDK, beside those of packages actors and runtime (which it returns wrapped).
var (
	// ErrNotInGang: a gang-only operation (AllReduce) on a standalone actor.
	ErrNotInGang = errors.New("sdk: actor is not in a gang")
	// ErrStale: the worker's gang incarnation has ended (a member failed); the call is from a
	// worker that is about to restart.
	ErrStale = errors.New("sdk: gang incarnation ended")
)

// Actor is what an actor kind implements. Receive handles one message at a time; its return
// values answer a Call. A panic fails the actor; in a gang every worker restarts together.
type Actor interface {
	Receive(ctx *Context, msg any) (any, error)
}

// Checkpointer is implemented by workers whose state survives restarts: Checkpoint returns
// the state to save (Gang.Checkpoint saves every worker's as one committed checkpoint), and
// Restore is called with that state, at (re)start, when the gang has a checkpoint.
type Checkpointer interface {
	Checkpoint() ([]byte, error)
	Restore(state []byte) error
}

// Starter is implemented by actors that set up state when they start (after Restore).
type Starter interface {
	Start(ctx *Context) error
}

// ActorRef addresses an actor.
type ActorRef struct{ ref actors.Ref }

// ID is the actor's id, usable with Cluster.Actor.
func (r ActorRef) ID() string { return r.ref.ID() }

// String is a printable address.
func (r ActorRef) String() string { return r.ref.String() }

// Call sends req to the actor and waits for its reply of type Resp within ctx. It fails fast
// when the actor is dead (actors.ErrActorDead) or unknown (actors.ErrUnknownActor).
func Call[Resp any](ctx context.Context, c *Cluster, to ActorRef, req any) (Resp, error) {
	return actors.Call[Resp](ctx, c.local.Actors, to.ref, req)
}

// Future is a reply in flight.
type Future[Resp any] struct{ f *actors.Future[Resp] }

// Await waits for the reply within ctx.
func (f Future[Resp]) Await(ctx context.Context) (Resp, error) { return f.f.Await(ctx) }

// CallAsync sends req and returns at once with a Future for the reply.
func CallAsync[Resp any](c *Cluster, to ActorRef, req any) Future[Resp] {
	return Future[Resp]{f: actors.CallAsync[Resp](c.local.Actors, to.ref, req)}
}

// Context is what an actor sees while it handles a message. It is valid only inside the
// actor's methods.
type Context struct {
	ac      *actors.Context
	cluster *Cluster
	env     *gangEnv // nil for a standalone actor
	gen     int
	restore int64 // step of the checkpoint restored at start, -1 if none
}

// Rank is the worker's rank in its gang (0..Size-1), or -1 for a standalone actor.
func (c *Context) Rank() int { return c.ac.Rank() }

// Size is the gang's size (1 for a standalone actor).
func (c *Context) Size() int {
	if c.env == nil {
		return 1
	}
	return c.env.size
}

// Self is the actor's own address.
func (c *Context) Self() ActorRef { return ActorRef{ref: c.ac.Self()} }

// Logger is the actor's logger.
func (c *Context) Logger() *zap.Logger { return c.ac.Logger() }

// Generation is the gang incarnation this worker belongs to (0, then +1 per restart).
func (c *Context) Generation() int { return c.gen }

// RestoredStep is the step of the checkpoint this worker was restored from, and whether it
// was restored at all.
func (c *Context) RestoredStep() (int64, bool) { return c.restore, c.restore >= 0 }

// Placement is where this worker runs: its machine and its GPUs (simulated in the embedded
// default). A standalone actor runs on the driver's machine with no GPU.
func (c *Context) Placement() runtime.MemberPlacement {
	if c.env == nil {
		return runtime.MemberPlacement{Machine: 0, MachineName: c.cluster.Machines()[0].Name}
	}
	return c.env.placement.Members[c.Rank()]
}

// AllReduce sums data element-wise across every worker of the gang, in place, with a ring
// whose chunks move through the machines' object stores (shared memory on one machine, the
// transfer plane between machines). Every worker
// must call it with a slice of the same length. It fails with ErrStale when a gang member has
// failed (the gang is restarting), and honours ctx.
func (c *Context) AllReduce(ctx context.Context, data []float32) error {
	if c.env == nil {
		return ErrNotInGang
	}
	ring, err := c.env.ring(c.gen)
	if err != nil {
		return err
	}
	if err := ring.AllReduce(ctx, c.Rank(), data); err != nil {
		if errors.Is(err, runtime.ErrAborted) {
			return fmt.Errorf("%w: %w", ErrStale, err)
		}
		return err
	}
	return nil
}

func (c *Context) host() (*runtime.Local, int, string) {
	return c.cluster.local, c.Placement().Machine, c.ac.Self().ID()
}

// gangEnv is what the workers of one gang share.
type gangEnv struct {
	local     *runtime.Local
	job, gang string
	size      int
	placement runtime.Placement

	mu    sync.Mutex
	rings map[int]*runtime.Ring // by generation
	dead  int                   // generations below this are over
}

func (e *gangEnv) ring(gen int) (*runtime.Ring, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if gen < e.dead {
		return nil, fmt.Errorf("%w: generation %d", ErrStale, gen)
	}
	r, ok := e.rings[gen]
	if !ok {
		machines := make([]int, e.size)
		for i, m := range e.placement.Members {
			machines[i] = m.Machine
		}
		r = runtime.NewRingOver(e.size, e.local.RingPlane(fmt.Sprintf("%s/%s/%d", e.job, e.gang, gen), machines))
		e.rings[gen] = r
	}
	return r, nil
}

// endGeneration aborts every ring of generations before next.
func (e *gangEnv) endGeneration(next int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for g, r := range e.rings {
		if g < next {
			r.Abort()
			delete(e.rings, g)
		}
	}
	e.dead = max(e.dead, next)
}

// checkpointReq asks a worker for its state.
type checkpointReq struct{ step int64 }

// cell adapts a user Actor to actors.Handler.
type cell struct {
	user    Actor
	cluster *Cluster
	ctx     Context
}

func (w *cell) Started(ac *actors.Context) error {
	w.ctx = Context{ac: ac, cluster: w.cluster, restore: -1}
	if g := ac.Gang(); g != nil {
		w.ctx.env, _ = g.Data().(*gangEnv)
		w.ctx.gen = g.Generation()
	}
	if cp, ok := w.user.(Checkpointer); ok && w.ctx.env != nil {
		if err := w.restore(cp); err != nil {
			return err
		}
	}
	if s, ok := w.user.(Starter); ok {
		return s.Start(&w.ctx)
	}
	return nil
}

func (w *cell) restore(cp Checkpointer) error {
	env := w.ctx.env
	ctx := context.Background()
	m, ok, err := w.cluster.local.LatestCheckpoint(ctx, env.job, env.gang)
	if err != nil || !ok {
		return err
	}
	rank := w.ctx.Rank()
	if rank >= len(m.Objects) {
		return fmt.Errorf("sdk: checkpoint at step %d has %d parts, rank %d has none", m.Step, len(m.Objects), rank)
	}
	view, release, err := w.cluster.local.GetObject(ctx, w.ctx.Placement().Machine, m.Objects[rank])
	if err != nil {
		return fmt.Errorf("sdk: restore rank %d from step %d: %w", rank, m.Step, err)
	}
	defer release()
	if err := cp.Restore(view); err != nil {
		return fmt.Errorf("sdk: restore rank %d from step %d: %w", rank, m.Step, err)
	}
	w.ctx.restore = m.Step
	w.ctx.Logger().Info("restored from checkpoint", zap.Int64("step", m.Step))
	return nil
}

func (w *cell) Receive(_ *actors.Context, msg any) (any, error) {
	if req, ok := msg.(checkpointReq); ok {
		cp, ok := w.user.(Checkpointer)
		if !ok {
			return nil, fmt.Errorf("sdk: actor %T does not implement Checkpointer", w.user)
		}
		state, err := cp.Checkpoint()
		if err != nil {
			return nil, fmt.Errorf("sdk: checkpoint at step %d: %w", req.step, err)
		}
		l, machine, owner := w.ctx.host()
		return l.PutObject(context.Background(), machine, owner, state)
	}
	return w.user.Receive(&w.ctx, msg)
}
