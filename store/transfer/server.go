package transfer

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/cespare/xxhash/v2"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/atoll-run/atoll/internal/pki"
	"github.com/atoll-run/atoll/store/object"
)

// Region is memory a server can serve by key. *object.Region implements it.
// WaitReady blocks until [0, end) may be read (immediately for sealed objects);
// Close is called once when the registration ends.
type Region interface {
	Bytes() []byte
	Size() int64
	// Fingerprint returns the whole region's xxhash64. It may wait (for an object
	// still being put) or write metadata (an object's first fingerprint is
	// recorded in the directory), both under ctx.
	Fingerprint(ctx context.Context) (uint64, error)
	WaitReady(ctx context.Context, end int64) error
	Close()
}

// ChunkFingerprinter is an optional Region extension: a region that can remember
// chunk fingerprints (an immutable object can) saves the server hashing the same
// bytes again when they are read again (repeated pulls, broadcast fan-out).
type ChunkFingerprinter interface {
	ChunkFingerprint(off, n int64) uint64
}

// FileRegion is an optional Region extension: a region whose bytes are a range
// of a file (an object's shared-memory file) is sent with sendfile(2), page cache
// to socket, with no copy through user space. *object.Region implements it.
type FileRegion interface {
	File() (path string, off int64)
}

// Source opens objects for serving. The server owns this interface; StoreSource
// adapts an *object.Store.
type Source interface {
	OpenRegion(ctx context.Context, id object.ID) (Region, error)
}

// StoreSource serves a Store's objects (including ones still being pulled, which
// is what lets a broadcast relay forward chunks as they arrive).
type StoreSource struct{ Store *object.Store }

// OpenRegion implements Source.
func (s StoreSource) OpenRegion(ctx context.Context, id object.ID) (Region, error) {
	r, err := s.Store.OpenRegion(ctx, id)
	if err != nil {
		return nil, err
	}
	return r, nil
}

// ServerConfig tunes a Server.
type ServerConfig struct {
	// Token is the shared cluster secret peers prove they know (at least 16 bytes).
	Token []byte
	// HandshakeTimeout bounds authentication. Default 5s.
	HandshakeTimeout time.Duration
	// ReadyTimeout bounds how long a read of a range still being written (a relay)
	// waits for it. Default 30s.
	ReadyTimeout time.Duration
	// WriteTimeout bounds sending one chunk. Default 30s.
	WriteTimeout time.Duration
	// Sendfile sends chunks of file-backed regions (store objects) with
	// sendfile(2), page cache to socket, instead of writev from the mapping.
	// Default false: over loopback on the machines measured here it was no faster
	// (the receiver's copy and per-page socket bookkeeping dominate); it saves
	// the sender's copy where a NIC does the rest.
	Sendfile bool
	// TLS, if set, runs every connection inside TLS with this config: set
	// Certificates (this server's) and ClientCAs (the cluster CA). Clients must
	// present a certificate that ClientCAs verifies (ClientAuth is forced to
	// tls.RequireAndVerifyClientCert) and then still prove the token. Chunks go
	// through TLS records, so Sendfile does not apply.
	TLS *tls.Config
	// Authorize, when set, decides each object a peer opens, by the peer's verified client
	// certificate (nil without TLS): an error refuses it (CodeDenied, ErrDenied at the
	// puller). It must be safe for concurrent use.
	Authorize func(ctx context.Context, peer *x509.Certificate, id object.ID) error
	Logger    *zap.Logger
	// Metrics, default unregistered counters.
	Metrics *Metrics
}

// DefaultServerConfig returns a config that needs only Token.
func DefaultServerConfig() ServerConfig {
	return ServerConfig{HandshakeTimeout: 5 * time.Second, ReadyTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second}
}

// Validate reports the first bad field.
func (c ServerConfig) Validate() error {
	switch {
	case len(c.Token) < 16:
		return fmt.Errorf("transfer: server config: Token has %d bytes, want at least 16", len(c.Token))
	case c.HandshakeTimeout <= 0 || c.ReadyTimeout <= 0 || c.WriteTimeout <= 0:
		return fmt.Errorf("transfer: server config: timeouts must be positive (%v, %v, %v)", c.HandshakeTimeout, c.ReadyTimeout, c.WriteTimeout)
	case c.TLS != nil && len(c.TLS.Certificates) == 0 && c.TLS.GetCertificate == nil && c.TLS.GetConfigForClient == nil:
		return fmt.Errorf("transfer: server config: TLS has no certificate (Certificates, GetCertificate)")
	case c.TLS != nil && c.TLS.ClientCAs == nil && c.TLS.GetConfigForClient == nil && !pki.SelfVerifying(c.TLS):
		return fmt.Errorf("transfer: server config: TLS.ClientCAs is nil: clients' certificates could not be verified")
	}
	return nil
}

type registration struct {
	secret [16]byte
	region Region
	conn   uint64   // connection that registered it (0: RegisterRegion); freed with it
	file   *os.File // the region's backing file (FileRegion), for sendfile; may be nil
	off    int64    // the region's offset in file

	// Reads in progress hold the registration (under Server.mu), so that
	// deregistering it (CloseRegion from another connection, the registering
	// connection ending) never closes the region or its file under a send.
	users int
	dead  bool
}

// unuseLocked ends one read's hold; it returns true when the caller must close
// the registration (it was deregistered and this was the last read).
func (r *registration) unuseLocked() bool {
	r.users--
	return r.dead && r.users == 0
}

// retireLocked marks the registration deregistered; it returns true when the
// caller must close it now (no read holds it).
func (r *registration) retireLocked() bool {
	r.dead = true
	return r.users == 0
}

func (r *registration) close() {
	if r.file != nil {
		_ = r.file.Close()
	}
	r.region.Close()
}

// Server serves registered regions to authenticated pullers.
type Server struct {
	cfg ServerConfig
	src Source
	log *zap.Logger
	m   *Metrics

	mu     sync.Mutex
	regs   map[uint64]*registration
	nextH  uint64
	nextC  uint64
	ln     net.Listener
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
	closed bool
}

// NewServer returns a server for src. Call Serve to accept connections.
func NewServer(cfg ServerConfig, src Source) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.Metrics == nil {
		cfg.Metrics, _ = NewMetrics(nil)
	}
	if cfg.TLS != nil {
		cfg.TLS = cfg.TLS.Clone()
		pki.RequireClientCert(cfg.TLS)
		if cfg.TLS.MinVersion < tls.VersionTLS13 {
			cfg.TLS.MinVersion = tls.VersionTLS13
		}
	}
	return &Server{cfg: cfg, src: src, log: cfg.Logger.Named("transfer"), m: cfg.Metrics,
		regs: map[uint64]*registration{}, conns: map[net.Conn]struct{}{}}, nil
}

// RegisterRegion registers r and returns the key that authorizes reading it. The
// registration lasts until DeregisterRegion.
func (s *Server) RegisterRegion(r Region) Key { return s.register(r, 0) }

func (s *Server) register(r Region, conn uint64) Key {
	var k Key
	reg := &registration{region: r, conn: conn}
	if fr, ok := r.(FileRegion); ok && r.Size() > 0 && s.cfg.Sendfile {
		if path, off := fr.File(); path != "" {
			if f, err := os.Open(path); err == nil {
				reg.file, reg.off = f, off
			} // else: served from the mapping with writev
		}
	}
	_, _ = rand.Read(reg.secret[:])
	s.mu.Lock()
	s.nextH++
	h := s.nextH
	s.regs[h] = reg
	s.mu.Unlock()
	binary.BigEndian.PutUint64(k[:8], h)
	copy(k[8:], reg.secret[:])
	return k
}

// DeregisterRegion ends k's registration and closes its region; it reports whether
// k was registered.
func (s *Server) DeregisterRegion(k Key) bool {
	s.mu.Lock()
	reg, ok := s.lookupLocked(k)
	closeNow := false
	if ok {
		delete(s.regs, binary.BigEndian.Uint64(k[:8]))
		closeNow = reg.retireLocked()
	}
	s.mu.Unlock()
	if closeNow {
		reg.close()
	}
	return ok
}

func (s *Server) lookupLocked(k Key) (*registration, bool) {
	reg, ok := s.regs[binary.BigEndian.Uint64(k[:8])]
	if !ok || subtle.ConstantTimeCompare(reg.secret[:], k[8:]) != 1 {
		return nil, false
	}
	return reg, true
}

// Listen binds addr ("127.0.0.1:0" for an ephemeral port) and serves in the
// background until Shutdown; it returns the bound address.
func (s *Server) Listen(addr string) (string, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("transfer: listen %s: %w", addr, err)
	}
	go func() { _ = s.Serve(ln) }()
	return ln.Addr().String(), nil
}

// Serve accepts connections on ln until Shutdown. It returns ErrClosed after Shutdown.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		ln.Close()
		return ErrClosed
	}
	s.ln = ln
	s.mu.Unlock()
	for {
		c, err := ln.Accept()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return ErrClosed
			}
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				continue
			}
			return fmt.Errorf("transfer: accept: %w", err)
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return ErrClosed
		}
		s.nextC++
		id := s.nextC
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			s.serveConn(c, id)
		}()
	}
}

// Shutdown stops accepting, closes every connection and registration, and waits
// for the connection goroutines until ctx ends.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	if s.ln != nil {
		s.ln.Close()
	}
	for c := range s.conns {
		c.Close()
	}
	regs := s.regs
	s.regs = map[uint64]*registration{}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		return fmt.Errorf("transfer: shutdown: %w", ctx.Err())
	}
	for _, r := range regs {
		r.close()
	}
	return nil
}

func (s *Server) serveConn(raw net.Conn, connID uint64) {
	log := s.log.With(zap.Stringer("peer", raw.RemoteAddr()))
	c := raw // what the frames go through: raw, or TLS over it
	ctx, cancel := context.WithCancel(context.Background())
	defer func() {
		cancel()
		c.Close()
		raw.Close()
		s.mu.Lock()
		delete(s.conns, raw)
		var mine []*registration
		for h, r := range s.regs {
			if r.conn == connID {
				delete(s.regs, h)
				if r.retireLocked() {
					mine = append(mine, r)
				} // else the last read in progress closes it
			}
		}
		s.mu.Unlock()
		for _, r := range mine {
			r.close()
		}
	}()
	var peer *x509.Certificate // the client's verified certificate, under TLS
	var sc syscall.RawConn     // for sendfile; nil if c is not a plain TCP connection
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
		sc, _ = tc.SyscallConn()
	}
	deadline := time.Now().Add(s.cfg.HandshakeTimeout)
	if s.cfg.TLS != nil {
		tc := tls.Server(raw, s.cfg.TLS)
		_ = raw.SetDeadline(deadline)
		if err := tc.Handshake(); err != nil {
			s.m.err(reasonTLS)
			log.Info("TLS handshake failed", zap.Error(err))
			return
		}
		c, sc = tc, nil
		st := tc.ConnectionState()
		peer = pki.PeerCert(&st)
	}
	if err := serverHandshake(c, s.cfg.Token, deadline); err != nil {
		s.m.err(reasonAuth)
		log.Info("handshake failed", zap.Error(err))
		_ = writeFrame(c, &Frame{Type: FrameError, Code: CodeBadKey, Msg: "authentication failed"})
		return
	}
	br := bufio.NewReaderSize(c, 64<<10)
	var buf []byte
	hdr := make([]byte, 0, 64)
	for {
		f, err := ReadFrame(br, &buf)
		if err != nil {
			if errors.Is(err, ErrBadFrame) {
				s.m.err(reasonBadFrame)
				log.Info("bad frame, closing", zap.Error(err))
				_ = writeFrame(c, &Frame{Type: FrameError, Code: CodeBadFrame, Msg: err.Error()})
			}
			return
		}
		switch f.Type {
		case FrameOpen:
			if s.cfg.Authorize != nil {
				if err := s.cfg.Authorize(ctx, peer, f.Object); err != nil {
					log.Info("object refused", zap.Stringer("object", f.Object), zap.Error(err))
					if s.sendErr(c, f.ReqID, CodeDenied, err) != nil {
						return
					}
					continue
				}
			}
			r, err := s.src.OpenRegion(ctx, f.Object)
			if err != nil {
				code := CodeInternal
				if errors.Is(err, object.ErrNotFound) {
					code = CodeNotFound
					s.m.err(reasonNotFound)
				} else if errors.Is(err, object.ErrLost) {
					code = CodeLost
				}
				if s.sendErr(c, f.ReqID, code, err) != nil {
					return
				}
				continue
			}
			// The first fingerprint of an object is recorded in the directory (a
			// consensus write in a cluster): bounded like a read of a range being written.
			fctx, cancel := context.WithTimeout(ctx, s.cfg.ReadyTimeout)
			fp, err := r.Fingerprint(fctx)
			cancel()
			if err != nil {
				r.Close()
				if s.sendErr(c, f.ReqID, CodeLost, err) != nil {
					return
				}
				continue
			}
			k := s.register(r, connID)
			hdr = AppendFrame(hdr[:0], &Frame{Type: FrameOpened, ReqID: f.ReqID, Key: k, Size: r.Size(), Fingerprint: fp})
			if _, err := c.Write(hdr); err != nil {
				return
			}
		case FrameClose:
			s.DeregisterRegion(f.Key)
		case FramePing:
			hdr = AppendFrame(hdr[:0], &Frame{Type: FramePong, ReqID: f.ReqID})
			_ = c.SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout))
			if _, err := c.Write(hdr); err != nil {
				return
			}
		case FrameRead:
			if err := s.serveRead(ctx, c, sc, &f, &hdr); err != nil {
				log.Debug("read failed", zap.Error(err))
				return
			}
		default:
			s.m.err(reasonBadFrame)
			_ = s.sendErr(c, f.ReqID, CodeBadFrame, fmt.Errorf("unexpected frame type %d: %w", f.Type, ErrBadFrame))
			return
		}
	}
}

func (s *Server) sendErr(c net.Conn, req uint64, code ErrCode, err error) error {
	_ = c.SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout))
	return writeFrame(c, &Frame{Type: FrameError, ReqID: req, Code: code, Msg: err.Error()})
}

// serveRead sends one chunk: the header with the fingerprint, then the bytes,
// with sendfile from the region's file when it has one and the connection is TCP
// (no copy through user space), else straight from the mapped region with one
// writev (no copy in user space). A non-nil return means the connection is
// unusable.
func (s *Server) serveRead(ctx context.Context, c net.Conn, raw syscall.RawConn, f *Frame, hdr *[]byte) error {
	s.mu.Lock()
	reg, ok := s.lookupLocked(f.Key)
	if ok {
		reg.users++
	}
	s.mu.Unlock()
	if ok {
		defer func() {
			s.mu.Lock()
			closeNow := reg.unuseLocked()
			s.mu.Unlock()
			if closeNow {
				reg.close()
			}
		}()
	}
	if !ok {
		s.m.err(reasonBadKey)
		return s.sendErr(c, f.ReqID, CodeBadKey, fmt.Errorf("read of unregistered key: %w", ErrBadKey))
	}
	end := f.Off + int64(f.Len)
	if end > reg.region.Size() || end < f.Off {
		s.m.err(reasonRange)
		return s.sendErr(c, f.ReqID, CodeRange, fmt.Errorf("range [%d,%d) outside region of %d bytes: %w", f.Off, end, reg.region.Size(), ErrRange))
	}
	rctx, cancel := context.WithTimeout(ctx, s.cfg.ReadyTimeout)
	err := reg.region.WaitReady(rctx, end)
	cancel()
	if err != nil {
		return s.sendErr(c, f.ReqID, CodeLost, err)
	}
	data := reg.region.Bytes()[f.Off:end]
	var fp uint64
	if cf, ok := reg.region.(ChunkFingerprinter); ok {
		fp = cf.ChunkFingerprint(f.Off, int64(f.Len))
	} else {
		fp = xxhash.Sum64(data)
	}
	*hdr = AppendFrame((*hdr)[:0], &Frame{Type: FrameChunk, ReqID: f.ReqID, Fingerprint: fp, Len: f.Len})
	_ = c.SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout))
	if raw != nil && reg.file != nil {
		if err := sendFileChunk(raw, *hdr, int(reg.file.Fd()), reg.off+f.Off, int(f.Len)); err != nil {
			return err
		}
		s.m.ChunksSendfile.Inc()
	} else {
		bufs := net.Buffers{*hdr, data}
		if _, err := bufs.WriteTo(c); err != nil {
			return err
		}
	}
	s.m.ChunksServed.Inc()
	s.m.BytesServed.Add(float64(f.Len))
	return nil
}

// sendFileChunk writes hdr (with MSG_MORE, so it leaves in the same segment as
// the data) and then n bytes of file fd at off with sendfile(2): the kernel sends
// the shared-memory file's pages without copying them through user space. The
// connection's write deadline applies while the socket is full.
func sendFileChunk(raw syscall.RawConn, hdr []byte, fd int, off int64, n int) error {
	var werr error
	sent := 0
	err := raw.Write(func(s uintptr) bool {
		for sent < len(hdr) {
			k, e := unix.SendmsgN(int(s), hdr[sent:], nil, nil, unix.MSG_MORE)
			switch {
			case e == unix.EINTR:
				continue
			case e == unix.EAGAIN:
				return false
			case e != nil:
				werr = e
				return true
			}
			sent += k
		}
		for n > 0 {
			k, e := unix.Sendfile(int(s), fd, &off, n)
			switch {
			case e == unix.EINTR:
				continue
			case e == unix.EAGAIN:
				return false
			case e != nil:
				werr = e
				return true
			case k == 0:
				werr = io.ErrUnexpectedEOF // the file is shorter than the region
				return true
			}
			n -= k
		}
		return true
	})
	if err != nil {
		return err
	}
	if werr != nil {
		return fmt.Errorf("transfer: sendfile: %w", werr)
	}
	return nil
}
