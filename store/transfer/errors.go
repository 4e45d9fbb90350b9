package transfer

import "errors"

// Sentinel errors. Check with errors.Is; returned errors wrap them with the
// object, address or offset involved.
var (
	// ErrObjectLost: no location could supply the object (all dead, or none had it).
	ErrObjectLost = errors.New("transfer: object lost")
	// ErrBadKey: a read named a region key the server does not hold (never
	// registered, deregistered, or a forged secret). Nothing is served.
	ErrBadKey = errors.New("transfer: bad region key")
	// ErrCorruptChunk: a chunk's bytes did not match the fingerprint sent ahead of
	// them. The puller re-fetches the chunk; this surfaces only when retries run out.
	ErrCorruptChunk = errors.New("transfer: corrupt chunk")
	// ErrBadFrame: a frame could not be decoded (truncated, oversized, unknown type).
	ErrBadFrame = errors.New("transfer: bad frame")
	// ErrAuth: the peer failed the challenge/response (wrong cluster token).
	ErrAuth = errors.New("transfer: authentication failed")
	// ErrNotFound: the server does not have the object.
	ErrNotFound = errors.New("transfer: object not found at source")
	// ErrRange: a read outside the region.
	ErrRange = errors.New("transfer: range outside region")
	// ErrClosed: the connection or server is closed.
	ErrClosed = errors.New("transfer: closed")
	// ErrDenied: the server's Authorize refused this peer the object (its certificate's
	// principal may not read it).
	ErrDenied = errors.New("transfer: denied")
	// ErrRemote: the server failed for another reason (message attached).
	ErrRemote = errors.New("transfer: remote error")
)
