package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/atoll-run/atoll/internal/testtime"
	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/sdk/sdktest"
)

// TestUpPoolsLaunchesReplacesAndDown runs `atoll up --pools` with real processes: the
// leader launches the pool's minimum as a local agent, which registers; when that agent is
// SIGKILLed, the machine is declared dead, the pool reports it lost and launches a
// replacement, which registers; `atoll down` stops the pool's agents too.
func TestUpPoolsLaunchesReplacesAndDown(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster of processes")
	}
	t.Parallel()
	tmp := t.TempDir()
	bin := buildAtoll(t)
	dir := filepath.Join(tmp, "cluster")
	poolFile := filepath.Join(tmp, "pools.json")
	if err := os.WriteFile(poolFile, []byte(`{"pools": [{"name": "h100", "machine": "dgx-h100", "min": 1, "max": 2,
		"price_per_hour": 98.32, "idle_timeout": "10m", "provider": {"type": "local"}}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, append([]string{"up", "--dir", dir, "--agents", "0", "--heads", "1", "--pools", poolFile},
		sdktest.UpFlags()...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("atoll up --pools: %v\n%s", err, out)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = exec.Command(bin, "down", "--dir", dir, "--grace", "5s").Run()
		}
		if t.Failed() {
			logs, _ := filepath.Glob(filepath.Join(dir, "logs", "*.log"))
			more, _ := filepath.Glob(filepath.Join(dir, "pools", "logs", "*.log"))
			for _, l := range append(logs, more...) {
				b, _ := os.ReadFile(l)
				if len(b) > 3000 {
					b = b[len(b)-3000:]
				}
				t.Logf("--- %s (tail)\n%s", filepath.Base(l), b)
			}
		}
	})
	status := func() api.Status {
		out, err := exec.Command(bin, "status", "--dir", dir, "--json").Output()
		if err != nil {
			t.Fatalf("status: %v", err)
		}
		var st api.Status
		if err := json.Unmarshal(out, &st); err != nil {
			t.Fatal(err)
		}
		return st
	}
	// waitFor polls the status (a real cluster: the only way to see it) until ok holds.
	waitFor := func(what string, ok func(api.Status) bool) api.Status {
		start := time.Now()
		deadline := testtime.Deadline(t, 60*time.Second)
		for {
			st := status()
			if ok(st) {
				return st
			}
			if time.Now().After(deadline) {
				b, _ := json.MarshalIndent(st, "", " ")
				t.Fatalf("%s: not within %v; status:\n%s", what, time.Since(start).Round(time.Second), b)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	readyMachine := func(st api.Status) string {
		if st.Pools == nil || len(st.Pools.Pools) != 1 {
			return ""
		}
		for _, pm := range st.Pools.Pools[0].Machines {
			for _, m := range st.Machines {
				if m.Name == pm.Name && m.Alive && pm.State == "ready" {
					return m.Name
				}
			}
		}
		return ""
	}
	st := waitFor("the pool minimum registers", func(st api.Status) bool { return readyMachine(st) != "" })
	first := readyMachine(st)
	var pid int
	for _, m := range st.Machines {
		if m.Name == first {
			pid = m.PID
		}
	}
	if pid <= 0 || !strings.HasPrefix(first, "h100-") {
		t.Fatalf("pool machine %q pid %d", first, pid)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	st = waitFor("a replacement registers", func(st api.Status) bool { m := readyMachine(st); return m != "" && m != first })
	second := readyMachine(st)
	kinds := map[string]int{}
	for _, e := range st.Pools.Events {
		kinds[e.Kind]++
		if e.Kind == "launch" && !strings.Contains(e.Reason, "pool minimum 1") {
			t.Errorf("launch reason %q", e.Reason)
		}
	}
	if kinds["launch"] != 2 || kinds["lost"] != 1 {
		t.Fatalf("events %+v", st.Pools.Events)
	}
	if st.Pools.Pools[0].CostUSD <= 0 {
		t.Errorf("cost so far %v", st.Pools.Pools[0].CostUSD)
	}
	text, err := exec.Command(bin, "status", "--dir", dir).Output()
	if err != nil || !strings.Contains(string(text), "POOL EVENTS") || !strings.Contains(string(text), second) {
		t.Fatalf("status text (%v):\n%s", err, text)
	}
	var pid2 int
	for _, m := range st.Machines {
		if m.Name == second {
			pid2 = m.PID
		}
	}
	out, err = exec.Command(bin, "down", "--dir", dir, "--grace", "5s").CombinedOutput()
	stopped = true
	if err != nil {
		t.Fatalf("down: %v\n%s", err, out)
	}
	if alive(pid2) {
		t.Fatalf("pool agent %s (pid %d) survived atoll down: %s", second, pid2, out)
	}
}
