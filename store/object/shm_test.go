package object

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// fakeStatfs reports a shared-memory file system with free bytes free.
func fakeStatfs(free int64) func(string) (int64, int64, error) {
	return func(string) (int64, int64, error) { return free, free, nil }
}

// budgetMapPair makes shared-memory files as mapPair does, but fails with ENOSPC
// once the files in the store's directory would pass budget bytes: a tmpfs of
// that size, shared by nobody else.
func budgetMapPair(budget int64) func(string, int64) ([]byte, []byte, error) {
	return func(path string, size int64) ([]byte, []byte, error) {
		var used int64
		es, _ := os.ReadDir(filepath.Dir(path))
		for _, e := range es {
			if fi, err := e.Info(); err == nil {
				used += fi.Size()
			}
		}
		if used+size > budget {
			return nil, nil, fmt.Errorf("object: allocate shm %s (%d bytes): %w", path, size, syscall.ENOSPC)
		}
		return mapPair(path, size)
	}
}

// TestSmallShm: a store on a shared-memory file system smaller than its
// capacity shrinks its hot tier to fit and spills to disk, instead of failing
// every allocation; one with almost nothing free says so at Open.
func TestSmallShm(t *testing.T) {
	s := newTestStore(t, func(c *Config) { c.statfs = fakeStatfs(8 << 20) })
	if c := s.Capacity(); c > 8<<20 || c < 6<<20 {
		t.Fatalf("capacity %d with 8 MiB of shared memory free", c)
	}
	ctx := context.Background()
	var ids []ID
	for i := range 24 {
		id, err := s.Put(ctx, "o", randBytes(1<<20, uint64(i)))
		if err != nil {
			t.Fatalf("put %d of 24 MiB into 8 MiB of shared memory: %v", i, err)
		}
		ids = append(ids, id)
	}
	if st := s.Stats(); st.ColdObjects == 0 || st.HotBytes > st.Capacity {
		t.Fatalf("stats %+v: want spilled objects, hot bytes within capacity", st)
	}
	for i, id := range ids {
		v, err := s.Get(ctx, id)
		if err != nil || !bytes.Equal(v.Bytes(), randBytes(1<<20, uint64(i))) {
			t.Fatalf("object %d: %v", i, err)
		}
		v.Release()
	}

	cfg := openCfg(t)
	cfg.statfs = fakeStatfs(512 << 10)
	if s, err := Open(cfg, t.TempDir()); !errors.Is(err, ErrShmTooSmall) {
		if err == nil {
			s.Close()
		}
		t.Fatalf("open with 512 KiB of shared memory: %v, want ErrShmTooSmall", err)
	}
}

// TestShmFullRetries: when the shared-memory file system fills before the hot
// tier's capacity does (it shrank, or others use it), an allocation makes room
// and tries again; when nothing can make room it gives up after a bounded
// number of tries with ErrStoreFull wrapping the file system's ENOSPC.
func TestShmFullRetries(t *testing.T) {
	s := newTestStore(t, func(c *Config) {
		c.Capacity = 32 << 20
		c.hooks = &hooks{mapPair: budgetMapPair(6 << 20)}
	})
	ctx := context.Background()
	var ids []ID
	for i := range 12 {
		id, err := s.Put(ctx, "o", randBytes(1<<20, uint64(i)))
		if err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
		ids = append(ids, id)
	}
	if got := testutil.ToFloat64(s.m.shmRetries); got == 0 {
		t.Fatal("no allocation found shared memory full: the case did not occur")
	}
	if s.Stats().ColdObjects == 0 {
		t.Fatal("nothing spilled to make room")
	}
	// Pin everything in shared memory: no room can be made, and the put fails fast.
	for _, id := range ids {
		s.mu.Lock()
		hot := s.objs[id].state == stateHot
		s.mu.Unlock()
		if !hot {
			continue
		}
		v, err := s.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		defer v.Release()
	}
	_, err := s.Put(ctx, "o", randBytes(1<<20, 99))
	if !errors.Is(err, ErrStoreFull) || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("put with shared memory full of pinned objects: %v, want ErrStoreFull and ENOSPC", err)
	}
}

// tmpfsResult is what the tmpfs helper process reports.
type tmpfsResult struct {
	Capacity []int64 `json:"capacity"`
	Puts     int     `json:"puts"`
	Cold     int     `json:"cold"`
	Read     int     `json:"read"`
	Err      string  `json:"err,omitempty"`
}

// tmpfsHelper runs in a private mount namespace: it mounts an 8 MiB tmpfs,
// opens two stores on it (each asking for 256 MiB, as the embedded default's
// machines do) and puts 32 MiB into them.
func tmpfsHelper() int {
	res := tmpfsResult{}
	err := func() error {
		mnt, err := os.MkdirTemp("", "atoll-tmpfs")
		if err != nil {
			return err
		}
		defer os.RemoveAll(mnt)
		if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size=8m"); err != nil {
			return fmt.Errorf("mount: %w", err)
		}
		defer syscall.Unmount(mnt, 0)
		ctx := context.Background()
		var stores []*Store
		for range 2 {
			cfg := DefaultLocalConfig()
			cfg.ShmDir = mnt
			dir, err := os.MkdirTemp("", "atoll-tmpfs-store")
			if err != nil {
				return err
			}
			defer os.RemoveAll(dir)
			s, err := Open(cfg, dir)
			if err != nil {
				return err
			}
			defer s.Close()
			stores = append(stores, s)
			res.Capacity = append(res.Capacity, s.Capacity())
		}
		var ids []ID
		for i := range 32 {
			id, err := stores[i%2].Put(ctx, "o", randBytes(1<<20, uint64(i)))
			if err != nil {
				return fmt.Errorf("put %d: %w", i, err)
			}
			ids = append(ids, id)
			res.Puts++
		}
		for i, id := range ids {
			v, err := stores[i%2].Get(ctx, id)
			if err != nil {
				return fmt.Errorf("get %d: %w", i, err)
			}
			if !bytes.Equal(v.Bytes(), randBytes(1<<20, uint64(i))) {
				return fmt.Errorf("object %d differs", i)
			}
			v.Release()
			res.Read++
		}
		for _, s := range stores {
			res.Cold += s.Stats().ColdObjects
		}
		return nil
	}()
	if err != nil {
		res.Err = err.Error()
	}
	_ = json.NewEncoder(os.Stdout).Encode(res)
	return 0
}

// TestSmallTmpfs runs the stores on a real 8 MiB tmpfs, in a helper process in
// its own mount namespace (unshare). It is skipped where that is not allowed.
func TestSmallTmpfs(t *testing.T) {
	args := []string{"-m", "--propagation", "private"}
	if os.Geteuid() != 0 {
		args = append([]string{"-r"}, args...)
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("no unshare(1): cannot mount a small tmpfs here")
	}
	probe := exec.Command("unshare", append(args, "true")...)
	if out, err := probe.CombinedOutput(); err != nil {
		t.Skipf("unshare not permitted here (%v: %s): cannot mount a small tmpfs", err, strings.TrimSpace(string(out)))
	}
	cmd := exec.Command("unshare", append(args, os.Args[0], "-test.run=^$")...)
	cmd.Env = append(os.Environ(), "ATOLL_OBJECT_TMPFS=1")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helper: %v (%s)", err, out)
	}
	var res tmpfsResult
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("helper said %q: %v", out, err)
	}
	if res.Err != "" {
		if strings.Contains(res.Err, "mount:") {
			t.Skipf("cannot mount tmpfs: %s", res.Err)
		}
		t.Fatalf("on an 8 MiB tmpfs: %s (after %d puts, %d reads)", res.Err, res.Puts, res.Read)
	}
	for _, c := range res.Capacity {
		if c > 8<<20 {
			t.Fatalf("capacity %d on an 8 MiB tmpfs", c)
		}
	}
	if res.Puts != 32 || res.Read != 32 || res.Cold == 0 {
		t.Fatalf("%+v: want 32 puts and reads, some of them spilled", res)
	}
}
