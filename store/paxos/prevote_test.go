package paxos

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// A follower cut off from the group keeps timing out. Without pre-vote each timeout
// raises its ballot, and when it comes back its refusal of the leader's next Accept
// (naming the higher ballot) deposes a healthy leader. With pre-vote it asks first, hears
// nothing, raises nothing, and simply follows again.
func TestPreVoteRejoiningFollowerDoesNotDepose(t *testing.T) {
	for _, tc := range []struct {
		name    string
		preVote bool
		deposed bool
	}{
		{"pre-vote", true, false},
		{"without pre-vote (the disruption pre-vote prevents)", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, 3, nil)
			for _, n := range h.nodes {
				n.cfg.PreVote = tc.preVote
			}
			h.elect(1)
			ballot := h.nodes[1].promised
			h.cut[3] = true
			h.tick(10 * h.nodes[3].cfg.ElectionTicks) // node 3 times out again and again
			if l := h.leader(); l != 1 {
				t.Fatalf("leader %d while node 3 was cut off, want 1", l)
			}
			if raised := h.nodes[3].promised > ballot; raised != tc.deposed {
				t.Fatalf("cut-off node raised its ballot: %v (promised %x, leader's %x)", raised, h.nodes[3].promised, ballot)
			}
			delete(h.cut, 3)
			h.tick(3 * h.nodes[1].cfg.HeartbeatTicks)
			deposed := h.nodes[1].role != Leader || h.nodes[1].promised != ballot
			if deposed != tc.deposed {
				t.Fatalf("leader deposed: %v, want %v (node 1 %v at %x, was %x)", deposed, tc.deposed, h.nodes[1].role, h.nodes[1].promised, ballot)
			}
			if !tc.deposed {
				if h.nodes[3].leader != 1 || h.nodes[3].log.commit != h.nodes[1].log.commit {
					t.Fatalf("rejoined follower: leader %d commit %d, want 1 and %d", h.nodes[3].leader, h.nodes[3].log.commit, h.nodes[1].log.commit)
				}
			}
		})
	}
}

// A pre-vote is refused by a replica that heard the leader within the election timeout
// and by the leader itself, granted by one that did not; it changes no ballot anywhere.
func TestPreVoteAnswers(t *testing.T) {
	h := newHarness(t, 3, nil)
	h.elect(1)
	before := map[uint64]uint64{}
	for id, n := range h.nodes {
		before[id] = n.promised
	}
	ask := func(to uint64) Message {
		t.Helper()
		n := h.nodes[to]
		n.Step(Message{Type: MsgPreVote, From: 3, To: to, Epoch: 1, Ballot: MakeBallot(99, 3)})
		rd := n.Ready()
		n.Advance(rd)
		for _, m := range rd.Messages {
			if m.Type == MsgPreVoteResp && m.To == 3 {
				return m
			}
		}
		t.Fatalf("node %d did not answer the pre-vote", to)
		return Message{}
	}
	if m := ask(1); !m.Reject {
		t.Fatal("the leader granted a pre-vote")
	}
	if m := ask(2); !m.Reject {
		t.Fatal("a follower that just heard the leader granted a pre-vote")
	}
	// Node 2 stops hearing the leader for an election timeout: it grants.
	h.cut[1] = true
	for i := 0; i < h.nodes[2].cfg.ElectionTicks; i++ {
		h.nodes[2].now++ // time passes for node 2 alone; its own timeout is not run
	}
	if m := ask(2); m.Reject || m.Promised != before[2] {
		t.Fatalf("a follower that has not heard the leader for an election timeout answered %+v", m)
	}
	for id, n := range h.nodes {
		if n.promised != before[id] {
			t.Fatalf("node %d promised %x after pre-votes, was %x", id, n.promised, before[id])
		}
	}
}

// When the leader is gone, pre-vote still elects a new one, and that leader's ballot is
// above every ballot promised (the refusals teach the pre-candidate the highest round).
func TestPreVoteElectsAfterLeaderLoss(t *testing.T) {
	h := newHarness(t, 3, nil)
	h.elect(1)
	old := h.nodes[1].promised
	h.cut[1] = true
	h.tick(4 * h.nodes[2].cfg.ElectionTicks)
	l := h.leader()
	if l == 0 || l == 1 {
		t.Fatalf("leader %d after node 1 was cut off", l)
	}
	if h.nodes[l].promised <= old {
		t.Fatalf("new leader's ballot %x not above the old %x", h.nodes[l].promised, old)
	}
}

// A leader whose process stalls while a partition elects another must not serve a read
// under its old lease when it resumes: its clock is the wall clock's (ticks are caught up,
// not dropped), so the lease has run out, and Leading says so even before the stalled loop
// runs again.
func TestStalledLeaderServesNoStaleRead(t *testing.T) {
	c := newTestCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.put(ctx, "k", "old"); err != nil {
		t.Fatal(err)
	}
	l := c.leader(ctx)
	stalled := c.reps[l]
	if !stalled.Leading() {
		t.Fatal("the leader holds no lease after a write")
	}
	entered, release := make(chan struct{}), make(chan struct{})
	go stalled.do(ctx, func() { close(entered); <-release }) // the leader's loop stops here
	<-entered
	c.net.Isolate(l)
	// The others elect a leader of their own and write.
	var other uint64
	for other == 0 {
		var chs []<-chan struct{}
		for id, r := range c.reps {
			if id == l {
				continue
			}
			chs = append(chs, r.Changed())
			if r.Status().Role == Leader {
				other = id
			}
		}
		if other == 0 {
			select {
			case <-chs[0]:
			case <-chs[1]:
			case <-ctx.Done():
				t.Fatal("the others elected no leader")
			}
		}
	}
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	for {
		if _, err := c.reps[other].Propose(wctx, []byte("k=new")); err == nil {
			break
		} else if !IsRetryable(err) {
			t.Fatal(err)
		}
	}
	wcancel()
	if stalled.Leading() {
		t.Fatal("the stalled leader still says it leads after another was elected and wrote")
	}
	close(release)
	rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
	defer rcancel()
	err := stalled.Read(rctx)
	if v, _ := c.sms[l].get("k"); err == nil && v != "new" {
		t.Fatalf("the resumed leader served a read of k=%q under its old lease; k=new was committed by leader %d", v, other)
	}
	if err != nil && !errors.Is(err, ErrNotLeader) && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatal(err)
	}
}

func TestSetTiming(t *testing.T) {
	for _, tc := range []struct {
		tick, election time.Duration
		ok             bool
		et, hb         int
	}{
		{100 * time.Millisecond, time.Second, true, 10, 2},
		{10 * time.Millisecond, 100 * time.Millisecond, true, 10, 2},
		{100 * time.Millisecond, 2 * time.Second, true, 20, 4},
		{50 * time.Millisecond, 260 * time.Millisecond, true, 5, 1},
		{100 * time.Millisecond, 400 * time.Millisecond, false, 0, 0}, // 4 ticks
		{0, time.Second, false, 0, 0},
		{time.Second, 2 * time.Minute, false, 0, 0},
	} {
		c := DefaultReplicaConfig(1, []uint64{1, 2, 3})
		err := c.SetTiming(tc.tick, tc.election)
		if (err == nil) != tc.ok {
			t.Errorf("SetTiming(%v, %v) = %v", tc.tick, tc.election, err)
			continue
		}
		if err != nil {
			if !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("SetTiming(%v, %v) = %v, not ErrInvalidConfig", tc.tick, tc.election, err)
			}
			continue
		}
		if c.Node.ElectionTicks != tc.et || c.Node.HeartbeatTicks != tc.hb || c.TickInterval != tc.tick || c.Validate() != nil {
			t.Errorf("SetTiming(%v, %v): %d election ticks, heartbeat every %d, valid: %v", tc.tick, tc.election, c.Node.ElectionTicks, c.Node.HeartbeatTicks, c.Validate())
		}
	}
}

// Heartbeats go out every HeartbeatTicks even while proposals stream: only they reach a
// learner (and retransmit lost Accepts). With heartbeats a fifth of the election timeout
// apart, a batch of Accepts per tick used to postpone them forever, and a replica being
// added under a steady write load never heard from the leader.
func TestHeartbeatsReachLearnersUnderSteadyProposals(t *testing.T) {
	h := newHarness(t, 3, nil)
	cfg := DefaultConfig(4, nil)
	cfg.Join = true
	n4, err := NewNode(cfg, HardState{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	h.nodes[4], h.ids = n4, append(h.ids, 4)
	h.elect(1)
	l := h.nodes[1]
	l.cfg.HeartbeatTicks = 4
	if err := l.AddLearner(4); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3*l.cfg.HeartbeatTicks; i++ {
		if _, _, err := l.Propose([]byte(fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
		h.tick(1) // a batch of Accepts every tick
	}
	if c, ok := l.LearnerCommit(4); !ok || c == 0 {
		t.Fatalf("the learner reported %d (%v) after %d ticks of steady proposals", c, ok, 3*l.cfg.HeartbeatTicks)
	}
}

// Followers learn that values were chosen at once, not at the next heartbeat (a fifth of
// an election timeout away): a read at a follower's state machine right after a write was
// acknowledged used to miss it for that long.
func TestFollowersLearnCommitWithoutWaitingForHeartbeat(t *testing.T) {
	h := newHarness(t, 3, nil)
	h.elect(1)
	for _, n := range h.nodes {
		n.cfg.HeartbeatTicks = 4
	}
	if _, _, err := h.nodes[1].Propose([]byte("x")); err != nil {
		t.Fatal(err)
	}
	h.settle() // no tick: only what the write itself causes
	for _, id := range h.ids {
		if got := data(h.log[id]); len(got) == 0 || got[len(got)-1] != "x" {
			t.Errorf("node %d applied %v without a tick, want x last", id, got)
		}
	}
}

// Two followers time out close together after the leader dies (at 1,000 machines, 44 ms
// apart): node 2's Prepare reaches node 3 after node 3 sent its own pre-vote, and node 2,
// a candidate by then, grants that pre-vote. Node 3 promised node 2 in between, so the
// grant is stale: acting on it, node 3 campaigned at a higher ballot, refused node 2's
// Accepts, and deposed the leader it had just elected; the next election came an election
// timeout later (3.87 s to fail over, where one timeout and a round trip suffice).
func TestPreVoteGrantAfterPromiseIsStale(t *testing.T) {
	h := newHarness(t, 3, nil)
	h.elect(1)
	h.cut[1] = true // the leader dies
	for _, id := range []uint64{2, 3} {
		h.nodes[id].now += uint64(h.nodes[id].cfg.ElectionTicks) // neither hears it for a timeout
	}
	out := h.outbox
	// take returns the one message of type typ from ms to node to.
	take := func(ms []Message, typ MsgType, to uint64) Message {
		t.Helper()
		for _, m := range ms {
			if m.Type == typ && m.To == to {
				return m
			}
		}
		t.Fatalf("no %v to node %d in %v", typ, to, ms)
		return Message{}
	}
	h.nodes[2].preCampaign()
	h.nodes[3].Step(take(out(2), MsgPreVote, 3))
	h.nodes[2].Step(take(out(3), MsgPreVoteResp, 2)) // granted: node 2 campaigns
	prepare := take(out(2), MsgPrepare, 3)
	if h.nodes[2].role != Candidate {
		t.Fatalf("node 2 is %v after a granted pre-vote, want a candidate", h.nodes[2].role)
	}
	h.nodes[3].preCampaign() // node 3's own timeout, before node 2's Prepare arrives
	preVote := take(out(3), MsgPreVote, 2)
	h.nodes[3].Step(prepare) // node 3 promises node 2
	promise := take(out(3), MsgPromise, 2)
	if promise.Reject {
		t.Fatalf("node 3 refused node 2's Prepare: %+v", promise)
	}
	h.nodes[2].Step(preVote) // node 2, a candidate, grants node 3's pre-vote
	h.nodes[3].Step(take(out(2), MsgPreVoteResp, 3))
	h.nodes[2].Step(promise)
	if h.nodes[2].role != Leader {
		t.Fatalf("node 2 is %v with node 3's promise, want the leader", h.nodes[2].role)
	}
	ballot := h.nodes[2].promised
	h.settle()
	h.tick(3 * h.nodes[2].cfg.HeartbeatTicks)
	if l := h.leader(); l != 2 || h.nodes[2].promised != ballot {
		t.Fatalf("leader %d at ballot %x after node 3's stale pre-vote grant, want node 2 at %x (node 3 %v, promised %x)",
			l, h.nodes[2].promised, ballot, h.nodes[3].role, h.nodes[3].promised)
	}
}
