package object

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"
	"unsafe"

	"github.com/cespare/xxhash/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap/zaptest"
	"golang.org/x/sys/unix"
)

func randBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e37))
	b := make([]byte, n)
	for i := 0; i+8 <= n; i += 8 {
		v := r.Uint64()
		for j := 0; j < 8; j++ {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	for i := n &^ 7; i < n; i++ {
		b[i] = byte(r.Uint32())
	}
	return b
}

type testStore struct {
	*Store
	reg *prometheus.Registry
	dir string
}

func newTestStore(t *testing.T, mut func(*Config)) testStore {
	t.Helper()
	cfg := DefaultLocalConfig()
	cfg.Logger = zaptest.NewLogger(t)
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	cfg.Location = "test"
	if mut != nil {
		mut(&cfg)
	}
	dir := t.TempDir()
	s, err := Open(cfg, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return testStore{s, reg, dir}
}

func errCount(t *testing.T, s testStore, reason string) float64 {
	t.Helper()
	return testutil.ToFloat64(s.m.errors.WithLabelValues(reason))
}

func TestZeroCopyGet(t *testing.T) {
	for _, size := range []int{1<<20 + 123, 1000} { // a segment of its own; a slab slot
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			s := newTestStore(t, nil)
			ctx := context.Background()
			data := randBytes(size, 1)
			id, err := s.Put(ctx, "driver", data)
			if err != nil {
				t.Fatal(err)
			}
			v, err := s.Get(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			defer v.Release()
			if !bytes.Equal(v.Bytes(), data) {
				t.Fatal("bytes differ")
			}
			m, err := s.Map(ctx, id, "worker-1")
			if err != nil {
				t.Fatal(err)
			}
			// A second, writable mapping of the same shared-memory file: a write
			// through it must show up in the view, which proves the view is the
			// mapped pages and not a copy.
			f, err := os.OpenFile(m.Path, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			start := m.Offset &^ 4095
			w, err := unix.Mmap(int(f.Fd()), start, int(m.Offset+m.Size-start), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Munmap(w)
			w = w[m.Offset-start:]
			w[size/2] ^= 0xff
			if v.Bytes()[size/2] != data[size/2]^0xff {
				t.Fatal("view did not see a write through the shared mapping: it is a copy")
			}
			// Two gets see the same memory.
			v2, err := s.Get(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			defer v2.Release()
			if unsafe.SliceData(v2.Bytes()) != unsafe.SliceData(v.Bytes()) {
				t.Fatal("two gets returned different memory")
			}
			// A worker process maps the same bytes read-only by path and offset.
			b, unmapFn, err := MapFile(m)
			if err != nil {
				t.Fatal(err)
			}
			defer unmapFn()
			if len(b) != size || b[size/2] != w[size/2] || !bytes.Equal(b[:100], data[:100]) {
				t.Fatal("worker mapping differs")
			}
			if m.Fingerprint != xxhash.Sum64(data) {
				t.Fatal("mapping fingerprint wrong")
			}
		})
	}
}

func TestRecycleAndSlabs(t *testing.T) {
	s := newTestStore(t, func(c *Config) { c.Capacity = 16 << 20 })
	ctx := context.Background()
	// A freed large object's memory is reused by the next one of its class.
	a, _ := s.Put(ctx, "o", randBytes(3<<20, 1))
	va, _ := s.Get(ctx, a)
	pa := unsafe.SliceData(va.Bytes())
	va.Release()
	if err := s.Release(ctx, a, "o"); err != nil {
		t.Fatal(err)
	}
	d := randBytes(3<<20-100, 2)
	b, _ := s.Put(ctx, "o", d)
	vb, _ := s.Get(ctx, b)
	if unsafe.SliceData(vb.Bytes()) != pa || !bytes.Equal(vb.Bytes(), d) {
		t.Fatal("freed segment not reused, or reused with wrong bytes")
	}
	vb.Release()
	// Many small objects: far fewer files than objects, all readable.
	var ids []ID
	for i := range 3000 {
		id, err := s.Put(ctx, "o", []byte(fmt.Sprintf("object %d", i)))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	for i, id := range ids {
		v, err := s.Get(ctx, id)
		if err != nil || string(v.Bytes()) != fmt.Sprintf("object %d", i) {
			t.Fatalf("small object %d: %q %v", i, v.Bytes(), err)
		}
		v.Release()
	}
	es, _ := os.ReadDir(s.shmDir)
	if len(es) > 10 {
		t.Fatalf("%d files for 3000 small objects", len(es))
	}
	// Pressure drops recycled memory before spilling live objects.
	if err := s.Release(ctx, b, "o"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Put(ctx, "o", randBytes(14<<20, 3)); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.ColdObjects != 0 || st.HotBytes > st.Capacity {
		t.Fatalf("stats %+v: want nothing spilled, within capacity", st)
	}
}

func TestRefcountFreeing(t *testing.T) {
	s := newTestStore(t, nil)
	ctx := context.Background()
	id, err := s.Put(ctx, "owner", randBytes(4096, 2))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.AddRef(ctx, id, "reader"); err != nil {
		t.Fatal(err)
	}
	v, err := s.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name      string
		do        func() error
		wantAlive bool
	}{
		{"owner releases", func() error { return s.Release(ctx, id, "owner") }, true},
		{"reader releases", func() error { return s.Release(ctx, id, "reader") }, true}, // view still pins
		{"view released", func() error { v.Release(); return nil }, false},
	}
	for _, st := range steps {
		if err := st.do(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if got := s.Contains(id); got != st.wantAlive {
			t.Fatalf("%s: alive=%v want %v", st.name, got, st.wantAlive)
		}
	}
	if _, err := s.Directory().Lookup(ctx, id); !errors.Is(err, ErrNotFound) {
		t.Fatalf("directory still has it: %v", err)
	}
	if _, err := s.Get(ctx, id); !errors.Is(err, ErrNotFound) {
		t.Fatalf("get of freed id: %v", err)
	}
	if err := s.Release(ctx, id, "owner"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("release of freed id: %v", err)
	}
	if got := errCount(t, s, reasonNotFound); got < 2 {
		t.Fatalf("not_found counted %v times", got)
	}
	if st := s.Stats(); st.Objects != 0 || st.HotBytes > s.slabSize { // one empty slab stays cached
		t.Fatalf("stats %+v after free", st)
	}
}

func TestSpillRestoreExact(t *testing.T) {
	s := newTestStore(t, func(c *Config) { c.Capacity = 3 << 20 })
	ctx := context.Background()
	var ids []ID
	var datas [][]byte
	for i := range 6 { // 6 MiB into 3 MiB: at least 3 spill
		d := randBytes(1<<20, uint64(10+i))
		if i%2 == 0 {
			d = bytes.Repeat([]byte{byte(i)}, 1<<20) // compressible too
		}
		id, err := s.Put(ctx, "o", d)
		if err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
		ids, datas = append(ids, id), append(datas, d)
	}
	st := s.Stats()
	if st.ColdObjects < 3 || st.HotBytes > 3<<20 {
		t.Fatalf("stats %+v: want >=3 cold, hot <= capacity", st)
	}
	for i, id := range ids {
		v, err := s.Get(ctx, id)
		if err != nil {
			t.Fatalf("get %d: %v", i, err)
		}
		if !bytes.Equal(v.Bytes(), datas[i]) {
			t.Fatalf("object %d differs after restore", i)
		}
		v.Release()
	}
	if testutil.ToFloat64(s.m.restores) < 3 {
		t.Fatal("no restores counted")
	}
	// Freeing removes spill files.
	for _, id := range ids {
		if err := s.Release(ctx, id, "o"); err != nil {
			t.Fatal(err)
		}
	}
	names, _ := s.spill.List()
	if len(names) != 0 {
		t.Fatalf("spill files left after free: %v", names)
	}
}

func TestDiskFull(t *testing.T) {
	lim := &LimitFS{Limit: 64 << 10}
	s := newTestStore(t, func(c *Config) {
		c.Capacity = 2 << 20
		lim.FS = DirFS{Dir: t.TempDir()}
		c.Spill = lim
	})
	ctx := context.Background()
	a, err := s.Put(ctx, "o", randBytes(1<<20, 3)) // incompressible: cannot spill in 64 KiB
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Put(ctx, "o", randBytes(1<<20, 4)); err != nil {
		t.Fatal(err)
	}
	_, err = s.Put(ctx, "o", randBytes(1<<20, 5))
	if !errors.Is(err, ErrDiskFull) {
		t.Fatalf("put needing a spill onto a full disk: %v, want ErrDiskFull", err)
	}
	if errCount(t, s, reasonDiskFull) != 1 {
		t.Fatal("disk_full not counted once")
	}
	if lim.Used() != 0 {
		t.Fatalf("partial spill file left: %d bytes", lim.Used())
	}
	// The store is intact: the old objects are still readable, capacity not overcommitted.
	v, err := s.Get(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	v.Release()
	if st := s.Stats(); st.HotBytes > st.Capacity {
		t.Fatalf("overcommitted: %+v", st)
	}
}

func TestAdmission(t *testing.T) {
	blocked := make(chan int64, 4)
	s := newTestStore(t, func(c *Config) {
		c.Capacity = 1 << 20
		c.hooks = &hooks{admitBlocked: func(size int64) { blocked <- size }}
	})
	ctx := context.Background()
	if _, err := s.Put(ctx, "o", make([]byte, 2<<20)); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("put larger than capacity: %v", err)
	}
	id, err := s.Put(ctx, "o", make([]byte, 1<<20))
	if err != nil {
		t.Fatal(err)
	}
	v, err := s.Get(ctx, id) // pinned: cannot spill
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Put(ctx, "o", make([]byte, 10)); !errors.Is(err, ErrStoreFull) {
		t.Fatalf("no deadline: %v, want ErrStoreFull", err)
	}
	// With a deadline the putter waits, and gets in once the pin goes.
	dctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	put := make(chan error, 1)
	go func() { _, err := s.Put(dctx, "o", make([]byte, 10)); put <- err }()
	select {
	case <-blocked: // the put is waiting for room
	case err := <-put:
		t.Fatalf("put with a deadline did not wait for room: %v", err)
	}
	v.Release()
	if err := <-put; err != nil {
		t.Fatalf("waiting put: %v", err)
	}
	v, _ = s.Get(ctx, id)
	defer v.Release()
	sctx, cancel2 := context.WithTimeout(ctx, 30*time.Millisecond)
	defer cancel2()
	if _, err := s.Put(sctx, "o", make([]byte, 1<<20)); !errors.Is(err, ErrStoreFull) {
		t.Fatalf("deadline passes: %v", err)
	}
	if len(blocked) != 1 {
		t.Fatalf("the put whose deadline passed waited %d times, want once", len(blocked))
	}
	if errCount(t, s, reasonTooLarge) != 1 || errCount(t, s, reasonStoreFull) != 2 {
		t.Fatal("admission errors not counted")
	}
}

func TestRestartRediscovers(t *testing.T) {
	dir := t.TempDir()
	cfg := DefaultLocalConfig()
	cfg.Capacity = 1 << 20
	cfg.Logger = zaptest.NewLogger(t)
	s, err := Open(cfg, dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	d1, d2, d3 := randBytes(1<<20, 7), randBytes(1<<20, 8), randBytes(1<<20, 9)
	id1, _ := s.Put(ctx, "alice", d1)
	id2, _ := s.Put(ctx, "bob", d2)     // spills id1
	id3, err := s.Put(ctx, "carol", d3) // spills id2
	if err != nil {
		t.Fatal(err)
	}
	// Simulate a crash: do not Close, but drop the locks, as the kernel does when
	// a process dies; corrupt id2's spill file.
	crash(s)
	p := filepath.Join(dir, "spill", spillName(id2))
	if err := os.Truncate(p, 20); err != nil {
		t.Fatal(err)
	}
	s2, err := Open(cfg, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if _, err := os.Stat(s.shmDir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("shared memory of the crashed instance not reclaimed: %v", err)
	}
	v, err := s2.Get(ctx, id1)
	if err != nil {
		t.Fatalf("rediscovered object: %v", err)
	}
	if !bytes.Equal(v.Bytes(), d1) {
		t.Fatal("rediscovered object differs")
	}
	v.Release()
	if _, err := s2.Get(ctx, id2); !errors.Is(err, ErrNotFound) {
		t.Fatalf("corrupt spill: %v", err)
	}
	lost := s2.Lost()
	has := func(id ID) bool {
		for _, l := range lost {
			if l == id {
				return true
			}
		}
		return false
	}
	if !has(id2) || has(id1) || len(lost) != 1 {
		t.Fatalf("lost = %v; want only id2 (corrupt spill)", lost)
	}
	// id3 lived only in shared memory: a crash loses it (the directory still names
	// this location; reconciling that is the agent's job).
	if _, err := s2.Get(ctx, id3); !errors.Is(err, ErrNotFound) {
		t.Fatalf("hot-only object after restart: %v", err)
	}

	if err := s2.Release(ctx, id1, "alice"); err != nil {
		t.Fatalf("owner recorded in spill file: %v", err)
	}
}

// crash drops s's locks without cleaning up, as the kernel does for a process
// that dies: its shared memory stays until a later Open reclaims it.
func crash(s *Store) {
	s.dirLock.Close()
	s.home.lock.Close()
}

type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func TestLeaseReleasesDeadReader(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	s := newTestStore(t, func(c *Config) { c.Clock = clk.now; c.LeaseTTL = time.Second })
	ctx := context.Background()
	id, _ := s.Put(ctx, "owner", randBytes(100, 1))
	s.Renew("worker-7")
	if err := s.AddRef(ctx, id, "worker-7"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Map(ctx, id, "worker-7"); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, id, "owner"); err != nil {
		t.Fatal(err)
	}
	clk.t = clk.t.Add(500 * time.Millisecond)
	if got := s.ExpireLeases(clk.t); len(got) != 0 || !s.Contains(id) {
		t.Fatalf("expired too early: %v", got)
	}
	clk.t = clk.t.Add(time.Second) // worker-7 died and stopped renewing
	if got := s.ExpireLeases(clk.t); len(got) != 1 || got[0] != "worker-7" {
		t.Fatalf("expired %v", got)
	}
	if s.Contains(id) {
		t.Fatal("object held only by a dead reader was not freed")
	}
}

func TestParseID(t *testing.T) {
	id := NewID()
	tests := []struct {
		in   string
		want error
	}{
		{id.String(), nil},
		{"abc", ErrBadID},
		{id.String()[:63] + "z", ErrBadID},
	}
	for _, tc := range tests {
		got, err := ParseID(tc.in)
		if !errors.Is(err, tc.want) || (err == nil && got != id) {
			t.Errorf("ParseID(%q) = %v, %v", tc.in, got, err)
		}
	}
}
