package actors

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/atoll-run/atoll/internal/codec"
	"github.com/atoll-run/atoll/proto/actorspb"
)

// Ref addresses one actor, in this process or another. The zero Ref addresses nothing;
// calls to it fail with ErrUnknownActor. Refs are small values, safe to copy and share.
type Ref struct {
	pid  *actor.PID
	kind string
}

// NewRef addresses the actor id on the system at address (as System.Address gives it).
func NewRef(address, id string) Ref { return Ref{pid: actor.NewPID(address, id)} }

// ID is the actor's id on its system (for example "digits/dp.g0/w3").
func (r Ref) ID() string {
	if r.pid == nil {
		return ""
	}
	return r.pid.Id
}

// Address is the address of the actor's system.
func (r Ref) Address() string {
	if r.pid == nil {
		return ""
	}
	return r.pid.Address
}

// Kind is the actor's kind name when known.
func (r Ref) Kind() string { return r.kind }

// IsZero reports whether r addresses nothing.
func (r Ref) IsZero() bool { return r.pid == nil }

// localAddress is protoactor's address of a system that is not remote.
const localAddress = "nonhost"

// String is "id@host:port" for an actor of a remote system, "id (in this process)" for one
// of a system that is not.
func (r Ref) String() string {
	if r.pid == nil {
		return "<nil actor>"
	}
	if r.pid.Address == localAddress {
		return r.pid.Id + " (in this process)"
	}
	return r.pid.Id + "@" + r.pid.Address
}

// Future is the pending result of a call. It may be awaited any number of times, from
// any number of goroutines; every Await sees the same result.
type Future[T any] struct {
	to   Ref
	done chan struct{}
	once sync.Once
	val  T
	err  error
	// raw is the reply message, decoded into val by the first reader (in its goroutine, not
	// in the replying actor's).
	raw    any
	decode sync.Once

	sys   *System
	reply *actor.PID

	// cleanups stop what watches the call (its context hook, its timer, its entry in the
	// system's per-address table); they are added while the call is set up, which a
	// cancellation may already race with, so under mu, and run once it completes.
	mu       sync.Mutex
	finished bool
	cleanups []func()
}

// onFinish adds a cleanup of the call, run when it completes (at once if it has).
func (f *Future[T]) onFinish(fn func()) {
	f.mu.Lock()
	if f.finished {
		f.mu.Unlock()
		fn()
		return
	}
	f.cleanups = append(f.cleanups, fn)
	f.mu.Unlock()
}

// Done is closed when the result is known.
func (f *Future[T]) Done() <-chan struct{} { return f.done }

// Await waits for the result within ctx. ctx bounds only this wait: the call itself is
// bounded and cancelled by the context given to CallAsync.
func (f *Future[T]) Await(ctx context.Context) (T, error) {
	select {
	case <-f.done:
		return f.result()
	default:
	}
	select {
	case <-f.done:
		return f.result()
	case <-ctx.Done():
		var zero T
		return zero, fmt.Errorf("actors: call %s: %w", f.to, ctx.Err())
	}
}

// result decodes the reply once; every reader sees the same value.
func (f *Future[T]) result() (T, error) {
	f.decode.Do(func() {
		if f.raw != nil {
			f.val, f.err = decodeReply[T](f.sys, f.to, f.raw)
			f.raw = nil
		}
	})
	return f.val, f.err
}

// Result returns the result and true when it is known, without waiting.
func (f *Future[T]) Result() (T, error, bool) {
	select {
	case <-f.done:
		v, err := f.result()
		return v, err, true
	default:
		var zero T
		return zero, nil, false
	}
}

func (f *Future[T]) complete(v T, err error) bool {
	return f.finish(nil, v, err)
}

// finish completes the future with a raw reply (decoded later by its reader) or a value.
func (f *Future[T]) finish(raw any, v T, err error) bool {
	first := false
	f.once.Do(func() {
		first = true
		f.raw, f.val, f.err = raw, v, err
		f.mu.Lock()
		f.finished = true
		cleanups := f.cleanups
		f.cleanups = nil
		f.mu.Unlock()
		for _, c := range cleanups {
			c()
		}
		if f.reply != nil {
			f.sys.sys.ProcessRegistry.Remove(f.reply)
		}
		close(f.done)
	})
	return first
}

var callIDs atomic.Uint64

// replyProcess takes the one reply of a call. It is registered in protoactor's process
// registry for the life of the call, so a reply (or a dead-letter notice) from this process
// or another reaches the caller without a goroutine per call.
type replyProcess struct{ deliver func(msg any) }

func (p *replyProcess) SendUserMessage(_ *actor.PID, message any) {
	_, msg, _ := actor.UnwrapEnvelope(message)
	p.deliver(msg)
}
func (p *replyProcess) SendSystemMessage(*actor.PID, any) {}
func (p *replyProcess) Stop(*actor.PID)                   {}

// CallAsync sends msg to the actor at to and returns a Future for its reply of type T.
// msg and the reply pass through the system's codec (they must be able to cross a process
// boundary, wherever the actor is). ctx bounds and cancels the call: when it ends first, the
// Future fails with its error and the handler's context is cancelled, in whatever process
// it runs. A ctx without a deadline gets the system's default call timeout.
func CallAsync[T any](ctx context.Context, s *System, to Ref, msg any) *Future[T] {
	f := &Future[T]{sys: s, to: to, done: make(chan struct{})}
	var zero T
	if to.pid == nil {
		f.complete(zero, fmt.Errorf("%w: empty ref", ErrUnknownActor))
		return f
	}
	if ctx.Err() != nil {
		f.complete(zero, fmt.Errorf("actors: call %s: %w", to, context.Cause(ctx)))
		return f
	}
	body, err := s.codec.Encode(msg)
	if err != nil {
		f.complete(zero, fmt.Errorf("actors: call %s: %w", to, err))
		return f
	}
	id := callIDs.Add(1)
	p := &replyProcess{deliver: func(m any) { f.finish(m, zero, nil) }}
	pid, ok := s.sys.ProcessRegistry.Add(p, "call$"+s.sys.ProcessRegistry.NextId())
	if !ok {
		f.complete(zero, fmt.Errorf("actors: call %s: cannot register reply address", to))
		return f
	}
	f.reply = pid
	deadline, has := ctx.Deadline()
	if !has {
		deadline = time.Now().Add(s.timeout)
		timer := time.AfterFunc(s.timeout, func() {
			if f.complete(zero, fmt.Errorf("actors: call %s: no reply within %v: %w", to, s.timeout, context.DeadlineExceeded)) {
				s.sendCancel(to, pid, id)
			}
		})
		f.onFinish(func() { timer.Stop() })
	}
	stop := context.AfterFunc(ctx, func() {
		// A call whose deadline passed needs no Cancel: its handler has the same deadline.
		if f.complete(zero, fmt.Errorf("actors: call %s: %w", to, context.Cause(ctx))) && !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			s.sendCancel(to, pid, id)
		}
	})
	f.onFinish(func() { stop() })
	if s.rem != nil && to.pid.Address != s.sys.Address() {
		f.onFinish(s.remotes.add(to.pid.Address, id, func() {
			f.complete(zero, fmt.Errorf("call %s: %w (its process is unreachable)", to, ErrActorDead))
		}))
	}
	req := &actorspb.Request{CallId: id, Body: body, DeadlineUnixNano: deadline.UnixNano(), Caller: callerKey(pid)}
	s.sys.Root.RequestWithCustomSender(to.pid, req, pid)
	return f
}

func callerKey(pid *actor.PID) string { return pid.Address + "/" + pid.Id }

func (s *System) sendCancel(to Ref, reply *actor.PID, id uint64) {
	s.sys.Root.Send(actor.NewPID(to.pid.Address, CancellerID), &actorspb.Cancel{Caller: callerKey(reply), CallId: id})
}

func decodeReply[T any](s *System, to Ref, m any) (T, error) {
	var zero T
	switch r := m.(type) {
	case *actorspb.Reply:
		if r.Error != nil {
			err := s.errorFromWire(r.Error)
			if r.Failed {
				err = answererFailed{err}
			}
			return zero, fmt.Errorf("call %s: %w", to, err)
		}
		if reflect.TypeFor[T]().Kind() == reflect.Interface {
			v, err := s.codec.Decode(r.Body)
			if err != nil {
				return zero, fmt.Errorf("actors: call %s: reply: %w", to, err)
			}
			if v == nil {
				return zero, nil
			}
			tv, ok := v.(T)
			if !ok {
				return zero, fmt.Errorf("actors: call %s: reply is %T, want %s", to, v, reflect.TypeFor[T]())
			}
			return tv, nil
		}
		var v T
		if err := codec.DecodeInto(r.Body, &v); err != nil {
			return zero, fmt.Errorf("actors: call %s: reply: %w", to, err)
		}
		return v, nil
	case *actor.DeadLetterResponse:
		return zero, fmt.Errorf("call %s: %w", to, ErrNotDelivered)
	}
	return zero, fmt.Errorf("actors: call %s: unexpected reply %T", to, m)
}

// answererFailed marks the error of a call whose actor failed handling it
// (ErrAnswererFailed); its text is the error's.
type answererFailed struct{ error }

func (e answererFailed) Unwrap() error        { return e.error }
func (e answererFailed) Is(target error) bool { return target == ErrAnswererFailed }

// Call sends msg to the actor at to and waits for its reply of type T within ctx. It fails
// fast with ErrActorDead when the target is stopped, and with ctx's error on deadline or
// cancellation (the handler's context is then cancelled too).
func Call[T any](ctx context.Context, s *System, to Ref, msg any) (T, error) {
	return CallAsync[T](ctx, s, to, msg).Await(context.WithoutCancel(ctx))
}

// Send delivers msg to the actor without waiting for a reply. The message passes through
// the codec as a call's would.
func Send(s *System, to Ref, msg any) error {
	if to.pid == nil {
		return fmt.Errorf("%w: empty ref", ErrUnknownActor)
	}
	body, err := s.codec.Encode(msg)
	if err != nil {
		return fmt.Errorf("actors: send to %s: %w", to, err)
	}
	s.sys.Root.Send(to.pid, &actorspb.Tell{Body: body})
	return nil
}

// inflight holds the contexts of the calls being handled on this system, by caller key, so
// that a Cancel (which must not wait behind the busy actor's mailbox) reaches them. A Cancel
// that arrives before its call is handled (the call still queued behind another) leaves a
// tombstone, so the call starts cancelled; tombstones are forgotten after tombstoneTTL.
type inflight struct {
	mu    sync.Mutex
	m     map[string]context.CancelCauseFunc
	tombs map[string]time.Time
}

const tombstoneTTL = time.Minute

func newInflight() *inflight {
	return &inflight{m: map[string]context.CancelCauseFunc{}, tombs: map[string]time.Time{}}
}

func (in *inflight) add(key string, cancel context.CancelCauseFunc) {
	in.mu.Lock()
	_, dead := in.tombs[key]
	if dead {
		delete(in.tombs, key)
	} else {
		in.m[key] = cancel
	}
	in.mu.Unlock()
	if dead {
		cancel(context.Canceled)
	}
}

func (in *inflight) remove(key string) {
	in.mu.Lock()
	delete(in.m, key)
	in.mu.Unlock()
}

func (in *inflight) cancel(key string) {
	now := time.Now()
	in.mu.Lock()
	c, ok := in.m[key]
	if !ok {
		in.tombs[key] = now
		if len(in.tombs) > 1024 {
			for k, at := range in.tombs {
				if now.Sub(at) > tombstoneTTL {
					delete(in.tombs, k)
				}
			}
		}
	}
	in.mu.Unlock()
	if ok {
		c(context.Canceled)
	}
}

func (in *inflight) cancelAll() {
	in.mu.Lock()
	defer in.mu.Unlock()
	for _, c := range in.m {
		c(ErrShutdown)
	}
}

// cancelProcess takes Cancel messages from callers, here or in other processes.
type cancelProcess struct{ s *System }

func (p *cancelProcess) SendUserMessage(_ *actor.PID, message any) {
	_, msg, _ := actor.UnwrapEnvelope(message)
	if c, ok := msg.(*actorspb.Cancel); ok {
		p.s.calls.cancel(c.Caller)
	}
}
func (p *cancelProcess) SendSystemMessage(*actor.PID, any) {}
func (p *cancelProcess) Stop(*actor.PID)                   {}

// remoteCalls tracks the calls waiting on each remote address, so that when protoactor
// gives up on an address (its process is gone) they fail at once with ErrActorDead instead
// of waiting for their deadlines.
type remoteCalls struct {
	mu sync.Mutex
	m  map[string]map[uint64]func()
}

func (rc *remoteCalls) add(addr string, id uint64, fail func()) (remove func()) {
	rc.mu.Lock()
	if rc.m == nil {
		rc.m = map[string]map[uint64]func(){}
	}
	if rc.m[addr] == nil {
		rc.m[addr] = map[uint64]func(){}
	}
	rc.m[addr][id] = fail
	rc.mu.Unlock()
	return func() {
		rc.mu.Lock()
		delete(rc.m[addr], id)
		if len(rc.m[addr]) == 0 {
			delete(rc.m, addr)
		}
		rc.mu.Unlock()
	}
}

func (rc *remoteCalls) failAll(addr string) {
	rc.mu.Lock()
	fails := make([]func(), 0, len(rc.m[addr]))
	for _, f := range rc.m[addr] {
		fails = append(fails, f)
	}
	rc.mu.Unlock()
	for _, f := range fails {
		f()
	}
}
