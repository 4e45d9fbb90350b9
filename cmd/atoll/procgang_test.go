package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/atoll-run/atoll/internal/testtime"
	"github.com/atoll-run/atoll/runtime/api"
)

// TestClusterProcessGang runs a Python program (testdata/procgang/sumranks.py, standard
// library only) as a 4-member process gang on a cluster of processes (two machines, two
// members of 4 GPUs each): every member checks its environment, the members sum their
// ranks at MASTER_ADDR:MASTER_PORT and rank 0 writes the sum; a drain of one machine
// gives every member a notice (SIGUSR1 and the notice file), each checkpoints its step to
// a file and exits with the yield code, and the gang queues again; once the machine is
// back it resumes as its next generation, whose members continue from their checkpoints
// and exit 0, which completes it.
func TestClusterProcessGang(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("no python3")
	}
	testProcessGang(t, nil, "python3", "testdata/procgang/sumranks.py")
}

// TestClusterProcessGangInContainers is TestClusterProcessGang with the members in
// containers (--image): an image FROM scratch of this machine's Python and the same
// program, the test's output directory mounted into each.
func TestClusterProcessGangInContainers(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds an image and starts a cluster of processes")
	}
	if err := exec.Command("docker", "info").Run(); err != nil {
		t.Skipf("Docker is not available here (docker info: %v): the container members need it", err)
	}
	image := pythonImage(t)
	testProcessGang(t, func(out string) []string { return []string{"--image", image, "--mount", out + ":" + out} }, "python3", "/app/sumranks.py")
}

// testProcessGang runs the process gang test with the program's command (and, from
// submitFlags given the output directory, more flags of atoll submit).
func testProcessGang(t *testing.T, submitFlags func(out string) []string, command ...string) {
	bin, dir := upCluster(t, 2)
	out := t.TempDir()
	run := func(args ...string) string {
		t.Helper()
		b, err := exec.Command(bin, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("atoll %s: %v\n%s", strings.Join(args, " "), err, b)
		}
		return string(b)
	}
	ctx, cancel := testtime.Context(t, 4*time.Minute)
	defer cancel()
	addr, _, err := clusterAddress(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	c, err := dialCluster(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	waitFor := func(what string, ok func(g api.Gang) bool) api.Gang {
		t.Helper()
		return awaitGang(ctx, t, c, "pg", what, ok)
	}
	readJSON := func(name string, v any) {
		t.Helper()
		awaitJSON(ctx, t, c, out, "pg", name, v)
	}

	args := []string{"submit", "--dir", dir, "--name", "pg", "--workers", "4", "--gpus-per-worker", "4", "--strategy", "spread"}
	if submitFlags != nil {
		args = append(args, submitFlags(out)...)
	}
	said := run(append(append(append(args, "--"), command...), "--out", out, "--gpus", "4")...)
	if !strings.Contains(said, "process gang main of 4 members") {
		t.Fatalf("atoll submit said:\n%s", said)
	}
	g := waitFor("the gang running", func(g api.Gang) bool { return g.State == api.GangRunning })
	if g.Generation != 0 || len(g.Placement.Machines) != 2 {
		t.Fatalf("generation %d on machines %v: want generation 0 on both machines", g.Generation, g.Placement.Machines)
	}

	// Every member's environment: torchrun's, its GPUs, Atoll's.
	var master string
	for r := range 4 {
		var env map[string]string
		readJSON(fmt.Sprintf("env-%d-g0.json", r), &env)
		m := g.Placement.Members[r]
		var idx []string
		for _, i := range m.GPUs {
			idx = append(idx, strconv.Itoa(i))
		}
		local := 0
		for _, o := range g.Placement.Members[:r] {
			if o.Machine == m.Machine {
				local++
			}
		}
		var groups []string // the machines in the order of their first rank
		for _, o := range g.Placement.Members {
			if !slices.Contains(groups, o.Machine) {
				groups = append(groups, o.Machine)
			}
		}
		want := map[string]string{"RANK": strconv.Itoa(r), "WORLD_SIZE": "4", "LOCAL_RANK": strconv.Itoa(local), "LOCAL_WORLD_SIZE": "2",
			"ATOLL_JOB": "pg", "ATOLL_GANG": "main", "ATOLL_RANK": strconv.Itoa(r), "ATOLL_GENERATION": "0", "ATOLL_MACHINE": m.Machine,
			"CUDA_VISIBLE_DEVICES": strings.Join(idx, ","), "ATOLL_SIMULATED_GPUS": strings.Join(m.UUIDs, ",")}
		for k, v := range want {
			if env[k] != v {
				t.Errorf("rank %d: %s=%q, want %q (env %v)", r, k, env[k], v, env)
			}
		}
		if want := strconv.Itoa(slices.Index(groups, m.Machine)); env["GROUP_RANK"] != want {
			t.Errorf("rank %d: GROUP_RANK=%q, want %s (machines by first rank: %v)", r, env["GROUP_RANK"], want, groups)
		}
		if ma := env["MASTER_ADDR"] + ":" + env["MASTER_PORT"]; master == "" {
			master = ma
		} else if ma != master {
			t.Errorf("rank %d: MASTER_ADDR:MASTER_PORT %s, rank 0's %s: want the same", r, ma, master)
		}
		if !strings.HasSuffix(env["ATOLL_NOTICE_FILE"], ".notice.json") {
			t.Errorf("rank %d: ATOLL_NOTICE_FILE=%q", r, env["ATOLL_NOTICE_FILE"])
		}
	}
	var sum struct{ Sum, World, Generation int }
	readJSON("sum-g0.json", &sum)
	if sum.Sum != 0+1+2+3 || sum.World != 4 {
		t.Fatalf("rank 0 wrote %+v: want the sum 6 of 4 ranks", sum)
	}
	if logs := run("logs", "pg", "--dir", dir, "--rank", "2"); !strings.Contains(logs, "rank 2 of 4, generation 0") ||
		!strings.Contains(logs, "the sum of the ranks is 6") {
		t.Errorf("atoll logs pg --rank 2:\n%s", logs)
	}

	// A drain: every member checkpoints and yields; the gang queues again (the other
	// machine alone cannot hold it).
	drained := g.Placement.Machines[0]
	run("drain", drained, "--dir", dir, "--reason", "the test's drain", "--within", "2m")
	steps := map[int]int{}
	for r := range 4 {
		var y struct {
			Step   int
			Notice api.ProcessNotice
		}
		readJSON(fmt.Sprintf("yield-%d-g0.json", r), &y)
		if y.Notice.Kind != api.NoticeDrain || y.Notice.Deadline.IsZero() || y.Notice.Generation != 0 || y.Notice.YieldExitCode != api.DefaultYieldExitCode {
			t.Errorf("rank %d read the notice %+v: want a drain of generation 0 with its deadline and yield code", r, y.Notice)
		}
		if y.Step <= 0 {
			t.Errorf("rank %d checkpointed step %d: want some steps", r, y.Step)
		}
		steps[r] = y.Step
	}
	g = waitFor("the gang yielded and queued again", func(g api.Gang) bool { return g.State == api.GangPending && g.Generation == 1 })
	if g.Preemptions != 1 || g.Restarts != 0 || !strings.Contains(g.Reason, "yielded with exit code 75") {
		t.Errorf("after the yield: preemptions %d, restarts %d, reason %q: want a yield, not a failure", g.Preemptions, g.Restarts, g.Reason)
	}

	// The machine is back: the next generation starts the command again, and continues
	// from the checkpoints.
	run("undrain", drained, "--dir", dir)
	for r := range 4 {
		var res struct {
			FromStep int `json:"from_step"`
		}
		readJSON(fmt.Sprintf("resumed-%d-g1.json", r), &res)
		if res.FromStep != steps[r] {
			t.Errorf("rank %d of generation 1 resumed from step %d, its checkpoint was of step %d", r, res.FromStep, steps[r])
		}
	}
	readJSON("sum-g1.json", &sum)
	if sum.Sum != 6 || sum.Generation != 1 {
		t.Errorf("generation 1's rank 0 wrote %+v: want the sum 6 in generation 1", sum)
	}
	var env1 map[string]string
	readJSON("env-1-g1.json", &env1)
	if env1["ATOLL_GENERATION"] != "1" {
		t.Errorf("generation 1's rank 1 has ATOLL_GENERATION=%q", env1["ATOLL_GENERATION"])
	}
	g = waitFor("the gang completed", func(g api.Gang) bool { return g.State == api.GangStopped })
	if !strings.HasPrefix(g.Reason, "completed") || g.Generation != 1 {
		t.Errorf("the gang stopped in generation %d: %q: want it completed in generation 1", g.Generation, g.Reason)
	}
	// No driver runs to stop the job: it ends with its gang.
	for {
		kv, ok, err := c.Meta().Get(ctx, api.TableJobs+"pg")
		var j api.Job
		if err == nil && ok && json.Unmarshal(kv.Value, &j) == nil && j.State == api.JobStopped {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the job did not stop with its completed gang: %s %v %v", kv.Value, ok, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// pythonImage builds an image FROM scratch of this machine's Python (its executable, the
// shared libraries it loads, its standard library without tests and site-packages) and
// the process gang test's program at /app/sumranks.py; it is removed when the test ends.
func pythonImage(t *testing.T) string {
	t.Helper()
	ctxDir := t.TempDir()
	root := filepath.Join(ctxDir, "root")
	exe, err := exec.Command("python3", "-c", "import sys, sysconfig; print(sys.executable); print(sysconfig.get_paths()['stdlib'])").Output()
	if err != nil {
		t.Fatalf("python3: %v", err)
	}
	lines := strings.Fields(string(exe))
	if len(lines) != 2 {
		t.Fatalf("python3 said %q", exe)
	}
	py, stdlib := lines[0], lines[1]
	copyFile := func(src string) {
		t.Helper()
		b, err := os.ReadFile(src) // through symbolic links
		if err != nil {
			t.Fatal(err)
		}
		st, err := os.Stat(src)
		if err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(root, src)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, b, st.Mode().Perm()); err != nil {
			t.Fatal(err)
		}
	}
	// The executable and every shared library it or a module of lib-dynload loads.
	libs := map[string]bool{}
	addLibs := func(obj string) {
		out, _ := exec.Command("ldd", obj).Output() // "not a dynamic executable" is no error here
		for _, l := range strings.Split(string(out), "\n") {
			for _, f := range strings.Fields(l) {
				if strings.HasPrefix(f, "/") {
					libs[f] = true
				}
			}
		}
	}
	copyFile(py)
	addLibs(py)
	skip := map[string]bool{"site-packages": true, "test": true, "tests": true, "idlelib": true, "tkinter": true, "turtledemo": true,
		"ensurepip": true, "lib2to3": true, "__pycache__": true}
	err = filepath.WalkDir(stdlib, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if skip[d.Name()] || strings.HasPrefix(d.Name(), "config-") {
				return filepath.SkipDir
			}
			return nil
		}
		if d.Type()&fs.ModeSymlink != 0 {
			return nil
		}
		copyFile(p)
		if strings.HasSuffix(p, ".so") {
			addLibs(p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for l := range libs {
		copyFile(l)
	}
	app := filepath.Join(root, "app")
	if err := os.MkdirAll(app, 0o755); err != nil {
		t.Fatal(err)
	}
	prog, err := os.ReadFile(filepath.Join("testdata", "procgang", "sumranks.py"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(app, "sumranks.py"), prog, 0o755); err != nil {
		t.Fatal(err)
	}
	dockerfile := "FROM scratch\nCOPY root/ /\nENV PATH=" + filepath.Dir(py) + "\n"
	if err := os.WriteFile(filepath.Join(ctxDir, "Dockerfile"), []byte(dockerfile), 0o644); err != nil {
		t.Fatal(err)
	}
	image := fmt.Sprintf("atoll-test-python:%d", os.Getpid())
	if out, err := exec.Command("docker", "build", "-q", "-t", image, ctxDir).CombinedOutput(); err != nil {
		t.Fatalf("docker build: %v\n%s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("docker", "rmi", "-f", image).Run() })
	return image
}

// TestClusterProcessGangResize resizes an elastic process gang as torchrun's elastic agent
// expects: 4 members of 4 GPUs (minimum 2) fill both machines; a gang of higher priority
// that needs one machine shrinks it (a shrink notice: every member checkpoints and yields,
// and the next generation starts at WORLD_SIZE 2 with MASTER_* renewed, its members
// meeting again); once that gang stops, a grow brings it back to 4 the same way. No
// restart is counted, and the work goes on from the checkpoints.
func TestClusterProcessGangResize(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("no python3")
	}
	bin, dir := upCluster(t, 2)
	out := t.TempDir()
	run := func(args ...string) string {
		t.Helper()
		b, err := exec.Command(bin, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("atoll %s: %v\n%s", strings.Join(args, " "), err, b)
		}
		return string(b)
	}
	ctx, cancel := testtime.Context(t, 5*time.Minute)
	defer cancel()
	addr, _, err := clusterAddress(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	c, err := dialCluster(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	waitFor := func(job, what string, ok func(g api.Gang) bool) api.Gang {
		t.Helper()
		return awaitGang(ctx, t, c, job, what, ok)
	}
	readJSON := func(name string, v any) {
		t.Helper()
		awaitJSON(ctx, t, c, out, "el", name, v)
	}
	type sum struct{ Sum, World, Generation int }
	master := func(rank, gen int) string {
		var env map[string]string
		readJSON(fmt.Sprintf("env-%d-g%d.json", rank, gen), &env)
		if env["WORLD_SIZE"] == "" || env["ATOLL_GENERATION"] != strconv.Itoa(gen) {
			t.Fatalf("rank %d of generation %d: env %v", rank, gen, env)
		}
		return env["MASTER_ADDR"] + ":" + env["MASTER_PORT"]
	}

	run("submit", "--dir", dir, "--name", "el", "--workers", "4", "--min-workers", "2", "--gpus-per-worker", "4",
		"--", "python3", "testdata/procgang/sumranks.py", "--out", out, "--gpus", "4", "--elastic")
	waitFor("el", "the elastic gang running at 4", func(g api.Gang) bool { return g.State == api.GangRunning && g.Generation == 0 })
	var s0 sum
	readJSON("sum-g0.json", &s0)
	if s0.Sum != 6 || s0.World != 4 {
		t.Fatalf("generation 0 summed %+v: want 6 over 4 ranks", s0)
	}
	m0 := master(0, 0)

	// A gang of priority 10 that needs one whole machine: the elastic gang shrinks to 2.
	run("submit", "--dir", dir, "--name", "hi", "--workers", "2", "--gpus-per-worker", "4", "--priority", "10", "--", "sleep", "600")
	for r := range 4 {
		var y struct{ Notice api.ProcessNotice }
		readJSON(fmt.Sprintf("yield-%d-g0.json", r), &y)
		if y.Notice.Kind != api.NoticeShrink {
			t.Errorf("rank %d of generation 0 got a %q notice, want shrink", r, y.Notice.Kind)
		}
	}
	waitFor("hi", "the high-priority gang running", func(g api.Gang) bool { return g.State == api.GangRunning })
	g1 := waitFor("el", "the elastic gang running again at 2", func(g api.Gang) bool {
		return g.State == api.GangRunning && g.Generation >= 1
	})
	var s1 sum
	readJSON(fmt.Sprintf("sum-g%d.json", g1.Generation), &s1)
	if s1.World != 2 || s1.Sum != 1 {
		t.Fatalf("after the shrink, generation %d summed %+v: want 0+1 over 2 ranks", g1.Generation, s1)
	}
	if m1 := master(0, g1.Generation); m1 == "" || m1 == ":" {
		t.Fatalf("generation %d has no MASTER_ADDR:MASTER_PORT (generation 0 had %s)", g1.Generation, m0)
	}

	// The high-priority gang ends: the elastic gang grows back to 4.
	if err := c.StopJob(ctx, "hi"); err != nil {
		t.Fatal(err)
	}
	for r := range 2 {
		var y struct{ Notice api.ProcessNotice }
		readJSON(fmt.Sprintf("yield-%d-g%d.json", r, g1.Generation), &y)
		if y.Notice.Kind != api.NoticeGrow {
			t.Errorf("rank %d of generation %d got a %q notice, want grow", r, g1.Generation, y.Notice.Kind)
		}
	}
	g2 := waitFor("el", "the elastic gang running again at 4", func(g api.Gang) bool {
		return g.State == api.GangRunning && g.Generation > g1.Generation
	})
	var s2 sum
	readJSON(fmt.Sprintf("sum-g%d.json", g2.Generation), &s2)
	if s2.World != 4 || s2.Sum != 6 {
		t.Fatalf("after the grow, generation %d summed %+v: want 6 over 4 ranks", g2.Generation, s2)
	}
	if g2.Restarts != 0 {
		t.Errorf("the resizes counted %d restarts, want 0", g2.Restarts)
	}
	// Every member ends: the gang completes.
	if err := os.WriteFile(filepath.Join(out, "stop"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	g := waitFor("el", "the elastic gang completed", func(g api.Gang) bool { return g.State == api.GangStopped })
	if !strings.HasPrefix(g.Reason, "completed") {
		t.Errorf("the elastic gang stopped: %q, want completed", g.Reason)
	}
}

// awaitGang polls a job's gang "main" until ok says it is where the test wants it; a
// failed gang or the end of ctx fails the test.
func awaitGang(ctx context.Context, t *testing.T, c *dialed, job, what string, ok func(g api.Gang) bool) api.Gang {
	t.Helper()
	for {
		g, _, err := c.Gang(ctx, job, "main")
		if err == nil && ok(g) {
			return g
		}
		if err == nil && g.State == api.GangFailed {
			t.Fatalf("waiting for %s: gang %s failed: %s", what, job, g.Reason)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v (gang %s: %+v, %v)", what, ctx.Err(), job, g, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// awaitJSON waits for a JSON file a process gang's program writes into dir, and decodes
// it into v; the job's gang failing or the end of ctx fails the test.
func awaitJSON(ctx context.Context, t *testing.T, c *dialed, dir, job, name string, v any) {
	t.Helper()
	for {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err == nil {
			if err := json.Unmarshal(b, v); err != nil {
				t.Fatalf("%s: %v\n%s", name, err, b)
			}
			return
		}
		if !errors.Is(err, fs.ErrNotExist) {
			t.Fatal(err)
		}
		g, _, _ := c.Gang(ctx, job, "main")
		if g.State == api.GangFailed {
			t.Fatalf("waiting for %s: the gang failed: %s", name, g.Reason)
		}
		if g.Restarts > 0 {
			// A member failed and the gang started again: the file of the generation it
			// left will never come (these tests' gangs never fail).
			t.Fatalf("waiting for %s: the gang restarted (%d restarts, now generation %d, %s): %s", name, g.Restarts, g.Generation, g.State, g.Reason)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v (gang %s: %s)", name, ctx.Err(), g.State, g.Reason)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
