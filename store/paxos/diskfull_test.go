package paxos

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
)

// await polls cond (each replica's state moves on its own goroutine) until it holds.
func await(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting until %s", what)
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// TestReplicaWaitsOutAFullDisk: the leader's disk fills (ENOSPC): it steps down and answers
// ErrDiskFull, the others go on; once it can write again it rejoins by itself, catches up,
// and its state machine holds every acknowledged write exactly once.
func TestReplicaWaitsOutAFullDisk(t *testing.T) {
	net := NewMemNetwork(1)
	ids := []uint64{1, 2, 3}
	stores := map[uint64]*MemStorage{}
	reps := map[uint64]*Replica{}
	sms := map[uint64]*testSM{}
	for _, id := range ids {
		stores[id] = &MemStorage{}
		sms[id] = &testSM{data: map[string]string{}}
		cfg := DefaultReplicaConfig(id, ids)
		cfg.TickInterval = 2 * time.Millisecond
		cfg.Logger = zaptest.NewLogger(t)
		r, err := StartReplica(cfg, stores[id], net.Transport(id), sms[id])
		if err != nil {
			t.Fatal(err)
		}
		reps[id] = r
		defer r.Close()
	}
	c := &testCluster{t: t, ids: ids, reps: reps}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	acked := 0
	put := func() {
		t.Helper()
		if err := c.put(ctx, fmt.Sprintf("k%d", acked), "v"); err != nil {
			t.Fatal(err)
		}
		acked++
	}
	for range 5 {
		put()
	}
	l := c.leader(ctx)
	full := stores[l]
	full.mu.Lock()
	full.FailWrites, full.WriteErr = true, fmt.Errorf("write /wal/00000000000000000001: %w", syscall.ENOSPC)
	full.mu.Unlock()
	for range 5 { // the leader's next write fails; another leads
		put()
	}
	await(t, ctx, "the full replica reports it", func() bool { return errors.Is(reps[l].Err(), ErrDiskFull) })
	if _, err := reps[l].Propose(ctx, []byte("x=1")); !errors.Is(err, ErrDiskFull) || !IsRetryable(err) {
		t.Fatalf("propose at the full replica: %v; want ErrDiskFull (retryable)", err)
	}
	if st := reps[l].Status(); st.Role == Leader {
		t.Fatalf("the full replica still leads: %+v", st)
	}
	since, err := reps[l].Fault()
	if since.IsZero() || !errors.Is(err, ErrDiskFull) {
		t.Fatalf("Fault: %v %v", since, err)
	}
	for range 5 {
		put()
	}
	full.mu.Lock()
	full.FailWrites = false
	full.mu.Unlock()
	other := ids[0]
	if other == l {
		other = ids[1]
	}
	await(t, ctx, "the replica rejoins", func() bool { return reps[l].Err() == nil })
	for range 5 {
		put()
	}
	// A write the full leader had sent out when its disk filled has an unknown outcome: the
	// others may choose it, and put proposes it again. The replicas agree either way.
	await(t, ctx, "every replica holds every write", func() bool {
		_, want := sms[other].get("")
		for _, id := range ids {
			if _, n := sms[id].get(fmt.Sprintf("k%d", acked-1)); n != want || n < acked {
				return false
			}
		}
		return true
	})
	for i := range acked {
		if v, _ := sms[l].get(fmt.Sprintf("k%d", i)); v != "v" {
			t.Fatalf("k%d lost on the replica whose disk filled", i)
		}
	}
}
