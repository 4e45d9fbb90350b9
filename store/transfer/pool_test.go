package transfer

import (
	"bytes"
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
)

// TestPoolReusesConnections: consecutive pulls from one server reuse the
// connections the first one dialed; with pooling off every pull dials its own.
func TestPoolReusesConnections(t *testing.T) {
	for _, tc := range []struct {
		name           string
		maxIdle        int
		dialed, reused float64
		pulls, streams int
	}{
		{"pooled", 4, 2, 8, 5, 2},
		{"pooling off", -1, 10, 0, 5, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			log := zaptest.NewLogger(t)
			a := newNode(t, log, nil)
			b := newNode(t, log, func(c *ClientConfig) { c.MaxIdlePerPeer, c.Streams = tc.maxIdle, tc.streams })
			ctx := ctxT(t)
			for i := range tc.pulls {
				data := randBytes(4<<10, uint64(i))
				id, err := a.store.Put(ctx, "o", data)
				if err != nil {
					t.Fatal(err)
				}
				if err := b.client.Pull(ctx, b.store, id, []string{a.addr}, PullOptions{}); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(getBytes(t, b.store, id), data) {
					t.Fatalf("pull %d: bytes differ", i)
				}
			}
			if got := testutil.ToFloat64(b.m.ConnsDialed); got != tc.dialed {
				t.Errorf("dialed %v connections, want %v", got, tc.dialed)
			}
			if got := testutil.ToFloat64(b.m.ConnsReused); got != tc.reused {
				t.Errorf("reused %v connections, want %v", got, tc.reused)
			}
		})
	}
}

// pooledConns returns the connections b's client keeps for addr.
func pooledConns(cl *Client, addr string) []*Conn {
	cl.pool.mu.Lock()
	defer cl.pool.mu.Unlock()
	var cs []*Conn
	for _, it := range cl.pool.idle[addr] {
		cs = append(cs, it.c)
	}
	return cs
}

// TestPoolEvictsBroken: when the server goes away, its pooled connections are
// dropped (their readers saw the end), never handed to a pull; the next pull,
// from the server started again on the same address, dials new ones.
func TestPoolEvictsBroken(t *testing.T) {
	log := zaptest.NewLogger(t)
	a := newNode(t, log, nil)
	b := newNode(t, log, nil)
	ctx := ctxT(t)
	id, _ := a.store.Put(ctx, "o", randBytes(4<<10, 1))
	if err := b.client.Pull(ctx, b.store, id, []string{a.addr}, PullOptions{Owner: "b"}); err != nil {
		t.Fatal(err)
	}
	_ = b.store.Release(ctx, id, "b")
	pooled := pooledConns(b.client, a.addr)
	if len(pooled) != 2 {
		t.Fatalf("%d connections pooled after a pull, want 2", len(pooled))
	}
	// Restart a's server on the same address.
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := a.server.Shutdown(sctx); err != nil {
		t.Fatal(err)
	}
	for _, c := range pooled {
		<-c.done // its reader saw the connection end
	}
	ln, err := net.Listen("tcp", a.addr)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := NewServer(a.server.cfg, StoreSource{a.store})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Shutdown(context.Background())
	if err := b.client.Pull(ctx, b.store, id, []string{a.addr}, PullOptions{}); err != nil {
		t.Fatalf("pull after the server restarted: %v", err)
	}
	if got := testutil.ToFloat64(b.m.ConnsEvicted); got != 2 {
		t.Fatalf("evicted %v connections, want the 2 broken ones", got)
	}
	if got := testutil.ToFloat64(b.m.ConnsDialed); got != 4 {
		t.Fatalf("dialed %v connections, want 2 + 2 new", got)
	}
	if got := testutil.ToFloat64(b.m.Errors.WithLabelValues(reasonSourceFailed)); got != 0 {
		t.Fatalf("the source was counted failed %v times: a broken pooled connection reached the pull", got)
	}
}

// holeConn is a connection that, once its hole is opened, swallows what is
// written and never delivers anything more: a peer that vanished without a
// word (no FIN, no RST), which its reader cannot notice.
type holeConn struct {
	net.Conn
	hole   <-chan struct{}
	closed chan struct{}
	once   sync.Once
}

func (c *holeConn) Read(p []byte) (int, error) {
	select {
	case <-c.hole:
		<-c.closed
		return 0, net.ErrClosed
	default:
	}
	return c.Conn.Read(p) // may block past the hole's opening: the next Read sees it
}

func (c *holeConn) Write(p []byte) (int, error) {
	select {
	case <-c.hole:
		return len(p), nil
	default:
		return c.Conn.Write(p)
	}
}

func (c *holeConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// TestPoolHealthCheck: pooled connections whose peer vanished without notice
// fail their health check (a ping) and are replaced by new connections before
// the pull uses them; the source is not taken for dead.
func TestPoolHealthCheck(t *testing.T) {
	log := zaptest.NewLogger(t)
	a := newNode(t, log, nil)
	hole := make(chan struct{})
	var mu sync.Mutex
	var holed []*holeConn
	b := newNode(t, log, func(c *ClientConfig) {
		c.HealthCheckAfter = time.Nanosecond // ping every pooled connection before use
		c.DialTimeout = 300 * time.Millisecond
		d := &net.Dialer{}
		c.Dial = func(ctx context.Context, addr string) (net.Conn, error) {
			conn, err := d.DialContext(ctx, "tcp", addr)
			if err != nil {
				return nil, err
			}
			mu.Lock()
			defer mu.Unlock()
			if len(holed) < 2 { // the first pull's connections
				h := &holeConn{Conn: conn, hole: hole, closed: make(chan struct{})}
				holed = append(holed, h)
				return h, nil
			}
			return conn, nil
		}
	})
	ctx := ctxT(t)
	data := randBytes(64<<10, 2)
	id, _ := a.store.Put(ctx, "o", data)
	if err := b.client.Pull(ctx, b.store, id, []string{a.addr}, PullOptions{Owner: "b"}); err != nil {
		t.Fatal(err)
	}
	_ = b.store.Release(ctx, id, "b")
	if n := len(pooledConns(b.client, a.addr)); n != 2 {
		t.Fatalf("%d connections pooled, want 2", n)
	}
	close(hole) // the peer vanishes from both pooled connections
	if err := b.client.Pull(ctx, b.store, id, []string{a.addr}, PullOptions{}); err != nil {
		t.Fatalf("pull with dead pooled connections: %v", err)
	}
	if !bytes.Equal(getBytes(t, b.store, id), data) {
		t.Fatal("bytes differ")
	}
	if got := testutil.ToFloat64(b.m.ConnsEvicted); got != 2 {
		t.Fatalf("evicted %v connections, want the 2 dead ones", got)
	}
	if got := testutil.ToFloat64(b.m.Errors.WithLabelValues(reasonSourceFailed)); got != 0 {
		t.Fatalf("the source was counted failed %v times", got)
	}
}

// BenchmarkSmallPull is a 4 KiB pull between two stores in this process, with
// pooled connections and with every pull dialing its own (the same run).
func BenchmarkSmallPull(b *testing.B) {
	for _, bc := range []struct {
		name    string
		maxIdle int
	}{{"pooled", 4}, {"dial-each", -1}} {
		b.Run(bc.name, func(b *testing.B) {
			log := zap.NewNop()
			src := newNode(b, log, nil)
			dst := newNode(b, log, func(c *ClientConfig) { c.MaxIdlePerPeer = bc.maxIdle })
			ctx := context.Background()
			id, _ := src.store.Put(ctx, "o", randBytes(4<<10, 1))
			for b.Loop() {
				if err := dst.client.Pull(ctx, dst.store, id, []string{src.addr}, PullOptions{Owner: "b"}); err != nil {
					b.Fatal(err)
				}
				if err := dst.store.Release(ctx, id, "b"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
