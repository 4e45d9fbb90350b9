// Recovery: what Open finds of a previous instance of the store.

package object

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// The marker a store writes into its directory. Open adopts a directory only if
// it is new, empty, or holds this marker: recovery then removes only files
// whose names the store itself gives (spill files and their temporaries).
const (
	storeMarker     = "ATOLL_OBJECT_STORE"
	storeMarkerText = "atoll object store, format 1\n" +
		"This directory holds an Atoll object store's spill files. Do not put other files here.\n"
)

// adoptDir makes sure dir is a store directory (creating it, or marking it if
// it is empty) and locks its marker; the returned file holds the lock until
// closed. It refuses a directory with foreign contents (ErrNotStoreDir) and one
// that another open store holds (ErrDirInUse) once wait has passed (busy, if not nil, is
// called each time it finds the lock held).
func adoptDir(dir string, wait time.Duration, busy func()) (*os.File, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("object: open %s: %w", dir, err)
	}
	marker := filepath.Join(dir, storeMarker)
	b, err := os.ReadFile(marker)
	switch {
	case err == nil:
		if string(b) != storeMarkerText {
			return nil, fmt.Errorf("object: open %s: %s is not a store marker (%d bytes of something else): %w",
				dir, marker, len(b), ErrNotStoreDir)
		}
	case errors.Is(err, os.ErrNotExist):
		es, err := os.ReadDir(dir)
		if err != nil {
			return nil, fmt.Errorf("object: open %s: %w", dir, err)
		}
		if len(es) > 0 {
			return nil, fmt.Errorf("object: open %s: the directory holds %d entries (%q first) and no %s marker: "+
				"refusing to use someone else's directory as a store directory (give an empty or new one): %w",
				dir, len(es), es[0].Name(), storeMarker, ErrNotStoreDir)
		}
		if err := os.WriteFile(marker, []byte(storeMarkerText), 0o600); err != nil {
			return nil, fmt.Errorf("object: open %s: write marker: %w", dir, err)
		}
	default:
		return nil, fmt.Errorf("object: open %s: %w", dir, err)
	}
	f, err := os.OpenFile(marker, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("object: open %s: %w", dir, err)
	}
	deadline := time.Now().Add(wait)
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("object: open %s: lock %s: %w", dir, marker, err)
		}
		if busy != nil {
			busy()
		}
		if !time.Now().Before(deadline) {
			f.Close()
			return nil, fmt.Errorf("object: open %s: another open store holds it (waited %v): %w", dir, wait, ErrDirInUse)
		}
		time.Sleep(50 * time.Millisecond) // polling a lock another process holds: flock has no timed wait
	}
}

// recover finds what a previous instance left on disk: its durable files first
// (adoptDurable), then its spill files: each readable one is an object again;
// an unreadable one is removed and reported by Lost; the temporary file of an
// interrupted spill is removed, as is the spill file of an object adopted from
// its durable file. A file whose name the store does not give is left where it
// is.
func (s *Store) recover() error {
	ctx, cancel := s.background()
	defer cancel()
	adopted, err := s.adoptDurable(ctx)
	if err != nil {
		return err
	}
	names, err := s.spill.List()
	if err != nil {
		return fmt.Errorf("object: open: list spill files: %w", err)
	}
	for _, n := range names {
		id, ok := isSpillName(n)
		if !ok {
			if isSpillTempName(n) {
				_ = s.spill.Remove(n) // an interrupted spill
			} else {
				s.log.Warn("a file the store did not create is in its spill directory; left in place", zap.String("file", n))
			}
			continue
		}
		if adopted[id] {
			_ = s.spill.Remove(n) // the durable file is its copy
			continue
		}
		h, err := s.readHeader(n)
		if err == nil && h.id != id {
			err = fmt.Errorf("header names object %s", h.id.Short())
		}
		if err != nil {
			s.log.Warn("spill file unreadable, object lost", zap.String("file", n), zap.Error(err))
			s.lost = append(s.lost, id)
			s.m.errors.WithLabelValues(reasonLost).Inc()
			_ = s.spill.Remove(n)
			continue
		}
		e := &entry{id: id, size: h.size, fp: h.fp, fpOK: true, owner: h.owner, state: stateCold, spilled: true,
			refs: map[string]int{h.owner: 1}, progress: make(chan struct{})}
		s.putLocked(e)
		s.adopted = append(s.adopted, Meta{ID: id, Size: h.size, Fingerprint: h.fp, Owner: h.owner, Locations: []string{s.cfg.Location}, Refs: 1})
		if err := s.directory.Register(ctx, Meta{ID: id, Size: h.size, Fingerprint: h.fp,
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
