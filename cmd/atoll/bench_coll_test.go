package main

import (
	"fmt"
	"net"
	"testing"
)

// TestBaselineCollectives: the bare-TCP baselines of `atoll bench collectives` compute
// what they claim (exact results on small integers), so their times are honest.
func TestBaselineCollectives(t *testing.T) {
	for _, n := range []int{2, 3, 5} {
		for _, length := range []int{n, 17, 1 << 20} {
			t.Run(fmt.Sprintf("%d ranks %d floats", n, length), func(t *testing.T) {
				// A ring of in-memory connections: rank r reads from left[r], writes to right[r].
				left, right := make([]net.Conn, n), make([]net.Conn, n)
				for r := 0; r < n; r++ {
					a, b := net.Pipe()
					right[r], left[(r+1)%n] = a, b
				}
				errs := make(chan error, n)
				for r := 0; r < n; r++ {
					go func() { errs <- baselineRank(left[r], right[r], r, n, length) }()
				}
				for r := 0; r < n; r++ {
					if err := <-errs; err != nil {
						t.Fatal(err)
					}
				}
			})
		}
	}
}

func baselineRank(left, right net.Conn, rank, n, length int) error {
	v := make([]float32, length)
	buf := make([]byte, 4*(length/n+1))
	lo, hi := bounds(length, n, rank)
	for i := range v {
		v[i] = -1
	}
	for i := lo; i < hi; i++ {
		v[i] = float32(rank + 1)
	}
	if err := tcpAllGather(left, right, rank, n, v); err != nil {
		return err
	}
	for r := 0; r < n; r++ {
		rlo, rhi := bounds(length, n, r)
		for i := rlo; i < rhi; i++ {
			if v[i] != float32(r+1) {
				return fmt.Errorf("rank %d allgather [%d] = %v, want %v", rank, i, v[i], r+1)
			}
		}
	}
	for i := range v {
		v[i] = float32(rank + 1)
	}
	if err := tcpReduceScatter(left, right, rank, n, v, buf); err != nil {
		return err
	}
	for i := lo; i < hi; i++ {
		if v[i] != float32(n*(n+1)/2) {
			return fmt.Errorf("rank %d reducescatter [%d] = %v, want %v", rank, i, v[i], n*(n+1)/2)
		}
	}
	root := n - 1
	for i := range v {
		v[i] = float32(rank)
	}
	if err := tcpBroadcast(left, right, rank, n, root, v); err != nil {
		return err
	}
	for i := range v {
		if v[i] != float32(root) {
			return fmt.Errorf("rank %d broadcast [%d] = %v, want %v", rank, i, v[i], root)
		}
	}
	return nil
}
