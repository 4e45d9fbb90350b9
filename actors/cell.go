package actors

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"go.uber.org/zap"

	"github.com/atoll-run/atoll/proto/actorspb"
)

// Handler is what an actor kind implements. Receive is called one message at a time with
// the call's context (the caller's deadline; cancelled when the caller gives up, even from
// another process); what it returns is the reply to a Call (ignored for Send). A panic fails
// the actor: the pending call gets ErrActorFailed and the actor's group reports the failure.
type Handler interface {
	Receive(c *Context, msg any) (reply any, err error)
}

// Starter is implemented by handlers that set up state when their actor starts (for
// example, restoring a checkpoint). An error fails the actor.
type Starter interface {
	Started(c *Context) error
}

// Stopper is implemented by handlers that release resources when their actor stops.
type Stopper interface {
	Stopped(c *Context)
}

// crash is the message InjectFailure sends: the cell panics on it, as a crashing worker
// would. It never leaves the process.
type crash struct{ reason string }

// Context is what a Handler sees of its actor: its address, its place in a group, its
// logger, and the context of the message being handled. It is valid only inside the
// Handler's methods.
type Context struct {
	sys   *System
	self  Ref
	group *Group
	index int
	log   *zap.Logger
	ctx   context.Context
	pend  *pending
}

// Waiting counts the calls in the actor's mailbox that its handler has not taken yet (not
// the one it runs). Safe to call from any goroutine while the actor lives.
func (c *Context) Waiting() int {
	if c.pend == nil {
		return 0
	}
	c.pend.mu.Lock()
	defer c.pend.mu.Unlock()
	return len(c.pend.m)
}

// Self is the actor's own Ref.
func (c *Context) Self() Ref { return c.self }

// System is the actor system the actor lives on.
func (c *Context) System() *System { return c.sys }

// Group is the actor's group, or nil for a standalone actor.
func (c *Context) Group() *Group { return c.group }

// Index is the actor's index in its group, or -1 for a standalone actor.
func (c *Context) Index() int { return c.index }

// Logger is the actor's logger, named after its id.
func (c *Context) Logger() *zap.Logger { return c.log }

// Context is the context of the message being handled: the caller's deadline and
// cancellation for a call, a background context otherwise (Started, Send).
func (c *Context) Context() context.Context {
	if c.ctx == nil {
		return context.Background()
	}
	return c.ctx
}

// pending are the calls in an actor's mailbox that its handler has not taken yet. It is the
// mailbox's middleware: when the actor stops (after a failure, or asked to), it answers
// them with ErrNotDelivered, which protoactor would drop unanswered (the callers would wait
// for their deadlines, not knowing the handler never ran).
type pending struct {
	mu sync.Mutex
	m  map[*actorspb.Request]*actor.PID // the request and its reply address
}

func (p *pending) MailboxStarted() {}
func (p *pending) MailboxEmpty()   {}
func (p *pending) MessagePosted(message any) {
	_, msg, sender := actor.UnwrapEnvelope(message)
	if req, ok := msg.(*actorspb.Request); ok && sender != nil {
		p.mu.Lock()
		p.m[req] = sender
		p.mu.Unlock()
	}
}
func (p *pending) MessageReceived(message any) {
	_, msg, _ := actor.UnwrapEnvelope(message)
	if req, ok := msg.(*actorspb.Request); ok {
		p.take(req)
	}
}

func (p *pending) take(req *actorspb.Request) {
	p.mu.Lock()
	delete(p.m, req)
	p.mu.Unlock()
}

// refuseAll answers every call still waiting: the actor stopped before it took them.
func (p *pending) refuseAll(s *System, self *actor.PID) {
	p.mu.Lock()
	m := p.m
	p.m = map[*actorspb.Request]*actor.PID{}
	p.mu.Unlock()
	for req, sender := range m {
		err := s.errorToWire(fmt.Errorf("actor %s stopped before it took the call: %w", self.Id, ErrNotDelivered))
		s.noteAnswered(sender.Address)
		s.sys.Root.Send(sender, &actorspb.Reply{CallId: req.CallId, Error: err})
	}
}

// cellProps are the props of an actor of handler p: a cell, and a mailbox that keeps its
// pending calls.
func cellProps(s *System, p Producer, g *Group, index int, name string) *actor.Props {
	pend := &pending{m: map[*actorspb.Request]*actor.PID{}}
	return actor.PropsFromProducer(func() actor.Actor {
		c := newCell(s, p, g, index, name)
		c.pending = pend
		return c
	}, actor.WithMailbox(actor.Unbounded(pend)))
}

// cell adapts a Handler to protoactor's Actor.
type cell struct {
	pending *pending
	kills   killSwitch
	sys     *System
	h       Handler
	group   *Group
	index   int
	name    string
	ctx     Context
	started bool
}

func newCell(s *System, p Producer, g *Group, index int, name string) *cell {
	c := &cell{sys: s, h: p(), group: g, index: index, name: name}
	if g != nil {
		g.setCell(name, c)
	}
	return c
}

// killSwitch fails an actor from outside, as its process dying would: the call it runs
// has its context cancelled, and the actor fails as soon as its handler returns (a crash
// message alone would wait in the mailbox behind the running call).
type killSwitch struct {
	mu     sync.Mutex
	cancel context.CancelCauseFunc // the running call's, or nil
	reason string                  // why it was killed; "" while it was not
}

// kill ends the running call's context and marks the actor killed.
func (k *killSwitch) kill(reason string) {
	k.mu.Lock()
	if k.reason == "" {
		k.reason = reason
	}
	cancel := k.cancel
	k.mu.Unlock()
	if cancel != nil {
		cancel(fmt.Errorf("actors: the actor was killed: %s", reason))
	}
}

// running sets the running call's cancel (nil when none runs) and says whether the actor
// was killed.
func (k *killSwitch) running(cancel context.CancelCauseFunc) (killed string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.cancel = cancel
	return k.reason
}

func (c *cell) Receive(pc actor.Context) {
	switch m := pc.Message().(type) {
	case *actor.Started:
		c.ctx = Context{sys: c.sys, self: Ref{pid: pc.Self()}, group: c.group, index: c.index,
			log: c.sys.log.With(zap.String("actor", pc.Self().Id)), pend: c.pending}
		if s, ok := c.h.(Starter); ok {
			if err := s.Started(&c.ctx); err != nil {
				panic(fmt.Errorf("actors: %s failed to start: %w", pc.Self().Id, err))
			}
		}
		c.started = true
		if c.group != nil {
			c.group.memberStarted(c.name)
		}
	case *actor.Stopped:
		c.pending.refuseAll(c.sys, pc.Self())
	case *actor.Stopping, *actor.Restarting:
		if st, ok := c.h.(Stopper); ok && c.started {
			c.started = false
			st.Stopped(&c.ctx)
		}
	case *actorspb.Request:
		c.handleRequest(pc, m)
	case *actorspb.Tell:
		msg, err := c.sys.codec.Decode(m.Body)
		if err != nil {
			c.ctx.log.Warn("message dropped", zap.Error(err))
			return
		}
		c.ctx.ctx = context.Background()
		if _, err := c.h.Receive(&c.ctx, msg); err != nil {
			c.ctx.log.Debug("message failed", zap.Error(err))
		}
	case *crash:
		panic(fmt.Errorf("injected failure: %s", m.reason))
	case actor.SystemMessage, actor.AutoReceiveMessage:
	default:
		c.ctx.log.Warn("message of a foreign type dropped", zap.String("type", fmt.Sprintf("%T", m)))
	}
}

func (c *cell) handleRequest(pc actor.Context, m *actorspb.Request) {
	sender := pc.Sender()
	reply := func(r *actorspb.Reply) {
		if sender != nil {
			c.sys.noteAnswered(sender.Address)
			r.CallId = m.CallId
			pc.Send(sender, r)
		}
	}
	if reason := c.kills.running(nil); reason != "" {
		// Killed before it took the call: it fails now (the call stays pending, answered
		// ErrNotDelivered when the actor stops).
		panic(fmt.Errorf("killed: %s", reason))
	}
	c.pending.take(m)
	msg, err := c.sys.codec.Decode(m.Body)
	if err != nil {
		reply(&actorspb.Reply{Error: c.sys.errorToWire(fmt.Errorf("actor %s: request: %w", pc.Self().Id, err))})
		return
	}
	var ctx context.Context
	var cancel context.CancelCauseFunc
	if m.DeadlineUnixNano != 0 {
		dctx, dcancel := context.WithDeadline(context.Background(), time.Unix(0, m.DeadlineUnixNano))
		ctx, cancel = context.WithCancelCause(dctx)
		defer dcancel()
	} else {
		ctx, cancel = context.WithCancelCause(context.Background())
	}
	if m.Caller != "" {
		c.sys.calls.add(m.Caller, cancel)
		defer c.sys.calls.remove(m.Caller)
	}
	defer cancel(nil)
	defer func() {
		if r := recover(); r != nil {
			reply(&actorspb.Reply{Error: c.sys.errorToWire(fmt.Errorf("%w: %v", ErrActorFailed, r)), Failed: true})
			panic(r) // let supervision handle it
		}
	}()
	c.ctx.ctx = ctx
	c.kills.running(cancel)
	v, err := c.h.Receive(&c.ctx, msg)
	c.ctx.ctx = nil
	if reason := c.kills.running(nil); reason != "" {
		panic(fmt.Errorf("killed: %s", reason)) // answered ErrActorFailed, as a panic is
	}
	if err != nil {
		reply(&actorspb.Reply{Error: c.sys.errorToWire(err)})
		return
	}
	body, err := c.sys.codec.Encode(v)
	if err != nil {
		reply(&actorspb.Reply{Error: c.sys.errorToWire(fmt.Errorf("actor %s: reply: %w", pc.Self().Id, err))})
		return
	}
	reply(&actorspb.Reply{Body: body})
}
