package actors

import (
	"errors"
	"fmt"

	"github.com/asynkron/protoactor-go/actor"
	"go.uber.org/zap"
)

// Handler is what an actor kind implements. Receive is called one message at a time; what it
// returns is the reply to a Call (ignored for Send). A panic fails the actor: its supervisor
// restarts it (in a gang, the whole gang), and the pending call gets ErrActorFailed.
type Handler interface {
	Receive(c *Context, msg any) (reply any, err error)
}

// Starter is implemented by handlers that set up state when their actor starts, including
// after a restart (for example, restoring a checkpoint). An error fails the actor.
type Starter interface {
	Started(c *Context) error
}

// Stopper is implemented by handlers that release resources when their actor stops.
type Stopper interface {
	Stopped(c *Context)
}

// ErrActorFailed is returned to a caller whose call made the actor fail (panic).
var ErrActorFailed = errors.New("actors: actor failed while handling the call")

// crash is the message InjectFailure sends: the cell panics on it, as a crashing worker would.
type crash struct{ reason string }

// Context is what a Handler sees of its actor: its address, its place in a gang, its logger.
// It is valid only inside the Handler's methods.
type Context struct {
	sys  *System
	self Ref
	gang *Gang
	rank int
	log  *zap.Logger
}

// Self is the actor's own Ref.
func (c *Context) Self() Ref { return c.self }

// System is the actor system the actor lives on.
func (c *Context) System() *System { return c.sys }

// Gang is the actor's gang, or nil for a standalone actor.
func (c *Context) Gang() *Gang { return c.gang }

// Rank is the actor's index in its gang (0..size-1), or -1 for a standalone actor.
func (c *Context) Rank() int { return c.rank }

// Logger is the actor's logger, named after its id.
func (c *Context) Logger() *zap.Logger { return c.log }

// cell adapts a Handler to protoactor's Actor.
type cell struct {
	sys     *System
	h       Handler
	gang    *Gang
	rank    int
	ctx     Context
	started bool
	counted bool // counted in the gang's live workers
}

func newCell(s *System, p Producer, g *Gang, rank int) *cell {
	return &cell{sys: s, h: p(), gang: g, rank: rank}
}

func (c *cell) Receive(pc actor.Context) {
	switch m := pc.Message().(type) {
	case *actor.Started:
		if c.gang != nil && !c.counted {
			c.counted = true
			c.gang.workerAlive(+1)
		}
		c.ctx = Context{sys: c.sys, self: Ref{pid: pc.Self()}, gang: c.gang, rank: c.rank,
			log: c.sys.log.With(zap.String("actor", pc.Self().Id))}
		if s, ok := c.h.(Starter); ok {
			if err := s.Started(&c.ctx); err != nil {
				panic(fmt.Errorf("actors: %s failed to start: %w", pc.Self().Id, err))
			}
		}
		c.started = true
		if c.gang != nil {
			c.gang.workerStarted(c.rank)
		}
	case *actor.Stopping, *actor.Restarting:
		if st, ok := c.h.(Stopper); ok && c.started {
			c.started = false
			st.Stopped(&c.ctx)
		}
		if _, restarting := m.(*actor.Restarting); restarting && c.gang != nil && c.counted {
			c.counted = false // this incarnation ends; the next one counts itself at Started
			c.gang.workerAlive(-1)
		}
	case *actor.Stopped:
		if c.gang != nil && c.counted {
			c.counted = false
			c.gang.workerAlive(-1)
		}
	case *request:
		c.handleRequest(pc, m)
	case *crash:
		panic(fmt.Errorf("injected failure: %s", m.reason))
	case actor.SystemMessage, actor.AutoReceiveMessage:
	default:
		if _, err := c.h.Receive(&c.ctx, m); err != nil {
			c.ctx.log.Debug("message failed", zap.Error(err))
		}
	}
}

func (c *cell) handleRequest(pc actor.Context, m *request) {
	sender := pc.Sender()
	defer func() {
		if r := recover(); r != nil {
			if sender != nil {
				pc.Send(sender, &response{err: fmt.Errorf("%w: %v", ErrActorFailed, r)})
			}
			panic(r) // let supervision handle it
		}
	}()
	v, err := c.h.Receive(&c.ctx, m.msg)
	if sender != nil {
		pc.Send(sender, &response{val: v, err: err})
	}
}
