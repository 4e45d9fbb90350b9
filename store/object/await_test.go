package object

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
)

func TestCreatePendingAwait(t *testing.T) {
	tests := []struct {
		name   string
		finish func(w *Writer) error
		want   error // what Await returns
	}{
		{"sealed", func(w *Writer) error { return w.Seal(context.Background(), true) }, nil},
		{"aborted", func(w *Writer) error { w.Abort(); return nil }, ErrNotFound},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestStore(t, nil)
			ctx := context.Background()
			data := randBytes(1<<20+9, 3)
			id := ContentID(data)
			w, err := s.Create(ctx, "puller", id, int64(len(data)), xxhash.Sum64(data))
			if err != nil {
				t.Fatal(err)
			}
			// A second Create of a pending id says so, and is still ErrExists.
			if _, err := s.Create(ctx, "other", id, int64(len(data)), 0); !errors.Is(err, ErrPending) || !errors.Is(err, ErrExists) {
				t.Fatalf("second create: %v, want ErrPending and ErrExists", err)
			}
			const n = 8
			errs := make([]error, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					errs[i] = s.Await(ctx, id, "waiter")
				}()
			}
			// A waiter with a deadline gives up at its deadline.
			dctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
			if err := s.Await(dctx, id, "impatient"); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("await with deadline: %v", err)
			}
			cancel()
			copy(w.Bytes(), data)
			if err := tc.finish(w); err != nil {
				t.Fatal(err)
			}
			wg.Wait()
			for i, err := range errs {
				if !errors.Is(err, tc.want) || (tc.want == nil && err != nil) {
					t.Fatalf("waiter %d: %v, want %v", i, err, tc.want)
				}
			}
			if tc.want != nil {
				if s.Stats().Objects != 0 {
					t.Fatal("aborted object left behind")
				}
				// Once aborted, the id is free for a new Create.
				if _, err := s.Create(ctx, "next", id, 10, 0); err != nil {
					t.Fatalf("create after abort: %v", err)
				}
				return
			}
			// Every waiter took a reference: the object survives the owner's release
			// and each waiter's but the last.
			if err := s.Release(ctx, id, "puller"); err != nil {
				t.Fatal(err)
			}
			for i := range n {
				if !s.Contains(id) {
					t.Fatalf("freed with %d waiter references left", n-i)
				}
				if err := s.Release(ctx, id, "waiter"); err != nil {
					t.Fatal(err)
				}
			}
			if s.Contains(id) {
				t.Fatal("not freed after the last reference")
			}
			if err := s.Release(ctx, id, "impatient"); !errors.Is(err, ErrNotFound) {
				t.Fatalf("impatient waiter: %v", err)
			}
		})
	}
}

func TestAwaitSealedAndUnknown(t *testing.T) {
	s := newTestStore(t, nil)
	ctx := context.Background()
	data := randBytes(5000, 4)
	id, _ := s.Put(ctx, "owner", data)
	if err := s.Await(ctx, id, ""); err != nil {
		t.Fatalf("await sealed, no holder: %v", err)
	}
	if err := s.Await(ctx, id, "h"); err != nil {
		t.Fatalf("await sealed: %v", err)
	}
	if err := s.Release(ctx, id, "h"); err != nil {
		t.Fatalf("await did not add a reference: %v", err)
	}
	if err := s.Await(ctx, NewID(), "h"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("await unknown: %v", err)
	}
	w, _ := s.Create(ctx, "p", NewID(), 100, 0)
	done := make(chan error, 1)
	go func() { done <- s.Await(ctx, w.ID(), "h") }()
	time.Sleep(10 * time.Millisecond)
	s.Close()
	select {
	case err := <-done:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("await across close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("await did not end when the store closed")
	}
}

// syncClock is a fake clock safe to read from the reaper goroutine.
type syncClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *syncClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *syncClock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func TestLeaseReaper(t *testing.T) {
	clk := &syncClock{t: time.Unix(5000, 0)}
	s := newTestStore(t, func(c *Config) { c.Clock = clk.now; c.LeaseTTL = time.Second })
	ctx := context.Background()
	data := randBytes(200<<10, 5)
	id, _ := s.Put(ctx, "owner", data)
	s.Renew("actor-3") // an in-process holder (an actor) with a lease
	s.Renew("worker-9")
	for _, h := range []string{"actor-3", "worker-9"} {
		if err := s.AddRef(ctx, id, h); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Map(ctx, id, "worker-9"); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, id, "owner"); err != nil {
		t.Fatal(err)
	}
	stop := s.StartLeaseReaper(ctx, time.Millisecond)
	defer stop()
	// Both renew within the TTL: the reaper, running all along, keeps everything.
	for range 3 {
		clk.add(600 * time.Millisecond)
		s.Renew("actor-3")
		s.Renew("worker-9")
		time.Sleep(5 * time.Millisecond)
	}
	if !s.Contains(id) {
		t.Fatal("reaper freed an object whose holders renew")
	}
	// worker-9 dies; actor-3 keeps renewing.
	clk.add(600 * time.Millisecond)
	s.Renew("actor-3")
	clk.add(600 * time.Millisecond)
	s.Renew("actor-3")
	waitFor(t, func() bool { return errCount(t, s, reasonLeaseExpiry) == 1 }, "worker-9's lease expires")
	if !s.Contains(id) {
		t.Fatal("freed while actor-3 holds a reference")
	}
	if err := s.Unmap(id, "worker-9"); !errors.Is(err, ErrNotHolder) {
		t.Fatalf("dead worker's mapping survived: %v", err)
	}
	v, err := s.Get(ctx, id)
	if err != nil || !bytes.Equal(v.Bytes(), data) {
		t.Fatalf("get after expiry: %v", err)
	}
	v.Release()
	// actor-3 dies too: the last reference goes with its lease, and the object with it.
	clk.add(2 * time.Second)
	waitFor(t, func() bool { return !s.Contains(id) }, "the object is freed once its last holder's lease expires")
	stop()
	stop() // idempotent
}

func TestLeaseReaperStopsOnClose(t *testing.T) {
	s := newTestStore(t, nil)
	stop := s.StartLeaseReaper(context.Background(), time.Millisecond)
	s.Close()
	done := make(chan struct{})
	go func() { stop(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("reaper did not stop when the store closed")
	}
}

// waitFor polls cond for up to 5s (for effects of a background goroutine).
func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting: %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// BenchmarkGetRelease is the fixed cost a same-machine get adds to reading the
// bytes: Get, then Release of the view.
func BenchmarkGetRelease(b *testing.B) {
	cfg := DefaultLocalConfig()
	s, err := Open(cfg, b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	id, err := s.Put(ctx, "o", make([]byte, 1<<20))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		v, err := s.Get(ctx, id)
		if err != nil {
			b.Fatal(err)
		}
		v.Release()
	}
}

// BenchmarkSmallPut is a 1 KiB put and its release (a slab slot taken and given back).
func BenchmarkSmallPut(b *testing.B) {
	s, err := Open(DefaultLocalConfig(), b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	data := make([]byte, 1024)
	b.ReportAllocs()
	for b.Loop() {
		id, err := s.Put(ctx, "o", data)
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Release(ctx, id, "o"); err != nil {
			b.Fatal(err)
		}
	}
}
