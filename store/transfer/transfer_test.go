package transfer

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/atoll-run/atoll/store/object"
)

var testToken = []byte("test-cluster-token-0123456789")

func randBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 7))
	b := make([]byte, n+8)
	for i := 0; i < n; i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.Uint64())
	}
	return b[:n]
}

type node struct {
	store  *object.Store
	server *Server
	client *Client
	addr   string
	m      *Metrics
}

func newNode(t testing.TB, logger *zap.Logger, mutClient func(*ClientConfig)) *node {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := object.DefaultLocalConfig()
	cfg.Location = ln.Addr().String()
	cfg.Logger = logger
	st, err := object.Open(cfg, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	m, _ := NewMetrics(prometheus.NewRegistry())
	scfg := DefaultServerConfig()
	scfg.Token, scfg.Logger, scfg.Metrics = testToken, logger, m
	srv, err := NewServer(scfg, StoreSource{st})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	ccfg := DefaultClientConfig()
	ccfg.Token, ccfg.Logger, ccfg.Metrics = testToken, logger, m
	ccfg.Chunk.Min, ccfg.Chunk.Initial = 64<<10, 256<<10 // several chunks for small test objects
	if mutClient != nil {
		mutClient(&ccfg)
	}
	cl, err := NewClient(ccfg)
	if err != nil {
		t.Fatal(err)
	}
	n := &node{store: st, server: srv, client: cl, addr: ln.Addr().String(), m: m}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		cl.Close()
		srv.Shutdown(ctx)
		st.Close()
	})
	return n
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func getBytes(t *testing.T, st *object.Store, id object.ID) []byte {
	t.Helper()
	v, err := st.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Release()
	return bytes.Clone(v.Bytes())
}

func TestPullSizes(t *testing.T) {
	log := zaptest.NewLogger(t)
	a, b := newNode(t, log, nil), newNode(t, log, nil)
	for _, size := range []int{0, 1, 65535, 1 << 20, 3<<20 + 17} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			ctx := ctxT(t)
			data := randBytes(size, uint64(size))
			id, err := a.store.Put(ctx, "o", data)
			if err != nil {
				t.Fatal(err)
			}
			if err := b.client.Pull(ctx, b.store, id, []string{a.addr}, PullOptions{}); err != nil {
				t.Fatal(err)
			}
			if got := getBytes(t, b.store, id); !bytes.Equal(got, data) {
				t.Fatal("pulled bytes differ")
			}
			m, err := b.store.Directory().Lookup(ctx, id)
			if err != nil || m.Size != int64(size) {
				t.Fatalf("directory: %+v %v", m, err)
			}
		})
	}
}

func TestBadInput(t *testing.T) {
	log := zaptest.NewLogger(t)
	a := newNode(t, log, nil)
	ctx := ctxT(t)
	id, _ := a.store.Put(ctx, "o", randBytes(1000, 1))

	// Wrong token.
	bad := DefaultClientConfig()
	bad.Token = []byte("not-the-cluster-token!")
	bcl, _ := NewClient(bad)
	if _, err := bcl.Dial(ctx, a.addr); !errors.Is(err, ErrAuth) || strings.Contains(err.Error(), "server does not know") {
		t.Fatalf("wrong token: %v, want ErrAuth that does not blame the server (the client holds the wrong token)", err)
	}
	if testutil.ToFloat64(bcl.m.Errors.WithLabelValues(reasonAuth)) != 1 {
		t.Fatal("auth failure not counted by the client")
	}
	// A client that cannot prove the token is refused before it can name a key.
	{
		raw, err := net.Dial("tcp", a.addr)
		if err != nil {
			t.Fatal(err)
		}
		raw.SetDeadline(time.Now().Add(5 * time.Second))
		var buf []byte
		writeFrame(raw, &Frame{Type: FrameHello, Version: ProtocolVersion})
		if f, err := ReadFrame(raw, &buf); err != nil || f.Type != FrameChallenge {
			t.Fatalf("challenge: %+v %v", f, err)
		}
		writeFrame(raw, &Frame{Type: FrameAuth, MAC: [32]byte{1}})
		if f, err := ReadFrame(raw, &buf); err != nil || f.Type != FrameError {
			t.Fatalf("bad proof answered with %+v %v", f, err)
		}
		raw.Close()
		if testutil.ToFloat64(a.m.Errors.WithLabelValues(reasonAuth)) < 1 {
			t.Fatal("auth failure not counted by the server")
		}
	}

	c, err := a.client.Dial(ctx, a.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r, err := c.Open(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		key  Key
		off  int64
		n    int
		want error
	}{
		{"forged secret", func() Key { k := r.Key; k[20] ^= 1; return k }(), 0, 10, ErrBadKey},
		{"unknown handle", Key{0, 0, 0, 0, 0, 0, 0, 99}, 0, 10, ErrBadKey},
		{"past end", r.Key, 990, 20, ErrRange},
		{"valid", r.Key, 10, 20, nil},
	}
	for _, tc := range tests {
		dst := make([]byte, tc.n)
		err := c.ReadRange(ctx, tc.key, tc.off, dst)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
		if tc.want != nil && !bytes.Equal(dst, make([]byte, tc.n)) {
			t.Errorf("%s: bytes served without a valid key", tc.name)
		}
	}
	if got := testutil.ToFloat64(a.m.Errors.WithLabelValues(reasonBadKey)); got != 2 {
		t.Fatalf("bad keys counted %v, want 2", got)
	}
	// After CloseRegion the key is dead.
	if err := c.CloseRegion(r.Key); err != nil {
		t.Fatal(err)
	}
	// Frames on one connection are handled in order: the close is done before this read.
	if err := c.ReadRange(ctx, r.Key, 0, make([]byte, 4)); !errors.Is(err, ErrBadKey) {
		t.Fatalf("read after close: %v", err)
	}
	// Unknown id.
	if _, err := c.Open(ctx, object.NewID()); !errors.Is(err, ErrNotFound) {
		t.Fatalf("open unknown: %v", err)
	}
	b := newNode(t, log, nil)
	if err := b.client.Pull(ctx, b.store, object.NewID(), []string{a.addr}, PullOptions{}); !errors.Is(err, ErrObjectLost) {
		t.Fatalf("pull unknown: %v", err)
	}
	// A truncated frame closes the connection with a counted error, never a hang.
	raw, _ := a.client.cfg.Dial(ctx, a.addr)
	defer raw.Close()
	if err := clientHandshake(raw, testToken, time.Now().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	frame := AppendFrame(nil, &Frame{Type: FrameRead, Key: r.Key, Len: 4})
	frame[3] = 7 // claims 7 body bytes: the type and 6 of the 44 a read needs
	raw.Write(frame[:4+7])
	raw.SetReadDeadline(time.Now().Add(5 * time.Second))
	var buf []byte
	f, err := ReadFrame(raw, &buf)
	if err != nil || f.Type != FrameError || f.Code != CodeBadFrame {
		t.Fatalf("truncated frame answer: %+v %v", f, err)
	}
	if testutil.ToFloat64(a.m.Errors.WithLabelValues(reasonBadFrame)) < 1 {
		t.Fatal("bad frame not counted")
	}
}

// corruptConn flips one byte of what the client reads at stream offset at.
type corruptConn struct {
	net.Conn
	pos, at int64
	done    bool
}

func (c *corruptConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if !c.done && c.pos+int64(n) > c.at {
		p[c.at-c.pos] ^= 0x5a
		c.done = true
	}
	c.pos += int64(n)
	return n, err
}

func TestCorruptChunkRefetched(t *testing.T) {
	log := zaptest.NewLogger(t)
	a := newNode(t, log, nil)
	var corrupted atomic.Int32
	b := newNode(t, log, func(c *ClientConfig) {
		d := &net.Dialer{}
		c.Streams = 1
		c.Dial = func(ctx context.Context, addr string) (net.Conn, error) {
			conn, err := d.DialContext(ctx, "tcp", addr)
			if err != nil || corrupted.Add(1) > 1 {
				return conn, err
			}
			return &corruptConn{Conn: conn, at: 200_000}, nil // inside the first chunk's data
		}
	})
	ctx := ctxT(t)
	data := randBytes(2<<20, 3)
	id, _ := a.store.Put(ctx, "o", data)
	if err := b.client.Pull(ctx, b.store, id, []string{a.addr}, PullOptions{}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(getBytes(t, b.store, id), data) {
		t.Fatal("bytes differ after re-fetch")
	}
	if got := testutil.ToFloat64(b.m.ChunkRefetch); got != 1 {
		t.Fatalf("refetched %v chunks, want 1", got)
	}
	if got := testutil.ToFloat64(b.m.Errors.WithLabelValues(reasonCorrupt)); got != 1 {
		t.Fatalf("corrupt chunks counted %v", got)
	}
}

// dyingConn reads normally until limit bytes, then kills its source server (a
// machine dying mid-transfer) and fails.
type dyingConn struct {
	net.Conn
	n     *atomic.Int64
	limit int64
	kill  func()
}

func (c *dyingConn) Read(p []byte) (int, error) {
	if c.n.Load() > c.limit {
		c.kill()
		return 0, errors.New("source died")
	}
	n, err := c.Conn.Read(p)
	c.n.Add(int64(n))
	return n, err
}

func TestSourceDeathMidPull(t *testing.T) {
	log := zaptest.NewLogger(t)
	ctx := ctxT(t)
	data := randBytes(4<<20, 4)
	id := object.ContentID(data)
	// setup returns a source holding the object, and a puller whose connections
	// to that source kill it after 1 MiB has arrived.
	setup := func(t *testing.T) (src *node, dst *node, read *atomic.Int64) {
		src = newNode(t, log, nil)
		if err := src.store.PutID(ctx, "o", id, data); err != nil {
			t.Fatal(err)
		}
		read = &atomic.Int64{}
		var once sync.Once
		kill := func() {
			once.Do(func() {
				go func() {
					sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					defer cancel()
					src.server.Shutdown(sctx)
				}()
			})
		}
		dst = newNode(t, log, func(c *ClientConfig) {
			d := &net.Dialer{}
			c.Dial = func(ctx context.Context, addr string) (net.Conn, error) {
				conn, err := d.DialContext(ctx, "tcp", addr)
				if err != nil || addr != src.addr {
					return conn, err
				}
				return &dyingConn{Conn: conn, n: read, limit: 1 << 20, kill: kill}, nil
			}
		})
		return src, dst, read
	}
	t.Run("continues from another location", func(t *testing.T) {
		src1, dst, read := setup(t)
		src2 := newNode(t, log, nil)
		if err := src2.store.PutID(ctx, "o", id, data); err != nil {
			t.Fatal(err)
		}
		if err := dst.client.Pull(ctx, dst.store, id, []string{src1.addr, src2.addr}, PullOptions{}); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(getBytes(t, dst.store, id), data) {
			t.Fatal("bytes differ")
		}
		if read.Load() < 1<<20 {
			t.Fatalf("the first source served only %d bytes: it did not die mid-pull", read.Load())
		}
		if testutil.ToFloat64(dst.m.Errors.WithLabelValues(reasonSourceFailed)) < 1 {
			t.Fatal("source failure not counted")
		}
		if testutil.ToFloat64(src2.m.BytesServed) == 0 {
			t.Fatal("second source served nothing")
		}
	})
	t.Run("no other location", func(t *testing.T) {
		src, dst, read := setup(t)
		err := dst.client.Pull(ctx, dst.store, id, []string{src.addr}, PullOptions{})
		if !errors.Is(err, ErrObjectLost) {
			t.Fatalf("got %v, want ErrObjectLost", err)
		}
		if read.Load() < 1<<20 {
			t.Fatalf("the source served only %d bytes: it did not die mid-pull", read.Load())
		}
		if st := dst.store.Stats(); dst.store.Contains(id) || st.Objects != 0 || st.HotBytes != st.Recycled {
			t.Fatalf("failed pull left an object or its room behind: %+v", st)
		}
		if testutil.ToFloat64(dst.m.Errors.WithLabelValues(reasonLost)) != 1 {
			t.Fatal("object lost not counted")
		}
	})
}

func TestBroadcast(t *testing.T) {
	log := zaptest.NewLogger(t)
	for _, fanout := range []int{1, 2} {
		t.Run(fmt.Sprintf("fanout=%d", fanout), func(t *testing.T) {
			src := newNode(t, log, nil)
			var rs []Receiver
			var nodes []*node
			for range 5 {
				n := newNode(t, log, nil)
				nodes = append(nodes, n)
				rs = append(rs, Receiver{Store: n.store, Client: n.client})
			}
			ctx := ctxT(t)
			data := randBytes(3<<20, 5)
			id, _ := src.store.Put(ctx, "o", data)
			if err := Broadcast(ctx, id, src.addr, rs, fanout, "bcast"); err != nil {
				t.Fatal(err)
			}
			for i, n := range nodes {
				if !bytes.Equal(getBytes(t, n.store, id), data) {
					t.Fatalf("receiver %d differs", i)
				}
			}
			// The source sent the object to its fanout children only, not to all 5.
			if got, want := testutil.ToFloat64(src.m.BytesServed), float64(fanout*len(data)); got > want {
				t.Fatalf("source served %v bytes, want <= %v", got, want)
			}
		})
	}
}

func TestBroadcastPlan(t *testing.T) {
	tests := []struct {
		fanout int
		want   [][]string
	}{
		{1, [][]string{{"s"}, {"a", "s"}, {"b", "a", "s"}, {"c", "b", "a", "s"}}},
		{2, [][]string{{"s"}, {"s"}, {"a", "s"}, {"a", "s"}}},
	}
	for _, tc := range tests {
		got := BroadcastPlan("s", []string{"a", "b", "c", "d"}, tc.fanout)
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("fanout %d: %v, want %v", tc.fanout, got, tc.want)
		}
	}
}

func TestChunkSizer(t *testing.T) {
	cfg := DefaultChunkConfig()
	tests := []struct {
		name     string
		bw       float64 // bytes/s
		rtt      time.Duration
		inflight int
		lo, hi   int64
	}{
		{"slow link: small chunks", 50e6, 100 * time.Microsecond, 4, cfg.Min, cfg.Min},
		{"fast link: big chunks", 5e9, 50 * time.Microsecond, 4, 8 << 20, cfg.Max},
		{"long path: cover the BDP", 1e9, 10 * time.Millisecond, 8, 8 << 20, cfg.Max},
		{"mid", 1e9, 100 * time.Microsecond, 4, 1 << 20, 3 << 20},
	}
	for _, tc := range tests {
		s := NewChunkSizer(cfg)
		if s.Next() != cfg.Initial {
			t.Fatal("initial")
		}
		s.ObserveRTT(tc.rtt)
		for range 50 {
			n := s.Next()
			lat := time.Duration(float64(n)*float64(tc.inflight)/tc.bw*1e9) + tc.rtt
			s.Observe(n, lat, tc.inflight)
		}
		if got := s.Next(); got < tc.lo || got > tc.hi {
			t.Errorf("%s: chunk %d outside [%d, %d]", tc.name, got, tc.lo, tc.hi)
		}
	}
}

// The helper process for TestTwoProcesses: a store with one object behind a
// transfer server, in its own process.
func TestMain(m *testing.M) {
	if os.Getenv("ATOLL_TRANSFER_HELPER") == "serve" {
		os.Exit(helperServe())
	}
	os.Exit(m.Run())
}

func helperServe() int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Println("ERR", err)
		return 1
	}
	dir, _ := os.MkdirTemp("", "atoll-helper")
	defer os.RemoveAll(dir)
	cfg := object.DefaultLocalConfig()
	cfg.Location = ln.Addr().String()
	st, err := object.Open(cfg, dir)
	if err != nil {
		fmt.Println("ERR", err)
		return 1
	}
	defer st.Close()
	data := randBytes(8<<20, 42)
	id, err := st.Put(context.Background(), "helper", data)
	if err != nil {
		fmt.Println("ERR", err)
		return 1
	}
	scfg := DefaultServerConfig()
	scfg.Token = testToken
	srv, _ := NewServer(scfg, StoreSource{st})
	go srv.Serve(ln)
	fmt.Println(ln.Addr().String(), id.String())
	bufio.NewReader(os.Stdin).ReadString('\n') // until the parent closes stdin
	return 0
}

func TestTwoProcesses(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "ATOLL_TRANSFER_HELPER=serve")
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); cmd.Wait() }()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	fields := strings.Fields(line)
	if len(fields) != 2 {
		t.Fatalf("helper said %q", line)
	}
	id, err := object.ParseID(fields[1])
	if err != nil {
		t.Fatal(err)
	}
	dst := newNode(t, zaptest.NewLogger(t), nil)
	ctx := ctxT(t)
	if err := dst.client.Pull(ctx, dst.store, id, []string{fields[0]}, PullOptions{}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(getBytes(t, dst.store, id), randBytes(8<<20, 42)) {
		t.Fatal("bytes pulled from the other process differ")
	}
	if pid := cmd.Process.Pid; pid == os.Getpid() {
		t.Fatal("not a separate process")
	}
}

func TestBroadcastRelayDies(t *testing.T) {
	log := zaptest.NewLogger(t)
	src, relay := newNode(t, log, nil), newNode(t, log, nil)
	var read atomic.Int64
	var once sync.Once
	kill := func() {
		once.Do(func() {
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				relay.server.Shutdown(ctx)
			}()
		})
	}
	leaf := newNode(t, log, func(c *ClientConfig) {
		d := &net.Dialer{}
		c.Dial = func(ctx context.Context, addr string) (net.Conn, error) {
			conn, err := d.DialContext(ctx, "tcp", addr)
			if err != nil || addr != relay.addr {
				return conn, err
			}
			return &dyingConn{Conn: conn, n: &read, limit: 512 << 10, kill: kill}, nil
		}
	})
	ctx := ctxT(t)
	data := randBytes(3<<20, 12)
	id, _ := src.store.Put(ctx, "o", data)
	rs := []Receiver{{relay.store, relay.client}, {leaf.store, leaf.client}}
	if err := Broadcast(ctx, id, src.addr, rs, 1, "bcast"); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(getBytes(t, leaf.store, id), data) {
		t.Fatal("leaf bytes differ after its relay died")
	}
	if read.Load() < 512<<10 {
		t.Fatalf("leaf read only %d bytes from the relay: it did not die mid-stream", read.Load())
	}
	if testutil.ToFloat64(leaf.m.Errors.WithLabelValues(reasonSourceFailed)) < 1 {
		t.Fatal("relay failure not counted")
	}
}

// A source that accepts but never answers is given up after ChunkTimeout.
func TestStalledSource(t *testing.T) {
	log := zaptest.NewLogger(t)
	good := newNode(t, log, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close() // accept, then say nothing
		}
	}()
	dst := newNode(t, log, func(c *ClientConfig) { c.DialTimeout = 200 * time.Millisecond })
	ctx := ctxT(t)
	data := randBytes(1<<20, 13)
	id, _ := good.store.Put(ctx, "o", data)
	if err := dst.client.Pull(ctx, dst.store, id, []string{ln.Addr().String(), good.addr}, PullOptions{}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(getBytes(t, dst.store, id), data) {
		t.Fatal("bytes differ")
	}
}

// BenchmarkPull pulls a 256 MiB object between two stores in this process.
func BenchmarkPull(b *testing.B) {
	log := zap.NewNop()
	src, dst := newNode(b, log, func(c *ClientConfig) { *c = DefaultClientConfig(); c.Token = testToken }), newNode(b, log, func(c *ClientConfig) { *c = DefaultClientConfig(); c.Token = testToken })
	ctx := context.Background()
	data := randBytes(256<<20, 1)
	id, _ := src.store.Put(ctx, "o", data)
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if err := dst.client.Pull(ctx, dst.store, id, []string{src.addr}, PullOptions{Owner: "b"}); err != nil {
			b.Fatal(err)
		}
		if err := dst.store.Release(ctx, id, "b"); err != nil {
			b.Fatal(err)
		}
	}
}
