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
	"sync"
	"testing"
	"time"

	"github.com/atoll-run/atoll/internal/testtime"
	"github.com/atoll-run/atoll/runtime/api"
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
	// The driver trains 1000 steps without the demo's own injected crash (DEMO_KILL_AT=-1).
	// The test follows the gang's events and kills as soon as each generation runs; the
	// training stands still while a generation restarts, so the kills use up a few hundred
	// steps, whatever the machine's speed. What is left trains after the leader's container
	// is killed, and slowly (not understood yet): in the runs of 2026-12-01 the test spent
	// two to four minutes there.
	env := append(os.Environ(), "ATOLL_CLUSTER="+cluster, "ATOLL_IMAGE="+image, "DEMO_STEPS=1000", "DEMO_WORKERS=8", "DEMO_KILL_AT=-1",
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
	// The cluster first; the driver (the training) once the test is ready to follow it.
	if out, err := compose("up", "-d", "head1", "head2", "head3", "agent1", "agent2", "agent3", "agent4"); err != nil {
		t.Fatalf("compose up: %v\n%s", err, out)
	}
	// The containers' ids, from docker's labels: a killed container keeps its id, and every
	// docker-compose run costs a Python start on the machine the cluster shares.
	ids := map[string]string{}
	container := func(service string) string {
		if id := ids[service]; id != "" {
			return id
		}
		out, err := run("docker", "ps", "-a", "--filter", "label=com.docker.compose.project="+project,
			"--format", `{{.ID}} {{.Label "com.docker.compose.service"}}`)
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			if id, svc, ok := strings.Cut(line, " "); ok {
				ids[svc] = id
			}
		}
		if ids[service] == "" {
			t.Fatalf("no container of %s (docker ps: %v)\n%s", service, err, out)
		}
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
	// The test follows the job's events from a head that does not lead (it is not killed):
	// one process that prints each placement and restart as it is committed, where polling
	// the status (docker exec, a process and a certificate each time) fell a minute behind
	// the training on a loaded machine, and the training ended before the kills.
	var st status
	for deadline := testtime.Deadline(t, time.Minute); ; time.Sleep(200 * time.Millisecond) {
		if st, err = statusOf(); err == nil && st.Leader != 0 && len(st.Machines) == 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cluster did not come up: %+v, %v", st, err)
		}
	}
	watcher := fmt.Sprintf("head%d", st.Leader%3+1)
	follow := exec.CommandContext(ctx, "docker", "exec", container(watcher), "/atoll", "events", "--follow", "--json", "--job", "digits",
		"--address", address+";ca=/cluster/tls/ca.crt")
	follow.Env = env
	var followErr lockedBuffer
	follow.Stderr = &followErr
	stream, err := follow.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := follow.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = follow.Process.Kill(); _ = follow.Wait() })
	events := make(chan api.Event, 64)
	go func() {
		defer close(events)
		dec := json.NewDecoder(stream)
		for {
			var e api.Event
			if dec.Decode(&e) != nil {
				return
			}
			events <- e
		}
	}()
	var placed []string // the machines of the newest placement (a restart in place keeps them)
	// awaitGang waits until digits/dp runs in at least generation gen and returns its
	// machines; it fails at once when the gang ends or the driver exits.
	awaitGang := func(gen int, why string) (machines []string) {
		t.Helper()
		since := func() time.Duration { return time.Since(start).Round(time.Second) }
		driverLog := func() string {
			logs, _ := run("docker", "logs", "--tail", "30", container("driver"))
			return logs
		}
		timeout := time.NewTimer(time.Until(testtime.Deadline(t, time.Minute)))
		defer timeout.Stop()
		for {
			select {
			case e, ok := <-events:
				if !ok {
					t.Fatalf("%v: the events stopped before the gang ran in generation %d %s: %s\nthe driver's log:\n%s",
						since(), gen, why, followErr.String(), driverLog())
				}
				if e.Gang != "dp" {
					continue
				}
				switch e.Kind {
				case api.EventGangPlaced:
					placed = e.Machines
				case api.EventGangRunning:
					if e.Generation >= gen {
						t.Logf("%v: the gang runs in generation %d on %v %s", since(), e.Generation, placed, why)
						if len(placed) == 0 {
							t.Fatalf("no placement of the gang among its events")
						}
						return placed
					}
				case api.EventGangFailed, api.EventGangStopped:
					t.Fatalf("%v: %s in generation %d %s: %s; the driver's log:\n%s", since(), e.Kind, e.Generation, why, e.Reason, driverLog())
				}
			case <-timeout.C:
				t.Fatalf("%v: the gang did not run in generation %d %s", since(), gen, why)
			}
		}
	}
	if out, err := compose("up", "-d", "driver"); err != nil {
		t.Fatalf("compose up driver: %v\n%s", err, out)
	}
	awaitGang(0, "at the start")
	// A worker process is killed.
	if out, err := run("docker", "exec", container(watcher), "/atoll", "kill-worker", "digits", "--gang", "dp", "--rank", "5", "--address", address+";ca=/cluster/tls/ca.crt"); err != nil {
		t.Fatalf("kill-worker: %v\n%s", err, out)
	}
	machines := awaitGang(1, "after a worker was killed")
	// An agent's container is killed: its gang moves to other machines.
	lost := machines[0]
	if out, err := run("docker", "kill", container(lost)); err != nil {
		t.Fatalf("docker kill %s: %v\n%s", lost, err, out)
	}
	killed[lost] = true
	machines = awaitGang(2, "after an agent's container was killed")
	if slices.Contains(machines, lost) {
		t.Fatalf("the gang still runs on the killed machine %s: %v", lost, machines)
	}
	// The leader head's container is killed: another head leads, the training goes on.
	st, err = statusOf()
	if err != nil {
		t.Fatal(err)
	}
	leader := fmt.Sprintf("head%d", st.Leader)
	if out, err := run("docker", "kill", container(leader)); err != nil {
		t.Fatalf("docker kill %s: %v\n%s", leader, err, out)
	}
	killed[leader] = true
	deadline := testtime.Deadline(t, time.Minute)
	var st2Leader uint64
	for {
		st2, err := statusOf()
		if err == nil && st2.Leader != 0 && st2.Leader != st.Leader {
			st2Leader = st2.Leader
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no new leader after %s was killed: %v", leader, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if out, err := run("docker", "inspect", "-f", "{{.State.Running}}", container("driver")); err != nil || strings.TrimSpace(out) != "true" {
		t.Fatalf("the training ended before the leader head was killed (running %q, %v): the test did not test it", strings.TrimSpace(out), err)
	}
	t.Logf("%v: %s, the leader, killed; head%d leads", time.Since(start).Round(time.Second), leader, st2Leader)
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
		WallSeconds  float64  `json:"wall_s"`
		Accuracy     float64  `json:"accuracy"`
		Restarts     int      `json:"restarts"`
		MachinesUsed []string `json:"machines_used"`
		Steps        int      `json:"steps"`
	}
	lines := strings.Split(strings.TrimSpace(logs), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil {
		t.Fatalf("driver output: %v\n%s", err, logs)
	}
	if res.Accuracy < 0.85 || res.Restarts < 2 || res.Steps != 1000 {
		t.Fatalf("training: accuracy %.3f, %d restarts, %d steps", res.Accuracy, res.Restarts, res.Steps)
	}
	t.Logf("%v: trained to %.1f%% accuracy in %.0f s through %d restarts (worker, agent and leader killed); last on %v",
		time.Since(start).Round(time.Second), 100*res.Accuracy, res.WallSeconds, res.Restarts, res.MachinesUsed)
}

// lockedBuffer is a bytes.Buffer that a process writes while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
