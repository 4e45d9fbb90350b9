package object

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
)

// TestMain doubles as a worker process: with ATOLL_OBJECT_WORKER set to a JSON
// Mapping it maps the object read-only and prints the xxhash64 of what it sees.
func TestMain(m *testing.M) {
	if os.Getenv("ATOLL_OBJECT_TMPFS") == "1" {
		os.Exit(tmpfsHelper())
	}
	if d := os.Getenv("ATOLL_OBJECT_DURABLE"); d != "" {
		os.Exit(durableHelper(d))
	}
	if d := os.Getenv("ATOLL_OBJECT_OWNER"); d != "" {
		os.Exit(ownerHelper(d, os.Getenv("ATOLL_OBJECT_OWNER_DIR")))
	}
	if js := os.Getenv("ATOLL_OBJECT_WRITER"); js != "" {
		os.Exit(writerHelper(js))
	}
	if js := os.Getenv("ATOLL_OBJECT_WORKER"); js != "" {
		var mp Mapping
		if err := json.Unmarshal([]byte(js), &mp); err != nil {
			fmt.Println("ERR", err)
			os.Exit(1)
		}
		b, unmapFn, err := MapFile(mp)
		if err != nil {
			fmt.Println("ERR", err)
			os.Exit(1)
		}
		fmt.Printf("%x\n", xxhash.Sum64(b))
		_ = unmapFn()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestWorkerProcessMapsObject(t *testing.T) {
	s := newTestStore(t, nil)
	ctx := context.Background()
	for _, size := range []int{3<<20 + 5, 700} {
		data := randBytes(size, uint64(size))
		id, err := s.Put(ctx, "driver", data)
		if err != nil {
			t.Fatal(err)
		}
		m, err := s.Map(ctx, id, "worker-9")
		if err != nil {
			t.Fatal(err)
		}
		js, _ := json.Marshal(m)
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "ATOLL_OBJECT_WORKER="+string(js))
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("worker process: %v", err)
		}
		if got, want := strings.TrimSpace(string(out)), fmt.Sprintf("%x", xxhash.Sum64(data)); got != want {
			t.Fatalf("size %d: worker process saw hash %s, want %s", size, got, want)
		}
		if err := s.Unmap(ctx, id, "worker-9"); err != nil {
			t.Fatal(err)
		}
	}
}

// writerJob is what TestMain's writer process is told: where to write, what,
// and whether to stop halfway and wait to be killed.
type writerJob struct {
	Mapping Mapping `json:"mapping"`
	Seed    uint64  `json:"seed"`
	Stall   bool    `json:"stall"`
}

// writerHelper is a worker process putting an object: it maps the writable
// range the store gave it and writes the bytes in place.
func writerHelper(js string) int {
	var job writerJob
	if err := json.Unmarshal([]byte(js), &job); err != nil {
		fmt.Println("ERR", err)
		return 1
	}
	b, unmapFn, err := MapFileRW(job.Mapping)
	if err != nil {
		fmt.Println("ERR", err)
		return 1
	}
	data := randBytes(len(b), job.Seed)
	if job.Stall {
		copy(b[:len(b)/2], data)
		fmt.Println("half")
		_, _ = bufio.NewReader(os.Stdin).ReadString('\n') // killed here
		return 1
	}
	copy(b, data)
	if err := unmapFn(); err != nil {
		fmt.Println("ERR", err)
		return 1
	}
	fmt.Println("written")
	return 0
}

// TestWorkerProcessWritesObject: another process writes a new object straight
// into the store's shared memory (CreateFor, Writer.Mapping, MapFileRW); the
// owner seals it (the fingerprint, computed on first need as for any put, is that of
// the bytes written); nothing was copied through this process and the object is exactly what the other process wrote.
func TestWorkerProcessWritesObject(t *testing.T) {
	s := newTestStore(t, nil)
	ctx := context.Background()
	// A neighbour in a slab: the writer's range must not reach it.
	nb, _ := s.Put(ctx, "driver", randBytes(700, 5))
	for _, size := range []int{3<<20 + 5, 700, 0} {
		id := NewID()
		w, err := s.CreateFor(ctx, "worker-3", "worker-3", id, int64(size))
		if err != nil {
			t.Fatal(err)
		}
		m := w.Mapping()
		if m.Offset != 0 || m.Size != int64(size) {
			t.Fatalf("size %d: mapping %+v, want a file of its own", size, m)
		}
		if size > 0 {
			if fi, err := os.Stat(m.Path); err != nil || fi.Size() != largeClass(int64(size)) {
				t.Fatalf("size %d: the writable file is %v bytes (%v): it holds more than this object", size, fi, err)
			}
		}
		js, _ := json.Marshal(writerJob{Mapping: m, Seed: uint64(size)})
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "ATOLL_OBJECT_WRITER="+string(js))
		out, err := cmd.Output()
		if err != nil || strings.TrimSpace(string(out)) != "written" {
			t.Fatalf("size %d: writer process: %q %v", size, out, err)
		}
		if _, err := s.Get(ctx, id); !errors.Is(err, ErrNotFound) {
			t.Fatalf("size %d: visible before its seal: %v", size, err)
		}
		if err := w.Seal(ctx, false); err != nil {
			t.Fatal(err)
		}
		want := randBytes(size, uint64(size))
		v, err := s.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(v.Bytes(), want) {
			t.Fatalf("size %d: the object differs from what the worker wrote", size)
		}
		if fp := v.Fingerprint(ctx); fp != xxhash.Sum64(want) {
			t.Fatalf("size %d: fingerprint %x, want %x", size, fp, xxhash.Sum64(want))
		}
		v.Release()
		meta, err := s.Directory().Lookup(ctx, id)
		if err != nil || meta.Owner != "worker-3" || (meta.Fingerprint != 0 && meta.Fingerprint != xxhash.Sum64(want)) {
			t.Fatalf("size %d: directory %+v %v", size, meta, err)
		}
		if err := s.Release(ctx, id, "worker-3"); err != nil {
			t.Fatal(err)
		}
	}
	v, _ := s.Get(ctx, nb)
	defer v.Release()
	if !bytes.Equal(v.Bytes(), randBytes(700, 5)) {
		t.Fatal("the slab neighbour changed")
	}
	if st := s.Stats(); st.Recycled != 0 {
		t.Fatalf("%d bytes another process mapped writable went to the recycle pool", st.Recycled)
	}
}

// TestWriterProcessDies: a worker process killed while writing an object never
// seals it: its lease expires, the writer is aborted, its memory freed (the
// segment dropped, not recycled), and a late Seal fails with ErrAborted.
func TestWriterProcessDies(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	s := newTestStore(t, func(c *Config) { c.Clock = clk.now; c.LeaseTTL = time.Second })
	ctx := context.Background()
	id := NewID()
	s.Renew("worker-7")
	before := s.Stats()
	w, err := s.CreateFor(ctx, "worker-7", "worker-7", id, 3<<20)
	if err != nil {
		t.Fatal(err)
	}
	m := w.Mapping()
	js, _ := json.Marshal(writerJob{Mapping: m, Seed: 7, Stall: true})
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "ATOLL_OBJECT_WRITER="+string(js))
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	line, _ := bufio.NewReader(stdout).ReadString('\n')
	if strings.TrimSpace(line) != "half" {
		t.Fatalf("writer process said %q", line)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	clk.t = clk.t.Add(500 * time.Millisecond)
	if got := s.ExpireLeases(clk.t); len(got) != 0 || s.Stats().Objects != 1 {
		t.Fatalf("expired %v before the lease ran out", got)
	}
	clk.t = clk.t.Add(time.Second) // the dead worker stopped renewing
	if got := s.ExpireLeases(clk.t); len(got) != 1 || got[0] != "worker-7" {
		t.Fatalf("expired %v, want worker-7", got)
	}
	if st := s.Stats(); st.Objects != 0 || st.HotBytes != before.HotBytes || st.Recycled != 0 {
		t.Fatalf("stats %+v after the writer died (before: %+v): memory not freed", st, before)
	}
	if _, err := os.Stat(m.Path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the dead writer's segment: %v, want dropped", err)
	}
	if err := w.Seal(ctx, false); !errors.Is(err, ErrAborted) {
		t.Fatalf("seal after the writer died: %v, want ErrAborted", err)
	}
	if _, err := s.Get(ctx, id); !errors.Is(err, ErrNotFound) {
		t.Fatalf("get of the aborted object: %v", err)
	}
}

// TestWriterKeepsItsSegments: a freed segment that a process with a lease wrote
// (CreateFor) is kept for that process's next object of its class, uncleared (the bytes
// were its own), and never handed to another process (which gets a cleared or new one);
// the kept segments are dropped when memory is needed, the dropped files reported to
// the writer (TakeUnmapped), and all of them when its lease expires.
func TestWriterKeepsItsSegments(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	s := newTestStore(t, func(c *Config) { c.Clock = clk.now; c.LeaseTTL = time.Second })
	ctx := context.Background()
	s.Renew("worker-1")
	s.Renew("worker-2")
	write := func(holder string, size int, fill byte) (ID, Mapping) {
		t.Helper()
		id := NewID()
		w, err := s.CreateFor(ctx, holder, holder, id, int64(size))
		if err != nil {
			t.Fatal(err)
		}
		b := w.Bytes()
		for i := range b {
			b[i] = fill
		}
		if err := w.Seal(ctx, false); err != nil {
			t.Fatal(err)
		}
		return id, w.Mapping()
	}
	id1, m1 := write("worker-1", 3<<20, 0xA1)
	if err := s.Release(ctx, id1, "worker-1"); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Recycled != largeClass(3<<20) {
		t.Fatalf("recycled %d bytes after worker-1's object was freed, want its segment (%d)", st.Recycled, largeClass(3<<20))
	}
	// Another process never gets it.
	id2 := NewID()
	w2, err := s.CreateFor(ctx, "worker-2", "worker-2", id2, 3<<20)
	if err != nil {
		t.Fatal(err)
	}
	if w2.Mapping().Path == m1.Path {
		t.Fatal("worker-2 was handed worker-1's segment")
	}
	for _, c := range w2.Bytes() {
		if c != 0 {
			t.Fatal("worker-2's new segment is not clear")
		}
	}
	w2.Abort()
	// Its writer gets it back, as it left it.
	id3 := NewID()
	w3, err := s.CreateFor(ctx, "worker-1", "worker-1", id3, 3<<20-4096)
	if err != nil {
		t.Fatal(err)
	}
	if w3.Mapping().Path != m1.Path {
		t.Fatalf("worker-1's next object is in %s, want its freed segment %s", w3.Mapping().Path, m1.Path)
	}
	if w3.Bytes()[0] != 0xA1 {
		t.Fatal("the kept segment was cleared for the process that wrote it")
	}
	if err := w3.Seal(ctx, false); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, id3, "worker-1"); err != nil {
		t.Fatal(err)
	}
	// Pressure drops it, and the writer is told.
	s.mu.Lock()
	dropped := s.dropCachedLocked()
	s.mu.Unlock()
	if !dropped {
		t.Fatal("nothing dropped under pressure")
	}
	if got := s.TakeUnmapped("worker-1"); len(got) != 1 || got[0] != m1.Path {
		t.Fatalf("unmapped %v, want [%s]", got, m1.Path)
	}
	if _, err := os.Stat(m1.Path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the dropped segment: %v", err)
	}
	// A lease that expires drops what is kept.
	id4, m4 := write("worker-1", 1<<20, 1)
	if err := s.Release(ctx, id4, "worker-1"); err != nil {
		t.Fatal(err)
	}
	if s.Stats().Recycled == 0 {
		t.Fatal("worker-1's second segment was not kept")
	}
	clk.t = clk.t.Add(2 * time.Second)
	s.ExpireLeases(clk.t)
	if st := s.Stats(); st.Recycled != 0 {
		t.Fatalf("%d bytes kept for a writer whose lease expired", st.Recycled)
	}
	if _, err := os.Stat(m4.Path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the expired writer's segment: %v", err)
	}
}

// recordDirectory records every registration.
type recordDirectory struct {
	*MemDirectory
	mu    sync.Mutex
	metas []Meta
}

func (d *recordDirectory) Register(ctx context.Context, m Meta) error {
	d.mu.Lock()
	d.metas = append(d.metas, m)
	d.mu.Unlock()
	return d.MemDirectory.Register(ctx, m)
}

// TestCreateForRegistersAPut: an object another process writes in place is a new object,
// registered as a put's (Meta.Put), so a directory that writes puts' records behind the put
// (runtime/objects.WriteBehind) does so for it too, instead of a consensus round in its seal.
func TestCreateForRegistersAPut(t *testing.T) {
	dir := &recordDirectory{MemDirectory: NewMemDirectory()}
	s := newTestStore(t, func(c *Config) { c.Directory = dir })
	ctx := context.Background()
	s.Renew("worker-1")
	w, err := s.CreateFor(ctx, "owner", "worker-1", NewID(), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Seal(ctx, false); err != nil {
		t.Fatal(err)
	}
	dir.mu.Lock()
	defer dir.mu.Unlock()
	if len(dir.metas) != 1 || dir.metas[0].ID != w.ID() || !dir.metas[0].Put || dir.metas[0].Owner != "owner" {
		t.Fatalf("registrations %+v, want one put's of %s owned by owner", dir.metas, w.ID().Short())
	}
}
