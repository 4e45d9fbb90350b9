package actors

import (
	"context"
	"errors"
	"fmt"

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

// remoteError is an error that came from another process (or through the codec): its text
// is the handler's, and Is matches the sentinel its code names.
type remoteError struct {
	msg      string
	sentinel error
}

func (e *remoteError) Error() string { return e.msg }
func (e *remoteError) Unwrap() error { return e.sentinel }

func errorToWire(err error) *actorspb.Error {
	for _, w := range wireErrors {
		if errors.Is(err, w.err) {
			return &actorspb.Error{Code: w.code, Message: err.Error()}
		}
	}
	return &actorspb.Error{Code: actorspb.ErrorCode_USER, Message: err.Error()}
}

func errorFromWire(e *actorspb.Error) error {
	if e.Code == actorspb.ErrorCode_USER {
		return errors.New(e.Message)
	}
	for _, w := range wireErrors {
		if w.code == e.Code {
			return &remoteError{msg: e.Message, sentinel: w.err}
		}
	}
	return fmt.Errorf("%s (error code %v)", e.Message, e.Code)
}
