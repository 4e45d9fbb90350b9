package main

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/atoll-run/atoll/internal/testtime"
	"github.com/atoll-run/atoll/store/meta"
	"github.com/atoll-run/atoll/store/paxos"
)

// TestHeadMembershipChange runs real `atoll head` processes: three start, a fourth joins
// through POST /v1/members/add while writes go on, then one of the first three (the
// leader) is removed through POST /v1/members/remove and killed; every acknowledged write
// is still readable and the remaining members reach the same revision.
func TestHeadMembershipChange(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the atoll binary and runs real processes")
	}
	t.Parallel()
	dir := t.TempDir()
	if d := os.Getenv("ATOLL_KEEP_LOGS"); d != "" {
		dir = d // keep the heads' logs for inspection
	}
	bin := buildAtoll(t)
	const token = "real-process-members-token"
	addrs := freePorts(t, 8)
	peerAddrs, clientAddrs := addrs[:4], addrs[4:]
	ps := peerList(peerAddrs)
	first := strings.Join(ps[:3], ",")
	all := strings.Join(ps, ",")
	procs := map[int]*headProc{}
	for id := 1; id <= 3; id++ {
		procs[id] = startHead(t, bin, id, first, clientAddrs[id-1], dir, token)
	}
	defer func() {
		for _, p := range procs {
			p.cmd.Process.Kill()
			p.cmd.Wait()
		}
	}()
	conn := func(id int) meta.HTTPConn {
		return meta.HTTPConn{BaseURL: "http://" + clientAddrs[id-1], Token: token}
	}
	// Replica 4 is reachable (once started) through the same client: a redirect to it
	// is followed, and before it runs it is just a replica that does not answer.
	conns := map[uint64]meta.Conn{}
	for id := 1; id <= 4; id++ {
		conns[uint64(id)] = conn(id)
	}
	cfg := meta.DefaultClientConfig()
	cfg.AttemptTimeout = time.Second
	client, err := meta.NewClient(cfg, conns)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := testtime.Context(t, 90*time.Second)
	defer cancel()

	w := startAckWriter(t, ctx, client, "nodes/m")
	waitAcked := w.waitAcked
	leaderOf := func(ids []int) int {
		t.Helper()
		for ctx.Err() == nil {
			for _, id := range ids {
				if st, err := headStatus(clientAddrs[id-1], token); err == nil && st["role"] == "leader" {
					return id
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Fatal("no leader found")
		return 0
	}
	// change retries a membership change at the current leader until it is chosen.
	change := func(ids []int, add bool, id int) meta.MembershipResult {
		t.Helper()
		tried := false
		for ctx.Err() == nil {
			c := conn(leaderOf(ids))
			cctx, ccancel := context.WithTimeout(ctx, testtime.Scale(20*time.Second))
			var res meta.MembershipResult
			var err error
			if add {
				res, err = c.AddReplica(cctx, uint64(id), peerAddrs[id-1])
			} else {
				res, err = c.RemoveReplica(cctx, uint64(id))
			}
			ccancel()
			if err == nil {
				return res
			}
			if errors.Is(err, meta.ErrBadRequest) && tried {
				// An earlier attempt whose answer was lost took effect: check the members.
				if st, serr := headStatus(clientAddrs[leaderOf(ids)-1], token); serr == nil {
					var ms []uint64
					for _, m := range st["members"].([]any) {
						ms = append(ms, uint64(m.(float64)))
					}
					if slices.Contains(ms, uint64(id)) == add {
						return meta.MembershipResult{Epoch: uint64(st["epoch"].(float64)), Members: ms}
					}
				}
			}
			tried = true
			if !paxos.IsRetryable(err) && !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("membership change (add %v) %d: %v", add, id, err)
			}
			t.Logf("membership change (add %v) %d: %v (retrying)", add, id, err)
		}
		t.Fatalf("membership change (add %v) %d: %v", add, id, ctx.Err())
		return meta.MembershipResult{}
	}
	waitAcked(100)

	// A bad change is refused as a bad request (400).
	if _, err := conn(leaderOf([]int{1, 2, 3})).RemoveReplica(ctx, 9); !errors.Is(err, meta.ErrBadRequest) {
		t.Fatalf("removing a non-member: %v, want meta.ErrBadRequest", err)
	}

	// Add replica 4 (started with --join; its peers list names every replica).
	procs[4] = startHead(t, bin, 4, all, clientAddrs[3], dir, token, "--join", "--initial-members", "1,2,3")
	res := change([]int{1, 2, 3}, true, 4)
	if res.Epoch != 2 || !slices.Equal(res.Members, []uint64{1, 2, 3, 4}) {
		t.Fatalf("after add: %+v", res)
	}
	before := w.count()
	waitAcked(before + 100)

	// Remove the leader, then stop it: the three others elect a leader and go on.
	removed := leaderOf([]int{1, 2, 3, 4})
	res = change([]int{1, 2, 3, 4}, false, removed)
	if res.Epoch != 3 || len(res.Members) != 3 || slices.Contains(res.Members, uint64(removed)) {
		t.Fatalf("after remove %d: %+v", removed, res)
	}
	var rest []int
	for _, m := range res.Members {
		rest = append(rest, int(m))
	}
	if l := leaderOf(rest); l == removed {
		t.Fatalf("removed replica %d still leads", removed)
	}
	procs[removed].cmd.Process.Kill()
	procs[removed].cmd.Wait()
	delete(procs, removed)
	before = w.count()
	waitAcked(before + 100)
	acked := w.finish()

	final := map[uint64]meta.Conn{}
	for _, id := range rest {
		final[uint64(id)] = conn(id)
	}
	reader, err := meta.NewClient(cfg, final)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range acked {
		kv, ok, err := reader.Get(ctx, k)
		if err != nil {
			t.Fatalf("get %s: %v", k, err)
		}
		if !ok || string(kv.Value) != v {
			t.Fatalf("acknowledged write %s=%s lost (found=%v %q)", k, v, ok, kv.Value)
		}
	}
	deadline := testtime.Deadline(t, 15*time.Second)
	for {
		revs := map[float64]bool{}
		for _, id := range rest {
			if st, err := headStatus(clientAddrs[id-1], token); err == nil {
				revs[st["revision"].(float64)] = true
			}
		}
		if len(revs) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("members %v at different revisions: %v", rest, revs)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("%d acknowledged writes; replica 4 joined, replica %d (the leader) removed; members %v", len(acked), removed, rest)
}
