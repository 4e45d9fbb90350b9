package transfer

import (
	"fmt"
	"time"
)

// ChunkConfig bounds the adaptive chunk size.
type ChunkConfig struct {
	Min, Max, Initial int64
	// Target is how long one chunk should take on the wire: long enough that the
	// per-chunk cost (a request, a header, a hash call, a wakeup) is small, short
	// enough that a re-fetch is cheap. Default 2ms.
	Target time.Duration
}

// DefaultChunkConfig returns 256 KiB .. 16 MiB, starting at 1 MiB.
func DefaultChunkConfig() ChunkConfig {
	return ChunkConfig{Min: 256 << 10, Max: 16 << 20, Initial: 1 << 20, Target: 2 * time.Millisecond}
}

// Validate reports the first bad field.
func (c ChunkConfig) Validate() error {
	if c.Min <= 0 || c.Max < c.Min || c.Initial < c.Min || c.Initial > c.Max || c.Max > MaxChunk || c.Target <= 0 {
		return fmt.Errorf("transfer: chunk config: want 0 < Min %d <= Initial %d <= Max %d <= %d and Target %v > 0",
			c.Min, c.Initial, c.Max, MaxChunk, c.Target)
	}
	return nil
}

// ChunkSizer picks the next chunk size from measured bandwidth and RTT. It is a
// pure value: the caller measures and passes the times in. Not safe for
// concurrent use.
type ChunkSizer struct {
	cfg    ChunkConfig
	bw     float64       // bytes/s, EWMA
	minRTT time.Duration // smallest data-free round trip seen
}

// NewChunkSizer returns a sizer starting at cfg.Initial.
func NewChunkSizer(cfg ChunkConfig) *ChunkSizer { return &ChunkSizer{cfg: cfg} }

// ObserveRTT records a round trip that carried no data (the Open of a pull).
func (s *ChunkSizer) ObserveRTT(d time.Duration) {
	if d > 0 && (s.minRTT == 0 || d < s.minRTT) {
		s.minRTT = d
	}
}

// Observe records that a chunk of n bytes took lat from request to verified
// arrival while inflight chunks (this one included) shared the path. The link
// rate is estimated from the time beyond one RTT.
func (s *ChunkSizer) Observe(n int64, lat time.Duration, inflight int) {
	if lat <= 0 || n <= 0 {
		return
	}
	wire := lat - s.minRTT
	if wire <= lat/10 {
		wire = lat
	}
	sample := float64(n) * float64(max(inflight, 1)) / wire.Seconds()
	if s.bw == 0 {
		s.bw = sample
	} else {
		s.bw = 0.8*s.bw + 0.2*sample
	}
}

// Next returns the next chunk size: bandwidth × max(Target, RTT), so that on a
// long path a chunk covers the bandwidth-delay product, clamped to [Min, Max] and
// rounded down to 64 KiB.
func (s *ChunkSizer) Next() int64 {
	if s.bw == 0 {
		return s.cfg.Initial
	}
	d := max(s.cfg.Target, s.minRTT)
	n := int64(s.bw * d.Seconds())
	n = min(max(n, s.cfg.Min), s.cfg.Max)
	if n > 64<<10 {
		n &^= 64<<10 - 1
	}
	return n
}
