package object

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"os"
	"path/filepath"
	"syscall"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// Memory layout of the hot tier.
//
// Large objects (over SmallMax) live one per file ("segment"), sized to a size
// class (at most 1/8 above the object). A freed segment is kept, still mapped and
// its pages still allocated, in a recycle pool and reused by the next object of
// its class: fresh shared memory
// costs a page fault and a page clear per 4 KiB, which on the machines measured here
// runs at 1-2 GB/s, ten times slower than copying into pages already there.
// Pooled bytes count against Capacity and are the first thing dropped under pressure.
//
// Small objects share slab files (SlabSize each, one size class per slab), so that a
// million small objects are not a million files and a million mappings (Linux allows
// 65530 mappings per process).
//
// Every file is mapped twice: read-write for the store to fill, read-only for the
// views it hands out (a write through a view faults). No mprotect flips, which would
// cost a write fault per page on every reuse.

type segment struct {
	path   string
	rw, ro []byte // whole mappings, class bytes
	class  int64
	// writer is the holder (another process) that has mapped the segment writable
	// (CreateFor): freed, the segment is kept for that holder's next object
	// (Store.writerPool) while it holds a lease, and dropped otherwise; it never
	// goes to another holder or back to the store's own pool.
	writer string
}

type slab struct {
	path    string
	rw, ro  []byte
	class   int64
	free    []int32
	live    int
	partial bool // in its class's partial list
}

// mem is where one object's bytes are.
type mem struct {
	seg  *segment
	slab *slab
	slot int32
	ro   []byte // read-only view (for large objects, read-only once sealed)
	rw   []byte // writable view, used only before sealing
	path string
	off  int64
}

func (m mem) none() bool { return m.seg == nil && m.slab == nil }

func roundUp(n, to int64) int64 { return (n + to - 1) / to * to }

// largeClass rounds size up to a multiple of 1/8 of its power of two (and a page).
func largeClass(size int64) int64 {
	if size <= 4096 {
		return 4096
	}
	step := int64(1) << (63 - bits.LeadingZeros64(uint64(size)) - 3)
	return roundUp(roundUp(size, step), 4096)
}

// smallClass is the slot size for a small object: a power of two, at least 64.
func smallClass(size int64) int64 {
	if size <= 64 {
		return 64
	}
	return int64(1) << (64 - bits.LeadingZeros64(uint64(size-1)))
}

func (s *Store) small(size int64) bool { return size <= s.smallMax }

// memBytes is what an object of size charges against capacity when it needs new
// memory (a new slab for small objects, unless external: see allocLocked).
func (s *Store) memBytes(size int64, external bool) int64 {
	if s.small(size) && !external {
		return s.slabSize
	}
	return largeClass(size)
}

// allocLocked finds memory for an object of size with id. It may release s.mu
// while admitting (spilling) and while creating files.
//
// With a writer, the memory is for that other process to write (CreateFor): it
// is a segment of its own, whatever the size, so that the writable mapping that
// process gets covers no other object's pages. It is one that process wrote
// before (its writer pool: no clearing, the bytes were its own, and it may still
// have it mapped, so its next put needs no new mapping), or one of the store's
// recycled segments, cleared first so that it sees no earlier object's bytes, or
// a new one. When the object is freed the segment goes back to that process's
// writer pool (while it holds a lease), never to another's.
func (s *Store) allocLocked(ctx context.Context, id ID, size int64, writer string) (mem, error) {
	external := writer != ""
	if s.small(size) && !external {
		class := smallClass(size)
		for {
			if m, ok := s.takeSlotLocked(class, size); ok {
				return m, nil
			}
			satisfied, err := s.reserveLocked(ctx, s.slabSize, func() bool { return len(s.partial[class]) > 0 })
			if err != nil {
				return mem{}, err
			}
			if satisfied {
				continue
			}
			s.slabSeq++
			path := filepath.Join(s.shmDir, fmt.Sprintf("slab-%d", s.slabSeq))
			rw, ro, err := s.mapPairLocked(ctx, path, s.slabSize)
			if err != nil {
				s.used -= s.slabSize
				s.notifyLocked()
				return mem{}, err
			}
			sl := newSlab(path, rw, ro, class)
			sl.partial = true
			s.partial[class] = append(s.partial[class], sl)
			s.slabs[sl] = struct{}{}
		}
	}
	class := largeClass(size)
	if segs := s.writerPool[writer][class]; external && len(segs) > 0 {
		seg := segs[len(segs)-1]
		s.writerPool[writer][class] = segs[:len(segs)-1]
		s.poolBytes -= class
		return mem{seg: seg, ro: seg.ro[:size], rw: seg.rw[:size], path: seg.path}, nil
	}
	if segs := s.pool[class]; len(segs) > 0 {
		seg := segs[len(segs)-1]
		s.pool[class] = segs[:len(segs)-1]
		s.poolBytes -= class
		if external {
			clear(seg.rw)
			seg.writer = writer
		}
		return mem{seg: seg, ro: seg.ro[:size], rw: seg.rw[:size], path: seg.path}, nil
	}
	if _, err := s.reserveLocked(ctx, class, nil); err != nil {
		return mem{}, err
	}
	s.segSeq++
	path := filepath.Join(s.shmDir, fmt.Sprintf("seg-%d", s.segSeq))
	rw, ro, err := s.mapPairLocked(ctx, path, class)
	if err != nil {
		s.used -= class
		s.notifyLocked()
		return mem{}, err
	}
	seg := &segment{path: path, rw: rw, ro: ro, class: class, writer: writer}
	return mem{seg: seg, ro: ro[:size], rw: rw[:size], path: path}, nil
}

// mapPair creates a shared-memory file of size bytes and maps it read-write and
// read-only.
func mapPair(path string, size int64) (rw, ro []byte, err error) {
	rw, err = createShm(path, size)
	if err != nil {
		return nil, nil, err
	}
	f, err := os.Open(path)
	if err != nil {
		_ = unmap(rw)
		_ = os.Remove(path)
		return nil, nil, fmt.Errorf("object: open %s: %w", path, err)
	}
	ro, err = unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED|unix.MAP_POPULATE)
	f.Close()
	if err != nil {
		_ = unmap(rw)
		_ = os.Remove(path)
		return nil, nil, fmt.Errorf("object: map %s read-only: %w", path, err)
	}
	return rw, ro, nil
}

// shmRetries bounds how many times an allocation that found the shared-memory
// file system full makes room in the hot tier and tries again.
const shmRetries = 8

// mapPairLocked is mapPair for memory already reserved against capacity, with
// s.mu released while the file is made. The file system can be fuller than
// the reservation says: smaller than it was at Open, or shared with other
// stores and programs. When it is (ENOSPC), room is made as admission makes it
// (recycled memory first, then spilling least-recently-used objects) and the
// allocation tried again, at most shmRetries times; then it fails with
// ErrStoreFull wrapping the last error.
func (s *Store) mapPairLocked(ctx context.Context, path string, size int64) (rw, ro []byte, err error) {
	for attempt := 1; ; attempt++ {
		s.mu.Unlock()
		if s.hooks != nil && s.hooks.mapPair != nil {
			rw, ro, err = s.hooks.mapPair(path, size)
		} else {
			rw, ro, err = mapPair(path, size)
		}
		s.mu.Lock()
		if err == nil || !errors.Is(err, syscall.ENOSPC) {
			return rw, ro, err
		}
		made := false
		if attempt <= shmRetries {
			if s.dropCachedLocked() {
				made = true
			} else if v := s.victimLocked(); v != nil {
				serr := s.spillLocked(ctx, v)
				made = serr == nil || v.freed
				if serr != nil && !v.freed {
					err = fmt.Errorf("%w; making room: %w", err, serr)
				}
			}
		}
		if !made {
			return nil, nil, s.fail(reasonStoreFull, fmt.Errorf("shared memory at %s is full after %d tries (%d of %d bytes of the hot tier in use): %w (%w)",
				s.cfg.ShmDir, attempt, s.used, s.capacity, ErrStoreFull, err))
		}
		s.m.shmRetries.Inc()
		s.log.Info("shared memory full: made room in the hot tier, allocating again", zap.Int("attempt", attempt), zap.Int64("size", size), zap.Error(err))
	}
}

func newSlab(path string, rw, ro []byte, class int64) *slab {
	size := int64(len(rw))
	n := int32(size / class)
	sl := &slab{path: path, rw: rw, ro: ro, class: class, free: make([]int32, 0, n)}
	for i := n - 1; i >= 0; i-- {
		sl.free = append(sl.free, i)
	}
	return sl
}

func (s *Store) takeSlotLocked(class, size int64) (mem, bool) {
	ps := s.partial[class]
	if len(ps) == 0 {
		return mem{}, false
	}
	sl := ps[len(ps)-1]
	i := sl.free[len(sl.free)-1]
	sl.free = sl.free[:len(sl.free)-1]
	sl.live++
	if len(sl.free) == 0 {
		sl.partial = false
		s.partial[class] = ps[:len(ps)-1]
	}
	off := int64(i) * class
	return mem{slab: sl, slot: i, ro: sl.ro[off : off+size], rw: sl.rw[off : off+size], path: sl.path, off: off}, true
}

// sealMem is where a sealed object would be write-protected; views already come
// from read-only mappings, so there is nothing to do.
func sealMem(mem) error { return nil }

// releaseMemLocked gives an object's memory back: to the recycle pool or its slab.
func (s *Store) releaseMemLocked(m mem, sealed bool) {
	switch {
	case m.seg != nil:
		seg := m.seg
		_, leased := s.leases[seg.writer]
		switch {
		case s.poolBytes+seg.class > s.recycleBytes || s.closed:
			s.dropSegmentLocked(seg)
		case seg.writer == "":
			s.pool[seg.class] = append(s.pool[seg.class], seg)
			s.poolBytes += seg.class
		case leased && sealed: // an aborted write's process may be slow, not dead, and still writing
			if s.writerPool[seg.writer] == nil {
				s.writerPool[seg.writer] = map[int64][]*segment{}
			}
			s.writerPool[seg.writer][seg.class] = append(s.writerPool[seg.writer][seg.class], seg)
			s.poolBytes += seg.class
		default:
			s.dropSegmentLocked(seg)
		}
	case m.slab != nil:
		sl := m.slab
		sl.free = append(sl.free, m.slot)
		sl.live--
		if !sl.partial {
			sl.partial = true
			s.partial[sl.class] = append(s.partial[sl.class], sl)
		}
		if sl.live == 0 && len(s.partial[sl.class]) > 1 { // keep one empty slab per class
			s.dropSlabLocked(sl)
		}
	}
	s.notifyLocked()
}

func (s *Store) dropSegmentLocked(seg *segment) {
	_ = unmap(seg.rw)
	_ = unmap(seg.ro)
	_ = os.Remove(seg.path)
	s.used -= seg.class
	if _, leased := s.leases[seg.writer]; leased {
		s.unmapped[seg.writer] = append(s.unmapped[seg.writer], seg.path)
	}
}

// forgetWriterLocked drops the segments kept for holder's next writes (it ended).
func (s *Store) forgetWriterLocked(holder string) {
	for _, segs := range s.writerPool[holder] {
		for _, seg := range segs {
			s.poolBytes -= seg.class
			s.dropSegmentLocked(seg)
		}
	}
	delete(s.writerPool, holder)
	delete(s.unmapped, holder)
}

// ForgetWriter drops the segments kept for the next writes of holder, a process that
// ended (its lease's expiry does the same), and gives their memory back.
func (s *Store) ForgetWriter(holder string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.forgetWriterLocked(holder)
	s.notifyLocked()
}

// TakeUnmapped returns, and forgets, the files of holder's segments the store dropped
// since holder last asked: a process that keeps its writable mappings for its next
// writes (CreateFor) unmaps these, so that their memory is given back.
func (s *Store) TakeUnmapped(holder string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	paths := s.unmapped[holder]
	delete(s.unmapped, holder)
	return paths
}

func (s *Store) dropSlabLocked(sl *slab) {
	ps := s.partial[sl.class]
	for i, p := range ps {
		if p == sl {
			s.partial[sl.class] = append(ps[:i], ps[i+1:]...)
			break
		}
	}
	delete(s.slabs, sl)
	_ = unmap(sl.rw)
	_ = unmap(sl.ro)
	_ = os.Remove(sl.path)
	s.used -= int64(len(sl.rw))
}

// dropCachedLocked frees one pooled segment or one empty slab; it reports whether
// it freed anything.
func (s *Store) dropCachedLocked() bool {
	for _, byClass := range s.writerPool {
		for class, segs := range byClass {
			if len(segs) > 0 {
				seg := segs[len(segs)-1]
				byClass[class] = segs[:len(segs)-1]
				s.poolBytes -= class
				s.dropSegmentLocked(seg)
				return true
			}
		}
	}
	for class, segs := range s.pool {
		if len(segs) > 0 {
			seg := segs[len(segs)-1]
			s.pool[class] = segs[:len(segs)-1]
			s.poolBytes -= class
			s.dropSegmentLocked(seg)
			return true
		}
	}
	for _, ps := range s.partial {
		for _, sl := range ps {
			if sl.live == 0 {
				s.dropSlabLocked(sl)
				return true
			}
		}
	}
	return false
}

// Mapping tells a worker process on the same machine where to map an object
// from, with MapFile: the bytes are Size bytes at Offset in the file at Path.
type Mapping struct {
	Path        string
	Offset      int64
	Size        int64
	Fingerprint uint64
}

// MapFile maps an object read-only, as a worker process on the same machine does
// with the Mapping from Store.Map. The bytes are the store's own pages: nothing is
// copied. Call the returned function to unmap; the slice must not be used after.
func MapFile(m Mapping) ([]byte, func() error, error) {
	if m.Size == 0 {
		return []byte{}, func() error { return nil }, nil
	}
	if m.Offset < 0 || m.Size < 0 {
		return nil, nil, fmt.Errorf("object: map %s: bad offset %d / size %d", m.Path, m.Offset, m.Size)
	}
	f, err := os.Open(m.Path)
	if err != nil {
		return nil, nil, fmt.Errorf("object: map %s: %w", m.Path, err)
	}
	defer f.Close()
	start := m.Offset &^ 4095
	length := m.Offset + m.Size - start
	b, err := unix.Mmap(int(f.Fd()), start, int(length), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, nil, fmt.Errorf("object: mmap %s [%d,+%d): %w", m.Path, m.Offset, m.Size, err)
	}
	return b[m.Offset-start:], func() error { return unix.Munmap(b) }, nil
}

// MapFileRW maps the writable range of an object being created for another
// process (Writer.Mapping), in that process: the bytes written through it are
// the store's own shared memory, so the object needs no copy. Call the returned
// function to unmap, before asking the store's owner to seal the object; the
// slice must not be used after. See Store.CreateFor for who owns what.
func MapFileRW(m Mapping) ([]byte, func() error, error) {
	if m.Size == 0 {
		return []byte{}, func() error { return nil }, nil
	}
	if m.Offset < 0 || m.Size < 0 || m.Offset%4096 != 0 {
		return nil, nil, fmt.Errorf("object: map %s writable: bad offset %d / size %d", m.Path, m.Offset, m.Size)
	}
	f, err := os.OpenFile(m.Path, os.O_RDWR, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("object: map %s writable: %w", m.Path, err)
	}
	defer f.Close()
	// MAP_POPULATE: the pages are mapped (and, for a fresh segment, allocated) in one
	// call rather than faulted in one by one while the caller writes.
	b, err := unix.Mmap(int(f.Fd()), m.Offset, int(m.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return nil, nil, fmt.Errorf("object: mmap %s [%d,+%d) writable: %w", m.Path, m.Offset, m.Size, err)
	}
	return b, func() error { return unix.Munmap(b) }, nil
}

// WritableFile is a whole shared-memory segment file that another process (a worker)
// mapped writable for its puts (CreateFor) and keeps mapped for its next ones: the store
// keeps a freed segment for the process that wrote it, so a process that puts objects of
// the same sizes again and again (checkpoints) maps each segment once. It unmaps a file
// when the store says it dropped it (TakeUnmapped), and all of them when it exits.
type WritableFile struct {
	b        []byte
	dev, ino uint64
}

// MapWritable maps the whole file at path writable (its pages populated in one call).
func MapWritable(path string) (*WritableFile, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("object: map %s writable: %w", path, err)
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, fmt.Errorf("object: map %s writable: %w", path, err)
	}
	if st.Size == 0 {
		return &WritableFile{b: []byte{}, dev: uint64(st.Dev), ino: st.Ino}, nil
	}
	b, err := unix.Mmap(int(f.Fd()), 0, int(st.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("object: mmap %s (%d bytes) writable: %w", path, st.Size, err)
	}
	return &WritableFile{b: b, dev: uint64(st.Dev), ino: st.Ino}, nil
}

// Range returns the writable bytes of m, which must be in this file, or false when
// they are not (the file at m.Path is another one now, or smaller).
func (w *WritableFile) Range(m Mapping) ([]byte, bool) {
	var st unix.Stat_t
	if err := unix.Stat(m.Path, &st); err != nil || uint64(st.Dev) != w.dev || st.Ino != w.ino {
		return nil, false
	}
	if m.Offset < 0 || m.Size < 0 || m.Offset+m.Size > int64(len(w.b)) {
		return nil, false
	}
	return w.b[m.Offset : m.Offset+m.Size], true
}

// Close unmaps the file.
func (w *WritableFile) Close() error {
	if len(w.b) == 0 {
		return nil
	}
	b := w.b
	w.b = nil
	return unix.Munmap(b)
}
