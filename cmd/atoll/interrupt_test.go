package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/atoll-run/atoll/internal/testtime"
)

// owned lists what a demo process of pid holds: its shared-memory directories and its
// temporary directories under tmp.
func owned(t *testing.T, pid int, tmp string) []string {
	t.Helper()
	shm, _ := filepath.Glob(fmt.Sprintf("/dev/shm/atoll-%d-*", pid))
	dirs, _ := filepath.Glob(filepath.Join(tmp, fmt.Sprintf("atoll-*-%d-*", pid)))
	return append(shm, dirs...)
}

// startDemo starts a long embedded demo and waits until it holds shared memory and a
// temporary directory.
func startDemo(t *testing.T, bin, tmp string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(bin, "demo", "--steps", "1000000", "--kill-at", "-1", "--json")
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := testtime.Deadline(t, time.Minute)
	for len(owned(t, cmd.Process.Pid, tmp)) < 2 {
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			t.Fatal("the demo made no shared memory or temporary directory by its deadline")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return cmd
}

// SIGINT and SIGTERM stop the demo with its shared memory and temporary directories
// removed; what a SIGKILL leaves, the next run removes.
func TestInterruptedDemoLeavesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the demo")
	}
	if _, err := os.Stat("/dev/shm"); err != nil {
		t.Skip("no /dev/shm here")
	}
	t.Parallel()
	tmp := t.TempDir()
	bin := buildAtoll(t)
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		cmd := startDemo(t, bin, tmp)
		if err := cmd.Process.Signal(sig); err != nil {
			t.Fatal(err)
		}
		err := cmd.Wait()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 130 {
			t.Errorf("%v: exit %v, want status 130", sig, err)
		}
		if left := owned(t, cmd.Process.Pid, tmp); len(left) != 0 {
			t.Errorf("%v left %v", sig, left)
		}
	}
	cmd := startDemo(t, bin, tmp)
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	killed := owned(t, cmd.Process.Pid, tmp)
	if len(killed) < 2 {
		t.Fatalf("SIGKILL left %v: nothing to reclaim (the test did not test)", killed)
	}
	next := exec.Command(bin, "demo", "--steps", "2", "--kill-at", "-1", "--json")
	next.Env = append(os.Environ(), "TMPDIR="+tmp)
	if out, err := next.CombinedOutput(); err != nil {
		t.Fatalf("the next demo: %v\n%s", err, out)
	}
	if left := owned(t, cmd.Process.Pid, tmp); len(left) != 0 {
		t.Errorf("the next run did not reclaim %v", left)
	}
}
