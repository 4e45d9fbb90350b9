package coll

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// shmDir is where a machine's collective segments are created (tmpfs: shared memory).
var shmDir = "/dev/shm"

// A segment is the shared memory of one gang generation's members on one machine: a
// header page (a futex barrier and each member's vector length), then the data area the
// hierarchical collectives lay out (one slot per local member and a packed area). Every
// local member opens the same file; once all have (the first barrier), the lowest unlinks
// it, so a crash leaves nothing behind in /dev/shm.
type segment struct {
	f     *os.File
	path  string
	mem   []byte
	local int // this member's index among the machine's members
	size  int // the machine's members
	first bool
	// broken: a collective failed between barriers; the segment's barrier counts no
	// longer agree between members, so no later collective may use it.
	broken bool
}

const (
	shmHeader    = 4096
	shmMaxLocal  = (shmHeader - 64) / 16
	futexWait    = 0
	futexWake    = 1
	barrierCount = 0
	barrierGen   = 4
	shmPollEvery = 50 * time.Millisecond
)

// errBroken: an earlier collective of this machine's group failed half-way.
var errBroken = errors.New("coll: the machine's shared-memory group is broken by an earlier failed collective")

// segmentName names a group's segment: a hash of its gang generation, machine and every
// member's address (a process's address is new each time it starts, so a file left by
// a crash is never taken for this group's).
func segmentName(job, gang string, gen int64, machine string, peers []Peer) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00%d\x00%s", job, gang, gen, machine)
	for _, p := range peers {
		fmt.Fprintf(h, "\x00%s", p.Address)
	}
	return "atoll-coll-" + hex.EncodeToString(h.Sum(nil)[:12])
}

// openSegment opens (creating it if this member is first) a group's segment.
func openSegment(name string, local, size int) (*segment, error) {
	if size > shmMaxLocal {
		return nil, fmt.Errorf("coll: %d members on one machine (at most %d share a segment)", size, shmMaxLocal)
	}
	path := filepath.Join(shmDir, name)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("coll: open shared memory %s: %w", path, err)
	}
	s := &segment{f: f, path: path, local: local, size: size, first: true}
	if err := s.grow(0); err != nil {
		_ = f.Close()
		return nil, err
	}
	return s, nil
}

// grow makes the data area at least n bytes (fallocate never shrinks the file, so members
// growing it at once cannot cut each other's mapping) and maps it.
func (s *segment) grow(n int) error {
	want := shmHeader + n
	if len(s.mem) >= want {
		return nil
	}
	if err := unix.Fallocate(int(s.f.Fd()), 0, 0, int64(want)); err != nil {
		return fmt.Errorf("coll: allocate shared memory %s (%d bytes): %w", s.path, want, err)
	}
	b, err := unix.Mmap(int(s.f.Fd()), 0, want, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("coll: map shared memory %s (%d bytes): %w", s.path, want, err)
	}
	if s.mem != nil {
		_ = unix.Munmap(s.mem)
	}
	s.mem = b
	return nil
}

// close unmaps the segment and removes its file if it is still there.
func (s *segment) close() {
	if s.mem != nil {
		_ = unix.Munmap(s.mem)
		s.mem = nil
	}
	_ = s.f.Close()
	_ = os.Remove(s.path)
}

func (s *segment) word(off int) *uint32 { return (*uint32)(unsafe.Pointer(&s.mem[off])) }

// setCall and call are the collective each member is in (its op code and vector length),
// compared after a barrier.
func (s *segment) setCall(op, n int) {
	atomic.StoreInt64((*int64)(unsafe.Pointer(&s.mem[64+16*s.local])), int64(op))
	atomic.StoreInt64((*int64)(unsafe.Pointer(&s.mem[72+16*s.local])), int64(n))
}

func (s *segment) call(j int) (op, n int) {
	return int(atomic.LoadInt64((*int64)(unsafe.Pointer(&s.mem[64+16*j])))),
		int(atomic.LoadInt64((*int64)(unsafe.Pointer(&s.mem[72+16*j]))))
}

// floats is the data area's float32s from byte offset off (a multiple of 4), n of them.
func (s *segment) floats(off, n int) []float32 {
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&s.mem[shmHeader+off])), n)
}

// barrier waits until every local member has arrived (a sense-reversing barrier on two
// words of the header; waiters sleep in futex(2), woken by the last to arrive). It gives
// up when ctx or done ends, and the segment is then broken.
func (s *segment) barrier(ctx context.Context, done <-chan struct{}) error {
	if s.broken {
		return errBroken
	}
	cnt, gen := s.word(barrierCount), s.word(barrierGen)
	g := atomic.LoadUint32(gen)
	if atomic.AddUint32(cnt, 1) == uint32(s.size) {
		atomic.StoreUint32(cnt, 0)
		atomic.AddUint32(gen, 1)
		futex(gen, futexWake, math.MaxInt32, nil)
	} else {
		ts := unix.NsecToTimespec(int64(shmPollEvery))
		for atomic.LoadUint32(gen) == g {
			futex(gen, futexWait, g, &ts)
			if atomic.LoadUint32(gen) != g {
				break
			}
			select {
			case <-done:
				s.broken = true
				return ErrAborted
			case <-ctx.Done():
				s.broken = true
				return fmt.Errorf("waiting for the other members on this machine: %w", ctx.Err())
			default:
			}
		}
	}
	if s.first {
		// Every member has the file open: nobody needs its name any more.
		s.first = false
		if s.local == 0 {
			_ = os.Remove(s.path)
		}
	}
	return nil
}

// futex is futex(2) on a word of a shared mapping (not FUTEX_PRIVATE: the waiters are in
// other processes).
func futex(addr *uint32, op int, val uint32, ts *unix.Timespec) {
	_, _, _ = unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), uintptr(op), uintptr(val), uintptr(unsafe.Pointer(ts)), 0, 0)
}
