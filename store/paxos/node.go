package paxos

import (
	"fmt"
	"math/bits"
	"math/rand"
	"slices"
)

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

type slotState struct {
	e      Entry
	acks   uint64 // bitmask over peer indexes (leader only)
	chosen bool   // leader only: a majority accepted e at the leader's ballot
	sentAt uint64 // leader only: tick of the last Accept carrying e
}

type pendingRead struct {
	id  uint64
	seq uint64
}

// Node is the pure Multi-Paxos core, shaped like etcd raft's RawNode: feed it ticks (Tick),
// messages (Step) and proposals (Propose); collect what to persist, send and apply with
// Ready. It does no I/O, starts no goroutines and is not safe for concurrent use.
type Node struct {
	cfg    Config
	conf   ConfState   // the current configuration
	confs  []ConfState // configurations from the snapshot's on, oldest first
	peers  []uint64
	pidx   map[uint64]int
	quorum int
	rng    *rand.Rand

	role     Role
	promised uint64
	maxRound uint64
	leader   uint64
	log      []slotState // slot s at log[s-snap-1]
	snap     uint64      // slots <= snap are compacted into a state machine snapshot
	commit   uint64
	applied  uint64

	now             uint64
	electionElapsed int
	electionTimeout int
	lastHeard       uint64
	quietUntil      uint64

	// candidate
	promises    map[uint64]Message
	prepareFrom uint64

	// leader
	stopAt       uint64 // slot of the configuration entry in flight: nothing is proposed past it
	learners     map[uint64]bool
	learnerAt    map[uint64]uint64
	nextSlot     uint64
	startSlot    uint64
	unsent       []Entry
	peerCommit   map[uint64]uint64
	catchupAt    map[uint64]uint64
	catchupTo    map[uint64]uint64
	hbElapsed    int
	checkElapsed int
	active       map[uint64]bool
	hbSeq        uint64
	seqTick      map[uint64]uint64
	ackTick      map[uint64]uint64
	ackSeq       map[uint64]uint64
	reads        []pendingRead
	forceHB      bool

	// output
	snapshot     *SnapshotData
	sendFirst    []Message
	hsDirty      bool
	persist      []Entry
	msgs         []Message
	readsReady   []ReadState
	readsDropped []uint64
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
		conf = hs.Conf.Clone()
	}
	n := &Node{
		cfg:      cfg,
		rng:      rand.New(rand.NewSource(cfg.Seed)),
		promised: hs.Promised,
		maxRound: BallotRound(hs.Promised),
		commit:   max(hs.Commit, hs.Snapshot),
		snap:     hs.Snapshot,
		applied:  hs.Snapshot,
	}
	n.catchupAt = map[uint64]uint64{}
	n.catchupTo = map[uint64]uint64{}
	n.learners = map[uint64]bool{}
	n.learnerAt = map[uint64]uint64{}
	n.confs = []ConfState{conf}
	n.setConf(conf)
	for _, e := range entries {
		if e.Slot == 0 {
			return nil, fmt.Errorf("paxos: restore entry with slot 0: %w", ErrCorruptWAL)
		}
		if e.Epoch == 0 {
			e.Epoch = 1 // records written before configurations existed
		}
		if e.Slot > n.snap {
			n.setEntry(e)
		}
	}
	if n.commit > n.lastSlot() {
		return nil, fmt.Errorf("paxos: restore commit %d beyond last slot %d: %w", n.commit, n.lastSlot(), ErrCorruptWAL)
	}
	for s := n.snap + 1; s <= n.commit; s++ {
		e := n.entry(s).e
		if e.Ballot == 0 {
			return nil, fmt.Errorf("paxos: restore committed slot %d is empty: %w", s, ErrCorruptWAL)
		}
		if e.Type == EntryConfig {
			c, err := DecodeConfState(e.Data)
			if err != nil {
				return nil, fmt.Errorf("paxos: restore configuration at slot %d: %v: %w", s, err, ErrCorruptWAL)
			}
			c.Start = s + 1
			n.confs = append(n.confs, c)
			n.setConf(c)
		}
	}
	// Values accepted past the commit index in an epoch that has since ended are void.
	n.dropStale(n.commit)
	n.quietUntil = uint64(cfg.ElectionTicks)
	n.resetElectionTimeout()
	return n, nil
}

// setConf makes c the configuration used for quorums and membership from now on.
func (n *Node) setConf(c ConfState) {
	n.conf = c
	n.peers = slices.Clone(c.Members)
	slices.Sort(n.peers)
	n.pidx = map[uint64]int{}
	for i, p := range n.peers {
		n.pidx[p] = i
		delete(n.learners, p)
		delete(n.learnerAt, p)
	}
	n.quorum = len(n.peers)/2 + 1
}

// dropStale voids accepted values after slot that belong to an epoch before the current
// one (the epoch they were accepted in ended at or before slot).
func (n *Node) dropStale(after uint64) {
	for s := max(after, n.snap) + 1; s <= n.lastSlot(); s++ {
		if st := n.entry(s); st.e.Ballot != 0 && st.e.Epoch < n.conf.Epoch {
			*st = slotState{}
		}
	}
	for len(n.log) > 0 && n.log[len(n.log)-1].e.Ballot == 0 && n.lastSlot() > n.commit {
		n.log = n.log[:len(n.log)-1]
	}
}

func (n *Node) isMember() bool {
	_, ok := n.pidx[n.cfg.ID]
	return ok
}

// ID returns the replica id.
func (n *Node) ID() uint64 { return n.cfg.ID }

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

// Status returns the current state.
func (n *Node) Status() Status {
	return Status{ID: n.cfg.ID, Role: n.role, Leader: n.leader, Promised: n.promised,
		Commit: n.commit, Applied: n.applied, NextSlot: n.nextSlot,
		Epoch: n.conf.Epoch, Members: slices.Clone(n.conf.Members)}
}

// Leader returns the leader hint (0 when unknown).
func (n *Node) Leader() uint64 { return n.leader }

func (n *Node) resetElectionTimeout() {
	n.electionElapsed = 0
	n.electionTimeout = n.cfg.ElectionTicks + n.rng.Intn(n.cfg.ElectionTicks)
}

func (n *Node) entry(s uint64) *slotState {
	if s <= n.snap || s > n.lastSlot() {
		return nil
	}
	return &n.log[s-n.snap-1]
}

func (n *Node) setEntry(e Entry) *slotState {
	if e.Slot <= n.snap {
		return &slotState{} // compacted: chosen long ago, nothing to record
	}
	for n.lastSlot() < e.Slot {
		n.log = append(n.log, slotState{})
	}
	st := &n.log[e.Slot-n.snap-1]
	st.e = e
	st.acks = 0
	st.chosen = false
	return st
}

func (n *Node) lastSlot() uint64 { return n.snap + uint64(len(n.log)) }

func (n *Node) send(m Message) {
	m.From = n.cfg.ID
	m.Epoch = n.conf.Epoch
	n.msgs = append(n.msgs, m)
}

func (n *Node) setPromised(b uint64) {
	if b > n.promised {
		n.promised = b
		n.hsDirty = true
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
			n.campaign()
		}
	case Leader:
		n.hbElapsed++
		if n.hbElapsed >= n.cfg.HeartbeatTicks {
			n.broadcastHeartbeat()
		}
		n.checkElapsed++
		if n.checkElapsed >= n.cfg.ElectionTicks {
			n.checkElapsed = 0
			if len(n.active)+1 < n.quorum {
				n.stepDown(0)
				return
			}
			n.active = map[uint64]bool{}
		}
	}
}

// Campaign starts phase 1 now (tests and leadership transfer use it).
func (n *Node) Campaign() { n.campaign() }

func (n *Node) campaign() {
	if !n.isMember() {
		return
	}
	round := max(n.maxRound, BallotRound(n.promised)) + 1
	b := MakeBallot(round, n.cfg.ID)
	n.role = Candidate
	n.leader = 0
	n.setPromised(b)
	n.resetElectionTimeout()
	n.prepareFrom = n.commit + 1
	n.promises = map[uint64]Message{}
	n.promises[n.cfg.ID] = Message{Type: MsgPromise, From: n.cfg.ID, Ballot: b, Commit: n.commit, Entries: n.acceptedFrom(n.prepareFrom)}
	if len(n.promises) >= n.quorum {
		n.becomeLeader()
		return
	}
	for _, p := range n.peers {
		if p != n.cfg.ID {
			n.send(Message{Type: MsgPrepare, To: p, Ballot: b, Slot: n.prepareFrom, Commit: n.commit})
		}
	}
}

func (n *Node) acceptedFrom(from uint64) []Entry {
	var out []Entry
	for s := max(from, n.snap+1); s <= n.lastSlot(); s++ {
		if e := n.entry(s).e; e.Ballot != 0 {
			out = append(out, e)
		}
	}
	return out
}

func (n *Node) becomeLeader() {
	n.role = Leader
	n.leader = n.cfg.ID
	b := n.promised
	// Choose per slot the value accepted at the highest ballot among the quorum.
	best := map[uint64]Entry{}
	maxSlot := n.commit
	for _, pm := range n.promises {
		for _, e := range pm.Entries {
			if e.Slot <= n.commit {
				continue
			}
			if cur, ok := best[e.Slot]; !ok || e.Ballot > cur.Ballot {
				best[e.Slot] = e
			}
			maxSlot = max(maxSlot, e.Slot)
		}
	}
	n.promises = nil
	n.unsent = nil
	// A configuration entry ends this epoch at its slot: nothing past it is proposed, and
	// the next configuration starts after it once it is chosen.
	n.stopAt = 0
	for s := n.commit + 1; s <= maxSlot; s++ {
		if e, ok := best[s]; ok && e.Type == EntryConfig {
			n.stopAt = s
			maxSlot = s
			break
		}
	}
	for s := n.commit + 1; s <= maxSlot; s++ {
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
	n.peerCommit = map[uint64]uint64{}
	n.active = map[uint64]bool{}
	n.ackTick = map[uint64]uint64{}
	n.ackSeq = map[uint64]uint64{}
	n.seqTick = map[uint64]uint64{}
	n.reads = nil
	n.hbElapsed = 0
	n.checkElapsed = 0
	n.hbSeq++
	n.seqTick[n.hbSeq] = n.now
	n.maybeCommit()
}

// acceptOwn records the leader's own acceptance of e (persisted with the next Ready,
// before the Accept carrying it is sent).
func (n *Node) acceptOwn(e Entry) {
	st := n.setEntry(e)
	st.sentAt = n.now
	n.persist = append(n.persist, e)
	n.unsent = append(n.unsent, e)
}

// Advance tells the node that rd's entries are durable: the leader now counts its own
// acceptance of them. Call it once per Ready, after persisting it; Readies may be handed
// out before earlier ones are durable, as long as they are persisted and advanced in order.
func (n *Node) Advance(rd Ready) {
	if n.role == Leader {
		bit := uint64(1) << uint(n.pidx[n.cfg.ID])
		for _, e := range rd.Entries {
			st := n.entry(e.Slot)
			if st == nil || st.chosen || st.e.Ballot != n.promised || e.Ballot != n.promised {
				continue
			}
			st.acks |= bit
			if bits.OnesCount64(st.acks) >= n.quorum {
				st.chosen = true
			}
		}
		n.maybeCommit()
	}
}

func (n *Node) stepDown(leaderHint uint64) {
	clear(n.learners)
	clear(n.learnerAt)
	n.role = Follower
	n.leader = leaderHint
	n.promises = nil
	n.unsent = nil
	for _, r := range n.reads {
		n.readsDropped = append(n.readsDropped, r.id)
	}
	n.reads = nil
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

// ProposeConfChange asks the leader to add (add true) or remove replica id, through the
// log: the configuration entry goes in the next free slot s, nothing is proposed after it
// until it is chosen, and the new configuration (epoch+1) governs every slot from s+1.
// addr, for an added replica, is recorded in the configuration for the transports. Only
// one replica changes at a time; while a change is in flight it returns ErrReconfiguring.
// Like Propose, it succeeded if the entry committed at slot is the configuration entry.
func (n *Node) ProposeConfChange(add bool, id uint64, addr string) (slot, ballot uint64, err error) {
	if n.role != Leader {
		return 0, 0, &NotLeaderError{Leader: n.leader}
	}
	if n.stopAt != 0 {
		return 0, 0, ErrReconfiguring
	}
	c := n.conf.Clone()
	c.Epoch++
	c.Start = n.nextSlot + 1
	switch {
	case id == 0 || id > 0xffff:
		return 0, 0, fmt.Errorf("%w: replica id %d must be in [1, 65535]", ErrBadConfChange, id)
	case add && c.Has(id):
		return 0, 0, fmt.Errorf("%w: replica %d is already a member of %v", ErrBadConfChange, id, c.Members)
	case !add && !c.Has(id):
		return 0, 0, fmt.Errorf("%w: replica %d is not a member of %v", ErrBadConfChange, id, c.Members)
	case !add && len(c.Members) == 1:
		return 0, 0, fmt.Errorf("%w: cannot remove the last member %d", ErrBadConfChange, id)
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
	if _, ok := n.pidx[id]; !ok {
		n.learners[id] = true
	}
	return nil
}

// LearnerCommit returns the commit index a learner last reported to this leader.
func (n *Node) LearnerCommit(id uint64) (uint64, bool) {
	c, ok := n.learnerAt[id]
	return c, ok && n.learners[id]
}

// switchConf ends the current epoch at slot, where the configuration entry e was just
// committed, and starts the next one.
func (n *Node) switchConf(slot uint64, e Entry) {
	c, err := DecodeConfState(e.Data)
	if err != nil || len(c.Members) == 0 {
		// Only this package encodes configurations; a bad one means a corrupt log. Keep
		// the current configuration rather than adopt an empty one.
		return
	}
	c.Start = slot + 1
	wasLeader := n.role == Leader
	n.confs = append(n.confs, c)
	n.setConf(c)
	n.stopAt = 0
	n.dropStale(slot)
	if n.lastSlot() > slot {
		n.log = n.log[:slot-n.snap] // values accepted past the entry belonged to the old epoch
	}
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

// ReadIndex asks for a linearizable read point for request id. When the leader's lease
// is valid the read is ready at once; otherwise a heartbeat round confirms leadership
// (read-index). Ready.ReadsReady reports it; Ready.ReadsDropped reports it lost.
func (n *Node) ReadIndex(id uint64) error {
	if n.role != Leader {
		return &NotLeaderError{Leader: n.leader}
	}
	if n.commit >= n.startSlot && n.LeaseValid() {
		n.readsReady = append(n.readsReady, ReadState{ID: id, Index: n.commit})
		return nil
	}
	n.reads = append(n.reads, pendingRead{id: id, seq: n.hbSeq + 1})
	n.forceHB = true
	return nil
}

// LeaseValid reports whether this leader holds a lease: a majority (itself included)
// acknowledged a heartbeat sent less than ElectionTicks-LeaseDriftTicks ticks ago.
func (n *Node) LeaseValid() bool {
	if n.role != Leader {
		return false
	}
	ticks := []uint64{n.now}
	for _, p := range n.peers {
		if p != n.cfg.ID {
			if t, ok := n.ackTick[p]; ok {
				ticks = append(ticks, t)
			}
		}
	}
	if len(ticks) < n.quorum {
		return false
	}
	slices.Sort(ticks)
	slices.Reverse(ticks)
	t := ticks[n.quorum-1]
	return n.now < t+uint64(n.cfg.ElectionTicks)-uint64(min(n.cfg.LeaseDriftTicks, n.cfg.ElectionTicks))
}

func (n *Node) broadcastHeartbeat() {
	n.hbElapsed = 0
	n.hbSeq++
	n.seqTick[n.hbSeq] = n.now
	if len(n.seqTick) > 512 {
		for s := range n.seqTick {
			if s+256 < n.hbSeq {
				delete(n.seqTick, s)
			}
		}
	}
	// Retransmit the oldest undecided run, to the peers that have not acknowledged its
	// first slot, when its Accept may have been lost.
	var resend []Entry
	var acked uint64
	if st := n.entry(n.commit + 1); st != nil && !st.chosen && n.now-st.sentAt >= uint64(max(2*n.cfg.HeartbeatTicks, n.cfg.ElectionTicks/2)) {
		acked = st.acks
		size := 0
		for s := n.commit + 1; s < n.nextSlot && len(resend) < n.cfg.MaxBatch; s++ {
			st := n.entry(s)
			if size += len(st.e.Data); size > n.cfg.MaxBatchBytes && len(resend) > 0 {
				break
			}
			st.sentAt = n.now
			resend = append(resend, st.e)
		}
	}
	for _, p := range n.peers {
		if p != n.cfg.ID {
			m := Message{Type: MsgAccept, To: p, Ballot: n.promised, Commit: n.commit, Seq: n.hbSeq}
			if acked&(1<<uint(n.pidx[p])) == 0 {
				m.Entries = resend
			}
			n.send(m)
		}
	}
	for p := range n.learners {
		n.send(Message{Type: MsgAccept, To: p, Ballot: n.promised, Commit: n.commit})
	}
}

func (n *Node) maybeCommit() {
	for {
		st := n.entry(n.commit + 1)
		if st == nil || !st.chosen {
			break
		}
		n.commit++
		if st.e.Type == EntryConfig {
			n.switchConf(n.commit, st.e)
			return
		}
	}
	n.releaseReads()
}

func (n *Node) releaseReads() {
	if n.role != Leader || len(n.reads) == 0 || n.commit < n.startSlot {
		return
	}
	seqs := []uint64{^uint64(0)}
	for _, p := range n.peers {
		if p != n.cfg.ID {
			seqs = append(seqs, n.ackSeq[p])
		}
	}
	slices.Sort(seqs)
	slices.Reverse(seqs)
	confirmed := seqs[n.quorum-1]
	kept := n.reads[:0]
	for _, r := range n.reads {
		if r.seq <= confirmed {
			n.readsReady = append(n.readsReady, ReadState{ID: r.id, Index: n.commit})
		} else {
			kept = append(kept, r)
		}
	}
	n.reads = kept
}

// Step feeds one received message. Messages not addressed to this replica, from unknown
// replicas, or malformed are ignored (never panic).
func (n *Node) Step(m Message) {
	if m.To != n.cfg.ID || m.From == n.cfg.ID || m.From == 0 || m.From > 0xffff {
		return
	}
	if n.role == Leader && n.learners[m.From] && (m.Type == MsgLearn || (m.Type == MsgAccepted && !m.Reject)) {
		n.learnerAt[m.From] = max(n.learnerAt[m.From], m.Commit) // a learner's progress
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
			n.send(Message{Type: MsgLearn, To: m.From, Commit: n.commit})
		} else {
			n.maybeCatchUp(m.From, m.Commit)
		}
		return
	}
	_, fromMember := n.pidx[m.From]
	if !n.isMember() {
		// Not a voter (a learner, or removed): answer a leader's Accept with our commit
		// index only, so it can catch us up; never promise or accept.
		if m.Type == MsgAccept && fromMember {
			n.send(Message{Type: MsgAccepted, To: m.From, Ballot: m.Ballot, Commit: n.commit, KnownCommit: m.Commit})
		}
		return
	}
	if !fromMember {
		if m.Type == MsgAccepted && n.role == Leader && n.learners[m.From] && !m.Reject {
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
	case MsgChosen:
		n.onChosen(m)
	case MsgSnapshot:
		n.onSnapshot(m)
	}
}

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
	n.resetElectionTimeout()
	n.send(Message{Type: MsgPromise, To: m.From, Ballot: m.Ballot, Slot: m.Slot, Commit: n.commit, Last: n.snap, Entries: n.acceptedFrom(m.Slot)})
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
	n.promises[m.From] = m
	if len(n.promises) >= n.quorum {
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
	var first, last uint64
	for i, e := range m.Entries {
		if e.Slot == 0 {
			continue
		}
		if i == 0 {
			first = e.Slot
		}
		last = e.Slot
		if e.Slot <= n.commit {
			continue
		}
		if st := n.entry(e.Slot); st != nil && st.e.Ballot == m.Ballot {
			continue // a retransmission: already durable at this ballot
		}
		e.Ballot = m.Ballot
		e.Epoch = m.Epoch
		n.setEntry(e)
		n.persist = append(n.persist, e)
	}
	for n.commit < m.Commit {
		st := n.entry(n.commit + 1)
		if st == nil || st.e.Ballot != m.Ballot {
			break
		}
		n.commit++
		if st.e.Type == EntryConfig {
			n.switchConf(n.commit, st.e)
			break
		}
	}
	n.send(Message{Type: MsgAccepted, To: m.From, Ballot: m.Ballot, Slot: first, Last: last, Commit: n.commit, Seq: m.Seq, KnownCommit: m.Commit})
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
		n.active[m.From] = true
		if m.Seq > n.ackSeq[m.From] {
			n.ackSeq[m.From] = m.Seq
			if t, ok := n.seqTick[m.Seq]; ok && t >= n.ackTick[m.From] {
				n.ackTick[m.From] = t
			}
		}
	}
	if m.Commit > n.peerCommit[m.From] {
		n.peerCommit[m.From] = m.Commit
	}
	bit := uint64(1) << uint(n.pidx[m.From])
	if m.Slot > 0 && m.Last >= m.Slot {
		for s := m.Slot; s <= m.Last; s++ {
			st := n.entry(s)
			if st == nil || st.chosen || st.e.Ballot != n.promised {
				continue
			}
			st.acks |= bit
			if bits.OnesCount64(st.acks) >= n.quorum {
				st.chosen = true
			}
		}
	}
	n.maybeCommit()
	if m.Commit < m.KnownCommit {
		n.maybeCatchUp(m.From, m.Commit)
	}
}

func (n *Node) maybeCatchUp(peer, peerCommit uint64) {
	if peerCommit >= n.commit {
		return
	}
	if peerCommit < n.snap {
		// The values it lacks are compacted: the driver attaches the snapshot.
		if n.catchupTo[peer] >= n.snap && n.now-n.catchupAt[peer] < uint64(n.cfg.ElectionTicks) {
			return
		}
		n.catchupTo[peer] = n.snap
		n.catchupAt[peer] = n.now
		n.send(Message{Type: MsgSnapshot, To: peer, Ballot: n.promised, Slot: n.snap, Commit: n.commit})
		return
	}
	// One catch-up batch in flight per peer; resend after an election timeout.
	if n.catchupTo[peer] > peerCommit && n.now-n.catchupAt[peer] < uint64(n.cfg.ElectionTicks) {
		return
	}
	to := min(n.commit, peerCommit+uint64(n.cfg.MaxBatch))
	ents := make([]Entry, 0, to-peerCommit)
	size := 0
	for s := peerCommit + 1; s <= to; s++ {
		e := n.entry(s).e
		if size += len(e.Data); size > n.cfg.MaxBatchBytes && len(ents) > 0 {
			to = s - 1
			break
		}
		ents = append(ents, e)
	}
	n.catchupTo[peer] = to
	n.catchupAt[peer] = n.now
	n.send(Message{Type: MsgChosen, To: peer, Ballot: n.promised, Commit: n.commit, Entries: ents})
}

func (n *Node) onChosen(m Message) {
	for _, e := range m.Entries {
		if e.Slot != n.commit+1 {
			continue
		}
		b := max(m.Ballot, e.Ballot)
		if st := n.entry(e.Slot); st != nil && st.e.Ballot > b {
			b = st.e.Ballot
		}
		e.Ballot = b
		if e.Epoch == 0 {
			e.Epoch = max(n.conf.Epoch, 1)
		}
		n.setEntry(e)
		n.persist = append(n.persist, e)
		n.commit++
		if e.Type == EntryConfig {
			n.switchConf(n.commit, e)
		}
	}
	n.send(Message{Type: MsgAccepted, To: m.From, Ballot: m.Ballot, Commit: n.commit, KnownCommit: m.Commit})
}

// HasReady reports whether Ready would return a non-empty batch.
func (n *Node) HasReady() bool {
	return n.hsDirty || n.snapshot != nil || len(n.persist) > 0 || len(n.msgs) > 0 || len(n.sendFirst) > 0 || n.commit > n.applied ||
		len(n.readsReady) > 0 || len(n.readsDropped) > 0 || (n.role == Leader && (len(n.unsent) > 0 || n.forceHB))
}

// Ready returns the pending work and clears it. The caller owns the returned slices;
// entry data is shared with the node and must not be modified.
func (n *Node) Ready() Ready {
	if n.role == Leader {
		if len(n.unsent) > 0 {
			n.flushAccepts()
		} else if n.forceHB {
			n.broadcastHeartbeat()
		}
		n.forceHB = false
	}
	rd := Ready{
		HardState:   HardState{Promised: n.promised, Commit: n.commit, Snapshot: n.snap},
		Entries:     n.persist,
		SendFirst:   n.sendFirst,
		MustPersist: n.hsDirty || len(n.persist) > 0,
		Messages:    n.msgs,
		ReadsReady:  n.readsReady,
	}
	rd.ReadsDropped = n.readsDropped
	rd.Snapshot = n.snapshot
	n.snapshot = nil
	if n.commit > n.applied {
		rd.Committed = make([]Entry, 0, n.commit-n.applied)
		for s := n.applied + 1; s <= n.commit; s++ {
			rd.Committed = append(rd.Committed, n.entry(s).e)
		}
		n.applied = n.commit
	}
	n.hsDirty = false
	n.persist = nil
	n.sendFirst = nil
	n.msgs = nil
	n.readsReady = nil
	n.readsDropped = nil
	return rd
}

// flushAccepts sends the batched new entries to every peer, split into contiguous runs
// of at most MaxBatch entries (an Accepted acknowledges a contiguous range).
func (n *Node) flushAccepts() {
	// A heartbeat sequence number on the batch lets its acknowledgement extend the lease.
	n.hbSeq++
	n.seqTick[n.hbSeq] = n.now
	n.hbElapsed = 0
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
	for _, p := range n.peers {
		if p == n.cfg.ID {
			continue
		}
		for _, r := range runs {
			n.sendFirst = append(n.sendFirst, Message{Type: MsgAccept, From: n.cfg.ID, To: p, Ballot: n.promised, Commit: n.commit, Entries: r, Seq: n.hbSeq, Epoch: n.conf.Epoch})
		}
	}
	n.unsent = nil
}

// Compact drops the log through slot, which the caller's state machine snapshot covers
// (the snapshot must be durable first). slot must not exceed the applied index.
func (n *Node) Compact(slot uint64) error {
	if slot > n.applied {
		return fmt.Errorf("paxos: compact through %d beyond applied %d", slot, n.applied)
	}
	if slot <= n.snap {
		return nil
	}
	n.log = append([]slotState(nil), n.log[slot-n.snap:]...)
	n.snap = slot
	return nil
}

// Compacted returns the slot through which the log is compacted.
func (n *Node) Compacted() uint64 { return n.snap }

func (n *Node) onSnapshot(m Message) {
	if m.Slot > n.commit && m.Snapshot != nil {
		if m.Slot >= n.lastSlot() {
			n.log = nil
		} else {
			n.log = append([]slotState(nil), n.log[m.Slot-n.snap:]...)
		}
		n.snap = m.Slot
		n.commit = m.Slot
		n.applied = m.Slot
		n.snapshot = &SnapshotData{Slot: m.Slot, Data: m.Snapshot, Conf: m.Conf.Clone()}
		n.hsDirty = true
		if m.Conf.Epoch > 0 && m.Conf.Epoch != n.conf.Epoch {
			// The snapshot crosses configuration changes: adopt its configuration.
			n.confs = []ConfState{m.Conf.Clone()}
			n.setConf(m.Conf.Clone())
			n.stopAt = 0
			n.dropStale(m.Slot)
			if n.role != Follower {
				n.stepDown(0)
			}
		} else {
			n.confs = []ConfState{n.ConfAt(m.Slot)}
		}
	}
	n.send(Message{Type: MsgAccepted, To: m.From, Ballot: m.Ballot, Commit: n.commit, KnownCommit: m.Commit})
}
