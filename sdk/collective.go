package sdk

import (
	"context"

	"github.com/atoll-run/atoll/runtime/coll"
)

// Pending is the result of a collective started asynchronously (Context.AllReduceAsync,
// Buckets.Add): its slice belongs to the collective until it is done.
type Pending struct {
	w   *hosted
	h   *coll.Handle
	err error // the collective could not start
}

// Done is closed when the collective has ended.
func (p *Pending) Done() <-chan struct{} {
	if p.h == nil {
		ch := make(chan struct{})
		close(ch)
		return ch
	}
	return p.h.Done()
}

// Wait waits for the collective and returns its error (ErrStale when the gang's
// generation ended under it), or ctx's if ctx ends first (the collective goes on).
func (p *Pending) Wait(ctx context.Context) error {
	if p.h == nil {
		return p.err
	}
	if err := p.h.Wait(ctx); err != nil {
		if ctx.Err() != nil {
			return err
		}
		return p.w.collErr(ctx, err)
	}
	return nil
}

// AllReduceAsync starts AllReduce of data after every collective this worker started
// before it, and returns at once: computation goes on while the sum travels. data belongs
// to the collective until the Pending is done; every worker must start the same
// collectives in the same order. ctx bounds the collective. A synchronous collective
// called later waits for it first.
func (c *Context) AllReduceAsync(ctx context.Context, data []float32) *Pending {
	if c.w == nil {
		return &Pending{err: ErrNotInGang}
	}
	m, err := c.w.ring(ctx)
	if err != nil {
		return &Pending{err: err}
	}
	return &Pending{w: c.w, h: m.AllReduceAsync(ctx, data)}
}

// Buckets groups a model's gradients (many slices, layer by layer) into buckets of about
// a given size, each AllReduced asynchronously as one vector as soon as it is full, as
// PyTorch DDP's buckets do: the backward pass of the next layers overlaps the sums of the
// last ones. Every worker must Add slices of the same lengths in the same order and Flush
// at the same points. A Buckets is used by one goroutine.
type Buckets struct {
	w *hosted
	b *coll.Buckets
}

// Buckets returns a bucketing of AllReduces in buckets of about bytes bytes (25 MiB is
// DDP's default).
func (c *Context) Buckets(ctx context.Context, bytes int) (*Buckets, error) {
	if c.w == nil {
		return nil, ErrNotInGang
	}
	m, err := c.w.ringFor(ctx, false)
	if err != nil {
		return nil, err
	}
	return &Buckets{w: c.w, b: m.Buckets(bytes)}, nil
}

// Add puts data in the open bucket (starting its AllReduce when full) and returns the
// bucket's Pending: once done, data holds the sum.
func (b *Buckets) Add(ctx context.Context, data []float32) *Pending {
	return &Pending{w: b.w, h: b.b.Add(ctx, data)}
}

// Flush starts the open bucket's AllReduce, full or not (at the end of a backward pass).
func (b *Buckets) Flush(ctx context.Context) { b.b.Flush(ctx) }
