// The durable tier: objects whose put must outlive the process, a restart of the
// machine and the store's reopening (a checkpoint's parts, detached objects).
//
// Persist writes an object's bytes, uncompressed, to one file under the store
// directory's durable/ folder: a temporary file is written and fsync'd, renamed
// into place, and the folder fsync'd, before Persist returns. Open adopts every
// such file it finds, after reading it whole and checking it against the
// checksum in its header; a file that fails is reported by Lost and removed.

package object

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/cespare/xxhash/v2"
	"go.uber.org/zap"
)

// Durable file layout: the spill header with its own magic, then the object's
// bytes as they are:
//
//	magic "ATOLDUR1" | id [32] | size u64 | fingerprint u64 | owner len u16 | owner | bytes
const durableMagic = "ATOLDUR1"

const durableSuffix = ".obj"

func durableName(id ID) string { return id.String() + durableSuffix }

func isDurableName(n string) (ID, bool) {
	s, ok := strings.CutSuffix(n, durableSuffix)
	if !ok {
		return ID{}, false
	}
	id, err := ParseID(s)
	return id, err == nil && id.String() == s
}

func isDurableTempName(n string) bool {
	base, ok := strings.CutSuffix(n, tmpSuffix)
	if !ok {
		return false
	}
	_, ok = isDurableName(base)
	return ok
}

// durableDir is the folder of durable files.
type durableDir struct {
	dir string
	// sync fsyncs a file or folder; tests count or fail it. Default (*os.File).Sync.
	sync func(f *os.File) error
}

func (d durableDir) path(id ID) string { return filepath.Join(d.dir, durableName(id)) }

// write stores data as id's durable file: written to a temporary file, fsync'd,
// renamed into place, and the folder fsync'd, so that the file is complete or
// absent after any crash.
func (d durableDir) write(h spillHeader, data []byte) (err error) {
	final := d.path(h.id)
	tmp := final + tmpSuffix
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = os.Remove(tmp)
		}
	}()
	hdr := h.marshal()
	copy(hdr, durableMagic)
	if _, err := f.Write(hdr); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := d.sync(f); err != nil {
		f.Close()
		return fmt.Errorf("fsync %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, final); err != nil {
		return err
	}
	return d.syncDir()
}

func (d durableDir) syncDir() error {
	df, err := os.Open(d.dir)
	if err != nil {
		return err
	}
	defer df.Close()
	if err := d.sync(df); err != nil {
		return fmt.Errorf("fsync %s: %w", d.dir, err)
	}
	return nil
}

// open opens id's durable file and reads its header.
func (d durableDir) open(id ID) (*os.File, spillHeader, error) {
	f, err := os.Open(d.path(id))
	if err != nil {
		return nil, spillHeader{}, err
	}
	h, err := readDurableHeader(f)
	if err != nil {
		f.Close()
		return nil, spillHeader{}, err
	}
	if h.id != id {
		f.Close()
		return nil, spillHeader{}, fmt.Errorf("header names object %s", h.id.Short())
	}
	return f, h, nil
}

// readInto reads id's bytes into dst (len(dst) == size) and checks them against
// the header's fingerprint.
func (d durableDir) readInto(id ID, dst []byte) (spillHeader, error) {
	f, h, err := d.open(id)
	if err != nil {
		return h, err
	}
	defer f.Close()
	if h.size != int64(len(dst)) {
		return h, fmt.Errorf("header says %d bytes, want %d", h.size, len(dst))
	}
	if _, err := io.ReadFull(f, dst); err != nil {
		return h, fmt.Errorf("body: %w", err)
	}
	if got := xxhash.Sum64(dst); got != h.fp {
		return h, fmt.Errorf("checksum %x, header says %x", got, h.fp)
	}
	return h, nil
}

// verify reads id's file whole, without keeping it, and checks its checksum and
// length. It returns the header.
func (d durableDir) verify(id ID) (spillHeader, error) {
	f, h, err := d.open(id)
	if err != nil {
		return h, err
	}
	defer f.Close()
	dg := xxhash.New()
	n, err := io.Copy(dg, bufio.NewReaderSize(f, 1<<20))
	if err != nil {
		return h, fmt.Errorf("body: %w", err)
	}
	if n != h.size {
		return h, fmt.Errorf("body holds %d bytes, header says %d", n, h.size)
	}
	if got := dg.Sum64(); got != h.fp {
		return h, fmt.Errorf("checksum %x, header says %x", got, h.fp)
	}
	return h, nil
}

func (d durableDir) remove(id ID) error {
	err := os.Remove(d.path(id))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

func readDurableHeader(r io.Reader) (spillHeader, error) {
	var magic [8]byte
	if _, err := io.ReadFull(r, magic[:]); err != nil {
		return spillHeader{}, fmt.Errorf("header: %w", err)
	}
	if string(magic[:]) != durableMagic {
		return spillHeader{}, fmt.Errorf("header: bad magic %q", magic[:])
	}
	return readSpillHeader(io.MultiReader(strings.NewReader(spillMagic), r))
}

// Persist makes the object durable on this machine: its bytes are written to a
// file of the durable tier and fsync'd (with the folder that names it) before
// Persist returns, so the copy survives the process (SIGKILL included), a
// restart of the machine and the store's reopening: the next Open adopts it,
// verified against its checksum. It returns the object's metadata, its
// fingerprint known. Persisting a durable object again costs nothing;
// concurrent calls write once.
//
// A durable object is spilled without a write (its file is its cold copy) and
// its file is removed when it is freed.
func (s *Store) Persist(ctx context.Context, id ID) (Meta, error) {
	s.mu.Lock()
	for {
		e, ok := s.objs[id]
		if !ok || e.state == statePending || e.state == stateAborted || e.freePending {
			s.mu.Unlock()
			return Meta{}, s.fail(reasonNotFound, fmt.Errorf("object: persist %s: %w", id.Short(), ErrNotFound))
		}
		if e.dropped != nil {
			s.mu.Unlock()
			return Meta{}, fmt.Errorf("object: persist %s: %w", id.Short(), e.dropped)
		}
		if e.durable {
			m := Meta{ID: id, Size: e.size, Fingerprint: e.fp, Owner: e.owner, Locations: []string{s.cfg.Location}, Durable: true}
			s.mu.Unlock()
			return m, nil
		}
		if ch := e.persisting; ch != nil {
			s.mu.Unlock()
			select {
			case <-ch:
			case <-ctx.Done():
				return Meta{}, fmt.Errorf("object: persist %s: %w", id.Short(), ctx.Err())
			}
			s.mu.Lock()
			continue
		}
		return s.persistLocked(ctx, e)
	}
}

// persistLocked writes e's durable file; s.mu is held on entry and released on
// return.
func (s *Store) persistLocked(ctx context.Context, e *entry) (Meta, error) {
	ch := make(chan struct{})
	e.persisting = ch
	e.views++ // pinned: neither spilled nor freed while we read it
	err := s.ensureHotLocked(ctx, e)
	data := e.mem.ro
	s.mu.Unlock()
	var fp uint64
	if err == nil {
		fp, err = s.fingerprint(ctx, e)
	}
	if err == nil {
		err = s.durable.write(spillHeader{id: e.id, size: e.size, fp: fp, owner: e.owner}, data)
		if err != nil {
			if errors.Is(err, syscall.ENOSPC) {
				err = fmt.Errorf("%v: %w", err, ErrDiskFull)
			}
			err = fmt.Errorf("object: persist %s (%d bytes): %w", e.id.Short(), e.size, err)
		}
	}
	s.mu.Lock()
	e.persisting = nil
	close(ch)
	if err == nil {
		s.setDurableLocked(e)
		s.m.persists.Inc()
		s.m.bytesPersisted.Add(float64(e.size))
	}
	e.views--
	freed := s.maybeFreeLocked(e) // removes the file just written if it was let go meanwhile
	s.notifyLocked()
	m := Meta{ID: e.id, Size: e.size, Fingerprint: fp, Owner: e.owner, Locations: []string{s.cfg.Location}, Durable: true}
	s.mu.Unlock()
	s.forget(ctx, freed)
	if err != nil {
		return Meta{}, s.fail(reasonPersist, err)
	}
	if len(freed) > 0 {
		return Meta{}, s.fail(reasonNotFound, fmt.Errorf("object: persist %s: freed while being written: %w", e.id.Short(), ErrNotFound))
	}
	// The directory learns this copy is durable before the caller is told so.
	if err := s.directory.Register(ctx, m); err != nil {
		return Meta{}, fmt.Errorf("object: persist %s: register in directory: %w", e.id.Short(), err)
	}
	return m, nil
}

// Durable reports whether id has a durable copy in this store.
func (s *Store) Durable(id ID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.objs[id]
	return ok && e.durable && !e.freed
}

// Verify reads this store's copy of id whole and checks it against the
// fingerprint the store holds for it: from shared memory when it is hot,
// otherwise from its durable or spill file, without restoring it. It returns
// the metadata of the verified copy, or ErrLost when the bytes do not match or
// cannot be read.
func (s *Store) Verify(ctx context.Context, id ID) (Meta, error) {
	s.mu.Lock()
	e, ok := s.objs[id]
	if !ok || e.state == statePending || e.state == stateAborted || e.freePending {
		s.mu.Unlock()
		return Meta{}, s.fail(reasonNotFound, fmt.Errorf("object: verify %s: %w", id.Short(), ErrNotFound))
	}
	if e.dropped != nil {
		s.mu.Unlock()
		return Meta{}, fmt.Errorf("object: verify %s: %w", id.Short(), e.dropped)
	}
	e.views++
	hot, data, durable, fp, fpOK := e.state == stateHot, e.mem.ro, e.durable, e.fp, e.fpOK
	s.mu.Unlock()
	defer s.unpin(e)
	m := Meta{ID: id, Size: e.size, Fingerprint: fp, Owner: e.owner, Locations: []string{s.cfg.Location}}
	var err error
	switch {
	case hot && !fpOK:
		m.Fingerprint, err = s.fingerprint(ctx, e) // nothing to check against yet: this is the checksum
	case hot:
		if got := xxhash.Sum64(data); got != fp {
			err = fmt.Errorf("shared memory: checksum %x, want %x", got, fp)
		}
	case durable:
		var h spillHeader
		if h, err = s.durable.verify(id); err == nil && h.fp != fp {
			err = fmt.Errorf("durable file: checksum %x, want %x", h.fp, fp)
		}
	default:
		err = s.verifySpill(e)
	}
	if err != nil {
		return Meta{}, s.fail(reasonLost, fmt.Errorf("object: verify %s: %v: %w", id.Short(), err, ErrLost))
	}
	return m, nil
}

// adoptDurable finds the durable files of a previous instance: each one whose
// bytes match its checksum is an object again (cold, owned by its recorded
// owner with one reference) and is registered at this store's location; the
// others are removed and reported by Lost. It returns the adopted ids.
func (s *Store) adoptDurable(ctx context.Context) (map[ID]bool, error) {
	es, err := os.ReadDir(s.durable.dir)
	if err != nil {
		return nil, fmt.Errorf("object: open: list durable files: %w", err)
	}
	adopted := map[ID]bool{}
	for _, de := range es {
		n := de.Name()
		id, ok := isDurableName(n)
		if !ok || !de.Type().IsRegular() {
			if isDurableTempName(n) {
				_ = os.Remove(filepath.Join(s.durable.dir, n)) // a persist the crash interrupted: never acknowledged
			} else {
				s.log.Warn("a file the store did not create is in its durable directory; left in place", zap.String("file", n))
			}
			continue
		}
		h, err := s.durable.verify(id)
		if err != nil {
			s.log.Warn("durable file fails its check, object lost", zap.String("file", n), zap.Error(err))
			s.lost = append(s.lost, id)
			s.m.errors.WithLabelValues(reasonLost).Inc()
			_ = s.durable.remove(id)
			continue
		}
		e := &entry{id: id, size: h.size, fp: h.fp, fpOK: true, owner: h.owner, state: stateCold, durable: true,
			refs: map[string]int{h.owner: 1}, progress: make(chan struct{})}
		s.putLocked(e)
		adopted[id] = true
		m := Meta{ID: id, Size: h.size, Fingerprint: h.fp, Owner: h.owner, Locations: []string{s.cfg.Location}, Refs: 1, Durable: true}
		s.adopted = append(s.adopted, m)
		if err := s.directory.Register(ctx, m); err != nil {
			s.log.Warn("directory register of an adopted durable object failed", zap.Stringer("id", id), zap.Error(err))
		}
	}
	if len(adopted) > 0 || len(s.lost) > 0 {
		s.log.Info("durable objects adopted", zap.Int("adopted", len(adopted)), zap.Int("lost", len(s.lost)))
	}
	return adopted, nil
}

// Adopted returns the metadata of the objects Open found of a previous instance
// (durable files and spill files), each verified and registered at this store's
// location.
func (s *Store) Adopted() []Meta {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Meta(nil), s.adopted...)
}

// Export writes a copy of id into dir, a directory outside the store (a shared
// checkpoint directory that other machines mount), in the durable file format:
// written, fsync'd, renamed into place and the directory fsync'd before Export
// returns. The store's own copy is unchanged. It returns the object's metadata
// (Locations empty: the caller names the directory's location).
func (s *Store) Export(ctx context.Context, id ID, dir string) (Meta, error) {
	s.mu.Lock()
	e, ok := s.objs[id]
	if !ok || e.state == statePending || e.state == stateAborted || e.freePending {
		s.mu.Unlock()
		return Meta{}, s.fail(reasonNotFound, fmt.Errorf("object: export %s: %w", id.Short(), ErrNotFound))
	}
	if e.dropped != nil {
		s.mu.Unlock()
		return Meta{}, fmt.Errorf("object: export %s: %w", id.Short(), e.dropped)
	}
	e.views++
	err := s.ensureHotLocked(ctx, e)
	data := e.mem.ro
	s.mu.Unlock()
	defer s.unpin(e)
	if err != nil {
		return Meta{}, err
	}
	fp, err := s.fingerprint(ctx, e)
	if err != nil {
		return Meta{}, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Meta{}, fmt.Errorf("object: export %s: %w", id.Short(), err)
	}
	d := durableDir{dir: dir, sync: s.durable.sync}
	if err := d.write(spillHeader{id: id, size: e.size, fp: fp, owner: e.owner}, data); err != nil {
		if errors.Is(err, syscall.ENOSPC) {
			err = fmt.Errorf("%v: %w", err, ErrDiskFull)
		}
		return Meta{}, s.fail(reasonPersist, fmt.Errorf("object: export %s to %s: %w", id.Short(), dir, err))
	}
	return Meta{ID: id, Size: e.size, Fingerprint: fp, Owner: e.owner, Durable: true}, nil
}

// Import makes a copy of id in this store from its file in dir (written by
// Export, on this machine or another), owned by owner with one reference: the
// bytes are read straight into shared memory and checked against the file's
// checksum before the object is sealed and registered at this store's location.
// A file that fails its check is ErrLost; a missing one ErrNotFound.
func (s *Store) Import(ctx context.Context, owner string, id ID, dir string) (Meta, error) {
	d := durableDir{dir: dir}
	f, h, err := d.open(id)
	if errors.Is(err, os.ErrNotExist) {
		return Meta{}, fmt.Errorf("object: import %s from %s: %w", id.Short(), dir, ErrNotFound)
	}
	if err != nil {
		return Meta{}, s.fail(reasonLost, fmt.Errorf("object: import %s from %s: %v: %w", id.Short(), dir, err, ErrLost))
	}
	defer f.Close()
	w, err := s.create(ctx, owner, id, h.size, h.fp, true, "")
	if err != nil {
		return Meta{}, err
	}
	if _, err := io.ReadFull(bufio.NewReaderSize(f, 1<<20), w.e.mem.rw); err != nil {
		w.Abort()
		return Meta{}, s.fail(reasonLost, fmt.Errorf("object: import %s from %s: %v: %w", id.Short(), dir, err, ErrLost))
	}
	if err := w.seal(ctx, true); err != nil {
		if errors.Is(err, ErrFingerprint) {
			err = fmt.Errorf("%v: %w", err, ErrLost)
		}
		return Meta{}, fmt.Errorf("object: import %s from %s: %w", id.Short(), dir, err)
	}
	return Meta{ID: id, Size: h.size, Fingerprint: h.fp, Owner: owner, Locations: []string{s.cfg.Location}, Refs: 1}, nil
}

// VerifyFile reads id's file in dir (written by Export) whole and checks it
// against its checksum, returning its metadata (ErrLost when it does not match,
// ErrNotFound when it is missing).
func VerifyFile(dir string, id ID) (Meta, error) {
	h, err := durableDir{dir: dir}.verify(id)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return Meta{}, fmt.Errorf("object: verify %s in %s: %w", id.Short(), dir, ErrNotFound)
	case err != nil:
		return Meta{}, fmt.Errorf("object: verify %s in %s: %v: %w", id.Short(), dir, err, ErrLost)
	}
	return Meta{ID: id, Size: h.size, Fingerprint: h.fp, Owner: h.owner, Durable: true}, nil
}

// RemoveFile removes id's file from dir (written by Export); a missing one is
// not an error.
func RemoveFile(dir string, id ID) error { return durableDir{dir: dir}.remove(id) }
