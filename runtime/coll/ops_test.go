package coll

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The collectives are checked against a single-process reference: each rank's input is
// vector(rank, length), small integers, so every sum is exact in float32 whatever the
// order of the additions, and results must be equal, not close.

func refAllGather(n, length int) []float32 {
	w := make([]float32, length)
	for r := 0; r < n; r++ {
		lo, hi := bounds(length, n, r)
		copy(w[lo:hi], vector(r, length)[lo:hi])
	}
	return w
}

func equal(got, want []float32) error {
	if len(got) != len(want) {
		return fmt.Errorf("length %d, want %d", len(got), len(want))
	}
	for j := range want {
		if got[j] != want[j] {
			return fmt.Errorf("[%d] = %v, want %v", j, got[j], want[j])
		}
	}
	return nil
}

// scenarioLengths: shorter than the gang (empty shards), small (recursive doubling,
// inline chunks), ring with inline chunks, ring with chunks read from regions.
var scenarioLengths = []int{3, 1000, 300007, 1500000}

// scenario runs every collective on every length as rank of peers and checks each result.
func scenario(p *Plane, gang string, rank int, peers []Peer) error {
	m, err := p.Join("job", gang, 0, rank, peers)
	if err != nil {
		return err
	}
	n := len(peers)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, length := range scenarioLengths {
		v := vector(rank, length)
		if err := m.AllReduce(ctx, v); err != nil {
			return err
		}
		if err := equal(v, want(n, length)); err != nil {
			return fmt.Errorf("rank %d allreduce %d: %w", rank, length, err)
		}
		// AllGather: only the own shard is input; the rest is garbage on entry.
		v = make([]float32, length)
		for j := range v {
			v[j] = -7
		}
		lo, hi := m.Shard(length, rank)
		copy(v[lo:hi], vector(rank, length)[lo:hi])
		if err := m.AllGather(ctx, v); err != nil {
			return err
		}
		if err := equal(v, refAllGather(n, length)); err != nil {
			return fmt.Errorf("rank %d allgather %d: %w", rank, length, err)
		}
		v = vector(rank, length)
		if err := m.ReduceScatter(ctx, v); err != nil {
			return err
		}
		if err := equal(v[lo:hi], want(n, length)[lo:hi]); err != nil {
			return fmt.Errorf("rank %d reducescatter %d: %w", rank, length, err)
		}
		for _, root := range []int{0, n - 1, n / 2} {
			v = vector(rank, length)
			if err := m.Broadcast(ctx, root, v); err != nil {
				return err
			}
			if err := equal(v, vector(root, length)); err != nil {
				return fmt.Errorf("rank %d broadcast %d from %d: %w", rank, length, root, err)
			}
		}
		if err := m.Barrier(ctx); err != nil {
			return err
		}
	}
	return buckets(ctx, m, rank, n)
}

// bucketSizes are gradients of a model, layer by layer: several to a bucket, one larger
// than a bucket, and a last bucket flushed half full.
var bucketSizes = []int{10, 300, 5000, 70000, 3, 200000, 7}

// buckets AllReduces gradients through asynchronous buckets, a synchronous AllReduce
// started behind them, and checks every result.
func buckets(ctx context.Context, m *Member, rank, n int) error {
	b := m.Buckets(256 << 10)
	grads := make([][]float32, len(bucketSizes))
	handles := make([]*Handle, len(bucketSizes))
	for i, size := range bucketSizes {
		grads[i] = vector(rank+i, size)
		handles[i] = b.Add(ctx, grads[i])
	}
	b.Flush(ctx)
	// A synchronous collective waits for the buckets before it (every rank started them
	// in the same order), so its result is the same whatever the buckets' progress.
	sync := vector(rank, 1000)
	if err := m.AllReduce(ctx, sync); err != nil {
		return err
	}
	for i, h := range handles {
		select {
		case <-h.Done():
		default:
			return fmt.Errorf("rank %d: bucket of gradient %d not done after the AllReduce behind it", rank, i)
		}
		if err := h.Wait(ctx); err != nil {
			return err
		}
		w := make([]float32, bucketSizes[i])
		for r := 0; r < n; r++ {
			for j, x := range vector(r+i, bucketSizes[i]) {
				w[j] += x
			}
		}
		if err := equal(grads[i], w); err != nil {
			return fmt.Errorf("rank %d bucketed gradient %d: %w", rank, i, err)
		}
	}
	return equal(sync, want(n, 1000))
}

func TestCollectivesInProcess(t *testing.T) {
	sys, p := newPlane(t, false)
	for _, n := range []int{1, 2, 3, 5, 8} {
		peers := make([]Peer, n)
		for i := range peers {
			peers[i] = Peer{Address: sys.Address()}
		}
		errs := make(chan error, n)
		for r := 0; r < n; r++ {
			go func() { errs <- scenario(p, fmt.Sprintf("ops-%d", n), r, peers) }()
		}
		for r := 0; r < n; r++ {
			if err := <-errs; err != nil {
				t.Fatalf("%d ranks: %v", n, err)
			}
		}
	}
}

// TestBarrierWaitsForEveryRank: no rank leaves a barrier before the last has entered it.
func TestBarrierWaitsForEveryRank(t *testing.T) {
	sys, p := newPlane(t, false)
	peers := []Peer{{Address: sys.Address()}, {Address: sys.Address()}, {Address: sys.Address()}}
	left := make(chan int, 3)
	for r := 0; r < 2; r++ {
		m, _ := p.Join("job", "barrier", 0, r, peers)
		go func() {
			if err := m.Barrier(context.Background()); err == nil {
				left <- r
			}
		}()
	}
	m, _ := p.Join("job", "barrier", 0, 2, peers)
	select {
	case r := <-left:
		t.Fatalf("rank %d left the barrier before rank 2 entered it", r)
	default:
	}
	if err := m.Barrier(context.Background()); err != nil {
		t.Fatal(err)
	}
	<-left
	<-left
}

func TestPlacementOf(t *testing.T) {
	for _, tc := range []struct {
		name  string
		peers []Peer
		ok    bool
		want  [][]int
	}{
		{"unknown machine", []Peer{{"a", "m1"}, {"b", ""}}, false, nil},
		{"two ranks in one process", []Peer{{"a", "m1"}, {"a", "m1"}}, false, nil},
		{"interleaved", []Peer{{"a", "m1"}, {"b", "m2"}, {"c", "m1"}, {"d", "m2"}}, true, [][]int{{0, 2}, {1, 3}}},
		{"uneven", []Peer{{"a", "m2"}, {"b", "m1"}, {"c", "m1"}}, true, [][]int{{0}, {1, 2}}},
	} {
		pl, ok := placementOf(tc.peers)
		if ok != tc.ok || fmt.Sprint(pl.machines) != fmt.Sprint(tc.want) && ok {
			t.Errorf("%s: %v %v, want %v %v", tc.name, pl.machines, ok, tc.want, tc.ok)
		}
	}
}

// hierPlacements are the machines of the six ranks of TestHierarchicalAcrossProcesses'
// gangs, one process each.
var hierPlacements = [][]string{
	{"m1", "m1", "m1", "m2", "m2", "m2"}, // two machines, ranks in order
	{"m1", "m2", "m1", "m2", "m2", "m1"}, // interleaved
	{"m1", "m2", "m2", "m2", "m2", "m3"}, // uneven, a machine of one
	{"m1", "m1", "m1", "m1", "m1", "m1"}, // one machine: shared memory only
}

const hierRanks = 6

func hierPeers(addrs []string, place []string) []Peer {
	peers := make([]Peer, len(addrs))
	for r := range addrs {
		peers[r] = Peer{Address: addrs[r], Machine: place[r]}
	}
	return peers
}

// TestHierarchicalAcrossProcesses runs six ranks in six processes (rank 0 here, the
// others in children: this test binary re-executed): members of a machine meet in
// shared memory, machines' leaders over the transfer plane. Every collective of every
// placement must give the reference's exact result.
func TestHierarchicalAcrossProcesses(t *testing.T) {
	t.Setenv(AlgoEnv, "auto") // sums too take the hierarchy (the children inherit it)
	sys, p := newPlane(t, true)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	addrs := []string{sys.Address()}
	var ins []*bufio.Writer
	var outs []*bufio.Reader
	for r := 1; r < hierRanks; r++ {
		cmd := exec.Command(exe, "-test.run=^$")
		cmd.Env = append(os.Environ(), "ATOLL_COLL_TEST_RANK="+strconv.Itoa(r))
		stdin, _ := cmd.StdinPipe()
		stdout, _ := cmd.StdoutPipe()
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = stdin.Close(); _ = cmd.Process.Kill(); _ = cmd.Wait() })
		out := bufio.NewReader(stdout)
		line, err := out.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		addrs = append(addrs, strings.TrimSpace(line))
		ins, outs = append(ins, bufio.NewWriter(stdin)), append(outs, out)
	}
	for _, in := range ins {
		fmt.Fprintln(in, strings.Join(addrs, ","))
		_ = in.Flush()
	}
	for i, place := range hierPlacements {
		if err := scenario(p, fmt.Sprintf("hier-%d", i), 0, hierPeers(addrs, place)); err != nil {
			t.Fatalf("placement %v: %v", place, err)
		}
	}
	for r, out := range outs {
		res, err := out.ReadString('\n')
		if err != nil || strings.TrimSpace(res) != "ok" {
			t.Fatalf("rank %d: %q %v", r+1, res, err)
		}
	}
	entries, _ := os.ReadDir(shmDir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "atoll-coll-") {
			t.Errorf("a segment was left in %s: %s", shmDir, e.Name())
		}
	}
}

// hierChild is a child rank of TestHierarchicalAcrossProcesses.
func hierChild(rank int) error {
	sys, p, err := childPlane()
	if err != nil {
		return err
	}
	defer sys.Shutdown(context.Background())
	fmt.Println(sys.Address())
	var line string
	if _, err := fmt.Scanln(&line); err != nil {
		return err
	}
	addrs := strings.Split(line, ",")
	if len(addrs) != hierRanks {
		return errors.New("bad peers line")
	}
	for i, place := range hierPlacements {
		if err := scenario(p, fmt.Sprintf("hier-%d", i), rank, hierPeers(addrs, place)); err != nil {
			return err
		}
	}
	fmt.Println("ok")
	// Stay up until the parent has read our last chunks (it closes our stdin).
	var end string
	fmt.Scanln(&end)
	return nil
}

// hierTestMain runs a child rank when the environment says so.
func hierTestMain() {
	if r := os.Getenv("ATOLL_COLL_TEST_RANK"); r != "" {
		rank, _ := strconv.Atoi(r)
		if err := hierChild(rank); err != nil {
			fmt.Println(err)
			os.Exit(1)
		}
		os.Exit(0)
	}
}
