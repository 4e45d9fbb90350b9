package paxos

import "fmt"

// slotState is one slot of a replica's log: the value it accepted there and, on the
// leader, who acknowledged it.
type slotState struct {
	e      Entry
	acks   uint64 // leader only: bitmask over the voters' tracker bits (see MaxMembers)
	chosen bool   // leader only: a majority accepted e at the leader's ballot
	sentAt uint64 // leader only: tick of the last Accept carrying e
}

// slotLog is a replica's log: the slots after the compaction point, the commit index
// (every slot up to it is chosen and held here) and the applied index (the last slot
// handed out in a Ready). Slots at or below snap live only in the state machine snapshot.
type slotLog struct {
	slots   []slotState // slot s at slots[s-snap-1]
	snap    uint64      // slots <= snap are compacted into a state machine snapshot
	commit  uint64
	applied uint64
}

// last returns the highest slot held (accepted or void), or snap when none is.
func (l *slotLog) last() uint64 { return l.snap + uint64(len(l.slots)) }

// at returns slot s, or nil when s is compacted or beyond the log.
func (l *slotLog) at(s uint64) *slotState {
	if s <= l.snap || s > l.last() {
		return nil
	}
	return &l.slots[s-l.snap-1]
}

// set records e in its slot (growing the log with void slots as needed) and clears the
// slot's acknowledgements. A compacted slot was chosen long ago: nothing is recorded.
func (l *slotLog) set(e Entry) *slotState {
	if e.Slot <= l.snap {
		return &slotState{}
	}
	for l.last() < e.Slot {
		l.slots = append(l.slots, slotState{})
	}
	st := &l.slots[e.Slot-l.snap-1]
	st.e = e
	st.acks = 0
	st.chosen = false
	return st
}

// acceptedFrom returns every accepted value from slot from on (what a promise carries).
func (l *slotLog) acceptedFrom(from uint64) []Entry {
	var out []Entry
	for s := max(from, l.snap+1); s <= l.last(); s++ {
		if e := l.at(s).e; e.Ballot != 0 {
			out = append(out, e)
		}
	}
	return out
}

// dropThrough forgets every slot through s (s > snap), which a snapshot now covers.
func (l *slotLog) dropThrough(s uint64) {
	if s >= l.last() {
		l.slots = nil
	} else {
		l.slots = append([]slotState(nil), l.slots[s-l.snap:]...)
	}
	l.snap = s
}

// truncateAfter forgets every slot after s (s >= snap).
func (l *slotLog) truncateAfter(s uint64) {
	if l.last() > s {
		l.slots = l.slots[:s-l.snap]
	}
}

// trimVoid drops void slots at the end of the log, past the commit index.
func (l *slotLog) trimVoid() {
	for len(l.slots) > 0 && l.slots[len(l.slots)-1].e.Ballot == 0 && l.last() > l.commit {
		l.slots = l.slots[:len(l.slots)-1]
	}
}

// takeCommitted returns the committed entries not yet handed out, in slot order, and
// marks them applied.
func (l *slotLog) takeCommitted() []Entry {
	if l.commit <= l.applied {
		return nil
	}
	out := make([]Entry, 0, l.commit-l.applied)
	for s := l.applied + 1; s <= l.commit; s++ {
		out = append(out, l.at(s).e)
	}
	l.applied = l.commit
	return out
}

// Compact drops the log through slot, which the caller's state machine snapshot covers
// (the snapshot must be durable first). slot must not exceed the applied index.
func (n *Node) Compact(slot uint64) error {
	if slot > n.log.applied {
		return fmt.Errorf("paxos: compact through %d beyond applied %d", slot, n.log.applied)
	}
	if slot <= n.log.snap {
		return nil
	}
	n.log.dropThrough(slot)
	return nil
}

// Compacted returns the slot through which the log is compacted.
func (n *Node) Compacted() uint64 { return n.log.snap }
