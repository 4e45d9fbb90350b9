package object

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// durableHelper is a store in another process: it puts three objects, persists
// the first two, prints their ids and the third's, and waits to be killed.
func durableHelper(dir string) int {
	cfg := DefaultLocalConfig()
	cfg.ShmDir = os.Getenv("ATOLL_OBJECT_DURABLE_SHM")
	cfg.Location = "old:1"
	s, err := Open(cfg, dir)
	if err != nil {
		fmt.Println("ERR", err)
		return 1
	}
	ctx := context.Background()
	var ids []string
	for i, n := range []int{3<<20 + 11, 1000, 2 << 20} { // a segment, a slab slot, one never persisted
		id, err := s.Put(ctx, fmt.Sprintf("owner-%d", i), randBytes(n, uint64(n)))
		if err != nil {
			fmt.Println("ERR", err)
			return 1
		}
		if i < 2 {
			if _, err := s.Persist(ctx, id); err != nil {
				fmt.Println("ERR", err)
				return 1
			}
		}
		ids = append(ids, id.String())
	}
	fmt.Println(strings.Join(ids, " "))
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n') // never comes: the test kills this process
	return 0
}

// TestPersistSurvivesSIGKILL: what Persist acknowledged is on disk when the
// process that held the store is killed with SIGKILL; the next Open adopts it,
// verified, owned as before and registered at the new location; what was never
// persisted is gone.
func TestPersistSurvivesSIGKILL(t *testing.T) {
	dir, shm := t.TempDir(), t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "ATOLL_OBJECT_DURABLE="+dir, "ATOLL_OBJECT_DURABLE_SHM="+shm)
	stdin, _ := cmd.StdinPipe()
	defer stdin.Close()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || strings.HasPrefix(line, "ERR") {
		t.Fatalf("store process: %q %v", line, err)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	var ids []ID
	for _, f := range strings.Fields(line) {
		id, err := ParseID(f)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}

	md := NewMemDirectory()
	cfg := openCfg(t)
	cfg.ShmDir, cfg.Directory, cfg.Location = shm, md, "new:2"
	s, err := Open(cfg, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	for i, n := range []int{3<<20 + 11, 1000} {
		v, err := s.Get(ctx, ids[i])
		if err != nil {
			t.Fatalf("persisted object %d after SIGKILL: %v", i, err)
		}
		if !bytes.Equal(v.Bytes(), randBytes(n, uint64(n))) {
			t.Fatalf("persisted object %d: bytes differ", i)
		}
		v.Release()
		m, err := md.Lookup(ctx, ids[i])
		if err != nil || !slices.Equal(m.Locations, []string{"new:2"}) || m.Owner != fmt.Sprintf("owner-%d", i) || m.Fingerprint == 0 {
			t.Fatalf("directory after adoption: %+v %v", m, err)
		}
		if !s.Durable(ids[i]) {
			t.Fatalf("adopted object %d is not durable", i)
		}
	}
	if _, err := s.Get(ctx, ids[2]); !errors.Is(err, ErrNotFound) {
		t.Fatalf("an object never persisted, after SIGKILL: %v; want ErrNotFound", err)
	}
	if got := len(s.Adopted()); got != 2 {
		t.Fatalf("adopted %d objects, want 2", got)
	}
	// Its owner's reference came back with it: releasing it frees the object and its file.
	if err := s.Release(ctx, ids[0], "owner-0"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "durable", durableName(ids[0]))); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("durable file of a freed object: %v", err)
	}
}

// TestDurableCorruptIsLost: a durable file whose bytes no longer match its
// checksum (a torn disk, a flipped bit) is not adopted: it is reported lost and
// removed, and the object is not served.
func TestDurableCorruptIsLost(t *testing.T) {
	cfg := openCfg(t)
	dir := t.TempDir()
	s, err := Open(cfg, dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	good, _ := s.Put(ctx, "o", randBytes(70000, 1))
	bad, _ := s.Put(ctx, "o", randBytes(70000, 2))
	for _, id := range []ID{good, bad} {
		if _, err := s.Persist(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	p := filepath.Join(dir, "durable", durableName(bad))
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-100] ^= 0x40
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	s, err = Open(cfg, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if lost := s.Lost(); !slices.Equal(lost, []ID{bad}) {
		t.Fatalf("lost %v, want the corrupt one %v", lost, bad)
	}
	if _, err := s.Get(ctx, bad); !errors.Is(err, ErrNotFound) {
		t.Fatalf("corrupt object served: %v", err)
	}
	if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("corrupt durable file left: %v", err)
	}
	v, err := s.Get(ctx, good)
	if err != nil || !bytes.Equal(v.Bytes(), randBytes(70000, 1)) {
		t.Fatalf("good object: %v", err)
	}
	v.Release()
}

// TestPersistFsyncsBeforeAck: Persist returns only after the file and the
// folder naming it are fsync'd; a failed fsync fails the persist and leaves no
// file and no durable copy.
func TestPersistFsyncsBeforeAck(t *testing.T) {
	var synced []string
	fail := false
	s := newTestStore(t, func(c *Config) {
		c.hooks = &hooks{sync: func(f *os.File) error {
			if fail {
				return syscall.EIO
			}
			synced = append(synced, filepath.Base(f.Name()))
			return nil
		}}
	})
	ctx := context.Background()
	id, _ := s.Put(ctx, "o", randBytes(5000, 3))
	m, err := s.Persist(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{durableName(id) + tmpSuffix, "durable"}; !slices.Equal(synced, want) {
		t.Fatalf("fsyncs before the ack: %v, want %v", synced, want)
	}
	if m.Fingerprint == 0 || m.Size != 5000 {
		t.Fatalf("persist meta %+v", m)
	}
	if _, err := s.Persist(ctx, id); err != nil || len(synced) != 2 {
		t.Fatalf("second persist: %v, %d fsyncs (want none more)", err, len(synced)-2)
	}
	fail = true
	id2, _ := s.Put(ctx, "o", randBytes(5000, 4))
	if _, err := s.Persist(ctx, id2); err == nil {
		t.Fatal("persist with a failing fsync succeeded")
	}
	if s.Durable(id2) {
		t.Fatal("an object whose fsync failed is marked durable")
	}
	es, _ := os.ReadDir(filepath.Join(s.dir, "durable"))
	if len(es) != 1 {
		t.Fatalf("durable folder holds %d files, want only the first object's", len(es))
	}
}

// TestDurableSpillsWithoutWrite: a durable object leaves the hot tier without a
// spill write (its file is its cold copy) and comes back from that file intact.
func TestDurableSpillsWithoutWrite(t *testing.T) {
	s := newTestStore(t, func(c *Config) { c.Capacity = 4 << 20 })
	ctx := context.Background()
	data := randBytes(3<<20, 5)
	id, _ := s.Put(ctx, "o", data)
	if _, err := s.Persist(ctx, id); err != nil {
		t.Fatal(err)
	}
	other, err := s.Put(ctx, "o", randBytes(3<<20, 6)) // no room for both: the durable one goes cold
	if err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.ColdObjects != 1 || st.DurableObjects != 1 {
		t.Fatalf("stats %+v: want the durable object cold", st)
	}
	if names, _ := s.spill.List(); len(names) != 0 {
		t.Fatalf("spill files %v: a durable object was written again", names)
	}
	if err := s.Release(ctx, other, "o"); err != nil {
		t.Fatal(err)
	}
	v, err := s.Get(ctx, id)
	if err != nil || !bytes.Equal(v.Bytes(), data) {
		t.Fatalf("restored from the durable file: %v", err)
	}
	v.Release()
}

// TestVerifyReadsTheCopy: Verify checks the bytes this store holds, hot or
// cold, and reports a damaged copy lost.
func TestVerifyReadsTheCopy(t *testing.T) {
	s := newTestStore(t, func(c *Config) { c.Capacity = 4 << 20 })
	ctx := context.Background()
	id, _ := s.Put(ctx, "o", randBytes(3<<20, 7))
	m, err := s.Persist(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := s.Verify(ctx, id); err != nil || got.Fingerprint != m.Fingerprint {
		t.Fatalf("verify hot: %+v %v", got, err)
	}
	if _, err := s.Put(ctx, "o", randBytes(3<<20, 8)); err != nil { // pushes it cold
		t.Fatal(err)
	}
	if got, err := s.Verify(ctx, id); err != nil || got.Fingerprint != m.Fingerprint {
		t.Fatalf("verify cold: %+v %v", got, err)
	}
	p := filepath.Join(s.dir, "durable", durableName(id))
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("XX"), 1<<20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if _, err := s.Verify(ctx, id); !errors.Is(err, ErrLost) {
		t.Fatalf("verify of a damaged file: %v, want ErrLost", err)
	}
}

// TestDropRefusesWithCause: a dropped object is refused with its cause at once
// (ErrOwnerDied when its owner ended), though a view taken before keeps its
// bytes; it is freed, with its location, when that view goes.
func TestDropRefusesWithCause(t *testing.T) {
	md := NewMemDirectory()
	s := newTestStore(t, func(c *Config) { c.Directory = md })
	ctx := context.Background()
	data := randBytes(100000, 9)
	id, _ := s.Put(ctx, "worker/a", data)
	keep, _ := s.Put(ctx, "worker/b", data)
	if err := s.AddRef(ctx, id, "reader"); err != nil {
		t.Fatal(err)
	}
	v, err := s.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.DropOwner(ctx, "worker/a", ErrOwnerDied); !slices.Equal(got, []ID{id}) {
		t.Fatalf("dropped %v, want %v", got, id)
	}
	for name, err := range map[string]error{
		"get":    func() error { _, err := s.Get(ctx, id); return err }(),
		"map":    func() error { _, err := s.Map(ctx, id, "w"); return err }(),
		"addref": s.AddRef(ctx, id, "r2"),
	} {
		if !errors.Is(err, ErrOwnerDied) {
			t.Fatalf("%s after the owner died: %v, want ErrOwnerDied", name, err)
		}
	}
	if !bytes.Equal(v.Bytes(), data) {
		t.Fatal("a view taken before the drop lost its bytes")
	}
	if _, err := md.Lookup(ctx, id); err != nil {
		t.Fatalf("location removed while a view pins the copy: %v", err)
	}
	v.Release()
	if _, err := md.Lookup(ctx, id); !errors.Is(err, ErrNotFound) {
		t.Fatalf("directory after the last view: %v, want the location gone", err)
	}
	if !s.Contains(keep) {
		t.Fatal("another owner's object was dropped")
	}
}

// failingReader yields n bytes, then fails.
type failingReader struct{ n int }

func (r *failingReader) Read(p []byte) (int, error) {
	if r.n == 0 {
		return 0, io.ErrClosedPipe
	}
	k := min(len(p), r.n)
	r.n -= k
	return k, nil
}

// TestPutFromStreamsAndReleases: PutFrom writes a body straight into shared
// memory; one over the limit is refused before a byte is read, naming the
// limit; a body that fails halfway leaves nothing held.
func TestPutFromStreamsAndReleases(t *testing.T) {
	s := newTestStore(t, func(c *Config) { c.Capacity = 64 << 20; c.MaxObjectSize = 16 << 20 })
	ctx := context.Background()
	data := randBytes(10<<20+3, 10)
	id := NewID()
	m, err := s.PutFrom(ctx, "o", id, int64(len(data)), bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	v, err := s.Get(ctx, id)
	if err != nil || !bytes.Equal(v.Bytes(), data) {
		t.Fatalf("streamed object: %v", err)
	}
	if fp := v.Fingerprint(ctx); fp == 0 || fp != m.Fingerprint || m.Size != int64(len(data)) {
		t.Fatalf("fingerprint %x, put returned %+v", fp, m)
	}
	v.Release()
	r := &failingReader{n: 1 << 30}
	_, err = s.PutFrom(ctx, "o", NewID(), 17<<20, r)
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), fmt.Sprint(16<<20)) {
		t.Fatalf("over the limit: %v; want ErrTooLarge naming %d", err, 16<<20)
	}
	if r.n != 1<<30 {
		t.Fatal("a body over the limit was read")
	}
	before := s.Stats()
	if _, err := s.PutFrom(ctx, "o", NewID(), 12<<20, &failingReader{n: 5 << 20}); !errors.Is(err, io.ErrClosedPipe) {
		t.Fatalf("failing body: %v", err)
	}
	if _, err := s.PutFrom(ctx, "o", NewID(), 12<<20, bytes.NewReader(make([]byte, 1<<20))); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("short body: %v", err)
	}
	after := s.Stats()
	if after.Objects != before.Objects || after.HotBytes-after.Recycled != before.HotBytes-before.Recycled {
		t.Fatalf("after failed uploads: %+v, before %+v: their room is still held", after, before)
	}
	if got := testutil.ToFloat64(s.m.errors.WithLabelValues(reasonTooLarge)); got != 1 {
		t.Fatalf("too_large errors %v", got)
	}
}

// TestExportImport: a copy exported to a shared directory (fsync'd) is imported by
// another store, checked against its checksum; a damaged file is refused as lost.
func TestExportImport(t *testing.T) {
	shared := t.TempDir()
	md := NewMemDirectory()
	a := newTestStore(t, func(c *Config) { c.Directory = md; c.Location = "a:1" })
	b := newTestStore(t, func(c *Config) { c.Directory = md; c.Location = "b:1" })
	ctx := context.Background()
	data := randBytes(2<<20+5, 11)
	id, _ := a.Put(ctx, "checkpoint/j/g", data)
	m, err := a.Export(ctx, id, shared)
	if err != nil || m.Fingerprint == 0 || !m.Durable {
		t.Fatalf("export: %+v %v", m, err)
	}
	if vm, err := VerifyFile(shared, id); err != nil || vm.Fingerprint != m.Fingerprint || vm.Owner != "checkpoint/j/g" {
		t.Fatalf("verify file: %+v %v", vm, err)
	}
	got, err := b.Import(ctx, "reader", id, shared)
	if err != nil || got.Fingerprint != m.Fingerprint {
		t.Fatalf("import: %+v %v", got, err)
	}
	v, err := b.Get(ctx, id)
	if err != nil || !bytes.Equal(v.Bytes(), data) {
		t.Fatalf("imported copy: %v", err)
	}
	v.Release()
	if dm, _ := md.Lookup(ctx, id); !slices.Contains(dm.Locations, "b:1") {
		t.Fatalf("the imported copy is not registered: %+v", dm)
	}
	other := NewID()
	if _, err := b.Import(ctx, "reader", other, shared); !errors.Is(err, ErrNotFound) {
		t.Fatalf("import of a missing file: %v", err)
	}
	id2, _ := a.Put(ctx, "o", data)
	if _, err := a.Export(ctx, id2, shared); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(shared, durableName(id2))
	f, _ := os.OpenFile(p, os.O_WRONLY, 0)
	_, _ = f.WriteAt([]byte("zz"), 1<<20)
	f.Close()
	if _, err := VerifyFile(shared, id2); !errors.Is(err, ErrLost) {
		t.Fatalf("verify of a damaged file: %v", err)
	}
	if _, err := b.Import(ctx, "reader", id2, shared); !errors.Is(err, ErrLost) {
		t.Fatalf("import of a damaged file: %v", err)
	}
	if b.Contains(id2) {
		t.Fatal("a damaged import was kept")
	}
	if err := RemoveFile(shared, id2); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("file not removed")
	}
}
