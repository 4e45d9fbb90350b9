package paxos

import (
	"fmt"
	"math/rand"
	"slices"
)

// The core is split as etcd raft splits raft.go: this file holds the roles, Tick, Step
// and the leader's replication; log.go the slots and commit index; tracker.go one progress
// per peer and the quorums; readonly.go leases and read-index; confchange.go membership
// changes; catchup.go teaching lagging replicas; ready.go the output batch.

// Role is a replica's current role.
type Role int

// Roles.
const (
	// Follower accepts a leader's proposals.
	Follower Role = iota
	// Candidate runs phase 1 for its ballot.
	Candidate
	// Leader runs phase 2 only, for every slot from its start on.
	Leader
)

func (r Role) String() string {
	switch r {
	case Follower:
		return "follower"
	case Candidate:
		return "candidate"
	case Leader:
		return "leader"
	}
	return fmt.Sprintf("role(%d)", int(r))
}

// Status is a snapshot of a Node's state for callers and tests.
type Status struct {
	// ID is the replica id.
	ID uint64
	// Role is follower, candidate or leader.
	Role Role
	// Leader is the leader hint (0 when unknown).
	Leader uint64
	// Promised is the highest ballot promised.
	Promised uint64
	// Commit is the highest slot with every slot up to it chosen.
	Commit uint64
	// Applied is the highest slot handed out for applying.
	Applied uint64
	// NextSlot is the leader's next free slot (0 on a replica that never led).
	NextSlot uint64
	// Epoch is the configuration epoch (0 on a joining replica that has not learned one).
	Epoch uint64
	// Members are the voting members of the current configuration.
	Members []uint64
}

// Node is the pure Multi-Paxos core, shaped like etcd raft's RawNode: feed it ticks (Tick),
// messages (Step) and proposals (Propose); collect what to persist, send and apply with
// Ready. It does no I/O, starts no goroutines and is not safe for concurrent use.
type Node struct {
	cfg Config
	rng *rand.Rand

	conf  ConfState   // the current configuration
	confs []ConfState // configurations from the snapshot's on, oldest first
	log   slotLog
	trk   tracker
	ro    readOnly

	role     Role
	promised uint64
	maxRound uint64
	leader   uint64

	// time, in ticks
	now             uint64
	electionElapsed int
	electionTimeout int
	lastHeard       uint64 // follower: tick the leader was last heard
	quietUntil      uint64 // no promise to a rival before this tick (restart, step-down)
	hbElapsed       int
	checkElapsed    int

	// candidate
	prepareFrom uint64
	// pre-candidate (Config.PreVote): the ballot it asks about (0: not asking) and the
	// voters that said it could win.
	preBallot uint64
	preGrants map[uint64]bool
	// preRounds counts the pre-votes asked; preRefused the refusals the latest one heard
	// (the driver logs them: an election that takes several timeouts says why).
	preRounds, preRefused uint64

	// leader
	stopAt     uint64 // slot of the configuration entry in flight: nothing is proposed past it
	sentCommit uint64 // the commit index last sent to the voters (Accepts and heartbeats carry it)
	nextSlot   uint64
	startSlot  uint64 // first slot of this leadership's own proposals
	unsent     []Entry

	out pendingOutput
}

// NewNode restores a Node from persisted state (zero HardState and nil entries for a new
// replica). Entries may repeat slots; the last one for a slot wins. A restarted replica
// refuses to promise for ElectionTicks, so leases held before its crash stay safe.
func NewNode(cfg Config, hs HardState, entries []Entry) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	conf := ConfState{Epoch: 1, Start: 1, Members: slices.Clone(cfg.Peers)}
	slices.Sort(conf.Members)
	if cfg.Join {
		conf = ConfState{Start: 1}
	}
	if hs.Snapshot > 0 && hs.Conf.Epoch > 0 {
		if !usableConf(hs.Conf) {
			return nil, fmt.Errorf("paxos: restore snapshot configuration %v (1 to %d members): %w", hs.Conf.Members, MaxMembers, ErrCorruptWAL)
		}
		conf = hs.Conf.Clone()
	}
	n := &Node{
		cfg:      cfg,
		rng:      rand.New(rand.NewSource(cfg.Seed)),
		promised: hs.Promised,
		maxRound: BallotRound(hs.Promised),
		log:      slotLog{commit: max(hs.Commit, hs.Snapshot), snap: hs.Snapshot, applied: hs.Snapshot},
		trk:      newTracker(),
	}
	n.ro.reset()
	n.confs = []ConfState{conf}
	n.setConf(conf)
	for _, e := range entries {
		if e.Slot == 0 {
			return nil, fmt.Errorf("paxos: restore entry with slot 0: %w", ErrCorruptWAL)
		}
		if e.Epoch == 0 {
			e.Epoch = 1 // records written before configurations existed
		}
		if e.Slot > n.log.snap {
			n.log.set(e)
		}
	}
	if n.log.commit > n.log.last() {
		return nil, fmt.Errorf("paxos: restore commit %d beyond last slot %d: %w", n.log.commit, n.log.last(), ErrCorruptWAL)
	}
	for s := n.log.snap + 1; s <= n.log.commit; s++ {
		e := n.log.at(s).e
		if e.Ballot == 0 {
			return nil, fmt.Errorf("paxos: restore committed slot %d is empty: %w", s, ErrCorruptWAL)
		}
		if e.Type == EntryConfig {
			c, err := DecodeConfState(e.Data)
			if err != nil {
				return nil, fmt.Errorf("paxos: restore configuration at slot %d: %v: %w", s, err, ErrCorruptWAL)
			}
			if !usableConf(c) {
				return nil, fmt.Errorf("paxos: restore configuration at slot %d: members %v (1 to %d): %w", s, c.Members, MaxMembers, ErrCorruptWAL)
			}
			c.Start = s + 1
			n.confs = append(n.confs, c)
			n.setConf(c)
		}
	}
	// Values accepted past the commit index in an epoch that has since ended are void.
	n.dropStale(n.log.commit)
	n.quietUntil = uint64(cfg.ElectionTicks)
	n.resetElectionTimeout()
	return n, nil
}

// ID returns the replica id.
func (n *Node) ID() uint64 { return n.cfg.ID }

// Status returns the current state.
func (n *Node) Status() Status {
	return Status{ID: n.cfg.ID, Role: n.role, Leader: n.leader, Promised: n.promised,
		Commit: n.log.commit, Applied: n.log.applied, NextSlot: n.nextSlot,
		Epoch: n.conf.Epoch, Members: slices.Clone(n.conf.Members)}
}

// Role returns the node's role.
func (n *Node) Role() Role { return n.role }

// Leader returns the leader hint (0 when unknown).
func (n *Node) Leader() uint64 { return n.leader }

func (n *Node) resetElectionTimeout() {
	n.electionElapsed = 0
	n.electionTimeout = n.cfg.ElectionTicks + n.rng.Intn(n.cfg.ElectionTicks)
}

func (n *Node) send(m Message) {
	m.From = n.cfg.ID
	m.Epoch = n.conf.Epoch
	n.out.msgs = append(n.out.msgs, m)
}

func (n *Node) setPromised(b uint64) {
	if b > n.promised {
		n.promised = b
		n.out.hsDirty = true
	}
	if r := BallotRound(b); r > n.maxRound {
		n.maxRound = r
	}
}

// Tick advances the logical clock by one tick.
func (n *Node) Tick() {
	n.now++
	switch n.role {
	case Follower, Candidate:
		if !n.isMember() {
			n.electionElapsed = 0 // not a voter: never campaigns
			return
		}
		n.electionElapsed++
		if n.electionElapsed >= n.electionTimeout {
			if n.cfg.PreVote {
				n.preCampaign()
			} else {
				n.campaign()
			}
		}
	case Leader:
		n.hbElapsed++
		if n.hbElapsed >= n.cfg.HeartbeatTicks {
			n.broadcastHeartbeat()
		}
		n.checkElapsed++
		if n.checkElapsed >= n.cfg.ElectionTicks {
			// Check-quorum: a leader that heard from no majority for an election timeout
			// steps down.
			n.checkElapsed = 0
			if n.trk.activeVoters()+1 < n.trk.quorum {
				n.stepDown(0)
				return
			}
			n.trk.resetActive()
		}
	}
}

// TickN ticks the node k times at once, as its driver does for the ticks it was not
// scheduled for. A follower's or candidate's ticks are Tick's, one by one. A leader's
// heartbeat and check-quorum are judged once, at the end: ticked one by one, a stall of
// more than two election timeouts made the leader judge twice in a row, the second time
// on no message at all (its driver steps none between two ticks), and step down although
// its followers had answered every heartbeat.
func (n *Node) TickN(k uint64) {
	if n.role != Leader || k <= 1 {
		for ; k > 0; k-- {
			n.Tick()
		}
		return
	}
	n.now += k - 1
	n.hbElapsed += int(k - 1)
	n.checkElapsed += int(k - 1)
	n.Tick()
}

// TicksUntilTimer returns how many ticks from now the node's next timer is due: a
// follower's election timeout, a leader's heartbeat or check-quorum (at least 1). Ticking
// it more often changes nothing: a driver may sleep until then (unless a message, a
// proposal or a read arrives first), and then tick the elapsed ticks.
func (n *Node) TicksUntilTimer() int {
	switch {
	case n.role == Leader:
		return max(1, min(n.cfg.HeartbeatTicks-n.hbElapsed, n.cfg.ElectionTicks-n.checkElapsed))
	case !n.isMember():
		return max(1, n.cfg.ElectionTicks) // no timer: a look now and then costs nothing
	default:
		return max(1, n.electionTimeout-n.electionElapsed)
	}
}

// PreVotes returns how many pre-votes this replica has asked, how many refusals the latest
// heard, and how many ticks ago it last heard a leader (for a driver's logs).
func (n *Node) PreVotes() (rounds, refused, sinceHeard uint64) {
	return n.preRounds, n.preRefused, n.now - n.lastHeard
}

// Campaign starts phase 1 now, without a pre-vote (tests and leadership transfer use it).
func (n *Node) Campaign() { n.campaign() }

// preCampaign asks the voters whether this replica could win an election, changing no
// ballot anywhere; a majority of grants (its own included) starts phase 1. Without one,
// the next election timeout asks again.
func (n *Node) preCampaign() {
	if !n.isMember() {
		return
	}
	n.resetElectionTimeout()
	n.preBallot = MakeBallot(max(n.maxRound, BallotRound(n.promised))+1, n.cfg.ID)
	n.preGrants = map[uint64]bool{n.cfg.ID: true}
	n.preRounds++
	n.preRefused = 0
	if len(n.preGrants) >= n.trk.quorum {
		n.campaign()
		return
	}
	for _, p := range n.trk.voters {
		if p != n.cfg.ID {
			n.send(Message{Type: MsgPreVote, To: p, Ballot: n.preBallot, Commit: n.log.commit})
		}
	}
}

// onPreVote answers whether the sender could win: no when this replica leads, is in its
// quiet period, or heard a live leader less than an election timeout ago (the same rule
// that refuses a Prepare). It changes no state: a pre-vote disturbs nobody.
func (n *Node) onPreVote(m Message) {
	n.send(Message{Type: MsgPreVoteResp, To: m.From, Ballot: m.Ballot, Reject: n.sticky(), Promised: n.promised})
}

func (n *Node) onPreVoteResp(m Message) {
	if r := BallotRound(m.Promised); r > n.maxRound {
		n.maxRound = r
	}
	if n.preBallot != 0 && m.Ballot == n.preBallot && m.Reject {
		n.preRefused++
	}
	if n.preBallot == 0 || m.Ballot != n.preBallot || n.role == Leader || m.Reject {
		return
	}
	n.preGrants[m.From] = true
	if len(n.preGrants) >= n.trk.quorum {
		n.campaign()
	}
}

func (n *Node) campaign() {
	n.preBallot, n.preGrants = 0, nil
	if !n.isMember() {
		return
	}
	round := max(n.maxRound, BallotRound(n.promised)) + 1
	b := MakeBallot(round, n.cfg.ID)
	n.role = Candidate
	n.leader = 0
	n.setPromised(b)
	n.resetElectionTimeout()
	n.prepareFrom = n.log.commit + 1
	n.trk.votes = map[uint64]Message{}
	n.trk.votes[n.cfg.ID] = Message{Type: MsgPromise, From: n.cfg.ID, Ballot: b, Commit: n.log.commit, Entries: n.log.acceptedFrom(n.prepareFrom)}
	if len(n.trk.votes) >= n.trk.quorum {
		n.becomeLeader()
		return
	}
	for _, p := range n.trk.voters {
		if p != n.cfg.ID {
			n.send(Message{Type: MsgPrepare, To: p, Ballot: b, Slot: n.prepareFrom, Commit: n.log.commit})
		}
	}
}

func (n *Node) becomeLeader() {
	n.role = Leader
	n.leader = n.cfg.ID
	b := n.promised
	commit := n.log.commit
	// Choose per slot the value accepted at the highest ballot among the quorum.
	best := map[uint64]Entry{}
	maxSlot := commit
	for _, pm := range n.trk.votes {
		for _, e := range pm.Entries {
			if e.Slot <= commit {
				continue
			}
			if cur, ok := best[e.Slot]; !ok || e.Ballot > cur.Ballot {
				best[e.Slot] = e
			}
			maxSlot = max(maxSlot, e.Slot)
		}
	}
	n.trk.votes = nil
	n.unsent = nil
	// A configuration entry ends this epoch at its slot: nothing past it is proposed, and
	// the next configuration starts after it once it is chosen.
	n.stopAt = 0
	for s := commit + 1; s <= maxSlot; s++ {
		if e, ok := best[s]; ok && e.Type == EntryConfig {
			n.stopAt = s
			maxSlot = s
			break
		}
	}
	for s := commit + 1; s <= maxSlot; s++ {
		e, ok := best[s]
		if !ok {
			e = Entry{Type: EntryNoop}
		}
		n.acceptOwn(Entry{Slot: s, Ballot: b, Type: e.Type, Data: e.Data, Epoch: n.conf.Epoch})
	}
	n.nextSlot = maxSlot + 1
	if n.stopAt != 0 {
		n.startSlot = n.stopAt
	} else {
		n.startSlot = n.nextSlot
		n.acceptOwn(Entry{Slot: n.nextSlot, Ballot: b, Type: EntryNoop, Epoch: n.conf.Epoch})
		n.nextSlot++
	}
	n.trk.resetLeader()
	n.ro.reset()
	n.hbElapsed = 0
	n.checkElapsed = 0
	n.ro.next(n.now)
	n.maybeCommit()
}

// acceptOwn records the leader's own acceptance of e (persisted with the next Ready,
// before the Accept carrying it is sent).
func (n *Node) acceptOwn(e Entry) {
	st := n.log.set(e)
	st.sentAt = n.now
	n.out.persist = append(n.out.persist, e)
	n.unsent = append(n.unsent, e)
}

func (n *Node) stepDown(leaderHint uint64) {
	n.preBallot, n.preGrants = 0, nil
	n.trk.dropLearners()
	n.role = Follower
	n.leader = leaderHint
	n.trk.votes = nil
	n.unsent = nil
	n.dropReads()
	n.quietUntil = n.now + uint64(n.cfg.ElectionTicks)
	n.resetElectionTimeout()
}

// Propose asks the leader to put data in the next free slot. It returns the slot and the
// ballot; the proposal succeeded if the entry later committed at that slot carries the
// same data. On a non-leader it returns ErrNotLeader.
func (n *Node) Propose(data []byte) (slot, ballot uint64, err error) {
	return n.propose(EntryNormal, data)
}

func (n *Node) propose(t EntryType, data []byte) (uint64, uint64, error) {
	if n.role != Leader {
		return 0, 0, &NotLeaderError{Leader: n.leader}
	}
	if n.stopAt != 0 {
		return 0, 0, ErrReconfiguring
	}
	s := n.nextSlot
	n.nextSlot++
	if t == EntryConfig {
		n.stopAt = s
	}
	n.acceptOwn(Entry{Slot: s, Ballot: n.promised, Type: t, Data: data, Epoch: n.conf.Epoch})
	n.maybeCommit()
	return s, n.promised, nil
}

func (n *Node) broadcastHeartbeat() {
	n.hbElapsed = 0
	n.sentCommit = n.log.commit
	seq := n.ro.next(n.now)
	n.ro.prune()
	// Retransmit the oldest undecided run, to the peers that have not acknowledged its
	// first slot, when its Accept may have been lost.
	var resend []Entry
	var acked uint64
	if st := n.log.at(n.log.commit + 1); st != nil && !st.chosen && n.now-st.sentAt >= uint64(max(2*n.cfg.HeartbeatTicks, n.cfg.ElectionTicks/2)) {
		acked = st.acks
		size := 0
		for s := n.log.commit + 1; s < n.nextSlot && len(resend) < n.cfg.MaxBatch; s++ {
			st := n.log.at(s)
			if size += len(st.e.Data); size > n.cfg.MaxBatchBytes && len(resend) > 0 {
				break
			}
			st.sentAt = n.now
			resend = append(resend, st.e)
		}
	}
	for _, p := range n.trk.voters {
		if p != n.cfg.ID {
			m := Message{Type: MsgAccept, To: p, Ballot: n.promised, Commit: n.log.commit, Seq: seq}
			if acked&n.trk.bit(p) == 0 {
				m.Entries = resend
			}
			n.send(m)
		}
	}
	for _, p := range n.trk.learners() {
		n.send(Message{Type: MsgAccept, To: p, Ballot: n.promised, Commit: n.log.commit})
	}
}

// flushAccepts sends the batched new entries to every peer, split into contiguous runs
// of at most MaxBatch entries (an Accepted acknowledges a contiguous range).
func (n *Node) flushAccepts() {
	// A heartbeat sequence number on the batch lets its acknowledgement extend the lease.
	// The heartbeat timer runs on: only heartbeats reach the learners and retransmit a
	// lost Accept, and a steady stream of batches must not starve them.
	seq := n.ro.next(n.now)
	n.sentCommit = n.log.commit
	runs := [][]Entry{}
	start, size := 0, len(n.unsent[0].Data)
	for i := 1; i <= len(n.unsent); i++ {
		if i < len(n.unsent) {
			size += len(n.unsent[i].Data)
		}
		if i == len(n.unsent) || n.unsent[i].Slot != n.unsent[i-1].Slot+1 || i-start >= n.cfg.MaxBatch || size > n.cfg.MaxBatchBytes {
			runs = append(runs, n.unsent[start:i])
			start = i
			if i < len(n.unsent) {
				size = len(n.unsent[i].Data)
			}
		}
	}
	for _, p := range n.trk.voters {
		if p == n.cfg.ID {
			continue
		}
		for _, r := range runs {
			n.out.sendFirst = append(n.out.sendFirst, Message{Type: MsgAccept, From: n.cfg.ID, To: p, Ballot: n.promised, Commit: n.log.commit, Entries: r, Seq: seq, Epoch: n.conf.Epoch})
		}
	}
	n.unsent = nil
}

// maybeCommit advances the commit index over chosen slots, stopping at (and switching
// the configuration on) a configuration entry.
func (n *Node) maybeCommit() {
	for {
		st := n.log.at(n.log.commit + 1)
		if st == nil || !st.chosen {
			break
		}
		n.log.commit++
		if st.e.Type == EntryConfig {
			n.switchConf(n.log.commit, st.e)
			return
		}
	}
	n.releaseReads()
}

// Step feeds one received message. Messages not addressed to this replica, from unknown
// replicas, or malformed are ignored (never panic).
func (n *Node) Step(m Message) {
	if m.To != n.cfg.ID || m.From == n.cfg.ID || m.From == 0 || m.From > 0xffff {
		return
	}
	if n.role == Leader && n.trk.isLearner(m.From) && (m.Type == MsgLearn || (m.Type == MsgAccepted && !m.Reject)) {
		n.noteLearner(m.From, m.Commit)
	}
	// Learning chosen values is epoch-free: whoever knows them may teach them.
	switch m.Type {
	case MsgChosen:
		n.onChosen(m)
		return
	case MsgSnapshot:
		n.onSnapshot(m)
		return
	case MsgLearn:
		n.maybeCatchUp(m.From, m.Commit)
		return
	}
	if m.Epoch != n.conf.Epoch {
		if m.Epoch > n.conf.Epoch {
			// This replica missed a configuration change: it asks to be taught the log
			// and, knowing a newer group is alive, does not campaign meanwhile.
			n.electionElapsed = 0
			n.send(Message{Type: MsgLearn, To: m.From, Commit: n.log.commit})
		} else {
			n.maybeCatchUp(m.From, m.Commit)
		}
		return
	}
	fromMember := n.trk.isVoter(m.From)
	if !n.isMember() {
		// Not a voter (a learner, or removed): answer a leader's Accept with our commit
		// index only, so it can catch us up; never promise or accept.
		if m.Type == MsgAccept && fromMember {
			n.send(Message{Type: MsgAccepted, To: m.From, Ballot: m.Ballot, Commit: n.log.commit, KnownCommit: m.Commit})
		}
		return
	}
	if !fromMember {
		if m.Type == MsgAccepted && n.role == Leader && n.trk.isLearner(m.From) && !m.Reject {
			if m.Commit < m.KnownCommit {
				n.maybeCatchUp(m.From, m.Commit)
			}
		}
		return
	}
	switch m.Type {
	case MsgPrepare:
		n.onPrepare(m)
	case MsgPromise:
		n.onPromise(m)
	case MsgAccept:
		n.onAccept(m)
	case MsgAccepted:
		n.onAccepted(m)
	case MsgPreVote:
		n.onPreVote(m)
	case MsgPreVoteResp:
		n.onPreVoteResp(m)
	}
}

// sticky reports whether this replica refuses to promise a rival: it leads, it restarted
// or stepped down less than an election timeout ago, or it heard the leader recently.
func (n *Node) sticky() bool {
	if n.role == Leader {
		return true
	}
	if n.now < n.quietUntil {
		return true
	}
	return n.role == Follower && n.leader != 0 && n.now-n.lastHeard < uint64(n.cfg.ElectionTicks)
}

func (n *Node) onPrepare(m Message) {
	ok := m.Ballot > n.promised || (m.Ballot == n.promised && BallotNode(m.Ballot) == m.From)
	// A follower refuses rivals of the leader it heard recently (the lease); the leader
	// itself may renew its ballot (after a configuration change it leads again).
	if ok && m.Ballot > n.promised && n.sticky() && !(n.role == Follower && m.From == n.leader) {
		ok = false
	}
	if BallotNode(m.Ballot) != m.From {
		ok = false
	}
	if !ok {
		if r := BallotRound(m.Ballot); r > n.maxRound {
			n.maxRound = r
		}
		n.send(Message{Type: MsgPromise, To: m.From, Ballot: m.Ballot, Reject: true, Promised: n.promised})
		return
	}
	if m.Ballot > n.promised && n.role != Follower {
		n.stepDown(0)
	}
	n.setPromised(m.Ballot)
	n.leader = 0
	// A pre-vote of this replica's own still out is stale now: it promised a candidate.
	// Campaigning on its grants would refuse that candidate's Accepts, deposing the leader
	// this promise helps elect (two followers that time out close together).
	n.preBallot, n.preGrants = 0, nil
	n.resetElectionTimeout()
	n.send(Message{Type: MsgPromise, To: m.From, Ballot: m.Ballot, Slot: m.Slot, Commit: n.log.commit, Last: n.log.snap, Entries: n.log.acceptedFrom(m.Slot)})
}

func (n *Node) onPromise(m Message) {
	if m.Reject {
		if r := BallotRound(m.Promised); r > n.maxRound {
			n.maxRound = r
		}
		if n.role == Candidate && m.Ballot == n.promised {
			n.stepDown(0)
		}
		return
	}
	if n.role != Candidate || m.Ballot != n.promised {
		return
	}
	if m.Last >= n.prepareFrom {
		// The acceptor compacted slots this candidate has not seen chosen: it cannot
		// recover them from promises, so it must not lead; it waits to be caught up.
		n.stepDown(0)
		return
	}
	n.trk.votes[m.From] = m
	if len(n.trk.votes) >= n.trk.quorum {
		n.becomeLeader()
	}
}

func (n *Node) onAccept(m Message) {
	if m.Ballot < n.promised || BallotNode(m.Ballot) != m.From {
		n.send(Message{Type: MsgAccepted, To: m.From, Ballot: m.Ballot, Reject: true, Promised: n.promised})
		return
	}
	if n.role != Follower {
		n.stepDown(m.From)
	}
	n.setPromised(m.Ballot)
	n.leader = m.From
	n.lastHeard = n.now
	n.electionElapsed = 0
	n.preBallot, n.preGrants = 0, nil
	var first, last uint64
	for i, e := range m.Entries {
		if e.Slot == 0 {
			continue
		}
		if i == 0 {
			first = e.Slot
		}
		last = e.Slot
		if e.Slot <= n.log.commit {
			continue
		}
		if st := n.log.at(e.Slot); st != nil && st.e.Ballot == m.Ballot {
			continue // a retransmission: already durable at this ballot
		}
		e.Ballot = m.Ballot
		e.Epoch = m.Epoch
		n.log.set(e)
		n.out.persist = append(n.out.persist, e)
	}
	for n.log.commit < m.Commit {
		st := n.log.at(n.log.commit + 1)
		if st == nil || st.e.Ballot != m.Ballot {
			break
		}
		n.log.commit++
		if st.e.Type == EntryConfig {
			n.switchConf(n.log.commit, st.e)
			break
		}
	}
	n.send(Message{Type: MsgAccepted, To: m.From, Ballot: m.Ballot, Slot: first, Last: last, Commit: n.log.commit, Seq: m.Seq, KnownCommit: m.Commit})
}

func (n *Node) onAccepted(m Message) {
	if m.Reject {
		if m.Promised > n.promised {
			n.setPromised(m.Promised)
			if n.role == Leader {
				n.stepDown(0)
			}
		}
		return
	}
	if n.role != Leader || m.Ballot != n.promised {
		return
	}
	if m.Seq > 0 {
		n.recordHeartbeatAck(m.From, m.Seq)
	}
	bit := n.trk.bit(m.From)
	if m.Slot > 0 && m.Last >= m.Slot {
		// Only held, undecided slots can be acknowledged: the range is clipped to them, so
		// a malformed range (Last far beyond the log) costs nothing.
		for s := max(m.Slot, n.log.commit+1); s <= min(m.Last, n.log.last()); s++ {
			st := n.log.at(s)
			if st == nil || st.chosen || st.e.Ballot != n.promised {
				continue
			}
			n.ack(st, bit)
		}
	}
	n.maybeCommit()
	if m.Commit < m.KnownCommit {
		n.maybeCatchUp(m.From, m.Commit)
	}
}
