package lockdir

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Make: the directory appears under its final name complete, with its lock held and
// fill's files in it, and nothing hidden is left; a failing fill leaves nothing.
func TestMake(t *testing.T) {
	root := t.TempDir()
	d, err := Make(root, "atoll-x-", "lock", func(dir string) error {
		return os.WriteFile(filepath.Join(dir, "owner"), []byte("me"), 0o600)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Lock.Close()
	if want := fmt.Sprintf("atoll-x-%d-", os.Getpid()); filepath.Dir(d.Path) != root || len(filepath.Base(d.Path)) != len(want)+8 {
		t.Fatalf("path %s, want %s/%s<8 hex>", d.Path, root, want)
	}
	if b, err := os.ReadFile(filepath.Join(d.Path, "owner")); err != nil || string(b) != "me" {
		t.Fatalf("owner file %q %v", b, err)
	}
	if !held(d.Path) {
		t.Fatal("the lock is not held")
	}
	if _, err := Make(root, "atoll-x-", "lock", func(string) error { return errors.New("no") }); err == nil {
		t.Fatal("a failing fill made a directory")
	}
	es, _ := os.ReadDir(root)
	if len(es) != 1 {
		t.Fatalf("root holds %d entries, want only the finished directory", len(es))
	}
}

// deadPid returns the pid of a process that has exited.
func deadPid(t *testing.T) int {
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Skip("no `true` to run:", err)
	}
	return cmd.Process.Pid
}

// Partial removes a half-made directory whose maker is dead, or which is older than the
// grace period; it keeps one whose maker lives (a live pid, young) or holds its lock, and
// anything not of its prefix.
func TestPartial(t *testing.T) {
	root := t.TempDir()
	mk := func(name string, age time.Duration) string {
		d := filepath.Join(root, name)
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "lock"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		old := time.Now().Add(-age)
		_ = os.Chtimes(d, old, old)
		return d
	}
	me := os.Getpid()
	dead := mk(fmt.Sprintf(".new-atoll-x-%d-aa", deadPid(t)), 0)
	young := mk(fmt.Sprintf(".new-atoll-x-%d-bb", me), 0)
	old := mk(fmt.Sprintf(".new-atoll-x-%d-cc", me), time.Hour)
	locked := mk(fmt.Sprintf(".new-atoll-x-%d-dd", deadPid(t)), time.Hour)
	other := mk(fmt.Sprintf(".new-other-%d-ee", deadPid(t)), time.Hour)
	final := mk(fmt.Sprintf("atoll-x-%d-ff", deadPid(t)), time.Hour)
	f, err := os.Open(filepath.Join(locked, "lock"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	removed, err := Partial(root, "atoll-x-", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(removed)
	want := []string{dead, old}
	slices.Sort(want)
	if !slices.Equal(removed, want) {
		t.Fatalf("removed %v, want %v", removed, want)
	}
	for _, d := range []string{young, locked, other, final} {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("%s: %v, want kept", filepath.Base(d), err)
		}
	}
}
