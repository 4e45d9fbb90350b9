package scenariotest

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/atoll-run/atoll/cmd/atoll/internal/clustertest"
	"github.com/atoll-run/atoll/internal/testtime"
)

// schedCluster starts a cluster of processes (3 heads, 4 agents, one process per worker)
// with the operator's queues from a file, and returns how to run atoll on it.
func schedCluster(t *testing.T) (bin, dir string, run func(args ...string) []byte) {
	t.Helper()
	bin, dir = clustertest.Up(t, 4)
	start := time.Now()
	run = func(args ...string) []byte {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Stderr = os.Stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("atoll %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		if args[0] == "demo" {
			t.Logf("%v: atoll %s done", time.Since(start).Round(time.Second), strings.Join(args, " "))
		}
		return out
	}
	conf := filepath.Join(t.TempDir(), "queues.json")
	// The programs answer their notices at their next step boundary, after a checkpoint
	// (two durable copies): on a loaded machine that took longer than 5 s, and the leader
	// then carried the shrink out alone (a restart the elastic case asserts there is not).
	os.WriteFile(conf, []byte(`{"queues": [{"name": "research", "weight": 2}, {"name": "prod", "weight": 1, "quota_gpus": 16}],
 "default_queue": "research", "priority_classes": [{"name": "low", "value": 0, "default": true}, {"name": "high", "value": 1}],
 "notice_grace": "`+testNoticeGrace.String()+`"}`), 0o600)
	run("queues", "--dir", dir, "--set", conf)
	return bin, dir, run
}

// testNoticeGrace is the notice grace of the scheduler tests' clusters.
var testNoticeGrace = testtime.Scale(30 * time.Second).Round(time.Second)

// TestClusterSchedulerPreempts runs the scheduler's decisions on a cluster of real
// processes: the operator's queues from a file, and the preempt scenario with an elastic
// victim (shrink, then grow) and with a fixed one (a just-in-time checkpoint, a stop, a
// requeue and a resume).
func TestClusterSchedulerPreempts(t *testing.T) {
	t.Parallel()
	bin, dir, run := schedCluster(t)

	// The queues from the file; a bad file names where it is bad.
	var q struct {
		Config struct {
			DefaultQueue string `json:"default_queue"`
			NoticeGrace  string `json:"notice_grace"`
		} `json:"config"`
		Queues []struct {
			Name   string  `json:"name"`
			Weight float64 `json:"weight"`
		} `json:"queues"`
	}
	if err := json.Unmarshal(run("queues", "--dir", dir, "--json"), &q); err != nil {
		t.Fatal(err)
	}
	if q.Config.DefaultQueue != "research" || q.Config.NoticeGrace != testNoticeGrace.String() || len(q.Queues) != 2 || q.Queues[0].Weight != 2 {
		t.Fatalf("queues --json after --set: %+v", q)
	}
	bad := filepath.Join(t.TempDir(), "bad.json")
	os.WriteFile(bad, []byte("{\"queues\": [\n  {\"name\": \"x\" \"weight\": 1}]}"), 0o600)
	if out, err := exec.Command(bin, "queues", "--dir", dir, "--set", bad).CombinedOutput(); err == nil || !strings.Contains(string(out), "bad.json:2:") {
		t.Fatalf("queues --set of a malformed file: %v\n%s; want an error naming bad.json:2:col", err, out)
	}

	// preempt, elastic victim: shrunk for the high-priority gang, grown back after it.
	var p map[string]any
	if err := json.Unmarshal(run("demo", "--dir", dir, "--scenario", "preempt", "--json"), &p); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"high_prio_wait_s", "victim_checkpointed", "victim_steps_lost", "victim_shrunk_to", "victim_resumed", "cost_s",
		"victim_final_loss", "victim_accuracy", "high_final_loss", "high_accuracy"} {
		if _, ok := p[k]; !ok {
			t.Errorf("preempt --json has no %q", k)
		}
	}
	costs, _ := p["cost_s"].(map[string]any)
	for _, k := range []string{"work_lost", "checkpoint", "restore", "cuda_context"} {
		if _, ok := costs[k]; !ok {
			t.Errorf("preempt --json cost_s has no %q: %v", k, costs)
		}
	}
	if p["embedded"] != false || p["victim_shrunk_to"] != 24.0 || p["victim_resumed"] != true || p["victim_checkpointed"] != true ||
		p["victim_steps_lost"].(float64) > 1 || p["victim_accuracy"].(float64) < 0.9 || p["high_accuracy"].(float64) < 0.9 {
		t.Fatalf("preempt on the cluster: %v", p)
	}
	if rs := p["victim"].(map[string]any)["resizes"].([]any); len(rs) != 2 {
		t.Fatalf("victim resizes %v: want a shrink and a grow", rs)
	}

	// preempt, fixed victim: checkpointed on notice, stopped, queued, resumed.
	p = nil
	if err := json.Unmarshal(run("demo", "--dir", dir, "--scenario", "preempt", "--victim-fixed", "--json"), &p); err != nil {
		t.Fatal(err)
	}
	victim := p["victim"].(map[string]any)
	if p["victim_shrunk_to"] != nil || p["victim_resumed"] != true || p["victim_checkpointed"] != true || p["victim_steps_lost"].(float64) > 1 ||
		victim["preemptions"] != 1.0 || victim["restarts"] != 0.0 || p["victim_accuracy"].(float64) < 0.9 {
		// What restarted it (a worker's exit, a machine declared dead) is in the events.
		evs, _ := exec.Command(bin, "events", "--dir", dir, "--job", "digits-low").CombinedOutput()
		t.Fatalf("preempt --victim-fixed on the cluster: %v\nthe victim's events:\n%s", p, evs)
	}
	if c := p["cost_s"].(map[string]any); c["checkpoint"].(float64) <= 0 || c["restore"].(float64) <= 0 {
		t.Fatalf("a fixed victim's costs %v: want the measured checkpoint and its restore", c)
	}

}

// TestClusterSchedulerResizesAndDrains runs, on a cluster of real processes, the elastic
// scenario (grow, shrink, grow without a restart), and a drain whose deadline the program
// misses (it is stopped anyway and resumes from its newest checkpoint).
func TestClusterSchedulerResizesAndDrains(t *testing.T) {
	t.Parallel()
	bin, dir, run := schedCluster(t)

	// elastic: 8 -> 32 when the other gang ends, 32 -> 24 for the high-priority one, back to
	// 32; none of it a restart.
	var e struct {
		Resizes []struct {
			From, To int
			Kind     string
		} `json:"resizes"`
		Restarts int     `json:"restarts"`
		Sizes    []int   `json:"sizes"`
		Accuracy float64 `json:"accuracy"`
	}
	if err := json.Unmarshal(run("demo", "--dir", dir, "--scenario", "elastic", "--json"), &e); err != nil {
		t.Fatal(err)
	}
	if len(e.Resizes) != 3 || e.Restarts != 0 || len(e.Sizes) != 4 || e.Sizes[0] != 8 || e.Sizes[1] != 32 || e.Sizes[2] != 24 || e.Sizes[3] != 32 || e.Accuracy < 0.9 {
		t.Fatalf("elastic on the cluster: %+v", e)
	}

	// A drain the program does not answer (the plain demo reads no notices): its gang is
	// stopped at the deadline, queued again and resumed elsewhere from its checkpoint. The
	// drain takes effect a second or two after the gang is seen running; 2000 steps (half a
	// minute on the 2-core project machine at a load average of 25) leave room for it, and
	// the events below say whether it came in time.
	ctx, cancel := testtime.Context(t, 3*time.Minute)
	defer cancel()
	demo := exec.CommandContext(ctx, bin, "demo", "--dir", dir, "--workers", "8", "--steps", "2000", "--kill-at", "-1", "--json")
	demo.Stderr = os.Stderr
	outc := make(chan []byte, 1)
	errc := make(chan error, 1)
	go func() {
		out, err := demo.Output()
		outc <- out
		errc <- err
	}()
	var on string
	for on == "" {
		var st struct {
			Gangs []struct {
				Job      string   `json:"job"`
				State    string   `json:"state"`
				Machines []string `json:"machines"`
			} `json:"gangs"`
		}
		if err := json.Unmarshal(run("status", "--dir", dir, "--json"), &st); err != nil {
			t.Fatal(err)
		}
		for _, g := range st.Gangs {
			if g.Job == "digits" && g.State == "running" && len(g.Machines) == 1 {
				on = g.Machines[0]
			}
		}
		select {
		case err := <-errc:
			t.Fatalf("the demo ended before it was drained: %v\n%s", err, <-outc)
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
			t.Fatal("the demo's gang never ran")
		}
	}
	run("drain", on, "--dir", dir, "--within", "500ms", "--reason", "test")
	if err := <-errc; err != nil {
		t.Fatalf("the drained demo: %v\n%s", err, <-outc)
	}
	var d struct {
		Accuracy float64 `json:"accuracy"`
	}
	if err := json.Unmarshal(<-outc, &d); err != nil {
		t.Fatal(err)
	}
	evs := string(run("events", "--dir", dir, "--job", "digits"))
	if !strings.Contains(evs, "gang_notice") || !strings.Contains(evs, "drain (its deadline passed)") || d.Accuracy < 0.9 {
		t.Fatalf("drained demo: accuracy %.3f; events:\n%s", d.Accuracy, evs)
	}
}

// TestDemoAutoscaleScenario: `atoll demo --scenario autoscale` brings its own cluster (one
// head, the built-in pools, the local provider): machines are added for a gang on empty
// pools, a spot interruption moves the gang (checkpointed, nothing lost) to a replacement,
// and the idle machines are removed.
func TestDemoAutoscaleScenario(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster of processes")
	}
	t.Parallel()
	bin := clustertest.Atoll(t)
	cmd := exec.Command(bin, "demo", "--scenario", "autoscale", "--json")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("demo --scenario autoscale: %v\n%s", err, out)
	}
	var r map[string]any
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"scale_up_s", "machines_added", "machines_removed", "interruptions", "steps_lost", "final_loss", "accuracy"} {
		if _, ok := r[k]; !ok {
			t.Errorf("autoscale --json lacks %q", k)
		}
	}
	// Every idle machine goes, but one that holds the last copy of an object: it stays
	// while no other machine can take the copy (the pools never remove one with it).
	left, _ := r["machines_left"].(float64)
	kept := map[string]bool{}
	for _, e := range r["events"].([]any) {
		if ev := e.(string); strings.HasPrefix(ev, "move-failed") && strings.Contains(ev, "no other machine to copy them to") {
			kept[strings.TrimSuffix(strings.Fields(ev)[1], ":")] = true
		}
	}
	if r["machines_added"].(float64) < 3 || r["machines_removed"].(float64)+left != r["machines_added"].(float64) || r["interruptions"] != 1.0 ||
		r["steps_lost"].(float64) > 1 || r["checkpointed"] != true || left > float64(len(kept)) || r["accuracy"].(float64) < 0.9 {
		t.Fatalf("autoscale: %s", out)
	}
	if left > 0 {
		t.Logf("%v machine(s) kept for the last copies of objects (%v)", left, kept)
	}
	on := fmt.Sprint(r["resumed_on"])
	if strings.Contains(on, r["interrupted_machine"].(string)) {
		t.Fatalf("the gang resumed on %s, the interrupted machine %s among them", on, r["interrupted_machine"])
	}
}
