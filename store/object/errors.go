package object

import "errors"

// Sentinel errors returned by the store. Check them with errors.Is; the returned
// errors wrap them with the object id and the operation that failed.
var (
	// ErrNotFound: the id is unknown to this store (never put, or already freed).
	ErrNotFound = errors.New("object: not found")
	// ErrTooLarge: the object is larger than the store's whole capacity or its
	// MaxObjectSize; it can never fit.
	ErrTooLarge = errors.New("object: larger than store capacity")
	// ErrStoreFull: admission could not make room (everything resident is in use)
	// before the context's deadline. Nothing was overcommitted.
	ErrStoreFull = errors.New("object: store full")
	// ErrDiskFull: spilling to the cold tier failed for lack of disk (ENOSPC or the
	// configured spill capacity). Returned to the putter; the store never retries forever.
	ErrDiskFull = errors.New("object: spill disk full")
	// ErrExists: an object with this id is already present.
	ErrExists = errors.New("object: already exists")
	// ErrPending: Create named an id that is being written (another pull of the same
	// object into this store). The error matches ErrExists too; Await waits for it.
	ErrPending = errors.New("object: being written")
	// ErrFingerprint: the bytes do not match the object's fingerprint.
	ErrFingerprint = errors.New("object: fingerprint mismatch")
	// ErrLost: the object's bytes are gone (a spill file vanished or is corrupt).
	ErrLost = errors.New("object: lost")
	// ErrNotHolder: Release or Unmap named a holder that holds no reference.
	ErrNotHolder = errors.New("object: holder holds no reference")
	// ErrAborted: Seal of a writer that was aborted (Abort, or the lease of the
	// holder writing it expired), or aborted while sealing. Nothing was kept.
	ErrAborted = errors.New("object: writer aborted")
	// ErrClosed: the store has been closed.
	ErrClosed = errors.New("object: store closed")
	// ErrNotStoreDir: Open was given a directory that holds files but is not a
	// store directory (no marker). The store never adopts, cleans or deletes
	// files in a directory it did not create.
	ErrNotStoreDir = errors.New("object: not a store directory")
	// ErrDirInUse: another open store (in this process or another) holds the
	// store directory.
	ErrDirInUse = errors.New("object: store directory in use")
	// ErrShmTooSmall: the shared-memory file system (Config.ShmDir) has less than
	// MinShm free.
	ErrShmTooSmall = errors.New("object: shared memory too small")
	// ErrOwnerDied: the object's owner (the process or job that put it) has
	// ended, and the object with it: it is refused, as Ray's OwnerDiedError.
	ErrOwnerDied = errors.New("object: owner died")
	// ErrBadID: a printable id could not be parsed.
	ErrBadID = errors.New("object: bad id")
)
