package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/atoll-run/atoll/runtime/api"
)

func TestReadProcIdentifiesAProcess(t *testing.T) {
	sleep := exec.Command("sleep", "60")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sleep.Process.Kill(); _ = sleep.Wait() }()
	p := procInfo{Name: "sleep", PID: sleep.Process.Pid}
	if err := p.identify(); err != nil {
		t.Fatal(err)
	}
	if p.Start == 0 || !slices.Equal(p.Cmdline, []string{"sleep", "60"}) || !p.running() {
		t.Fatalf("identity %+v (running %v): want a start time and the command line", p, p.running())
	}
	for _, other := range []procInfo{
		{PID: p.PID, Start: p.Start + 1, Cmdline: p.Cmdline}, // the pid, reused later
		{PID: p.PID, Start: p.Start, Cmdline: []string{"atoll", "head"}},
		{PID: p.PID, Dir: "/nowhere"}, // an old record, naming its directory
	} {
		if other.running() || other.signal(syscall.SIGTERM) {
			t.Fatalf("%+v is taken for the process %+v", other, p)
		}
	}
	if !p.signal(syscall.SIGKILL) {
		t.Fatal("the process itself was not signalled")
	}
	_ = sleep.Wait()
	if p.running() {
		t.Fatal("a dead process is running")
	}
}

// clusterStatus runs `atoll status --json`.
func clusterStatus(t *testing.T, bin, dir string) api.Status {
	t.Helper()
	out, err := exec.Command(bin, "status", "--dir", dir, "--json").Output()
	if err != nil {
		t.Fatalf("atoll status: %v\n%s", err, out)
	}
	var st api.Status
	if err := json.Unmarshal(out, &st); err != nil {
		t.Fatalf("status --json: %v\n%s", err, out)
	}
	return st
}

// sigkill kills processes as a crash would and waits until they are gone.
func sigkill(t *testing.T, procs ...procInfo) {
	t.Helper()
	for _, p := range procs {
		_ = syscall.Kill(p.PID, syscall.SIGKILL)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, p := range procs {
		for alive(p.PID) {
			if time.Now().After(deadline) {
				t.Fatalf("%s (pid %d) survived SIGKILL", p.Name, p.PID)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// checkAgentsRegistered: every agent of the cluster file is a live machine of the status,
// registered by the process the file names, at the address the file names.
func checkAgentsRegistered(t *testing.T, cf *clusterFile, st api.Status) {
	t.Helper()
	for _, a := range cf.Agents {
		i := slices.IndexFunc(st.Machines, func(m api.MachineStatus) bool { return m.Name == a.Name })
		if i < 0 {
			t.Fatalf("agent %s is no machine of the status %+v", a.Name, st.Machines)
		}
		m := st.Machines[i]
		if !m.Alive || m.PID != a.PID || m.Agent != a.API || a.API == "" || !a.running() {
			t.Fatalf("machine %+v: want alive, registered by pid %d at %s (running %v)", m, a.PID, a.API, a.running())
		}
	}
}

// TestUpDownIdentifyTheirProcesses: after a SIGKILL of the whole cluster, with its pids
// reused by unrelated processes, `atoll down` signals none of them and `atoll up` starts
// the cluster again rather than refuse, returning once every agent registered from its new
// process at its new address; with one agent killed, up restarts it alone.
func TestUpDownIdentifyTheirProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster of processes")
	}
	tmp := t.TempDir()
	bin := buildAtoll(t, tmp)
	dir := filepath.Join(tmp, "cluster")
	up := func() *clusterFile {
		t.Helper()
		out, err := exec.Command(bin, "up", "--dir", dir, "--heads", "1", "--agents", "2", "--timeout", "2m").CombinedOutput()
		if err != nil {
			t.Fatalf("atoll up: %v\n%s", err, out)
		}
		cf, err := readClusterFile(dir)
		if err != nil {
			t.Fatal(err)
		}
		return cf
	}
	first := up()
	t.Cleanup(func() {
		if out, err := exec.Command(bin, "down", "--dir", dir, "--grace", "5s").CombinedOutput(); err != nil {
			t.Errorf("atoll down: %v\n%s", err, out)
		}
		if t.Failed() {
			logs, _ := filepath.Glob(filepath.Join(dir, "logs", "*.log"))
			for _, l := range logs {
				b, _ := os.ReadFile(l)
				if len(b) > 3000 {
					b = b[len(b)-3000:]
				}
				t.Logf("--- %s (tail)\n%s", filepath.Base(l), b)
			}
		}
	})
	checkAgentsRegistered(t, first, clusterStatus(t, bin, dir))

	// The whole cluster is SIGKILLed; unrelated processes get its pids.
	procs := append(append([]procInfo(nil), first.Heads...), first.Agents...)
	sigkill(t, procs...)
	exited := map[int]chan struct{}{}
	reused := *first
	reused.Heads, reused.Agents = slices.Clone(first.Heads), slices.Clone(first.Agents)
	for _, group := range [][]procInfo{reused.Heads, reused.Agents} {
		for i := range group {
			sleep := exec.Command("sleep", "600")
			if err := sleep.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan struct{})
			go func() { _ = sleep.Wait(); close(done) }()
			t.Cleanup(func() { _ = sleep.Process.Kill(); <-done })
			group[i].PID = sleep.Process.Pid
			exited[sleep.Process.Pid] = done
		}
	}
	if err := writeClusterFile(dir, &reused); err != nil {
		t.Fatal(err)
	}
	untouched := func(when string) {
		t.Helper()
		for pid, done := range exited {
			select {
			case <-done:
				t.Fatalf("%s: the unrelated process %d that reused a pid of the cluster was killed", when, pid)
			default:
			}
		}
	}
	if out, err := exec.Command(bin, "down", "--dir", dir, "--grace", "2s").CombinedOutput(); err != nil {
		t.Fatalf("atoll down after the SIGKILL: %v\n%s", err, out)
	}
	untouched("atoll down")

	// up starts it again and returns once the agents registered from their new processes.
	second := up()
	untouched("atoll up")
	for i, a := range second.Agents {
		if _, ok := exited[a.PID]; ok || a.API == first.Agents[i].API {
			t.Fatalf("agent %s after up: pid %d, address %s (before: %s); want a new process at a new address", a.Name, a.PID, a.API, first.Agents[i].API)
		}
	}
	checkAgentsRegistered(t, second, clusterStatus(t, bin, dir))

	// One agent dies; once the head has declared its machine dead, up restarts it alone.
	sigkill(t, second.Agents[1])
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		st := clusterStatus(t, bin, dir)
		if i := slices.IndexFunc(st.Machines, func(m api.MachineStatus) bool { return m.Name == second.Agents[1].Name }); i >= 0 && !st.Machines[i].Alive {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the killed agent's machine was never declared dead")
		case <-time.After(100 * time.Millisecond):
		}
	}
	third := up()
	if third.Heads[0].PID != second.Heads[0].PID || third.Agents[0].PID != second.Agents[0].PID {
		t.Fatalf("up restarted processes that ran: heads %d -> %d, agent %d -> %d", second.Heads[0].PID, third.Heads[0].PID, second.Agents[0].PID, third.Agents[0].PID)
	}
	if third.Agents[1].PID == second.Agents[1].PID {
		t.Fatal("up did not restart the killed agent")
	}
	checkAgentsRegistered(t, third, clusterStatus(t, bin, dir))
}
