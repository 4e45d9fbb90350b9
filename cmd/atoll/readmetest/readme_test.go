package readmetest

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/atoll-run/atoll/cmd/atoll/internal/clustertest"
	"github.com/atoll-run/atoll/internal/testtime"
	"github.com/atoll-run/atoll/sdk/sdktest"
)

// readmeShellLines are the command lines of the ```sh blocks of README.md's section
// titled title (from its "## " heading to the next).
func readmeShellLines(t *testing.T, title string) []string {
	t.Helper()
	f, err := os.Open("../../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []string
	in, block := false, false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l := sc.Text()
		switch {
		case strings.HasPrefix(l, "## "):
			in = strings.TrimPrefix(l, "## ") == title
		case in && strings.HasPrefix(l, "```"):
			block = !block && strings.TrimPrefix(l, "```") == "sh"
		case in && block && strings.TrimSpace(l) != "":
			lines = append(lines, l)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(lines) == 0 {
		t.Fatalf("README.md has no shell lines in a section %q", title)
	}
	return lines
}

// readmePaths are the README's relative paths of what its lines make: the cluster
// directory and the two executables. The test runs the lines in the repository's root (as
// a reader does: go build ./cmd/atoll), with these in a temporary directory instead.
var readmePaths = regexp.MustCompile(`(^|[\s=(])\./(atoll|digits|mycluster)\b|(-o )(atoll|digits)\b`)

// TestREADMECluster runs every shell line of README.md's "A cluster of processes" section,
// and the lines of its queues section that use that cluster, as written (in the
// repository's root, with the cluster directory and the executables they build in a
// temporary directory), and checks that each exits 0 and prints what the README says it
// does: a cluster of 3 heads and 4 agents, its status, the demo on 16 worker processes, a
// driver run and a submitted one, a worker's training lines, every checkpoint verified,
// and down stopping what up started.
func TestREADMECluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster of processes")
	}
	t.Parallel()
	tmp := t.TempDir()
	lines := readmeShellLines(t, "A cluster of processes")
	var down string
	if last := lines[len(lines)-1]; strings.HasPrefix(last, "./atoll down") {
		down, lines = last, lines[:len(lines)-1]
	}
	for _, l := range readmeShellLines(t, "Queues, preemption and elastic gangs") {
		if strings.Contains(l, "./mycluster") {
			lines = append(lines, l)
		}
	}
	if down == "" {
		t.Fatal("the README's cluster section does not end with ./atoll down")
	}
	lines = append(lines, down)
	bin, cluster := filepath.Join(tmp, "atoll"), filepath.Join(tmp, "mycluster")
	t.Cleanup(func() { // whatever a failed line left running
		if _, err := os.Stat(filepath.Join(cluster, "cluster.json")); err == nil {
			if t.Failed() {
				clustertest.PrintLogs(t, cluster)
			}
			_ = exec.Command(bin, "down", "--dir", cluster, "--grace", "5s").Run()
		}
	})
	ctx, cancel := testtime.Context(t, 10*time.Minute)
	defer cancel()
	for _, line := range lines {
		cmdline := readmePaths.ReplaceAllStringFunc(line, func(m string) string {
			sub := readmePaths.FindStringSubmatch(m)
			if sub[3] != "" {
				return sub[3] + filepath.Join(tmp, sub[4])
			}
			return sub[1] + filepath.Join(tmp, sub[2])
		})
		if strings.HasPrefix(line, "./atoll up") {
			// The failure detection of the test clusters: the defaults on a quiet machine,
			// stretched on a loaded one (a busy agent is not taken for a dead one).
			cmdline += " " + strings.Join(sdktest.UpFlags(), " ")
		}
		start := time.Now()
		cmd := exec.CommandContext(ctx, "bash", "-c", cmdline)
		cmd.Dir = "../../.."
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		t.Logf("%s: %v (%v)", line, err, time.Since(start).Round(time.Millisecond))
		if err != nil {
			t.Fatalf("%s\n(run as %s): %v\nstdout:\n%s\nstderr:\n%s", line, cmdline, err, out, tail(stderr.String(), 4000))
		}
		checkREADMELine(t, bin, cluster, line, string(out))
	}
}

// checkREADMELine checks that a README line printed what the README says it prints.
func checkREADMELine(t *testing.T, bin, cluster, line, out string) {
	t.Helper()
	fail := func(what string) {
		t.Helper()
		t.Fatalf("%s: %s; it printed:\n%s", line, what, tail(out, 4000))
	}
	has := func(want ...string) {
		t.Helper()
		for _, w := range want {
			if !strings.Contains(out, w) {
				fail("no " + w)
			}
		}
	}
	cmd, _, _ := strings.Cut(line, "#")
	f := strings.Fields(cmd)
	switch {
	case strings.HasPrefix(cmd, "go build"):
		if _, err := os.Stat(filepath.Join(filepath.Dir(cluster), f[len(f)-2])); err != nil {
			fail("nothing built: " + err.Error())
		}
	case strings.HasPrefix(cmd, "./atoll up"):
		has("cluster up in "+cluster, "3 heads (leader", "4 agents of dgx-h100", "address: https://")
		checkStatusJSON(t, bin, cluster) // its links are mutual TLS: cmd/atoll TestClusterSurvivesFailures
	case strings.HasPrefix(cmd, "./atoll status"):
		has("leader: head ", "HEAD", "leader", "follower", "MACHINE", "node-0", "node-3", "simulated", "GANG", "QUEUE")
	case strings.HasPrefix(cmd, "./atoll demo"):
		var res struct {
			WorkerPIDs   []int    `json:"worker_pids"`
			MachinesUsed []string `json:"machines_used"`
			Restarts     int      `json:"restarts"`
			Restored     int      `json:"restored_from_step"`
			Accuracy     float64  `json:"accuracy"`
			Embedded     bool     `json:"embedded"`
		}
		if err := json.Unmarshal([]byte(out), &res); err != nil {
			fail("not the demo's JSON: " + err.Error())
		}
		pids := map[int]bool{}
		for _, p := range res.WorkerPIDs {
			pids[p] = true
		}
		if len(res.WorkerPIDs) != 16 || len(pids) != 16 || len(res.MachinesUsed) != 2 || res.Embedded {
			fail("want 16 worker processes on 2 machines of the cluster")
		}
		if res.Restarts != 1 || res.Restored != 125 || res.Accuracy < 0.85 {
			fail("want one restart, from the checkpoint of step 125 (a worker is killed at 130), and an accuracy of 85% or more")
		}
	case strings.Contains(cmd, "go run ./examples/digits"):
		has("final loss", "test accuracy", "1 restart(s)")
	case strings.HasPrefix(cmd, "./atoll submit"):
		has("submitted ", "completed: the driver exited with status 0")
		// The driver's own output is its agent's log.
		name := strings.TrimSuffix(strings.Fields(out)[1], ":")
		logs, err := exec.Command(bin, "logs", name, "--dir", cluster).CombinedOutput()
		if err != nil || !strings.Contains(string(logs), "test accuracy") {
			t.Fatalf("atoll logs %s (the submitted driver): %v\n%s", name, err, tail(string(logs), 2000))
		}
	case strings.HasPrefix(cmd, "./atoll logs"):
		// The last generation of rank 3 of the submitted driver's gang: restored from the
		// checkpoint of step 125, it trains to step 300.
		has(`"msg":"training"`, `"msg":"trained"`, `"job":"digits"`, `"rank":3`, `"step":300`)
	case strings.HasPrefix(cmd, "./atoll checkpoints"):
		var cps []struct {
			Job      string `json:"job"`
			Step     int64  `json:"step"`
			Parts    int    `json:"parts"`
			Readable int    `json:"readable_parts"`
		}
		if err := json.Unmarshal([]byte(out), &cps); err != nil || len(cps) == 0 {
			fail("not a JSON list of checkpoints")
		}
		for _, c := range cps {
			if c.Parts == 0 || c.Readable != c.Parts {
				fail("a checkpoint not read back whole")
			}
		}
	case strings.HasPrefix(cmd, "./atoll queues"):
		has("default queue research", "research", "prod")
	case strings.HasPrefix(cmd, "./atoll drain"):
		has("machine node-1 drained")
	case strings.HasPrefix(cmd, "./atoll undrain"):
		has("node-1")
	case strings.HasPrefix(cmd, "./atoll down"):
		has("stopped 7 processes")
		if out, err := exec.Command(bin, "status", "--dir", cluster).CombinedOutput(); err == nil || !strings.Contains(string(out), "no cluster runs in") {
			t.Fatalf("atoll status after down: %v\n%s", err, out)
		}
	default:
		t.Fatalf("%s: the test does not know what this README line prints: teach checkREADMELine", line)
	}
}

// checkStatusJSON checks atoll status --json of a fresh cluster of 3 heads and 4 agents:
// one leader, every head and agent a live process, every GPU free.
func checkStatusJSON(t *testing.T, bin, dir string) {
	t.Helper()
	out, err := exec.Command(bin, "status", "--dir", dir, "--json").Output()
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Leader uint64 `json:"leader"`
		Heads  []struct {
			ID     uint64 `json:"id"`
			PID    int    `json:"pid"`
			Leader bool   `json:"leader"`
		} `json:"heads"`
		Machines []struct {
			Name     string `json:"name"`
			GPUs     int    `json:"gpus"`
			FreeGPUs int    `json:"free_gpus"`
			Alive    bool   `json:"alive"`
			PID      int    `json:"pid"`
		} `json:"machines"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		t.Fatalf("status --json: %v\n%s", err, out)
	}
	leaders := 0
	for _, h := range st.Heads {
		if h.Leader {
			leaders++
			if h.ID != st.Leader {
				t.Errorf("head %d marked leader, status leader %d", h.ID, st.Leader)
			}
		}
		if h.PID == 0 || !running(h.PID) {
			t.Errorf("head %d pid %d is not a live process", h.ID, h.PID)
		}
	}
	if len(st.Heads) != 3 || leaders != 1 || len(st.Machines) != 4 {
		t.Fatalf("status: %d heads, %d leaders, %d machines\n%s", len(st.Heads), leaders, len(st.Machines), out)
	}
	for _, m := range st.Machines {
		if m.GPUs != 8 || m.FreeGPUs != 8 || !m.Alive || !running(m.PID) {
			t.Errorf("machine %+v", m)
		}
	}
}

// running reports whether pid is a process: the heads and agents of `atoll up` outlive
// the command that started them, and init reaps them, so none stays a zombie.
func running(pid int) bool { return pid > 0 && syscall.Kill(pid, 0) == nil }

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}
