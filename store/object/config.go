package object

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// Config tunes a Store. DefaultConfig works as-is.
type Config struct {
	// ShmDir is the shared-memory filesystem where hot objects live, one file each
	// (under a per-store subdirectory). Default /dev/shm.
	ShmDir string
	// Capacity is the most bytes the hot tier holds. Admission never goes past it.
	// Default: CapacityShare of physical RAM.
	Capacity int64
	// CapacityShare is the share of RAM used when Capacity is 0. Default 0.3.
	CapacityShare float64
	// MaxObjectSize is the largest object the store takes; a larger put or create
	// fails at once with ErrTooLarge, naming the limit (an agent answers 413).
	// Default (0): the capacity, which is also the most it can be.
	MaxObjectSize int64
	// SmallMax: objects up to this size share slab files instead of one file each.
	// Default min(64 KiB, SlabSize/4).
	SmallMax int64
	// SlabSize is the size of one slab file. Default min(4 MiB, Capacity/16), at least 64 KiB.
	SlabSize int64
	// RecycleBytes bounds the freed large-object memory kept mapped for reuse (it
	// counts against Capacity and is dropped first under pressure). Default Capacity.
	RecycleBytes int64
	// FingerprintOnPut computes the xxhash64 during Put. Default false: it is
	// computed on first need (serving a transfer, spilling, View.Fingerprint), since
	// a same-machine get never needs it and hashing halves put bandwidth.
	FingerprintOnPut bool
	// Location is this store's transfer address as recorded in the Directory.
	Location string
	// Directory receives object metadata. Default: a fresh MemDirectory.
	Directory Directory
	// Spill is where the cold tier writes. Default DirFS{dir/spill}.
	Spill SpillFS
	// SpillCompression is the zstd level name: "fastest", "default", "better". Default "fastest":
	// spilling is on the put path, so speed beats ratio.
	SpillCompression string
	// LeaseTTL is how long a holder that called Renew keeps its references without
	// renewing. Holders that never renew have no lease. Default 10s.
	LeaseTTL time.Duration
	// DirectoryTimeout bounds a directory write the store makes on nobody's
	// behalf: the removal of a location when a view's release, a mapping's end or
	// a lease's expiry frees an object, and the registration of recovered
	// objects at Open. Writes made for a caller use the caller's context.
	// Default 10s.
	DirectoryTimeout time.Duration
	// LockWait is how long Open waits for another holder of the directory to let go
	// before it fails with ErrDirInUse: a process restarted right after its predecessor
	// was killed (an agent's supervisor) finds the lock held until the kernel has torn the
	// dead process down. Default 0: fail at once.
	LockWait time.Duration
	// Clock returns the time; only lease bookkeeping reads it. Default time.Now.
	Clock func() time.Time
	// Logger, default zap.NewNop().
	Logger *zap.Logger
	// Registerer receives the store's counters; nil registers nothing.
	Registerer prometheus.Registerer

	hooks  *hooks                                          // tests only
	statfs func(dir string) (free, total int64, err error) // default: statfs(2); tests fake a small /dev/shm
}

// DefaultConfig returns a config with a capacity of 30% of RAM.
func DefaultConfig() Config {
	return Config{ShmDir: "/dev/shm", CapacityShare: 0.3, SpillCompression: "fastest", LeaseTTL: 10 * time.Second,
		DirectoryTimeout: 10 * time.Second}
}

// DefaultLocalConfig is DefaultConfig with a small capacity (256 MiB), for tests.
func DefaultLocalConfig() Config {
	c := DefaultConfig()
	c.Capacity = 256 << 20
	return c
}

// Validate reports the first bad field.
func (c Config) Validate() error {
	switch {
	case c.ShmDir == "":
		return fmt.Errorf("object: config: ShmDir is empty")
	case c.Capacity < 0:
		return fmt.Errorf("object: config: Capacity %d is negative", c.Capacity)
	case c.MaxObjectSize < 0:
		return fmt.Errorf("object: config: MaxObjectSize %d is negative", c.MaxObjectSize)
	case c.Capacity == 0 && (c.CapacityShare <= 0 || c.CapacityShare > 0.9):
		return fmt.Errorf("object: config: CapacityShare %v must be in (0, 0.9] when Capacity is 0", c.CapacityShare)
	case c.SmallMax < 0 || c.SlabSize < 0 || c.RecycleBytes < 0:
		return fmt.Errorf("object: config: SmallMax %d, SlabSize %d, RecycleBytes %d must not be negative", c.SmallMax, c.SlabSize, c.RecycleBytes)
	case c.SlabSize != 0 && c.SlabSize%4096 != 0:
		return fmt.Errorf("object: config: SlabSize %d is not a multiple of 4096", c.SlabSize)
	case c.LeaseTTL <= 0:
		return fmt.Errorf("object: config: LeaseTTL %v must be positive", c.LeaseTTL)
	case c.DirectoryTimeout < 0:
		return fmt.Errorf("object: config: DirectoryTimeout %v is negative", c.DirectoryTimeout)
	}
	switch c.SpillCompression {
	case "fastest", "default", "better", "":
	default:
		return fmt.Errorf("object: config: SpillCompression %q: want fastest, default or better", c.SpillCompression)
	}
	return nil
}

func ramBytes() int64 {
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil {
		return 4 << 30
	}
	return int64(si.Totalram) * int64(si.Unit)
}
