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
}

// Bytes returns the object's writable shared memory.
func (w *Writer) Bytes() []byte { return w.e.mem.rw }

// ID returns the object's id.
func (w *Writer) ID() ID { return w.e.id }

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
		close(e.progress)
		e.progress = make(chan struct{})
	}
}

// Seal makes the object immutable and visible to Get, owned by its owner with one
// reference. With verify it checks the whole object against the fingerprint given
// to Create first (a mismatch aborts the object and returns ErrFingerprint).
func (w *Writer) Seal(ctx context.Context, verify bool) error { return w.seal(ctx, verify) }

func (w *Writer) seal(ctx context.Context, verify bool) error {
	s, e := w.s, w.e
	if verify {
		if got := xxhash.Sum64(e.mem.rw); got != e.fp {
			w.Abort()
			return s.fail(reasonFingerprint, fmt.Errorf("object: seal %s: fingerprint %x, want %x: %w", e.id.Short(), got, e.fp, ErrFingerprint))
		}
	}
	if err := sealMem(e.mem); err != nil {
		w.Abort()
		return fmt.Errorf("object: seal %s: mprotect: %w", e.id.Short(), err)
	}
	s.mu.Lock()
	e.state = stateHot
	e.refs = map[string]int{e.owner: 1}
	e.ready = e.size
	e.done = nil
	e.lru = s.lru.PushFront(e)
	close(e.progress)
	e.progress = make(chan struct{})
	s.mu.Unlock()
	fp := e.fp
	if !e.fpOK {
		fp = 0 // computed on first need (a transfer, a spill, View.Fingerprint)
	}
	err := s.directory.Register(ctx, Meta{ID: e.id, Size: e.size, Fingerprint: fp, Owner: e.owner,
		Locations: []string{s.cfg.Location}, Refs: 1})
	// Callers waiting in Await take their references only now, after the metadata
	// naming this copy is recorded.
	s.mu.Lock()
	e.settleLocked()
	s.mu.Unlock()
	return err
}

// Abort discards the object and gives its room back.
func (w *Writer) Abort() {
	s, e := w.s, w.e
	s.mu.Lock()
	if e.state != statePending {
		s.mu.Unlock()
		return
	}
	e.state = stateAborted
	e.settleLocked()
	s.maybeFreeLocked(e)
	close(e.progress)
	e.progress = make(chan struct{})
	s.mu.Unlock()
}
