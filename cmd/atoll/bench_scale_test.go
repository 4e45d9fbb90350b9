package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestBenchScaleSmoke runs `atoll bench scale --json` small (6 hollow machines in two
// processes, 20 pending gangs, 30 tasks): the contract's fields are there, measured, with
// sane values; the 30 tasks ran at once on task workers the hollow processes host (their
// own count); and no process of the run is left.
func TestBenchScaleSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the atoll binary and runs a cluster of processes")
	}
	bin := buildAtoll(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "bench", "scale", "--json", "--machines", "6", "--per-process", "5", "--gossip-members", "1",
		"--gangs", "2", "--actors", "10", "--pending", "20", "--tasks", "30", "--probes", "5", "--window", "1s", "--setup-timeout", "2m")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("bench scale: %v\n%s", err, stderr.String())
	}
	var raw map[string]any
	if err := json.Unmarshal(out, &raw); err != nil {
		t.Fatalf("not one JSON object: %v\n%s", err, out)
	}
	for _, k := range []string{"machines", "gpus", "register_s", "head_cpu_cores", "head_rss_mib", "meta_writes_per_s", "sched_p50_ms",
		"sched_p99_ms", "running_gangs", "actors", "running_tasks", "queued_tasks", "tasks_s", "failover_s", "lost_machine_detect_s"} {
		if v, ok := raw[k].(float64); !ok || v < 0 {
			t.Errorf("%s = %v, want a number >= 0", k, raw[k])
		}
	}
	var r scaleResult
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatal(err)
	}
	if r.Machines != 6 || r.Registered != 6 || r.GPUs != 48 || r.HollowProcesses != 2 {
		t.Errorf("machines %d (registered %d), gpus %d, processes %d: want 6 (6), 48, 2", r.Machines, r.Registered, r.GPUs, r.HollowProcesses)
	}
	if *r.RunningGangs+r.WorkloadFailed > 2 || *r.Actors > 10 || r.PendingGangs > 20 || *r.SchedP50MS > *r.SchedP99MS {
		t.Errorf("running gangs %d, actors %d, pending %d, p50 %v > p99 %v", *r.RunningGangs, *r.Actors, r.PendingGangs, *r.SchedP50MS, *r.SchedP99MS)
	}
	if *r.RunningTasks != 30 || *r.QueuedTasks != 0 || r.TasksEnded != 0 {
		t.Errorf("running tasks %d, queued %d, ended early %d: want 30, 0, 0 (notes %q)", *r.RunningTasks, *r.QueuedTasks, r.TasksEnded, r.Notes)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err == nil && strings.HasPrefix(string(b), bin+"\x00") {
			t.Errorf("left running: %s", strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
}
