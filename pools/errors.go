package pools

import "errors"

// Sentinel errors. Errors returned by this package wrap one of these; check with errors.Is.
var (
	// ErrSpec reports a pool file that is not well-formed JSON, has an unknown field, or
	// contradicts itself (max below min, a negative price...). The message names the file,
	// line:col, the pool and the field.
	ErrSpec = errors.New("pools: invalid pool spec")
	// ErrUnknownPool reports a machine, launch or notice naming a pool that is not configured.
	ErrUnknownPool = errors.New("pools: unknown pool")
	// ErrSnapshot reports a snapshot the autoscaler cannot decide on (a machine of an unknown
	// pool, a gang of no members, duplicate names).
	ErrSnapshot = errors.New("pools: invalid snapshot")
)
