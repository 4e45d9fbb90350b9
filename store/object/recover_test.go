package object

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
)

// writeFiles creates files (path relative to dir -> content) under dir.
func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// checkFiles fails unless every file is still there with its content.
func checkFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, body := range files {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || string(b) != body {
			t.Fatalf("%s: %q, %v; the user's file was touched", name, b, err)
		}
	}
}

func openCfg(t *testing.T) Config {
	cfg := DefaultLocalConfig()
	cfg.Logger = zaptest.NewLogger(t)
	cfg.ShmDir = t.TempDir()
	return cfg
}

// TestOpenRefusesForeignDir: a store directory that points at someone's files
// (a hostile or mistaken path, such as a machine named ../../victim in a spec)
// is refused, and nothing in it is touched.
func TestOpenRefusesForeignDir(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files map[string]string
	}{
		{"user files", map[string]string{"notes.txt": "mine", "src/main.go": "package main"}},
		{"a spill directory of user files", map[string]string{"spill/thesis.tex": "chapter 1", "spill/x.spill": "not a spill"}},
		{"a marker that is not ours", map[string]string{storeMarker: "something else", "spill/data.csv": "a,b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			writeFiles(t, dir, tc.files)
			s, err := Open(openCfg(t), dir)
			if err == nil {
				s.Close()
			}
			if !errors.Is(err, ErrNotStoreDir) {
				t.Fatalf("open of a foreign directory: %v, want ErrNotStoreDir", err)
			}
			checkFiles(t, dir, tc.files)
		})
	}
}

// TestRecoveryRemovesOnlyItsOwnFiles: in a store directory, recovery removes the
// temporary file of an interrupted spill and an unreadable spill file, and
// leaves a file it did not create where it is.
func TestRecoveryRemovesOnlyItsOwnFiles(t *testing.T) {
	dir := t.TempDir()
	cfg := openCfg(t)
	s, err := Open(cfg, dir)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	id := NewID()
	foreign := map[string]string{
		"spill/README":                              "someone's notes",
		"spill/" + id.String() + ".spill.bak":       "a backup someone made",
		"spill/" + NewID().String()[:60] + ".spill": "short name",
	}
	writeFiles(t, dir, foreign)
	tmp := filepath.Join(dir, "spill", spillName(NewID())+tmpSuffix)
	corrupt := filepath.Join(dir, "spill", spillName(id))
	writeFiles(t, "/", map[string]string{tmp[1:]: "partial", corrupt[1:]: "ATOLSPL1 truncated"})
	s, err = Open(cfg, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	checkFiles(t, dir, foreign)
	for _, p := range []string{tmp, corrupt} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s: %v, want removed", p, err)
		}
	}
	if lost := s.Lost(); len(lost) != 1 || lost[0] != id {
		t.Fatalf("lost %v, want the corrupt spill file's object", lost)
	}
}

// TestOpenTwice: a second store on an open store's directory is refused; once
// the first closes, the directory opens again with its spilled objects.
func TestOpenTwice(t *testing.T) {
	dir := t.TempDir()
	cfg := openCfg(t)
	cfg.Capacity = 1 << 20
	s, err := Open(cfg, dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	a, _ := s.Put(ctx, "o", randBytes(1<<20, 1))
	if _, err := s.Put(ctx, "o", randBytes(1<<20, 2)); err != nil { // spills a
		t.Fatal(err)
	}
	if s2, err := Open(cfg, dir); !errors.Is(err, ErrDirInUse) {
		if err == nil {
			s2.Close()
		}
		t.Fatalf("second open: %v, want ErrDirInUse", err)
	}
	s.Close()
	s2, err := Open(cfg, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if !s2.Contains(a) {
		t.Fatal("spilled object not recovered")
	}
}

// TestOpenWaitsForTheHolder: with LockWait, an Open that finds the directory held waits
// for the holder to let go (a killed predecessor the kernel has not torn down yet) and
// then opens it; without, or past the wait, it fails with ErrDirInUse.
func TestOpenWaitsForTheHolder(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(openCfg(t), dir)
	if err != nil {
		t.Fatal(err)
	}
	short := openCfg(t)
	short.LockWait = 100 * time.Millisecond
	if s2, err := Open(short, dir); !errors.Is(err, ErrDirInUse) {
		if err == nil {
			s2.Close()
		}
		t.Fatalf("an open past its wait: %v, want ErrDirInUse", err)
	}
	busy := make(chan struct{}, 1)
	cfg := openCfg(t)
	cfg.LockWait = time.Minute
	cfg.hooks = &hooks{lockBusy: func() {
		select {
		case busy <- struct{}{}:
		default:
		}
	}}
	opened := make(chan error, 1)
	go func() {
		s2, err := Open(cfg, dir)
		if err == nil {
			s2.Close()
		}
		opened <- err
	}()
	<-busy // it found the lock held and waits
	s.Close()
	if err := <-opened; err != nil {
		t.Fatalf("an open waiting for the holder, after the holder closed: %v", err)
	}
}
