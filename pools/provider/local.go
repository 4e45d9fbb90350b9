package provider

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// LocalConfig configures the local provider.
type LocalConfig struct {
	// Exe is the atoll executable (default: this process's own).
	Exe string
	// Join is the cluster's head API URLs, comma-separated (the agents' --join).
	Join string
	// Dir holds each machine's agent directory (Dir/agents/NAME) and log (Dir/logs/NAME.log).
	Dir string
	// Env is added to the agents' environment (ATOLL_TOKEN_FILE=...; never a secret itself).
	Env []string
	// Credential, when set, makes each machine's agent credential (a scoped token of
	// agent/<name>): it is written to Dir/agents/NAME/credential (mode 0600) and given as
	// the agent's ATOLL_TOKEN_FILE, so that the agent holds no cluster secret.
	Credential func(machine string) (string, error)
	// Grace is how long a terminated agent has after SIGTERM before SIGKILL. Default 10 s.
	Grace time.Duration
	// Now is the clock for notices (default time.Now).
	Now func() time.Time
}

// Local runs each machine as an `atoll agent --machine TYPE` process on this machine
// (simulated GPUs), in its own session so that it outlives the head that started it, as
// `atoll up` starts its agents. Each agent's pid is in Dir/pids/NAME.pid while it runs.
type Local struct {
	cfg LocalConfig
	notices

	mu    sync.Mutex
	procs map[string]*localProc
}

type localProc struct {
	pool    string
	pid     int
	started time.Time
	done    chan struct{}
}

var _ Provider = (*Local)(nil)
var _ Interrupter = (*Local)(nil)

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// NewLocal returns a local provider.
func NewLocal(cfg LocalConfig) (*Local, error) {
	if cfg.Exe == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, err
		}
		cfg.Exe = exe
	}
	if cfg.Join == "" || cfg.Dir == "" {
		return nil, fmt.Errorf("%w: the local provider needs the cluster's address and a directory", ErrInvalid)
	}
	if cfg.Grace == 0 {
		cfg.Grace = 10 * time.Second
	}
	return &Local{cfg: cfg, notices: notices{now: cfg.Now}, procs: map[string]*localProc{}}, nil
}

// Launch starts one agent process per name.
func (l *Local) Launch(ctx context.Context, req LaunchRequest) error {
	for _, name := range req.Names {
		if !nameRE.MatchString(name) {
			return fmt.Errorf("%w: machine name %q", ErrInvalid, name)
		}
	}
	for _, d := range []string{"agents", "logs", "pids"} {
		if err := os.MkdirAll(filepath.Join(l.cfg.Dir, d), 0o700); err != nil {
			return err
		}
	}
	for _, name := range req.Names {
		if err := ctx.Err(); err != nil {
			return err
		}
		l.mu.Lock()
		p := l.procs[name]
		l.mu.Unlock()
		if p != nil && alive(p) {
			continue
		}
		logf, err := os.OpenFile(filepath.Join(l.cfg.Dir, "logs", name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			return err
		}
		cmd := exec.Command(l.cfg.Exe, "agent", "--join", l.cfg.Join, "--name", name, "--machine", req.Machine,
			"--rack", strconv.Itoa(req.Rack), "--dir", filepath.Join(l.cfg.Dir, "agents", name))
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.Env = append(os.Environ(), l.cfg.Env...)
		if l.cfg.Credential != nil {
			f, err := l.credential(name)
			if err != nil {
				return fmt.Errorf("provider: agent %s: its credential: %w", name, err)
			}
			cmd.Env = append(cmd.Env, "ATOLL_TOKEN_FILE="+f) // the last entry wins
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		err = cmd.Start()
		logf.Close()
		if err != nil {
			return fmt.Errorf("provider: start agent %s: %w", name, err)
		}
		p = &localProc{pool: req.Pool, pid: cmd.Process.Pid, started: time.Now(), done: make(chan struct{})}
		go func(done chan struct{}) { _ = cmd.Wait(); close(done) }(p.done)
		l.mu.Lock()
		l.procs[name] = p
		l.mu.Unlock()
		// The pid file lets `atoll down` stop agents whose head is gone.
		_ = os.WriteFile(filepath.Join(l.cfg.Dir, "pids", name+".pid"), []byte(strconv.Itoa(p.pid)), 0o600)
	}
	return nil
}

func alive(p *localProc) bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Terminate stops a machine's agent: SIGTERM, then SIGKILL after the grace.
func (l *Local) Terminate(ctx context.Context, name string) error {
	l.mu.Lock()
	p := l.procs[name]
	delete(l.procs, name)
	l.mu.Unlock()
	_ = os.Remove(filepath.Join(l.cfg.Dir, "pids", name+".pid"))
	if p == nil || !alive(p) {
		return nil
	}
	_ = syscall.Kill(p.pid, syscall.SIGTERM)
	t := time.NewTimer(l.cfg.Grace)
	defer t.Stop()
	select {
	case <-p.done:
		return nil
	case <-t.C:
	case <-ctx.Done():
	}
	_ = syscall.Kill(p.pid, syscall.SIGKILL)
	select {
	case <-p.done:
		return nil
	case <-time.After(5 * time.Second):
		return fmt.Errorf("provider: agent %s (pid %d) did not exit after SIGKILL", name, p.pid)
	}
}

// List returns the agents this provider started that still run.
func (l *Local) List(ctx context.Context) ([]Instance, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []Instance
	for name, p := range l.procs {
		out = append(out, Instance{Name: name, Pool: p.pool, Running: alive(p), Started: p.started, Detail: "pid " + strconv.Itoa(p.pid)})
	}
	return out, nil
}

// PID returns a machine's agent process id (0 when it does not run).
func (l *Local) PID(name string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if p := l.procs[name]; p != nil && alive(p) {
		return p.pid
	}
	return 0
}

// Interrupt injects an interruption notice for a machine.
func (l *Local) Interrupt(name string, after time.Duration) error {
	l.mu.Lock()
	_, ok := l.procs[name]
	l.mu.Unlock()
	return l.add(name, after, ok)
}

// Notices returns the injected notices not yet returned.
func (l *Local) Notices() []Notice { return l.take() }

// credential writes a machine's agent credential into its directory.
func (l *Local) credential(name string) (string, error) {
	tok, err := l.cfg.Credential(name)
	if err != nil {
		return "", err
	}
	dir := filepath.Join(l.cfg.Dir, "agents", name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	path := filepath.Join(dir, "credential")
	if err := os.WriteFile(path+".new", []byte(tok+"\n"), 0o600); err != nil {
		return "", err
	}
	return path, os.Rename(path+".new", path)
}
