package object

import (
	"context"
	"errors"
	"io"
	"sync"
	"testing"
	"time"
)

// gateFS is a SpillFS whose Create tells the test that a spill has started and
// then waits until the test lets it go on, so a test can act while a spill is
// in flight (with s.mu released).
type gateFS struct {
	SpillFS
	started chan string   // receives the name of each Create
	proceed chan struct{} // closed by the test to let spills continue
}

func newGateFS(fs SpillFS) *gateFS {
	return &gateFS{SpillFS: fs, started: make(chan string, 16), proceed: make(chan struct{})}
}

func (g *gateFS) Create(name string) (io.WriteCloser, error) {
	g.started <- name
	<-g.proceed
	return g.SpillFS.Create(name)
}

// TestFreedWhileSpilling: an object whose last reference goes while it is being
// spilled is freed when the spill ends, and its location is removed from the
// directory, whether the spill succeeded or failed for lack of disk. The put
// that needed the room gets it either way.
func TestFreedWhileSpilling(t *testing.T) {
	for _, tc := range []struct {
		name  string
		limit int64 // spill budget; 0: unlimited
	}{
		{"spill succeeds", 0},
		{"spill fails, disk full", 4 << 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var fs SpillFS = DirFS{Dir: t.TempDir()}
			if tc.limit > 0 {
				fs = &LimitFS{FS: fs, Limit: tc.limit}
			}
			gate := newGateFS(fs)
			dir := NewMemDirectory()
			s := newTestStore(t, func(c *Config) { c.Capacity = 2 << 20; c.Spill = gate; c.Directory = dir })
			ctx := context.Background()
			a, err := s.Put(ctx, "o", randBytes(1<<20, 1)) // the least recently used: the victim
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.Put(ctx, "o", randBytes(1<<20, 2)); err != nil {
				t.Fatal(err)
			}
			put := make(chan error, 1)
			go func() { _, err := s.Put(ctx, "o", randBytes(1<<20, 3)); put <- err }()
			select {
			case <-gate.started: // a's spill is in flight
			case err := <-put:
				t.Fatalf("put finished without spilling: %v", err)
			}
			if err := s.Release(ctx, a, "o"); err != nil {
				t.Fatal(err)
			}
			if _, err := dir.Lookup(ctx, a); err != nil {
				t.Fatalf("a left the directory before its spill ended: %v", err)
			}
			close(gate.proceed)
			if err := <-put; err != nil {
				t.Fatalf("put that needed a's room: %v", err)
			}
			if s.Contains(a) {
				t.Fatal("a outlived its last reference")
			}
			if m, err := dir.Lookup(ctx, a); !errors.Is(err, ErrNotFound) {
				t.Fatalf("directory still names a freed object: %+v %v", m, err)
			}
			if names, _ := fs.List(); len(names) != 0 {
				t.Fatalf("spill files left for a freed object: %v", names)
			}
		})
	}
}

// failDirectory is a MemDirectory whose Register fails while fail is set, and
// which records the context of each call.
type failDirectory struct {
	*MemDirectory
	mu   sync.Mutex
	fail error
	ctxs []context.Context
}

func (d *failDirectory) Register(ctx context.Context, m Meta) error {
	d.mu.Lock()
	err := d.fail
	d.ctxs = append(d.ctxs, ctx)
	d.mu.Unlock()
	if err != nil {
		return err
	}
	return d.MemDirectory.Register(ctx, m)
}

var errNoQuorum = errors.New("no quorum (injected)")

// TestSealRegisterFails: a seal whose directory registration fails leaves no
// object behind (no orphan that nobody will ever release), and the error says why.
func TestSealRegisterFails(t *testing.T) {
	dir := &failDirectory{MemDirectory: NewMemDirectory(), fail: errNoQuorum}
	s := newTestStore(t, func(c *Config) { c.Directory = dir })
	ctx := context.Background()
	for _, size := range []int{1000, 3 << 20} { // a slab slot, a segment
		id := NewID()
		if err := s.PutID(ctx, "o", id, randBytes(size, 4)); !errors.Is(err, errNoQuorum) {
			t.Fatalf("put with a failing directory: %v, want the directory's error", err)
		}
		if s.Contains(id) {
			t.Fatal("a put that failed left a sealed object")
		}
		if _, err := s.Get(ctx, id); !errors.Is(err, ErrNotFound) {
			t.Fatalf("get after the failed put: %v", err)
		}
		if err := s.Await(ctx, id, "h"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("await after the failed put: %v", err)
		}
		if st := s.Stats(); st.Objects != 0 {
			t.Fatalf("stats after the failed put: %+v", st)
		}
	}
	// Once the directory works again, the same id can be put.
	dir.mu.Lock()
	dir.fail = nil
	dir.mu.Unlock()
	id := NewID()
	if err := s.PutID(ctx, "o", id, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if !s.Contains(id) {
		t.Fatal("put lost")
	}
}

type ctxKey struct{}

// TestFingerprintUsesCallersContext: the directory write that records an
// object's first fingerprint runs under the caller's context (its deadline and
// values), not a background one.
func TestFingerprintUsesCallersContext(t *testing.T) {
	dir := &failDirectory{MemDirectory: NewMemDirectory()}
	s := newTestStore(t, func(c *Config) { c.Directory = dir })
	id, err := s.Put(context.Background(), "o", randBytes(5000, 5))
	if err != nil {
		t.Fatal(err)
	}
	check := func(name string, fp func(ctx context.Context) uint64) {
		t.Helper()
		dir.mu.Lock()
		dir.ctxs = nil
		dir.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.WithValue(context.Background(), ctxKey{}, name), time.Minute)
		defer cancel()
		if fp(ctx) == 0 {
			t.Fatalf("%s: no fingerprint", name)
		}
		dir.mu.Lock()
		defer dir.mu.Unlock()
		if len(dir.ctxs) != 1 || dir.ctxs[0].Value(ctxKey{}) != name {
			t.Fatalf("%s: fingerprint recorded under %d contexts, not the caller's", name, len(dir.ctxs))
		}
		if _, ok := dir.ctxs[0].Deadline(); !ok {
			t.Fatalf("%s: the caller's deadline was dropped", name)
		}
	}
	check("region", func(ctx context.Context) uint64 {
		r, err := s.OpenRegion(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		fp, err := r.Fingerprint(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return fp
	})
	s.mu.Lock()
	s.objs[id].fpOK = false // forget it, to compute it again through a view
	s.mu.Unlock()
	check("view", func(ctx context.Context) uint64 {
		v, err := s.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		defer v.Release()
		return v.Fingerprint(ctx)
	})
}
