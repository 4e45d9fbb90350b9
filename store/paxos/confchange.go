package paxos

import (
	"fmt"
	"slices"
)

// nextConf returns the configuration that follows cur once replica id is added (add true,
// reachable at addr when addr is not empty) or removed, starting at slot start. It is
// pure: it refuses (ErrBadConfChange) a change that is not exactly one replica, that would
// leave the group empty, or that would grow it past MaxMembers.
func nextConf(cur ConfState, add bool, id uint64, addr string, start uint64) (ConfState, error) {
	c := cur.Clone()
	c.Epoch++
	c.Start = start
	switch {
	case id == 0 || id > 0xffff:
		return ConfState{}, fmt.Errorf("%w: replica id %d must be in [1, 65535]", ErrBadConfChange, id)
	case add && c.Has(id):
		return ConfState{}, fmt.Errorf("%w: replica %d is already a member of %v", ErrBadConfChange, id, c.Members)
	case add && len(c.Members) >= MaxMembers:
		return ConfState{}, fmt.Errorf("%w: adding replica %d would make %d members, more than MaxMembers (%d)", ErrBadConfChange, id, len(c.Members)+1, MaxMembers)
	case !add && !c.Has(id):
		return ConfState{}, fmt.Errorf("%w: replica %d is not a member of %v", ErrBadConfChange, id, c.Members)
	case !add && len(c.Members) == 1:
		return ConfState{}, fmt.Errorf("%w: cannot remove the last member %d", ErrBadConfChange, id)
	}
	if add {
		c.Members = append(c.Members, id)
		slices.Sort(c.Members)
		if addr != "" {
			if c.Addrs == nil {
				c.Addrs = map[uint64]string{}
			}
			c.Addrs[id] = addr
		}
	} else {
		c.Members = slices.DeleteFunc(c.Members, func(x uint64) bool { return x == id })
		delete(c.Addrs, id)
	}
	return c, nil
}

// usableConf reports whether a configuration read from a log entry, a snapshot or a
// message can be adopted: one to MaxMembers voters with valid ids. Only this package
// encodes configurations, so an unusable one means corruption.
func usableConf(c ConfState) bool {
	if len(c.Members) == 0 || len(c.Members) > MaxMembers {
		return false
	}
	for _, id := range c.Members {
		if id == 0 || id > 0xffff {
			return false
		}
	}
	return true
}

// Conf returns the current configuration.
func (n *Node) Conf() ConfState { return n.conf.Clone() }

// ConfAt returns the configuration in effect for the slots after slot (what a snapshot
// through slot must carry). slot must not be below the compaction point.
func (n *Node) ConfAt(slot uint64) ConfState {
	c := n.confs[0]
	for _, x := range n.confs[1:] {
		if x.Start <= slot+1 {
			c = x
		}
	}
	return c.Clone()
}

// setConf makes c the configuration used for quorums and membership from now on.
func (n *Node) setConf(c ConfState) {
	n.conf = c
	n.trk.setVoters(c.Members)
}

func (n *Node) isMember() bool { return n.trk.isVoter(n.cfg.ID) }

// dropStale voids accepted values after slot that belong to an epoch before the current
// one (the epoch they were accepted in ended at or before slot).
func (n *Node) dropStale(after uint64) {
	for s := max(after, n.log.snap) + 1; s <= n.log.last(); s++ {
		if st := n.log.at(s); st.e.Ballot != 0 && st.e.Epoch < n.conf.Epoch {
			*st = slotState{}
		}
	}
	n.log.trimVoid()
}

// ProposeConfChange asks the leader to add (add true) or remove replica id, through the
// log: the configuration entry goes in the next free slot s, nothing is proposed after it
// until it is chosen, and the new configuration (epoch+1) governs every slot from s+1.
// addr, for an added replica, is recorded in the configuration for the transports. Only
// one replica changes at a time; while a change is in flight it returns ErrReconfiguring.
// A configuration never exceeds MaxMembers. Like Propose, it succeeded if the entry
// committed at slot is the configuration entry.
func (n *Node) ProposeConfChange(add bool, id uint64, addr string) (slot, ballot uint64, err error) {
	if n.role != Leader {
		return 0, 0, &NotLeaderError{Leader: n.leader}
	}
	if n.stopAt != 0 {
		return 0, 0, ErrReconfiguring
	}
	c, err := nextConf(n.conf, add, id, addr, n.nextSlot+1)
	if err != nil {
		return 0, 0, err
	}
	return n.propose(EntryConfig, EncodeConfState(c))
}

// AddLearner makes this leader send heartbeats and catch-up to replica id, which is not a
// member: the way a replica about to be added learns the log before it counts. Learners
// are forgotten when leadership changes and when they become members.
func (n *Node) AddLearner(id uint64) error {
	if n.role != Leader {
		return &NotLeaderError{Leader: n.leader}
	}
	if id == 0 || id > 0xffff || id == n.cfg.ID {
		return fmt.Errorf("%w: learner id %d", ErrBadConfChange, id)
	}
	if !n.trk.isVoter(id) {
		n.trk.pr(id).learner = true
	}
	return nil
}

// LearnerCommit returns the commit index a learner last reported to this leader.
func (n *Node) LearnerCommit(id uint64) (uint64, bool) {
	p := n.trk.prs[id]
	if p == nil || !p.learner || !p.reported {
		return 0, false
	}
	return p.learnerCommit, true
}

// noteLearner records the commit index a learner reported (on a MsgLearn or an Accepted).
func (n *Node) noteLearner(id, commit uint64) {
	p := n.trk.pr(id)
	p.learnerCommit = max(p.learnerCommit, commit)
	p.reported = true
}

// switchConf ends the current epoch at slot, where the configuration entry e was just
// committed, and starts the next one.
func (n *Node) switchConf(slot uint64, e Entry) {
	c, err := DecodeConfState(e.Data)
	if err != nil || !usableConf(c) {
		// Only this package encodes configurations; a bad one means a corrupt log. Keep
		// the current configuration rather than adopt an unusable one.
		return
	}
	c.Start = slot + 1
	wasLeader := n.role == Leader
	n.confs = append(n.confs, c)
	n.setConf(c)
	n.stopAt = 0
	n.dropStale(slot)
	n.log.truncateAfter(slot) // values accepted past the entry belonged to the old epoch
	if n.role != Follower {
		hint := n.leader
		if wasLeader {
			hint = 0
		}
		n.stepDown(hint)
	}
	if wasLeader && n.isMember() {
		// Still a member: lead the new configuration at once (phase 1 among its members;
		// they promise the leader they last heard without waiting out its lease).
		n.campaign()
	}
}
