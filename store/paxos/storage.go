package paxos

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/tidwall/wal"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/atoll-run/atoll/proto/paxospb"
)

// Storage persists what a Ready asks for. Save must be durable (per the storage's fsync
// policy) when it returns: the driver sends messages only after Save returns.
// Implementations are used from one goroutine at a time.
type Storage interface {
	// Load returns the persisted hard state and entries (a slot may repeat; last wins).
	Load() (HardState, []Entry, error)
	// Save appends the hard state and entries as one record.
	Save(hs HardState, entries []Entry) error
	// SaveSnapshot durably and atomically replaces the state machine snapshot.
	SaveSnapshot(s SnapshotData) error
	// LoadSnapshot returns the latest snapshot (zero SnapshotData when none).
	LoadSnapshot() (SnapshotData, error)
	// Compact may drop persisted entries through slot (covered by the snapshot).
	Compact(slot uint64) error
	// Close releases the storage.
	Close() error
}

// MemStorage is an in-memory Storage for tests (it survives a simulated crash as long as
// the value is kept).
type MemStorage struct {
	mu      sync.Mutex
	hs      HardState
	entries []Entry
	snap    SnapshotData
	// FailWrites makes Save fail (a disk that fails writes), with WriteErr when set.
	FailWrites bool
	WriteErr   error
}

var _ Storage = (*MemStorage)(nil)

// Load implements Storage.
func (m *MemStorage) Load() (HardState, []Entry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	hs := m.hs
	hs.Snapshot = m.snap.Slot
	hs.Conf = m.snap.Conf.Clone()
	return hs, append([]Entry(nil), m.entries...), nil
}

// Save implements Storage.
func (m *MemStorage) Save(hs HardState, entries []Entry) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.FailWrites {
		if m.WriteErr != nil {
			return m.WriteErr
		}
		return errors.New("paxos: mem storage: injected write failure")
	}
	m.hs = hs
	m.entries = append(m.entries, entries...)
	return nil
}

// Close implements Storage.
func (m *MemStorage) Close() error { return nil }

// Reopen implements Reopener: a failed Save changed nothing, so there is nothing to drop.
func (m *MemStorage) Reopen() error { return nil }

var _ Reopener = (*MemStorage)(nil)

// SaveSnapshot implements Storage.
func (m *MemStorage) SaveSnapshot(s SnapshotData) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.snap = SnapshotData{Slot: s.Slot, Data: append([]byte(nil), s.Data...), Conf: s.Conf.Clone()}
	return nil
}

// LoadSnapshot implements Storage.
func (m *MemStorage) LoadSnapshot() (SnapshotData, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.snap, nil
}

// Compact implements Storage.
func (m *MemStorage) Compact(slot uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	kept := m.entries[:0]
	for _, e := range m.entries {
		if e.Slot > slot {
			kept = append(kept, e)
		}
	}
	m.entries = kept
	return nil
}

// WALOptions configures a WAL.
type WALOptions struct {
	// NoSync turns off fsync after each record. Default false: every Save is fsync'd
	// before it returns, which is what makes an acknowledged write survive a power cut.
	NoSync bool
	// SegmentSize is the tidwall/wal segment size in bytes (default 64 MiB).
	SegmentSize int
	// Logger receives repair notices (default zap.NewNop()).
	Logger *zap.Logger
	// RejoinFree is the free space a WAL whose disk filled must find before Reopen lets
	// its replica rejoin (default 1 MiB): less would fill again at the next records.
	RejoinFree int64
}

// WAL is the durable Storage: a tidwall/wal log in a directory, one record per Save.
// Each record is a CRC32-C (4 bytes, little endian) followed by a protobuf paxospb.Record.
// On open a torn or corrupt tail is detected, logged and truncated after the last good
// record (a tail of zero bytes, which a crash leaves on many file systems, is a torn
// tail); corruption before the tail is an error (ErrCorruptWAL), never applied.
//
// The directory is locked (flock on the file LOCK, which records the holder's pid) while
// the WAL is open: a second opener, in this process or another, gets ErrLocked.
type WAL struct {
	dir    string
	opts   WALOptions
	lock   *os.File
	log    *wal.Log
	last   uint64
	buf    []byte
	recMax map[uint64]uint64 // record index -> highest slot in it
}

var (
	_ Storage  = (*WAL)(nil)
	_ Reopener = (*WAL)(nil)
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// OpenWAL opens (creating if needed) the WAL in dir, repairing a torn tail.
func OpenWAL(dir string, opts WALOptions) (*WAL, error) {
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if opts.SegmentSize <= 0 {
		opts.SegmentSize = 64 << 20
	}
	if opts.RejoinFree <= 0 {
		opts.RejoinFree = 1 << 20
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("paxos: wal mkdir %s: %w", dir, err)
	}
	lock, err := lockDir(dir)
	if err != nil {
		return nil, err
	}
	w := &WAL{dir: dir, opts: opts, lock: lock, recMax: map[uint64]uint64{}}
	if err := w.openLog(); err != nil {
		lock.Close()
		return nil, err
	}
	return w, nil
}

// openLog opens the tidwall/wal log of the directory, truncating a torn segment tail.
func (w *WAL) openLog() error {
	l, err := w.open()
	if errors.Is(err, wal.ErrCorrupt) {
		if rerr := w.repairSegment(); rerr != nil {
			return rerr
		}
		l, err = w.open()
	}
	if err != nil {
		return fmt.Errorf("paxos: wal open %s: %w", w.dir, err)
	}
	last, err := l.LastIndex()
	if err != nil {
		l.Close()
		return fmt.Errorf("paxos: wal last index %s: %w", w.dir, err)
	}
	w.log, w.last = l, last
	return nil
}

// Reopen implements Reopener: it closes the log (keeping the directory's lock) and opens
// it again from disk, as OpenWAL does, so that a write that failed half-way (a full disk)
// leaves neither a partial record nor an index that counts it. The segments' cached pages
// are dropped first, so that what is read back is what the disk holds. Load must follow.
// While the file system has less than RejoinFree bytes free it fails with ErrDiskFull
// and changes nothing.
func (w *WAL) Reopen() error {
	var fs unix.Statfs_t
	if err := unix.Statfs(w.dir, &fs); err == nil {
		if free := int64(fs.Bavail) * int64(fs.Bsize); free < w.opts.RejoinFree {
			return fmt.Errorf("%w: %s has %d bytes free, %d needed to rejoin", ErrDiskFull, w.dir, free, w.opts.RejoinFree)
		}
	}
	if err := w.log.Close(); err != nil && !errors.Is(err, wal.ErrClosed) && !errors.Is(err, wal.ErrCorrupt) {
		_ = w.log.Close() // a failed sync is reported once; the second close releases the file
	}
	if ents, err := os.ReadDir(w.dir); err == nil {
		for _, e := range ents {
			if isSegmentName(e.Name()) {
				dropCachedPages(filepath.Join(w.dir, e.Name()))
			}
		}
	}
	clear(w.recMax)
	return w.openLog()
}

// dropCachedPages asks the kernel to forget a file's clean cached pages: after a failed
// write or fsync they may hold bytes the disk does not.
func dropCachedPages(path string) {
	f, err := os.Open(path)
	if err != nil {
		return
	}
	defer f.Close()
	_ = unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
}

// lockFile is the name of the lock file in a WAL directory.
const lockFile = "LOCK"

// lockDir takes an exclusive flock on dir/LOCK and writes this process's pid into it. The
// lock lasts until the returned file is closed (or the process dies).
func lockDir(dir string) (*os.File, error) {
	path := filepath.Join(dir, lockFile)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o640)
	if err != nil {
		return nil, fmt.Errorf("paxos: wal lock %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			holder := "another process"
			if b, rerr := os.ReadFile(path); rerr == nil {
				if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); perr == nil && pid > 0 {
					holder = fmt.Sprintf("process %d", pid)
				}
			}
			return nil, fmt.Errorf("paxos: wal directory %s is in use by %s (lock %s): %w", dir, holder, path, ErrLocked)
		}
		return nil, fmt.Errorf("paxos: wal lock %s: %w", path, err)
	}
	if err := f.Truncate(0); err == nil {
		_, err = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("paxos: wal lock %s: record pid: %w", path, err)
	}
	return f, nil
}

func (w *WAL) open() (*wal.Log, error) {
	return wal.Open(w.dir, &wal.Options{
		NoSync:           w.opts.NoSync,
		SegmentSize:      w.opts.SegmentSize,
		LogFormat:        wal.Binary,
		SegmentCacheSize: 2,
		NoCopy:           true,
		DirPerms:         0o750,
		FilePerms:        0o640,
	})
}

// repairSegment truncates the last segment after its last complete frame (a torn write
// leaves a partial length-prefixed frame that tidwall/wal refuses to load).
func (w *WAL) repairSegment() error {
	ents, err := os.ReadDir(w.dir)
	if err != nil {
		return fmt.Errorf("paxos: wal repair %s: %w", w.dir, err)
	}
	var segs []string
	for _, e := range ents {
		if !e.IsDir() && len(e.Name()) == 20 {
			segs = append(segs, e.Name())
		}
	}
	if len(segs) == 0 {
		return fmt.Errorf("paxos: wal repair %s: no segment: %w", w.dir, ErrCorruptWAL)
	}
	sort.Strings(segs)
	path := filepath.Join(w.dir, segs[len(segs)-1])
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("paxos: wal repair read %s: %w", path, err)
	}
	good := 0
	for good < len(data) {
		size, n := binary.Uvarint(data[good:])
		if n <= 0 || uint64(len(data)-good-n) < size {
			break
		}
		good += n + int(size)
	}
	w.opts.Logger.Warn("paxos: wal torn tail truncated", zap.String("segment", path),
		zap.Int("good_bytes", good), zap.Int("dropped_bytes", len(data)-good))
	if good == 0 && len(segs) > 1 {
		return os.Remove(path)
	}
	if err := os.Truncate(path, int64(good)); err != nil {
		return fmt.Errorf("paxos: wal repair truncate %s: %w", path, err)
	}
	return nil
}

// Load implements Storage. A record failing its checksum at the tail is truncated (and
// logged); one failing before the tail returns ErrCorruptWAL.
func (w *WAL) Load() (HardState, []Entry, error) {
	var hs HardState
	var out []Entry
	first, err := w.log.FirstIndex()
	if err != nil {
		return hs, nil, fmt.Errorf("paxos: wal first index: %w", err)
	}
	snap, err := w.LoadSnapshot()
	if err != nil {
		return hs, nil, err
	}
	hs.Snapshot = snap.Slot
	hs.Commit = snap.Slot
	hs.Conf = snap.Conf
	if w.last == 0 {
		return hs, nil, nil
	}
	for i := first; i <= w.last; i++ {
		data, err := w.log.Read(i)
		if err != nil {
			return hs, nil, fmt.Errorf("paxos: wal read record %d in %s: %w", i, w.dir, err)
		}
		rec, derr := decodeRecord(data)
		if derr != nil {
			zeros, zerr := w.zeroFilledAfter(i)
			if zerr != nil {
				return hs, nil, zerr
			}
			if !zeros {
				return hs, nil, fmt.Errorf("paxos: wal record %d of %d in %s: %v, and records after it are not a zero-filled tail: %w", i, w.last, w.dir, derr, ErrCorruptWAL)
			}
			w.opts.Logger.Warn("paxos: wal torn tail truncated", zap.String("dir", w.dir), zap.Uint64("record", i),
				zap.Uint64("dropped_records", w.last-i+1), zap.Error(derr))
			if err := w.truncateTail(i); err != nil {
				return hs, nil, err
			}
			break
		}
		hs.Promised = max(hs.Promised, rec.Promised)
		hs.Commit = max(hs.Commit, rec.Commit)
		var top uint64
		for _, e := range rec.Entries {
			top = max(top, e.Slot)
			if e.Slot > snap.Slot {
				out = append(out, Entry{Slot: e.Slot, Ballot: e.Ballot, Type: EntryType(e.Type), Data: e.Data, Epoch: e.Epoch})
			}
		}
		w.recMax[i] = top
	}
	return hs, out, nil
}

// zeroFilledAfter reports whether every record after i is empty or all zero bytes: the
// tail a crash leaves when the file system extended the file but did not write its data
// (each zero byte reads as an empty frame).
func (w *WAL) zeroFilledAfter(i uint64) (bool, error) {
	for j := i + 1; j <= w.last; j++ {
		data, err := w.log.Read(j)
		if err != nil {
			return false, fmt.Errorf("paxos: wal read record %d in %s: %w", j, w.dir, err)
		}
		for _, b := range data {
			if b != 0 {
				return false, nil
			}
		}
	}
	return true, nil
}

// truncateTail drops records i and after.
func (w *WAL) truncateTail(i uint64) error {
	first, err := w.log.FirstIndex()
	if err != nil {
		return fmt.Errorf("paxos: wal first index: %w", err)
	}
	if i > first {
		if err := w.log.TruncateBack(i - 1); err != nil {
			return fmt.Errorf("paxos: wal truncate after record %d: %w", i-1, err)
		}
		w.last = i - 1
		return nil
	}
	// No good record is left: start an empty log (the segments only: the snapshot and the
	// lock stay).
	if err := w.log.Close(); err != nil {
		return fmt.Errorf("paxos: wal close for reset: %w", err)
	}
	ents, err := os.ReadDir(w.dir)
	if err != nil {
		return fmt.Errorf("paxos: wal reset %s: %w", w.dir, err)
	}
	for _, e := range ents {
		if isSegmentName(e.Name()) {
			if err := os.Remove(filepath.Join(w.dir, e.Name())); err != nil {
				return fmt.Errorf("paxos: wal reset: %w", err)
			}
		}
	}
	l, err := w.open()
	if err != nil {
		return fmt.Errorf("paxos: wal reopen %s: %w", w.dir, err)
	}
	w.log, w.last = l, 0
	for k := range w.recMax {
		delete(w.recMax, k)
	}
	return nil
}

// isSegmentName reports whether name is a tidwall/wal segment file (20 digits, optionally
// .START or .END).
func isSegmentName(name string) bool {
	base, _ := strings.CutSuffix(name, ".START")
	base, _ = strings.CutSuffix(base, ".END")
	if len(base) != 20 {
		return false
	}
	for _, c := range base {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

func decodeRecord(data []byte) (*paxospb.Record, error) {
	if len(data) < 4 {
		return nil, fmt.Errorf("record of %d bytes is shorter than its checksum", len(data))
	}
	want := binary.LittleEndian.Uint32(data)
	if got := crc32.Checksum(data[4:], crcTable); got != want {
		return nil, fmt.Errorf("checksum %08x, want %08x", got, want)
	}
	rec := &paxospb.Record{}
	if err := proto.Unmarshal(data[4:], rec); err != nil {
		return nil, fmt.Errorf("decode: %v", err)
	}
	return rec, nil
}

// Save implements Storage: one record, fsync'd unless NoSync.
func (w *WAL) Save(hs HardState, entries []Entry) error {
	rec := &paxospb.Record{Promised: hs.Promised, Commit: hs.Commit, Entries: toPBEntries(entries)}
	w.buf = append(w.buf[:0], 0, 0, 0, 0)
	var err error
	w.buf, err = proto.MarshalOptions{}.MarshalAppend(w.buf, rec)
	if err != nil {
		return fmt.Errorf("paxos: wal encode record: %w", err)
	}
	binary.LittleEndian.PutUint32(w.buf, crc32.Checksum(w.buf[4:], crcTable))
	if err := w.log.Write(w.last+1, w.buf); err != nil {
		return fmt.Errorf("paxos: wal write record %d: %w", w.last+1, err)
	}
	w.last++
	var top uint64
	for _, e := range entries {
		top = max(top, e.Slot)
	}
	w.recMax[w.last] = top
	return nil
}

const (
	snapshotFile   = "snapshot.v2"
	snapshotFileV1 = "snapshot"
)

// SaveSnapshot implements Storage: written to a temporary file, fsync'd, renamed over the
// previous one, and the directory fsync'd. Format: slot (8 bytes BE), CRC32-C of the rest
// (4 bytes BE), length of the encoded configuration (4 bytes BE), the configuration
// (paxospb.ConfState), the state machine data.
func (w *WAL) SaveSnapshot(s SnapshotData) error {
	path := filepath.Join(w.dir, snapshotFile)
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o640)
	if err != nil {
		return fmt.Errorf("paxos: snapshot create %s: %w", tmp, err)
	}
	conf := EncodeConfState(s.Conf)
	body := binary.BigEndian.AppendUint32(nil, uint32(len(conf)))
	body = append(body, conf...)
	body = append(body, s.Data...)
	hdr := binary.BigEndian.AppendUint64(nil, s.Slot)
	hdr = binary.BigEndian.AppendUint32(hdr, crc32.Checksum(body, crcTable))
	_, err = f.Write(append(hdr, body...))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("paxos: snapshot write %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("paxos: snapshot rename %s: %w", path, err)
	}
	d, err := os.Open(w.dir)
	if err != nil {
		return fmt.Errorf("paxos: snapshot dir sync %s: %w", w.dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("paxos: snapshot dir sync %s: %w", w.dir, err)
	}
	_ = os.Remove(filepath.Join(w.dir, snapshotFileV1)) // superseded (an older format)
	return nil
}

// LoadSnapshot implements Storage. A snapshot failing its checksum is an error. A
// snapshot in the older format (no configuration) is read with an empty Conf.
func (w *WAL) LoadSnapshot() (SnapshotData, error) {
	path := filepath.Join(w.dir, snapshotFile)
	b, err := os.ReadFile(path)
	v1 := false
	if errors.Is(err, os.ErrNotExist) {
		path = filepath.Join(w.dir, snapshotFileV1)
		b, err = os.ReadFile(path)
		v1 = true
	}
	if errors.Is(err, os.ErrNotExist) {
		return SnapshotData{}, nil
	}
	if err != nil {
		return SnapshotData{}, fmt.Errorf("paxos: snapshot read %s: %w", path, err)
	}
	if len(b) < 12 {
		return SnapshotData{}, fmt.Errorf("paxos: snapshot %s is %d bytes, shorter than its header: %w", path, len(b), ErrCorruptWAL)
	}
	slot := binary.BigEndian.Uint64(b)
	if got, want := crc32.Checksum(b[12:], crcTable), binary.BigEndian.Uint32(b[8:]); got != want {
		return SnapshotData{}, fmt.Errorf("paxos: snapshot %s checksum %08x, want %08x: %w", path, got, want, ErrCorruptWAL)
	}
	if v1 {
		return SnapshotData{Slot: slot, Data: b[12:]}, nil
	}
	body := b[12:]
	if len(body) < 4 || uint64(binary.BigEndian.Uint32(body)) > uint64(len(body)-4) {
		return SnapshotData{}, fmt.Errorf("paxos: snapshot %s: configuration length out of range: %w", path, ErrCorruptWAL)
	}
	n := binary.BigEndian.Uint32(body)
	conf, err := DecodeConfState(body[4 : 4+n])
	if err != nil {
		return SnapshotData{}, fmt.Errorf("paxos: snapshot %s: %v: %w", path, err, ErrCorruptWAL)
	}
	return SnapshotData{Slot: slot, Data: body[4+n:], Conf: conf}, nil
}

// Compact implements Storage: it drops the longest prefix of records whose entries are
// all covered by the snapshot, keeping at least the last record (the promised ballot).
func (w *WAL) Compact(slot uint64) error {
	first, err := w.log.FirstIndex()
	if err != nil || first == 0 {
		return err
	}
	k := first
	for k < w.last && w.recMax[k] <= slot {
		k++
	}
	if k == first {
		return nil
	}
	if err := w.log.TruncateFront(k); err != nil {
		return fmt.Errorf("paxos: wal truncate before record %d: %w", k, err)
	}
	for i := first; i < k; i++ {
		delete(w.recMax, i)
	}
	return nil
}

// Close implements Storage: it closes the log and releases the directory lock.
func (w *WAL) Close() error {
	err := w.log.Close()
	if w.lock != nil {
		if cerr := w.lock.Close(); err == nil {
			err = cerr
		}
		w.lock = nil
	}
	return err
}

func toPBEntries(es []Entry) []*paxospb.Entry {
	out := make([]*paxospb.Entry, len(es))
	for i, e := range es {
		out[i] = &paxospb.Entry{Slot: e.Slot, Ballot: e.Ballot, Type: uint32(e.Type), Data: e.Data, Epoch: e.Epoch}
	}
	return out
}

func fromPBEntries(es []*paxospb.Entry) []Entry {
	out := make([]Entry, len(es))
	for i, e := range es {
		out[i] = Entry{Slot: e.Slot, Ballot: e.Ballot, Type: EntryType(e.Type), Data: e.Data, Epoch: e.Epoch}
	}
	return out
}
