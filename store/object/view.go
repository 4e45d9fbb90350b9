// Views: zero-copy, read-only access to a sealed object in this process.

package object

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/cespare/xxhash/v2"
	"go.uber.org/zap"
)

// View is a read-only view of an object's bytes in shared memory. It pins the
// object (it is neither spilled nor freed) until Release.
type View struct {
	s        *Store
	e        *entry
	released atomic.Bool
}

// Bytes returns the object's bytes: the mapped pages themselves, not a copy. They
// are mapped read-only; writing to them faults. Do not use them after Release.
func (v *View) Bytes() []byte { return v.e.mem.ro }

// ID returns the object's id.
func (v *View) ID() ID { return v.e.id }

// Size returns the object's size.
func (v *View) Size() int64 { return v.e.size }

// Fingerprint returns the object's xxhash64, computing it now if it was not
// yet. The first computation records it in the directory under ctx (a failed
// write is logged: the fingerprint itself is right either way).
func (v *View) Fingerprint(ctx context.Context) uint64 {
	fp, _ := v.s.fingerprint(ctx, v.e) // sealed: nothing to wait for, no error
	return fp
}

// fingerprint returns e's fingerprint, computing it on first use and recording
// it in the directory under ctx. The caller has pinned e. An object still being
// put (its fingerprint unknown until its bytes are complete) is waited for
// until it is sealed or aborted (ErrLost), or ctx ends.
func (s *Store) fingerprint(ctx context.Context, e *entry) (uint64, error) {
	s.mu.Lock()
	for !e.fpOK && e.state == statePending && e.settled != nil {
		ch := e.settled
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return 0, fmt.Errorf("object: fingerprint %s: waiting for its writer: %w", e.id.Short(), ctx.Err())
		}
		s.mu.Lock()
	}
	if e.state == stateAborted && !e.fpOK {
		s.mu.Unlock()
		return 0, fmt.Errorf("object: fingerprint %s: aborted while being written: %w", e.id.Short(), ErrLost)
	}
	fp, ok, data := e.fp, e.fpOK, e.mem.ro
	s.mu.Unlock()
	if ok {
		return fp, nil
	}
	fp = xxhash.Sum64(data)
	s.mu.Lock()
	e.fp, e.fpOK = fp, true
	s.mu.Unlock()
	if err := s.directory.Register(ctx, Meta{ID: e.id, Size: e.size, Fingerprint: fp, Owner: e.owner,
		Locations: []string{s.cfg.Location}}); err != nil {
		s.log.Warn("directory register fingerprint", zap.Stringer("id", e.id), zap.Error(err))
	}
	return fp, nil
}

// Release unpins the view. Calling it again does nothing.
func (v *View) Release() {
	if !v.released.CompareAndSwap(false, true) {
		return
	}
	v.s.unpin(v.e)
}

func (s *Store) unpin(e *entry) {
	s.mu.Lock()
	e.views--
	freed := s.maybeFreeLocked(e)
	s.notifyLocked()
	s.mu.Unlock()
	s.forgetBackground(freed)
}

// Get returns a read-only view of id, restoring it from the cold tier if needed.
// The caller must Release the view.
func (s *Store) Get(ctx context.Context, id ID) (*View, error) {
	s.mu.Lock()
	e, ok := s.objs[id]
	if !ok || e.state == statePending || e.state == stateAborted || e.freePending {
		s.mu.Unlock()
		return nil, s.fail(reasonNotFound, fmt.Errorf("object: get %s: %w", id.Short(), ErrNotFound))
	}
	if e.dropped != nil {
		s.mu.Unlock()
		return nil, fmt.Errorf("object: get %s: %w", id.Short(), e.dropped)
	}
	e.views++
	if err := s.ensureHotLocked(ctx, e); err != nil {
		e.views--
		lostNow := errors.Is(err, ErrLost)
		var freed []ID
		if lostNow { // the bytes are gone: drop the entry so nobody waits on it again
			freed = s.finishFreeLocked(e, nil)
		}
		s.mu.Unlock()
		s.forget(ctx, freed)
		return nil, err
	}
	if e.lru != nil {
		s.lru.MoveToFront(e.lru)
	}
	s.mu.Unlock()
	s.m.gets.Inc()
	return &View{s: s, e: e}, nil
}
