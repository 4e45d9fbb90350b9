package transfer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/atoll-run/atoll/store/object"
)

// PullOptions are the optional parts of a pull.
type PullOptions struct {
	// Owner owns the new local copy (one reference). Default "transfer".
	Owner string
	// OnCreated is called once the local object exists (still being written); a
	// broadcast uses it to start the next receiver, which reads from this one.
	OnCreated func()
}

type span struct{ off, n int64 }

// source is one location being pulled from.
type source struct {
	cl     *Client
	addr   string
	conns  []*Conn
	remote Remote
	opened bool // remote.Key is registered on the server
}

// close ends the pull's registration on the server and gives the connections
// back to the pool (which keeps the healthy ones).
func (s *source) close() {
	for i, c := range s.conns {
		if i == 0 && s.opened && !c.Closed() {
			if err := c.CloseRegion(s.remote.Key); err != nil {
				c.Close() // the registration ends with the connection
			}
		}
		s.cl.pool.put(c)
	}
	s.conns = nil
}

// Pull copies object id into st from the first of locations (transfer addresses)
// that has it, chunk by chunk with Streams×Depth reads in flight, writing each
// chunk straight into the new object's shared memory and checking its fingerprint
// on arrival (a bad chunk is fetched again). If a source dies mid-pull the
// remaining chunks come from the next location; when none is left it returns
// ErrObjectLost. Locations equal to st.Location() are skipped.
//
// A pull of an id st already holds returns nil at once (no reference is added).
// Pulls of the same id into the same store are single-flight: while one is in
// progress (from this client, another client, or a broadcast relay), later callers
// wait for it instead of copying the object again; when it seals they return nil
// with one reference of their own for opt.Owner, and when it fails one of them
// pulls in its place. Every wait ends with ctx. On success opt.Owner holds one
// reference to the new copy (unless st already held it on entry).
func (cl *Client) Pull(ctx context.Context, st *object.Store, id object.ID, locations []string, opt PullOptions) error {
	_, err := cl.pull(ctx, st, id, locations, opt, false)
	return err
}

// flightKey names one pull in progress: an object into a store.
type flightKey struct {
	st *object.Store
	id object.ID
}

// flight is a pull in progress; done closes when it has finished, with err set.
type flight struct {
	done chan struct{}
	err  error
}

// pull is Pull. With refIfHeld, an object st already holds gets a reference for
// opt.Owner too, so that on success the owner always holds one; ref reports
// whether a reference was added.
func (cl *Client) pull(ctx context.Context, st *object.Store, id object.ID, locations []string, opt PullOptions, refIfHeld bool) (ref bool, err error) {
	if opt.Owner == "" {
		opt.Owner = "transfer"
	}
	if !refIfHeld && st.Contains(id) {
		return false, nil
	}
	var locs []string
	for _, l := range locations {
		if l != "" && l != st.Location() {
			locs = append(locs, l)
		}
	}
	k := flightKey{st, id}
	var last error
	for round := 0; round < maxPullRounds; round++ {
		if err := ctx.Err(); err != nil {
			return false, fmt.Errorf("transfer: pull %s: %w", id.Short(), err)
		}
		cl.fmu.Lock()
		if f, ok := cl.flights[k]; ok {
			cl.fmu.Unlock()
			cl.m.PullWaits.Inc()
			if cl.waitHook != nil {
				cl.waitHook()
			}
			select {
			case <-f.done:
			case <-ctx.Done():
				return false, fmt.Errorf("transfer: pull %s: waiting for a pull in progress: %w", id.Short(), ctx.Err())
			}
			last = f.err
			continue // sealed: Await below takes the reference; failed: try ourselves
		}
		f := &flight{done: make(chan struct{})}
		cl.flights[k] = f
		cl.fmu.Unlock()
		ref, err := cl.awaitOrPull(ctx, st, id, locs, opt)
		cl.fmu.Lock()
		f.err = err
		delete(cl.flights, k)
		close(f.done)
		cl.fmu.Unlock()
		if errors.Is(err, object.ErrExists) {
			// ErrPending too: another client (or relay) is writing it into st,
			// or it is being freed; Await waits for either. Plain ErrExists:
			// sealed by another client since we looked; Await takes a reference.
			if errors.Is(err, object.ErrPending) {
				cl.m.PullWaits.Inc()
			}
			last = err
			continue
		}
		return ref, err
	}
	return false, fmt.Errorf("transfer: pull %s: gave up after %d rounds of waiting for other writers of it: %w", id.Short(), maxPullRounds, last)
}

// maxPullRounds bounds how many times one pull waits for another writer of the
// same object into the same store (a pull in progress, a pull that failed and
// was retried by someone else, an aborted copy) before it gives up with the last
// error it saw. Each round ends with another writer finishing or failing.
const maxPullRounds = 64

// awaitOrPull takes a reference to id if st holds it sealed, waits for it if
// someone else is writing it into st, and else pulls it.
func (cl *Client) awaitOrPull(ctx context.Context, st *object.Store, id object.ID, locs []string, opt PullOptions) (ref bool, err error) {
	if err := st.Await(ctx, id, opt.Owner); err == nil {
		return true, nil
	} else if !errors.Is(err, object.ErrNotFound) {
		return false, fmt.Errorf("transfer: pull %s: %w", id.Short(), err)
	}
	if err := cl.pullOnce(ctx, st, id, locs, opt); err != nil {
		return false, err
	}
	return true, nil
}

// pullOnce copies the object from the first usable location.
func (cl *Client) pullOnce(ctx context.Context, st *object.Store, id object.ID, locs []string, opt PullOptions) error {
	p := &puller{cl: cl, id: id, locs: locs, sizer: NewChunkSizer(cl.cfg.Chunk), changed: make(chan struct{})}
	src, err := p.openNext(ctx)
	if err != nil {
		return err
	}
	p.src = src
	p.size = src.remote.Size
	w, err := st.Create(ctx, opt.Owner, id, src.remote.Size, src.remote.Fingerprint)
	if err != nil {
		src.close()
		return fmt.Errorf("transfer: pull %s: %w", id.Short(), err)
	}
	if opt.OnCreated != nil {
		opt.OnCreated()
	}
	p.dst = w.Bytes()
	p.w = w
	err = p.run(ctx)
	p.mu.Lock()
	for _, s := range p.retired {
		s.close()
	}
	if p.src != nil {
		p.src.close()
	}
	p.mu.Unlock()
	if err != nil {
		w.Abort()
		return err
	}
	// Every chunk was checked against the fingerprint its server computed from
	// sealed bytes (or bytes a relay had itself verified), so no second pass.
	if err := w.Seal(ctx, false); err != nil {
		return fmt.Errorf("transfer: pull %s: %w", id.Short(), err)
	}
	cl.m.Pulls.Inc()
	return nil
}

type puller struct {
	cl    *Client
	id    object.ID
	locs  []string
	next  int // index into locs of the next location to try
	size  int64
	dst   []byte
	w     *object.Writer
	sizer *ChunkSizer

	mu       sync.Mutex
	src      *source
	retired  []*source
	cursor   int64
	retry    []span
	refetch  map[int64]int
	inflight int
	doneB    int64
	err      error
	changed  chan struct{}
	cancel   context.CancelFunc
}

// openNext dials the next location that has the object.
func (p *puller) openNext(ctx context.Context) (*source, error) {
	var errs []error
	for p.next < len(p.locs) {
		addr := p.locs[p.next]
		p.next++
		s, err := p.open(ctx, addr)
		if err == nil {
			return s, nil
		}
		p.cl.m.err(reasonSourceFailed)
		p.cl.log.Info("source unusable", zap.String("addr", addr), zap.Stringer("id", p.id), zap.Error(err))
		errs = append(errs, err)
	}
	p.cl.m.err(reasonLost)
	return nil, fmt.Errorf("transfer: pull %s: no location of %d could supply it: %w (%w)", p.id.Short(), len(p.locs), ErrObjectLost, errors.Join(errs...))
}

func (p *puller) open(ctx context.Context, addr string) (*source, error) {
	s := &source{cl: p.cl, addr: addr}
	var fresh []bool
	for range p.cl.cfg.Streams {
		c, f, err := p.cl.conn(ctx, addr)
		if err != nil {
			s.close()
			return nil, err
		}
		s.conns = append(s.conns, c)
		fresh = append(fresh, f)
	}
	r, err := p.openOn(ctx, s.conns[0])
	if err != nil && !fresh[0] && !answered(err) && ctx.Err() == nil {
		// The pooled connection had died without notice: try once more on a
		// new one before calling the source dead.
		p.cl.log.Debug("pooled connection dead, dialing a new one", zap.String("addr", addr), zap.Error(err))
		s.conns[0].Close()
		c, derr := p.cl.Dial(ctx, addr)
		if derr != nil {
			s.close()
			return nil, fmt.Errorf("%w (and a new connection: %w)", err, derr)
		}
		s.conns[0] = c
		r, err = p.openOn(ctx, c)
	}
	if err != nil {
		s.close()
		return nil, err
	}
	s.remote, s.opened = r, true
	if p.size != 0 && (r.Size != p.size || (p.src != nil && r.Fingerprint != p.src.remote.Fingerprint)) {
		s.close()
		return nil, fmt.Errorf("transfer: %s has a different object under %s (size %d)", addr, p.id.Short(), r.Size)
	}
	return s, nil
}

// openOn asks the server at the other end of c to open the object, bounded by
// DialTimeout, and feeds the round trip to the chunk sizer.
func (p *puller) openOn(ctx context.Context, c *Conn) (Remote, error) {
	octx, cancel := context.WithTimeout(ctx, p.cl.cfg.DialTimeout)
	defer cancel()
	start := time.Now()
	r, err := c.Open(octx, p.id)
	if err == nil {
		p.mu.Lock()
		p.sizer.ObserveRTT(time.Since(start))
		p.mu.Unlock()
	}
	return r, err
}

func (p *puller) notifyLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// take returns the next span to fetch and the source to fetch it from; ok is
// false when the pull is over (finished or failed).
func (p *puller) take(ctx context.Context) (span, *source, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		if p.err != nil || p.doneB == p.size {
			return span{}, nil, false
		}
		if p.src == nil { // another worker is opening the next location
			goto wait
		}
		if n := len(p.retry); n > 0 {
			sp := p.retry[n-1]
			p.retry = p.retry[:n-1]
			p.inflight++
			return sp, p.src, true
		}
		if p.cursor < p.size {
			n := min(p.sizer.Next(), p.size-p.cursor)
			sp := span{p.cursor, n}
			p.cursor += n
			p.inflight++
			return sp, p.src, true
		}
	wait:
		ch := p.changed // others hold the last spans (or a source is opening); wait
		p.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
		}
		p.mu.Lock()
		if ctx.Err() != nil && p.err == nil {
			p.err = fmt.Errorf("transfer: pull %s: %w", p.id.Short(), ctx.Err())
			p.notifyLocked()
		}
	}
}

func (p *puller) run(ctx context.Context) error {
	if p.size == 0 {
		return nil
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	p.cancel = cancel
	workers := p.cl.cfg.Streams * p.cl.cfg.Depth
	var wg sync.WaitGroup
	for i := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.work(ctx, i)
		}()
	}
	wg.Wait()
	return p.err
}

func (p *puller) work(ctx context.Context, i int) {
	for {
		sp, src, ok := p.take(ctx)
		if !ok {
			return
		}
		conn := src.conns[i%len(src.conns)]
		start := time.Now()
		cctx, cancel := context.WithTimeout(ctx, p.cl.cfg.ChunkTimeout)
		err := conn.ReadRange(cctx, src.remote.Key, sp.off, p.dst[sp.off:sp.off+sp.n])
		cancel()
		lat := time.Since(start)
		p.mu.Lock()
		p.inflight--
		switch {
		case err == nil:
			p.sizer.Observe(sp.n, lat, p.inflight+1)
			p.doneB += sp.n
			p.cl.m.ChunksPulled.Inc()
			p.cl.m.BytesPulled.Add(float64(sp.n))
			p.mu.Unlock()
			p.w.MarkDone(sp.off, sp.n)
			p.mu.Lock()
		case errors.Is(err, ErrCorruptChunk):
			p.cl.m.err(reasonCorrupt)
			p.cl.m.ChunkRefetch.Inc()
			if p.refetch == nil {
				p.refetch = map[int64]int{}
			}
			p.refetch[sp.off]++
			if p.refetch[sp.off] > p.cl.cfg.MaxRefetch {
				p.setErrLocked(fmt.Errorf("transfer: pull %s: chunk at %d corrupt %d times: %w", p.id.Short(), sp.off, p.refetch[sp.off], err))
			} else {
				p.cl.log.Info("corrupt chunk, fetching again", zap.Stringer("id", p.id), zap.Int64("off", sp.off), zap.Error(err))
				p.retry = append(p.retry, sp)
			}
		case ctx.Err() != nil:
			p.setErrLocked(fmt.Errorf("transfer: pull %s: %w", p.id.Short(), ctx.Err()))
		default:
			// The connection's reader may still be writing this span (a timed-out
			// read): it must stop before anyone fetches the span again.
			p.mu.Unlock()
			conn.Close()
			p.mu.Lock()
			p.retry = append(p.retry, sp)
			if p.src == src { // first to notice: move to the next location
				p.cl.m.err(reasonSourceFailed)
				p.cl.log.Info("source failed mid-pull", zap.String("addr", src.addr), zap.Stringer("id", p.id), zap.Error(err))
				p.retired = append(p.retired, src)
				p.src = nil
				p.mu.Unlock()
				for _, c := range src.conns {
					c.Close()
				}
				ns, nerr := p.openNext(ctx)
				p.mu.Lock()
				if nerr != nil {
					p.setErrLocked(fmt.Errorf("%w (after %s failed: %v)", nerr, src.addr, err))
				} else {
					p.src = ns
				}
			}
		}
		p.notifyLocked()
		p.mu.Unlock()
	}
}

func (p *puller) setErrLocked(err error) {
	if p.err == nil {
		p.err = err
		if p.cancel != nil {
			p.cancel() // stop the reads in flight
		}
	}
}
