package runtime

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// ErrAborted is returned by a collective whose ring was aborted (a member failed).
var ErrAborted = errors.New("runtime: collective aborted")

// Ring runs collectives among the n ranks of one gang incarnation inside one process: rank i
// sends to rank i+1 and receives from rank i-1 over channels, as a ring AllReduce does over
// links. A Ring is used by one incarnation of a gang; when a member fails the runtime aborts it
// and the next incarnation gets a new one.
type Ring struct {
	n     int
	plane ChunkPlane
	inbox []chan ringMsg // inbox[i] carries what rank i-1 sends to rank i
	abort chan struct{}
	once  sync.Once
}

type ringMsg struct {
	op, step, total int
	chunk           []float32   // inline, when the ring has no plane
	handle          ChunkHandle // the chunk's object, when it has one
}

// ChunkPlane moves a ring's chunks between ranks through the object store: Send stores a
// chunk on the sender's machine and returns a handle; Recv lends the receiver a read-only
// view of it (the shared memory itself on the same machine, a checksummed pull otherwise)
// and frees it afterwards. Implementations are safe for concurrent use by all ranks.
type ChunkPlane interface {
	Send(ctx context.Context, from int, chunk []float32) (ChunkHandle, error)
	Recv(ctx context.Context, to int, h ChunkHandle, use func(chunk []float32)) error
}

// ChunkHandle names a chunk in flight.
type ChunkHandle struct {
	ID ObjectID
	N  int // float32 count
}

// NewRingOver makes a ring of n ranks whose chunks move through plane.
func NewRingOver(n int, plane ChunkPlane) *Ring {
	r := NewRing(n)
	r.plane = plane
	return r
}

// NewRing makes a ring of n ranks.
func NewRing(n int) *Ring {
	r := &Ring{n: n, inbox: make([]chan ringMsg, n), abort: make(chan struct{})}
	for i := range r.inbox {
		r.inbox[i] = make(chan ringMsg, n)
	}
	return r
}

// Size is the number of ranks.
func (r *Ring) Size() int { return r.n }

// Abort wakes every rank waiting in a collective with ErrAborted; later calls fail at once.
// When the ring's plane can release chunks in flight (PlaneReleaser), they are freed, and
// the plane refuses later sends.
func (r *Ring) Abort() {
	r.once.Do(func() {
		close(r.abort)
		if rel, ok := r.plane.(PlaneReleaser); ok {
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				_ = rel.Release(ctx)
			}()
		}
	})
}

// PlaneReleaser is implemented by chunk planes that can free the chunks of an aborted ring.
type PlaneReleaser interface {
	Release(ctx context.Context) error
}

func chunkBounds(length, n, k int) (int, int) {
	return k * length / n, (k + 1) * length / n
}

// AllReduce sums data element-wise across all ranks, in place: every rank must call it with a
// slice of the same length. It is the bandwidth-optimal ring algorithm: a reduce-scatter of
// n-1 steps, then an all-gather of n-1 steps, each rank sending 2(n-1)/n of the data.
func (r *Ring) AllReduce(ctx context.Context, rank int, data []float32) error {
	if rank < 0 || rank >= r.n {
		return fmt.Errorf("%w: rank %d outside ring of %d", ErrInvalidRequest, rank, r.n)
	}
	if r.n == 1 {
		return nil
	}
	n := r.n
	right := (rank + 1) % n
	mod := func(x int) int { return ((x % n) + n) % n }
	exchange := func(op, step, sendChunk int) (ringMsg, error) {
		lo, hi := chunkBounds(len(data), n, sendChunk)
		out := ringMsg{op: op, step: step, total: len(data)}
		if r.plane != nil && hi > lo {
			h, err := r.plane.Send(ctx, rank, data[lo:hi])
			if err != nil {
				return ringMsg{}, err
			}
			out.handle = h
		} else {
			out.chunk = append([]float32(nil), data[lo:hi]...)
		}
		select {
		case r.inbox[right] <- out:
		case <-r.abort:
			return ringMsg{}, ErrAborted
		case <-ctx.Done():
			return ringMsg{}, ctx.Err()
		}
		select {
		case in := <-r.inbox[rank]:
			if in.op != op || in.step != step || in.total != len(data) {
				return ringMsg{}, fmt.Errorf("%w: rank %d got step %d/%d of length %d, expected step %d/%d of length %d (ranks called collectives out of order or with different lengths)",
					ErrInvalidRequest, rank, in.op, in.step, in.total, op, step, len(data))
			}
			return in, nil
		case <-r.abort:
			return ringMsg{}, ErrAborted
		case <-ctx.Done():
			return ringMsg{}, ctx.Err()
		}
	}
	for s := 0; s < n-1; s++ { // reduce-scatter
		in, err := exchange(0, s, mod(rank-s))
		if err != nil {
			return fmt.Errorf("allreduce rank %d: %w", rank, err)
		}
		lo, _ := chunkBounds(len(data), n, mod(rank-s-1))
		if err := r.receive(ctx, rank, in, func(c []float32) {
			for i, v := range c {
				data[lo+i] += v
			}
		}); err != nil {
			return fmt.Errorf("allreduce rank %d: %w", rank, err)
		}
	}
	for s := 0; s < n-1; s++ { // all-gather
		in, err := exchange(1, s, mod(rank+1-s))
		if err != nil {
			return fmt.Errorf("allreduce rank %d: %w", rank, err)
		}
		lo, _ := chunkBounds(len(data), n, mod(rank-s))
		if err := r.receive(ctx, rank, in, func(c []float32) { copy(data[lo:], c) }); err != nil {
			return fmt.Errorf("allreduce rank %d: %w", rank, err)
		}
	}
	return nil
}

func (r *Ring) receive(ctx context.Context, rank int, in ringMsg, use func([]float32)) error {
	if in.handle.ID == "" {
		use(in.chunk)
		return nil
	}
	return r.plane.Recv(ctx, rank, in.handle, use)
}
