// Writers: objects filled in place (by the transfer plane or another process)
// before they are sealed, and Await for callers that want an object being written.

package object

import (
	"context"
	"fmt"

	"github.com/cespare/xxhash/v2"
)

// Writer fills a created object in place. Its methods may be called from several
// goroutines (MarkDone is safe concurrently); Seal or Abort exactly once.
type Writer struct {
	s *Store
	e *entry
	// put says the writer is a put's (Put, PutFrom): its registration is the object's
	// first (Meta.Put), not a copy's.
	put bool
}

// Bytes returns the object's writable shared memory.
func (w *Writer) Bytes() []byte { return w.e.mem.rw }

// ID returns the object's id.
func (w *Writer) ID() ID { return w.e.id }

// Mapping tells another process where the object's writable bytes are: Size
// bytes at Offset in the file at Path, for MapFileRW. For a writer from
// CreateFor the range starts a page of its own and shares no page with any other
// object; for one from Create it may (a slab), so do not hand that one out.
func (w *Writer) Mapping() Mapping {
	return Mapping{Path: w.e.mem.path, Offset: w.e.mem.off, Size: w.e.size}
}

// MarkDone records that [off, off+n) is written, so a relay serving the object
// before it is sealed may send those bytes.
func (w *Writer) MarkDone(off, n int64) {
	s, e := w.s, w.e
	s.mu.Lock()
	defer s.mu.Unlock()
	if e.done == nil {
		e.done = map[int64]int64{}
	}
	if end, ok := e.done[off]; !ok || end < off+n {
		e.done[off] = off + n
	}
	advanced := false
	for {
		end, ok := e.done[e.ready]
		if !ok {
			break
		}
		delete(e.done, e.ready)
		e.ready = max(end, e.ready)
		advanced = true
	}
	if advanced {
		e.wakeLocked()
	}
}

// Seal makes the object immutable and visible to Get, owned by its owner with one
// reference. With verify it checks the whole object against the fingerprint given
// to Create first (a mismatch aborts the object and returns ErrFingerprint).
//
// The object's metadata is registered in the directory, under ctx, before the
// object becomes visible: if that fails the object is aborted (its memory freed)
// and the error returned, so a failed seal leaves nothing behind. A writer that
// was aborted meanwhile (Abort, or its holder's lease expired) gets ErrAborted.
func (w *Writer) Seal(ctx context.Context, verify bool) error { return w.seal(ctx, verify) }

func (w *Writer) seal(ctx context.Context, verify bool) error {
	s, e := w.s, w.e
	s.mu.Lock()
	if e.state != statePending || e.sealing {
		s.mu.Unlock()
		return fmt.Errorf("object: seal %s: %w", e.id.Short(), ErrAborted)
	}
	e.sealing = true
	e.views++ // the bytes stay ours while we read them, even if an Abort comes
	s.mu.Unlock()

	err := w.check(verify)
	registered := false
	if err == nil {
		s.mu.Lock()
		e.ready, e.done = e.size, nil // every byte is written: relays may serve them all
		e.wakeLocked()
		fp := e.fp
		if !e.fpOK {
			fp = 0 // computed on first need (a transfer, a spill, View.Fingerprint)
		}
		s.mu.Unlock()
		// The metadata naming this copy is recorded before anyone can take a
		// reference to it (Get, AddRef, Await all wait for the state below).
		err = s.directory.Register(ctx, Meta{ID: e.id, Size: e.size, Fingerprint: fp, Owner: e.owner,
			Locations: []string{s.cfg.Location}, Refs: 1, Put: w.put})
		if err != nil {
			err = fmt.Errorf("object: seal %s: register in directory: %w", e.id.Short(), err)
		} else {
			registered = true
		}
	}

	s.mu.Lock()
	e.views--
	e.sealing = false
	if err == nil && e.state != statePending {
		err = fmt.Errorf("object: seal %s: aborted while sealing: %w", e.id.Short(), ErrAborted)
	}
	if err != nil {
		s.setStateLocked(e, stateAborted)
		e.settleLocked()
		freed := s.maybeFreeLocked(e)
		e.wakeLocked()
		s.mu.Unlock()
		s.forget(ctx, freed)
		if registered { // a location was recorded for a copy that is gone
			s.forget(ctx, []ID{e.id})
		}
		return err
	}
	s.setStateLocked(e, stateHot)
	e.refs = map[string]int{e.owner: 1}
	e.lru = s.lru.PushFront(e)
	e.wakeLocked()
	e.settleLocked()
	s.mu.Unlock()
	return nil
}

// check verifies the bytes against the expected fingerprint (verify), or
// computes the fingerprint of bytes another process wrote (CreateFor) when the
// store fingerprints puts (Config.FingerprintOnPut; otherwise, as for any put, it
// is computed on first need).
func (w *Writer) check(verify bool) error {
	s, e := w.s, w.e
	switch {
	case verify:
		if got := xxhash.Sum64(e.mem.rw); got != e.fp {
			return s.fail(reasonFingerprint, fmt.Errorf("object: seal %s: fingerprint %x, want %x: %w", e.id.Short(), got, e.fp, ErrFingerprint))
		}
	case e.hashOnSeal && s.cfg.FingerprintOnPut:
		fp := xxhash.Sum64(e.mem.ro)
		s.mu.Lock()
		e.fp, e.fpOK = fp, true
		s.mu.Unlock()
	}
	if err := sealMem(e.mem); err != nil {
		return fmt.Errorf("object: seal %s: %w", e.id.Short(), err)
	}
	return nil
}

// Abort discards the object and gives its room back.
func (w *Writer) Abort() {
	s, e := w.s, w.e
	s.mu.Lock()
	if e.state != statePending {
		s.mu.Unlock()
		return
	}
	s.abortLocked(e)
	s.mu.Unlock()
}

// abortLocked aborts the pending object e: waiters and relays are told, and its
// memory is freed now, or when the last region (or a seal in progress) lets go.
func (s *Store) abortLocked(e *entry) {
	s.setStateLocked(e, stateAborted)
	e.settleLocked()
	s.maybeFreeLocked(e)
	e.wakeLocked()
}

// Await waits while id is being written into this store (Create was called and
// the writer has neither sealed nor aborted it), so that concurrent fetches of the
// same object make one copy: a caller whose Create failed with ErrPending, or that
// sees the id pending, waits here instead of failing.
//
// It returns nil once id is sealed here, and then, if holder is not empty, holder
// holds one new reference to it, taken atomically with the check (so the object
// cannot be freed in between). It returns ErrNotFound when id is not in this store
// or its writer aborted it (the caller may then fetch it itself), ErrClosed when
// the store closes, and ctx's error, wrapped, when ctx ends first.
func (s *Store) Await(ctx context.Context, id ID, holder string) error {
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return fmt.Errorf("object: await %s: %w", id.Short(), ErrClosed)
		}
		e, ok := s.objs[id]
		if !ok || e.state == stateAborted || e.dropped != nil {
			s.mu.Unlock()
			return fmt.Errorf("object: await %s: %w", id.Short(), ErrNotFound)
		}
		var settled <-chan struct{} // nil: wait only for a change in the store
		switch {
		case e.freePending:
			// Being freed once its spill ends: wait until it is gone.
		case e.state == statePending:
			settled = e.settled
		default: // sealed (Seal settles it in the same step)
			if holder == "" {
				s.mu.Unlock()
				return nil
			}
			return s.addRefUnlock(ctx, e, holder)
		}
		changed := s.changedLocked()
		s.mu.Unlock()
		if s.hooks != nil && s.hooks.awaitBlocked != nil {
			s.hooks.awaitBlocked(id)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("object: await %s: %w", id.Short(), ctx.Err())
		case <-settled:
		case <-changed: // store closing, or another change; look again
		}
	}
}
