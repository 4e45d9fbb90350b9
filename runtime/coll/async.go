package coll

import (
	"context"
	"sync"
)

// Handle is the result of a collective started asynchronously: done once it ended.
type Handle struct {
	done chan struct{}
	err  error
}

// Done is closed when the collective has ended.
func (h *Handle) Done() <-chan struct{} { return h.done }

// Wait waits for the collective and returns its error, or ctx's if ctx ends first (the
// collective goes on).
func (h *Handle) Wait(ctx context.Context) error {
	select {
	case <-h.done:
		return h.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (h *Handle) finish(err error) {
	h.err = err
	close(h.done)
}

// queue runs a member's asynchronous collectives one after the other, in the order they
// were started (every rank starts them in the same order), on a goroutine that ends when
// the queue is empty.
type queue struct {
	mu      sync.Mutex
	pending []func()
	running bool
	last    *Handle
}

func (q *queue) push(f func(), h *Handle) {
	q.mu.Lock()
	q.pending = append(q.pending, f)
	q.last = h
	if q.running {
		q.mu.Unlock()
		return
	}
	q.running = true
	q.mu.Unlock()
	go func() {
		for {
			q.mu.Lock()
			if len(q.pending) == 0 {
				q.running = false
				q.mu.Unlock()
				return
			}
			f := q.pending[0]
			q.pending = q.pending[1:]
			q.mu.Unlock()
			f()
		}
	}()
}

// quiesce waits until every collective started asynchronously has ended: a synchronous
// collective must not overtake them.
func (q *queue) quiesce(ctx context.Context) error {
	q.mu.Lock()
	last := q.last
	q.mu.Unlock()
	if last == nil {
		return nil
	}
	select {
	case <-last.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// AllReduceAsync starts AllReduce of data after every collective started before it on
// this member and returns at once; data belongs to the collective until the handle is
// done. ctx bounds the collective, as AllReduce's. Synchronous collectives called later
// wait for it first.
func (mm *Member) AllReduceAsync(ctx context.Context, data []float32) *Handle {
	h := &Handle{done: make(chan struct{})}
	mm.m.q.push(func() { h.finish(mm.allReduce(ctx, data)) }, h)
	return h
}

// Buckets groups many small vectors (a model's gradients, layer by layer) into buckets of
// about a given size, each AllReduced asynchronously as one vector as soon as it is full,
// so that communication overlaps the computation of the next gradients (PyTorch DDP's
// buckets). Every member must Add vectors of the same lengths in the same order, and
// Flush at the same points. A Buckets is used by one goroutine.
type Buckets struct {
	mm    *Member
	bytes int
	parts [][]float32
	n     int
	h     *Handle
}

// Buckets returns a bucketing of AllReduces in buckets of about bytes bytes.
func (mm *Member) Buckets(bytes int) *Buckets { return &Buckets{mm: mm, bytes: max(bytes, 4)} }

// Add puts data in the open bucket (starting its AllReduce when full) and returns the
// bucket's handle: once it is done data holds the sum. data belongs to the collective
// until then.
func (b *Buckets) Add(ctx context.Context, data []float32) *Handle {
	if b.h == nil {
		b.h = &Handle{done: make(chan struct{})}
	}
	h := b.h
	b.parts = append(b.parts, data)
	b.n += len(data)
	if 4*b.n >= b.bytes {
		b.Flush(ctx)
	}
	return h
}

// Flush starts the open bucket's AllReduce, full or not.
func (b *Buckets) Flush(ctx context.Context) {
	if b.h == nil {
		return
	}
	parts, n, h := b.parts, b.n, b.h
	b.parts, b.n, b.h = nil, 0, nil
	b.mm.m.q.push(func() {
		if len(parts) == 1 {
			h.finish(b.mm.allReduce(ctx, parts[0]))
			return
		}
		flat := make([]float32, 0, n)
		for _, p := range parts {
			flat = append(flat, p...)
		}
		err := b.mm.allReduce(ctx, flat)
		if err == nil {
			off := 0
			for _, p := range parts {
				off += copy(p, flat[off:])
			}
		}
		h.finish(err)
	}, h)
}
