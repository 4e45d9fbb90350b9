// Package testtime gives the project's tests their deadlines. A test states how long a wait
// takes on a quiet machine; Scale stretches that by how slow this machine is, so that a
// test waits long enough on a loaded machine (a shared 2-core runner, -race) and still
// fails, with its own message, when the event never comes.
//
//	ctx, cancel := testtime.Context(t, time.Minute) // the whole test
//	defer cancel()
//	cctx, ccancel := context.WithTimeout(ctx, testtime.Scale(20*time.Second)) // one collective
//
// The factor is ATOLL_TEST_SLOWDOWN when set (a number, at least 1); otherwise the load
// average per CPU when the tests start, when above 1 (at most MaxFactor).
package testtime

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Env names the variable that sets the factor: ATOLL_TEST_SLOWDOWN=3 gives every wait
// three times its quiet-machine figure.
const Env = "ATOLL_TEST_SLOWDOWN"

// MaxFactor bounds the factor measured from the load average (not one set by Env): the
// load average counts every runnable thread of the machine, and a test's processes get
// more of it than its share; a larger factor would mostly make a wait that never ends
// take longer to fail, out of the 10 minutes its package's tests share.
const MaxFactor = 4

// Grace is what Context leaves before the test binary's own deadline (go test -timeout),
// for the test to fail with its message and clean up (stop its cluster of processes).
const Grace = 30 * time.Second

var (
	once   sync.Once
	factor float64
	why    string
)

// Factor is how many times slower than a quiet machine this one runs the tests, and what
// says so.
func Factor() (float64, string) {
	once.Do(func() { factor, why = measure(os.Getenv(Env), loadPerCPU()) })
	return factor, why
}

// measure picks the factor from the variable's value (if any) and the load per CPU.
func measure(env string, load float64) (float64, string) {
	if env != "" {
		f, err := strconv.ParseFloat(env, 64)
		if err == nil && f >= 1 {
			return f, fmt.Sprintf("%s=%s", Env, env)
		}
		return 1, fmt.Sprintf("%s=%q is not a number ≥ 1: ignored", Env, env)
	}
	if load > 1 {
		return min(load, MaxFactor), fmt.Sprintf("load average %.1f per CPU", load)
	}
	return 1, "a quiet machine"
}

// loadPerCPU is the one-minute load average per CPU (0 where it cannot be read).
func loadPerCPU() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	fields := strings.Fields(string(b))
	if len(fields) == 0 {
		return 0
	}
	l, err := strconv.ParseFloat(fields[0], 64)
	if err != nil {
		return 0
	}
	return l / float64(runtime.NumCPU())
}

// Scale returns d, a wait's length on a quiet machine, times Factor.
func Scale(d time.Duration) time.Duration {
	f, _ := Factor()
	return time.Duration(float64(d) * f)
}

// Context returns a context that ends Scale(d) from now, or Grace before the test's own
// deadline when that comes first.
func Context(t testing.TB, d time.Duration) (context.Context, context.CancelFunc) {
	t.Helper()
	return context.WithDeadline(context.Background(), Deadline(t, d))
}

// Deadline is when a wait of d (on a quiet machine) that starts now must end: Scale(d) from
// now, or Grace before the test's own deadline when that comes first.
func Deadline(t testing.TB, d time.Duration) time.Time {
	t.Helper()
	at := time.Now().Add(Scale(d))
	if td, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		if end, ok := td.Deadline(); ok && end.Add(-Grace).Before(at) {
			at = end.Add(-Grace)
		}
	}
	return at
}
