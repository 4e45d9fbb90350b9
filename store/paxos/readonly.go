package paxos

import "math"

// pendingRead is a read-index request waiting for a quorum to acknowledge heartbeat seq.
type pendingRead struct {
	id  uint64
	seq uint64
}

// readOnly is the leader's read state (as etcd raft's read_only.go): heartbeat sequence
// numbers with the tick each was sent at (an acknowledged one extends the lease), and the
// read-index requests waiting for a quorum to acknowledge a heartbeat sent after them.
type readOnly struct {
	hbSeq   uint64            // last heartbeat sequence sent (never reset: unique per replica run)
	seqTick map[uint64]uint64 // heartbeat sequence -> tick it was sent at
	pending []pendingRead
	forceHB bool // a read waits: the next Ready sends a heartbeat
}

// reset starts a leadership: no heartbeat sent, no read waiting.
func (r *readOnly) reset() {
	r.seqTick = map[uint64]uint64{}
	r.pending = nil
}

// next numbers a heartbeat (or an Accept batch, which acts as one) sent at tick now.
func (r *readOnly) next(now uint64) uint64 {
	r.hbSeq++
	r.seqTick[r.hbSeq] = now
	return r.hbSeq
}

// prune forgets the send ticks of old heartbeats (a late acknowledgement of one no longer
// extends the lease).
func (r *readOnly) prune() {
	if len(r.seqTick) > 512 {
		for s := range r.seqTick {
			if s+256 < r.hbSeq {
				delete(r.seqTick, s)
			}
		}
	}
}

// ReadIndex asks for a linearizable read point for request id. When the leader's lease
// is valid the read is ready at once; otherwise a heartbeat round confirms leadership
// (read-index). Ready.ReadsReady reports it; Ready.ReadsDropped reports it lost.
func (n *Node) ReadIndex(id uint64) error {
	if n.role != Leader {
		return &NotLeaderError{Leader: n.leader}
	}
	if n.log.commit >= n.startSlot && n.LeaseValid() {
		n.out.readsReady = append(n.out.readsReady, ReadState{ID: id, Index: n.log.commit})
		return nil
	}
	n.ro.pending = append(n.ro.pending, pendingRead{id: id, seq: n.ro.hbSeq + 1})
	n.ro.forceHB = true
	return nil
}

// LeaseValid reports whether this leader holds a lease: a majority (itself included)
// acknowledged a heartbeat sent less than ElectionTicks-LeaseDriftTicks ticks ago.
func (n *Node) LeaseValid() bool {
	_, ok := n.LeaseExpiry()
	return ok
}

// LeaseExpiry returns the tick at which this leader's lease ends (its ticks are counted
// from the node's start: the current one is Now), and whether it holds one now. A driver
// that maps ticks to its clock can tell whether the lease still holds at a later instant
// without asking the node (which may not have been ticked since: a paused process).
func (n *Node) LeaseExpiry() (uint64, bool) {
	if n.role != Leader {
		return 0, false
	}
	t, ok := n.trk.quorumValue(n.cfg.ID, n.now, func(p *progress) (uint64, bool) { return p.ackTick, p.acked })
	if !ok {
		return 0, false
	}
	end := t + uint64(n.cfg.ElectionTicks) - uint64(min(n.cfg.LeaseDriftTicks, n.cfg.ElectionTicks))
	return end, n.now < end
}

// Now returns the node's clock: the number of ticks since it was created.
func (n *Node) Now() uint64 { return n.now }

// recordHeartbeatAck notes that peer acknowledged heartbeat seq: it is active, and the
// heartbeat's send tick may extend the lease.
func (n *Node) recordHeartbeatAck(peer, seq uint64) {
	p := n.trk.pr(peer)
	p.active = true
	if seq > p.ackSeq {
		p.ackSeq = seq
		if t, ok := n.ro.seqTick[seq]; ok && t >= p.ackTick {
			p.ackTick, p.acked = t, true
		}
	}
}

// releaseReads hands out the pending reads whose heartbeat a quorum acknowledged.
func (n *Node) releaseReads() {
	if n.role != Leader || len(n.ro.pending) == 0 || n.log.commit < n.startSlot {
		return
	}
	confirmed, _ := n.trk.quorumValue(n.cfg.ID, math.MaxUint64, func(p *progress) (uint64, bool) { return p.ackSeq, true })
	kept := n.ro.pending[:0]
	for _, r := range n.ro.pending {
		if r.seq <= confirmed {
			n.out.readsReady = append(n.out.readsReady, ReadState{ID: r.id, Index: n.log.commit})
		} else {
			kept = append(kept, r)
		}
	}
	n.ro.pending = kept
}

// dropReads reports every pending read lost (leadership lost).
func (n *Node) dropReads() {
	for _, r := range n.ro.pending {
		n.out.readsDropped = append(n.out.readsDropped, r.id)
	}
	n.ro.pending = nil
}
