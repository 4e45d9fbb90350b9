package transfer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap/zaptest"

	"github.com/atoll-run/atoll/store/object"
)

// gatedConn reads normally until after bytes, then blocks until gate closes (or
// the connection is closed): a pull that is in progress, with its object created
// but not sealed, for as long as the test wants.
type gatedConn struct {
	net.Conn
	after  int64
	n      int64
	gate   <-chan struct{}
	closed chan struct{}
	once   sync.Once
}

func (c *gatedConn) Read(p []byte) (int, error) {
	if c.n > c.after {
		select {
		case <-c.gate:
		case <-c.closed:
			return 0, net.ErrClosed
		}
	}
	n, err := c.Conn.Read(p[:min(len(p), 64<<10)]) // small reads: the gate holds precisely
	c.n += int64(n)
	return n, err
}

func (c *gatedConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// flightRig is a source node holding an object and a destination node whose
// client's connections can be wrapped (gated, made to die) while wrap is set.
type flightRig struct {
	src, dst *node
	other    *Client // a second client pulling into the same store
	data     []byte
	id       object.ID
	wrap     atomic.Pointer[func(net.Conn) net.Conn]
}

func newFlightRig(t *testing.T) *flightRig {
	log := zaptest.NewLogger(t)
	r := &flightRig{src: newNode(t, log, nil), data: randBytes(4<<20+5, 21)}
	r.id = object.ContentID(r.data)
	if err := r.src.store.PutID(context.Background(), "o", r.id, r.data); err != nil {
		t.Fatal(err)
	}
	r.dst = newNode(t, log, func(c *ClientConfig) {
		d := &net.Dialer{}
		c.Dial = func(ctx context.Context, addr string) (net.Conn, error) {
			conn, err := d.DialContext(ctx, "tcp", addr)
			if w := r.wrap.Load(); err == nil && w != nil {
				return (*w)(conn), nil
			}
			return conn, err
		}
	})
	ccfg := DefaultClientConfig()
	ccfg.Token, ccfg.Logger = testToken, log
	ccfg.Chunk.Min, ccfg.Chunk.Initial = 64<<10, 256<<10
	other, err := NewClient(ccfg)
	if err != nil {
		t.Fatal(err)
	}
	r.other = other
	return r
}

// gate makes the destination client's next connections stall after 1 MiB
// until the returned function is called.
func (r *flightRig) gate() (open func()) {
	g := make(chan struct{})
	w := func(c net.Conn) net.Conn {
		return &gatedConn{Conn: c, after: 1 << 20, gate: g, closed: make(chan struct{})}
	}
	r.wrap.Store(&w)
	var once sync.Once
	return func() { once.Do(func() { close(g) }) }
}

// startLeader starts a pull by the destination client and returns once its object
// exists in the destination store (pending: the pull is in progress).
func (r *flightRig) startLeader(t *testing.T, ctx context.Context, locs []string) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	created := make(chan struct{})
	go func() {
		done <- r.dst.client.Pull(ctx, r.dst.store, r.id, locs, PullOptions{Owner: "leader", OnCreated: func() { close(created) }})
	}()
	select {
	case <-created:
	case err := <-done:
		t.Fatalf("the leader's pull ended before creating its object: %v", err)
	}
	if r.dst.store.Contains(r.id) {
		t.Fatal("the object is sealed already; the gate did not hold the pull")
	}
	return done
}

// waits counts the pulls of the destination client that start waiting for its
// pull in progress; call it before starting any pull.
func (r *flightRig) waits() <-chan struct{} {
	ch := make(chan struct{}, 256)
	r.dst.client.waitHook = func() { ch <- struct{}{} }
	return ch
}

// await receives n values from ch: n pulls are waiting.
func await(ch <-chan struct{}, n int) {
	for range n {
		<-ch
	}
}

// followers starts n pulls of the same object into the same store, alternately
// through the same client and through another one, and returns their errors.
func (r *flightRig) followers(ctx context.Context, n int, locs []string) func() []error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := r.dst.client
			if i%2 == 1 {
				cl = r.other
			}
			errs[i] = cl.Pull(ctx, r.dst.store, r.id, locs, PullOptions{Owner: fmt.Sprintf("f%d", i)})
		}()
	}
	return func() []error { wg.Wait(); return errs }
}

func TestConcurrentPullsSingleFlight(t *testing.T) {
	const n = 24
	r := newFlightRig(t)
	ctx := ctxT(t)
	open := r.gate()
	defer open()
	waiting := r.waits()
	leader := r.startLeader(t, ctx, []string{r.src.addr})
	wait := r.followers(ctx, n, []string{r.src.addr})
	// The same client's followers (half of them) wait for the leader's pull;
	// the other client's wait in the store (Await).
	await(waiting, n/2)
	open()
	if err := <-leader; err != nil {
		t.Fatalf("leader: %v", err)
	}
	for i, err := range wait() {
		if err != nil {
			t.Fatalf("follower %d: %v", i, err)
		}
	}
	if !bytes.Equal(getBytes(t, r.dst.store, r.id), r.data) {
		t.Fatal("bytes differ")
	}
	// One copy crossed the wire: the source served the object once. The source counts a
	// chunk once its write returned, which can be after the puller has read it: wait until
	// the count reaches one copy (or the test's context ends), then it must be exactly that.
	served := func() float64 { return testutil.ToFloat64(r.src.m.BytesServed) }
	for served() < float64(len(r.data)) && ctx.Err() == nil {
		time.Sleep(5 * time.Millisecond)
	}
	if got := served(); got != float64(len(r.data)) {
		t.Fatalf("source served %v bytes, want %d (one pull)", got, len(r.data))
	}
	if got := testutil.ToFloat64(r.dst.m.Pulls) + testutil.ToFloat64(r.other.m.Pulls); got != 1 {
		t.Fatalf("%v pulls completed, want 1", got)
	}
	// Every caller holds its own reference: the object lives until the last one
	// is released.
	owners := []string{"leader"}
	for i := range n {
		owners = append(owners, fmt.Sprintf("f%d", i))
	}
	for i, o := range owners {
		if !r.dst.store.Contains(r.id) {
			t.Fatalf("freed before %s (%d of %d) released", o, i, len(owners))
		}
		if err := r.dst.store.Release(ctx, r.id, o); err != nil {
			t.Fatalf("release by %s: %v", o, err)
		}
	}
	if r.dst.store.Contains(r.id) {
		t.Fatal("object outlived every reference")
	}
}

func TestConcurrentPullsSourceDies(t *testing.T) {
	const n = 12
	// dying wraps gated connections that kill the source once 2 MiB arrived.
	dying := func(r *flightRig) (open func(), read *atomic.Int64) {
		read = &atomic.Int64{}
		g := make(chan struct{})
		var once sync.Once
		kill := func() {
			once.Do(func() {
				go func() {
					sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					defer cancel()
					r.src.server.Shutdown(sctx)
				}()
			})
		}
		w := func(c net.Conn) net.Conn {
			if c.RemoteAddr().String() != r.src.addr {
				return c // only the first source dies
			}
			return &gatedConn{Conn: &dyingConn{Conn: c, n: read, limit: 2 << 20, kill: kill}, after: 1 << 20, gate: g, closed: make(chan struct{})}
		}
		r.wrap.Store(&w)
		var o sync.Once
		return func() { o.Do(func() { close(g) }) }, read
	}
	t.Run("another location", func(t *testing.T) {
		r := newFlightRig(t)
		ctx := ctxT(t)
		second := newNode(t, zaptest.NewLogger(t), nil)
		if err := second.store.PutID(ctx, "o", r.id, r.data); err != nil {
			t.Fatal(err)
		}
		locs := []string{r.src.addr, second.addr}
		open, read := dying(r)
		defer open()
		waiting := r.waits()
		leader := r.startLeader(t, ctx, locs)
		wait := r.followers(ctx, n, locs)
		await(waiting, n/2)
		open()
		if err := <-leader; err != nil {
			t.Fatalf("leader: %v", err)
		}
		for i, err := range wait() {
			if err != nil {
				t.Fatalf("follower %d: %v", i, err)
			}
		}
		if read.Load() < 2<<20 {
			t.Fatalf("the first source served %d bytes: it did not die mid-pull", read.Load())
		}
		if !bytes.Equal(getBytes(t, r.dst.store, r.id), r.data) {
			t.Fatal("bytes differ")
		}
		if got := testutil.ToFloat64(r.dst.m.Pulls) + testutil.ToFloat64(r.other.m.Pulls); got != 1 {
			t.Fatalf("%v pulls completed, want 1", got)
		}
	})
	t.Run("no other location", func(t *testing.T) {
		r := newFlightRig(t)
		ctx := ctxT(t)
		locs := []string{r.src.addr}
		open, _ := dying(r)
		defer open()
		waiting := r.waits()
		leader := r.startLeader(t, ctx, locs)
		wait := r.followers(ctx, n, locs)
		await(waiting, n/2)
		open()
		if err := <-leader; !errors.Is(err, ErrObjectLost) {
			t.Fatalf("leader: %v, want ErrObjectLost", err)
		}
		// Each follower tried in turn after the pull it waited for failed, and
		// found no source either: a clear error, never "already exists".
		for i, err := range wait() {
			if !errors.Is(err, ErrObjectLost) || errors.Is(err, object.ErrExists) {
				t.Fatalf("follower %d: %v, want ErrObjectLost", i, err)
			}
		}
		if st := r.dst.store.Stats(); r.dst.store.Contains(r.id) || st.Objects != 0 || st.HotBytes != st.Recycled {
			t.Fatalf("failed pulls left an object or its room behind: %+v", st)
		}
	})
}

func TestConcurrentPullsContext(t *testing.T) {
	t.Run("follower gives up, leader finishes", func(t *testing.T) {
		r := newFlightRig(t)
		ctx := ctxT(t)
		open := r.gate()
		defer open()
		leader := r.startLeader(t, ctx, []string{r.src.addr})
		for _, cl := range []*Client{r.dst.client, r.other} { // flight wait, and Await in the store
			fctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			start := time.Now()
			err := cl.Pull(fctx, r.dst.store, r.id, []string{r.src.addr}, PullOptions{Owner: "impatient"})
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("impatient follower: %v, want DeadlineExceeded", err)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Fatalf("impatient follower returned after %v", d)
			}
		}
		open()
		if err := <-leader; err != nil {
			t.Fatalf("leader: %v", err)
		}
		if err := r.dst.store.Release(ctx, r.id, "impatient"); !errors.Is(err, object.ErrNotHolder) {
			t.Fatalf("a follower that gave up holds a reference: %v", err)
		}
	})
	t.Run("leader cancelled, a follower takes over", func(t *testing.T) {
		r := newFlightRig(t)
		ctx := ctxT(t)
		open := r.gate()
		defer open()
		lctx, cancelLeader := context.WithCancel(ctx)
		waiting := r.waits()
		leader := r.startLeader(t, lctx, []string{r.src.addr})
		r.wrap.Store(nil) // the follower's own connections are not gated
		wait := r.followers(ctx, 4, []string{r.src.addr})
		await(waiting, 2)
		cancelLeader()
		if err := <-leader; !errors.Is(err, context.Canceled) {
			t.Fatalf("leader: %v, want Canceled", err)
		}
		// The leader's connections that were idle when it was cancelled went
		// back to the pool, gate and all: a follower may take them.
		open()
		for i, err := range wait() {
			if err != nil {
				t.Fatalf("follower %d: %v", i, err)
			}
		}
		if !bytes.Equal(getBytes(t, r.dst.store, r.id), r.data) {
			t.Fatal("bytes differ")
		}
		if err := r.dst.store.Release(ctx, r.id, "leader"); !errors.Is(err, object.ErrNotHolder) {
			t.Fatalf("the cancelled leader holds a reference: %v", err)
		}
	})
}

// TestNodeGetConcurrent: many gets of the same remote object on one node make
// one copy, and each caller gets its own reference (the runtime releases one per
// get that pulled).
func TestNodeGetConcurrent(t *testing.T) {
	dir := object.NewMemDirectory()
	a, b := startTestNodes(t, dir, nil)
	ctx := ctxT(t)
	data := randBytes(8<<20, 31)
	id, err := a.Store.Put(ctx, "driver", data)
	if err != nil {
		t.Fatal(err)
	}
	const n = 16
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, err := b.Get(ctx, id, fmt.Sprintf("w%d", i))
			if err == nil {
				if !bytes.Equal(v.Bytes(), data) {
					err = errors.New("bytes differ")
				}
				v.Release()
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	refs := 0
	for i, err := range errs {
		if err != nil {
			t.Fatalf("get %d: %v", i, err)
		}
		if b.Store.Release(ctx, id, fmt.Sprintf("w%d", i)) == nil {
			refs++
		}
	}
	if got := testutil.ToFloat64(a.Metrics.BytesServed); got != float64(len(data)) {
		t.Fatalf("a served %v bytes, want %d (one pull)", got, len(data))
	}
	// Gets that found the object already sealed add no reference; the others each
	// held one, and once all are released the copy is gone.
	if refs < 1 || b.Store.Contains(id) {
		t.Fatalf("%d references released, object still there: %v", refs, b.Store.Contains(id))
	}
}
