package paxos

import (
	"math/rand"
	"sync"
	"time"
)

// MemNetwork is an in-memory network of replicas for tests. It can drop, delay (and so
// reorder), duplicate and partition messages. Safe for concurrent use.
type MemNetwork struct {
	mu       sync.Mutex
	rng      *rand.Rand
	nodes    map[uint64]*MemTransport
	cut      map[[2]uint64]bool
	drop     float64
	dup      float64
	minDelay time.Duration
	maxDelay time.Duration
}

// NewMemNetwork returns a network without faults; seed drives its fault choices.
func NewMemNetwork(seed int64) *MemNetwork {
	return &MemNetwork{rng: rand.New(rand.NewSource(seed)), nodes: map[uint64]*MemTransport{}, cut: map[[2]uint64]bool{}}
}

// SetFaults sets the drop and duplicate probabilities and the delay range.
func (n *MemNetwork) SetFaults(drop, dup float64, minDelay, maxDelay time.Duration) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.drop, n.dup, n.minDelay, n.maxDelay = drop, dup, minDelay, maxDelay
}

// Isolate cuts every link between id and the other replicas (both ways).
func (n *MemNetwork) Isolate(id uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for other := range n.nodes {
		if other != id {
			n.cut[[2]uint64{id, other}] = true
			n.cut[[2]uint64{other, id}] = true
		}
	}
}

// Heal removes every partition.
func (n *MemNetwork) Heal() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.cut = map[[2]uint64]bool{}
}

// Transport returns (creating) the endpoint of replica id.
func (n *MemNetwork) Transport(id uint64) *MemTransport {
	n.mu.Lock()
	defer n.mu.Unlock()
	if t, ok := n.nodes[id]; ok {
		return t
	}
	t := &MemTransport{net: n, id: id, ch: make(chan Message, 65536)}
	n.nodes[id] = t
	return t
}

// MemTransport is one replica's endpoint on a MemNetwork.
type MemTransport struct {
	net *MemNetwork
	id  uint64
	ch  chan Message
}

var _ Transport = (*MemTransport)(nil)

// Send implements Transport.
func (t *MemTransport) Send(m Message) {
	n := t.net
	n.mu.Lock()
	dst := n.nodes[m.To]
	if dst == nil || n.cut[[2]uint64{m.From, m.To}] || (n.drop > 0 && n.rng.Float64() < n.drop) {
		n.mu.Unlock()
		return
	}
	copies := 1
	if n.dup > 0 && n.rng.Float64() < n.dup {
		copies = 2
	}
	delays := make([]time.Duration, copies)
	for i := range delays {
		delays[i] = n.minDelay
		if n.maxDelay > n.minDelay {
			delays[i] += time.Duration(n.rng.Int63n(int64(n.maxDelay - n.minDelay)))
		}
	}
	n.mu.Unlock()
	for _, d := range delays {
		if d == 0 {
			dst.deliver(m)
			continue
		}
		time.AfterFunc(d, func() { dst.deliver(m) })
	}
}

func (t *MemTransport) deliver(m Message) {
	select {
	case t.ch <- m:
	default: // a full inbox drops, like a congested network
	}
}

// Recv implements Transport.
func (t *MemTransport) Recv() <-chan Message { return t.ch }

// Close implements Transport.
func (t *MemTransport) Close() error { return nil }
