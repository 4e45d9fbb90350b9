package coll

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/atoll-run/atoll/actors"
)

var token = []byte("coll-test-token-0123456789")

func newPlane(t testing.TB, remote bool) (*actors.System, *Plane) {
	t.Helper()
	cfg := actors.Config{}
	if remote {
		cfg.Remote = &actors.RemoteConfig{}
	}
	sys, err := actors.NewSystem(cfg)
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewPlane(sys, token, "127.0.0.1", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close(); _ = sys.Shutdown(context.Background()) })
	return sys, p
}

func vector(rank, length int) []float32 {
	v := make([]float32, length)
	for j := range v {
		v[j] = float32(rank*100 + j%17)
	}
	return v
}

func want(n, length int) []float32 {
	w := make([]float32, length)
	for r := 0; r < n; r++ {
		for j, x := range vector(r, length) {
			w[j] += x
		}
	}
	return w
}

// runRanks runs AllReduce on the given ranks of this process and checks every result.
func runRanks(t *testing.T, p *Plane, gang string, ranks []int, peers []Peer, length, times int) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, len(ranks))
	for _, r := range ranks {
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			m, err := p.Join("job", gang, 0, r, peers)
			if err != nil {
				errs <- err
				return
			}
			for k := 0; k < times; k++ {
				v := vector(r, length)
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				err := m.AllReduce(ctx, v)
				cancel()
				if err != nil {
					errs <- fmt.Errorf("rank %d round %d: %w", r, k, err)
					return
				}
				w := want(len(peers), length)
				for j := range w {
					if v[j] != w[j] {
						errs <- fmt.Errorf("rank %d round %d: [%d] = %v, want %v", r, k, j, v[j], w[j])
						return
					}
				}
			}
		}(r)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

func TestAllReduceInProcess(t *testing.T) {
	sys, p := newPlane(t, false)
	// Small vectors take recursive doubling (powers of two and not), larger ones the ring.
	for _, tc := range []struct{ n, length int }{{1, 5}, {2, 7}, {3, 10}, {8, 1000}, {8, 3}, {5, 0}, {6, 100}, {5, 100003}, {8, 40000}} {
		peers := make([]Peer, tc.n)
		ranks := make([]int, tc.n)
		for i := range peers {
			peers[i], ranks[i] = Peer{Address: sys.Address()}, i
		}
		runRanks(t, p, fmt.Sprintf("g%d-%d", tc.n, tc.length), ranks, peers, tc.length, 3)
	}
}

func TestAbortWakesEveryRank(t *testing.T) {
	sys, p := newPlane(t, false)
	peers := []Peer{{Address: sys.Address()}, {Address: sys.Address()}, {Address: sys.Address()}, {Address: sys.Address()}}
	done := make(chan error, 3)
	for r := 0; r < 3; r++ { // rank 3 never comes
		m, _ := p.Join("job", "abort", 0, r, peers)
		go func() { done <- m.AllReduce(context.Background(), make([]float32, 64)) }()
	}
	p.End("job", "abort", 0)
	for r := 0; r < 3; r++ {
		if err := <-done; !errors.Is(err, ErrAborted) {
			t.Fatalf("rank: %v, want ErrAborted", err)
		}
	}
	// A missing rank is named when the context ends.
	m, _ := p.Join("job", "lonely", 0, 0, []Peer{{Address: sys.Address()}, {Address: sys.Address()}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	if err := m.AllReduce(ctx, make([]float32, 8)); !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "rank 1 never sent it") {
		t.Fatalf("lonely rank: %v", err)
	}
}

// xprocLengths cover the three paths between processes: recursive doubling with inline
// vectors, the ring with inline chunks, the ring with chunks read from regions.
var xprocLengths = []int{1000, 300007, 1500000}

// TestAllReduceAcrossProcesses runs ranks 0-2 here and ranks 3-5 in a child process (this
// test binary, re-executed): chunks between the processes are read over the transfer plane.
func TestAllReduceAcrossProcesses(t *testing.T) {
	sys, p := newPlane(t, true)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), "ATOLL_COLL_TEST_CHILD=1")
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	out := bufio.NewReader(stdout)
	child, err := out.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	child = strings.TrimSpace(child)
	fmt.Fprintln(stdin, sys.Address())
	peers := []Peer{{Address: sys.Address()}, {Address: sys.Address()}, {Address: sys.Address()}, {Address: child}, {Address: child}, {Address: child}}
	for _, length := range xprocLengths {
		runRanks(t, p, fmt.Sprintf("xproc-%d", length), []int{0, 1, 2}, peers, length, 2)
	}
	res, err := out.ReadString('\n')
	if err != nil || strings.TrimSpace(res) != "ok" {
		t.Fatalf("child: %q %v", res, err)
	}
}

func childPlane() (*actors.System, *Plane, error) {
	sys, err := actors.NewSystem(actors.Config{Remote: &actors.RemoteConfig{}})
	if err != nil {
		return nil, nil, err
	}
	p, err := NewPlane(sys, token, "127.0.0.1", nil)
	if err != nil {
		return nil, nil, err
	}
	return sys, p, nil
}

func TestMain(m *testing.M) {
	hierTestMain()
	if os.Getenv("ATOLL_COLL_TEST_CHILD") == "1" {
		sys, p, err := childPlane()
		if err != nil {
			fmt.Println(err)
			os.Exit(1)
		}
		fmt.Println(sys.Address())
		var parent string
		fmt.Scanln(&parent)
		peers := []Peer{{Address: parent}, {Address: parent}, {Address: parent}, {Address: sys.Address()}, {Address: sys.Address()}, {Address: sys.Address()}}
		var wg sync.WaitGroup
		var mu sync.Mutex
		var firstErr error
		for _, r := range []int{3, 4, 5} {
			wg.Add(1)
			go func(r int) {
				defer wg.Done()
				for _, length := range xprocLengths {
					mem, _ := p.Join("job", fmt.Sprintf("xproc-%d", length), 0, r, peers)
					for k := 0; k < 2; k++ {
						v := vector(r, length)
						ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
						err := mem.AllReduce(ctx, v)
						cancel()
						w := want(6, length)
						for j := range w {
							if err == nil && v[j] != w[j] {
								err = fmt.Errorf("rank %d [%d] = %v, want %v", r, j, v[j], w[j])
							}
						}
						if err != nil {
							mu.Lock()
							firstErr = err
							mu.Unlock()
							return
						}
					}
				}
			}(r)
		}
		wg.Wait()
		if firstErr != nil {
			fmt.Println(firstErr)
			os.Exit(1)
		}
		fmt.Println("ok")
		// Stay up until the parent has read our last chunks.
		var end string
		fmt.Scanln(&end)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestSkippedCollectiveKeepsRanksInStep: ranks 0 and 1 begin a collective that rank 2's
// caller gave up on before it began (Skip); theirs fails, on both alike, and the next
// collective of every rank sums exactly, the chunks of the skipped one dropped.
func TestSkippedCollectiveKeepsRanksInStep(t *testing.T) {
	sys, p := newPlane(t, false)
	for _, length := range []int{5, 40000} { // recursive doubling, the ring
		gang := fmt.Sprintf("skip-%d", length)
		peers := []Peer{{Address: sys.Address()}, {Address: sys.Address()}, {Address: sys.Address()}}
		ms := make([]*Member, len(peers))
		for r := range ms {
			ms[r], _ = p.Join("job", gang, 0, r, peers)
		}
		ms[2].Skip()
		errs := make(chan error, 2)
		for r := 0; r < 2; r++ {
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
				defer cancel()
				errs <- ms[r].AllReduce(ctx, vector(r, length))
			}()
		}
		for range 2 {
			if err := <-errs; !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("length %d: the skipped collective on a rank that began it: %v, want its deadline", length, err)
			}
		}
		var wg sync.WaitGroup
		got := make([][]float32, len(ms))
		fail := make([]error, len(ms))
		for r, m := range ms {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				got[r] = vector(r, length)
				fail[r] = m.AllReduce(ctx, got[r])
			}()
		}
		wg.Wait()
		w := want(len(ms), length)
		for r := range ms {
			if fail[r] != nil {
				t.Fatalf("length %d rank %d: the collective after the skipped one: %v", length, r, fail[r])
			}
			for j := range w {
				if got[r][j] != w[j] {
					t.Fatalf("length %d rank %d: [%d] = %v, want %v", length, r, j, got[r][j], w[j])
				}
			}
		}
	}
}
