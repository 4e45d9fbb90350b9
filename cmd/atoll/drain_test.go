package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/atoll-run/atoll/sdk"
)

// TestClusterDrainSurvivesLeaderChanges: on a cluster of processes (3 heads, 2 agents),
// `atoll drain` is recorded in the log: the leader head is paused (SIGSTOP) until another
// head leads, twice, and the machine is still cordoned, with its reason, in `atoll status
// --json`, whose term counted both changes; a gang does not land on it; `atoll undrain`
// lifts the drain and the gang waiting for it lands there.
func TestClusterDrainSurvivesLeaderChanges(t *testing.T) {
	bin, dir := upCluster(t, 2)
	run := func(args ...string) []byte {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Stderr = os.Stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("atoll %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	type status struct {
		Leader   uint64 `json:"leader"`
		Term     *int64 `json:"term"`
		Machines []struct {
			Name     string  `json:"name"`
			Cordoned *bool   `json:"cordoned"`
			Reason   *string `json:"cordon_reason"`
		} `json:"machines"`
		Gangs []struct {
			Job      string   `json:"job"`
			Name     string   `json:"name"`
			State    string   `json:"state"`
			Machines []string `json:"machines"`
		} `json:"gangs"`
	}
	read := func() status {
		t.Helper()
		var st status
		out := run("status", "--dir", dir, "--json")
		if err := json.Unmarshal(out, &st); err != nil {
			t.Fatalf("status --json: %v\n%s", err, out)
		}
		if st.Term == nil {
			t.Fatalf("status --json has no term:\n%s", out)
		}
		var lists map[string]json.RawMessage
		if err := json.Unmarshal(out, &lists); err != nil || string(lists["services"]) != "[]" {
			t.Fatalf("status --json: services %s (a cluster without services: [])\n%s", lists["services"], out)
		}
		for _, m := range st.Machines {
			if m.Cordoned == nil || m.Reason == nil {
				t.Fatalf("status --json: machine %s without cordoned or cordon_reason:\n%s", m.Name, out)
			}
		}
		return st
	}
	cf, err := readClusterFile(dir)
	if err != nil {
		t.Fatal(err)
	}
	st := read()
	drained := st.Machines[0].Name
	run("drain", drained, "--dir", dir, "--reason", "bad fan", "--within", "1s")
	// The leader stops (its process paused) until another head leads, then goes on as a
	// follower.
	changeLeader := func() {
		t.Helper()
		before := read()
		var pid int
		for _, h := range cf.Heads {
			if h.ID == before.Leader {
				pid = h.PID
			}
		}
		if pid == 0 {
			t.Fatalf("no process for leader head %d", before.Leader)
		}
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
		}()
		deadline := time.After(time.Minute)
		for {
			if now := read(); now.Leader != 0 && now.Leader != before.Leader && *now.Term > *before.Term {
				return
			}
			select {
			case <-deadline:
				t.Fatalf("no other head leads a minute after head %d was paused", before.Leader)
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	changeLeader()
	changeLeader()
	after := read()
	if *after.Term < *st.Term+2 {
		t.Fatalf("term %d after two changes of leader from %d", *after.Term, *st.Term)
	}
	for _, m := range after.Machines {
		if want := m.Name == drained; *m.Cordoned != want || (want && *m.Reason != "bad fan") {
			t.Fatalf("after two changes of leader machine %s cordoned %v (%q)", m.Name, *m.Cordoned, *m.Reason)
		}
	}
	// A gang of a whole machine goes to the other one; a second waits for the drained one.
	addr, _, err := clusterAddress(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := sdk.Connect(ctx, addr, testKinds()...)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Shutdown(context.Background())
	job, err := c.Submit(ctx, sdk.JobSpec{Name: "drained"})
	if err != nil {
		t.Fatal(err)
	}
	a, err := job.SpawnGang(ctx, sdk.GangSpec{Name: "a", Kind: "counter", Workers: 1, GPUsPerWorker: 8})
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(a.Placement().Machines, drained) {
		t.Fatalf("gang a placed on the drained machine %s", drained)
	}
	type spawned struct {
		g   *sdk.Gang
		err error
	}
	bc := make(chan spawned, 1)
	go func() {
		g, err := job.SpawnGang(ctx, sdk.GangSpec{Name: "b", Kind: "counter", Workers: 1, GPUsPerWorker: 8})
		bc <- spawned{g, err}
	}()
	for waiting := false; !waiting; {
		for _, g := range read().Gangs {
			waiting = waiting || (g.Job == "drained" && g.Name == "b" && g.State == "pending")
		}
		select {
		case b := <-bc:
			t.Fatalf("gang b started while the only free machine is drained: %+v, %v", b.g, b.err)
		case <-ctx.Done():
			t.Fatal("gang b never waited")
		case <-time.After(100 * time.Millisecond):
		}
	}
	run("undrain", drained, "--dir", dir)
	b := <-bc
	if b.err != nil {
		t.Fatal(b.err)
	}
	if !slices.Equal(b.g.Placement().Machines, []string{drained}) {
		t.Fatalf("gang b placed on %v after the undrain, want %s", b.g.Placement().Machines, drained)
	}
	for _, m := range read().Machines {
		if *m.Cordoned {
			t.Fatalf("machine %s cordoned after the undrain", m.Name)
		}
	}
	if err := job.Stop(ctx); err != nil {
		t.Fatal(err)
	}
}
