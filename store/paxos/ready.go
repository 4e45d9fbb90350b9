package paxos

import "math/bits"

// pendingOutput is what the node has produced since the last Ready.
type pendingOutput struct {
	snapshot     *SnapshotData
	sendFirst    []Message
	hsDirty      bool
	persist      []Entry
	msgs         []Message
	readsReady   []ReadState
	readsDropped []uint64
}

// HasReady reports whether Ready would return a non-empty batch.
func (n *Node) HasReady() bool {
	o := &n.out
	return o.hsDirty || o.snapshot != nil || len(o.persist) > 0 || len(o.msgs) > 0 || len(o.sendFirst) > 0 || n.log.commit > n.log.applied ||
		len(o.readsReady) > 0 || len(o.readsDropped) > 0 || (n.role == Leader && (len(n.unsent) > 0 || n.ro.forceHB || n.log.commit > n.sentCommit))
}

// Ready returns the pending work and clears it. The caller owns the returned slices;
// entry data is shared with the node and must not be modified.
func (n *Node) Ready() Ready {
	if n.role == Leader {
		switch {
		case len(n.unsent) > 0:
			n.flushAccepts()
		case n.ro.forceHB || n.log.commit > n.sentCommit:
			// A read waits, or values were chosen since the followers were last told the
			// commit index: tell them now rather than at the next heartbeat (a fifth of an
			// election timeout away), so that they apply what was chosen promptly.
			n.broadcastHeartbeat()
		}
		n.ro.forceHB = false
	}
	o := n.out
	n.out = pendingOutput{}
	return Ready{
		HardState:    HardState{Promised: n.promised, Commit: n.log.commit, Snapshot: n.log.snap},
		Entries:      o.persist,
		SendFirst:    o.sendFirst,
		MustPersist:  o.hsDirty || len(o.persist) > 0,
		Messages:     o.msgs,
		ReadsReady:   o.readsReady,
		ReadsDropped: o.readsDropped,
		Snapshot:     o.snapshot,
		Committed:    n.log.takeCommitted(),
	}
}

// Advance tells the node that rd's entries are durable: the leader now counts its own
// acceptance of them. Call it once per Ready, after persisting it; Readies may be handed
// out before earlier ones are durable, as long as they are persisted and advanced in order.
func (n *Node) Advance(rd Ready) {
	if n.role != Leader {
		return
	}
	bit := n.trk.bit(n.cfg.ID)
	for _, e := range rd.Entries {
		st := n.log.at(e.Slot)
		if st == nil || st.chosen || st.e.Ballot != n.promised || e.Ballot != n.promised {
			continue
		}
		n.ack(st, bit)
	}
	n.maybeCommit()
}

// ack records a voter's acceptance of a slot (bit from the tracker); a majority chooses it.
func (n *Node) ack(st *slotState, bit uint64) {
	st.acks |= bit
	if bits.OnesCount64(st.acks) >= n.trk.quorum {
		st.chosen = true
	}
}
