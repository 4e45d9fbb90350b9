package agent

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/atoll-run/atoll/runtime/api"
)

func mode(t *testing.T, path string) os.FileMode {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Mode().Perm()
}

func TestWriteWorkerSpec(t *testing.T) {
	run := filepath.Join(t.TempDir(), "run")
	spec := api.WorkerSpec{Job: "j", Gang: "g", Rank: 2, Generation: 1, Token: "secret", Heads: []string{"http://h:1"}, Holder: "worker/j/g/2.g1"}
	path, err := writeWorkerSpec(run, "j.g.2.g1", spec)
	if err != nil {
		t.Fatal(err)
	}
	if path != filepath.Join(run, "j.g.2.g1.json") || mode(t, path) != 0o600 || mode(t, run) != 0o700 {
		t.Fatalf("spec %s mode %v in a directory of mode %v: want 0600 in 0700", path, mode(t, path), mode(t, run))
	}
	got, err := api.ReadWorkerSpec(path)
	if err != nil || !reflect.DeepEqual(got, spec) {
		t.Fatalf("read back %+v, %v; want %+v", got, err, spec)
	}
	// Written again (a restart of the same name): still 0600, the new content.
	spec.Generation = 2
	if _, err := writeWorkerSpec(run, "j.g.2.g1", spec); err != nil {
		t.Fatal(err)
	}
	if got, err := api.ReadWorkerSpec(path); err != nil || got.Generation != 2 {
		t.Fatalf("rewritten: %+v, %v", got, err)
	}
	// A file where the directory should be.
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := writeWorkerSpec(file, "x", spec); err == nil {
		t.Fatal("a spec written under a file")
	}
}

func TestInheritedEnv(t *testing.T) {
	got := inheritedEnv([]string{"PATH=/bin", "ATOLL_WORKER=/x", "ATOLL_TOKEN_FILE=/t", "CUDA_VISIBLE_DEVICES=0,1", "CUDA_HOME=/cuda", "HOME=/h"})
	if want := []string{"PATH=/bin", "CUDA_HOME=/cuda", "HOME=/h"}; !reflect.DeepEqual(got, want) {
		t.Errorf("env %v, want %v", got, want)
	}
	if got := inheritedEnv(nil); got == nil || len(got) != 0 {
		t.Errorf("an empty environment must stay empty, not nil (nil would inherit everything): %#v", got)
	}
}

func TestGPUEnv(t *testing.T) {
	cases := []struct {
		name string
		spec api.WorkerSpec
		want []string
	}{
		{name: "real cards by UUID", spec: api.WorkerSpec{Member: api.Member{UUIDs: []string{"GPU-a", "GPU-b"}}}, want: []string{"CUDA_VISIBLE_DEVICES=GPU-a,GPU-b"}},
		{name: "no cards: none visible", spec: api.WorkerSpec{}, want: []string{"CUDA_VISIBLE_DEVICES="}},
		{name: "simulated: none visible, the UUIDs apart", spec: api.WorkerSpec{Simulated: true, Member: api.Member{UUIDs: []string{"GPU-sim-0"}}},
			want: []string{"CUDA_VISIBLE_DEVICES=", api.SimulatedGPUsEnv + "=GPU-sim-0"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := gpuEnv(c.spec); !reflect.DeepEqual(got, c.want) {
				t.Errorf("env %v, want %v", got, c.want)
			}
		})
	}
}

func TestWriteDriverFiles(t *testing.T) {
	cases := []struct {
		name   string
		caCert string
	}{
		{name: "plain http"},
		{name: "mutual TLS: the CA certificate too", caCert: "-----BEGIN CERTIFICATE-----\n"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			run := t.TempDir()
			env, _, err := writeDriverFiles(run, "j.driver.0.g0", api.WorkerSpec{Token: "tok", Heads: []string{"http://a:1", "http://b:2"}, CACert: c.caCert})
			if err != nil {
				t.Fatal(err)
			}
			tokenPath := filepath.Join(run, "j.driver.0.g0.token")
			want := []string{"ATOLL_ADDRESS=http://a:1,http://b:2", "ATOLL_TOKEN_FILE=" + tokenPath}
			if c.caCert != "" {
				want = append(want, api.CACertEnv+"="+filepath.Join(run, "j.driver.0.g0.ca.crt"))
			}
			if !reflect.DeepEqual(env, want) {
				t.Fatalf("env %v, want %v", env, want)
			}
			if b, err := os.ReadFile(tokenPath); err != nil || string(b) != "tok\n" || mode(t, tokenPath) != 0o600 {
				t.Errorf("token file %q %v, mode %v", b, err, mode(t, tokenPath))
			}
		})
	}
}

func TestWorkDir(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for in, want := range map[string]string{"": "", dir: dir, file: "", filepath.Join(dir, "missing"): ""} {
		if got := workDir(in); got != want {
			t.Errorf("workDir(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestExitError(t *testing.T) {
	run := func(script string) error { return exec.Command("/bin/sh", "-c", script).Run() }
	cases := []struct {
		name      string
		err       error
		want      string
		permanent bool
	}{
		{name: "status 0", err: nil, want: ErrExitedZero.Error()},
		{name: "a status", err: run("exit 3"), want: "exited with status 3"},
		{name: "the permanent status", err: run("exit 78"), want: "exited with status 78 (permanent", permanent: true},
		{name: "a signal", err: run("kill -9 $$"), want: "killed by signal killed"},
		{name: "not an exit", err: errors.New("wait: no child"), want: "wait: no child"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := exitError(c.err)
			if !strings.HasPrefix(err.Error(), c.want) || isPermanent(err) != c.permanent {
				t.Errorf("exit %q (permanent %v), want %q (%v)", err, isPermanent(err), c.want, c.permanent)
			}
		})
	}
	if !errors.Is(exitError(nil), ErrExitedZero) {
		t.Error("a clean exit is not ErrExitedZero")
	}
}

// TestExecLauncher starts real (tiny) worker processes: the spec file they are given,
// their environment and log, and how their ends are reported.
func TestExecLauncher(t *testing.T) {
	if _, err := os.Stat("/bin/sh"); err != nil {
		t.Skip("no /bin/sh")
	}
	t.Setenv("ATOLL_LEAK", "agent's own")
	dir := t.TempDir()
	l := &ExecLauncher{RunDir: filepath.Join(dir, "run"), LogDir: filepath.Join(dir, "logs"),
		Binary: func(context.Context, api.Job) (string, error) { return "/bin/sh", nil }}
	spec := api.WorkerSpec{Job: "j", Gang: "g", Rank: 1, Generation: 3, Token: "secret", Member: api.Member{UUIDs: []string{"GPU-x"}}}
	cases := []struct {
		name   string
		script string
		stop   func(Handle) error
		exit   string
		log    []string
	}{
		{name: "a worker that returns", script: `stat -c 'spec mode %a' "$ATOLL_WORKER"; echo "cuda=$CUDA_VISIBLE_DEVICES leak=$ATOLL_LEAK extra=$EXTRA"`,
			exit: "exited with status 0", log: []string{"spec mode 600", "cuda=GPU-x leak= extra=job's"}},
		{name: "a worker that fails for good", script: "echo failing >&2; exit 78", exit: "exited with status 78 (permanent", log: []string{"failing"}},
		// Start returns once the process runs the shell in its own process group: a signal
		// to the group from then on reaches it, whether it got to sleep yet or not.
		{name: "a worker stopped", script: "exec sleep 60",
			stop: func(h Handle) error { return h.Stop(context.Background(), time.Minute) }, exit: "killed by signal terminated"},
		{name: "a worker killed", script: "exec sleep 60", stop: func(h Handle) error { return h.Kill() }, exit: "killed by signal killed"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h, err := l.Launch(context.Background(), spec, api.Job{Name: "j", Args: []string{"-c", c.script}, Env: []string{"EXTRA=job's"}})
			if err != nil {
				t.Fatal(err)
			}
			if h.PID() <= 0 {
				t.Errorf("pid %d", h.PID())
			}
			if c.stop != nil {
				if err := c.stop(h); err != nil {
					t.Fatal(err)
				}
			}
			<-h.Done()
			if !strings.HasPrefix(h.Err().Error(), c.exit) {
				t.Errorf("exit %q, want %q", h.Err(), c.exit)
			}
			if _, err := os.Stat(filepath.Join(dir, "run", "j.g.1.g3.json")); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the spec file outlived its worker: %v", err)
			}
			logPath := LogPath(dir, "j", "g", 1, 3)
			b, err := os.ReadFile(logPath)
			if err != nil || mode(t, logPath) != 0o600 {
				t.Fatalf("log %v, mode %v", err, mode(t, logPath))
			}
			for _, want := range c.log {
				if !strings.Contains(string(b), want) {
					t.Errorf("log %q lacks %q", b, want)
				}
			}
			if err := os.Remove(logPath); err != nil {
				t.Fatal(err)
			}
		})
	}
	failing := &ExecLauncher{RunDir: l.RunDir, LogDir: l.LogDir, Binary: func(context.Context, api.Job) (string, error) {
		return "", permanentErr{errors.New("no executable")}
	}}
	if _, err := failing.Launch(context.Background(), spec, api.Job{}); !isPermanent(err) {
		t.Errorf("a binary that cannot be had: %v, want its permanent error", err)
	}
	missing := &ExecLauncher{RunDir: l.RunDir, LogDir: l.LogDir, Binary: func(context.Context, api.Job) (string, error) {
		return filepath.Join(dir, "no-such-binary"), nil
	}}
	if _, err := missing.Launch(context.Background(), spec, api.Job{}); err == nil || !strings.Contains(err.Error(), "start worker j/g/1.g3") {
		t.Errorf("a binary that does not start: %v", err)
	}
}

// openFDs counts this process's open file descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	return len(fds)
}

// TestExecLauncherDriverFilesFail: when a driver's token or CA file cannot be written, Launch
// fails and closes the worker's log file (no descriptor left open).
func TestExecLauncherDriverFilesFail(t *testing.T) {
	// The garbage collector would close a leaked file through its finalizer, hiding the leak.
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	dir := t.TempDir()
	l := &ExecLauncher{RunDir: filepath.Join(dir, "run"), LogDir: filepath.Join(dir, "logs"),
		Binary: func(context.Context, api.Job) (string, error) { return "/bin/true", nil }}
	cases := []struct {
		name   string
		file   string // made a directory, so that it cannot be written
		caCert string
		err    string
	}{
		{name: "token file", file: "j.driver.0.g0.token", err: "driver token file"},
		{name: "CA file", file: "j.driver.0.g0.ca.crt", caCert: "-----BEGIN CERTIFICATE-----\n", err: "driver CA file"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// Written as root too, where a read-only run directory would not stop it.
			blocked := filepath.Join(l.RunDir, c.file)
			if err := os.MkdirAll(blocked, 0o700); err != nil {
				t.Fatal(err)
			}
			defer os.RemoveAll(blocked)
			spec := api.WorkerSpec{Job: "j", Gang: "driver", Driver: true, Token: "secret", Heads: []string{"http://h:1"}, CACert: c.caCert}
			before := openFDs(t)
			for i := 0; i < 20; i++ {
				if _, err := l.Launch(context.Background(), spec, api.Job{Name: "j"}); err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("launch: %v, want an error about the %s", err, c.err)
				}
			}
			if after := openFDs(t); after > before {
				t.Errorf("%d descriptors open after 20 failed launches, %d before", after, before)
			}
		})
	}
}

// TestNoCredentialFileOutlivesItsProcess: the spec and credential files of a launch that
// fails are removed at once, those of a process when it ends, and those an earlier run of
// the agent left when it starts again; the spec holds the process's own credential.
func TestNoCredentialFileOutlivesItsProcess(t *testing.T) {
	dir := t.TempDir()
	run := filepath.Join(dir, "run")
	bin := "/nonexistent/program"
	l := &ExecLauncher{RunDir: run, LogDir: filepath.Join(dir, "logs"),
		Binary:     func(context.Context, api.Job) (string, error) { return bin, nil },
		Credential: func(_ context.Context, s api.WorkerSpec) (string, error) { return "credential-of-" + s.Key(), nil }}
	left := func() []string {
		m, _ := filepath.Glob(filepath.Join(run, "*"))
		return m
	}
	for _, driver := range []bool{false, true} {
		spec := api.WorkerSpec{Job: "j", Gang: "g", Driver: driver, Heads: []string{"http://h:1"}, CACert: "-----BEGIN CERTIFICATE-----\n"}
		if _, err := l.Launch(context.Background(), spec, api.Job{Name: "j"}); err == nil {
			t.Fatal("a launch of a missing program started")
		}
		if f := left(); len(f) != 0 {
			t.Errorf("driver %v: a failed launch left %v", driver, f)
		}
	}
	bin = "/bin/true"
	for _, driver := range []bool{false, true} {
		spec := api.WorkerSpec{Job: "j", Gang: "g", Driver: driver, Heads: []string{"http://h:1"}, CACert: "-----BEGIN CERTIFICATE-----\n"}
		h, err := l.Launch(context.Background(), spec, api.Job{Name: "j"})
		if err != nil {
			t.Fatal(err)
		}
		<-h.Done()
		if f := left(); len(f) != 0 {
			t.Errorf("driver %v: an ended process left %v", driver, f)
		}
	}
	// The spec holds the credential the launcher got, never another.
	spec, err := writeWorkerSpec(run, "x", api.WorkerSpec{Token: "credential-of-x"})
	if err != nil {
		t.Fatal(err)
	}
	if s, err := api.ReadWorkerSpec(spec); err != nil || s.Token != "credential-of-x" {
		t.Fatalf("spec: %+v %v", s, err)
	}
	for _, f := range []string{"a.token", "a.ca.crt"} {
		if err := os.WriteFile(filepath.Join(run, f), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if n := removeRunFiles(run); n != 3 || len(left()) != 0 {
		t.Errorf("removeRunFiles removed %d, left %v", n, left())
	}
}
