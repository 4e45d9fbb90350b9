// Package lockdir makes directories that a process owns while it lives and that the next
// process reclaims once it has died, however it died (SIGKILL included).
//
// A directory is built under a hidden name (.new-<name>), where its lock file is created
// and locked with flock and its other first files are written, and only then renamed to
// its final name. So a directory under its final name always holds a lock file: a process
// killed while making one leaves a hidden directory, never a final one without a lock, and
// Partial removes those hidden leftovers once their maker is gone.
//
// Liveness is the lock, not the pid: a pid is reused, a lock dies with the open file that
// holds it. The hidden name carries the maker's pid only so that a leftover whose maker
// is dead can be removed at once; one whose pid is alive is given a grace period (the pid
// may have been reused).
package lockdir

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// hidden is the prefix of a directory that is still being made.
const hidden = ".new-"

// Dir is a directory owned by this process while its lock is held.
type Dir struct {
	Path string
	Lock *os.File
}

// Make creates root/<prefix><pid>-<random>, holding lockName locked with flock, after
// fill (if not nil) has written the directory's other first files into it. The
// directory appears under its final name only once it is complete.
func Make(root, prefix, lockName string, fill func(dir string) error) (*Dir, error) {
	var r [4]byte
	if _, err := rand.Read(r[:]); err != nil {
		return nil, err
	}
	name := fmt.Sprintf("%s%d-%s", prefix, os.Getpid(), hex.EncodeToString(r[:]))
	tmp := filepath.Join(root, hidden+name)
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return nil, err
	}
	fail := func(err error) (*Dir, error) {
		_ = os.RemoveAll(tmp) // made just now under a fresh name: ours alone
		return nil, err
	}
	lock, err := os.OpenFile(filepath.Join(tmp, lockName), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fail(fmt.Errorf("lock file: %w", err))
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		lock.Close()
		return fail(fmt.Errorf("lock %s: %w", lock.Name(), err))
	}
	if fill != nil {
		if err := fill(tmp); err != nil {
			lock.Close()
			return fail(err)
		}
	}
	final := filepath.Join(root, name)
	if err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, final, unix.RENAME_NOREPLACE); err != nil {
		lock.Close()
		return fail(fmt.Errorf("rename %s to %s: %w", tmp, final, err))
	}
	return &Dir{Path: final, Lock: lock}, nil
}

// Partial removes the directories under root that a process of prefix's kind began to
// make and never finished (it died between creating one and renaming it): those whose
// lock is free and whose maker's pid is not alive, or that are older than grace. It
// returns the directories removed and the errors of those it could not remove.
func Partial(root, prefix string, grace time.Duration) ([]string, error) {
	es, err := os.ReadDir(root)
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, e := range es {
		rest, ok := strings.CutPrefix(e.Name(), hidden+prefix)
		if !e.IsDir() || !ok {
			continue
		}
		dir := filepath.Join(root, e.Name())
		if held(dir) {
			continue // its maker lives and is filling it now
		}
		fi, err := e.Info()
		if err != nil {
			continue
		}
		pid, _, _ := strings.Cut(rest, "-")
		if n, err := strconv.Atoi(pid); err == nil && n > 0 && alive(n) && time.Since(fi.ModTime()) < grace {
			continue
		}
		if err := os.RemoveAll(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, dir)
	}
	return removed, errors.Join(errs...)
}

// held reports whether some regular file in dir is locked by a live process.
func held(dir string) bool {
	es, _ := os.ReadDir(dir)
	for _, e := range es {
		if !e.Type().IsRegular() {
			continue
		}
		f, err := os.OpenFile(filepath.Join(dir, e.Name()), os.O_RDONLY|unix.O_NOFOLLOW, 0)
		if err != nil {
			continue
		}
		err = unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB)
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return true
		}
	}
	return false
}

// alive reports whether a process pid exists.
func alive(pid int) bool {
	err := unix.Kill(pid, 0)
	return err == nil || errors.Is(err, unix.EPERM)
}
