package paxos

import (
	"errors"
	"slices"
	"testing"
)

func confEntry(slot, ballot, epoch uint64, members ...uint64) Entry {
	return Entry{Slot: slot, Ballot: ballot, Epoch: epoch, Type: EntryConfig,
		Data: EncodeConfState(ConfState{Epoch: epoch + 1, Start: slot + 1, Members: members})}
}

// nodeInEpoch2 restores replica 1 of {1,2,3} with a configuration entry committed at slot
// 2 (epoch 2: {1,2,3,4}) and, past it, a value accepted in epoch 1 (void).
func nodeInEpoch2(t *testing.T) *Node {
	t.Helper()
	b := MakeBallot(1, 2)
	ents := []Entry{
		{Slot: 1, Ballot: b, Epoch: 1, Type: EntryNoop},
		confEntry(2, b, 1, 1, 2, 3, 4),
		{Slot: 3, Ballot: b, Epoch: 1, Data: []byte("stale")},
	}
	n, err := NewNode(DefaultConfig(1, []uint64{1, 2, 3}), HardState{Promised: b, Commit: 2}, ents)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestConfRestoreReplaysConfigurationAndVoidsStaleValues(t *testing.T) {
	n := nodeInEpoch2(t)
	if c := n.Conf(); c.Epoch != 2 || c.Start != 3 || !slices.Equal(c.Members, []uint64{1, 2, 3, 4}) {
		t.Fatalf("conf after restore %+v", c)
	}
	if n.log.last() != 2 {
		t.Fatalf("value accepted in epoch 1 past the configuration entry kept (last slot %d)", n.log.last())
	}
	if got := n.ConfAt(1); got.Epoch != 1 || !slices.Equal(got.Members, []uint64{1, 2, 3}) {
		t.Fatalf("ConfAt(1) = %+v, want epoch 1 {1,2,3}", got)
	}
	if got := n.ConfAt(2); got.Epoch != 2 {
		t.Fatalf("ConfAt(2) = %+v, want epoch 2", got)
	}
}

// Messages of another epoch are never acted on: an older sender is taught the log, a newer
// one is asked to teach.
func TestConfEpochGate(t *testing.T) {
	high := MakeBallot(9, 2)
	cases := []struct {
		name     string
		msg      Message
		wantType MsgType
		persists bool
	}{
		{"stale-epoch accept with a higher ballot", Message{Type: MsgAccept, From: 2, To: 1, Epoch: 1, Ballot: high, Commit: 1,
			Entries: []Entry{{Slot: 3, Data: []byte("x")}}}, MsgChosen, false},
		{"stale-epoch prepare", Message{Type: MsgPrepare, From: 3, To: 1, Epoch: 1, Ballot: high, Slot: 2, Commit: 1}, MsgChosen, false},
		{"newer-epoch prepare", Message{Type: MsgPrepare, From: 3, To: 1, Epoch: 3, Ballot: high, Slot: 5, Commit: 4}, MsgLearn, false},
		{"newer-epoch accept", Message{Type: MsgAccept, From: 4, To: 1, Epoch: 3, Ballot: high, Commit: 4,
			Entries: []Entry{{Slot: 5, Data: []byte("y")}}}, MsgLearn, false},
		{"same-epoch accept", Message{Type: MsgAccept, From: 4, To: 1, Epoch: 2, Ballot: MakeBallot(9, 4), Commit: 2,
			Entries: []Entry{{Slot: 3, Data: []byte("z")}}}, MsgAccepted, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			n := nodeInEpoch2(t)
			n.Ready()
			n.Step(tc.msg)
			rd := n.Ready()
			if (len(rd.Entries) > 0) != tc.persists {
				t.Fatalf("persisted %v, want persist=%v", rd.Entries, tc.persists)
			}
			if tc.persists && rd.Entries[0].Epoch != 2 {
				t.Fatalf("accepted entry tagged epoch %d, want 2", rd.Entries[0].Epoch)
			}
			if len(rd.Messages) != 1 || rd.Messages[0].Type != tc.wantType || rd.Messages[0].To != tc.msg.From {
				t.Fatalf("replies %+v, want one %v to %d", rd.Messages, tc.wantType, tc.msg.From)
			}
			if rd.Messages[0].Epoch != 2 {
				t.Fatalf("reply epoch %d, want 2", rd.Messages[0].Epoch)
			}
			if n.Status().Promised >= high && !tc.persists {
				t.Fatalf("promised a ballot from another epoch")
			}
		})
	}
}

// A follower's commit index stops at a configuration entry: the slots after it in the
// same message belong to the ended epoch and are voided.
func TestConfCommitStopsAtConfigurationEntry(t *testing.T) {
	n, err := NewNode(DefaultConfig(2, []uint64{1, 2, 3}), HardState{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	b := MakeBallot(1, 1)
	n.Step(Message{Type: MsgAccept, From: 1, To: 2, Epoch: 1, Ballot: b, Commit: 3, Entries: []Entry{
		{Slot: 1, Type: EntryNoop}, confEntry(2, 0, 1, 1, 2), {Slot: 3, Data: []byte("after")}}})
	rd := n.Ready()
	if st := n.Status(); st.Commit != 2 || st.Epoch != 2 || !slices.Equal(st.Members, []uint64{1, 2}) {
		t.Fatalf("status %+v: want commit 2, epoch 2, members [1 2]", st)
	}
	if len(rd.Committed) != 2 || rd.Committed[1].Type != EntryConfig {
		t.Fatalf("committed %+v", rd.Committed)
	}
	if n.log.last() != 2 {
		t.Fatalf("slot 3 of the ended epoch kept (last slot %d)", n.log.last())
	}
}

func TestProposeConfChangeValidation(t *testing.T) {
	h := newHarness(t, 3, nil)
	h.elect(1)
	l := h.nodes[1]
	if l.Status().Role != Leader {
		t.Fatal("no leader")
	}
	cases := []struct {
		name string
		add  bool
		id   uint64
		want error
	}{
		{"add a member", true, 2, ErrBadConfChange},
		{"remove a non-member", false, 7, ErrBadConfChange},
		{"id zero", true, 0, ErrBadConfChange},
		{"id too large", true, 70000, ErrBadConfChange},
	}
	for _, tc := range cases {
		if _, _, err := l.ProposeConfChange(tc.add, tc.id, ""); !errors.Is(err, tc.want) {
			t.Fatalf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	if _, _, err := h.nodes[2].ProposeConfChange(true, 4, ""); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("follower: %v, want ErrNotLeader", err)
	}
	if _, _, err := l.ProposeConfChange(false, 3, ""); err != nil {
		t.Fatal(err)
	}
	// One change at a time, and nothing proposed past the configuration entry.
	if _, _, err := l.ProposeConfChange(false, 2, ""); !errors.Is(err, ErrReconfiguring) {
		t.Fatalf("second change in flight: %v, want ErrReconfiguring", err)
	}
	if _, _, err := l.Propose([]byte("x")); !errors.Is(err, ErrReconfiguring) || !IsRetryable(err) {
		t.Fatalf("propose during a change: %v, want retryable ErrReconfiguring", err)
	}
	h.settle()
	for _, id := range []uint64{1, 2} {
		if st := h.nodes[id].Status(); st.Epoch != 2 || !slices.Equal(st.Members, []uint64{1, 2}) {
			t.Fatalf("node %d status %+v after removing 3", id, st)
		}
	}
	// Removing down to one member works; removing the last does not.
	for i := 0; i < 100 && h.leader() == 0; i++ {
		h.tick(1)
	}
	l = h.nodes[h.leader()]
	other := uint64(3) - l.ID()
	if _, _, err := l.ProposeConfChange(false, other, ""); err != nil {
		t.Fatal(err)
	}
	h.settle()
	for i := 0; i < 100 && (h.leader() == 0 || h.nodes[h.leader()].Status().Epoch != 3); i++ {
		h.tick(1)
	}
	l = h.nodes[h.leader()]
	if _, _, err := l.ProposeConfChange(false, l.ID(), ""); !errors.Is(err, ErrBadConfChange) {
		t.Fatalf("removing the last member: %v, want ErrBadConfChange", err)
	}
	if _, _, err := l.Propose([]byte("alone")); err != nil {
		t.Fatalf("a one-member group commits: %v", err)
	}
}
