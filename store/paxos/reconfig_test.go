package paxos

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"
)

// TestReplicaMembershipChange runs 3→4→5→4→3 on real WALs over the in-memory network,
// with writes between the changes, snapshots small enough that the joiners learn the log
// from a snapshot, the leader removed, and a full restart of the final group at the end.
func TestReplicaMembershipChange(t *testing.T) {
	c := newTestCluster(t, 3, 50)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	n := 0
	write := func(k int) {
		t.Helper()
		for i := 0; i < k; i++ {
			n++
			if err := c.put(ctx, fmt.Sprintf("k%d", n), fmt.Sprint(n)); err != nil {
				t.Fatalf("write %d: %v", n, err)
			}
		}
	}
	change := func(add bool, id uint64) {
		t.Helper()
		tried := false
		for ctx.Err() == nil {
			l := c.reps[c.leader(ctx)]
			cctx, ccancel := context.WithTimeout(ctx, 3*time.Second)
			var err error
			if add {
				err = l.AddReplica(cctx, id, "")
			} else {
				err = l.RemoveReplica(cctx, id)
			}
			ccancel()
			if err == nil {
				return
			}
			if errors.Is(err, ErrBadConfChange) && tried && slices.Contains(l.Status().Members, id) == add {
				return // an earlier attempt whose answer was lost took effect
			}
			tried = true
			if !IsRetryable(err) && !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("change (add %v) %d: %v", add, id, err)
			}
		}
		t.Fatalf("change (add %v) %d: %v", add, id, ctx.Err())
	}
	members := func() []uint64 {
		st := c.reps[c.leader(ctx)].Status()
		return st.Members
	}
	write(120) // past a snapshot: joiners must install one

	// Bad changes are refused with a clear error.
	l := c.reps[c.leader(ctx)]
	if err := l.RemoveReplica(ctx, 9); !errors.Is(err, ErrBadConfChange) {
		t.Fatalf("remove a non-member: %v, want ErrBadConfChange", err)
	}
	if err := l.AddReplica(ctx, 2, ""); !errors.Is(err, ErrBadConfChange) {
		t.Fatalf("add a member: %v, want ErrBadConfChange", err)
	}

	for _, id := range []uint64{4, 5} {
		c.ids = append(c.ids, id)
		c.start(id)
		change(true, id)
		write(60)
	}
	if got := members(); !slices.Equal(got, []uint64{1, 2, 3, 4, 5}) {
		t.Fatalf("members %v after two adds", got)
	}
	// Remove the leader: it steps down and the four others elect one.
	old := c.leader(ctx)
	change(false, old)
	write(30)
	if l := c.leader(ctx); l == old {
		t.Fatalf("removed replica %d still leads", old)
	}
	// Remove one more, then stop the two removed replicas.
	var other uint64
	for _, id := range members() {
		if id != c.leader(ctx) {
			other = id
			break
		}
	}
	change(false, other)
	write(30)
	final := members()
	if len(final) != 3 || slices.Contains(final, old) || slices.Contains(final, other) {
		t.Fatalf("final members %v (removed %d, %d)", final, old, other)
	}
	c.stop(old)
	c.stop(other)
	c.ids = final
	c.last.Store(0)
	write(20)

	// Every member holds every write.
	check := func() {
		t.Helper()
		for _, id := range final {
			deadline := time.Now().Add(10 * time.Second)
			for {
				v, _ := c.sms[id].get(fmt.Sprintf("k%d", n))
				if v == fmt.Sprint(n) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("replica %d lacks k%d", id, n)
				}
				time.Sleep(5 * time.Millisecond)
			}
			for i := 1; i <= n; i++ {
				if v, _ := c.sms[id].get(fmt.Sprintf("k%d", i)); v != fmt.Sprint(i) {
					t.Fatalf("replica %d: k%d=%q", id, i, v)
				}
			}
		}
	}
	check()
	// A full restart of the final group comes back in the final configuration (from the
	// snapshots' configurations and the configuration entries in the WALs).
	for _, id := range final {
		c.stop(id)
	}
	for _, id := range final {
		c.start(id)
	}
	if got := members(); !slices.Equal(got, final) {
		t.Fatalf("after restart members %v, want %v", got, final)
	}
	write(10)
	check()
}
