// Ownership of shared memory: each store's hot tier is a directory under
// Config.ShmDir that names its owner and is locked while the owner lives, so
// that what a dead process left behind is reclaimed and a live one's never is.

package object

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/atoll-run/atoll/internal/lockdir"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// Layout of a store's shared-memory directory, <ShmDir>/atoll-<pid>-<random>:
//
//	lock        held with flock(LOCK_EX) by the owning store from before its
//	            first segment until Close; the kernel drops it when the owner
//	            dies, however it dies (SIGKILL included)
//	owner       JSON: the owner's pid, its start time (so that a reader can tell
//	            a reused pid) and the store directory, written once locked
//	seg-N       large objects, one each
//	slab-N      small objects, many each
//
// Liveness is the lock, not the pid: a pid can be reused by an unrelated
// process, a lock cannot outlive the open file it belongs to.
const (
	shmPrefix    = "atoll-"
	shmLockName  = "lock"
	shmOwnerName = "owner"
	// reclaimGrace: a directory with a free lock but no owner file (an older
	// layout's), or a half-made one whose maker's pid is alive (the pid may be
	// reused), is reclaimed only once it is older than this.
	reclaimGrace = time.Minute
)

// shmOwner is the content of a shared-memory directory's owner file.
type shmOwner struct {
	PID int `json:"pid"`
	// Start is the owner's start time in clock ticks since boot (field 22 of
	// /proc/PID/stat), 0 where unknown.
	Start    uint64 `json:"start"`
	StoreDir string `json:"store_dir"`
	Created  string `json:"created"` // RFC 3339
}

// parseShmOwner decodes an owner file; it rejects anything that is not one.
func parseShmOwner(b []byte) (shmOwner, error) {
	var o shmOwner
	if len(b) > 64<<10 {
		return o, fmt.Errorf("owner file of %d bytes: too large", len(b))
	}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&o); err != nil {
		return o, fmt.Errorf("owner file: %w", err)
	}
	if o.PID <= 0 {
		return o, fmt.Errorf("owner file: pid %d", o.PID)
	}
	return o, nil
}

// procStart returns pid's start time in clock ticks since boot, or 0.
func procStart(pid int) uint64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command name (field 2) is in parentheses and may hold spaces.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 { // field 22 is the 20th after the name
		return 0
	}
	v, _ := strconv.ParseUint(f[19], 10, 64)
	return v
}

// shmHome is a store's own shared-memory directory, locked while the store lives.
type shmHome struct {
	dir  string
	lock *os.File
}

// claimShm creates and locks a new shared-memory directory under shmDir for a
// store whose state lives in storeDir. The directory appears under its final name
// only with its lock held and its owner file written (lockdir.Make), so that a
// process killed while making it never leaves a directory Reclaim cannot judge.
func claimShm(shmDir, storeDir string) (*shmHome, error) {
	d, err := lockdir.Make(shmDir, shmPrefix, shmLockName, func(dir string) error {
		owner, _ := json.Marshal(shmOwner{PID: os.Getpid(), Start: procStart(os.Getpid()), StoreDir: storeDir,
			Created: time.Now().UTC().Format(time.RFC3339)})
		if err := os.WriteFile(filepath.Join(dir, shmOwnerName), owner, 0o600); err != nil {
			return fmt.Errorf("owner file: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("object: create shared-memory directory: %w", err)
	}
	return &shmHome{dir: d.Path, lock: d.Lock}, nil
}

// release removes the directory's files (only the ones a store creates) and the
// directory, then drops the lock.
func (h *shmHome) release() error {
	err := removeShmFiles(h.dir)
	h.lock.Close()
	return err
}

// isShmFile reports whether name is a file a store creates in its
// shared-memory directory.
func isShmFile(name string) bool {
	switch name {
	case shmLockName, shmOwnerName, shmOwnerName + ".tmp":
		return true
	}
	for _, p := range []string{"seg-", "slab-"} {
		if n, ok := strings.CutPrefix(name, p); ok {
			_, err := strconv.ParseUint(n, 10, 64)
			return err == nil
		}
	}
	return false
}

// removeShmFiles removes the store files in dir, then dir itself if that left
// it empty. A file it does not know is left where it is (and dir with it).
func removeShmFiles(dir string) error {
	es, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var errs []error
	foreign := 0
	for _, e := range es {
		if !e.Type().IsRegular() || !isShmFile(e.Name()) {
			foreign++
			continue
		}
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if foreign > 0 {
		errs = append(errs, fmt.Errorf("object: %s: %d files not created by a store left in place", dir, foreign))
	} else if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// ReclaimReport says what Reclaim did.
type ReclaimReport struct {
	// Removed lists the directories of dead owners that were removed.
	Removed []string
	// Live counts directories whose owner holds its lock: left alone.
	Live int
	// Bytes is the size of the files removed.
	Bytes int64
}

// Reclaim removes the shared memory that stores of dead processes left under
// shmDir (a process killed with SIGKILL cannot clean up after itself). A
// store's directory is reclaimed only if nothing holds its lock, that is, its
// owner has exited; a live owner's, including this process's own stores', is
// never touched. Only files a store creates are removed; anything else under
// shmDir is left alone. Open calls it for Config.ShmDir; the CLI may call it
// too. The errors of the directories it could not clean are joined.
func Reclaim(shmDir string, log *zap.Logger) (ReclaimReport, error) {
	var rep ReclaimReport
	if log == nil {
		log = zap.NewNop()
	}
	es, err := os.ReadDir(shmDir)
	if err != nil {
		return rep, fmt.Errorf("object: reclaim %s: %w", shmDir, err)
	}
	var errs []error
	// Directories a store began to make and never finished (killed in between).
	partial, err := lockdir.Partial(shmDir, shmPrefix, reclaimGrace)
	if err != nil {
		errs = append(errs, fmt.Errorf("object: reclaim %s: %w", shmDir, err))
	}
	rep.Removed = append(rep.Removed, partial...)
	for _, e := range es {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), shmPrefix) {
			continue
		}
		dir := filepath.Join(shmDir, e.Name())
		removed, live, n, err := reclaimOne(dir, log)
		switch {
		case err != nil:
			errs = append(errs, err)
		case live:
			rep.Live++
		case removed:
			rep.Removed = append(rep.Removed, dir)
			rep.Bytes += n
		}
	}
	return rep, errors.Join(errs...)
}

// reclaimOne removes dir if its owner is dead. It reports whether it removed
// it, whether its owner lives, and the bytes freed.
func reclaimOne(dir string, log *zap.Logger) (removed, live bool, bytes int64, err error) {
	lock, err := os.OpenFile(filepath.Join(dir, shmLockName), os.O_RDWR, 0)
	if err != nil {
		// Not a store's directory (an older layout, someone else's), or one
		// being created: not ours to judge.
		return false, false, 0, nil
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		if errors.Is(err, unix.EWOULDBLOCK) {
			return false, true, 0, nil
		}
		return false, false, 0, fmt.Errorf("object: reclaim %s: lock: %w", dir, err)
	}
	// The lock is ours: the owner is gone, or has not written its owner file yet.
	b, rerr := os.ReadFile(filepath.Join(dir, shmOwnerName))
	owner, perr := parseShmOwner(b)
	if rerr != nil || perr != nil {
		fi, err := os.Stat(dir)
		if err != nil || time.Since(fi.ModTime()) < reclaimGrace {
			return false, false, 0, nil
		}
	}
	es, _ := os.ReadDir(dir)
	for _, e := range es {
		if fi, err := e.Info(); err == nil && isShmFile(e.Name()) && (strings.HasPrefix(e.Name(), "seg-") || strings.HasPrefix(e.Name(), "slab-")) {
			bytes += fi.Size()
		}
	}
	if err := removeShmFiles(dir); err != nil {
		return false, false, 0, fmt.Errorf("object: reclaim %s: %w", dir, err)
	}
	log.Info("reclaimed the shared memory of a dead store", zap.String("dir", dir), zap.Int("owner_pid", owner.PID),
		zap.Uint64("owner_start", owner.Start), zap.String("store_dir", owner.StoreDir), zap.Int64("bytes", bytes))
	return true, false, bytes, nil
}
