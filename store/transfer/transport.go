package transfer

import (
	"context"
	"fmt"
	"sync"
)

// Transport is the seam between the data plane's users (the collectives, and pulls in
// time) and the wire, designed from the RDMA verbs model so that a verbs backend
// (rdma-core: ibv_reg_mr, RDMA READ over a reliable-connected queue pair) can sit behind
// it without changing its users:
//
//   - Register is ibv_reg_mr: memory of this process becomes a registered region, named
//     by a Key (the rkey, with a secret so that keys cannot be guessed); Deregister is
//     ibv_dereg_mr. The registering process does not take part in the reads that follow.
//   - Dial is connection establishment (rdma_cm's connect: a queue pair to a peer,
//     authenticated); Endpoint.Read is a one-sided RDMA READ of a range of the peer's
//     region by key, straight into dst (which a verbs backend would register too).
//   - Addr is what peers dial (rdma_cm's address); notifications ("the chunk is ready,
//     here is its key") travel outside the transport, as verbs applications send them
//     over a control channel.
//
// Today's implementation is TCP (NewTCPTransport: a Server serving registered regions,
// a Client's authenticated connections, mutual TLS when configured; each read is a
// request and a fingerprinted reply); MemTransport is the in-memory one beside it, for
// tests. Implementations are safe for concurrent use; a region's memory must stay valid
// and unchanged until it is deregistered.
type Transport interface {
	// Addr is where peers Dial this transport's registered regions ("" before Listen
	// on TCP).
	Addr() string
	// Register exposes r for one-sided reads by authenticated peers until Deregister.
	Register(r Region) Key
	// Deregister ends k's registration (reads in flight finish first) and reports
	// whether k was registered.
	Deregister(k Key) bool
	// Dial returns an endpoint to the transport at addr.
	Dial(ctx context.Context, addr string) (Endpoint, error)
	// Shutdown ends the registrations and the endpoints served.
	Shutdown(ctx context.Context) error
}

// Endpoint is a connection to a peer's transport: one-sided reads of its registered
// regions. Reads may be issued from many goroutines at once (they pipeline).
type Endpoint interface {
	// Read reads len(dst) bytes at off of the region registered under key into dst:
	// ErrBadKey for a key not registered, ErrRange outside the region,
	// ErrCorruptChunk when the bytes did not arrive intact.
	Read(ctx context.Context, key Key, off int64, dst []byte) error
	// Addr is the peer's address.
	Addr() string
	// Closed reports whether the endpoint is dead (dial again).
	Closed() bool
	Close() error
}

var (
	_ Endpoint  = (*Conn)(nil)
	_ Transport = (*TCPTransport)(nil)
	_ Transport = (*MemTransport)(nil)
)

// Read is ReadRange: Conn is the TCP transport's Endpoint.
func (cn *Conn) Read(ctx context.Context, key Key, off int64, dst []byte) error {
	return cn.ReadRange(ctx, key, off, dst)
}

// TCPTransport is the Transport over TCP: a Server for this process's registered
// regions and a Client for the peers'.
type TCPTransport struct {
	srv  *Server
	cl   *Client
	addr string
}

// NewTCPTransport returns the transport of a server (already listening at addr, or ""
// when it only reads) and a client.
func NewTCPTransport(srv *Server, addr string, cl *Client) *TCPTransport {
	return &TCPTransport{srv: srv, cl: cl, addr: addr}
}

// Addr implements Transport.
func (t *TCPTransport) Addr() string { return t.addr }

// Register implements Transport.
func (t *TCPTransport) Register(r Region) Key { return t.srv.RegisterRegion(r) }

// Deregister implements Transport.
func (t *TCPTransport) Deregister(k Key) bool { return t.srv.DeregisterRegion(k) }

// Dial implements Transport: a new authenticated connection.
func (t *TCPTransport) Dial(ctx context.Context, addr string) (Endpoint, error) {
	return t.cl.Dial(ctx, addr)
}

// Shutdown implements Transport.
func (t *TCPTransport) Shutdown(ctx context.Context) error {
	_ = t.cl.Close()
	if t.srv == nil {
		return nil
	}
	return t.srv.Shutdown(ctx)
}

// MemNetwork connects MemTransports by address, inside one process (tests).
type MemNetwork struct {
	mu    sync.Mutex
	next  int
	peers map[string]*MemTransport
}

// NewMemNetwork returns an empty network.
func NewMemNetwork() *MemNetwork { return &MemNetwork{peers: map[string]*MemTransport{}} }

// MemTransport is the in-memory Transport: a read copies from the registered region.
type MemTransport struct {
	net  *MemNetwork
	addr string

	mu     sync.Mutex
	next   uint64
	regs   map[Key]Region
	closed bool
}

// Transport returns a new transport on the network.
func (n *MemNetwork) Transport() *MemTransport {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.next++
	t := &MemTransport{net: n, addr: fmt.Sprintf("mem-%d", n.next), regs: map[Key]Region{}}
	n.peers[t.addr] = t
	return t
}

// Addr implements Transport.
func (t *MemTransport) Addr() string { return t.addr }

// Register implements Transport.
func (t *MemTransport) Register(r Region) Key {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.next++
	var k Key
	k[0], k[1], k[2], k[3], k[4], k[5], k[6], k[7] = byte(t.next>>56), byte(t.next>>48), byte(t.next>>40), byte(t.next>>32), byte(t.next>>24), byte(t.next>>16), byte(t.next>>8), byte(t.next)
	t.regs[k] = r
	return k
}

// Deregister implements Transport.
func (t *MemTransport) Deregister(k Key) bool {
	t.mu.Lock()
	r, ok := t.regs[k]
	delete(t.regs, k)
	t.mu.Unlock()
	if ok {
		r.Close()
	}
	return ok
}

// Dial implements Transport.
func (t *MemTransport) Dial(_ context.Context, addr string) (Endpoint, error) {
	t.net.mu.Lock()
	peer := t.net.peers[addr]
	t.net.mu.Unlock()
	if peer == nil {
		return nil, fmt.Errorf("transfer: dial %s: no such transport: %w", addr, ErrClosed)
	}
	return &memEndpoint{peer: peer}, nil
}

// Shutdown implements Transport.
func (t *MemTransport) Shutdown(context.Context) error {
	t.mu.Lock()
	regs := t.regs
	t.regs, t.closed = map[Key]Region{}, true
	t.mu.Unlock()
	for _, r := range regs {
		r.Close()
	}
	t.net.mu.Lock()
	delete(t.net.peers, t.addr)
	t.net.mu.Unlock()
	return nil
}

type memEndpoint struct {
	peer   *MemTransport
	mu     sync.Mutex
	closed bool
}

func (e *memEndpoint) Read(ctx context.Context, key Key, off int64, dst []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	e.mu.Lock()
	closed := e.closed
	e.mu.Unlock()
	e.peer.mu.Lock()
	defer e.peer.mu.Unlock()
	if closed || e.peer.closed {
		return fmt.Errorf("transfer: %s: %w", e.peer.addr, ErrClosed)
	}
	r, ok := e.peer.regs[key]
	if !ok {
		return fmt.Errorf("transfer: %s: %w", e.peer.addr, ErrBadKey)
	}
	if off < 0 || off+int64(len(dst)) > r.Size() {
		return fmt.Errorf("transfer: %s: [%d,+%d) of %d bytes: %w", e.peer.addr, off, len(dst), r.Size(), ErrRange)
	}
	copy(dst, r.Bytes()[off:])
	return nil
}

func (e *memEndpoint) Addr() string { return e.peer.addr }

func (e *memEndpoint) Closed() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.closed
}

func (e *memEndpoint) Close() error {
	e.mu.Lock()
	e.closed = true
	e.mu.Unlock()
	return nil
}
