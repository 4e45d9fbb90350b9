package provider

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestMain lets the test binary stand in for `atoll agent` in the local provider's tests:
// with ATOLL_FAKE_AGENT set it writes its arguments to that directory and waits for
// SIGTERM, as an agent does.
func TestMain(m *testing.M) {
	if dir := os.Getenv("ATOLL_FAKE_EXEC_PROVIDER"); dir != "" { // an Exec provider program
		err := ServeExec(context.Background(), os.Stdin, os.Stdout, func(req ExecRequest) (Provider, error) {
			return newDirProvider(dir, req)
		})
		if err != nil {
			os.Exit(1)
		}
		os.Exit(0)
	}
	if dir := os.Getenv("ATOLL_FAKE_AGENT"); dir != "" {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGTERM)
		name := "unnamed"
		for i, a := range os.Args {
			if a == "--name" && i+1 < len(os.Args) {
				name = os.Args[i+1]
			}
		}
		_ = os.WriteFile(filepath.Join(dir, name+".tokenfile"), []byte(os.Getenv("ATOLL_TOKEN_FILE")), 0o600)
		_ = os.WriteFile(filepath.Join(dir, name+".args"), []byte(strings.Join(os.Args[1:], " ")), 0o600)
		if os.Getenv("ATOLL_FAKE_AGENT_STUBBORN") != "" {
			signal.Ignore(syscall.SIGTERM)
			select {}
		}
		<-sig
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func waitFile(t *testing.T, path string) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if b, err := os.ReadFile(path); err == nil && len(b) > 0 {
			return string(b)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%s never appeared", path)
	return ""
}

func TestLocal(t *testing.T) {
	dir := t.TempDir()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	l, err := NewLocal(LocalConfig{Exe: exe, Join: "http://127.0.0.1:1", Dir: dir, Env: []string{"ATOLL_FAKE_AGENT=" + dir, "ATOLL_TOKEN_FILE=/cluster/token"}, Grace: 5 * time.Second,
		Credential: func(m string) (string, error) { return "credential-of-" + m, nil }})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := l.Launch(ctx, LaunchRequest{Pool: "p", Names: []string{"p-0", "p-1"}, Machine: "dgx-h100", Rack: 2}); err != nil {
		t.Fatal(err)
	}
	args := waitFile(t, filepath.Join(dir, "p-0.args"))
	// Its own credential, not the cluster token's file.
	cred := filepath.Join(dir, "agents", "p-0", "credential")
	if tf, _ := os.ReadFile(filepath.Join(dir, "p-0.tokenfile")); string(tf) != cred {
		t.Errorf("the agent's ATOLL_TOKEN_FILE %q, want %s", tf, cred)
	}
	if st, err := os.Stat(cred); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("the credential file: %v %v, want mode 0600", st, err)
	} else if b, _ := os.ReadFile(cred); strings.TrimSpace(string(b)) != "credential-of-p-0" {
		t.Errorf("the credential file holds %q", b)
	}
	want := "agent --join http://127.0.0.1:1 --name p-0 --machine dgx-h100 --rack 2 --dir " + filepath.Join(dir, "agents", "p-0")
	if args != want {
		t.Fatalf("agent arguments %q, want %q", args, want)
	}
	waitFile(t, filepath.Join(dir, "p-1.args"))
	pid := l.PID("p-0")
	// Launching a running name again starts nothing.
	if err := l.Launch(ctx, LaunchRequest{Pool: "p", Names: []string{"p-0"}, Machine: "dgx-h100"}); err != nil || l.PID("p-0") != pid {
		t.Fatalf("relaunch: %v, pid %d -> %d", err, pid, l.PID("p-0"))
	}
	list, _ := l.List(ctx)
	if len(list) != 2 || !list[0].Running || !list[1].Running {
		t.Fatalf("list %+v", list)
	}
	if err := l.Interrupt("p-1", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := l.Interrupt("nosuch", time.Minute); !errors.Is(err, ErrInvalid) {
		t.Fatalf("interrupting an unknown machine: %v", err)
	}
	if n := l.Notices(); len(n) != 1 || n[0].Machine != "p-1" || len(l.Notices()) != 0 {
		t.Fatalf("notices %+v", n)
	}
	for _, name := range []string{"p-0", "p-1"} {
		if err := l.Terminate(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	if syscall.Kill(pid, 0) == nil {
		t.Fatalf("agent pid %d still runs after Terminate", pid)
	}
	if err := l.Terminate(ctx, "p-0"); err != nil {
		t.Fatalf("terminating a gone machine: %v", err)
	}
	if err := l.Launch(ctx, LaunchRequest{Names: []string{"../x"}}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("bad name: %v", err)
	}
}

// TestLocalKillsStubbornAgent: an agent that ignores SIGTERM is killed after the grace.
func TestLocalKillsStubbornAgent(t *testing.T) {
	dir := t.TempDir()
	exe, _ := os.Executable()
	l, err := NewLocal(LocalConfig{Exe: exe, Join: "x", Dir: dir, Env: []string{"ATOLL_FAKE_AGENT=" + dir, "ATOLL_FAKE_AGENT_STUBBORN=1"}, Grace: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Launch(context.Background(), LaunchRequest{Pool: "p", Names: []string{"s"}, Machine: "dgx-h100"}); err != nil {
		t.Fatal(err)
	}
	waitFile(t, filepath.Join(dir, "s.args"))
	pid := l.PID("s")
	if err := l.Terminate(context.Background(), "s"); err != nil {
		t.Fatal(err)
	}
	if syscall.Kill(pid, 0) == nil {
		t.Fatalf("stubborn agent %d survived", pid)
	}
}

func TestSim(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := NewSim(func() time.Time { return now })
	ctx := context.Background()
	if err := s.Launch(ctx, LaunchRequest{Pool: "spot", Names: []string{"a", "b"}, Spot: true}); err != nil {
		t.Fatal(err)
	}
	s.SetSpotAvailable(false)
	if err := s.Launch(ctx, LaunchRequest{Pool: "spot", Names: []string{"c"}, Spot: true}); !errors.Is(err, ErrNoCapacity) {
		t.Fatalf("spot launch without capacity: %v", err)
	}
	if err := s.Launch(ctx, LaunchRequest{Pool: "od", Names: []string{"c"}}); err != nil {
		t.Fatal(err)
	}
	_ = s.Terminate(ctx, "a")
	l, _ := s.List(ctx)
	if fmt.Sprint(l[0].Name, l[1].Name, len(l)) != "bc2" {
		t.Fatalf("list %+v", l)
	}
	_ = s.Interrupt("b", 30*time.Second)
	if n := s.Notices(); len(n) != 1 || !n[0].Deadline.Equal(now.Add(30*time.Second)) {
		t.Fatalf("notices %+v", n)
	}
}
