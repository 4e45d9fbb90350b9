package paxos

import "slices"

// MaxMembers is the largest voting configuration a group may have. The leader records a
// slot's acknowledgements as a 64-bit mask over the voters, so a configuration of more
// than 64 members is refused (Config.Validate, ProposeConfChange) and never adopted from
// a log or a snapshot. Every commit waits for a majority's fsync: groups are 3 or 5.
const MaxMembers = 64

// progress is what this replica knows of one peer, as etcd raft's tracker keeps one
// Progress per peer. Fields are grouped by who sets them and when they are reset.
type progress struct {
	// Leader only, reset when this replica becomes leader:
	active  bool   // acknowledged a heartbeat since the last check-quorum
	ackSeq  uint64 // highest heartbeat sequence acknowledged
	ackTick uint64 // tick at which the newest acknowledged heartbeat was sent
	acked   bool   // ackTick is set

	// Leader only, forgotten when leadership is lost and when the peer becomes a voter:
	learner       bool   // a non-member this leader teaches the log (AddLearner)
	learnerCommit uint64 // the commit index the learner last reported
	reported      bool   // learnerCommit is set

	// Any role: the catch-up (chosen values or snapshot) last sent to the peer, so that
	// one batch is in flight per peer and it is resent only after an election timeout.
	catchupTo uint64
	catchupAt uint64
}

// tracker follows the current configuration's voters (each with its bit in a slot's
// acknowledgement mask and the quorum size), the promises of an election, and one
// progress per peer, voter or not.
type tracker struct {
	voters []uint64          // sorted
	bits   map[uint64]uint64 // voter -> its bit in slotState.acks
	quorum int
	prs    map[uint64]*progress
	votes  map[uint64]Message // candidate only: promises for its ballot, by sender
}

func newTracker() tracker {
	return tracker{bits: map[uint64]uint64{}, prs: map[uint64]*progress{}}
}

// setVoters makes members (at most MaxMembers) the voters; a learner that became a voter
// stops being one.
func (t *tracker) setVoters(members []uint64) {
	t.voters = slices.Clone(members)
	slices.Sort(t.voters)
	t.bits = make(map[uint64]uint64, len(t.voters))
	for i, id := range t.voters {
		t.bits[id] = 1 << uint(i)
		if pr := t.prs[id]; pr != nil {
			pr.learner, pr.learnerCommit, pr.reported = false, 0, false
		}
	}
	t.quorum = len(t.voters)/2 + 1
}

func (t *tracker) isVoter(id uint64) bool {
	_, ok := t.bits[id]
	return ok
}

// bit returns id's bit in a slot's acknowledgement mask (0 for a non-voter).
func (t *tracker) bit(id uint64) uint64 { return t.bits[id] }

// pr returns the progress of peer id, creating it.
func (t *tracker) pr(id uint64) *progress {
	p := t.prs[id]
	if p == nil {
		p = &progress{}
		t.prs[id] = p
	}
	return p
}

// resetLeader forgets what a previous leadership learned of heartbeats.
func (t *tracker) resetLeader() {
	for _, p := range t.prs {
		p.active, p.ackSeq, p.ackTick, p.acked = false, 0, 0, false
	}
}

// resetActive starts a new check-quorum interval.
func (t *tracker) resetActive() {
	for _, p := range t.prs {
		p.active = false
	}
}

// activeVoters counts the voters heard from since the last check-quorum (never self).
func (t *tracker) activeVoters() int {
	n := 0
	for _, id := range t.voters {
		if p := t.prs[id]; p != nil && p.active {
			n++
		}
	}
	return n
}

// dropLearners forgets every learner (leadership lost).
func (t *tracker) dropLearners() {
	for _, p := range t.prs {
		p.learner, p.learnerCommit, p.reported = false, 0, false
	}
}

// learners returns the learners' ids, sorted.
func (t *tracker) learners() []uint64 {
	var out []uint64
	for id, p := range t.prs {
		if p.learner {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

func (t *tracker) isLearner(id uint64) bool {
	p := t.prs[id]
	return p != nil && p.learner
}

// quorumValue returns the highest value that a quorum of voters has reached: self's is
// selfVal, another voter's comes from get (false: none yet). It reports false when fewer
// than a quorum of voters have a value.
func (t *tracker) quorumValue(self, selfVal uint64, get func(*progress) (uint64, bool)) (uint64, bool) {
	vals := []uint64{selfVal}
	for _, id := range t.voters {
		if id == self {
			continue
		}
		if p := t.prs[id]; p != nil {
			if v, ok := get(p); ok {
				vals = append(vals, v)
			}
		}
	}
	if len(vals) < t.quorum {
		return 0, false
	}
	slices.Sort(vals)
	return vals[len(vals)-t.quorum], true
}
