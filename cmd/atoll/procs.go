package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The processes `atoll up` starts are identified by more than their pid: a pid is reused
// once its process is gone (after a SIGKILL of the cluster, or a reboot), and signalling the
// recorded pid would then hit an unrelated process. Each record keeps what the kernel says
// of the process when it started it: its start time (/proc/PID/stat field 22, clock ticks
// since boot: a process that reuses the pid starts later) and its command line. `atoll
// down` signals, and `atoll up` counts as running, only a process that matches both.
// Records written before these were kept (and pool agents' pid files) are matched by their
// command line naming the process's own directory in the cluster directory.

// procIdentity is what /proc says of a process.
type procIdentity struct {
	start   uint64   // field 22 of /proc/PID/stat
	cmdline []string // /proc/PID/cmdline
	state   byte     // field 3: R, S, D, Z (zombie), X (dead)...
}

// errNoProc says this system has no /proc: processes are then known by their pid alone.
var errNoProc = errors.New("no /proc on this system")

// readProc reads a process's identity.
func readProc(pid int) (procIdentity, error) {
	if pid <= 0 {
		return procIdentity{}, fmt.Errorf("pid %d", pid)
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		if _, serr := os.Stat("/proc/self/stat"); serr != nil {
			return procIdentity{}, errNoProc
		}
		return procIdentity{}, err
	}
	// "pid (comm) state ppid ...": the command name may hold spaces and parentheses, so the
	// fields are counted from the last ')'.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return procIdentity{}, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(stat[i+1:])) // f[0] is field 3 (state), f[19] field 22
	if len(f) < 20 || len(f[0]) != 1 {
		return procIdentity{}, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	start, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return procIdentity{}, fmt.Errorf("/proc/%d/stat: start time %q: %w", pid, f[19], err)
	}
	cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return procIdentity{}, err
	}
	args := strings.Split(strings.TrimSuffix(string(cmd), "\x00"), "\x00")
	if len(cmd) == 0 {
		args = nil // a zombie, or a kernel thread
	}
	return procIdentity{start: start, cmdline: args, state: f[0][0]}, nil
}

// identify records the identity of a process just started. exec.Cmd.Start returns when
// the child's execve has closed its close-on-exec pipe, which is before the kernel has set
// up the new program's arguments: for that moment /proc/PID/cmdline reads empty. An empty
// command line recorded then would never match the running process again, and `atoll down`
// would leave it running; so identify reads until the command line is there (bounded).
func (p *procInfo) identify() error {
	var id procIdentity
	var err error
	for try := 0; try < 200; try++ {
		id, err = readProc(p.PID)
		if errors.Is(err, errNoProc) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s (pid %d) is not running: %w", p.Name, p.PID, err)
		}
		if len(id.cmdline) > 0 || id.state == 'Z' || id.state == 'X' {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if len(id.cmdline) == 0 {
		return fmt.Errorf("%s (pid %d) has no command line a second after it started (state %c)", p.Name, p.PID, id.state)
	}
	p.Start, p.Cmdline = id.start, id.cmdline
	return nil
}

// running reports whether the process this record names runs: its pid is alive (not a
// zombie) and is the same process (start time and command line), not one that reused it.
func (p procInfo) running() bool {
	id, err := readProc(p.PID)
	if errors.Is(err, errNoProc) {
		return alive(p.PID)
	}
	if err != nil || id.state == 'Z' || id.state == 'X' {
		return false
	}
	if p.Start != 0 || len(p.Cmdline) > 0 {
		return id.start == p.Start && slices.Equal(id.cmdline, p.Cmdline)
	}
	// A record without an identity: the process must name its directory.
	return p.Dir != "" && slices.Contains(id.cmdline, p.Dir)
}

// signal sends sig to the process this record names if it still runs. It reports whether
// it was sent. The process is held by a pidfd while it is checked, so that the signal
// reaches the process checked even if it died and its pid was reused in between.
func (p procInfo) signal(sig syscall.Signal) bool {
	fd, err := unix.PidfdOpen(p.PID, 0)
	if err != nil { // gone, or a kernel without pidfds (before 5.3)
		return p.running() && syscall.Kill(p.PID, sig) == nil
	}
	defer unix.Close(fd)
	if !p.running() {
		return false
	}
	return unix.PidfdSendSignal(fd, sig, nil, 0) == nil
}
