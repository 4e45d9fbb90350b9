package paxos

import (
	"bufio"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/atoll-run/atoll/internal/pki"
	"github.com/atoll-run/atoll/proto/paxospb"
)

// TCPConfig configures a TCPTransport.
type TCPConfig struct {
	// ID is this replica's id.
	ID uint64
	// Listen is the address to listen on ("127.0.0.1:0" picks a port); default Peers[ID].
	Listen string
	// Peers maps the other replicas' ids to their addresses.
	Peers map[uint64]string
	// Token is the shared cluster secret both ends prove they hold (HMAC-SHA256
	// challenge/response in each direction). Required, with or without TLS.
	Token []byte
	// TLS, when set, makes every connection mutual TLS, with the token handshake inside
	// it: the listener requires and verifies a client certificate against TLS.ClientCAs
	// (ClientAuth is forced to tls.RequireAndVerifyClientCert), and the dialer verifies
	// the peer's certificate against TLS.RootCAs for the host of the peer's address
	// (unless TLS.ServerName is set). It needs a certificate (Certificates or
	// GetCertificate), ClientCAs and RootCAs, or a configuration of a pki.Identity, which
	// verifies both ways against the cluster CAs of the moment in VerifyConnection. Nil: frames travel in clear (authenticated
	// by the token at connection setup only).
	TLS *tls.Config
	// MaxFrame is the largest frame accepted, in bytes (default 64 MiB); larger ones
	// are logged and the connection dropped.
	MaxFrame int
	// DialTimeout bounds a connection attempt (default 1 s).
	DialTimeout time.Duration
	// HandshakeTimeout bounds the authentication exchange (default 2 s).
	HandshakeTimeout time.Duration
	// QueueLen is the per-peer outbound queue; a full queue drops (default 16384).
	QueueLen int
	// Logger (default zap.NewNop()).
	Logger *zap.Logger
}

// Validate checks the config: the id, the token, a listen address (Listen, or this id's
// entry in Peers), and every peer's id and host:port address.
func (c TCPConfig) Validate() error {
	if c.ID == 0 || c.ID > 0xffff {
		return fmt.Errorf("%w: tcp transport ID %d must be in [1, 65535]", ErrInvalidConfig, c.ID)
	}
	if len(c.Token) < 8 {
		return fmt.Errorf("%w: tcp transport token of %d bytes is shorter than 8", ErrInvalidConfig, len(c.Token))
	}
	ids := slices.Sorted(maps.Keys(c.Peers))
	var known []string
	for _, id := range ids {
		addr := c.Peers[id]
		if id == 0 || id > 0xffff {
			return fmt.Errorf("%w: tcp transport peer id %d must be in [1, 65535]", ErrInvalidConfig, id)
		}
		if addr == "" {
			continue // no address yet: this replica (given Listen), or one learned later
		}
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return fmt.Errorf("%w: tcp transport peer %d address %q is not host:port: %v", ErrInvalidConfig, id, addr, err)
		}
		known = append(known, fmt.Sprintf("%d=%s", id, addr))
	}
	if c.Listen == "" {
		return fmt.Errorf("%w: tcp transport for replica %d has no listen address: Listen is empty and Peers (%s) has no address for %d",
			ErrInvalidConfig, c.ID, strings.Join(known, ","), c.ID)
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		return fmt.Errorf("%w: tcp transport Listen %q is not host:port: %v", ErrInvalidConfig, c.Listen, err)
	}
	if c.TLS != nil {
		switch {
		case len(c.TLS.Certificates) == 0 && c.TLS.GetCertificate == nil:
			return fmt.Errorf("%w: tcp transport TLS has no certificate (mutual TLS needs one at both ends)", ErrInvalidConfig)
		case pki.SelfVerifying(c.TLS):
			// A pki.Identity's configuration: it verifies every peer itself.
		case c.TLS.ClientCAs == nil:
			return fmt.Errorf("%w: tcp transport TLS.ClientCAs is nil: the listener could not verify peers' certificates", ErrInvalidConfig)
		case c.TLS.RootCAs == nil:
			return fmt.Errorf("%w: tcp transport TLS.RootCAs is nil: peers' certificates would be checked against the system roots", ErrInvalidConfig)
		}
	}
	return nil
}

// TCPTransport is the Transport between replicas over TCP: every frame is a 4-byte
// big-endian length and a protobuf paxospb.Message; each connection starts with a mutual
// HMAC challenge/response on the shared token, inside mutual TLS when TCPConfig.TLS is set. Truncated, oversized, undecodable or
// unauthenticated frames are logged and dropped; they never stop the replica.
type TCPTransport struct {
	cfg   TCPConfig
	log   *zap.Logger
	ln    net.Listener
	recv  chan Message
	stop  chan struct{}
	wg    sync.WaitGroup
	mu    sync.Mutex
	out   map[uint64]chan Message
	conns map[net.Conn]struct{}
	once  sync.Once
	// inbound handshake failures are logged at most once per handshakeLogEvery
	inLog logLimiter
}

// handshakeLogEvery is how often a repeated handshake failure is logged (each log line
// counts the failures held back since the previous one).
const handshakeLogEvery = 10 * time.Second

// logLimiter lets one log line through per handshakeLogEvery and counts the others.
type logLimiter struct {
	mu   sync.Mutex
	next time.Time
	held int
}

// allow reports whether to log now, and how many lines were held back before this one.
func (l *logLimiter) allow(now time.Time) (bool, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Before(l.next) {
		l.held++
		return false, 0
	}
	held := l.held
	l.next, l.held = now.Add(handshakeLogEvery), 0
	return true, held
}

var _ Transport = (*TCPTransport)(nil)

// NewTCPTransport listens on cfg.Listen and returns the transport; outbound connections
// are dialled lazily.
func NewTCPTransport(cfg TCPConfig) (*TCPTransport, error) {
	if cfg.MaxFrame <= 0 {
		cfg.MaxFrame = 64 << 20
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = time.Second
	}
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = 2 * time.Second
	}
	if cfg.QueueLen <= 0 {
		cfg.QueueLen = 16384
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.Listen == "" {
		cfg.Listen = cfg.Peers[cfg.ID]
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("paxos: tcp listen %s: %w", cfg.Listen, err)
	}
	if cfg.TLS != nil {
		server := cfg.TLS.Clone()
		pki.RequireClientCert(server)
		ln = tls.NewListener(ln, server)
	}
	t := &TCPTransport{cfg: cfg, log: cfg.Logger.Named("paxos-tcp").With(zap.Uint64("replica", cfg.ID)), ln: ln,
		recv: make(chan Message, 65536), stop: make(chan struct{}), out: map[uint64]chan Message{}, conns: map[net.Conn]struct{}{}}
	for id, addr := range cfg.Peers {
		if id == cfg.ID {
			continue
		}
		ch := make(chan Message, cfg.QueueLen)
		t.out[id] = ch
		t.wg.Add(1)
		go t.sender(id, addr, ch)
	}
	t.wg.Add(1)
	go t.acceptLoop()
	return t, nil
}

// Addr returns the listening address.
func (t *TCPTransport) Addr() net.Addr { return t.ln.Addr() }

// Send implements Transport (drops when the peer's queue is full or the peer unknown).
func (t *TCPTransport) Send(m Message) {
	t.mu.Lock()
	ch := t.out[m.To]
	t.mu.Unlock()
	if ch == nil {
		return
	}
	select {
	case ch <- m:
	default:
		t.log.Debug("outbound queue full, message dropped", zap.Uint64("to", m.To))
	}
}

// SetPeer implements PeerSetter: it adds replica id at addr (a replica added to the
// group). A peer already known keeps its address.
func (t *TCPTransport) SetPeer(id uint64, addr string) {
	if id == t.cfg.ID || id == 0 || addr == "" {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.out[id]; ok {
		return
	}
	select {
	case <-t.stop:
		return
	default:
	}
	ch := make(chan Message, t.cfg.QueueLen)
	t.out[id] = ch
	t.wg.Add(1)
	go t.sender(id, addr, ch)
}

// Recv implements Transport.
func (t *TCPTransport) Recv() <-chan Message { return t.recv }

// Close stops listening, closes every connection and waits for the goroutines.
func (t *TCPTransport) Close() error {
	t.once.Do(func() {
		close(t.stop)
		t.ln.Close()
		t.mu.Lock()
		for c := range t.conns {
			c.Close()
		}
		t.mu.Unlock()
	})
	t.wg.Wait()
	return nil
}

func (t *TCPTransport) track(c net.Conn, add bool) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if add {
		select {
		case <-t.stop:
			return false
		default:
		}
		t.conns[c] = struct{}{}
	} else {
		delete(t.conns, c)
	}
	return true
}

func (t *TCPTransport) acceptLoop() {
	defer t.wg.Done()
	for {
		c, err := t.ln.Accept()
		if err != nil {
			select {
			case <-t.stop:
				return
			default:
			}
			t.log.Warn("accept failed", zap.Error(err))
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if !t.track(c, true) {
			c.Close()
			return
		}
		t.wg.Add(1)
		go t.serveConn(c)
	}
}

func (t *TCPTransport) serveConn(c net.Conn) {
	defer t.wg.Done()
	defer t.track(c, false)
	defer c.Close()
	remote := c.RemoteAddr().String()
	c.SetDeadline(time.Now().Add(t.cfg.HandshakeTimeout))
	if tc, ok := c.(*tls.Conn); ok {
		if err := tc.Handshake(); err != nil {
			if ok, held := t.inLog.allow(time.Now()); ok {
				t.log.Warn("TLS handshake failed, connection dropped", zap.String("remote", remote), zap.Error(err),
					zap.Int("similar_failures_not_logged", held))
			}
			return
		}
	}
	peer, err := t.serverHandshake(c)
	if err != nil {
		if ok, held := t.inLog.allow(time.Now()); ok {
			t.log.Warn("unauthenticated connection dropped", zap.String("remote", remote), zap.Error(err),
				zap.Int("similar_failures_not_logged", held))
		}
		return
	}
	c.SetDeadline(time.Time{})
	r := bufio.NewReaderSize(c, 256<<10)
	var buf []byte
	for {
		var err error
		buf, err = readFrame(r, t.cfg.MaxFrame, buf)
		if err != nil {
			if !errors.Is(err, io.EOF) {
				select {
				case <-t.stop:
				default:
					t.log.Warn("bad frame, connection dropped", zap.Uint64("peer", peer), zap.String("remote", remote), zap.Error(err))
				}
			}
			return
		}
		pm := &paxospb.Message{}
		if err := proto.Unmarshal(buf, pm); err != nil {
			t.log.Warn("undecodable frame dropped", zap.Uint64("peer", peer), zap.Int("bytes", len(buf)), zap.Error(err))
			continue
		}
		m := fromPBMessage(pm)
		if m.From != peer || m.To != t.cfg.ID {
			t.log.Warn("frame with wrong sender or receiver dropped", zap.Uint64("peer", peer), zap.Uint64("from", m.From), zap.Uint64("to", m.To))
			continue
		}
		select {
		case t.recv <- m:
		case <-t.stop:
			return
		}
	}
}

func (t *TCPTransport) sender(id uint64, addr string, ch chan Message) {
	defer t.wg.Done()
	var c net.Conn
	var w *bufio.Writer
	var retryAt time.Time
	backoff := minRedial
	var buf []byte
	var dialLog logLimiter
	closeConn := func() {
		if c != nil {
			c.Close()
			t.track(c, false)
			c, w = nil, nil
		}
	}
	defer closeConn()
	retry := time.NewTimer(0)
	defer retry.Stop()
	for {
		// The connection is made as soon as the peer can be reached, not when the first
		// message waits for it: followers send each other nothing while a leader lives,
		// so the first messages between them are the election's, and a dial and two
		// handshakes between starved processes cost the first pre-votes (at 1,000
		// machines two rounds went unanswered, 2 s of a failover).
		if c == nil && !time.Now().Before(retryAt) {
			began := time.Now()
			nc, err := t.dial(id, addr)
			switch {
			case errors.Is(err, ErrStopped):
				return
			case err != nil:
				if errors.Is(err, ErrHandshake) {
					// Reached the peer but could not authenticate: an operator must act.
					if ok, held := dialLog.allow(time.Now()); ok {
						t.log.Warn("handshake with peer failed", zap.Uint64("peer", id), zap.String("addr", addr), zap.Error(err),
							zap.Int("similar_failures_not_logged", held))
					}
				} else {
					t.log.Debug("dial failed", zap.Uint64("peer", id), zap.String("addr", addr), zap.Error(err))
				}
				retryAt = time.Now().Add(backoff)
				backoff = min(2*backoff, maxRedial)
			default:
				c, w = nc, bufio.NewWriterSize(nc, 256<<10)
				backoff = minRedial
				t.log.Info("connected to peer", zap.Uint64("peer", id), zap.String("addr", addr), zap.Duration("took", time.Since(began)))
			}
		}
		var wake <-chan time.Time
		if c == nil {
			retry.Reset(time.Until(retryAt))
			wake = retry.C
		}
		var m Message
		select {
		case <-t.stop:
			return
		case <-wake:
			continue
		case m = <-ch:
		}
		if c == nil {
			continue // peer down: drop, Paxos retransmits
		}
		var err error
		for {
			buf, err = appendFrame(buf[:0], m)
			if err == nil {
				_, err = w.Write(buf)
			}
			if err != nil {
				break
			}
			more := false
			select {
			case m = <-ch:
				more = true
			default:
			}
			if !more {
				break
			}
		}
		if err == nil {
			err = w.Flush()
		}
		if err != nil {
			t.log.Debug("write failed, reconnecting", zap.Uint64("peer", id), zap.Error(err))
			closeConn()
			retryAt = time.Time{} // at once: the peer was there a moment ago
		}
	}
}

// minRedial and maxRedial bound the wait between two attempts to connect to a peer that
// cannot be reached (doubling from one to the other).
const (
	minRedial = 50 * time.Millisecond
	maxRedial = 500 * time.Millisecond
)

func (t *TCPTransport) dial(id uint64, addr string) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", addr, t.cfg.DialTimeout)
	if err != nil {
		return nil, err
	}
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	if !t.track(c, true) {
		c.Close()
		return nil, ErrStopped
	}
	c.SetDeadline(time.Now().Add(t.cfg.HandshakeTimeout))
	if t.cfg.TLS != nil {
		cfg := t.cfg.TLS.Clone()
		if cfg.ServerName == "" {
			cfg.ServerName, _, _ = net.SplitHostPort(addr)
		}
		tc := tls.Client(c, cfg)
		err := tc.Handshake()
		t.track(c, false)
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("%w: TLS with peer %d at %s: %v", ErrHandshake, id, addr, err)
		}
		if !t.track(tc, true) {
			c.Close()
			return nil, ErrStopped
		}
		c = tc
	}
	if err := t.clientHandshake(c, id); err != nil {
		c.Close()
		t.track(c, false)
		var oe *net.OpError
		if errors.As(err, &oe) && oe.Op == "remote error" {
			// TLS 1.3: the listener refuses a client certificate after the handshake.
			return nil, fmt.Errorf("%w: peer %d at %s refused this replica's TLS certificate (missing, or not signed by the cluster's CA): %v", ErrHandshake, id, addr, err)
		}
		return nil, err
	}
	c.SetDeadline(time.Time{})
	return c, nil
}

func (t *TCPTransport) mac(label string, a, b []byte, x, y uint64) []byte {
	h := hmac.New(sha256.New, t.cfg.Token)
	h.Write([]byte(label))
	h.Write(a)
	h.Write(b)
	var ids [16]byte
	binary.BigEndian.PutUint64(ids[:8], x)
	binary.BigEndian.PutUint64(ids[8:], y)
	h.Write(ids[:])
	return h.Sum(nil)
}

func nonce() []byte {
	b := make([]byte, 32)
	rand.Read(b)
	return b
}

func writeHello(c net.Conn, h *paxospb.Hello) error {
	b, err := proto.Marshal(h)
	if err != nil {
		return err
	}
	frame := binary.BigEndian.AppendUint32(nil, uint32(len(b)))
	_, err = c.Write(append(frame, b...))
	return err
}

func readHello(r io.Reader) (*paxospb.Hello, error) {
	b, err := readFrame(r, 4096, nil)
	if err != nil {
		return nil, err
	}
	h := &paxospb.Hello{}
	if err := proto.Unmarshal(b, h); err != nil {
		return nil, fmt.Errorf("decode hello: %w", err)
	}
	return h, nil
}

// serverHandshake: send a challenge, check the client's MAC over both nonces and ids,
// answer with our own MAC so the client can check us. A client whose proof fails is told
// so (a Hello without a MAC) before the connection closes, so that it can say the tokens
// differ.
func (t *TCPTransport) serverHandshake(c net.Conn) (uint64, error) {
	ns := nonce()
	if err := writeHello(c, &paxospb.Hello{From: t.cfg.ID, Nonce: ns}); err != nil {
		return 0, err
	}
	h, err := readHello(c)
	if err != nil {
		return 0, err
	}
	t.mu.Lock()
	_, known := t.out[h.From]
	t.mu.Unlock()
	if !known || h.From == t.cfg.ID {
		return 0, fmt.Errorf("%w: replica %d is not a peer of replica %d", ErrHandshake, h.From, t.cfg.ID)
	}
	if len(h.Nonce) != 32 || !hmac.Equal(h.Mac, t.mac("atoll-paxos-client", ns, h.Nonce, h.From, t.cfg.ID)) {
		writeHello(c, &paxospb.Hello{From: t.cfg.ID}) // refused: no MAC
		return 0, fmt.Errorf("%w: peer %d failed the token proof: the cluster tokens differ", ErrHandshake, h.From)
	}
	if err := writeHello(c, &paxospb.Hello{From: t.cfg.ID, Mac: t.mac("atoll-paxos-server", h.Nonce, ns, t.cfg.ID, h.From)}); err != nil {
		return 0, err
	}
	return h.From, nil
}

func (t *TCPTransport) clientHandshake(c net.Conn, peer uint64) error {
	h, err := readHello(c)
	if err != nil {
		return err
	}
	if h.From != peer || len(h.Nonce) != 32 {
		return fmt.Errorf("%w: the replica at %s says it is %d, want %d", ErrHandshake, c.RemoteAddr(), h.From, peer)
	}
	nc := nonce()
	if err := writeHello(c, &paxospb.Hello{From: t.cfg.ID, Nonce: nc, Mac: t.mac("atoll-paxos-client", h.Nonce, nc, t.cfg.ID, peer)}); err != nil {
		return err
	}
	h2, err := readHello(c)
	if errors.Is(err, io.EOF) {
		return fmt.Errorf("%w: peer %d closed the connection during the handshake: it does not list replica %d as a peer", ErrHandshake, peer, t.cfg.ID)
	}
	if err != nil {
		return err
	}
	if len(h2.Mac) == 0 {
		return fmt.Errorf("%w: peer %d refused this replica's token proof: the cluster tokens differ", ErrHandshake, peer)
	}
	if !hmac.Equal(h2.Mac, t.mac("atoll-paxos-server", nc, h.Nonce, peer, t.cfg.ID)) {
		return fmt.Errorf("%w: peer %d failed the token proof: the cluster tokens differ", ErrHandshake, peer)
	}
	return nil
}

// readFrame reads one length-prefixed frame, refusing lengths above max.
func readFrame(r io.Reader, maxLen int, buf []byte) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if int64(n) > int64(maxLen) {
		return nil, fmt.Errorf("%w: frame of %d bytes exceeds the %d byte limit", ErrBadFrame, n, maxLen)
	}
	if cap(buf) < int(n) {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	if _, err := io.ReadFull(r, buf); err != nil {
		return nil, fmt.Errorf("%w: truncated frame (%d bytes announced): %v", ErrBadFrame, n, err)
	}
	return buf, nil
}

func appendFrame(dst []byte, m Message) ([]byte, error) {
	dst = append(dst, 0, 0, 0, 0)
	var err error
	dst, err = proto.MarshalOptions{}.MarshalAppend(dst, toPBMessage(m))
	if err != nil {
		return nil, fmt.Errorf("paxos: encode %v: %w", m.Type, err)
	}
	binary.BigEndian.PutUint32(dst, uint32(len(dst)-4))
	return dst, nil
}

func toPBMessage(m Message) *paxospb.Message {
	return &paxospb.Message{Type: uint32(m.Type), From: m.From, To: m.To, Ballot: m.Ballot, Slot: m.Slot, Last: m.Last,
		Commit: m.Commit, Entries: toPBEntries(m.Entries), Reject: m.Reject, Promised: m.Promised, Seq: m.Seq, KnownCommit: m.KnownCommit, Snapshot: m.Snapshot,
		Epoch: m.Epoch, Conf: pbConfOrNil(m.Conf)}
}

func fromPBMessage(p *paxospb.Message) Message {
	return Message{Type: MsgType(p.Type), From: p.From, To: p.To, Ballot: p.Ballot, Slot: p.Slot, Last: p.Last,
		Commit: p.Commit, Entries: fromPBEntries(p.Entries), Reject: p.Reject, Promised: p.Promised, Seq: p.Seq, KnownCommit: p.KnownCommit, Snapshot: p.Snapshot,
		Epoch: p.Epoch, Conf: fromPBConf(p.Conf)}
}

func pbConfOrNil(c ConfState) *paxospb.ConfState {
	if c.Epoch == 0 && len(c.Members) == 0 {
		return nil
	}
	return toPBConf(c)
}
