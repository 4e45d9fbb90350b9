// The cold tier's file system: SpillFS and its implementations.

package object

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"sync"
	"syscall"
)

// SpillFS is where the cold tier writes its files. The store owns this interface;
// DirFS is the real one, LimitFS wraps any SpillFS with a byte budget (and is how
// tests exercise disk-full). Names are flat (no separators). Safe for concurrent use.
type SpillFS interface {
	// Create opens name for writing, truncating it.
	Create(name string) (io.WriteCloser, error)
	// Open opens name for reading.
	Open(name string) (io.ReadCloser, error)
	// Rename atomically replaces newName with oldName.
	Rename(oldName, newName string) error
	// Remove deletes name; removing a missing name is not an error.
	Remove(name string) error
	// List returns all names.
	List() ([]string, error)
}

// DirFS is a SpillFS over a directory on disk.
type DirFS struct{ Dir string }

var _ SpillFS = DirFS{}

// Create implements SpillFS.
func (d DirFS) Create(name string) (io.WriteCloser, error) {
	return os.OpenFile(filepath.Join(d.Dir, name), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
}

// Open implements SpillFS.
func (d DirFS) Open(name string) (io.ReadCloser, error) { return os.Open(filepath.Join(d.Dir, name)) }

// Rename implements SpillFS.
func (d DirFS) Rename(o, n string) error {
	return os.Rename(filepath.Join(d.Dir, o), filepath.Join(d.Dir, n))
}

// Remove implements SpillFS.
func (d DirFS) Remove(name string) error {
	err := os.Remove(filepath.Join(d.Dir, name))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// List implements SpillFS.
func (d DirFS) List() ([]string, error) {
	es, err := os.ReadDir(d.Dir)
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(es))
	for _, e := range es {
		if e.Type().IsRegular() {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// LimitFS wraps a SpillFS so that at most Limit bytes are written in total; a
// write past it fails with syscall.ENOSPC, as a full disk does. Removing a file
// gives its bytes back.
type LimitFS struct {
	FS    SpillFS
	Limit int64

	mu    sync.Mutex
	used  int64
	sizes map[string]int64
}

var _ SpillFS = (*LimitFS)(nil)

// Create implements SpillFS.
func (l *LimitFS) Create(name string) (io.WriteCloser, error) {
	w, err := l.FS.Create(name)
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	if l.sizes == nil {
		l.sizes = map[string]int64{}
	}
	l.used -= l.sizes[name]
	l.sizes[name] = 0
	l.mu.Unlock()
	return &limitWriter{l: l, name: name, w: w}, nil
}

type limitWriter struct {
	l    *LimitFS
	name string
	w    io.WriteCloser
}

func (w *limitWriter) Write(p []byte) (int, error) {
	w.l.mu.Lock()
	room := w.l.Limit - w.l.used
	n := int64(len(p))
	if n > room {
		n = max(room, 0)
	}
	w.l.used += n
	w.l.sizes[w.name] += n
	w.l.mu.Unlock()
	m, err := w.w.Write(p[:n])
	if err == nil && n < int64(len(p)) {
		err = &os.PathError{Op: "write", Path: w.name, Err: syscall.ENOSPC}
	}
	return m, err
}

func (w *limitWriter) Close() error { return w.w.Close() }

// Open implements SpillFS.
func (l *LimitFS) Open(name string) (io.ReadCloser, error) { return l.FS.Open(name) }

// Rename implements SpillFS.
func (l *LimitFS) Rename(o, n string) error {
	if err := l.FS.Rename(o, n); err != nil {
		return err
	}
	l.mu.Lock()
	l.used -= l.sizes[n]
	l.sizes[n] = l.sizes[o]
	delete(l.sizes, o)
	l.mu.Unlock()
	return nil
}

// Remove implements SpillFS.
func (l *LimitFS) Remove(name string) error {
	if err := l.FS.Remove(name); err != nil {
		return err
	}
	l.mu.Lock()
	l.used -= l.sizes[name]
	delete(l.sizes, name)
	l.mu.Unlock()
	return nil
}

// List implements SpillFS.
func (l *LimitFS) List() ([]string, error) { return l.FS.List() }

// Used returns the bytes currently accounted.
func (l *LimitFS) Used() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.used
}
