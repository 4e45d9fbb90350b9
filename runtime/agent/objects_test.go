package agent

import (
	"testing"
	"time"
)

// TestReconcilePause: a quick pass waits the interval; a slow one waits reconcileDuty
// times its length, at most maxReconcilePause (never less than the interval).
func TestReconcilePause(t *testing.T) {
	for _, c := range []struct{ interval, took, want time.Duration }{
		{10 * time.Second, 20 * time.Millisecond, 10 * time.Second},
		{10 * time.Second, 2 * time.Second, 40 * time.Second},
		{10 * time.Second, time.Minute, maxReconcilePause},
		{5 * time.Minute, time.Minute, 5 * time.Minute},
	} {
		if got := reconcilePause(c.interval, c.took); got != c.want {
			t.Errorf("reconcilePause(%v, %v) = %v, want %v", c.interval, c.took, got, c.want)
		}
	}
}
