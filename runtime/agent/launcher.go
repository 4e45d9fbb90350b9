package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/atoll-run/atoll/runtime/api"
)

// Launcher starts workers. Implementations: ExecLauncher (a process per worker, the job's
// own executable) and the SDK's in-process launcher of the embedded default.
type Launcher interface {
	// Launch starts a worker. The job says how (its binary, arguments, environment).
	Launch(ctx context.Context, spec api.WorkerSpec, job api.Job) (Handle, error)
}

// Handle is a started worker.
type Handle interface {
	// PID is its process id (this process's for an in-process worker).
	PID() int
	// Done is closed when the worker has stopped; Err then says why.
	Done() <-chan struct{}
	Err() error
	// Stop asks the worker to stop, waits up to grace, then kills it; it returns once the
	// worker has stopped.
	Stop(ctx context.Context, grace time.Duration) error
	// Kill stops the worker at once, as a crash would (SIGKILL for a process).
	Kill() error
}

// ExecLauncher starts each worker as a process of the job's executable, fetched by the
// agent into BinaryDir by content hash, with the driver's arguments and a api.WorkerEnv that
// names its spec file.
type ExecLauncher struct {
	// RunDir holds the workers' spec files; LogDir their stdout and stderr.
	RunDir, LogDir string
	// Binary returns the path of the job's executable (fetching it if needed).
	Binary func(ctx context.Context, job api.Job) (string, error)
}

// Launch implements Launcher.
func (l *ExecLauncher) Launch(ctx context.Context, spec api.WorkerSpec, job api.Job) (Handle, error) {
	bin, err := l.Binary(ctx, job)
	if err != nil {
		return nil, err
	}
	name := fmt.Sprintf("%s.%s.%d.g%d", spec.Job, spec.Gang, spec.Rank, spec.Generation)
	if err := os.MkdirAll(l.RunDir, 0o700); err != nil {
		return nil, err
	}
	specPath := filepath.Join(l.RunDir, name+".json")
	b, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(specPath, b, 0o600); err != nil {
		return nil, fmt.Errorf("agent: worker spec %s: %w", specPath, err)
	}
	logDir := filepath.Join(l.LogDir, spec.Job)
	if err := os.MkdirAll(logDir, 0o700); err != nil {
		return nil, err
	}
	logPath := filepath.Join(logDir, fmt.Sprintf("%s.%d.g%d.log", spec.Gang, spec.Rank, spec.Generation))
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("agent: worker log %s: %w", logPath, err)
	}
	cmd := exec.Command(bin, job.Args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = job.Dir
	if cmd.Dir != "" {
		if st, err := os.Stat(cmd.Dir); err != nil || !st.IsDir() {
			cmd.Dir = "" // the driver's directory does not exist on this machine
		}
	}
	env := []string{}
	for _, kv := range os.Environ() { // the agent's own environment, minus Atoll's and CUDA's
		if !strings.HasPrefix(kv, "ATOLL_") && !strings.HasPrefix(kv, "CUDA_VISIBLE_DEVICES=") {
			env = append(env, kv)
		}
	}
	env = append(env, job.Env...)
	if spec.Driver {
		// A driver connects like any other: the heads' address and a token file (0600).
		tokenPath := filepath.Join(l.RunDir, name+".token")
		if err := os.WriteFile(tokenPath, []byte(spec.Token+"\n"), 0o600); err != nil {
			return nil, fmt.Errorf("agent: driver token file: %w", err)
		}
		env = append(env, "ATOLL_ADDRESS="+strings.Join(spec.Heads, ","), "ATOLL_TOKEN_FILE="+tokenPath)
		if spec.CACert != "" { // and the cluster CA's certificate, to get its own from the heads
			caPath := filepath.Join(l.RunDir, name+".ca.crt")
			if err := os.WriteFile(caPath, []byte(spec.CACert), 0o644); err != nil {
				return nil, fmt.Errorf("agent: driver CA file: %w", err)
			}
			env = append(env, api.CACertEnv+"="+caPath)
		}
	} else {
		env = append(env, api.WorkerEnv+"="+specPath)
	}
	if spec.Simulated {
		env = append(env, "CUDA_VISIBLE_DEVICES=", api.SimulatedGPUsEnv+"="+strings.Join(spec.Member.UUIDs, ","))
	} else if len(spec.Member.UUIDs) > 0 {
		env = append(env, "CUDA_VISIBLE_DEVICES="+strings.Join(spec.Member.UUIDs, ","))
	} else {
		env = append(env, "CUDA_VISIBLE_DEVICES=")
	}
	cmd.Env = env
	// The worker dies with its agent, and its whole process group can be signalled.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("agent: start worker %s (%s): %w", spec.Key(), bin, err)
	}
	h := &procHandle{cmd: cmd, done: make(chan struct{}), spec: specPath, log: logf}
	go h.wait()
	return h, nil
}

type procHandle struct {
	cmd  *exec.Cmd
	done chan struct{}
	spec string
	log  *os.File

	mu  sync.Mutex
	err error
}

// ErrExitedZero is the exit of a process that ended with status 0 (a worker that returns
// from its program, or a submitted driver that finished).
var ErrExitedZero = errors.New("exited with status 0")

func (h *procHandle) wait() {
	err := h.cmd.Wait()
	if err == nil {
		err = ErrExitedZero
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			err = fmt.Errorf("killed by signal %v", ws.Signal())
		} else if ok && ws.ExitStatus() == api.ExitPermanent {
			err = permanentErr{fmt.Errorf("exited with status %d (permanent: a restart cannot help; see its log)", ws.ExitStatus())}
		} else if ok {
			err = fmt.Errorf("exited with status %d", ws.ExitStatus())
		}
	}
	_ = h.log.Close()
	_ = os.Remove(h.spec)
	h.mu.Lock()
	h.err = err
	h.mu.Unlock()
	close(h.done)
}

func (h *procHandle) PID() int              { return h.cmd.Process.Pid }
func (h *procHandle) Done() <-chan struct{} { return h.done }
func (h *procHandle) Err() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}

func (h *procHandle) Stop(ctx context.Context, grace time.Duration) error {
	_ = syscall.Kill(-h.cmd.Process.Pid, syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-h.done:
		return nil
	case <-t.C:
	case <-ctx.Done():
	}
	_ = h.Kill()
	select {
	case <-h.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (h *procHandle) Kill() error {
	return syscall.Kill(-h.cmd.Process.Pid, syscall.SIGKILL)
}
