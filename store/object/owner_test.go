package object

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
)

// ownerHelper runs as another process: it opens a store in dir whose shared
// memory lives under shmDir, puts objects, prints its shared-memory directory
// and waits until its stdin closes (or it is killed). dir belongs to the test,
// which removes it.
func ownerHelper(shmDir, dir string) int {
	cfg := DefaultLocalConfig()
	cfg.ShmDir = shmDir
	s, err := Open(cfg, dir)
	if err != nil {
		fmt.Println("ERR", err)
		return 1
	}
	defer s.Close()
	ctx := context.Background()
	for _, n := range []int{3 << 20, 1000} { // a segment and a slab
		if _, err := s.Put(ctx, "helper", randBytes(n, 1)); err != nil {
			fmt.Println("ERR", err)
			return 1
		}
	}
	fmt.Println(s.shmDir)
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	return 0
}

// startOwner starts ownerHelper in another process and returns it with its
// shared-memory directory.
func startOwner(t *testing.T, shmDir string) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "ATOLL_OBJECT_OWNER="+shmDir, "ATOLL_OBJECT_OWNER_DIR="+t.TempDir())
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); _ = cmd.Wait() }) // a live helper closes its store and exits
	line, err := bufio.NewReader(stdout).ReadString('\n')
	line = strings.TrimSpace(line)
	if err != nil || strings.HasPrefix(line, "ERR") {
		t.Fatalf("owner process: %q %v", line, err)
	}
	return cmd, line
}

// TestReclaimDeadOwner: the shared memory of a store whose process was killed
// (SIGKILL: no clean-up) is reclaimed by the next store that opens on the same
// file system; a live process's is never touched, by Reclaim or by Open.
func TestReclaimDeadOwner(t *testing.T) {
	shm := t.TempDir()
	live, liveDir := startOwner(t, shm)
	dead, deadDir := startOwner(t, shm)
	_ = live
	rep, err := Reclaim(shm, zaptest.NewLogger(t))
	if err != nil || rep.Live != 2 || len(rep.Removed) != 0 {
		t.Fatalf("reclaim with both owners alive: %+v %v", rep, err)
	}
	if err := dead.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = dead.Wait()
	if _, err := os.Stat(filepath.Join(deadDir, "seg-1")); err != nil {
		t.Fatalf("the killed process left no segment behind (%v): the case did not occur", err)
	}
	// The next store to open reclaims the dead one's memory, and only that.
	cfg := openCfg(t)
	cfg.ShmDir = shm
	s, err := Open(cfg, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := os.Stat(deadDir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("dead owner's shared memory: %v, want reclaimed", err)
	}
	for _, d := range []string{liveDir, s.shmDir} {
		if _, err := os.Stat(filepath.Join(d, shmLockName)); err != nil {
			t.Fatalf("a live owner's shared memory was touched: %v", err)
		}
	}
	if rep, err := Reclaim(shm, nil); err != nil || rep.Live != 2 || len(rep.Removed) != 0 {
		t.Fatalf("second reclaim: %+v %v", rep, err)
	}
}

// TestReclaimJudgesByLockNotPid: a dead owner's directory whose recorded pid
// now belongs to a live process (here, this one) is reclaimed: liveness is the
// lock, which no other process can hold. Directories that are not a store's,
// files a store did not create, and a directory still being created are left.
func TestReclaimJudgesByLockNotPid(t *testing.T) {
	shm := t.TempDir()
	mk := func(name string, files map[string]string, age time.Duration) string {
		d := filepath.Join(shm, name)
		writeFiles(t, d, files)
		old := time.Now().Add(-age)
		_ = os.Chtimes(d, old, old)
		return d
	}
	owner, _ := json.Marshal(shmOwner{PID: os.Getpid(), Start: procStart(os.Getpid()), StoreDir: "/gone"})
	reused := mk("atoll-1-reused", map[string]string{shmLockName: "", shmOwnerName: string(owner), "seg-1": "x", "slab-2": "y"}, 0)
	legacy := mk("atoll-0123456789abcdef", map[string]string{"seg-1": "old layout: no lock"}, time.Hour)
	other := mk("not-atoll", map[string]string{shmLockName: "", "data": "someone's"}, time.Hour)
	foreign := mk("atoll-2-foreign", map[string]string{shmLockName: "", shmOwnerName: string(owner), "seg-1": "x", "notes": "keep"}, 0)
	young := mk("atoll-3-young", map[string]string{shmLockName: ""}, 0)
	stale := mk("atoll-4-stale", map[string]string{shmLockName: "", "seg-9": "z"}, time.Hour)

	rep, err := Reclaim(shm, zaptest.NewLogger(t))
	if err == nil || !strings.Contains(err.Error(), "not created by a store") {
		t.Fatalf("reclaim error %v, want one naming the foreign file", err)
	}
	gone := map[string]bool{reused: true, stale: true}
	for _, d := range []string{reused, legacy, other, foreign, young, stale} {
		_, err := os.Stat(d)
		if removed := errors.Is(err, os.ErrNotExist); removed != gone[d] {
			t.Errorf("%s: removed=%v, want %v", filepath.Base(d), removed, gone[d])
		}
	}
	checkFiles(t, foreign, map[string]string{"notes": "keep"})
	checkFiles(t, other, map[string]string{"data": "someone's"})
	if len(rep.Removed) != 2 || rep.Bytes != 3 {
		t.Fatalf("report %+v", rep)
	}
}

// FuzzParseShmOwner: the owner file parser takes any bytes without panicking,
// and what it accepts has a positive pid.
func FuzzParseShmOwner(f *testing.F) {
	b, _ := json.Marshal(shmOwner{PID: 42, Start: 7, StoreDir: "/x", Created: "2026-01-01T00:00:00Z"})
	f.Add(b)
	f.Add([]byte(`{"pid":-1}`))
	f.Add([]byte(`{"pid":1,"extra":true}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		o, err := parseShmOwner(b)
		if err == nil && o.PID <= 0 {
			t.Fatalf("accepted pid %d", o.PID)
		}
	})
}

// TestOwnedListsAnOwnersLiveObjects: Owned names exactly the owner's sealed objects that
// are not freed, not another owner's, not one being written, and an owner with none
// (all freed) has none; the index forgets what was freed.
func TestOwnedListsAnOwnersLiveObjects(t *testing.T) {
	s := newTestStore(t, nil)
	ctx := context.Background()
	put := func(owner string) ID {
		id, err := s.Put(ctx, owner, []byte("bytes of "+owner))
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	a1, a2, freed, b1 := put("a"), put("a"), put("a"), put("b")
	if err := s.Release(ctx, freed, "a"); err != nil {
		t.Fatal(err)
	}
	w, err := s.Create(ctx, "a", NewID(), 10, 0) // being written: not listed
	if err != nil {
		t.Fatal(err)
	}
	defer w.Abort()
	got := s.Owned("a")
	slices.SortFunc(got, func(x, y ID) int { return strings.Compare(x.String(), y.String()) })
	want := []ID{a1, a2}
	slices.SortFunc(want, func(x, y ID) int { return strings.Compare(x.String(), y.String()) })
	if !slices.Equal(got, want) {
		t.Fatalf("Owned(a) = %v, want %v", got, want)
	}
	if got := s.Owned("b"); !slices.Equal(got, []ID{b1}) {
		t.Fatalf("Owned(b) = %v, want [%v]", got, b1)
	}
	for _, id := range []ID{a1, a2} {
		if err := s.Release(ctx, id, "a"); err != nil {
			t.Fatal(err)
		}
	}
	w.Abort()
	if got := s.Owned("a"); len(got) != 0 {
		t.Fatalf("Owned(a) after every release = %v", got)
	}
	s.mu.Lock()
	_, indexed := s.owned["a"]
	s.mu.Unlock()
	if indexed {
		t.Error("the owner index still names a, whose objects are all gone")
	}
}
