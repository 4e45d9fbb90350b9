package paxos

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// net is a lossless synchronous harness: deliver every message until quiet, except on
// cut links.
type harness struct {
	t     *testing.T
	nodes map[uint64]*Node
	ids   []uint64
	cut   map[uint64]bool // isolated nodes
	log   map[uint64][]Entry
	sent  []Message
}

func newHarness(t *testing.T, n int, restore map[uint64][]Entry) *harness {
	h := &harness{t: t, nodes: map[uint64]*Node{}, cut: map[uint64]bool{}, log: map[uint64][]Entry{}}
	for i := 1; i <= n; i++ {
		h.ids = append(h.ids, uint64(i))
	}
	for _, id := range h.ids {
		cfg := DefaultConfig(id, h.ids)
		var hs HardState
		for _, e := range restore[id] {
			hs.Promised = max(hs.Promised, e.Ballot)
		}
		nd, err := NewNode(cfg, hs, restore[id])
		if err != nil {
			t.Fatal(err)
		}
		h.nodes[id] = nd
	}
	return h
}

// outbox advances node id past its Readies (recording what it committed) and returns the
// messages they send, in order.
func (h *harness) outbox(id uint64) []Message {
	var msgs []Message
	n := h.nodes[id]
	for n.HasReady() {
		rd := n.Ready()
		msgs = append(msgs, rd.SendFirst...)
		msgs = append(msgs, rd.Messages...)
		n.Advance(rd)
		h.log[id] = append(h.log[id], rd.Committed...)
	}
	return msgs
}

func (h *harness) settle() {
	for round := 0; round < 1000; round++ {
		var msgs []Message
		for _, id := range h.ids {
			msgs = append(msgs, h.outbox(id)...)
		}
		h.sent = append(h.sent, msgs...)
		if len(msgs) == 0 {
			return
		}
		for _, m := range msgs {
			if h.cut[m.From] || h.cut[m.To] {
				continue
			}
			h.nodes[m.To].Step(m)
		}
	}
	h.t.Fatal("harness did not settle")
}

func (h *harness) tick(n int) {
	for i := 0; i < n; i++ {
		for _, id := range h.ids {
			h.nodes[id].Tick()
		}
		h.settle()
	}
}

func (h *harness) leader() uint64 {
	var l uint64
	for _, id := range h.ids {
		if h.nodes[id].role == Leader && !h.cut[id] {
			if l != 0 {
				h.t.Fatalf("two connected leaders: %d and %d", l, id)
			}
			l = id
		}
	}
	return l
}

func (h *harness) elect(id uint64) {
	for _, n := range h.nodes {
		n.quietUntil = 0 // as if the restart quiet period had passed
	}
	for try := 0; try < 3 && h.nodes[id].role != Leader; try++ {
		h.nodes[id].Campaign() // a rejection teaches it a higher round
		h.settle()
	}
	if h.nodes[id].role != Leader {
		h.t.Fatalf("node %d did not win (role %v)", id, h.nodes[id].role)
	}
}

func data(es []Entry) []string {
	var out []string
	for _, e := range es {
		if e.Type == EntryNoop {
			out = append(out, "noop")
		} else {
			out = append(out, string(e.Data))
		}
	}
	return out
}

func TestElectionAndBatching(t *testing.T) {
	h := newHarness(t, 3, nil)
	h.tick(40)
	l := h.leader()
	if l == 0 {
		t.Fatal("no leader after 40 ticks")
	}
	// A follower refuses proposals with the leader hint.
	f := h.ids[0]
	if f == l {
		f = h.ids[1]
	}
	_, _, err := h.nodes[f].Propose([]byte("x"))
	var nl *NotLeaderError
	if !errors.As(err, &nl) || nl.Leader != l {
		t.Fatalf("follower propose: %v", err)
	}
	// Ten proposals between two Readies go out as one Accept per peer.
	for i := 0; i < 10; i++ {
		if _, _, err := h.nodes[l].Propose([]byte(fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	rd := h.nodes[l].Ready()
	if len(rd.SendFirst) != 2 || len(rd.SendFirst[0].Entries) != 10 {
		t.Fatalf("want 2 accepts of 10 entries, got %d messages", len(rd.SendFirst))
	}
	if len(rd.Entries) != 10 || !rd.MustPersist {
		t.Fatalf("leader must persist its 10 entries, got %d", len(rd.Entries))
	}
	for _, m := range rd.SendFirst {
		h.nodes[m.To].Step(m)
	}
	h.nodes[l].Advance(rd)
	h.settle()
	h.tick(2)
	for _, id := range h.ids {
		got := data(h.log[id])
		if len(got) != 11 || got[0] != "noop" || got[10] != "9" {
			t.Fatalf("node %d log %v", id, got)
		}
	}
}

func TestNewLeaderRecoversValues(t *testing.T) {
	b1, b2 := MakeBallot(1, 1), MakeBallot(2, 2)
	cases := []struct {
		name    string
		restore map[uint64][]Entry
		want    []string
	}{
		{"hole-filled-with-noop", map[uint64][]Entry{
			2: {{Slot: 1, Ballot: b1, Data: []byte("a")}, {Slot: 3, Ballot: b1, Data: []byte("c")}},
		}, []string{"a", "noop", "c", "noop"}},
		{"highest-ballot-wins", map[uint64][]Entry{
			1: {{Slot: 1, Ballot: b1, Data: []byte("x")}},
			2: {{Slot: 1, Ballot: b2, Data: []byte("y")}},
		}, []string{"y", "noop"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, 3, tc.restore)
			h.cut[1] = true // quorum {2,3} must suffice
			h.elect(3)
			h.tick(2)
			got := data(h.log[3])
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("chosen %v, want %v", got, tc.want)
			}
		})
	}
}

func TestIsolatedLeaderCannotCommitAndCatchesUp(t *testing.T) {
	h := newHarness(t, 3, nil)
	h.elect(1)
	h.cut[1] = true
	if _, _, err := h.nodes[1].Propose([]byte("lost")); err != nil {
		t.Fatal(err)
	}
	h.tick(30) // node 1 steps down (check-quorum); 2 or 3 takes over
	if h.nodes[1].role == Leader {
		t.Fatal("isolated leader still leads")
	}
	l := h.leader()
	if l == 0 || l == 1 {
		t.Fatalf("leader %d", l)
	}
	for i := 0; i < 50; i++ {
		h.nodes[l].Propose([]byte(fmt.Sprint("v", i)))
	}
	h.settle()
	h.tick(2)
	if h.nodes[1].log.commit != 1 {
		t.Fatalf("isolated node committed to %d", h.nodes[1].log.commit)
	}
	delete(h.cut, 1)
	h.tick(5)
	if h.nodes[1].log.commit != h.nodes[l].log.commit {
		t.Fatalf("rejoined node commit %d, leader %d", h.nodes[1].log.commit, h.nodes[l].log.commit)
	}
	for _, e := range h.log[1] {
		if string(e.Data) == "lost" {
			t.Fatal("a value proposed by the cut-off leader was chosen")
		}
	}
}

func TestConfigValidate(t *testing.T) {
	cases := []struct {
		name string
		mod  func(*Config)
		ok   bool
	}{
		{"default", func(*Config) {}, true},
		{"zero-id", func(c *Config) { c.ID = 0 }, false},
		{"id-not-in-peers", func(c *Config) { c.ID = 9 }, false},
		{"dup-peer", func(c *Config) { c.Peers = []uint64{1, 1, 2} }, false},
		{"election-too-short", func(c *Config) { c.ElectionTicks = 2 }, false},
		{"no-batch", func(c *Config) { c.MaxBatch = 0 }, false},
		{"max-members", func(c *Config) { c.Peers = seqIDs(MaxMembers) }, true},
		{"too-many-members", func(c *Config) { c.Peers = seqIDs(MaxMembers + 1) }, false},
	}
	for _, tc := range cases {
		c := DefaultConfig(1, []uint64{1, 2, 3})
		tc.mod(&c)
		if err := c.Validate(); (err == nil) != tc.ok {
			t.Errorf("%s: Validate() = %v", tc.name, err)
		} else if err != nil && !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: %v is not ErrInvalidConfig", tc.name, err)
		}
	}
}

func TestAcceptBatchesSplitByBytes(t *testing.T) {
	h := newHarness(t, 3, nil)
	for _, n := range h.nodes {
		n.cfg.MaxBatchBytes = 100
	}
	h.elect(1)
	for i := 0; i < 10; i++ {
		if _, _, err := h.nodes[1].Propose(make([]byte, 40)); err != nil {
			t.Fatal(err)
		}
	}
	rd := h.nodes[1].Ready()
	if len(rd.SendFirst) != 10 {
		t.Fatalf("want 5 runs of 2 entries to each of 2 peers, got %d messages", len(rd.SendFirst))
	}
	for _, m := range rd.SendFirst {
		if len(m.Entries) != 2 || m.Entries[1].Slot != m.Entries[0].Slot+1 {
			t.Fatalf("run %+v", m.Entries)
		}
		h.nodes[m.To].Step(m)
	}
	h.nodes[1].Advance(rd)
	h.settle()
	if h.nodes[1].log.commit != 11 {
		t.Fatalf("commit %d, want 11", h.nodes[1].log.commit)
	}
}

func seqIDs(n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = uint64(i + 1)
	}
	return out
}

// The acknowledgement mask has one bit per voter: a group of MaxMembers commits (the
// highest voter's bit is bit 63), and one more member is refused everywhere.
func TestMaxMembers(t *testing.T) {
	h := newHarness(t, MaxMembers, nil)
	h.elect(MaxMembers) // the voter with the highest bit
	l := h.nodes[MaxMembers]
	if _, _, err := l.Propose([]byte("wide")); err != nil {
		t.Fatal(err)
	}
	for _, id := range h.ids[:MaxMembers/2] {
		h.cut[id] = true // 32 of 64 remain, the leader's own acceptance included: no majority
	}
	h.settle()
	if got := data(h.log[MaxMembers]); len(got) != 1 {
		t.Fatalf("leader of %d with 32 reachable applied %v, want only the noop", MaxMembers, got)
	}
	delete(h.cut, MaxMembers/2) // 33 of 64: a majority once the Accept is retransmitted
	h.tick(6)
	if got := data(h.log[MaxMembers]); len(got) != 2 || got[1] != "wide" {
		t.Fatalf("leader of %d with 33 reachable applied %v, want [noop wide]", MaxMembers, got)
	}
	if _, _, err := l.ProposeConfChange(true, MaxMembers+1, ""); !errors.Is(err, ErrBadConfChange) || !strings.Contains(err.Error(), "MaxMembers") {
		t.Fatalf("adding a 65th member: %v, want ErrBadConfChange naming MaxMembers", err)
	}
	big := ConfState{Epoch: 2, Start: 5, Members: seqIDs(MaxMembers + 1)}
	if _, err := NewNode(DefaultConfig(1, []uint64{1, 2, 3}), HardState{Snapshot: 4, Commit: 4, Conf: big}, nil); !errors.Is(err, ErrCorruptWAL) {
		t.Fatalf("restoring a snapshot configuration of %d members: %v, want ErrCorruptWAL", len(big.Members), err)
	}
}

// An acknowledgement of a huge slot range is clipped to the log (it used to loop over
// every slot of the range).
func TestAcceptedRangeIsClipped(t *testing.T) {
	h := newHarness(t, 3, nil)
	h.elect(1)
	l := h.nodes[1]
	if _, _, err := l.Propose([]byte("x")); err != nil {
		t.Fatal(err)
	}
	rd := l.Ready()
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.Step(Message{Type: MsgAccepted, From: 2, To: 1, Ballot: l.promised, Epoch: 1, Slot: 1, Last: 1 << 62})
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Step of an Accepted for slots 1..2^62 did not return")
	}
	l.Advance(rd)
	if got := l.Status().Commit; got != 2 {
		t.Fatalf("commit %d after the clipped acknowledgement and the leader's own, want 2", got)
	}
}

// TestStalledLeaderJudgesOnce: a leader whose driver missed more than two election
// timeouts, and then steps the answers its followers sent meanwhile, judges check-quorum
// once on them (TickN) and keeps leading; ticked one by one it judged twice, the second
// time on no message, and stepped down.
func TestStalledLeaderJudgesOnce(t *testing.T) {
	for _, oneByOne := range []bool{false, true} {
		h := newHarness(t, 3, nil)
		h.elect(1)
		l := h.nodes[1]
		for l.hbElapsed < l.cfg.HeartbeatTicks-1 {
			l.Tick()
		}
		l.Tick() // a heartbeat round, the last before the stall
		var acks []Message
		for _, m := range h.outbox(1) {
			h.nodes[m.To].Step(m)
		}
		for _, id := range []uint64{2, 3} {
			acks = append(acks, h.outbox(id)...)
		}
		if len(acks) == 0 {
			t.Fatal("the followers answered nothing")
		}
		for _, m := range acks { // stepped when the driver runs again, before its ticks
			l.Step(m)
		}
		stall := uint64(5 * l.cfg.ElectionTicks / 2)
		if oneByOne {
			for range stall {
				l.Tick()
			}
		} else {
			l.TickN(stall)
		}
		switch {
		case oneByOne && l.role == Leader:
			t.Fatal("ticked one by one, the stalled leader kept leading: the case TickN is for did not happen")
		case !oneByOne && l.role != Leader:
			t.Fatalf("after a stall of %d ticks and its followers' answers, the leader is %v", stall, l.role)
		}
	}
}
