// The Store: its entries' states, Open, occupancy, Close. The other concerns
// live beside it: put.go (admission and put), tiers.go (hot and cold tiers,
// spilling and restoring), refs.go (references, mappings, freeing), lease.go
// (leases of holders), view.go (zero-copy views and gets), writer.go (objects
// written in place, Await), region.go (serving to the transfer plane),
// recover.go (what Open finds of a previous instance), alloc.go and shm.go
// (shared-memory layout), spillfs.go and spillfile.go (the cold tier's files).

package object

import (
	"container/list"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/klauspost/compress/zstd"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
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
	spilled     bool          // a complete spill file exists
	durable     bool          // a complete durable file exists (Persist): it is the cold copy
	persisting  chan struct{} // closed when a Persist in progress ends
	dropped     error         // Drop: gets are refused with this cause; freed once unpinned
	freePending bool          // free once the in-flight spill finishes
	freed       bool          // finishFreeLocked ran: memory and spill file given back
	sealing     bool          // Writer.Seal in progress
	hashOnSeal  bool          // written by another process (CreateFor): Seal computes fp with FingerprintOnPut
	writer      string        // the holder writing it from another process (CreateFor), while pending
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

// wakeLocked wakes whoever waits on e's progress (relays reading a pending
// object, Region.WaitReady).
func (e *entry) wakeLocked() {
	close(e.progress)
	e.progress = make(chan struct{})
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
	maxObject    int64

	mu   sync.Mutex
	objs map[ID]*entry
	// owned indexes objs by owner (Owned: a worker's end must not go over every object
	// of the machine). Kept by putLocked and removeLocked.
	owned    map[string]map[ID]*entry
	used     int64
	tally    tally         // Stats' counts, kept by putLocked, removeLocked and updateLocked
	lru      *list.List    // of *entry, front = most recently used; hot sealed entries only
	changed  chan struct{} // nil unless someone waits; see notifyLocked
	spilling int
	leases   map[string]time.Time
	lost     []ID
	adopted  []Meta
	durable  durableDir
	closed   bool
	closing  chan struct{} // closed by Close: stops lease reapers

	// life ends at Close. Directory writes made on nobody's behalf (a view's
	// release freeing an object, lease expiry, recovery) run under it, bounded
	// by Config.DirectoryTimeout.
	life     context.Context
	stopLife context.CancelFunc
	hooks    *hooks
	home     *shmHome // the locked shared-memory directory (shmDir)
	dirLock  *os.File // the store directory's marker, locked while open

	pool map[int64][]*segment // recycled large segments by class
	// writerPool: freed segments that another process mapped writable (CreateFor),
	// by that process and class, kept for its next writes (see allocLocked); counted
	// in poolBytes and dropped first under pressure.
	writerPool map[string]map[int64][]*segment
	// unmapped: by writer, its segments' files dropped since it last asked
	// (TakeUnmapped).
	unmapped  map[string][]string
	poolBytes int64
	partial   map[int64][]*slab // slabs with free slots by class
	slabs     map[*slab]struct{}
	slabSeq   uint64
	segSeq    uint64
}

// Stats is a snapshot of the store's occupancy.
type Stats struct {
	Objects        int
	HotObjects     int
	ColdObjects    int
	ColdBytes      int64 // bytes of the objects only in their spill or durable files
	DurableObjects int   // objects with a durable copy here (Persist)
	DurableBytes   int64
	HotBytes       int64 // shared memory charged against Capacity, recycled memory included
	Recycled       int64 // freed large-object memory kept for reuse
	Capacity       int64
}

// Open opens the store whose state lives under dir (spill files in dir/spill unless
// cfg.Spill is set).
//
// dir must not exist, be empty, or be a store directory (one that holds the
// marker file Open writes, ATOLL_OBJECT_STORE): a directory holding anything
// else is refused with ErrNotStoreDir, so that a wrong path can never make the
// store treat someone's files as its own. While the store is open the marker is
// locked: a second Open of the same dir fails with ErrDirInUse.
//
// Hot objects are files in a fresh directory under cfg.ShmDir that names its
// owner and stays locked while this store lives; Open first reclaims the
// shared memory of stores whose processes died (see Reclaim). If the shared
// memory file system has less room free than the capacity asks for, the hot
// tier is shrunk to fit (and a warning logged), so puts spill to disk rather
// than fail; with less than MinShm free, Open fails with ErrShmTooSmall.
//
// Objects a previous instance made durable (Persist) are adopted: each durable
// file is read whole and checked against its checksum, and registered at this
// store's location; objects it spilled are found again too. Either kind is
// owned by its recorded owner, with one reference (Adopted lists them). Files
// that fail their check are removed and reported by Lost.
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
	log := cfg.Logger.Named("object")
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.DirectoryTimeout == 0 {
		cfg.DirectoryTimeout = 10 * time.Second
	}
	if cfg.Directory == nil {
		cfg.Directory = NewMemDirectory()
	}
	if cfg.statfs == nil {
		cfg.statfs = statfs
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("object: open %s: register metrics: %w", dir, err)
	}
	var busy func()
	if cfg.hooks != nil {
		busy = cfg.hooks.lockBusy
	}
	dirLock, err := adoptDir(abs, cfg.LockWait, busy)
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			dirLock.Close()
		}
	}()
	dd := filepath.Join(abs, "durable")
	if err := os.MkdirAll(dd, 0o700); err != nil {
		return nil, fmt.Errorf("object: open %s: %w", dir, err)
	}
	if cfg.Spill == nil {
		sd := filepath.Join(abs, "spill")
		if err := os.MkdirAll(sd, 0o700); err != nil {
			return nil, fmt.Errorf("object: open %s: %w", dir, err)
		}
		cfg.Spill = DirFS{Dir: sd}
	}
	if rep, err := Reclaim(cfg.ShmDir, log); err != nil {
		log.Warn("reclaiming the shared memory of dead stores", zap.String("shm_dir", cfg.ShmDir), zap.Error(err))
	} else if len(rep.Removed) > 0 {
		log.Info("reclaimed the shared memory of dead stores", zap.Int("stores", len(rep.Removed)), zap.Int64("bytes", rep.Bytes))
	}
	capacity := cfg.Capacity
	if capacity == 0 {
		capacity = int64(float64(ramBytes()) * cfg.CapacityShare)
	}
	capacity, err = fitShm(cfg, capacity, log)
	if err != nil {
		return nil, err
	}
	home, err := claimShm(cfg.ShmDir, abs)
	if err != nil {
		return nil, err
	}
	defer func() {
		if !ok {
			_ = home.release()
		}
	}()
	_, level := zstd.EncoderLevelFromString(cfg.SpillCompression)
	if cfg.SpillCompression == "" {
		level = zstd.SpeedFastest
	}
	s := &Store{
		cfg: cfg, log: log, m: m, capacity: capacity,
		shmDir:     home.dir,
		home:       home,
		dirLock:    dirLock,
		spill:      cfg.Spill,
		durable:    durableDir{dir: dd, sync: (*os.File).Sync},
		directory:  cfg.Directory,
		objs:       make(map[ID]*entry),
		owned:      make(map[string]map[ID]*entry),
		lru:        list.New(),
		closing:    make(chan struct{}),
		leases:     make(map[string]time.Time),
		level:      level,
		hooks:      cfg.hooks,
		pool:       make(map[int64][]*segment),
		writerPool: map[string]map[int64][]*segment{},
		unmapped:   map[string][]string{},
		partial:    make(map[int64][]*slab),
		slabs:      make(map[*slab]struct{}),
	}
	s.life, s.stopLife = context.WithCancel(context.Background())
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
	s.maxObject = cfg.MaxObjectSize
	if s.maxObject == 0 || s.maxObject > capacity {
		s.maxObject = capacity
	}
	if cfg.hooks != nil && cfg.hooks.sync != nil {
		s.durable.sync = cfg.hooks.sync
	}
	if s.smallMax > s.slabSize || s.slabSize > capacity {
		s.stopLife()
		return nil, fmt.Errorf("object: open %s: SmallMax %d <= SlabSize %d <= capacity %d does not hold", dir, s.smallMax, s.slabSize, capacity)
	}
	if err := s.recover(); err != nil {
		s.stopLife()
		return nil, err
	}
	ok = true
	return s, nil
}

// MinShm is the least free shared memory a store opens with: below it, Open
// fails with ErrShmTooSmall instead of running with a hot tier too small to
// hold a slab.
const MinShm = 1 << 20

// fitShm shrinks capacity to what the shared-memory file system has free (90%
// of it, leaving room for others), or fails if that is below MinShm.
func fitShm(cfg Config, capacity int64, log *zap.Logger) (int64, error) {
	free, total, err := cfg.statfs(cfg.ShmDir)
	if err != nil {
		return 0, fmt.Errorf("object: open: shared memory at %s: %w", cfg.ShmDir, err)
	}
	if capacity <= free {
		return capacity, nil
	}
	fit := free / 10 * 9 &^ 4095
	if fit < MinShm {
		return 0, fmt.Errorf("object: open: shared memory at %s has %d bytes free of %d, less than the %d a store needs "+
			"(mount a larger tmpfs there, or set ShmDir): %w", cfg.ShmDir, free, total, MinShm, ErrShmTooSmall)
	}
	log.Warn("shared memory is smaller than the hot tier's capacity: capacity lowered to fit, puts beyond it spill to disk",
		zap.String("shm_dir", cfg.ShmDir), zap.Int64("free", free), zap.Int64("total", total),
		zap.Int64("capacity_asked", capacity), zap.Int64("capacity", fit))
	return fit, nil
}

// statfs returns the bytes free (to an unprivileged user) and in total of the
// file system holding dir.
func statfs(dir string) (free, total int64, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, 0, err
	}
	return int64(st.Bavail) * st.Bsize, int64(st.Blocks) * st.Bsize, nil
}

// Capacity returns the hot tier's capacity in bytes.
func (s *Store) Capacity() int64 { return s.capacity }

// MaxObjectSize is the largest object this store takes (Config.MaxObjectSize,
// at most the capacity); a larger one fails with ErrTooLarge.
func (s *Store) MaxObjectSize() int64 { return s.maxObject }

// Location returns the transfer address this store registers objects under.
func (s *Store) Location() string { return s.cfg.Location }

// Directory returns the metadata directory the store writes through.
func (s *Store) Directory() Directory { return s.directory }

// Stats returns a snapshot of occupancy.
func (s *Store) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.tally
	return Stats{Objects: len(s.objs), HotObjects: t.hot, ColdObjects: t.cold, ColdBytes: t.coldBytes,
		DurableObjects: t.durable, DurableBytes: t.durableBytes, HotBytes: s.used, Recycled: s.poolBytes, Capacity: s.capacity}
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

// background returns a context for a directory write made on nobody's behalf:
// it ends when the store closes or after Config.DirectoryTimeout.
func (s *Store) background() (context.Context, context.CancelFunc) {
	return context.WithTimeout(s.life, s.cfg.DirectoryTimeout)
}

// hooks let tests observe the store's sequencing, so that a test waits for the
// event it is about rather than sleeping. Nil outside tests.
type hooks struct {
	awaitBlocked func(id ID)      // Await found id pending and is about to wait
	admitBlocked func(size int64) // admission found no room and is about to wait
	// mapPair replaces mapPair (creating a shared-memory file), to fake a full file system.
	mapPair func(path string, size int64) (rw, ro []byte, err error)
	// sync replaces (*os.File).Sync for the durable tier, to count or fail fsyncs.
	sync func(f *os.File) error
	// lockBusy: Open found its directory's lock held by another store (and waits, with
	// Config.LockWait).
	lockBusy func()
}

func (s *Store) fail(reason string, err error) error {
	s.m.errors.WithLabelValues(reason).Inc()
	return err
}

// Contains reports whether id is sealed in this store (hot or cold).
func (s *Store) Contains(id ID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.objs[id]
	return ok && (e.state == stateHot || e.state == stateCold) && !e.freePending && e.dropped == nil
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
	s.stopLife()
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
	for _, byClass := range s.writerPool {
		for _, segs := range byClass {
			for _, seg := range segs {
				_ = unmap(seg.rw)
				_ = unmap(seg.ro)
			}
		}
	}
	s.writerPool = nil
	for sl := range s.slabs {
		if !busy[sl] {
			_ = unmap(sl.rw)
			_ = unmap(sl.ro)
		}
	}
	s.slabs = nil
	s.notifyLocked()
	err := s.home.release() // only the files the store made; then the lock
	s.dirLock.Close()
	return err
}
