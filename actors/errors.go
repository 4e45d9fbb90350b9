package actors

import (
	"context"
	"errors"
	"fmt"
	"reflect"

	"github.com/atoll-run/atoll/internal/codec"
	"github.com/atoll-run/atoll/proto/actorspb"
)

// ErrStale says the actor incarnation a message was meant for has ended (its gang
// restarted); the caller should retry against the new incarnation.
var ErrStale = errors.New("actors: incarnation ended")

// ErrNotInGang: a gang-only operation (a collective) asked of a standalone actor.
var ErrNotInGang = errors.New("actors: actor is not in a gang")

// wireErrors maps the sentinels that keep their identity across processes to their codes.
// An error that wraps none of them crosses as USER, with its text only.
var wireErrors = []struct {
	code actorspb.ErrorCode
	err  error
}{
	{actorspb.ErrorCode_STALE, ErrStale},
	{actorspb.ErrorCode_NOT_DELIVERED, ErrNotDelivered}, // before ErrActorDead, which it wraps
	{actorspb.ErrorCode_ACTOR_DEAD, ErrActorDead},
	{actorspb.ErrorCode_ACTOR_FAILED, ErrActorFailed},
	{actorspb.ErrorCode_CANCELED, context.Canceled},
	{actorspb.ErrorCode_DEADLINE_EXCEEDED, context.DeadlineExceeded},
	{actorspb.ErrorCode_UNKNOWN_KIND, ErrUnknownKind},
	{actorspb.ErrorCode_INVALID, ErrInvalidSpec},
	{actorspb.ErrorCode_NOT_IN_GANG, ErrNotInGang},
	{actorspb.ErrorCode_CODEC, codec.ErrUnserializable},
	{actorspb.ErrorCode_CODEC_UNKNOWN_TYPE, codec.ErrUnknownType},
	{actorspb.ErrorCode_CODEC_CORRUPT, codec.ErrCorrupt},
	{actorspb.ErrorCode_SHUTDOWN, ErrShutdown},
}

// Errors are a program's own errors that keep their identity across processes: sentinels
// (matched by errors.Is) and error types (found by errors.As). A handler's error that wraps
// a registered sentinel reaches its caller wrapping that same sentinel; one that wraps a
// value of a registered type reaches it wrapping a copy of that value (through the codec).
// Every other error crosses with its text only. The processes of one program register the
// same errors; a sentinel crosses by its text, so two registered sentinels must read
// differently. Build it before the System starts (Config.Errors); it is not changed after,
// and is safe for concurrent use then.
type Errors struct {
	sentinels map[string]error
	names     []string // registration order
	types     map[reflect.Type]bool
}

// NewErrors returns an empty registry.
func NewErrors() *Errors {
	return &Errors{sentinels: map[string]error{}, types: map[reflect.Type]bool{}}
}

// AddSentinel registers a sentinel error (a package-level variable, compared by identity).
// It fails with ErrInvalidSpec for nil, a sentinel of the runtime's own, or one whose text
// another registered sentinel has.
func (e *Errors) AddSentinel(err error) error {
	if err == nil {
		return fmt.Errorf("%w: a nil sentinel error", ErrInvalidSpec)
	}
	for _, w := range wireErrors {
		if err == w.err {
			return fmt.Errorf("%w: %q is the runtime's own error (it crosses already)", ErrInvalidSpec, err)
		}
	}
	name := err.Error()
	if old, ok := e.sentinels[name]; ok {
		if old == err {
			return nil
		}
		return fmt.Errorf("%w: two sentinel errors read %q: they could not be told apart across processes", ErrInvalidSpec, name)
	}
	e.sentinels[name] = err
	e.names = append(e.names, name)
	return nil
}

// AddType registers the type of v, an error (a zero value will do: &QuotaError{} for
// *QuotaError), with c, the system's codec, so that its values cross. It fails with
// codec.ErrUnserializable when the type cannot cross a process boundary.
func (e *Errors) AddType(c *codec.Codec, v error) error {
	if v == nil {
		return fmt.Errorf("%w: a nil error type", ErrInvalidSpec)
	}
	if err := c.Register(v); err != nil {
		return fmt.Errorf("actors: error type %T: %w", v, err)
	}
	e.types[reflect.TypeOf(v)] = true
	return nil
}

// toWire adds to we the registered sentinels err wraps and the values of registered types
// in its tree.
func (e *Errors) toWire(c *codec.Codec, err error, we *actorspb.Error) {
	if e == nil {
		return
	}
	for _, name := range e.names {
		if errors.Is(err, e.sentinels[name]) {
			we.Sentinels = append(we.Sentinels, name)
		}
	}
	if len(e.types) == 0 {
		return
	}
	var walk func(error)
	walk = func(err error) {
		if err == nil {
			return
		}
		if e.types[reflect.TypeOf(err)] {
			if p, perr := c.Encode(err); perr == nil {
				we.Values = append(we.Values, p)
			}
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			walk(u.Unwrap())
		case interface{ Unwrap() []error }:
			for _, x := range u.Unwrap() {
				walk(x)
			}
		}
	}
	walk(err)
}

// fromWire is the registered errors we carries: the sentinels this process knows, and the
// values that decode as errors.
func (e *Errors) fromWire(c *codec.Codec, we *actorspb.Error) []error {
	if e == nil {
		return nil
	}
	var out []error
	for _, name := range we.Sentinels {
		if s, ok := e.sentinels[name]; ok {
			out = append(out, s)
		}
	}
	for _, p := range we.Values {
		if v, err := c.Decode(p); err == nil {
			if ev, ok := v.(error); ok {
				out = append(out, ev)
			}
		}
	}
	return out
}

// remoteError is an error that came from another process (or through the codec): its text
// is the handler's, and Is and As match the sentinel its code names and the registered
// errors it carried.
type remoteError struct {
	msg      string
	sentinel error
	user     []error
}

func (e *remoteError) Error() string { return e.msg }
func (e *remoteError) Unwrap() []error {
	if e.sentinel == nil {
		return e.user
	}
	return append([]error{e.sentinel}, e.user...)
}

// errorToWire is err as it crosses to a caller.
func (s *System) errorToWire(err error) *actorspb.Error {
	we := &actorspb.Error{Code: actorspb.ErrorCode_USER, Message: err.Error()}
	for _, w := range wireErrors {
		if errors.Is(err, w.err) {
			we.Code = w.code
			break
		}
	}
	s.errors.toWire(s.codec, err, we)
	return we
}

// errorFromWire is the error a caller sees for e.
func (s *System) errorFromWire(e *actorspb.Error) error {
	user := s.errors.fromWire(s.codec, e)
	if e.Code == actorspb.ErrorCode_USER {
		if len(user) == 0 {
			return errors.New(e.Message)
		}
		return &remoteError{msg: e.Message, user: user}
	}
	for _, w := range wireErrors {
		if w.code == e.Code {
			return &remoteError{msg: e.Message, sentinel: w.err, user: user}
		}
	}
	return fmt.Errorf("%s (error code %v)", e.Message, e.Code)
}
