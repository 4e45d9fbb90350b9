package paxos

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/atoll-run/atoll/proto/paxospb"
	"google.golang.org/protobuf/proto"
)

// Sentinel errors of the paxos package. Retryable ones are marked.
var (
	// ErrNotLeader is returned when a proposal or read reaches a replica that is not the
	// leader. The driver wraps it in a *NotLeaderError carrying the leader hint. Retryable.
	ErrNotLeader = errors.New("paxos: not leader")
	// ErrProposalDropped means the proposal's slot was filled by another leader's value:
	// it was not applied. Retryable (with a deduplicating request id above).
	ErrProposalDropped = errors.New("paxos: proposal dropped")
	// ErrStopped is returned by a replica that has been shut down.
	ErrStopped = errors.New("paxos: replica stopped")
	// ErrInvalidConfig is wrapped by Config.Validate.
	ErrInvalidConfig = errors.New("paxos: invalid config")
	// ErrCorruptWAL is returned when a WAL record other than the tail fails its checksum.
	ErrCorruptWAL = errors.New("paxos: corrupt wal")
	// ErrLocked is returned by OpenWAL when another WAL (in this process or another) has
	// the directory open; the error names the directory and, when known, the holder's pid.
	ErrLocked = errors.New("paxos: data directory in use")
	// ErrReconfiguring is returned by a leader asked to propose while a configuration
	// change it holds is not yet chosen: nothing is proposed past a configuration entry
	// (the next configuration starts at the slot after it). Retryable.
	ErrReconfiguring = errors.New("paxos: reconfiguration in progress")
	// ErrBadConfChange is returned for a membership change that is not exactly one
	// replica added or removed, or that would leave the group empty.
	ErrBadConfChange = errors.New("paxos: bad configuration change")
	// ErrLearnerBehind is returned by AddReplica when the replica being added did not catch
	// up with the log before the deadline: it is unreachable, not started with Config.Join,
	// or slower than the log grows. The group is unchanged.
	ErrLearnerBehind = errors.New("paxos: replica being added did not catch up")
	// ErrHandshake is logged (rate-limited, never returned to a caller) when a transport
	// connection fails its authentication: the two ends hold different cluster tokens, or
	// one does not know the other's id.
	ErrHandshake = errors.New("paxos: handshake failed")
	// ErrBadFrame is logged (never returned to a caller) for truncated, oversized or
	// unauthenticated transport frames.
	ErrBadFrame = errors.New("paxos: bad frame")
	// ErrDiskFull is returned by a replica whose storage is full (ENOSPC, EDQUOT) while it
	// waits for space: it has stepped down, and it rejoins by itself once it can write again
	// (diskfull.go). A proposal it was waiting on when the disk filled has an unknown
	// outcome (its value may still be chosen by the others). Retryable, at another replica.
	ErrDiskFull = errors.New("paxos: disk full")
)

// NotLeaderError is ErrNotLeader with the ID of the replica believed to lead (0 if unknown).
type NotLeaderError struct {
	// Leader is the hint: the replica that last led, or 0 when none is known.
	Leader uint64
}

// Error implements error.
func (e *NotLeaderError) Error() string {
	return fmt.Sprintf("paxos: not leader (leader hint %d)", e.Leader)
}

// Unwrap lets errors.Is(err, ErrNotLeader) hold.
func (e *NotLeaderError) Unwrap() error { return ErrNotLeader }

// IsRetryable reports whether err is a transient condition (no leader, lost leadership,
// dropped proposal, a full disk) after which the same request may be retried.
func IsRetryable(err error) bool {
	return errors.Is(err, ErrNotLeader) || errors.Is(err, ErrProposalDropped) || errors.Is(err, ErrReconfiguring) || errors.Is(err, ErrDiskFull)
}

// EntryType says what an entry's data means.
type EntryType uint32

// Entry types.
const (
	// EntryNormal carries application data.
	EntryNormal EntryType = 0
	// EntryNoop fills a hole left by a previous leader or marks a leader's start.
	EntryNoop EntryType = 1
	// EntryConfig carries a new configuration (an encoded ConfState): when chosen at slot i
	// it ends the current epoch at i, and the next epoch, with its members, starts at i+1.
	EntryConfig EntryType = 2
)

// ConfState is a group configuration: the voting members for every slot from Start on,
// in configuration epoch Epoch. Epoch 1 starts at slot 1 with Config.Peers; a configuration
// entry chosen at slot i starts epoch e+1 at slot i+1. Epoch 0 means "not known yet" (a
// replica started with Config.Join that has not learned the log).
type ConfState struct {
	// Epoch numbers configurations from 1.
	Epoch uint64
	// Start is the first slot of the epoch.
	Start uint64
	// Members are the voting replica ids, sorted.
	Members []uint64
	// Addrs maps members to transport addresses, when the change that added them gave one.
	Addrs map[uint64]string
}

// Has reports whether id is a voting member.
func (c ConfState) Has(id uint64) bool { return slices.Contains(c.Members, id) }

// Clone returns a deep copy.
func (c ConfState) Clone() ConfState {
	c.Members = slices.Clone(c.Members)
	c.Addrs = maps.Clone(c.Addrs)
	return c
}

// EncodeConfState encodes a configuration (the data of an EntryConfig entry).
func EncodeConfState(c ConfState) []byte {
	b, _ := proto.Marshal(toPBConf(c))
	return b
}

// DecodeConfState decodes the data of an EntryConfig entry.
func DecodeConfState(b []byte) (ConfState, error) {
	var p paxospb.ConfState
	if err := proto.Unmarshal(b, &p); err != nil {
		return ConfState{}, fmt.Errorf("paxos: decode configuration: %w", err)
	}
	return fromPBConf(&p), nil
}

func toPBConf(c ConfState) *paxospb.ConfState {
	return &paxospb.ConfState{Epoch: c.Epoch, Start: c.Start, Members: c.Members, Addrs: c.Addrs}
}

func fromPBConf(p *paxospb.ConfState) ConfState {
	if p == nil {
		return ConfState{}
	}
	c := ConfState{Epoch: p.Epoch, Start: p.Start, Members: slices.Clone(p.Members), Addrs: maps.Clone(p.Addrs)}
	slices.Sort(c.Members)
	return c
}

// Entry is a value in one log slot, accepted at Ballot.
type Entry struct {
	// Slot is the log position (from 1).
	Slot uint64
	// Ballot is the ballot at which this acceptor accepted the value.
	Ballot uint64
	// Type says whether Data is application data, a no-op or a configuration.
	Type EntryType
	// Epoch is the configuration epoch in which the value was accepted.
	Epoch uint64
	// Data is the proposed value (the state machine command).
	Data []byte
}

// MsgType is the kind of a Message.
type MsgType uint32

// Message types.
const (
	// MsgPrepare is phase 1a: Ballot, Slot = first slot the candidate has not seen chosen.
	MsgPrepare MsgType = iota + 1
	// MsgPromise is phase 1b: Entries = the acceptor's accepted entries from Slot on,
	// Commit = its commit index; Reject with Promised when the ballot is too low.
	MsgPromise
	// MsgAccept is phase 2a (and the heartbeat when Entries is empty): Commit = leader's
	// commit index, Seq = heartbeat sequence for leases and read-index.
	MsgAccept
	// MsgAccepted is phase 2b: Slot..Last accepted at Ballot, Commit = acceptor's commit,
	// Seq echoes the Accept's; Reject with Promised when the ballot is too low.
	MsgAccepted
	// MsgChosen is catch-up: Entries are chosen values for the receiver to adopt.
	MsgChosen
	// MsgSnapshot is catch-up past a compacted log: Snapshot is the state machine
	// snapshot through Slot (the core emits it empty; the driver attaches the bytes).
	MsgSnapshot
	// MsgLearn asks the receiver for the chosen values after Commit: the sender found
	// itself in an older configuration epoch than a message it received.
	MsgLearn
)

func (t MsgType) String() string {
	switch t {
	case MsgPrepare:
		return "prepare"
	case MsgPromise:
		return "promise"
	case MsgAccept:
		return "accept"
	case MsgAccepted:
		return "accepted"
	case MsgChosen:
		return "chosen"
	case MsgSnapshot:
		return "snapshot"
	case MsgLearn:
		return "learn"
	}
	return fmt.Sprintf("msg(%d)", uint32(t))
}

// Message is a Paxos message between replicas.
type Message struct {
	// Type is the message kind; the other fields' meaning is given per MsgType.
	Type MsgType
	// From and To are replica ids.
	From, To uint64
	// Ballot is the sender's ballot (or the ballot a reply answers).
	Ballot uint64
	// Slot is the first slot concerned (Prepare, Accepted, Snapshot).
	Slot uint64
	// Last is the last slot acknowledged (Accepted) or the acceptor's compaction point (Promise).
	Last uint64
	// Commit is the sender's commit index.
	Commit uint64
	// Entries are accepted (Promise), proposed (Accept) or chosen (Chosen) values.
	Entries []Entry
	// Reject marks a refused Prepare or Accept; Promised then names the higher ballot.
	Reject bool
	// Promised is the acceptor's promised ballot on a rejection.
	Promised uint64
	// Seq is the leader's heartbeat sequence (leases, read-index), echoed by Accepted.
	Seq uint64
	// KnownCommit, on an Accepted, echoes the commit index of the message it answers: an
	// acceptor whose Commit stays below it lacks chosen values and needs catch-up.
	KnownCommit uint64
	// Snapshot carries state machine snapshot bytes on a MsgSnapshot.
	Snapshot []byte
	// Epoch is the sender's configuration epoch; Prepare, Promise, Accept and Accepted
	// are only acted on within one epoch.
	Epoch uint64
	// Conf is the configuration at Slot on a MsgSnapshot (the core leaves it empty; the
	// driver attaches it with the snapshot bytes).
	Conf ConfState
}

// SnapshotData is a state machine snapshot covering every slot through Slot.
type SnapshotData struct {
	// Slot is the last slot the snapshot covers.
	Slot uint64
	// Data is the state machine's snapshot.
	Data []byte
	// Conf is the configuration in effect after Slot.
	Conf ConfState
}

// HardState is what a replica must persist besides entries.
type HardState struct {
	// Promised is the highest ballot this acceptor promised.
	Promised uint64
	// Commit is the highest slot known chosen with all slots below it.
	Commit uint64
	// Snapshot is the slot through which the log is compacted into a snapshot (restore
	// only: Storage.Load reports it; the node ignores it on Save).
	Snapshot uint64
	// Conf is the configuration at the snapshot (restore only, like Snapshot).
	Conf ConfState
}

// Ready is one batch of work handed out by Node.Ready. The driver may send SendFirst at
// once and may apply Committed at once (those values are chosen by a durable majority);
// it must persist HardState and Entries (fsync per policy) BEFORE sending Messages, and
// then call Node.Advance(rd). Readies are persisted and advanced in the order handed out.
type Ready struct {
	// HardState to persist when MustPersist.
	HardState HardState
	// Entries accepted since the last Ready; persist (overwriting by slot).
	Entries []Entry
	// MustPersist is true when the promised ballot or Entries changed. A change of the
	// commit index alone does not require a write: it is recoverable, and is written with
	// the next record.
	MustPersist bool
	// SendFirst are the leader's Accepts: they may be sent before persisting (the leader
	// counts its own acceptance only at Advance, after the write), so the leader's fsync
	// overlaps the followers'.
	SendFirst []Message
	// Messages to send after persisting.
	Messages []Message
	// Committed are newly chosen entries, contiguous, in slot order, to apply.
	Committed []Entry
	// ReadsReady lists read-index requests (ids from Node.ReadIndex) whose index is now
	// confirmed; each may be served once the applied index reaches ReadState.Index.
	ReadsReady []ReadState
	// Snapshot, when set, is a snapshot received from the leader: persist it (before
	// Messages), restore the state machine from it, then apply Committed after it.
	Snapshot *SnapshotData
	// ReadsDropped lists read-index requests lost because this replica stopped leading;
	// the caller should retry them (ErrNotLeader).
	ReadsDropped []uint64
}

// ReadState is a confirmed read index for a read request.
type ReadState struct {
	// ID is the caller's request id given to Node.ReadIndex.
	ID uint64
	// Index is the commit index the read must wait to have applied.
	Index uint64
}

// Empty reports whether the Ready carries nothing.
func (r *Ready) Empty() bool {
	return !r.MustPersist && len(r.Messages) == 0 && len(r.SendFirst) == 0 && len(r.Committed) == 0 && len(r.ReadsReady) == 0 && len(r.ReadsDropped) == 0 && r.Snapshot == nil
}

// MakeBallot builds a ballot from a round and a replica id (ids below 2^16).
func MakeBallot(round, id uint64) uint64 { return round<<16 | (id & 0xffff) }

// BallotRound returns the round of a ballot.
func BallotRound(b uint64) uint64 { return b >> 16 }

// BallotNode returns the replica id that owns a ballot.
func BallotNode(b uint64) uint64 { return b & 0xffff }
