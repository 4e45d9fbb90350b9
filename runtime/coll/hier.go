package coll

import (
	"context"
	"fmt"
	"os"
	"sync"

	"github.com/atoll-run/atoll/topology"
)

// leaderGang names the communicator of a gang generation's machine leaders: one member
// per machine (its lowest rank), ranked by machine.
const leaderGang = "\x00machines"

// railGang names the communicator of the members of local index i of every machine (a
// rail, as NCCL calls it), when every machine has as many members.
func railGang(i int) string { return fmt.Sprintf("\x00rail%d", i) }

// placement is where a communicator's members run: the ranks on each machine.
type placement struct {
	machines  [][]int // ranks of each machine; machines in the order of their lowest rank
	machineOf []int   // machine index of each rank
	pos       []int   // each rank's place in machine order (all of machine 0's ranks, then machine 1's...)
}

// placementOf groups peers by machine. ok is false when the placement does not allow
// sharing memory: a machine unknown, or two members of a machine in one process (they
// already hand chunks over in memory).
func placementOf(peers []Peer) (pl placement, ok bool) {
	idx := map[string]int{}
	procs := map[string]bool{}
	pl.machineOf = make([]int, len(peers))
	for r, p := range peers {
		if p.Machine == "" || procs[p.Address] {
			return placement{}, false
		}
		procs[p.Address] = true
		g, seen := idx[p.Machine]
		if !seen {
			g = len(pl.machines)
			idx[p.Machine] = g
			pl.machines = append(pl.machines, nil)
		}
		pl.machines[g] = append(pl.machines[g], r)
		pl.machineOf[r] = g
	}
	pl.pos = make([]int, len(peers))
	i := 0
	for _, rs := range pl.machines {
		for _, r := range rs {
			pl.pos[r] = i
			i++
		}
	}
	return pl, true
}

// perMachine is the number of members on each machine.
func (pl placement) perMachine() []int {
	out := make([]int, len(pl.machines))
	for g, rs := range pl.machines {
		out[g] = len(rs)
	}
	return out
}

// Links are the costs the choice between the flat ring and the hierarchy is made with
// (topology.DefaultHostLinks: a machine's memory copies against a TLS link's bytes).
var Links = topology.DefaultHostLinks()

// hier is a member's side of the hierarchical collectives: the machine's members meet in
// a shared-memory segment; the machine's leader (local index 0) runs the collective
// between machines with the other machines' leaders.
type hier struct {
	pl          placement
	mach, local int
	name        string
	leader      *member // this machine's leader communicator (nil unless local == 0 and there are several machines)
	rail        *member // this member's rail (nil unless there are several machines of as many members)

	mu  sync.Mutex // held for a whole collective: one at a time per member
	seg *segment
	end bool
}

// newHier returns the hierarchy of rank in a placement, nil when the flat ring is all
// there is to it (every machine has one member).
func (p *Plane) newHier(k memberKey, peers []Peer) *hier {
	pl, ok := placementOf(peers)
	if !ok {
		return nil
	}
	shared := false
	for _, rs := range pl.machines {
		shared = shared || len(rs) > 1
	}
	if !shared {
		return nil
	}
	g := pl.machineOf[k.rank]
	h := &hier{pl: pl, mach: g, name: segmentName(k.job, k.gang, k.gen, peers[k.rank].Machine, peers)}
	for i, r := range pl.machines[g] {
		if r == k.rank {
			h.local = i
		}
	}
	if h.local == 0 && len(pl.machines) > 1 {
		leaders := make([]Peer, len(pl.machines))
		for i, rs := range pl.machines {
			leaders[i] = peers[rs[0]]
		}
		lm := p.member(memberKey{k.job, k.gang + leaderGang, k.gen, g})
		lm.mu.Lock()
		lm.peers = leaders
		lm.mu.Unlock()
		h.leader = lm
	}
	uniform := len(pl.machines) > 1
	for _, rs := range pl.machines {
		uniform = uniform && len(rs) == len(pl.machines[0])
	}
	if uniform {
		rail := make([]Peer, len(pl.machines))
		for i, rs := range pl.machines {
			rail[i] = peers[rs[h.local]]
		}
		rm := p.member(memberKey{k.job, k.gang + railGang(h.local), k.gen, g})
		rm.mu.Lock()
		rm.peers = rail
		rm.mu.Unlock()
		h.rail = rm
	}
	return h
}

// AlgoEnv names the environment variable that lets sums (AllReduce, ReduceScatter) take
// the hierarchy when the model prefers it: "auto" (or "hierarchical"). Unset or "ring",
// sums take the flat algorithms, whose order of additions depends on the ranks alone, so
// a program's floating-point results are the same bits whatever its placement: on the
// embedded default and on any machines, before a failure and after a restart placed
// elsewhere (examples/dataparallel's exact recovery). The hierarchy adds each machine's
// members first, an order that depends on which ranks share a machine (as NCCL's results
// depend on NCCL_ALGO and the topology). Collectives that only move data (AllGather,
// Broadcast, Barrier) are exact either way and always follow the model. A driver passes
// it to its workers with sdk.WithEnv(AlgoEnv + "=auto").
const AlgoEnv = "ATOLL_COLL_ALGO"

// sumsByPlacement reports whether sums may take the hierarchy (AlgoEnv).
func sumsByPlacement() bool {
	switch os.Getenv(AlgoEnv) {
	case "auto", "hierarchical":
		return true
	}
	return false
}

// hierForSum is hierFor for a sum: nil unless AlgoEnv allows a placement-dependent order.
func (m *member) hierForSum(bytes int) *hier {
	if !sumsByPlacement() {
		return nil
	}
	return m.hierFor(bytes)
}

// hierFor returns the member's hierarchy when the model prefers it for a collective of
// that many bytes (every member decides alike: same placement, same size).
func (m *member) hierFor(bytes int) *hier {
	m.mu.Lock()
	h := m.hier
	m.mu.Unlock()
	if h == nil {
		return nil
	}
	per := h.pl.perMachine()
	if topology.HostAllReduceTime(per, int64(bytes), topology.Hierarchical, Links) > topology.HostAllReduceTime(per, int64(bytes), topology.Ring, Links) {
		return nil
	}
	return h
}

func (m *member) wrap(what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s rank %d: %w", what, m.key.rank, err)
}

// close frees the segment once no collective uses it (called when the generation ends).
func (h *hier) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.end = true
	if h.seg != nil {
		h.seg.close()
		h.seg = nil
	}
}

// start opens the segment (first use) and sizes its data area; the caller holds h.mu.
func (h *hier) start(m *member, bytes int) (*segment, error) {
	if h.end || isClosed(m.closed) {
		return nil, ErrAborted
	}
	if h.seg == nil {
		seg, err := openSegment(h.name, h.local, len(h.pl.machines[h.mach]))
		if err != nil {
			return nil, err
		}
		h.seg = seg
	}
	if err := h.seg.grow(bytes); err != nil {
		return nil, err
	}
	return h.seg, nil
}

// arrive publishes this member's collective (op, length), waits for the machine's other
// members and checks they called the same.
func (h *hier) arrive(ctx context.Context, m *member, seg *segment, op, n int) error {
	seg.setCall(op, n)
	if err := seg.barrier(ctx, m.closed); err != nil {
		return err
	}
	for j := 0; j < seg.size; j++ {
		if jo, jn := seg.call(j); jo != op || jn != n {
			return fmt.Errorf("%w: a member on this machine called collective %d on %d floats, this one %d on %d", ErrMismatch, jo, jn, op, n)
		}
	}
	return nil
}

// leaderDo runs f on the machine leader's communicator (only the leader, only when there
// are several machines); a failure breaks the segment (the others wait at the next
// barrier until the generation ends or their ctx does).
func (h *hier) leaderDo(seg *segment, f func(l *member) error) error {
	if h.leader == nil {
		return nil
	}
	if err := f(h.leader); err != nil {
		seg.broken = true
		return fmt.Errorf("between machines: %w", err)
	}
	return nil
}

// railDo runs f on the member's rail; a failure breaks the segment, as leaderDo's.
func (h *hier) railDo(seg *segment, f func(l *member) error) error {
	if err := f(h.rail); err != nil {
		seg.broken = true
		return fmt.Errorf("between machines: %w", err)
	}
	return nil
}

// railBounds are the chunks of the member's rail in the packed area: chunk g is the
// shard of the member of this local index on machine g.
func (h *hier) railBounds(shard func(int) (int, int), at func(int) int) func(int) (int, int) {
	return func(g int) (int, int) {
		r := h.pl.machines[g][h.local]
		lo, hi := shard(r)
		return at(r), at(r) + hi - lo
	}
}

// addInto adds every src into dst, a cache-sized block at a time, three sources a pass.
func addInto(dst []float32, srcs ...[]float32) {
	const block = 4096
	for lo := 0; lo < len(dst); lo += block {
		hi := min(lo+block, len(dst))
		d := dst[lo:hi]
		rest := srcs
		for len(rest) >= 3 {
			a, b, c := rest[0][lo:hi], rest[1][lo:hi], rest[2][lo:hi]
			a, b, c = a[:len(d)], b[:len(d)], c[:len(d)]
			for i := range d {
				d[i] += a[i] + b[i] + c[i]
			}
			rest = rest[3:]
		}
		for _, s := range rest {
			s := s[lo:hi]
			s = s[:len(d)]
			for i := range d {
				d[i] += s[i]
			}
		}
	}
}

// allReduce: every member copies its vector into its slot; each reduces 1/L of the
// vector over the slots into slot 0; that 1/L is AllReduced between machines by the
// member's rail (machines of as many members), or slot 0 as a whole by the machine's
// leader with the other machines' leaders; every member copies slot 0 back.
func (h *hier) allReduce(ctx context.Context, m *member, data []float32) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := len(data)
	L := len(h.pl.machines[h.mach])
	seg, err := h.start(m, L*4*n)
	if err != nil {
		return err
	}
	slot := func(j int) []float32 { return seg.floats(j*4*n, n) }
	copy(slot(h.local), data)
	if err := h.arrive(ctx, m, seg, opReduce, n); err != nil {
		return err
	}
	lo, hi := bounds(n, L, h.local)
	srcs := make([][]float32, 0, L-1)
	for j := 1; j < L; j++ {
		srcs = append(srcs, slot(j)[lo:hi])
	}
	addInto(slot(0)[lo:hi], srcs...)
	if h.rail != nil {
		// Every member AllReduces its own 1/L with the members of its rank on the
		// other machines: L rings between machines at once, each on 1/L of the bytes,
		// and no barrier between the sum and the ring.
		if err := h.railDo(seg, func(l *member) error { return l.allReduce(ctx, slot(0)[lo:hi]) }); err != nil {
			return err
		}
	} else {
		if err := seg.barrier(ctx, m.closed); err != nil {
			return err
		}
		if err := h.leaderDo(seg, func(l *member) error { return l.allReduce(ctx, slot(0)) }); err != nil {
			return err
		}
	}
	if err := seg.barrier(ctx, m.closed); err != nil {
		return err
	}
	copy(data, slot(0))
	return seg.barrier(ctx, m.closed)
}

// blocks are the machines' parts of a vector laid out in machine order, where rank r's
// shard is shard(r): machine g's block holds its ranks' shards, one after the other.
func (h *hier) blocks(shard func(int) (int, int)) (start []int, at func(r int) int) {
	n := len(h.pl.pos)
	byPos := make([]int, n)
	for r, p := range h.pl.pos {
		byPos[p] = r
	}
	offs := make([]int, n+1) // offset of each position in the packed layout
	for p, r := range byPos {
		lo, hi := shard(r)
		offs[p+1] = offs[p] + hi - lo
	}
	start = make([]int, len(h.pl.machines)+1)
	p := 0
	for g, rs := range h.pl.machines {
		start[g] = offs[p]
		p += len(rs)
	}
	start[len(h.pl.machines)] = offs[n]
	return start, func(r int) int { return offs[h.pl.pos[r]] }
}

func blockBounds(start []int) func(int) (int, int) {
	return func(g int) (int, int) { return start[g], start[g+1] }
}

// allGather: every member copies its shard into the packed area (machine order), the
// leaders all-gather the machines' blocks, every member copies the others' shards out.
func (h *hier) allGather(ctx context.Context, m *member, data []float32, shard func(int) (int, int)) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := len(data)
	seg, err := h.start(m, 4*n)
	if err != nil {
		return err
	}
	packed := seg.floats(0, n)
	start, at := h.blocks(shard)
	lo, hi := shard(m.key.rank)
	copy(packed[at(m.key.rank):], data[lo:hi])
	if err := h.arrive(ctx, m, seg, opAG, n); err != nil {
		return err
	}
	copyOut := func(local bool) {
		for r := range h.pl.pos {
			if r != m.key.rank && (h.pl.machineOf[r] == h.mach) == local {
				lo, hi := shard(r)
				copy(data[lo:hi], packed[at(r):])
			}
		}
	}
	// This machine's shards are all in: copy them out while the other machines' travel
	// (the collective between machines writes only their places in the packed area).
	done := make(chan struct{})
	go func() { defer close(done); copyOut(true) }()
	if h.rail != nil {
		// Every member all-gathers its shard with its rail: its rail's shards land in
		// the packed area straight from the other machines.
		err = h.railDo(seg, func(l *member) error { return l.allGather(ctx, packed, h.railBounds(shard, at)) })
	} else {
		err = h.leaderDo(seg, func(l *member) error { return l.allGather(ctx, packed, blockBounds(start)) })
	}
	<-done
	if err != nil {
		return err
	}
	if err := seg.barrier(ctx, m.closed); err != nil {
		return err
	}
	copyOut(false)
	return seg.barrier(ctx, m.closed)
}

// reduceScatter: every member copies its vector into its slot; each reduces 1/L of the
// packed area (machine order) over the slots; the leaders reduce-scatter the machines'
// blocks; every member copies its shard out.
func (h *hier) reduceScatter(ctx context.Context, m *member, data []float32, shard func(int) (int, int)) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := len(data)
	L := len(h.pl.machines[h.mach])
	seg, err := h.start(m, (L+1)*4*n)
	if err != nil {
		return err
	}
	slot := func(j int) []float32 { return seg.floats(j*4*n, n) }
	packed := seg.floats(L*4*n, n)
	copy(slot(h.local), data)
	if err := h.arrive(ctx, m, seg, opRS, n); err != nil {
		return err
	}
	start, at := h.blocks(shard)
	if h.rail != nil {
		// Every member sums, over the slots, the shards of its rail (its own local index
		// on every machine), reduce-scatters them with its rail, and takes its own.
		srcs := make([][]float32, L-1)
		for _, rs := range h.pl.machines {
			r := rs[h.local]
			slo, shi := shard(r)
			p := at(r)
			copy(packed[p:p+shi-slo], slot(0)[slo:shi])
			for j := 1; j < L; j++ {
				srcs[j-1] = slot(j)[slo:shi]
			}
			addInto(packed[p:p+shi-slo], srcs...)
		}
		if err := h.railDo(seg, func(l *member) error { return l.reduceScatter(ctx, packed, h.railBounds(shard, at)) }); err != nil {
			return err
		}
		lo, hi := shard(m.key.rank)
		copy(data[lo:hi], packed[at(m.key.rank):])
		return seg.barrier(ctx, m.closed)
	}
	plo, phi := bounds(n, L, h.local)
	srcs := make([][]float32, L-1)
	for r := range h.pl.pos {
		slo, shi := shard(r)
		p := at(r)
		x0, x1 := max(plo, p), min(phi, p+shi-slo)
		if x0 >= x1 {
			continue
		}
		g0 := slo + x0 - p
		g1 := g0 + x1 - x0
		copy(packed[x0:x1], slot(0)[g0:g1])
		for j := 1; j < L; j++ {
			srcs[j-1] = slot(j)[g0:g1]
		}
		addInto(packed[x0:x1], srcs...)
	}
	if err := seg.barrier(ctx, m.closed); err != nil {
		return err
	}
	if err := h.leaderDo(seg, func(l *member) error { return l.reduceScatter(ctx, packed, blockBounds(start)) }); err != nil {
		return err
	}
	if err := seg.barrier(ctx, m.closed); err != nil {
		return err
	}
	lo, hi := shard(m.key.rank)
	copy(data[lo:hi], packed[at(m.key.rank):])
	return seg.barrier(ctx, m.closed)
}

// broadcast: the root copies its vector into the packed area, the leaders broadcast it
// from the root's machine (a pipelined chain), every other member copies it out.
func (h *hier) broadcast(ctx context.Context, m *member, root int, data []float32) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := len(data)
	seg, err := h.start(m, 4*n)
	if err != nil {
		return err
	}
	packed := seg.floats(0, n)
	if m.key.rank == root {
		copy(packed, data)
	}
	if err := h.arrive(ctx, m, seg, opScatter+root<<8, n); err != nil {
		return err
	}
	rootMachine := h.pl.machineOf[root]
	// On the root's machine the vector is all in: copy it out while it travels to the
	// other machines (which only read it here).
	done := make(chan struct{})
	go func() {
		defer close(done)
		if h.mach == rootMachine && m.key.rank != root {
			copy(data, packed)
		}
	}()
	if h.rail != nil {
		// Every member broadcasts its 1/L of the vector along its rail.
		lo, hi := bounds(n, len(h.pl.machines[h.mach]), h.local)
		err = h.railDo(seg, func(l *member) error { return l.broadcast(ctx, rootMachine, packed[lo:hi]) })
	} else {
		err = h.leaderDo(seg, func(l *member) error { return l.broadcast(ctx, rootMachine, packed) })
	}
	<-done
	if err != nil {
		return err
	}
	if err := seg.barrier(ctx, m.closed); err != nil {
		return err
	}
	if h.mach != rootMachine {
		copy(data, packed)
	}
	return seg.barrier(ctx, m.closed)
}

// barrier: the machine's members meet, the leaders meet, the machine's members meet.
func (h *hier) barrier(ctx context.Context, m *member) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	seg, err := h.start(m, 0)
	if err != nil {
		return err
	}
	if err := h.arrive(ctx, m, seg, opBarrier, 0); err != nil {
		return err
	}
	if err := h.leaderDo(seg, func(l *member) error { return l.allReduce(ctx, []float32{0}) }); err != nil {
		return err
	}
	return seg.barrier(ctx, m.closed)
}
