package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestBenchControlPlaneSmoke runs `atoll bench controlplane --json` small (2 agents, 200
// pending gangs, 2 s windows): the four figures are there with sane values, the details
// agree with what was asked, and no process of the run is left.
func TestBenchControlPlaneSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the atoll binary and runs a cluster of processes")
	}
	bin := buildAtoll(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "bench", "controlplane", "--json", "--agents", "2", "--pending", "200",
		"--pause", "2s", "--settle", "3s", "--idle-window", "2s", "--load-window", "2s")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	start := time.Now()
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("bench controlplane: %v\n%s", err, stderr.String())
	}
	t.Logf("ran in %v", time.Since(start).Round(time.Second))
	var raw map[string]any
	if err := json.Unmarshal(out, &raw); err != nil {
		t.Fatalf("not one JSON object: %v\n%s", err, out)
	}
	for _, k := range []string{"leader_changes", "false_machine_deaths", "idle_cpu_pct", "leader_takeover_s"} {
		if v, ok := raw[k].(float64); !ok || v < 0 {
			t.Errorf("%s = %v, want a number >= 0", k, raw[k])
		}
	}
	var r cpResult
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatal(err)
	}
	if *r.IdleCPUPct > float64(100*runtime.NumCPU()) || len(r.IdleCPUPctPerHead) != 3 {
		t.Errorf("idle_cpu_pct %v (per head %v): want at most %d%% over three heads", *r.IdleCPUPct, r.IdleCPUPctPerHead, 100*runtime.NumCPU())
	}
	if *r.LeaderTakeoverS <= 0 || *r.LeaderTakeoverS > 120 || r.LeaderElectedS > *r.LeaderTakeoverS {
		t.Errorf("leader_takeover_s %v, elected after %v: want 0 < elected <= takeover <= 120", *r.LeaderTakeoverS, r.LeaderElectedS)
	}
	if r.TermBeforeFaults-r.TermStart > int64(*r.LeaderChanges) || r.TermEnd <= r.TermBeforeFaults {
		t.Errorf("terms %d -> %d -> %d with %d leader changes: the kill must change the term", r.TermStart, r.TermBeforeFaults, r.TermEnd, *r.LeaderChanges)
	}
	if r.Heads != 3 || r.Agents != 2 || r.AgentsAlive != 2 || r.GPUs != 16 {
		t.Errorf("heads %d, agents %d (%d alive), gpus %d: want 3, 2 (2), 16", r.Heads, r.Agents, r.AgentsAlive, r.GPUs)
	}
	if r.Pending != 200 || r.PendingSeen != 200 || r.PendingAfter != 200 {
		t.Errorf("pending %d, seen waiting %d before the kill, %d after: want 200 each", r.Pending, r.PendingSeen, r.PendingAfter)
	}
	if r.LoadWorkers != 2 || r.LoadSteps <= 0 || r.PauseS != 2 || r.LoadAvgMax <= 0 {
		t.Errorf("load workers %d, steps %d, pause %v s, load average max %v", r.LoadWorkers, r.LoadSteps, r.PauseS, r.LoadAvgMax)
	}
	if len(r.MachinesDeclaredDead) != *r.FalseMachineDeaths+r.TrueMachineDeaths {
		t.Errorf("machines declared dead %v: %d false + %d true", r.MachinesDeclaredDead, *r.FalseMachineDeaths, r.TrueMachineDeaths)
	}
	// Every process the run started is gone.
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err == nil && strings.HasPrefix(string(b), bin+"\x00") {
			t.Errorf("left running: %s", strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
}
