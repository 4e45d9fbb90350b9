package object

import (
	"container/list"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/klauspost/compress/zstd"
	"go.uber.org/zap"
)

type state int

const (
	statePending state = iota // being written (Create), visible only to OpenRegion
	stateHot                  // sealed, mapped in shared memory
	stateCold                 // sealed, only in the spill file
	stateAborted              // Create aborted; freed once no region pins it
)

type entry struct {
	id    ID
	size  int64
	fp    uint64
	owner string
	state state
	mem   mem  // where the bytes are while hot or pending
	fpOK  bool // fp is known (computed lazily for puts unless FingerprintOnPut)

	chunkFP map[[2]int64]uint64 // fingerprints of served chunks: {off, len} -> xxhash64

	refs  map[string]int // logical references by holder
	maps  map[string]int // external (worker-process) mappings by holder
	views int            // in-process views and regions

	spilling    bool
	spilled     bool // a complete spill file exists
	freePending bool // free once the in-flight spill finishes
	restoring   chan struct{}
	lru         *list.Element

	// progress of a pending object, for relays serving it before it is sealed.
	ready    int64
	done     map[int64]int64 // out-of-order completed ranges: start -> end
	progress chan struct{}   // closed and replaced when ready advances or state changes
	settled  chan struct{}   // closed once a pending object is sealed or aborted
}

// settleLocked closes e.settled (once): the object left the pending state.
func (e *entry) settleLocked() {
	if e.settled == nil {
		return
	}
	select {
	case <-e.settled:
	default:
		close(e.settled)
	}
}

func (e *entry) refTotal() int {
	n := 0
	for _, c := range e.refs {
		n += c
	}
	return n
}

func (e *entry) pinned() bool { return e.views > 0 || len(e.maps) > 0 }

// Store is one machine's object store. It is safe for concurrent use.
type Store struct {
	cfg       Config
	log       *zap.Logger
	m         *metrics
	capacity  int64
	shmDir    string
	spill     SpillFS
	directory Directory
	level     zstd.EncoderLevel
	smallMax  int64
	slabSize  int64

	recycleBytes int64

	mu       sync.Mutex
	objs     map[ID]*entry
	used     int64
	lru      *list.List    // of *entry, front = most recently used; hot sealed entries only
	changed  chan struct{} // nil unless someone waits; see notifyLocked
	spilling int
	leases   map[string]time.Time
	lost     []ID
	closed   bool
	closing  chan struct{} // closed by Close: stops lease reapers

	pool      map[int64][]*segment // recycled large segments by class
	poolBytes int64
	partial   map[int64][]*slab // slabs with free slots by class
	slabs     map[*slab]struct{}
	slabSeq   uint64
	segSeq    uint64
}

// Stats is a snapshot of the store's occupancy.
type Stats struct {
	Objects     int
	HotObjects  int
	ColdObjects int
	HotBytes    int64 // shared memory charged against Capacity, recycled memory included
	Recycled    int64 // freed large-object memory kept for reuse
	Capacity    int64
}

// Open opens the store whose state lives under dir (spill files in dir/spill unless
// cfg.Spill is set). Hot objects are files in a subdirectory of cfg.ShmDir named
// after dir, so reopening the same dir finds the same place. Objects spilled by a
// previous instance are found again (owned by their recorded owner, one reference);
// shared-memory leftovers and unreadable spill files are removed and reported by Lost.
func Open(cfg Config, dir string) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("object: open %s: %w", dir, err)
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.Directory == nil {
		cfg.Directory = NewMemDirectory()
	}
	if cfg.Spill == nil {
		sd := filepath.Join(abs, "spill")
		if err := os.MkdirAll(sd, 0o700); err != nil {
			return nil, fmt.Errorf("object: open %s: %w", dir, err)
		}
		cfg.Spill = DirFS{Dir: sd}
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("object: open %s: register metrics: %w", dir, err)
	}
	capacity := cfg.Capacity
	if capacity == 0 {
		capacity = int64(float64(ramBytes()) * cfg.CapacityShare)
	}
	sum := sha256.Sum256([]byte(abs))
	_, level := zstd.EncoderLevelFromString(cfg.SpillCompression)
	if cfg.SpillCompression == "" {
		level = zstd.SpeedFastest
	}
	s := &Store{
		cfg: cfg, log: cfg.Logger.Named("object"), m: m, capacity: capacity,
		shmDir:    filepath.Join(cfg.ShmDir, "atoll-"+hex.EncodeToString(sum[:8])),
		spill:     cfg.Spill,
		directory: cfg.Directory,
		objs:      make(map[ID]*entry),
		lru:       list.New(),
		closing:   make(chan struct{}),
		leases:    make(map[string]time.Time),
		level:     level,
		pool:      make(map[int64][]*segment),
		partial:   make(map[int64][]*slab),
		slabs:     make(map[*slab]struct{}),
	}
	s.slabSize = cfg.SlabSize
	if s.slabSize == 0 {
		s.slabSize = min(4<<20, max(64<<10, roundUp(capacity/16, 4096)))
	}
	s.smallMax = cfg.SmallMax
	if s.smallMax == 0 {
		s.smallMax = min(64<<10, s.slabSize/4)
	}
	s.recycleBytes = cfg.RecycleBytes
	if s.recycleBytes == 0 {
		s.recycleBytes = capacity
	}
	if s.smallMax > s.slabSize || s.slabSize > capacity {
		return nil, fmt.Errorf("object: open %s: SmallMax %d <= SlabSize %d <= capacity %d does not hold", dir, s.smallMax, s.slabSize, capacity)
	}
	if err := s.recover(); err != nil {
		return nil, err
	}
	return s, nil
}

// recover cleans the shm directory of a previous instance and finds spill files.
func (s *Store) recover() error {
	if es, err := os.ReadDir(s.shmDir); err == nil {
		// Objects that were only in shared memory are gone with the process that
		// owned them; the directory still names this location for them.
		s.log.Info("removing shared memory of a previous instance", zap.String("dir", s.shmDir), zap.Int("files", len(es)))
	}
	if err := os.RemoveAll(s.shmDir); err != nil {
		return fmt.Errorf("object: open: clean %s: %w", s.shmDir, err)
	}
	if err := os.MkdirAll(s.shmDir, 0o700); err != nil {
		return fmt.Errorf("object: open: %w", err)
	}
	names, err := s.spill.List()
	if err != nil {
		return fmt.Errorf("object: open: list spill files: %w", err)
	}
	for _, n := range names {
		id, ok := isSpillName(n)
		if !ok {
			_ = s.spill.Remove(n) // temp files of an interrupted spill
			continue
		}
		h, err := s.readHeader(n)
		if err != nil || h.id != id {
			s.log.Warn("spill file unreadable, object lost", zap.String("file", n), zap.Error(err))
			s.lost = append(s.lost, id)
			s.m.errors.WithLabelValues(reasonLost).Inc()
			_ = s.spill.Remove(n)
			continue
		}
		e := &entry{id: id, size: h.size, fp: h.fp, fpOK: true, owner: h.owner, state: stateCold, spilled: true,
			refs: map[string]int{h.owner: 1}, progress: make(chan struct{})}
		s.objs[id] = e
		if err := s.directory.Register(context.Background(), Meta{ID: id, Size: h.size, Fingerprint: h.fp,
			Owner: h.owner, Locations: []string{s.cfg.Location}, Refs: 1}); err != nil {
			s.log.Warn("directory register of recovered object failed", zap.Stringer("id", id), zap.Error(err))
		}
	}
	return nil
}

func (s *Store) readHeader(name string) (spillHeader, error) {
	r, err := s.spill.Open(name)
	if err != nil {
		return spillHeader{}, err
	}
	defer r.Close()
	return readSpillHeader(r)
}

// Lost returns the ids a previous instance held that could not be recovered.
func (s *Store) Lost() []ID {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]ID(nil), s.lost...)
}

// Capacity returns the hot tier's capacity in bytes.
func (s *Store) Capacity() int64 { return s.capacity }

// Location returns the transfer address this store registers objects under.
func (s *Store) Location() string { return s.cfg.Location }

// Directory returns the metadata directory the store writes through.
func (s *Store) Directory() Directory { return s.directory }

// Stats returns a snapshot of occupancy.
func (s *Store) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := Stats{Objects: len(s.objs), HotBytes: s.used, Recycled: s.poolBytes, Capacity: s.capacity}
	for _, e := range s.objs {
		switch e.state {
		case stateHot:
			st.HotObjects++
		case stateCold:
			st.ColdObjects++
		}
	}
	return st
}

// notifyLocked wakes everyone waiting for a change (room freed, a pin dropped,
// the store closing). The channel exists only while someone waits, so the hot
// paths (a view's release) pay nothing when nobody does.
func (s *Store) notifyLocked() {
	if s.changed != nil {
		close(s.changed)
		s.changed = nil
	}
}

// changedLocked returns a channel closed at the next notifyLocked.
func (s *Store) changedLocked() <-chan struct{} {
	if s.changed == nil {
		s.changed = make(chan struct{})
	}
	return s.changed
}

func (s *Store) fail(reason string, err error) error {
	s.m.errors.WithLabelValues(reason).Inc()
	return err
}

// Put stores a copy of b under a new random id owned by owner (one reference).
func (s *Store) Put(ctx context.Context, owner string, b []byte) (ID, error) {
	id := NewID()
	return id, s.PutID(ctx, owner, id, b)
}

// PutID stores a copy of b under id (for example ContentID(b)), owned by owner.
func (s *Store) PutID(ctx context.Context, owner string, id ID, b []byte) error {
	w, err := s.create(ctx, owner, id, int64(len(b)), 0, false)
	if err != nil {
		return err
	}
	if s.cfg.FingerprintOnPut {
		w.e.fp, w.e.fpOK = copyHash(w.e.mem.rw, b), true
	} else {
		copy(w.e.mem.rw, b)
	}
	return w.seal(ctx, false)
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
	return s.create(ctx, owner, id, size, fp, true)
}

func (s *Store) create(ctx context.Context, owner string, id ID, size int64, fp uint64, fpOK bool) (*Writer, error) {
	if size < 0 {
		return nil, fmt.Errorf("object: create %s: negative size %d", id.Short(), size)
	}
	if s.memBytes(size) > s.capacity {
		return nil, s.fail(reasonTooLarge, fmt.Errorf("object: create %s: %d bytes > capacity %d: %w", id.Short(), size, s.capacity, ErrTooLarge))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	if old, ok := s.objs[id]; ok {
		if old.state == statePending {
			return nil, fmt.Errorf("object: create %s: %w (%w)", id.Short(), ErrPending, ErrExists)
		}
		return nil, fmt.Errorf("object: create %s: %w", id.Short(), ErrExists)
	}
	e := &entry{id: id, size: size, fp: fp, fpOK: fpOK, owner: owner, state: statePending,
		progress: make(chan struct{}), settled: make(chan struct{})}
	s.objs[id] = e // reserve the id while admitting
	m, err := s.allocLocked(ctx, id, size)
	if err != nil {
		delete(s.objs, id)
		e.state = stateAborted
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
			if err := s.spillLocked(v); err != nil {
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
		select {
		case <-ctx.Done():
			s.mu.Lock()
			return false, s.fail(reasonStoreFull, fmt.Errorf("need %d bytes, %d of %d in use and pinned, waited until %v: %w", size, s.used, s.capacity, ctx.Err(), ErrStoreFull))
		case <-ch:
		}
		s.mu.Lock()
	}
}

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
func (s *Store) spillLocked(e *entry) error {
	if !e.spilled {
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
		if err != nil {
			var free []ID
			if e.freePending {
				free = s.finishFreeLocked(e, free)
				_ = free // directory cleanup is best effort here
			}
			if errors.Is(err, syscall.ENOSPC) || errors.Is(err, ErrDiskFull) {
				return s.fail(reasonDiskFull, fmt.Errorf("spill %s (%d bytes): %v: %w", e.id.Short(), e.size, err, ErrDiskFull))
			}
			return fmt.Errorf("spill %s: %w", e.id.Short(), err)
		}
		e.spilled = true
		s.m.spills.Inc()
		s.m.bytesSpilled.Add(float64(e.size))
		if e.freePending {
			s.finishFreeLocked(e, nil)
			return nil
		}
		if e.pinned() { // someone got it while we wrote; it stays hot, the file stays valid
			return nil
		}
	}
	s.releaseMemLocked(e.mem, true)
	e.mem = mem{}
	e.state = stateCold
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
		m, err := s.allocLocked(ctx, e.id, e.size)
		if err == nil {
			s.mu.Unlock()
			err = s.readSpill(e, m)
			s.mu.Lock()
			if err != nil {
				s.releaseMemLocked(m, false)
			} else {
				e.mem = m
				e.state = stateHot
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

// Fingerprint returns the object's xxhash64 (computed now if it was not yet).
func (v *View) Fingerprint() uint64 { return v.s.fingerprint(v.e) }

// fingerprint returns e's fingerprint, computing it on first use. The caller has
// pinned e.
func (s *Store) fingerprint(e *entry) uint64 {
	s.mu.Lock()
	fp, ok, data := e.fp, e.fpOK, e.mem.ro
	s.mu.Unlock()
	if ok {
		return fp
	}
	fp = xxhash.Sum64(data)
	s.mu.Lock()
	e.fp, e.fpOK = fp, true
	s.mu.Unlock()
	if err := s.directory.Register(context.Background(), Meta{ID: e.id, Size: e.size, Fingerprint: fp, Owner: e.owner,
		Locations: []string{s.cfg.Location}}); err != nil {
		s.log.Warn("directory register fingerprint", zap.Stringer("id", e.id), zap.Error(err))
	}
	return fp
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
	s.forget(freed)
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
	e.views++
	if err := s.ensureHotLocked(ctx, e); err != nil {
		e.views--
		lostNow := errors.Is(err, ErrLost)
		var freed []ID
		if lostNow { // the bytes are gone: drop the entry so nobody waits on it again
			freed = s.finishFreeLocked(e, nil)
		}
		s.mu.Unlock()
		s.forget(freed)
		return nil, err
	}
	if e.lru != nil {
		s.lru.MoveToFront(e.lru)
	}
	s.mu.Unlock()
	s.m.gets.Inc()
	return &View{s: s, e: e}, nil
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
		if !ok || e.state == stateAborted || e.freePending {
			s.mu.Unlock()
			return fmt.Errorf("object: await %s: %w", id.Short(), ErrNotFound)
		}
		ch := e.settled
		settled := ch == nil
		if !settled {
			select {
			case <-ch:
				settled = true
			default:
			}
		}
		if settled && (e.state == stateHot || e.state == stateCold) {
			if holder == "" {
				s.mu.Unlock()
				return nil
			}
			if e.refs == nil {
				e.refs = map[string]int{}
			}
			e.refs[holder]++
			n := e.refTotal()
			s.mu.Unlock()
			return s.directory.SetRefs(ctx, id, int64(n))
		}
		closed := s.changedLocked()
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			return fmt.Errorf("object: await %s: %w", id.Short(), ctx.Err())
		case <-ch:
		case <-closed: // store closing, or another change; look again
		}
	}
}

// AddRef adds a logical reference held by holder.
func (s *Store) AddRef(ctx context.Context, id ID, holder string) error {
	s.mu.Lock()
	e, ok := s.objs[id]
	if !ok || e.state == statePending || e.state == stateAborted || e.freePending {
		s.mu.Unlock()
		return s.fail(reasonNotFound, fmt.Errorf("object: add ref %s: %w", id.Short(), ErrNotFound))
	}
	if e.refs == nil {
		e.refs = map[string]int{}
	}
	e.refs[holder]++
	n := e.refTotal()
	s.mu.Unlock()
	return s.directory.SetRefs(ctx, id, int64(n))
}

// Release drops one logical reference of holder. When no reference, view or
// mapping remains, the object is freed: its shared memory, its spill file and its
// location in the directory.
func (s *Store) Release(ctx context.Context, id ID, holder string) error {
	s.mu.Lock()
	e, ok := s.objs[id]
	if !ok {
		s.mu.Unlock()
		return s.fail(reasonNotFound, fmt.Errorf("object: release %s: %w", id.Short(), ErrNotFound))
	}
	if e.refs[holder] == 0 {
		s.mu.Unlock()
		return fmt.Errorf("object: release %s by %q: %w", id.Short(), holder, ErrNotHolder)
	}
	e.refs[holder]--
	if e.refs[holder] == 0 {
		delete(e.refs, holder)
	}
	n := e.refTotal()
	freed := s.maybeFreeLocked(e)
	s.mu.Unlock()
	s.forget(freed)
	if len(freed) == 0 {
		return s.directory.SetRefs(ctx, id, int64(n))
	}
	return nil
}

// Map pins id for holder (a worker process) and returns where to map it. The pin
// lasts until Unmap, or until holder's lease expires (see Renew).
func (s *Store) Map(ctx context.Context, id ID, holder string) (Mapping, error) {
	s.mu.Lock()
	e, ok := s.objs[id]
	if !ok || e.state == statePending || e.state == stateAborted || e.freePending {
		s.mu.Unlock()
		return Mapping{}, s.fail(reasonNotFound, fmt.Errorf("object: map %s: %w", id.Short(), ErrNotFound))
	}
	if e.maps == nil {
		e.maps = map[string]int{}
	}
	e.maps[holder]++
	if err := s.ensureHotLocked(ctx, e); err != nil {
		s.dropMapLocked(e, holder)
		s.mu.Unlock()
		return Mapping{}, err
	}
	m := Mapping{Path: e.mem.path, Offset: e.mem.off, Size: e.size}
	s.mu.Unlock()
	m.Fingerprint = s.fingerprint(e)
	return m, nil
}

func (s *Store) dropMapLocked(e *entry, holder string) {
	e.maps[holder]--
	if e.maps[holder] <= 0 {
		delete(e.maps, holder)
	}
}

// Unmap drops one mapping pin of holder.
func (s *Store) Unmap(id ID, holder string) error {
	s.mu.Lock()
	e, ok := s.objs[id]
	if !ok || e.maps[holder] == 0 {
		s.mu.Unlock()
		return fmt.Errorf("object: unmap %s by %q: %w", id.Short(), holder, ErrNotHolder)
	}
	s.dropMapLocked(e, holder)
	freed := s.maybeFreeLocked(e)
	s.notifyLocked()
	s.mu.Unlock()
	s.forget(freed)
	return nil
}

// Renew gives holder a lease of LeaseTTL from now. A holder with a lease that
// expires (a worker process that died) loses all its references and mappings at
// the next ExpireLeases. Holders that never call Renew have no lease.
func (s *Store) Renew(holder string) {
	s.mu.Lock()
	s.leases[holder] = s.cfg.Clock().Add(s.cfg.LeaseTTL)
	s.mu.Unlock()
}

// ExpireLeases releases every reference and mapping of holders whose lease ended
// before now, freeing what that leaves unreferenced. It returns the holders expired.
// The agent calls it periodically.
func (s *Store) ExpireLeases(now time.Time) []string {
	s.mu.Lock()
	var expired []string
	for h, t := range s.leases {
		if now.After(t) {
			expired = append(expired, h)
			delete(s.leases, h)
		}
	}
	var freed []ID
	for _, h := range expired {
		s.m.errors.WithLabelValues(reasonLeaseExpiry).Inc()
		for _, e := range s.objs {
			_, r := e.refs[h]
			_, m := e.maps[h]
			if !r && !m {
				continue
			}
			delete(e.refs, h)
			delete(e.maps, h)
			freed = append(freed, s.maybeFreeLocked(e)...)
		}
	}
	if len(expired) > 0 {
		s.notifyLocked()
	}
	s.mu.Unlock()
	s.forget(freed)
	return expired
}

// StartLeaseReaper calls ExpireLeases(Clock()) every interval in a goroutine, so
// that holders which Renew and then die (a worker process, an actor) lose their
// references and mappings without anyone having to remember to expire them. It
// runs until ctx ends, the returned stop is called, or the store closes; stop
// waits for the goroutine to finish and may be called more than once. The time
// compared against leases is the store's Clock, so tests drive expiry with an
// injected clock; interval only sets how often it looks (at most LeaseTTL/2 is
// sensible). A non-positive interval uses LeaseTTL/4.
func (s *Store) StartLeaseReaper(ctx context.Context, interval time.Duration) (stop func()) {
	if interval <= 0 {
		interval = max(s.cfg.LeaseTTL/4, time.Millisecond)
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-s.closing:
				return
			case <-t.C:
				if exp := s.ExpireLeases(s.cfg.Clock()); len(exp) > 0 {
					s.log.Info("leases expired, references released", zap.Strings("holders", exp))
				}
			}
		}
	}()
	return func() { cancel(); <-done }
}

// maybeFreeLocked frees e if nothing references it; it returns the freed ids.
func (s *Store) maybeFreeLocked(e *entry) []ID {
	if e.state == stateAborted {
		if e.views == 0 {
			return s.finishFreeLocked(e, nil)
		}
		return nil
	}
	if e.state == statePending || e.refTotal() > 0 || e.pinned() || e.restoring != nil {
		return nil
	}
	if e.spilling {
		e.freePending = true
		return nil
	}
	return s.finishFreeLocked(e, nil)
}

func (s *Store) finishFreeLocked(e *entry, freed []ID) []ID {
	if s.objs[e.id] != e {
		return freed
	}
	if !e.mem.none() {
		s.releaseMemLocked(e.mem, e.state == stateHot)
		e.mem = mem{}
	}
	if e.spilled {
		if err := s.spill.Remove(spillName(e.id)); err != nil {
			s.log.Warn("remove spill file failed", zap.Stringer("id", e.id), zap.Error(err))
		}
	}
	if e.lru != nil {
		s.lru.Remove(e.lru)
		e.lru = nil
	}
	wasSealed := e.state == stateHot || e.state == stateCold
	e.state = stateAborted
	close(e.progress)
	e.progress = make(chan struct{})
	delete(s.objs, e.id)
	s.notifyLocked()
	s.m.frees.Inc()
	if wasSealed {
		freed = append(freed, e.id)
	}
	return freed
}

// forget removes this store's location for freed ids from the directory.
func (s *Store) forget(ids []ID) {
	for _, id := range ids {
		if err := s.directory.RemoveLocation(context.Background(), id, s.cfg.Location); err != nil {
			s.log.Debug("directory remove location", zap.Stringer("id", id), zap.Error(err))
		}
	}
}

// Contains reports whether id is sealed in this store (hot or cold).
func (s *Store) Contains(id ID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.objs[id]
	return ok && (e.state == stateHot || e.state == stateCold) && !e.freePending
}

// Close unmaps hot objects and removes their shared memory; spill files stay for the
// next Open. Memory under outstanding views is left mapped (returned at process exit).
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	close(s.closing)
	busy := map[*slab]bool{}
	for _, e := range s.objs {
		if e.views > 0 && e.mem.slab != nil {
			busy[e.mem.slab] = true
		}
		if e.views == 0 && e.mem.seg != nil {
			_ = unmap(e.mem.seg.rw)
			_ = unmap(e.mem.seg.ro)
		}
		e.mem = mem{}
	}
	for _, segs := range s.pool {
		for _, seg := range segs {
			_ = unmap(seg.rw)
			_ = unmap(seg.ro)
		}
	}
	s.pool = nil
	for sl := range s.slabs {
		if !busy[sl] {
			_ = unmap(sl.rw)
			_ = unmap(sl.ro)
		}
	}
	s.slabs = nil
	s.notifyLocked()
	return os.RemoveAll(s.shmDir)
}
