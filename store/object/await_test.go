package object

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
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
			blocked := make(chan ID, 64)
			s := newTestStore(t, func(c *Config) { c.hooks = &hooks{awaitBlocked: func(id ID) { blocked <- id }} })
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
			// Every waiter is waiting before the writer finishes.
			for range n {
				if got := <-blocked; got != id {
					t.Fatalf("a waiter blocked on %s", got.Short())
				}
			}
			// A waiter with a deadline gives up at its deadline.
			dctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
			if err := s.Await(dctx, id, "impatient"); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("await with deadline: %v", err)
			}
			cancel()
			<-blocked // the impatient one's wait
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
	blocked := make(chan ID, 1)
	s := newTestStore(t, func(c *Config) { c.hooks = &hooks{awaitBlocked: func(id ID) { blocked <- id }} })
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
	<-blocked // waiting for the writer
	s.Close()
	if err := <-done; !errors.Is(err, ErrClosed) {
		t.Fatalf("await across close: %v", err)
	}
}

// TestLeaseReaper runs the reaper in a synctest bubble: time is fake, the
// store's Clock is the bubble's, and synctest.Wait returns once the reaper has
// done what the last advance of time made it do.
func TestLeaseReaper(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newTestStore(t, func(c *Config) { c.LeaseTTL = time.Second })
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
		stop := s.StartLeaseReaper(ctx, 100*time.Millisecond)
		defer stop()
		// Both renew within the TTL: the reaper, running all along, keeps everything.
		for range 3 {
			time.Sleep(600 * time.Millisecond)
			synctest.Wait()
			s.Renew("actor-3")
			s.Renew("worker-9")
		}
		if !s.Contains(id) || errCount(t, s, reasonLeaseExpiry) != 0 {
			t.Fatal("reaper expired a holder that renews")
		}
		// worker-9 dies; actor-3 keeps renewing.
		for range 2 {
			time.Sleep(600 * time.Millisecond)
			synctest.Wait()
			s.Renew("actor-3")
		}
		if got := errCount(t, s, reasonLeaseExpiry); got != 1 {
			t.Fatalf("%v leases expired, want worker-9's", got)
		}
		if !s.Contains(id) {
			t.Fatal("freed while actor-3 holds a reference")
		}
		if err := s.Unmap(ctx, id, "worker-9"); !errors.Is(err, ErrNotHolder) {
			t.Fatalf("dead worker's mapping survived: %v", err)
		}
		v, err := s.Get(ctx, id)
		if err != nil || !bytes.Equal(v.Bytes(), data) {
			t.Fatalf("get after expiry: %v", err)
		}
		v.Release()
		// actor-3 dies too: the last reference goes with its lease, and the object with it.
		time.Sleep(1200 * time.Millisecond)
		synctest.Wait()
		if s.Contains(id) {
			t.Fatal("the object outlived its last holder's lease")
		}
		stop()
		stop() // idempotent
	})
}

func TestLeaseReaperStopsOnClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newTestStore(t, nil)
		stop := s.StartLeaseReaper(context.Background(), time.Millisecond)
		s.Close()
		stop() // returns only once the reaper goroutine has ended
	})
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
