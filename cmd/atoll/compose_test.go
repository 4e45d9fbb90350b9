package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/atoll-run/atoll/internal/testtime"
)

// TestComposeClusterSurvivesFailures brings up deploy/compose.yaml (three heads, four
// agents and a driver in containers built FROM scratch), then kills a worker process, an
// agent's container and the leader head's container while the driver trains, and checks
// that the training finishes with its accuracy. It needs Docker and docker-compose.
func TestComposeClusterSurvivesFailures(t *testing.T) {
	if testing.Short() {
		t.Skip("brings up a cluster of containers")
	}
	if err := exec.Command("docker", "info").Run(); err != nil {
		t.Skipf("Docker is not available here (docker info: %v): the compose cluster test needs it", err)
	}
	if _, err := exec.LookPath("docker-compose"); err != nil {
		t.Skip("docker-compose is not installed: the compose cluster test needs it")
	}
	t.Parallel()
	ctx, cancel := testtime.Context(t, 8*time.Minute)
	defer cancel()
	dir := t.TempDir()
	static, err := os.ReadFile(buildAtoll(t)) // the image's binary: the tests' static build
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "atoll"), static, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"Dockerfile", "compose.yaml"} {
		b, err := os.ReadFile(filepath.Join("..", "..", "deploy", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	project := fmt.Sprintf("atolltest%d", os.Getpid())
	image := "atoll:" + project
	cluster := filepath.Join(dir, "cluster")
	if _, _, err := initDir(cluster); err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), "ATOLL_CLUSTER="+cluster, "ATOLL_IMAGE="+image, "DEMO_STEPS=2000", "DEMO_WORKERS=8",
		"ATOLL_GOSSIP_PROBE="+testtime.Scale(500*time.Millisecond).String()) // as sdktest.UpFlags
	runIn := func(ctx context.Context, name string, args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Dir, cmd.Env = dir, env
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		return out.String(), err
	}
	run := func(name string, args ...string) (string, error) { return runIn(ctx, name, args...) }
	composeIn := func(ctx context.Context, args ...string) (string, error) {
		return runIn(ctx, "docker-compose", append([]string{"-p", project, "-f", filepath.Join(dir, "compose.yaml")}, args...)...)
	}
	compose := func(args ...string) (string, error) { return composeIn(ctx, args...) }
	start := time.Now()
	if out, err := run("docker", "build", "-q", "-t", image, dir); err != nil {
		t.Fatalf("docker build: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), time.Minute) // the test's context has ended
		defer cancel()
		if t.Failed() {
			out, err := composeIn(c, "logs", "--no-color", "--tail", "60")
			t.Logf("compose logs (%v):\n%s", err, out)
		}
		down := exec.CommandContext(c, "docker-compose", "-p", project, "-f", filepath.Join(dir, "compose.yaml"), "down", "-v", "-t", "2")
		down.Env = env
		_ = down.Run()
		_ = exec.CommandContext(c, "docker", "rmi", "-f", image).Run()
	})
	if out, err := compose("up", "-d"); err != nil {
		t.Fatalf("compose up: %v\n%s", err, out)
	}
	// The containers' ids, asked once: a killed container keeps its id, and every
	// docker-compose run costs a Python start on the machine the cluster shares.
	ids := map[string]string{}
	container := func(service string) string {
		if id := ids[service]; id != "" {
			return id
		}
		out, err := compose("ps", "-q", service)
		if err != nil || strings.TrimSpace(out) == "" {
			t.Fatalf("compose ps %s: %v\n%s", service, err, out)
		}
		ids[service] = strings.TrimSpace(out)
		return ids[service]
	}
	killed := map[string]bool{}
	address := "https://head1:7080,https://head2:7080,https://head3:7080"
	type status struct {
		Leader   uint64 `json:"leader"`
		Machines []struct {
			Name  string `json:"name"`
			Alive bool   `json:"alive"`
		} `json:"machines"`
		Gangs []struct {
			Job, Name, State, Reason string
			Generation               int
			Machines                 []string
		} `json:"gangs"`
	}
	// statusOf asks a live head's container for the cluster's status.
	statusOf := func() (status, error) {
		var st status
		var last error
		for _, h := range []string{"head1", "head2", "head3"} {
			if killed[h] {
				continue
			}
			out, err := run("docker", "exec", container(h), "/atoll", "status", "--address", address+";ca=/cluster/tls/ca.crt", "--json")
			if err != nil {
				last = fmt.Errorf("%v: %s", err, out)
				continue
			}
			if err := json.Unmarshal([]byte(out), &st); err != nil {
				last = err
				continue
			}
			return st, nil
		}
		return st, last
	}
	// awaitGang waits until digits/dp runs in at least generation gen; it fails at once when
	// the gang has ended or the driver has exited (nothing will run it again).
	awaitGang := func(gen int, why string) (machines []string) {
		t.Helper()
		deadline := testtime.Deadline(t, time.Minute)
		for time.Now().Before(deadline) {
			st, err := statusOf()
			if err == nil {
				for _, g := range st.Gangs {
					if g.Job != "digits" || g.Name != "dp" {
						continue
					}
					if g.State == "running" && g.Generation >= gen {
						t.Logf("%v: the gang runs in generation %d %s", time.Since(start).Round(time.Second), g.Generation, why)
						return g.Machines
					}
					if g.State == "failed" || g.State == "stopped" {
						logs, _ := run("docker", "logs", "--tail", "30", container("driver"))
						t.Fatalf("%v: the gang %s in generation %d %s: %s; the driver's log:\n%s", time.Since(start).Round(time.Second), g.State, g.Generation, why, g.Reason, logs)
					}
				}
			}
			if out, err := run("docker", "inspect", "-f", "{{.State.Running}}", container("driver")); err == nil && strings.TrimSpace(out) == "false" {
				logs, _ := run("docker", "logs", "--tail", "30", container("driver"))
				t.Fatalf("%v: the driver exited before the gang ran in generation %d %s:\n%s", time.Since(start).Round(time.Second), gen, why, logs)
			}
			time.Sleep(500 * time.Millisecond)
		}
		t.Fatalf("the gang did not run in generation %d %s", gen, why)
		return nil
	}
	awaitGang(1, "after the demo's own injected crash")
	// A worker process is killed.
	if out, err := run("docker", "exec", container("head1"), "/atoll", "kill-worker", "digits", "--gang", "dp", "--rank", "5", "--address", address+";ca=/cluster/tls/ca.crt"); err != nil {
		t.Fatalf("kill-worker: %v\n%s", err, out)
	}
	machines := awaitGang(2, "after a worker was killed")
	// An agent's container is killed: its gang moves to other machines.
	lost := machines[0]
	if out, err := run("docker", "kill", container(lost)); err != nil {
		t.Fatalf("docker kill %s: %v\n%s", lost, err, out)
	}
	killed[lost] = true
	machines = awaitGang(3, "after an agent's container was killed")
	if slices.Contains(machines, lost) {
		t.Fatalf("the gang still runs on the killed machine %s: %v", lost, machines)
	}
	// The leader head's container is killed: another head leads, the training goes on.
	st, err := statusOf()
	if err != nil {
		t.Fatal(err)
	}
	leader := fmt.Sprintf("head%d", st.Leader)
	if out, err := run("docker", "kill", container(leader)); err != nil {
		t.Fatalf("docker kill %s: %v\n%s", leader, err, out)
	}
	killed[leader] = true
	deadline := testtime.Deadline(t, time.Minute)
	for {
		st2, err := statusOf()
		if err == nil && st2.Leader != 0 && st2.Leader != st.Leader {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no new leader after %s was killed: %v", leader, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// The driver finishes the training.
	if out, err := run("docker", "wait", container("driver")); err != nil || strings.TrimSpace(out) != "0" {
		logs, _ := run("docker", "logs", "--tail", "20", container("driver"))
		t.Fatalf("the driver exited with %q (%v):\n%s", strings.TrimSpace(out), err, logs)
	}
	logs, err := run("docker", "logs", container("driver"))
	if err != nil {
		t.Fatal(err)
	}
	var res struct {
		Accuracy     float64  `json:"accuracy"`
		Restarts     int      `json:"restarts"`
		MachinesUsed []string `json:"machines_used"`
		Steps        int      `json:"steps"`
	}
	lines := strings.Split(strings.TrimSpace(logs), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil {
		t.Fatalf("driver output: %v\n%s", err, logs)
	}
	if res.Accuracy < 0.85 || res.Restarts < 3 || res.Steps != 2000 {
		t.Fatalf("training: accuracy %.3f, %d restarts, %d steps", res.Accuracy, res.Restarts, res.Steps)
	}
	t.Logf("trained to %.1f%% accuracy through %d restarts (worker, agent and leader killed); last on %v", 100*res.Accuracy, res.Restarts, res.MachinesUsed)
}
