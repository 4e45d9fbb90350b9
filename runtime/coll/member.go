package coll

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/atoll-run/atoll/internal/codec"
	"github.com/atoll-run/atoll/proto/collpb"
	"github.com/atoll-run/atoll/store/transfer"
)

// Member is one rank's handle on its gang generation's ring.
type Member struct{ m *member }

// Rank is the member's rank; Size the ring's.
func (m *Member) Rank() int { return m.m.key.rank }

// Size is the number of members.
func (m *Member) Size() int {
	m.m.mu.Lock()
	defer m.m.mu.Unlock()
	return len(m.m.peers)
}

// Stall is how long a rank waits for its neighbour's chunk before it reports which rank
// it waits for (the collective goes on waiting until its context ends).
const Stall = 10 * time.Second

type stepKey struct {
	seq      int64
	op, step int
}

// incoming is a chunk for this member: in memory (local, from a member of this process)
// or on another process's transfer server (remote).
type incoming struct {
	op, step int
	seq      int64
	total    int64
	lo, n    int64
	local    []float32
	done     func() // the local sender's release
	remote   *collpb.Chunk
}

type member struct {
	plane *Plane
	key   memberKey

	inbox  chan incoming
	closed chan struct{}
	once   sync.Once

	mu    sync.Mutex
	peers []Peer
	hier  *hier // nil: the flat ring only
	q     queue // asynchronous collectives
	seq   int64
	busy  map[int]chan struct{} // chunk index -> closed when its last send was read
	acks  map[transfer.Key]func()
	early map[stepKey]incoming // chunks of later steps, taken from the inbox before their turn
	spare []float32            // the receive buffer of sums, kept between collectives (borrowScratch)
}

// borrowScratch hands the member's receive buffer to one collective, which gives it back
// with returnScratch. It is kept between collectives: a fresh buffer each time cost the
// first touch of its pages (page faults inside the read from the socket), as much CPU as the
// read's own copy.
func (m *member) borrowScratch() []float32 {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.spare
	m.spare = nil
	return s
}

func (m *member) returnScratch(s []float32) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if cap(s) > cap(m.spare) {
		m.spare = s
	}
}

func (m *member) deliver(in incoming) {
	select {
	case m.inbox <- in:
	case <-m.closed:
		if in.done != nil {
			in.done()
		}
	}
}

func (m *member) abortLocked() {
	m.once.Do(func() { close(m.closed) })
}

// abort ends the member: its collectives fail, its exposed chunks are released.
func (m *member) abort() {
	m.mu.Lock()
	m.abortLocked()
	acks := m.acks
	m.acks = map[transfer.Key]func(){}
	h := m.hier
	m.mu.Unlock()
	for _, f := range acks {
		f()
	}
	if h != nil {
		// Once its collective (woken by the abort) has returned.
		go h.close()
	}
}

func (m *member) acked(k transfer.Key) {
	m.mu.Lock()
	f := m.acks[k]
	delete(m.acks, k)
	m.mu.Unlock()
	if f != nil {
		f()
	}
}

func bounds(length, n, k int) (int, int) { return k * length / n, (k + 1) * length / n }

// Algorithm choice. A vector of at most SmallVector bytes is reduced by recursive
// doubling (log2 n exchanges of the whole vector: latency-bound sizes), a larger one by
// the bandwidth-optimal ring (2(n-1) steps of 1/n of it). Chunks of at most InlineChunk
// bytes between processes travel inside their message; larger ones are read from the
// sender's region.
const (
	SmallVector = 64 << 10
	InlineChunk = 256 << 10
)

// Chunk indexes for the busy map: ring chunks use their index, whole-vector exchanges this.
const wholeVector = -1

// AllReduce sums data element-wise across every member, in place; every member must call
// it with a vector of the same length. Members placed several to a machine (each in its
// own process) reduce through the machine's shared memory and one leader per machine runs
// the ring between machines (see Hierarchical); otherwise small vectors use recursive
// doubling and larger ones the ring (see SmallVector). It fails with ErrAborted when the
// generation ends, and with ctx's error (naming the rank it waits for) when ctx ends.
func (mm *Member) AllReduce(ctx context.Context, data []float32) error {
	if err := mm.m.q.quiesce(ctx); err != nil {
		return err
	}
	return mm.allReduce(ctx, data)
}

func (mm *Member) allReduce(ctx context.Context, data []float32) error {
	m := mm.m
	if h := m.hierForSum(4 * len(data)); h != nil {
		return m.wrap("allreduce", h.allReduce(ctx, m, data))
	}
	return m.allReduce(ctx, data)
}

// allReduce is the flat AllReduce among the member's peers.
func (m *member) allReduce(ctx context.Context, data []float32) error {
	n, seq := m.next()
	if n <= 1 {
		return nil
	}
	var err error
	if 4*len(data) <= SmallVector {
		err = m.recursiveDoubling(ctx, seq, n, data)
	} else {
		if err = m.ring(ctx, seq, n, data, evenBounds(len(data), n), opReduce, opGather); err != nil {
			err = fmt.Errorf("allreduce %w", err)
		}
	}
	if err != nil {
		return err
	}
	return m.drain(ctx, n, "allreduce")
}

// drain waits until our last sends (chunks -1 to n-1) were read: only then may the
// caller change data again.
func (m *member) drain(ctx context.Context, n int, what string) error {
	for k := wholeVector; k < n; k++ {
		if err := m.waitFree(ctx, k); err != nil {
			return fmt.Errorf("%s rank %d: %w", what, m.key.rank, err)
		}
	}
	return nil
}

// Step keys' op codes: each collective's phases have their own, so ranks that call
// different collectives wait (and name who they wait for) instead of mixing chunks.
const (
	opReduce  = 0  // AllReduce's reduce-scatter phase
	opGather  = 1  // AllReduce's all-gather phase
	opRS      = 10 // ReduceScatter
	opAG      = 11 // AllGather
	opScatter = 12 // Broadcast: the root's scatter
	opBcastAG = 13 // Broadcast: the all-gather after it
	opNone    = -1
)

// evenBounds splits a vector of length floats into n chunks of (nearly) equal length.
func evenBounds(length, n int) func(int) (int, int) {
	return func(k int) (int, int) { return bounds(length, n, k) }
}

// ring runs a reduce-scatter phase (reduceOp, opNone to skip) then an all-gather phase
// (gatherOp) around the ring; chunk k of data is bnd(k). After the reduce-scatter, rank r
// holds the sum of chunk r; the all-gather starts from each rank holding its chunk r.
func (m *member) ring(ctx context.Context, seq int64, n int, data []float32, bnd func(int) (int, int), reduceOp, gatherOp int) error {
	rank := m.key.rank
	mod := func(x int) int { return ((x % n) + n) % n }
	right, left := mod(rank+1), mod(rank-1)
	scratch := m.borrowScratch()
	defer func() { m.returnScratch(scratch) }()
	for phase, op := range []int{reduceOp, gatherOp} {
		if op == opNone {
			continue
		}
		for s := 0; s < n-1; s++ {
			// The textbook schedule, shifted by one chunk so that rank r ends the
			// reduce-scatter with chunk r (and starts the all-gather from it).
			sendIdx, recvIdx := mod(rank-s-1), mod(rank-s-2)
			if phase == 1 {
				sendIdx, recvIdx = mod(rank-s), mod(rank-s-1)
			}
			k := stepKey{seq, op, s}
			lo, hi := bnd(sendIdx)
			if err := m.send(ctx, right, k, data, lo, hi, sendIdx); err != nil {
				return fmt.Errorf("rank %d step %d/%d: send to rank %d: %w", rank, op, s, right, err)
			}
			rlo, rhi := bnd(recvIdx)
			if err := m.take(ctx, left, k, data, rlo, rhi, recvIdx, phase == 0, &scratch); err != nil {
				return fmt.Errorf("rank %d step %d/%d: %w", rank, op, s, err)
			}
		}
	}
	return nil
}

// recursiveDoubling exchanges the whole vector with partner rank^2^k for k = 0..log2(p)-1
// (p the largest power of two <= n); the ranks beyond p first fold their vectors into rank
// r-p and get the result back at the end.
func (m *member) recursiveDoubling(ctx context.Context, seq int64, n int, data []float32) error {
	rank := m.key.rank
	p := 1
	for p*2 <= n {
		p *= 2
	}
	scratch := m.borrowScratch()
	defer func() { m.returnScratch(scratch) }()
	whole := len(data)
	if rank >= p { // fold in, then wait for the result
		if err := m.send(ctx, rank-p, stepKey{seq, 3, 0}, data, 0, whole, wholeVector); err != nil {
			return fmt.Errorf("allreduce rank %d: fold into rank %d: %w", rank, rank-p, err)
		}
		if err := m.take(ctx, rank-p, stepKey{seq, 4, 0}, data, 0, whole, wholeVector, false, &scratch); err != nil {
			return fmt.Errorf("allreduce rank %d: result from rank %d: %w", rank, rank-p, err)
		}
		return nil
	}
	if rank+p < n {
		if err := m.take(ctx, rank+p, stepKey{seq, 3, 0}, data, 0, whole, wholeVector, true, &scratch); err != nil {
			return fmt.Errorf("allreduce rank %d: fold from rank %d: %w", rank, rank+p, err)
		}
	}
	for k, bit := 0, 1; bit < p; k, bit = k+1, bit*2 {
		partner := rank ^ bit
		key := stepKey{seq, 2, k}
		if err := m.send(ctx, partner, key, data, 0, whole, wholeVector); err != nil {
			return fmt.Errorf("allreduce rank %d exchange %d: send to rank %d: %w", rank, k, partner, err)
		}
		if err := m.take(ctx, partner, key, data, 0, whole, wholeVector, true, &scratch); err != nil {
			return fmt.Errorf("allreduce rank %d exchange %d: %w", rank, k, err)
		}
	}
	if rank+p < n {
		if err := m.send(ctx, rank+p, stepKey{seq, 4, 0}, data, 0, whole, wholeVector); err != nil {
			return fmt.Errorf("allreduce rank %d: result to rank %d: %w", rank, rank+p, err)
		}
	}
	return nil
}

// take receives the chunk of step k from rank from and adds it into (or copies it over)
// data[lo:hi].
func (m *member) take(ctx context.Context, from int, k stepKey, data []float32, lo, hi, idx int, add bool, scratch *[]float32) error {
	in, err := m.receive(ctx, from, k)
	if err != nil {
		return err
	}
	if in.total != int64(len(data)) || in.lo != int64(lo) || in.n != int64(hi-lo) {
		m.drop(in)
		return fmt.Errorf("%w: rank %d got chunk [%d,+%d) of a vector of %d from rank %d, expected [%d,+%d) of %d (ranks called collectives out of order or with different lengths)",
			ErrMismatch, m.key.rank, in.lo, in.n, in.total, from, lo, hi-lo, len(data))
	}
	// The chunk we write into may still be exposed to a neighbour.
	if err := m.waitFree(ctx, idx); err != nil {
		m.release(in)
		return err
	}
	dst := data[lo:hi]
	src := in.local
	switch {
	case in.remote != nil && (in.remote.Data != nil || len(dst) == 0): // inline (an empty chunk decodes as nil)
		if len(in.remote.Data) != 4*len(dst) {
			return fmt.Errorf("%w: inline chunk of %d bytes, want %d", ErrMismatch, len(in.remote.Data), 4*len(dst))
		}
		src = viewF32(in.remote.Data)
	case in.remote != nil:
		if !add {
			if err := m.read(ctx, in.remote, dst); err != nil {
				return fmt.Errorf("read rank %d's chunk: %w", from, err)
			}
			return nil
		}
		if cap(*scratch) < len(dst) {
			*scratch = make([]float32, len(dst))
		}
		src = (*scratch)[:len(dst)]
		if err := m.read(ctx, in.remote, src); err != nil {
			return fmt.Errorf("read rank %d's chunk: %w", from, err)
		}
	}
	if add {
		for i, v := range src {
			dst[i] += v
		}
	} else {
		copy(dst, src)
	}
	m.release(in)
	return nil
}

// send exposes data[lo:hi] to rank to: in memory for a member of this process, inside the
// message for a small chunk, as a region of this process's transfer server otherwise.
func (m *member) send(ctx context.Context, to int, k stepKey, data []float32, lo, hi, idx int) error {
	m.mu.Lock()
	peer := m.peers[to]
	m.mu.Unlock()
	p := m.plane
	msg := &collpb.Chunk{Job: m.key.job, Gang: m.key.gang, Generation: m.key.gen, ToRank: int32(to), FromRank: int32(m.key.rank),
		Op: int32(k.op), Step: int32(k.step), Seq: k.seq, Total: int64(len(data)), Lo: int64(lo), N: int64(hi - lo), ReplyTo: p.sys.Address()}
	if !p.local(peer.Address) && 4*(hi-lo) <= InlineChunk {
		msg.Data = codec.F32Bytes(data[lo:hi]) // a copy: the sender may change data at once
		p.sendTo(peer.Address, msg)
		return nil
	}
	if p.local(peer.Address) && idx == wholeVector {
		// Both partners of an exchange change their vectors right after: hand over a copy
		// (small vectors only take this path), or each would wait for the other.
		in := incoming{op: k.op, step: k.step, seq: k.seq, total: int64(len(data)), lo: int64(lo), n: int64(hi - lo), local: append([]float32(nil), data[lo:hi]...)}
		p.member(memberKey{m.key.job, m.key.gang, m.key.gen, to}).deliver(in)
		return nil
	}
	// A chunk is exposed once at a time: its last send must have been read.
	if err := m.waitFree(ctx, idx); err != nil {
		return err
	}
	free := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(free) }) }
	m.mu.Lock()
	m.busy[idx] = free
	m.mu.Unlock()
	if p.local(peer.Address) {
		in := incoming{op: k.op, step: k.step, seq: k.seq, total: int64(len(data)), lo: int64(lo), n: int64(hi - lo), local: data[lo:hi], done: release}
		p.member(memberKey{m.key.job, m.key.gang, m.key.gen, to}).deliver(in)
		return nil
	}
	tr, err := p.transport()
	if err != nil {
		release()
		return err
	}
	key := tr.Register(chunkRegion{b: f32bytes(data[lo:hi])})
	addr := tr.Addr()
	m.mu.Lock()
	m.acks[key] = func() { tr.Deregister(key); release() }
	aborted := isClosed(m.closed)
	m.mu.Unlock()
	if aborted {
		m.acked(key)
		return ErrAborted
	}
	msg.Addr, msg.Key = addr, key[:]
	p.sendTo(peer.Address, msg)
	return nil
}

func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// receive waits for the left neighbour's chunk of a step.
func viewF32(b []byte) []float32 { return codec.ViewF32(b) }

func (m *member) receive(ctx context.Context, left int, want stepKey) (incoming, error) {
	m.mu.Lock()
	if in, ok := m.early[want]; ok {
		delete(m.early, want)
		m.mu.Unlock()
		return in, nil
	}
	m.mu.Unlock()
	stall := time.NewTimer(Stall)
	defer stall.Stop()
	for {
		select {
		case in := <-m.inbox:
			k := stepKey{in.seq, in.op, in.step}
			if k == want {
				return in, nil
			}
			if in.seq < want.seq {
				m.drop(in) // a chunk of a collective this member gave up on
				continue
			}
			m.mu.Lock()
			m.early[k] = in
			m.mu.Unlock()
		case <-m.closed:
			return incoming{}, ErrAborted
		case <-stall.C:
			m.plane.log.Warn("a collective waits for its neighbour")
			_ = left
		case <-ctx.Done():
			return incoming{}, fmt.Errorf("waiting for rank %d's chunk of step %d/%d of collective %d: rank %d never sent it: %w", left, want.op, want.step, want.seq, left, ctx.Err())
		}
	}
}

// readPiece is the size of one pipelined read of a remote chunk: several are in flight on
// one connection, so the sender's server writes the next while this side checks the last.
const readPiece = 1 << 20

// readDepth is how many pieces of one chunk are read at once.
const readDepth = 4

// read reads a remote chunk into dst, in pipelined, checksummed pieces.
func (m *member) read(ctx context.Context, c *collpb.Chunk, dst []float32) error {
	defer m.ackRemote(c)
	conn, err := m.plane.conn(ctx, c.Addr)
	if err != nil {
		return err
	}
	var k transfer.Key
	copy(k[:], c.Key)
	b := f32bytes(dst)
	if len(b) <= readPiece {
		return conn.Read(ctx, k, 0, b)
	}
	sem := make(chan struct{}, readDepth)
	errs := make(chan error, (len(b)+readPiece-1)/readPiece)
	var wg sync.WaitGroup
	for off := 0; off < len(b); off += readPiece {
		end := min(off+readPiece, len(b))
		sem <- struct{}{}
		wg.Add(1)
		go func(off, end int) {
			defer wg.Done()
			defer func() { <-sem }()
			if err := conn.Read(ctx, k, int64(off), b[off:end]); err != nil {
				errs <- err
			}
		}(off, end)
	}
	wg.Wait()
	close(errs)
	return <-errs
}

func (m *member) ackRemote(c *collpb.Chunk) {
	m.plane.sendTo(c.ReplyTo, &collpb.Ack{Job: c.Job, Gang: c.Gang, Generation: c.Generation, Rank: c.FromRank, Key: c.Key})
}

// release lets the sender of a chunk write it again (local chunks; remote ones are
// acknowledged when read).
func (m *member) release(in incoming) {
	if in.done != nil {
		in.done()
	}
}

// drop gives up a chunk unread: a local sender may write it again, a remote one is told it
// was read (or it would keep the chunk exposed, and its next send of that chunk would wait
// for a read that never comes).
func (m *member) drop(in incoming) {
	m.release(in)
	if in.remote != nil && in.remote.Data == nil && len(in.remote.Key) > 0 {
		m.ackRemote(in.remote)
	}
}

// waitFree waits until the last send of a chunk index was read.
func (m *member) waitFree(ctx context.Context, idx int) error {
	m.mu.Lock()
	ch := m.busy[idx]
	m.mu.Unlock()
	if ch == nil {
		return nil
	}
	select {
	case <-ch:
		m.mu.Lock()
		if m.busy[idx] == ch {
			delete(m.busy, idx)
		}
		m.mu.Unlock()
		return nil
	case <-m.closed:
		return ErrAborted
	case <-ctx.Done():
		return fmt.Errorf("waiting for the right neighbour to read chunk %d: %w", idx, ctx.Err())
	}
}
