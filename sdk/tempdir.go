package sdk

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/atoll-run/atoll/internal/lockdir"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// A process's own temporary directories (an embedded cluster's, a driver's object store)
// are named atoll-local-<pid>-* and atoll-driver-<pid>-* and hold a lock file, locked with
// flock for the directory's life. A process killed with SIGKILL cannot remove its
// directory; the next process that makes one removes those whose lock is free. Liveness is
// the lock, not the pid (a pid is reused; a lock dies with its holder), and only a
// directory that holds the lock file, which only this code creates, is ever removed.

const (
	tempLockName     = ".atoll-lock"
	tempPrefixLocal  = "atoll-local-"
	tempPrefixDriver = "atoll-driver-"
)

// tempDir is a temporary directory owned by this process while its lock is held.
type tempDir struct {
	path string
	lock *os.File
}

// makeTempDir creates a temporary directory named prefix<pid>-* and locks it, after
// reclaiming the directories of dead processes of the same prefix. The directory appears
// under its final name only with its lock held (lockdir.Make).
func makeTempDir(prefix string, log *zap.Logger) (*tempDir, error) {
	reclaimTempDirs(os.TempDir(), prefix, log)
	d, err := lockdir.Make(os.TempDir(), prefix, tempLockName, nil)
	if err != nil {
		return nil, fmt.Errorf("sdk: temporary directory: %w", err)
	}
	return &tempDir{path: d.Path, lock: d.Lock}, nil
}

// remove removes the directory, then drops its lock.
func (t *tempDir) remove() error {
	if t == nil {
		return nil
	}
	err := os.RemoveAll(t.path)
	t.lock.Close()
	return err
}

// reclaimTempDirs removes the directories named prefix* under root whose lock file no
// live process holds. It returns the directories removed.
func reclaimTempDirs(root, prefix string, log *zap.Logger) []string {
	if log == nil {
		log = zap.NewNop()
	}
	// Directories a process began to make and never finished (killed in between).
	removed, err := lockdir.Partial(root, prefix, time.Minute)
	if err != nil {
		log.Warn("could not remove a dead process's half-made directory", zap.Error(err))
	}
	es, err := os.ReadDir(root)
	if err != nil {
		return removed
	}
	for _, e := range es {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), prefix) {
			continue
		}
		dir := filepath.Join(root, e.Name())
		f, err := os.OpenFile(filepath.Join(dir, tempLockName), os.O_RDWR|unix.O_NOFOLLOW, 0)
		if err != nil {
			continue // no lock file: not one of ours (or not yet)
		}
		if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
			f.Close()
			continue
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			continue // its owner lives
		}
		err = os.RemoveAll(dir)
		f.Close()
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			log.Warn("could not remove a dead process's directory", zap.String("dir", dir), zap.Error(err))
			continue
		}
		log.Info("removed a dead process's directory", zap.String("dir", dir))
		removed = append(removed, dir)
	}
	return removed
}
