// Package coll runs a gang's collectives (AllReduce, its asynchronous and bucketed
// forms, AllGather, ReduceScatter, Broadcast, Barrier) between its members, wherever they
// live, choosing the algorithm from the placement (topology.HostAllReduceTime):
//
//   - members in one process hand each other their vectors' chunks in memory (the
//     receiver reads the sender's slice, no copy);
//   - members of one machine, a process each, meet in a shared-memory segment of the
//     machine (/dev/shm, a futex barrier in its header): no socket, no encryption;
//   - between machines, one ring per rail (the members of one local index on every
//     machine; a leader per machine when machines hold different numbers) over the
//     transfer plane, RDMA-style: the sender registers the chunk's memory as a region on
//     its transfer.Transport and tells the receiver its key; the receiver reads it
//     straight into its own vector (a checksummed read, inside mutual TLS) and
//     acknowledges, and only then may the sender write that chunk again.
//
// The messages that say "a chunk is ready" go to each process's router (a process
// registered beside the actors, not an actor mailbox, so they are taken while the member
// is busy in the call that runs the collective).
//
//	m, _ := plane.Join(job, gang, gen, rank, peers) // peers: addresses and machines by rank
//	err := m.AllReduce(ctx, grads)
//	h := m.AllReduceAsync(ctx, bucket) // ... compute ...; h.Wait(ctx)
package coll

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/atoll-run/atoll/actors"
	"github.com/atoll-run/atoll/internal/codec"
	"github.com/atoll-run/atoll/proto/collpb"
	"github.com/atoll-run/atoll/store/object"
	"github.com/atoll-run/atoll/store/transfer"
)

// RouterID is the id of every process's collective router.
const RouterID = "atoll$coll"

// Errors of the package.
var (
	// ErrAborted: the ring's generation ended (a member failed); the collective cannot finish.
	ErrAborted = errors.New("coll: collective aborted: the gang's generation ended")
	// ErrMismatch: ranks called collectives out of order or with different lengths.
	ErrMismatch = errors.New("coll: ranks disagree on the collective")
)

// Peer is where a gang member runs: its actor system's address and its machine.
type Peer struct {
	Address string
	// Machine names the machine (its agent) the member runs on. Members of one machine,
	// each in a process of its own, meet in the machine's shared memory (see Hierarchical);
	// empty: unknown, the member is only reached through its address.
	Machine string
}

// Plane is one process's side of every collective of the gangs it hosts members of.
type Plane struct {
	sys    *actors.System
	log    *zap.Logger
	token  []byte
	listen string
	// serverTLS and clientTLS make the plane's links mutual TLS (UseTLS).
	serverTLS, clientTLS *tls.Config

	mu      sync.Mutex
	tr      transfer.Transport
	conns   map[string]transfer.Endpoint
	members map[memberKey]*member
	closed  bool
}

type memberKey struct {
	job, gang string
	gen       int64
	rank      int
}

// NewPlane returns the plane of a process whose actors live on sys. Its transfer server
// (started on first need) listens on listenHost; token authenticates the plane's links.
func NewPlane(sys *actors.System, token []byte, listenHost string, log *zap.Logger) (*Plane, error) {
	if log == nil {
		log = zap.NewNop()
	}
	if listenHost == "" {
		listenHost = "127.0.0.1"
	}
	p := &Plane{sys: sys, log: log.Named("coll"), token: token, listen: net.JoinHostPort(listenHost, "0"),
		conns: map[string]transfer.Endpoint{}, members: map[memberKey]*member{}}
	if err := sys.AddProcess(RouterID, &router{p: p}); err != nil {
		return nil, fmt.Errorf("coll: %w", err)
	}
	return p, nil
}

// UseTLS makes the plane's links mutual TLS (the token is still proven inside them). Call
// it before the first collective.
func (p *Plane) UseTLS(server, client *tls.Config) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.serverTLS, p.clientTLS = server, client
}

// Close ends every collective of this process and stops its transport.
func (p *Plane) Close() error {
	p.mu.Lock()
	p.closed = true
	ms := make([]*member, 0, len(p.members))
	for _, m := range p.members {
		ms = append(ms, m)
	}
	tr, conns := p.tr, p.conns
	p.conns = map[string]transfer.Endpoint{}
	p.mu.Unlock()
	for _, m := range ms {
		m.abort()
	}
	for _, c := range conns {
		_ = c.Close()
	}
	if tr != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		return tr.Shutdown(ctx)
	}
	return nil
}

type noSource struct{}

func (noSource) OpenRegion(context.Context, object.ID) (transfer.Region, error) {
	return nil, fmt.Errorf("coll: the collective server serves registered chunks only: %w", object.ErrNotFound)
}

// transport returns the plane's transport, started on first use: the transfer plane's
// TCP transport (a server of registered chunks listening on the plane's host, and a
// client), mutual TLS after UseTLS. Chunks are registered on it and read through it
// (transfer.Transport, the verbs-shaped seam a verbs backend would implement).
func (p *Plane) transport() (transfer.Transport, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tr != nil {
		return p.tr, nil
	}
	scfg := transfer.DefaultServerConfig()
	scfg.Token, scfg.Logger, scfg.TLS = p.token, p.log, p.serverTLS
	srv, err := transfer.NewServer(scfg, noSource{})
	if err != nil {
		return nil, err
	}
	ccfg := transfer.DefaultClientConfig()
	ccfg.Token, ccfg.Logger, ccfg.TLS = p.token, p.log, p.clientTLS
	cl, err := transfer.NewClient(ccfg)
	if err != nil {
		return nil, err
	}
	addr, err := srv.Listen(p.listen)
	if err != nil {
		return nil, fmt.Errorf("coll: listen %s: %w", p.listen, err)
	}
	p.tr = transfer.NewTCPTransport(srv, addr, cl)
	return p.tr, nil
}

// conn returns a pooled endpoint to a peer's transport.
func (p *Plane) conn(ctx context.Context, addr string) (transfer.Endpoint, error) {
	p.mu.Lock()
	c := p.conns[addr]
	p.mu.Unlock()
	if c != nil && !c.Closed() {
		return c, nil
	}
	tr, err := p.transport()
	if err != nil {
		return nil, err
	}
	c, err = tr.Dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	if old := p.conns[addr]; old != nil && !old.Closed() {
		p.mu.Unlock()
		_ = c.Close()
		return old, nil
	}
	p.conns[addr] = c
	p.mu.Unlock()
	return c, nil
}

// member returns (creating it) the member state of a rank of a ring in this process. A
// chunk may arrive before its receiver joins: the member is then created by the router
// and joined later.
func (p *Plane) member(k memberKey) *member {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := p.members[k]
	if m == nil {
		m = &member{plane: p, key: k, inbox: make(chan incoming, 64), closed: make(chan struct{}),
			busy: map[int]chan struct{}{}, acks: map[transfer.Key]func(){}, early: map[stepKey]incoming{}}
		if p.closed {
			m.abortLocked()
		}
		p.members[k] = m
	}
	return m
}

// Join makes this process's member of rank of a gang's generation ready for collectives.
// peers are the members' addresses by rank. Call End when the generation ends.
func (p *Plane) Join(job, gang string, gen int64, rank int, peers []Peer) (*Member, error) {
	if rank < 0 || rank >= len(peers) {
		return nil, fmt.Errorf("%w: rank %d of %d", ErrMismatch, rank, len(peers))
	}
	k := memberKey{job, gang, gen, rank}
	m := p.member(k)
	h := p.newHier(k, peers)
	m.mu.Lock()
	m.peers = append([]Peer(nil), peers...)
	m.hier = h
	m.mu.Unlock()
	return &Member{m: m}, nil
}

// End aborts and forgets every member of a gang generation in this process (its collectives
// fail with ErrAborted) and frees the chunks they still expose.
func (p *Plane) End(job, gang string, gen int64) {
	p.mu.Lock()
	var ms []*member
	for k, m := range p.members {
		if k.job == job && (k.gang == gang || strings.HasPrefix(k.gang, gang+"\x00")) && k.gen == gen {
			ms = append(ms, m)
			delete(p.members, k)
		}
	}
	p.mu.Unlock()
	for _, m := range ms {
		m.abort()
	}
}

// router takes Chunk and Ack messages for this process's members.
type router struct{ p *Plane }

func (r *router) SendUserMessage(_ *actor.PID, message any) {
	_, msg, _ := actor.UnwrapEnvelope(message)
	switch m := msg.(type) {
	case *collpb.Chunk:
		mem := r.p.member(memberKey{m.Job, m.Gang, m.Generation, int(m.ToRank)})
		mem.deliver(incoming{op: int(m.Op), step: int(m.Step), seq: m.Seq, total: m.Total, lo: m.Lo, n: m.N, remote: m})
	case *collpb.Ack:
		r.p.mu.Lock()
		mem := r.p.members[memberKey{m.Job, m.Gang, m.Generation, int(m.Rank)}]
		r.p.mu.Unlock()
		if mem != nil {
			var k transfer.Key
			copy(k[:], m.Key)
			mem.acked(k)
		}
	}
}
func (r *router) SendSystemMessage(*actor.PID, any) {}
func (r *router) Stop(*actor.PID)                   {}

// chunkRegion exposes a chunk of a member's vector on the transfer server.
type chunkRegion struct{ b []byte }

var _ transfer.Region = chunkRegion{}

func (r chunkRegion) Bytes() []byte                               { return r.b }
func (r chunkRegion) Size() int64                                 { return int64(len(r.b)) }
func (r chunkRegion) Fingerprint(context.Context) (uint64, error) { return 0, nil }
func (r chunkRegion) WaitReady(context.Context, int64) error      { return nil }
func (r chunkRegion) Close()                                      {}

func (p *Plane) sendTo(addr string, msg proto.Message) { p.sys.Tell(addr, RouterID, msg) }

func f32bytes(f []float32) []byte { return codec.F32View(f) }

// local reports whether a peer lives in this process.
func (p *Plane) local(addr string) bool { return addr == p.sys.Address() }
