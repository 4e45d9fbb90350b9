package sdk

import (
	"os"
	"path/filepath"
	"testing"
)

// A dead process's directory (its lock file free) is removed; a live one's (locked), one
// without the lock file (not ours) and one of another prefix are left alone.
func TestReclaimTempDirs(t *testing.T) {
	root := t.TempDir()
	t.Setenv("TMPDIR", root)
	live, err := makeTempDir(tempPrefixLocal, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer live.remove()
	dead := filepath.Join(root, tempPrefixLocal+"999999-1")
	foreign := filepath.Join(root, tempPrefixLocal+"999999-2")
	other := filepath.Join(root, "atoll-other-1")
	for _, d := range []string{dead, foreign, other} {
		if err := os.MkdirAll(filepath.Join(d, "heads"), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{dead, other} {
		if err := os.WriteFile(filepath.Join(d, tempLockName), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	removed := reclaimTempDirs(root, tempPrefixLocal, nil)
	if len(removed) != 1 || removed[0] != dead {
		t.Fatalf("removed %v, want only %s", removed, dead)
	}
	for _, d := range []string{live.path, foreign, other} {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("%s was removed: %v", d, err)
		}
	}
	if err := live.remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(live.path); !os.IsNotExist(err) {
		t.Fatalf("%s left after remove: %v", live.path, err)
	}
}
