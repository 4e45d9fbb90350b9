package paxos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
)

type testSM struct {
	mu      sync.Mutex
	data    map[string]string
	n       int
	applied uint64
}

func (s *testSM) Snapshot() ([]byte, uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, err := json.Marshal(map[string]any{"data": s.data, "n": s.n})
	return b, s.applied, err
}

func (s *testSM) Restore(b []byte) error {
	var v struct {
		Data map[string]string `json:"data"`
		N    int               `json:"n"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.data, s.n = v.Data, v.N
	return nil
}

func (s *testSM) Apply(slot uint64, data []byte) []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	k, v, _ := strings.Cut(string(data), "=")
	s.data[k] = v
	s.n++
	s.applied = slot
	return []byte(fmt.Sprintf("applied@%d", slot))
}

func (s *testSM) get(k string) (string, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.data[k], s.n
}

type testCluster struct {
	t         *testing.T
	snapEvery uint64
	last      atomic.Uint64 // replica that took the last write
	dir       string
	net       *MemNetwork
	ids       []uint64
	genesis   []uint64 // the first configuration; other ids start with Config.Join
	reps      map[uint64]*Replica
	sms       map[uint64]*testSM
}

func newTestCluster(t *testing.T, n int, snapEvery ...uint64) *testCluster {
	c := &testCluster{t: t, dir: t.TempDir(), net: NewMemNetwork(1), reps: map[uint64]*Replica{}, sms: map[uint64]*testSM{}}
	if len(snapEvery) > 0 {
		c.snapEvery = snapEvery[0]
	}
	for i := 1; i <= n; i++ {
		c.ids = append(c.ids, uint64(i))
	}
	c.genesis = slices.Clone(c.ids)
	for _, id := range c.ids {
		c.start(id)
	}
	t.Cleanup(func() {
		for _, r := range c.reps {
			r.Close()
		}
	})
	return c
}

func (c *testCluster) start(id uint64) {
	w, err := OpenWAL(filepath.Join(c.dir, fmt.Sprint(id)), WALOptions{NoSync: true, Logger: zaptest.NewLogger(c.t)})
	if err != nil {
		c.t.Fatal(err)
	}
	cfg := DefaultReplicaConfig(id, c.genesis)
	cfg.Node.Join = !slices.Contains(c.genesis, id)
	// Ticks follow the wall clock: a 20-40 ms election timeout passes whenever a loaded
	// machine does not schedule the leader for that long, and leaders change under the tests.
	if err := cfg.SetTiming(2*time.Millisecond, 100*time.Millisecond); err != nil {
		c.t.Fatal(err)
	}
	cfg.SnapshotEvery = c.snapEvery
	cfg.Logger = zaptest.NewLogger(c.t)
	sm := &testSM{data: map[string]string{}}
	r, err := StartReplica(cfg, w, c.net.Transport(id), sm)
	if err != nil {
		c.t.Fatal(err)
	}
	c.reps[id], c.sms[id] = r, sm
}

func (c *testCluster) stop(id uint64) {
	c.reps[id].Close()
	delete(c.reps, id)
}

func (c *testCluster) leader(ctx context.Context) uint64 {
	for ctx.Err() == nil {
		for id, r := range c.reps {
			if r.Status().Role == Leader {
				return id
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
	c.t.Fatal("no leader")
	return 0
}

// put proposes at the leader, following redirects, until ctx ends.
func (c *testCluster) put(ctx context.Context, k, v string) error {
	target := c.last.Load()
	if target == 0 {
		target = c.ids[0]
	}
	for {
		r := c.reps[target]
		if r == nil {
			target = c.ids[int(time.Now().UnixNano())%len(c.ids)]
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		_, err := r.Propose(cctx, []byte(k+"="+v))
		cancel()
		if err == nil {
			c.last.Store(target)
			return nil
		}
		var nl *NotLeaderError
		if errors.As(err, &nl) && nl.Leader != 0 {
			target = nl.Leader
		} else {
			target = c.ids[(int(target))%len(c.ids)]
		}
		if ctx.Err() != nil {
			return err
		}
	}
}

func TestReplicaReplicatesAndRedirects(t *testing.T) {
	c := newTestCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l := c.leader(ctx)
	var wg sync.WaitGroup
	errs := make(chan error, 200)
	for i := 0; i < 200; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			errs <- c.put(ctx, fmt.Sprintf("k%d", i), fmt.Sprint(i))
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	// A follower redirects with the leader hint. (On a loaded machine a 2 ms tick's
	// election timeout can pass during the writes: the leader is the one of now.)
	for _, id := range c.ids {
		if l = c.leader(ctx); id == l {
			continue
		}
		_, err := c.reps[id].Propose(ctx, []byte("x=1"))
		var nl *NotLeaderError
		if !errors.As(err, &nl) || (nl.Leader != l && nl.Leader != c.leader(ctx)) || !IsRetryable(err) {
			t.Fatalf("follower %d: err %v, want NotLeaderError{%d}", id, err, l)
		}
		if err := c.reps[id].Read(ctx); !errors.Is(err, ErrNotLeader) {
			t.Fatalf("follower read: %v", err)
		}
		break
	}
	for try := 0; ; try++ {
		l = c.leader(ctx)
		err := c.reps[l].Read(ctx)
		if err == nil {
			break
		}
		if !errors.Is(err, ErrNotLeader) || try == 3 {
			t.Fatalf("leader read: %v", err)
		}
	}
	if v, _ := c.sms[l].get("k199"); v != "199" {
		t.Fatalf("leader state k199=%q", v)
	}
	// Every replica applies everything.
	for _, id := range c.ids {
		deadline := time.Now().Add(10 * time.Second)
		for {
			_, n := c.sms[id].get("")
			if n >= 200 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("replica %d applied %d of 200", id, n)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

func TestReplicaLeaderIsolatedAndRestart(t *testing.T) {
	c := newTestCluster(t, 3)
	c.net.SetFaults(0.05, 0.05, 0, 2*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := 0; i < 20; i++ {
		if err := c.put(ctx, fmt.Sprintf("a%d", i), "1"); err != nil {
			t.Fatal(err)
		}
	}
	old := c.leader(ctx)
	c.net.Isolate(old)
	// The majority elects a new leader and keeps committing.
	for i := 0; i < 20; i++ {
		if err := c.put(ctx, fmt.Sprintf("b%d", i), "2"); err != nil {
			t.Fatal(err)
		}
	}
	// The isolated old leader steps down (check-quorum) and cannot serve reads.
	deadline := time.Now().Add(5 * time.Second)
	for c.reps[old].Status().Role == Leader {
		if time.Now().After(deadline) {
			t.Fatal("isolated leader never stepped down")
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Crash a replica, heal, restart it from its WAL: it catches up.
	c.net.Heal()
	c.stop(old)
	for i := 0; i < 20; i++ {
		if err := c.put(ctx, fmt.Sprintf("c%d", i), "3"); err != nil {
			t.Fatal(err)
		}
	}
	c.start(old)
	deadline = time.Now().Add(10 * time.Second)
	for {
		v1, _ := c.sms[old].get("b19")
		v2, _ := c.sms[old].get("c19")
		if v1 == "2" && v2 == "3" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("restarted replica did not catch up: b19=%q c19=%q", v1, v2)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestReplicaProposeWaitsForElection(t *testing.T) {
	c := newTestCluster(t, 3)
	// Right after start no leader exists: a proposal waits within its deadline.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	// With no quorum at all, a proposal fails with a retryable error at its deadline.
	l := c.leader(ctx)
	for _, id := range c.ids {
		if id != l {
			c.stop(id)
		}
	}
	short, cancel2 := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel2()
	_, err := c.reps[l].Propose(short, []byte("z=1"))
	if err == nil {
		t.Fatal("proposal without quorum succeeded")
	}
	if !errors.Is(err, context.DeadlineExceeded) && !IsRetryable(err) {
		t.Fatalf("err %v is neither retryable nor a deadline", err)
	}
}

func TestReplicaSnapshotCompactionAndCatchUp(t *testing.T) {
	c := newTestCluster(t, 3, 25)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := 0; i < 30; i++ {
		if err := c.put(ctx, fmt.Sprintf("a%d", i), "1"); err != nil {
			t.Fatal(err)
		}
	}
	l := c.leader(ctx)
	var down uint64
	for _, id := range c.ids {
		if id != l {
			down = id
			break
		}
	}
	c.stop(down)
	for i := 0; i < 200; i++ {
		if err := c.put(ctx, fmt.Sprintf("b%d", i), "2"); err != nil {
			t.Fatal(err)
		}
	}
	if got := c.reps[l].node.Compacted(); got < 100 {
		t.Fatalf("leader compacted only through %d", got)
	}
	// The stopped replica is behind the leader's compaction point: it is caught up with
	// a snapshot, then with entries.
	c.start(down)
	deadline := time.Now().Add(10 * time.Second)
	for {
		v, _ := c.sms[down].get("b199")
		w, _ := c.sms[down].get("a3")
		if v == "2" && w == "1" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica %d not caught up: b199=%q a3=%q", down, v, w)
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Every replica restarts from its snapshot plus its compacted WAL with the full state.
	for _, id := range c.ids {
		c.stop(id)
	}
	for _, id := range c.ids {
		c.start(id)
	}
	if err := c.put(ctx, "after", "restart"); err != nil {
		t.Fatal(err)
	}
	for _, id := range c.ids {
		deadline := time.Now().Add(10 * time.Second)
		for {
			v, _ := c.sms[id].get("b150")
			w, _ := c.sms[id].get("after")
			if v == "2" && w == "restart" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("replica %d after restart: b150=%q after=%q", id, v, w)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

func TestReplicaStopsOnDiskFailure(t *testing.T) {
	net := NewMemNetwork(1)
	ids := []uint64{1, 2, 3}
	stores := map[uint64]*MemStorage{}
	reps := map[uint64]*Replica{}
	for _, id := range ids {
		stores[id] = &MemStorage{}
		cfg := DefaultReplicaConfig(id, ids)
		cfg.TickInterval = 2 * time.Millisecond
		cfg.Logger = zaptest.NewLogger(t)
		r, err := StartReplica(cfg, stores[id], net.Transport(id), &testSM{data: map[string]string{}})
		if err != nil {
			t.Fatal(err)
		}
		reps[id] = r
		defer r.Close()
	}
	c := &testCluster{t: t, ids: ids, reps: reps}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := c.put(ctx, "a", "1"); err != nil {
		t.Fatal(err)
	}
	l := c.leader(ctx)
	stores[l].mu.Lock()
	stores[l].FailWrites = true
	stores[l].mu.Unlock()
	// The leader's next write fails: it stops rather than answer, and the others go on.
	if err := c.put(ctx, "b", "2"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for reps[l].Err() == nil {
		if time.Now().After(deadline) {
			t.Fatal("leader with a failing disk kept running")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := reps[l].Propose(ctx, []byte("c=3")); !errors.Is(err, ErrStopped) {
		t.Fatalf("propose on stopped replica: %v", err)
	}
}
