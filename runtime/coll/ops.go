package coll

import (
	"context"
	"fmt"
)

// opBarrier is Barrier's op code in a machine's segment; opChain a broadcast's pieces.
const (
	opBarrier = 14
	opChain   = 15
)

// Shard is the part of a vector of length floats that rank owns in AllGather and
// ReduceScatter: the vector cut into Size nearly equal, consecutive parts, rank's the
// rank-th.
func (mm *Member) Shard(length, rank int) (lo, hi int) { return bounds(length, mm.Size(), rank) }

// AllGather fills every member's shard of data (Shard) with its owner's, in place: on
// entry each member's data holds its own shard; on return every member's data holds
// every shard. Every member must call it with the same length. Placement and failures
// as AllReduce.
func (mm *Member) AllGather(ctx context.Context, data []float32) error {
	m := mm.m
	if err := m.q.quiesce(ctx); err != nil {
		return err
	}
	shard := evenBounds(len(data), mm.Size())
	if h := m.hierFor(4 * len(data)); h != nil {
		return m.wrap("allgather", h.allGather(ctx, m, data, shard))
	}
	return m.wrap("allgather", m.allGather(ctx, data, shard))
}

// ReduceScatter sums data element-wise across every member and leaves each member its
// own shard of the sum (Shard): on return data[lo:hi] of this member's shard holds it;
// the rest of data is scratch, its contents unspecified. Every member must call it with
// the same length. Placement and failures as AllReduce.
func (mm *Member) ReduceScatter(ctx context.Context, data []float32) error {
	m := mm.m
	if err := m.q.quiesce(ctx); err != nil {
		return err
	}
	shard := evenBounds(len(data), mm.Size())
	if h := m.hierForSum(4 * len(data)); h != nil {
		return m.wrap("reducescatter", h.reduceScatter(ctx, m, data, shard))
	}
	return m.wrap("reducescatter", m.reduceScatter(ctx, data, shard))
}

// Broadcast copies root's data to every member's, in place. Every member must call it
// with the same root and length. Placement and failures as AllReduce.
func (mm *Member) Broadcast(ctx context.Context, root int, data []float32) error {
	m := mm.m
	if err := m.q.quiesce(ctx); err != nil {
		return err
	}
	n := mm.Size()
	if root < 0 || root >= n {
		return fmt.Errorf("%w: broadcast from rank %d of %d", ErrMismatch, root, n)
	}
	if h := m.hierFor(4 * len(data)); h != nil {
		return m.wrap("broadcast", h.broadcast(ctx, m, root, data))
	}
	return m.wrap("broadcast", m.broadcast(ctx, root, data))
}

// Barrier returns once every member has called it. Placement and failures as AllReduce.
func (mm *Member) Barrier(ctx context.Context) error {
	m := mm.m
	if err := m.q.quiesce(ctx); err != nil {
		return err
	}
	if h := m.hierFor(0); h != nil {
		return m.wrap("barrier", h.barrier(ctx, m))
	}
	return m.wrap("barrier", m.allReduce(ctx, []float32{0}))
}

// next begins a collective: it takes the collective's sequence number and drops the chunks
// of earlier ones that were taken from the inbox before their turn and never used (their
// collective failed here).
func (m *member) next() (n int, seq int64) {
	m.mu.Lock()
	m.seq++
	n, seq = len(m.peers), m.seq
	var stale []incoming
	for k, in := range m.early {
		if k.seq < seq {
			stale = append(stale, in)
			delete(m.early, k)
		}
	}
	m.mu.Unlock()
	for _, in := range stale {
		m.drop(in)
	}
	return n, seq
}

// Skip counts a collective this member's caller gave up on before it began here (its
// context ended while the world's communicator formed), as the members that began it
// count it: every member's next collective then has the same number, and the chunks the
// others sent for the skipped one are dropped when they arrive. The others' skipped
// collective fails (this member never sends its part), on every member alike. Skip keeps
// the count of the flat ring; a member of a machine's shared segment that skips leaves
// its machine's other members waiting at the segment, as any member's failure does.
func (mm *Member) Skip() { mm.m.next() }

// allGather is the ring all-gather among the member's peers: rank r owns chunk bnd(r).
func (m *member) allGather(ctx context.Context, data []float32, bnd func(int) (int, int)) error {
	n, seq := m.next()
	if n <= 1 {
		return nil
	}
	if err := m.ring(ctx, seq, n, data, bnd, opNone, opAG); err != nil {
		return err
	}
	return m.drain(ctx, n, "allgather")
}

// reduceScatter is the ring reduce-scatter among the member's peers: rank r ends with the
// sum of chunk bnd(r).
func (m *member) reduceScatter(ctx context.Context, data []float32, bnd func(int) (int, int)) error {
	n, seq := m.next()
	if n <= 1 {
		return nil
	}
	if err := m.ring(ctx, seq, n, data, bnd, opRS, opNone); err != nil {
		return err
	}
	return m.drain(ctx, n, "reducescatter")
}

// BroadcastPiece is the size of one piece of a broadcast's pipeline: each member
// forwards a piece to the next as soon as it has it.
const BroadcastPiece = 4 << 20

// broadcast is a pipelined chain from the root around the ring: the vector in pieces of
// about BroadcastPiece bytes (one piece between two members), each forwarded by every
// member as soon as it arrived, so every link carries the vector once and the time is
// one vector's plus a piece's per hop.
func (m *member) broadcast(ctx context.Context, root int, data []float32) error {
	n, seq := m.next()
	if n <= 1 {
		return nil
	}
	rank := m.key.rank
	mod := func(x int) int { return ((x % n) + n) % n }
	rel, right, left := mod(rank-root), mod(rank+1), mod(rank-1)
	pieces := 1 // a chain of two has nothing to overlap: one piece, one message
	if n > 2 {
		pieces = max(1, min(len(data), (4*len(data)+BroadcastPiece-1)/BroadcastPiece))
	}
	var scratch []float32
	for k := 0; k < pieces; k++ {
		lo, hi := bounds(len(data), pieces, k)
		key := stepKey{seq, opChain, k}
		if rel != 0 {
			if err := m.take(ctx, left, key, data, lo, hi, k, false, &scratch); err != nil {
				return fmt.Errorf("piece %d: %w", k, err)
			}
		}
		if rel != n-1 {
			if err := m.send(ctx, right, key, data, lo, hi, k); err != nil {
				return fmt.Errorf("piece %d: send to rank %d: %w", k, right, err)
			}
		}
	}
	return m.drain(ctx, pieces, "broadcast")
}
