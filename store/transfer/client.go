package transfer

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"
	"go.uber.org/zap"

	"github.com/atoll-run/atoll/store/object"
)

// ClientConfig tunes a Client.
type ClientConfig struct {
	// Token is the shared cluster secret (at least 16 bytes).
	Token []byte
	// Streams is the number of connections one pull uses per source. Default 2.
	Streams int
	// Depth is the number of chunk reads in flight per connection. Default 4.
	Depth int
	// Chunk tunes the adaptive chunk size.
	Chunk ChunkConfig
	// MaxRefetch is how many times one chunk is re-fetched after fingerprint
	// mismatches before the pull fails with ErrCorruptChunk. Default 3.
	MaxRefetch int
	// DialTimeout bounds dialing and authenticating. Default 5s.
	DialTimeout time.Duration
	// ChunkTimeout bounds one chunk read; a source that stalls past it is treated as
	// dead. Default 30s.
	ChunkTimeout time.Duration
	// MaxIdlePerPeer is how many authenticated connections to one server the
	// client keeps open between pulls for later pulls to reuse (a pull takes
	// Streams of them), so that a pull of a small object costs no dial and no
	// handshake. Default 4; negative keeps none: every pull dials its own.
	MaxIdlePerPeer int
	// IdleTimeout closes a pooled connection unused this long. Default 90s.
	IdleTimeout time.Duration
	// HealthCheckAfter: a pooled connection idle at least this long is pinged
	// (one round trip, bounded by DialTimeout) before a pull uses it, and
	// closed if it does not answer. Default 1s; negative never pings (a dead
	// connection is then found by the pull's first request, which is retried
	// once on a new connection).
	HealthCheckAfter time.Duration
	// TLS, if set, runs every connection inside TLS with this config: set
	// Certificates (this client's certificate, which servers with TLS require)
	// and RootCAs (the cluster CA). ServerName defaults to the dialed host. The
	// token handshake still runs, inside the TLS session.
	TLS *tls.Config
	// Dial opens a connection; default net.Dialer. Tests wrap it to inject faults.
	Dial   func(ctx context.Context, addr string) (net.Conn, error)
	Logger *zap.Logger
	// Metrics, default unregistered counters.
	Metrics *Metrics
}

// DefaultClientConfig returns a config that needs only Token.
func DefaultClientConfig() ClientConfig {
	return ClientConfig{Streams: 2, Depth: 4, Chunk: DefaultChunkConfig(), MaxRefetch: 3,
		DialTimeout: 5 * time.Second, ChunkTimeout: 30 * time.Second, MaxIdlePerPeer: 4, IdleTimeout: 90 * time.Second,
		HealthCheckAfter: time.Second}
}

// Validate reports the first bad field.
func (c ClientConfig) Validate() error {
	switch {
	case len(c.Token) < 16:
		return fmt.Errorf("transfer: client config: Token has %d bytes, want at least 16", len(c.Token))
	case c.Streams < 1 || c.Streams > 64:
		return fmt.Errorf("transfer: client config: Streams %d outside 1..64", c.Streams)
	case c.Depth < 1 || c.Depth > 64:
		return fmt.Errorf("transfer: client config: Depth %d outside 1..64", c.Depth)
	case c.MaxRefetch < 0:
		return fmt.Errorf("transfer: client config: MaxRefetch %d is negative", c.MaxRefetch)
	case c.DialTimeout <= 0 || c.ChunkTimeout <= 0:
		return fmt.Errorf("transfer: client config: timeouts must be positive")
	case c.MaxIdlePerPeer > 1024:
		return fmt.Errorf("transfer: client config: MaxIdlePerPeer %d above 1024", c.MaxIdlePerPeer)
	case c.IdleTimeout < 0:
		return fmt.Errorf("transfer: client config: IdleTimeout %v is negative", c.IdleTimeout)
	}
	return c.Chunk.Validate()
}

// Client pulls objects from remote Servers.
type Client struct {
	cfg ClientConfig
	log *zap.Logger
	m   *Metrics

	fmu     sync.Mutex
	flights map[flightKey]*flight // pulls in progress, for single-flight

	pool *connPool

	waitHook func() // tests: called when a pull starts waiting for the same pull in progress
}

// NewClient returns a client.
func NewClient(cfg ClientConfig) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.Metrics == nil {
		cfg.Metrics, _ = NewMetrics(nil)
	}
	if cfg.Dial == nil {
		d := &net.Dialer{}
		cfg.Dial = func(ctx context.Context, addr string) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) }
	}
	if cfg.IdleTimeout == 0 {
		cfg.IdleTimeout = 90 * time.Second
	}
	if cfg.HealthCheckAfter == 0 {
		cfg.HealthCheckAfter = time.Second
	}
	if cfg.TLS != nil {
		cfg.TLS = cfg.TLS.Clone()
		if cfg.TLS.MinVersion < tls.VersionTLS13 {
			cfg.TLS.MinVersion = tls.VersionTLS13
		}
	}
	return &Client{cfg: cfg, log: cfg.Logger.Named("transfer"), m: cfg.Metrics, flights: map[flightKey]*flight{},
		pool: newConnPool(cfg.MaxIdlePerPeer, cfg.IdleTimeout, cfg.Metrics)}, nil
}

// Close closes the pooled connections. Pulls in progress finish; the
// connections they return are closed instead of pooled.
func (cl *Client) Close() error {
	cl.pool.close()
	return nil
}

// Conn is one authenticated connection to a server. Calls may be made from many
// goroutines; replies are matched to requests by id, so reads pipeline.
type Conn struct {
	c    net.Conn
	addr string
	m    *Metrics

	wmu  sync.Mutex
	wbuf []byte

	mu      sync.Mutex
	next    uint64
	pending map[uint64]*call
	err     error // set once the connection is dead
	done    chan struct{}
}

type call struct {
	dst  []byte // chunk destination
	done chan error
	f    Frame // the reply (Opened, or Chunk: its fingerprint)
}

// Dial connects to addr and authenticates.
func (cl *Client) Dial(ctx context.Context, addr string) (*Conn, error) {
	dctx, cancel := context.WithTimeout(ctx, cl.cfg.DialTimeout)
	defer cancel()
	c, err := cl.cfg.Dial(dctx, addr)
	if err != nil {
		return nil, fmt.Errorf("transfer: dial %s: %w", addr, err)
	}
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	if cl.cfg.TLS != nil {
		tc := tls.Client(c, cl.tlsFor(addr))
		if err := tc.HandshakeContext(dctx); err != nil {
			c.Close()
			cl.m.err(reasonTLS)
			return nil, fmt.Errorf("transfer: TLS handshake with %s: %v: %w", addr, err, ErrAuth)
		}
		c = tc
	}
	dl, _ := dctx.Deadline()
	if err := clientHandshake(c, cl.cfg.Token, dl); err != nil {
		c.Close()
		var oe *net.OpError
		switch {
		case errors.Is(err, ErrAuth):
			cl.m.err(reasonAuth)
		case cl.cfg.TLS != nil && errors.As(err, &oe) && oe.Op == "remote error":
			// TLS 1.3: the server checks our certificate after the client's
			// side of the handshake is done, and says so in an alert here.
			cl.m.err(reasonTLS)
			err = fmt.Errorf("the server refused our certificate: %v: %w", err, ErrAuth)
		}
		return nil, fmt.Errorf("transfer: authenticate to %s: %w", addr, err)
	}
	cl.m.ConnsDialed.Inc()
	cn := &Conn{c: c, addr: addr, m: cl.m, pending: map[uint64]*call{}, done: make(chan struct{})}
	go cn.readLoop()
	return cn, nil
}

// tlsFor returns the client TLS config for addr: ServerName is the dialed host
// unless the config names one.
func (cl *Client) tlsFor(addr string) *tls.Config {
	if cl.cfg.TLS.ServerName != "" {
		return cl.cfg.TLS
	}
	c := cl.cfg.TLS.Clone()
	if host, _, err := net.SplitHostPort(addr); err == nil {
		c.ServerName = host
	}
	return c
}

// Addr returns the server address.
func (cn *Conn) Addr() string { return cn.addr }

// Close closes the connection and waits for its reader to stop (after which no
// byte is written into any destination buffer).
func (cn *Conn) Close() error {
	err := cn.c.Close()
	<-cn.done
	return err
}

// Closed reports whether the connection is dead.
func (cn *Conn) Closed() bool {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	return cn.err != nil
}

// idle reports whether the connection is alive with no request outstanding:
// fit to be pooled.
func (cn *Conn) idle() bool {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	return cn.err == nil && len(cn.pending) == 0
}

func (cn *Conn) fail(err error) {
	cn.mu.Lock()
	if cn.err == nil {
		cn.err = err
	}
	p := cn.pending
	cn.pending = map[uint64]*call{}
	cn.mu.Unlock()
	for _, c := range p {
		c.done <- err
	}
}

func (cn *Conn) readLoop() {
	defer close(cn.done)
	br := bufio.NewReaderSize(cn.c, 64<<10)
	var buf []byte
	for {
		f, err := ReadFrame(br, &buf)
		if err != nil {
			if errors.Is(err, ErrBadFrame) {
				cn.m.err(reasonBadFrame)
			}
			cn.c.Close()
			cn.fail(fmt.Errorf("transfer: connection to %s: %w", cn.addr, errOr(err, io.EOF)))
			return
		}
		cn.mu.Lock()
		c := cn.pending[f.ReqID]
		delete(cn.pending, f.ReqID)
		cn.mu.Unlock()
		switch f.Type {
		case FrameChunk:
			if c == nil || int(f.Len) != len(c.dst) {
				cn.m.err(reasonBadFrame)
				cn.c.Close()
				err := fmt.Errorf("transfer: %s sent an unexpected chunk (req %d, %d bytes): %w", cn.addr, f.ReqID, f.Len, ErrBadFrame)
				if c != nil {
					c.done <- err
				}
				cn.fail(err)
				return
			}
			if _, err := io.ReadFull(br, c.dst); err != nil {
				cn.c.Close()
				err = fmt.Errorf("transfer: %s: chunk truncated: %v: %w", cn.addr, err, ErrBadFrame)
				c.done <- err
				cn.fail(err)
				return
			}
			// The caller checks the fingerprint, so this goroutine can go on
			// receiving the next chunk while that one is hashed.
			c.f = f
			c.done <- nil
		case FrameOpened, FramePong:
			if c == nil {
				continue
			}
			c.f = f
			c.done <- nil
		case FrameError:
			if c == nil {
				cn.c.Close()
				cn.fail(fmt.Errorf("transfer: %s: %s: %w", cn.addr, f.Msg, ErrRemote))
				return
			}
			c.done <- remoteErr(cn.addr, f)
		default:
			cn.m.err(reasonBadFrame)
			cn.c.Close()
			cn.fail(fmt.Errorf("transfer: %s sent frame type %d: %w", cn.addr, f.Type, ErrBadFrame))
			return
		}
	}
}

func errOr(err, def error) error {
	if err == nil {
		return def
	}
	return err
}

func remoteErr(addr string, f Frame) error {
	var base error
	switch f.Code {
	case CodeBadKey:
		base = ErrBadKey
	case CodeNotFound:
		base = ErrNotFound
	case CodeRange:
		base = ErrRange
	case CodeLost:
		base = ErrObjectLost
	case CodeBadFrame:
		base = ErrBadFrame
	case CodeDenied:
		base = ErrDenied
	default:
		base = ErrRemote
	}
	return fmt.Errorf("transfer: %s: %s: %w", addr, f.Msg, base)
}

// roundTrip sends f (with a fresh ReqID) and waits for the reply.
func (cn *Conn) roundTrip(ctx context.Context, f *Frame, dst []byte) (*call, error) {
	c := &call{dst: dst, done: make(chan error, 1)}
	cn.mu.Lock()
	if cn.err != nil {
		cn.mu.Unlock()
		return nil, cn.err
	}
	cn.next++
	f.ReqID = cn.next
	cn.pending[f.ReqID] = c
	cn.mu.Unlock()
	cn.wmu.Lock()
	cn.wbuf = AppendFrame(cn.wbuf[:0], f)
	if dl, ok := ctx.Deadline(); ok {
		_ = cn.c.SetWriteDeadline(dl)
	}
	_, err := cn.c.Write(cn.wbuf)
	cn.wmu.Unlock()
	if err != nil {
		cn.c.Close()
		cn.fail(fmt.Errorf("transfer: write to %s: %w", cn.addr, err))
	}
	select {
	case err := <-c.done:
		return c, err
	case <-ctx.Done():
		// The reply may still arrive and be written into dst: the connection must
		// die (Close waits for the reader) before dst is reused.
		cn.c.Close()
		return nil, fmt.Errorf("transfer: %s: %w", cn.addr, ctx.Err())
	}
}

// Ping makes a round trip that carries nothing: it tells whether the
// connection and the server behind it still answer.
func (cn *Conn) Ping(ctx context.Context) error {
	_, err := cn.roundTrip(ctx, &Frame{Type: FramePing}, nil)
	return err
}

// Remote describes an object opened on a server: the key authorizes reads.
type Remote struct {
	Key         Key
	Size        int64
	Fingerprint uint64
}

// Open asks the server to register object id and returns its key.
func (cn *Conn) Open(ctx context.Context, id object.ID) (Remote, error) {
	c, err := cn.roundTrip(ctx, &Frame{Type: FrameOpen, Object: id}, nil)
	if err != nil {
		return Remote{}, err
	}
	return Remote{Key: c.f.Key, Size: c.f.Size, Fingerprint: c.f.Fingerprint}, nil
}

// ReadRange reads len(dst) bytes at off of the region named by key into dst, and
// checks them against the fingerprint the server sent ahead of them
// (ErrCorruptChunk on mismatch). If ctx ends first the connection is closed.
func (cn *Conn) ReadRange(ctx context.Context, key Key, off int64, dst []byte) error {
	if len(dst) > MaxChunk {
		return fmt.Errorf("transfer: read %d bytes: more than %d: %w", len(dst), MaxChunk, ErrRange)
	}
	c, err := cn.roundTrip(ctx, &Frame{Type: FrameRead, Key: key, Off: off, Len: uint32(len(dst))}, dst)
	if err != nil {
		return err
	}
	if got := xxhash.Sum64(dst); got != c.f.Fingerprint {
		return fmt.Errorf("transfer: chunk [%d,+%d) from %s: fingerprint %x, sent %x: %w", off, len(dst), cn.addr, got, c.f.Fingerprint, ErrCorruptChunk)
	}
	return nil
}

// CloseRegion ends the registration of key (best effort; it also ends with the
// connection).
func (cn *Conn) CloseRegion(key Key) error {
	cn.wmu.Lock()
	defer cn.wmu.Unlock()
	cn.wbuf = AppendFrame(cn.wbuf[:0], &Frame{Type: FrameClose, Key: key})
	_, err := cn.c.Write(cn.wbuf)
	return err
}
