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

// WorkerEnv is the environment variable that makes a program a worker: it names the
// worker's spec file (JSON, mode 0600, holding the cluster token among the rest).
const WorkerEnv = "ATOLL_WORKER"

// ExitPermanent is the exit status of a worker process that a restart cannot help (an
// unknown kind, undecodable arguments, an unreadable spec): the agent reports its exit as
// permanent, and the gang fails at once.
const ExitPermanent = 78

// SimulatedGPUsEnv lists a worker's simulated GPU UUIDs on a machine whose GPUs are
// declared, not real (CUDA_VISIBLE_DEVICES is then empty: there is no device to see).
const SimulatedGPUsEnv = "ATOLL_SIMULATED_GPUS"

// CACertEnv names the cluster CA certificate's file for a process that connects to a
// cluster (`atoll submit`'s drivers, commands): the address option ca=PATH does the same.
const CACertEnv = "ATOLL_CA_CERT"

// WorkerSpec is everything a worker needs to start: who it is in which gang, its GPUs, and
// how to reach the cluster.
type WorkerSpec struct {
	Job        string `json:"job"`
	Gang       string `json:"gang"`
	Rank       int    `json:"rank"`
	Generation int    `json:"generation"`
	// GangUID tells this gang from an earlier one of the same names.
	GangUID string `json:"gang_uid"`
	// Kind and Args make the worker's actor.
	Kind string       `json:"kind"`
	Args *api.Payload `json:"args,omitempty"`
	// Machine is the machine it runs on; Member its GPUs there; Placement the whole gang's.
	Machine   string        `json:"machine"`
	Simulated bool          `json:"simulated"`
	Member    api.Member    `json:"member"`
	Placement api.Placement `json:"placement"`
	// World is the gang's members as its program works with them when the worker starts
	// (member indices in rank order), at world Epoch; a member added by a grow is not in it
	// yet: its driver brings it in (Gang.Yield).
	World []int `json:"world,omitempty"`
	Epoch int   `json:"epoch,omitempty"`
	// Heads are the heads' API URLs, Token the cluster secret.
	Heads []string `json:"heads"`
	Token string   `json:"token"`
	// CACert is the cluster CA's certificate (PEM) when the cluster runs mutual TLS: the
	// worker gets a certificate of its own from the heads with it and the token.
	CACert string `json:"ca_cert,omitempty"`
	// Agent is the machine agent's API URL; Transfer its object store's transfer address.
	Agent    string `json:"agent"`
	Transfer string `json:"transfer"`
	// Holder names the worker to its agent's object store (its references and mappings).
	Holder string `json:"holder"`
	// Driver says this is a submitted driver (`atoll submit`), not a worker: it runs the
	// job's executable with the cluster's address.
	Driver bool `json:"driver,omitempty"`
}

// Key names the worker: job/gang/rank.g<generation>.
func (s *WorkerSpec) Key() string {
	return fmt.Sprintf("%s/%s/%d.g%d", s.Job, s.Gang, s.Rank, s.Generation)
}

// ReadWorkerSpec reads a worker's spec file, refusing one that others could read.
func ReadWorkerSpec(path string) (WorkerSpec, error) {
	st, err := os.Stat(path)
	if err != nil {
		return WorkerSpec{}, fmt.Errorf("atoll worker: spec %s: %w", path, err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return WorkerSpec{}, fmt.Errorf("atoll worker: spec %s has mode %v: it holds the cluster token and must be readable by its owner only (0600)", path, st.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return WorkerSpec{}, fmt.Errorf("atoll worker: spec %s: %w", path, err)
	}
	var s WorkerSpec
	if err := json.Unmarshal(b, &s); err != nil {
		return WorkerSpec{}, fmt.Errorf("atoll worker: spec %s: %w", path, err)
	}
	return s, nil
}

// Launcher starts workers. Implementations: ExecLauncher (a process per worker, the job's
// own executable) and the SDK's in-process launcher of the embedded default.
type Launcher interface {
	// Launch starts a worker. The job says how (its binary, arguments, environment).
	Launch(ctx context.Context, spec WorkerSpec, job api.Job) (Handle, error)
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
// agent into BinaryDir by content hash, with the driver's arguments and a WorkerEnv that
// names its spec file.
type ExecLauncher struct {
	// RunDir holds the workers' spec files; LogDir their stdout and stderr.
	RunDir, LogDir string
	// Binary returns the path of the job's executable (fetching it if needed).
	Binary func(ctx context.Context, job api.Job) (string, error)
}

// Launch implements Launcher.
func (l *ExecLauncher) Launch(ctx context.Context, spec WorkerSpec, job api.Job) (Handle, error) {
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
			env = append(env, CACertEnv+"="+caPath)
		}
	} else {
		env = append(env, WorkerEnv+"="+specPath)
	}
	if spec.Simulated {
		env = append(env, "CUDA_VISIBLE_DEVICES=", SimulatedGPUsEnv+"="+strings.Join(spec.Member.UUIDs, ","))
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
		} else if ok && ws.ExitStatus() == ExitPermanent {
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
