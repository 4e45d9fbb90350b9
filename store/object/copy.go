package object

import (
	"runtime"
	"sync"
)

// Copy thresholds: below parallelCopyMin one copy is as fast (starting goroutines costs
// microseconds); above it the bytes go in blocks of at least parallelCopyBlock, one
// goroutine per block, on at most parallelCopyThreads at once.
const (
	parallelCopyMin     = 16 << 20
	parallelCopyBlock   = 4 << 20
	parallelCopyThreads = 4
)

// Copy copies src into dst (as copy does) and returns the number of bytes copied. A large
// copy runs on several cores: one core's memmove does not saturate a machine's memory
// bandwidth (on this project's 2-core VM one copy of 800 MB runs at 6 GB/s, two at 11).
// Ray's object store does the same for puts (plasma's memcopy_threads).
func Copy(dst, src []byte) int {
	n := min(len(dst), len(src))
	threads := min(runtime.GOMAXPROCS(0), parallelCopyThreads, n/parallelCopyBlock)
	if n < parallelCopyMin || threads < 2 {
		return copy(dst, src)
	}
	part := (n + threads - 1) / threads
	part = (part + 4095) &^ 4095 // page-aligned parts: no two goroutines write one page
	var wg sync.WaitGroup
	for off := part; off < n; off += part {
		end := min(off+part, n)
		wg.Add(1)
		go func() {
			defer wg.Done()
			copy(dst[off:end], src[off:end])
		}()
	}
	copy(dst[:min(part, n)], src[:min(part, n)])
	wg.Wait()
	return n
}
