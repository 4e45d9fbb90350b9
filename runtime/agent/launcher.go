package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/atoll-run/atoll/internal/dockerapi"
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
	// Credential, when set, gets the process its own credential (api.WorkerSpec.Token): a
	// token for worker/<job>/<gang>/<rank>, or driver/<job> for a submitted driver.
	Credential func(ctx context.Context, spec api.WorkerSpec) (string, error)
	// Docker is the machine's Docker Engine, for process gang members with an image
	// (default: a client of DockerSocket, or of the usual socket); Owner labels their
	// containers (the agent's directory), so that a later run removes what this one left.
	Docker       *dockerapi.Client
	DockerSocket string
	Owner        string
	dockerOnce   sync.Once
}

// Launch implements Launcher.
func (l *ExecLauncher) Launch(ctx context.Context, spec api.WorkerSpec, job api.Job) (Handle, error) {
	if spec.Process != nil {
		return l.launchProcess(spec, job)
	}
	bin, err := l.Binary(ctx, job)
	if err != nil {
		return nil, err
	}
	if l.Credential != nil {
		if spec.Token, err = l.Credential(ctx, spec); err != nil {
			return nil, fmt.Errorf("agent: a credential for %s: %w", spec.Key(), err)
		}
	}
	name := fmt.Sprintf("%s.%s.%d.g%d", spec.Job, spec.Gang, spec.Rank, spec.Generation)
	specPath, err := writeWorkerSpec(l.RunDir, name, spec)
	if err != nil {
		return nil, err
	}
	files := []string{specPath} // what holds the credential: removed when the process ends, or now
	started := false
	defer func() {
		if !started {
			removeFiles(files)
		}
	}()
	logf, err := openWorkerLog(l.LogDir, spec)
	if err != nil {
		return nil, err
	}
	defer func() {
		if !started { // the log is the started worker's to close; on any error, ours
			_ = logf.Close()
		}
	}()
	cmd := exec.Command(bin, job.Args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = workDir(job.Dir)
	env := append(inheritedEnv(os.Environ()), job.Env...)
	if spec.Driver {
		denv, dfiles, err := writeDriverFiles(l.RunDir, name, spec)
		files = append(files, dfiles...)
		if err != nil {
			return nil, err
		}
		env = append(env, denv...)
	} else {
		env = append(env, api.WorkerEnv+"="+specPath)
	}
	cmd.Env = append(env, gpuEnv(spec)...)
	// The worker dies with its agent, and its whole process group can be signalled.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("agent: start worker %s (%s): %w", spec.Key(), bin, err)
	}
	started = true
	h := &procHandle{cmd: cmd, done: make(chan struct{}), files: files, log: logf}
	go h.wait()
	return h, nil
}

// writeWorkerSpec writes a worker's spec file, name.json in runDir (made 0700): mode 0600,
// for it holds the worker's credential (api.ReadWorkerSpec refuses any other). It returns
// the file's path.
func writeWorkerSpec(runDir, name string, spec api.WorkerSpec) (string, error) {
	if err := os.MkdirAll(runDir, 0o700); err != nil {
		return "", err
	}
	specPath := filepath.Join(runDir, name+".json")
	b, err := json.Marshal(spec)
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(specPath, b, 0o600); err != nil {
		return "", fmt.Errorf("agent: worker spec %s: %w", specPath, err)
	}
	return specPath, nil
}

// openWorkerLog opens (appending; 0600 in a 0700 directory per job) the file a worker's
// stdout and stderr go to: LogPath's layout.
func openWorkerLog(logDir string, spec api.WorkerSpec) (*os.File, error) {
	dir := filepath.Join(logDir, spec.Job)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	logPath := filepath.Join(dir, fmt.Sprintf("%s.%d.g%d.log", spec.Gang, spec.Rank, spec.Generation))
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("agent: worker log %s: %w", logPath, err)
	}
	return logf, nil
}

// workDir is the job's directory when it exists on this machine, else "" (the agent's).
func workDir(dir string) string {
	if dir != "" {
		if st, err := os.Stat(dir); err != nil || !st.IsDir() {
			return "" // the driver's directory does not exist on this machine
		}
	}
	return dir
}

// inheritedEnv is the agent's own environment minus Atoll's and CUDA's variables.
func inheritedEnv(environ []string) []string {
	env := []string{}
	for _, kv := range environ {
		if !strings.HasPrefix(kv, "ATOLL_") && !strings.HasPrefix(kv, "CUDA_VISIBLE_DEVICES=") {
			env = append(env, kv)
		}
	}
	return env
}

// writeDriverFiles writes what a submitted driver connects with, a token file (0600, its
// own credential) and the cluster CA's certificate when there is one, beside its spec in
// runDir, and returns the environment that names them and the heads, and the files (to
// remove when the driver ends).
func writeDriverFiles(runDir, name string, spec api.WorkerSpec) (env, files []string, err error) {
	tokenPath := filepath.Join(runDir, name+".token")
	files = append(files, tokenPath)
	if err := os.WriteFile(tokenPath, []byte(spec.Token+"\n"), 0o600); err != nil {
		return nil, files, fmt.Errorf("agent: driver token file: %w", err)
	}
	env = []string{"ATOLL_ADDRESS=" + strings.Join(spec.Heads, ","), "ATOLL_TOKEN_FILE=" + tokenPath}
	if spec.CACert != "" { // and the cluster CA's certificate, to get its own from the heads
		caPath := filepath.Join(runDir, name+".ca.crt")
		files = append(files, caPath)
		if err := os.WriteFile(caPath, []byte(spec.CACert), 0o644); err != nil {
			return nil, files, fmt.Errorf("agent: driver CA file: %w", err)
		}
		env = append(env, api.CACertEnv+"="+caPath)
	}
	return env, files, nil
}

// removeFiles removes the regular files of a list (what is not one, the launcher did not
// write).
func removeFiles(files []string) {
	for _, f := range files {
		if st, err := os.Lstat(f); err == nil && st.Mode().IsRegular() {
			_ = os.Remove(f)
		}
	}
}

// removeRunFiles removes the spec and credential files in runDir (a worker's spec, a
// submitted driver's token and CA certificate): those an earlier run of the agent left,
// whose processes died with it. It returns how many it removed.
func removeRunFiles(runDir string) int {
	n := 0
	for _, pat := range []string{"*.json", "*.token", "*.ca.crt"} {
		matches, _ := filepath.Glob(filepath.Join(runDir, pat))
		for _, m := range matches {
			if os.Remove(m) == nil {
				n++
			}
		}
	}
	return n
}

// gpuEnv gives a worker its GPUs: CUDA_VISIBLE_DEVICES lists its cards' UUIDs (empty
// without cards, and on simulated GPUs, whose UUIDs go in api.SimulatedGPUsEnv).
func gpuEnv(spec api.WorkerSpec) []string {
	switch {
	case spec.Simulated:
		return []string{"CUDA_VISIBLE_DEVICES=", api.SimulatedGPUsEnv + "=" + strings.Join(spec.Member.UUIDs, ",")}
	case len(spec.Member.UUIDs) > 0:
		return []string{"CUDA_VISIBLE_DEVICES=" + strings.Join(spec.Member.UUIDs, ",")}
	}
	return []string{"CUDA_VISIBLE_DEVICES="}
}

// launchProcess starts a process gang's member: its command, with no credential and no
// spec file (it has no SDK), in its own process group, with torchrun's environment
// (processEnv) and its notice file's path.
func (l *ExecLauncher) launchProcess(spec api.WorkerSpec, job api.Job) (Handle, error) {
	name := fmt.Sprintf("%s.%s.%d.g%d", spec.Job, spec.Gang, spec.Rank, spec.Generation)
	if err := os.MkdirAll(l.RunDir, 0o700); err != nil {
		return nil, err
	}
	noticePath := filepath.Join(l.RunDir, name+".notice.json")
	_ = os.Remove(noticePath) // an earlier run's: a notice is of one generation
	penv, err := processEnv(spec, noticePath)
	if err != nil {
		return nil, permanentErr{err}
	}
	logf, err := openWorkerLog(l.LogDir, spec)
	if err != nil {
		return nil, err
	}
	if spec.Process.Image != "" { // the image's environment, not this machine's
		h, err := l.launchContainer(spec, append(append(slices.Clone(job.Env), spec.Process.Env...), penv...), noticePath, logf)
		if err != nil {
			_ = logf.Close()
		}
		return h, err
	}
	cmd := exec.Command(spec.Process.Command[0], spec.Process.Command[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = workDir(job.Dir)
	env := append(inheritedEnv(os.Environ()), job.Env...)
	env = append(env, spec.Process.Env...)
	cmd.Env = append(env, penv...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		err = fmt.Errorf("agent: start process gang member %s (%q): %w", spec.Key(), spec.Process.Command[0], err)
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) || errors.Is(err, os.ErrPermission) {
			return nil, permanentErr{err} // it is not there on this machine: a restart cannot help
		}
		return nil, err
	}
	h := &procHandle{cmd: cmd, done: make(chan struct{}), files: []string{noticePath}, log: logf, notice: noticePath}
	go h.wait()
	return h, nil
}

// processEnv is the environment the agent sets for a process gang's member: torchrun's
// (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT), its GPUs, and Atoll's own (api.JobEnv...). RANK is the
// member's position in the gang's world; LOCAL_RANK its position among the world's
// members on its machine; GROUP_RANK its machine's position among the world's machines
// (in the order of their first rank).
func processEnv(spec api.WorkerSpec, noticePath string) ([]string, error) {
	world := spec.World
	if len(world) == 0 {
		for i, m := range spec.Placement.Members {
			if !m.Removed {
				world = append(world, i)
			}
		}
	}
	rank, localRank, localSize, group := -1, 0, 0, -1
	var machines []string
	for r, i := range world {
		if i < 0 || i >= len(spec.Placement.Members) {
			return nil, fmt.Errorf("agent: process gang %s/%s: world member %d is not in its placement", spec.Job, spec.Gang, i)
		}
		m := spec.Placement.Members[i].Machine
		if !slices.Contains(machines, m) {
			machines = append(machines, m)
		}
		if m == spec.Machine {
			if i == spec.Rank {
				rank, localRank, group = r, localSize, slices.Index(machines, m)
			}
			localSize++
		}
	}
	if rank < 0 {
		return nil, fmt.Errorf("agent: process gang %s/%s: member %d is not in its world %v", spec.Job, spec.Gang, spec.Rank, world)
	}
	host, port, err := net.SplitHostPort(spec.Master)
	if err != nil {
		return nil, fmt.Errorf("agent: process gang %s/%s: rendezvous address %q: %w", spec.Job, spec.Gang, spec.Master, err)
	}
	idx := make([]string, len(spec.Member.GPUs))
	for i, g := range spec.Member.GPUs {
		idx[i] = strconv.Itoa(g)
	}
	env := []string{
		"RANK=" + strconv.Itoa(rank), "LOCAL_RANK=" + strconv.Itoa(localRank), "WORLD_SIZE=" + strconv.Itoa(len(world)),
		"LOCAL_WORLD_SIZE=" + strconv.Itoa(localSize), "GROUP_RANK=" + strconv.Itoa(group), "GROUP_WORLD_SIZE=" + strconv.Itoa(len(machines)),
		"MASTER_ADDR=" + host, "MASTER_PORT=" + port,
		api.JobEnv + "=" + spec.Job, api.GangEnv + "=" + spec.Gang, api.RankEnv + "=" + strconv.Itoa(rank),
		api.MemberEnv + "=" + strconv.Itoa(spec.Rank), api.GenerationEnv + "=" + strconv.Itoa(spec.Generation),
		api.MachineEnv + "=" + spec.Machine, api.NoticeFileEnv + "=" + noticePath,
		api.YieldCodeEnv + "=" + strconv.Itoa(spec.Process.YieldExitCode), api.GPUIndexEnv + "=" + strings.Join(idx, ","),
		// Indices and UUIDs alike are in the PCI order NVML uses, not CUDA's default order.
		"CUDA_DEVICE_ORDER=PCI_BUS_ID",
	}
	switch {
	case spec.Simulated: // no device to see: the indices say which cards it holds
		env = append(env, "CUDA_VISIBLE_DEVICES="+strings.Join(idx, ","), api.SimulatedGPUsEnv+"="+strings.Join(spec.Member.UUIDs, ","))
	case len(spec.Member.UUIDs) > 0: // UUIDs (MIG slices' too) name the cards whatever the order
		env = append(env, "CUDA_VISIBLE_DEVICES="+strings.Join(spec.Member.UUIDs, ","))
	default:
		env = append(env, "CUDA_VISIBLE_DEVICES="+strings.Join(idx, ","))
	}
	return env, nil
}

// Signal sends sig to the worker's process group: how a process gang's member gets a
// notice (after its notice file is written).
func (h *procHandle) Signal(sig syscall.Signal) error {
	return syscall.Kill(-h.cmd.Process.Pid, sig)
}

// NoticeFile is where a process gang's member finds its notices ("" for other workers).
func (h *procHandle) NoticeFile() string { return h.notice }

type procHandle struct {
	notice string // a process gang member's notice file

	cmd   *exec.Cmd
	done  chan struct{}
	files []string // its spec and credential files
	log   *os.File

	mu  sync.Mutex
	err error
}

// ErrExitedZero is the exit of a process that ended with status 0 (a worker that returns
// from its program, or a submitted driver that finished).
var ErrExitedZero = errors.New("exited with status 0")

func (h *procHandle) wait() {
	err := exitError(h.cmd.Wait())
	_ = h.log.Close()
	removeFiles(h.files)
	h.mu.Lock()
	h.err = err
	h.mu.Unlock()
	close(h.done)
}

// exitError says why a worker process ended, from its Wait's error: ErrExitedZero, the
// signal that killed it, or its exit status (permanent for api.ExitPermanent).
func exitError(err error) error {
	if err == nil {
		return ErrExitedZero
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return err
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	switch {
	case !ok:
		return err
	case ws.Signaled():
		return fmt.Errorf("killed by signal %v", ws.Signal())
	case ws.ExitStatus() == api.ExitPermanent:
		return permanentErr{fmt.Errorf("exited with status %d (permanent: a restart cannot help; see its log)", ws.ExitStatus())}
	}
	return ExitStatusError{Status: ws.ExitStatus()}
}

// ExitStatusError is the exit of a worker process with a status other than 0 (and
// api.ExitPermanent).
type ExitStatusError struct{ Status int }

func (e ExitStatusError) Error() string { return fmt.Sprintf("exited with status %d", e.Status) }

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
