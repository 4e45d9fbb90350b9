// Admission and put: a new object's id is reserved and room is made for it
// without overcommitting the hot tier's capacity.

package object

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/cespare/xxhash/v2"
)

// Put stores a copy of b under a new random id owned by owner (one reference).
func (s *Store) Put(ctx context.Context, owner string, b []byte) (ID, error) {
	id := NewID()
	return id, s.PutID(ctx, owner, id, b)
}

// PutID stores a copy of b under id (for example ContentID(b)), owned by owner.
func (s *Store) PutID(ctx context.Context, owner string, id ID, b []byte) error {
	w, err := s.create(ctx, owner, id, int64(len(b)), 0, false, "")
	if err != nil {
		return err
	}
	if s.cfg.FingerprintOnPut {
		w.e.fp, w.e.fpOK = copyHash(w.e.mem.rw, b), true
	} else {
		Copy(w.e.mem.rw, b)
	}
	w.put = true
	return w.seal(ctx, false)
}

// PutFrom stores size bytes read from r under id, owned by owner (one
// reference), writing them straight into the object's shared memory as they
// arrive: nothing is buffered on the way, whatever the size. The object's room
// is admitted before the first byte is read (ErrTooLarge at once past
// MaxObjectSize). If r fails or ends early, or ctx ends, the object is aborted
// and its room given back before PutFrom returns; r is never read past size.
// The fingerprint is computed on the way; the new object's metadata is returned.
func (s *Store) PutFrom(ctx context.Context, owner string, id ID, size int64, r io.Reader) (Meta, error) {
	w, err := s.create(ctx, owner, id, size, 0, false, "")
	if err != nil {
		return Meta{}, err
	}
	dst := w.e.mem.rw
	d := xxhash.New()
	const block = 1 << 20
	for off := 0; off < len(dst); {
		if err := ctx.Err(); err != nil {
			w.Abort()
			return Meta{}, fmt.Errorf("object: put %s: %w", id.Short(), err)
		}
		end := min(off+block, len(dst))
		n, err := io.ReadFull(r, dst[off:end])
		_, _ = d.Write(dst[off : off+n])
		off += n
		if err != nil {
			w.Abort()
			if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
				return Meta{}, fmt.Errorf("object: put %s: the body ended after %d of %d bytes: %w", id.Short(), off, size, io.ErrUnexpectedEOF)
			}
			return Meta{}, fmt.Errorf("object: put %s: read after %d of %d bytes: %w", id.Short(), off, size, err)
		}
	}
	fp := d.Sum64()
	s.mu.Lock()
	w.e.fp, w.e.fpOK = fp, true
	s.mu.Unlock()
	w.put = true
	if err := w.seal(ctx, false); err != nil {
		return Meta{}, err
	}
	return Meta{ID: id, Size: size, Fingerprint: fp, Owner: owner, Locations: []string{s.cfg.Location}, Refs: 1}, nil
}

// copyHash copies src into dst and returns xxhash64(src), hashing each block
// while it is still in cache.
func copyHash(dst, src []byte) uint64 {
	const block = 64 << 10
	d := xxhash.New()
	for off := 0; off < len(src); off += block {
		end := min(off+block, len(src))
		copy(dst[off:end], src[off:end])
		_, _ = d.Write(dst[off:end])
	}
	return d.Sum64()
}

// Create admits size bytes and returns a Writer over the new object's writable
// shared memory, for a caller that fills it in place (the transfer plane writes
// arriving chunks straight into it). fp is the expected xxhash64, checked by
// Writer.Seal(true) and reported to relays serving the object before it is sealed.
// Until sealed the object is invisible to Get.
func (s *Store) Create(ctx context.Context, owner string, id ID, size int64, fp uint64) (*Writer, error) {
	return s.create(ctx, owner, id, size, fp, true, "")
}

// CreateFor admits size bytes for an object that another process on this
// machine (holder: a worker process) writes straight into shared memory, so a
// put from that process copies nothing through the agent.
//
// Ownership: the caller (the agent, for its worker) holds the Writer and hands
// holder w.Mapping(); holder maps it with MapFileRW, writes the bytes, unmaps,
// and tells the caller, who calls w.Seal. Seal registers the object and makes
// it visible, owned by owner with one reference (verify is ignored); its
// fingerprint is computed from the bytes as they are at the seal when the store
// fingerprints puts (Config.FingerprintOnPut), on first need otherwise, as for
// any put. The object has a segment of
// its own (its writable mapping covers no other object's memory), cleared
// before holder sees it.
//
// If holder dies before the seal, the writer is aborted and its memory freed:
// when the caller calls w.Abort (it saw the process exit), or when holder's
// lease expires (ExpireLeases; the caller should Renew holder while it lives).
// A later Seal then fails with ErrAborted. The aborted segment is dropped, not
// recycled, since a process that is slow rather than dead may still map it.
// A holder that keeps writing after Seal breaks the object's immutability, of
// its own objects only: transfers catch a change after the fingerprint was taken
// (chunk fingerprints), same-machine readers do not.
func (s *Store) CreateFor(ctx context.Context, owner, holder string, id ID, size int64) (*Writer, error) {
	if holder == "" {
		return nil, fmt.Errorf("object: create %s for another process: empty holder", id.Short())
	}
	w, err := s.create(ctx, owner, id, size, 0, false, holder)
	if err != nil {
		return nil, err
	}
	w.put = true // a new object, as Put's: its record is the first (a directory may write it behind)
	return w, nil
}

// create reserves id and admits size bytes for it. external names the holder
// (another process) that writes it, "" for this process.
func (s *Store) create(ctx context.Context, owner string, id ID, size int64, fp uint64, fpOK bool, external string) (*Writer, error) {
	if size < 0 {
		return nil, fmt.Errorf("object: create %s: negative size %d", id.Short(), size)
	}
	if size > s.maxObject {
		return nil, s.fail(reasonTooLarge, fmt.Errorf("object: create %s: %d bytes is over this store's object size limit of %d bytes: %w",
			id.Short(), size, s.maxObject, ErrTooLarge))
	}
	if s.memBytes(size, external != "") > s.capacity {
		return nil, s.fail(reasonTooLarge, fmt.Errorf("object: create %s: %d bytes > capacity %d: %w", id.Short(), size, s.capacity, ErrTooLarge))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	if old, ok := s.objs[id]; ok {
		switch {
		case old.state == stateAborted:
			// An aborted copy still pinned by a reader (a relay's region): it is
			// freed when that reader lets go; the id is free now.
			s.removeLocked(old)
		case old.state == statePending || old.freePending || old.dropped != nil:
			// Being written, or being freed once its spill ends or its last view goes
			// (dropped): Await waits for the writer, or says it is gone.
			return nil, fmt.Errorf("object: create %s: %w (%w)", id.Short(), ErrPending, ErrExists)
		default:
			return nil, fmt.Errorf("object: create %s: %w", id.Short(), ErrExists)
		}
	}
	e := &entry{id: id, size: size, fp: fp, fpOK: fpOK, owner: owner, state: statePending,
		writer: external, hashOnSeal: external != "",
		progress: make(chan struct{}), settled: make(chan struct{})}
	s.putLocked(e) // reserve the id while admitting
	m, err := s.allocLocked(ctx, id, size, external)
	if err != nil {
		s.removeLocked(e)
		e.state, e.freed = stateAborted, true
		e.settleLocked()
		return nil, fmt.Errorf("object: create %s: %w", id.Short(), err)
	}
	e.mem = m
	s.m.puts.Inc()
	s.m.bytesPut.Add(float64(size))
	return &Writer{s: s, e: e}, nil
}

// reserveLocked admits size bytes into the hot tier, dropping recycled memory and
// then spilling least-recently-used unpinned objects to make room. If pred is
// given and becomes true while making room (a slot of the wanted class was freed),
// it returns satisfied without reserving. It waits for room only until ctx's
// deadline (and not at all without one, unless spills are in flight). s.mu is
// held on entry and exit but released while spilling and waiting.
func (s *Store) reserveLocked(ctx context.Context, size int64, pred func() bool) (satisfied bool, err error) {
	for {
		if s.closed {
			return false, ErrClosed
		}
		if pred != nil && pred() {
			return true, nil
		}
		if s.used+size <= s.capacity {
			s.used += size
			return false, nil
		}
		if s.dropCachedLocked() {
			continue
		}
		if v := s.victimLocked(); v != nil {
			if err := s.spillLocked(ctx, v); err != nil {
				return false, err
			}
			continue
		}
		_, hasDeadline := ctx.Deadline()
		if !hasDeadline && s.spilling == 0 {
			return false, s.fail(reasonStoreFull, fmt.Errorf("need %d bytes, %d of %d in use and pinned: %w", size, s.used, s.capacity, ErrStoreFull))
		}
		ch := s.changedLocked()
		s.mu.Unlock()
		if s.hooks != nil && s.hooks.admitBlocked != nil {
			s.hooks.admitBlocked(size)
		}
		select {
		case <-ctx.Done():
			s.mu.Lock()
			return false, s.fail(reasonStoreFull, fmt.Errorf("need %d bytes, %d of %d in use and pinned, waited until %v: %w", size, s.used, s.capacity, ctx.Err(), ErrStoreFull))
		case <-ch:
		}
		s.mu.Lock()
	}
}
