package object

import (
	"context"
	"fmt"

	"github.com/cespare/xxhash/v2"
)

// Region is an object's bytes as served to the transfer plane: sealed objects are
// ready at once; an object still being written (a relay in a broadcast) is served
// range by range as its writer marks them done. It pins the object until Close.
type Region struct {
	s      *Store
	e      *entry
	closed bool
}

// OpenRegion pins id for serving. Pending objects are included.
func (s *Store) OpenRegion(ctx context.Context, id ID) (*Region, error) {
	s.mu.Lock()
	e, ok := s.objs[id]
	if !ok || e.state == stateAborted || e.freePending || e.dropped != nil {
		s.mu.Unlock()
		return nil, s.fail(reasonNotFound, fmt.Errorf("object: open region %s: %w", id.Short(), ErrNotFound))
	}
	e.views++
	if err := s.ensureHotLocked(ctx, e); err != nil {
		e.views--
		s.mu.Unlock()
		return nil, err
	}
	s.mu.Unlock()
	return &Region{s: s, e: e}, nil
}

// ID returns the object id.
func (r *Region) ID() ID { return r.e.id }

// Bytes returns the mapped bytes (read only; possibly still being written past Ready).
func (r *Region) Bytes() []byte { return r.e.mem.ro }

// Size returns the object size.
func (r *Region) Size() int64 { return r.e.size }

// File returns the shared-memory file that holds the bytes and their offset in
// it, so that a server can send them with sendfile(2) from the page cache
// instead of copying them through user space. The file must be opened read-only.
func (r *Region) File() (path string, off int64) { return r.e.mem.path, r.e.mem.off }

// Fingerprint returns the object's xxhash64: the expected one while a pull or a
// relay writes it, else computed on first use and then recorded in the
// directory under ctx. For an object still being put, whose bytes are not
// complete, it waits for the seal until ctx ends.
func (r *Region) Fingerprint(ctx context.Context) (uint64, error) { return r.s.fingerprint(ctx, r.e) }

// ChunkFingerprint returns xxhash64 of bytes [off, off+n), which the caller has
// waited to be ready. Fingerprints are remembered with the object (its bytes never
// change), so serving the same chunk again costs no hashing.
func (r *Region) ChunkFingerprint(off, n int64) uint64 {
	s, e := r.s, r.e
	k := [2]int64{off, n}
	s.mu.Lock()
	fp, ok := e.chunkFP[k]
	s.mu.Unlock()
	if ok {
		return fp
	}
	fp = xxhash.Sum64(e.mem.ro[off : off+n])
	s.mu.Lock()
	if e.chunkFP == nil {
		e.chunkFP = map[[2]int64]uint64{}
	}
	if len(e.chunkFP) < 1<<16 {
		e.chunkFP[k] = fp
	}
	s.mu.Unlock()
	return fp
}

// WaitReady blocks until [0, end) is written, the object is aborted (ErrLost) or
// ctx ends.
func (r *Region) WaitReady(ctx context.Context, end int64) error {
	s, e := r.s, r.e
	for {
		s.mu.Lock()
		if e.state == stateHot || e.state == stateCold || e.ready >= end {
			s.mu.Unlock()
			return nil
		}
		if e.state == stateAborted {
			s.mu.Unlock()
			return fmt.Errorf("object: region %s aborted while being written: %w", e.id.Short(), ErrLost)
		}
		ch := e.progress
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			return fmt.Errorf("object: region %s: waiting for byte %d: %w", e.id.Short(), end, ctx.Err())
		case <-ch:
		}
	}
}

// Close unpins the region. Calling it again does nothing. Not safe concurrently with itself.
func (r *Region) Close() {
	if r.closed {
		return
	}
	r.closed = true
	r.s.unpin(r.e)
}
