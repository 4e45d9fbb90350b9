// Tiers: moving objects between the hot tier (shared memory) and the cold tier
// (zstd-compressed spill files), least-recently-used first.

package object

import (
	"context"
	"errors"
	"fmt"
	"io"
	"syscall"

	"github.com/cespare/xxhash/v2"
	"github.com/klauspost/compress/zstd"
)

func (s *Store) victimLocked() *entry {
	for el := s.lru.Back(); el != nil; el = el.Prev() {
		e := el.Value.(*entry)
		if e.state == stateHot && !e.pinned() && !e.spilling {
			return e
		}
	}
	return nil
}

// spillLocked moves e to the cold tier. s.mu is released during the disk write.
// If e's last holder let it go meanwhile, e is freed (its location removed from
// the directory under ctx) whatever the write did: room was made either way.
func (s *Store) spillLocked(ctx context.Context, e *entry) error {
	if !e.spilled && !e.durable { // a durable object's file is its cold copy already
		e.spilling = true
		s.spilling++
		data, fp, fpOK := e.mem.ro, e.fp, e.fpOK
		s.mu.Unlock()
		if !fpOK {
			fp = xxhash.Sum64(data)
		}
		err := s.writeSpill(spillHeader{id: e.id, size: e.size, fp: fp, owner: e.owner}, data)
		s.mu.Lock()
		if !fpOK {
			e.fp, e.fpOK = fp, true
		}
		e.spilling = false
		s.spilling--
		s.notifyLocked()
		if err == nil {
			e.spilled = true
			s.m.spills.Inc()
			s.m.bytesSpilled.Add(float64(e.size))
		}
		if e.freePending {
			freed := s.finishFreeLocked(e, nil) // removes the file just written, if any
			s.mu.Unlock()
			s.forget(ctx, freed)
			s.mu.Lock()
			return nil
		}
		if err != nil {
			if errors.Is(err, syscall.ENOSPC) || errors.Is(err, ErrDiskFull) {
				return s.fail(reasonDiskFull, fmt.Errorf("spill %s (%d bytes): %v: %w", e.id.Short(), e.size, err, ErrDiskFull))
			}
			return fmt.Errorf("spill %s: %w", e.id.Short(), err)
		}
		if e.pinned() { // someone got it while we wrote; it stays hot, the file stays valid
			return nil
		}
	}
	s.releaseMemLocked(e.mem, true)
	e.mem = mem{}
	s.setStateLocked(e, stateCold)
	s.lru.Remove(e.lru)
	e.lru = nil
	s.notifyLocked()
	return nil
}

func (s *Store) writeSpill(h spillHeader, data []byte) error {
	name := spillName(h.id)
	tmp := name + tmpSuffix
	f, err := s.spill.Create(tmp)
	if err != nil {
		return err
	}
	err = func() error {
		if _, err := f.Write(h.marshal()); err != nil {
			return err
		}
		enc, err := zstd.NewWriter(f, zstd.WithEncoderLevel(s.level))
		if err != nil {
			return err
		}
		if _, err := enc.Write(data); err != nil {
			enc.Close()
			return err
		}
		return enc.Close()
	}()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = s.spill.Remove(tmp)
		return err
	}
	return s.spill.Rename(tmp, name)
}

// ensureHotLocked restores a cold object (the caller has pinned it).
func (s *Store) ensureHotLocked(ctx context.Context, e *entry) error {
	for e.state == stateCold {
		if e.restoring != nil {
			ch := e.restoring
			s.mu.Unlock()
			select {
			case <-ctx.Done():
				s.mu.Lock()
				return fmt.Errorf("object: restore %s: %w", e.id.Short(), ctx.Err())
			case <-ch:
			}
			s.mu.Lock()
			continue
		}
		ch := make(chan struct{})
		e.restoring = ch
		m, err := s.allocLocked(ctx, e.id, e.size, "")
		if err == nil {
			s.mu.Unlock()
			err = s.readCold(e, m)
			s.mu.Lock()
			if err != nil {
				s.releaseMemLocked(m, false)
			} else {
				e.mem = m
				s.setStateLocked(e, stateHot)
				e.lru = s.lru.PushFront(e)
				s.m.restores.Inc()
			}
		}
		e.restoring = nil
		close(ch)
		if err != nil {
			return fmt.Errorf("object: restore %s: %w", e.id.Short(), err)
		}
	}
	return nil
}

// readCold reads e's cold copy into m: its durable file when it has one, else
// its spill file; either way the bytes are checked against e's fingerprint.
func (s *Store) readCold(e *entry, m mem) error {
	if !e.durable {
		return s.readSpill(e, m)
	}
	h, err := s.durable.readInto(e.id, m.rw)
	if err == nil && h.fp != e.fp {
		err = fmt.Errorf("checksum %x, want %x", h.fp, e.fp)
	}
	if err != nil {
		return s.fail(reasonLost, fmt.Errorf("durable file: %v: %w", err, ErrLost))
	}
	return sealMem(m)
}

// verifySpill decompresses e's spill file, without keeping its bytes, and
// checks them against e's fingerprint.
func (s *Store) verifySpill(e *entry) error {
	r, err := s.spill.Open(spillName(e.id))
	if err != nil {
		return fmt.Errorf("open spill: %w", err)
	}
	defer r.Close()
	if _, err := readSpillHeader(r); err != nil {
		return fmt.Errorf("spill file: %w", err)
	}
	dec, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1))
	if err != nil {
		return fmt.Errorf("spill file: %w", err)
	}
	defer dec.Close()
	d := xxhash.New()
	n, err := io.Copy(d, dec)
	if err != nil {
		return fmt.Errorf("spill file: %w", err)
	}
	if n != e.size || d.Sum64() != e.fp {
		return fmt.Errorf("spill file: %d bytes of checksum %x, want %d of %x", n, d.Sum64(), e.size, e.fp)
	}
	return nil
}

// readSpill decompresses e's spill file into m and checks the fingerprint.
func (s *Store) readSpill(e *entry, m mem) error {
	r, err := s.spill.Open(spillName(e.id))
	if err != nil {
		return s.fail(reasonLost, fmt.Errorf("open spill: %v: %w", err, ErrLost))
	}
	defer r.Close()
	if _, err := readSpillHeader(r); err != nil {
		return s.fail(reasonLost, fmt.Errorf("spill file: %v: %w", err, ErrLost))
	}
	dec, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1))
	if err != nil {
		return s.fail(reasonLost, fmt.Errorf("spill file: %v: %w", err, ErrLost))
	}
	defer dec.Close()
	if _, err := io.ReadFull(dec, m.rw); err != nil {
		return s.fail(reasonLost, fmt.Errorf("spill file: %v: %w", err, ErrLost))
	}
	if got := xxhash.Sum64(m.rw); got != e.fp {
		return s.fail(reasonLost, fmt.Errorf("spill file: fingerprint %x, want %x: %w", got, e.fp, ErrLost))
	}
	return sealMem(m)
}
