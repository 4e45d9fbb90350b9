package head

import (
	"syscall"
	"testing"
)

// TestMaxAPIConns: the API's connection bound is the configured one, or half of the
// process's open-file limit (at least 256), leaving the other half to the Paxos links, the
// log and the gossip.
func TestMaxAPIConns(t *testing.T) {
	if got := maxAPIConns(100); got != 100 {
		t.Fatalf("configured 100: %d", got)
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Skip(err)
	}
	want := max(256, int(lim.Cur/2))
	if lim.Cur > 1<<30 {
		want = 1 << 14
	}
	if got := maxAPIConns(0); got != want || uint64(got) > max(256, lim.Cur) {
		t.Fatalf("default: %d, want %d (open-file limit %d)", got, want, lim.Cur)
	}
}
