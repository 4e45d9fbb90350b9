package object

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// TestCopy: every size around the thresholds and the parts' edges is copied whole, byte
// for byte, and no byte past the shorter slice is written.
func TestCopy(t *testing.T) {
	src := make([]byte, parallelCopyMin+3*parallelCopyBlock+4097)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range src {
		src[i] = byte(r.Uint32())
	}
	for _, n := range []int{0, 1, 4095, parallelCopyMin - 1, parallelCopyMin, parallelCopyMin + 1, parallelCopyMin + 4096, len(src)} {
		dst := make([]byte, n+8)
		for i := range dst {
			dst[i] = 0xEE
		}
		if got := Copy(dst[:n], src); got != n {
			t.Fatalf("Copy of %d bytes returned %d", n, got)
		}
		if !bytes.Equal(dst[:n], src[:n]) {
			t.Fatalf("Copy of %d bytes: the copy differs", n)
		}
		if !bytes.Equal(dst[n:], bytes.Repeat([]byte{0xEE}, 8)) {
			t.Fatalf("Copy of %d bytes wrote past its end", n)
		}
	}
	// A longer destination: only len(src) bytes.
	dst := make([]byte, len(src)+100)
	if got := Copy(dst, src); got != len(src) || !bytes.Equal(dst[:len(src)], src) {
		t.Fatalf("Copy into a longer slice returned %d", got)
	}
}

func BenchmarkCopy800MB(b *testing.B) {
	src, dst := make([]byte, 800<<20), make([]byte, 800<<20)
	copy(dst, src)
	b.Run("copy", func(b *testing.B) {
		b.SetBytes(int64(len(src)))
		for b.Loop() {
			copy(dst, src)
		}
	})
	b.Run("Copy", func(b *testing.B) {
		b.SetBytes(int64(len(src)))
		for b.Loop() {
			Copy(dst, src)
		}
	})
}
