package actors

import (
	"context"
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

// Ref addresses one actor. The zero Ref addresses nothing; calls to it fail with
// ErrUnknownActor. Refs are small values, safe to copy and share.
type Ref struct {
	pid  *actor.PID
	kind string
}

// ID is the actor's id on its system (for example "job-7/gang-train/w3").
func (r Ref) ID() string {
	if r.pid == nil {
		return ""
	}
	return r.pid.Id
}

// Kind is the actor's kind name when known.
func (r Ref) Kind() string { return r.kind }

// IsZero reports whether r addresses nothing.
func (r Ref) IsZero() bool { return r.pid == nil }

func (r Ref) String() string {
	if r.pid == nil {
		return "<nil actor>"
	}
	return r.pid.Address + "/" + r.pid.Id
}

// request is the envelope of a call; response is its answer.
type request struct{ msg any }

type response struct {
	val any
	err error
}

// replyProcess receives one response into a channel. It is registered in protoactor's process
// registry for the life of one call, so a reply (or a dead-letter notice) reaches the caller
// without a goroutine per call.
type replyProcess struct{ ch chan response }

func (p *replyProcess) SendUserMessage(_ *actor.PID, message any) {
	_, msg, _ := actor.UnwrapEnvelope(message)
	var r response
	switch m := msg.(type) {
	case *response:
		r = *m
	case *actor.DeadLetterResponse:
		r = response{err: ErrActorDead}
	default:
		r = response{val: m}
	}
	select {
	case p.ch <- r:
	default: // a second answer to one call is dropped
	}
}

func (p *replyProcess) SendSystemMessage(*actor.PID, any) {}
func (p *replyProcess) Stop(*actor.PID)                   {}

// Future is the pending result of a call. Await it once.
type Future[T any] struct {
	sys   *System
	to    Ref
	reply *actor.PID
	ch    chan response
	err   error // set when the call could not be sent
}

// CallAsync sends msg to the actor at to and returns a Future for its reply of type T. The
// message is delivered even if ctx ends later; ctx only bounds the wait in Await.
func CallAsync[T any](s *System, to Ref, msg any) *Future[T] {
	f := &Future[T]{sys: s, to: to}
	if to.pid == nil {
		f.err = fmt.Errorf("%w: empty ref", ErrUnknownActor)
		return f
	}
	p := &replyProcess{ch: make(chan response, 1)}
	pid, ok := s.sys.ProcessRegistry.Add(p, "call$"+s.sys.ProcessRegistry.NextId())
	if !ok {
		f.err = fmt.Errorf("actors: call %s: cannot register reply address", to)
		return f
	}
	f.reply, f.ch = pid, p.ch
	s.sys.Root.RequestWithCustomSender(to.pid, &request{msg: msg}, pid)
	return f
}

// Await waits for the reply within ctx (or the System's default call timeout when ctx has no
// deadline). A reply of the wrong type is an error, not a panic.
func (f *Future[T]) Await(ctx context.Context) (T, error) {
	var zero T
	if f.err != nil {
		return zero, f.err
	}
	defer f.sys.sys.ProcessRegistry.Remove(f.reply)
	var timeout <-chan time.Time
	if _, ok := ctx.Deadline(); !ok {
		t := time.NewTimer(f.sys.timeout)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case r := <-f.ch:
		if r.err != nil {
			return zero, fmt.Errorf("call %s: %w", f.to, r.err)
		}
		if r.val == nil {
			return zero, nil
		}
		v, ok := r.val.(T)
		if !ok {
			return zero, fmt.Errorf("actors: call %s: reply is %T, want %T", f.to, r.val, zero)
		}
		return v, nil
	case <-ctx.Done():
		return zero, fmt.Errorf("actors: call %s: %w", f.to, ctx.Err())
	case <-timeout:
		return zero, fmt.Errorf("actors: call %s: no reply within %v: %w", f.to, f.sys.timeout, context.DeadlineExceeded)
	}
}

// Call sends msg to the actor at to and waits for its reply of type T within ctx. It fails
// fast with ErrActorDead when the target is stopped, and with ctx's error on deadline or
// cancellation.
func Call[T any](ctx context.Context, s *System, to Ref, msg any) (T, error) {
	if err := ctx.Err(); err != nil {
		var zero T
		return zero, fmt.Errorf("actors: call %s: %w", to, err)
	}
	return CallAsync[T](s, to, msg).Await(ctx)
}

// Send delivers msg to the actor without waiting for a reply.
func Send(s *System, to Ref, msg any) error {
	if to.pid == nil {
		return fmt.Errorf("%w: empty ref", ErrUnknownActor)
	}
	s.sys.Root.Send(to.pid, msg)
	return nil
}
