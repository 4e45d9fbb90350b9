package runtime

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

func TestRingAllReduce(t *testing.T) {
	for _, tc := range []struct{ n, length int }{{1, 5}, {2, 7}, {3, 10}, {8, 1000}, {8, 3}, {5, 0}} {
		r := NewRing(tc.n)
		bufs := make([][]float32, tc.n)
		want := make([]float32, tc.length)
		for i := range bufs {
			bufs[i] = make([]float32, tc.length)
			for j := range bufs[i] {
				bufs[i][j] = float32(i*100 + j)
				want[j] += float32(i*100 + j)
			}
		}
		var wg sync.WaitGroup
		errs := make([]error, tc.n)
		for i := 0; i < tc.n; i++ {
			wg.Add(1)
			go func(i int) { defer wg.Done(); errs[i] = r.AllReduce(context.Background(), i, bufs[i]) }(i)
		}
		wg.Wait()
		for i := range bufs {
			if errs[i] != nil {
				t.Fatalf("n=%d rank %d: %v", tc.n, i, errs[i])
			}
			for j := range want {
				if bufs[i][j] != want[j] {
					t.Fatalf("n=%d len=%d rank %d [%d] = %v, want %v", tc.n, tc.length, i, j, bufs[i][j], want[j])
				}
			}
		}
	}
}

func TestRingAbortAndDeadline(t *testing.T) {
	r := NewRing(4)
	done := make(chan error, 3)
	for i := 0; i < 3; i++ { // rank 3 never comes
		go func(i int) { done <- r.AllReduce(context.Background(), i, make([]float32, 8)) }(i)
	}
	time.Sleep(10 * time.Millisecond)
	r.Abort()
	for i := 0; i < 3; i++ {
		if err := <-done; !errors.Is(err, ErrAborted) {
			t.Fatalf("aborted ring: %v", err)
		}
	}
	r2 := NewRing(2)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := r2.AllReduce(ctx, 0, make([]float32, 4)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("lonely rank: %v", err)
	}
	if err := r2.AllReduce(ctx, 7, nil); !errors.Is(err, ErrInvalidRequest) {
		t.Fatalf("bad rank: %v", err)
	}
}

func TestRingOverObjectStore(t *testing.T) {
	ctx := context.Background()
	l, err := StartLocal(ctx, Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Shutdown(ctx)
	// Ranks on two machines: chunks between them are pulled over the transfer plane.
	machines := []int{0, 0, 0, 1, 1, 1}
	r := NewRingOver(len(machines), l.RingPlane("test", machines))
	const length = 10007
	bufs := make([][]float32, len(machines))
	want := make([]float32, length)
	for i := range bufs {
		bufs[i] = make([]float32, length)
		for j := range bufs[i] {
			bufs[i][j] = float32(i + j%13)
			want[j] += float32(i + j%13)
		}
	}
	var wg sync.WaitGroup
	errs := make([]error, len(machines))
	for i := range machines {
		wg.Add(1)
		go func(i int) { defer wg.Done(); errs[i] = r.AllReduce(ctx, i, bufs[i]) }(i)
	}
	wg.Wait()
	for i := range bufs {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		for j := range want {
			if bufs[i][j] != want[j] {
				t.Fatalf("rank %d [%d] = %v, want %v", i, j, bufs[i][j], want[j])
			}
		}
	}
	// Every chunk was freed after use (a transfer server may pin a chunk it has just served
	// for a moment longer).
	for m := 0; m < 2; m++ {
		deadline := time.Now().Add(2 * time.Second)
		for l.Agents[m].Node.Store.Stats().Objects != 0 && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if st := l.Agents[m].Node.Store.Stats(); st.Objects != 0 {
			t.Fatalf("machine %d still holds %d objects after the AllReduce", m, st.Objects)
		}
	}
}

func TestAbortedRingLeavesNoChunks(t *testing.T) {
	ctx := context.Background()
	l, err := StartLocal(ctx, Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Shutdown(ctx)
	machines := []int{0, 0, 1, 1}
	r := NewRingOver(len(machines), l.RingPlane("aborted", machines))
	done := make(chan error, 3)
	for i := 0; i < 3; i++ { // rank 3 never joins: its neighbour's chunks pile up unread
		go func(i int) { done <- r.AllReduce(ctx, i, make([]float32, 4096)) }(i)
	}
	time.Sleep(50 * time.Millisecond)
	r.Abort()
	for i := 0; i < 3; i++ {
		if err := <-done; !errors.Is(err, ErrAborted) {
			t.Fatalf("rank: %v, want ErrAborted", err)
		}
	}
	deadline := time.Now().Add(3 * time.Second)
	for m := 0; m < 2; m++ {
		for l.Agents[m].Node.Store.Stats().Objects != 0 && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if n := l.Agents[m].Node.Store.Stats().Objects; n != 0 {
			t.Fatalf("machine %d still holds %d chunks of the aborted ring", m, n)
		}
	}
}
