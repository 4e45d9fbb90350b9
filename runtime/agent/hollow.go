package agent

import (
	"context"
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/atoll-run/atoll/runtime/api"
)

// A hollow agent is the real agent (registration, credential and certificate, load
// reports, the watch of the gangs table, the reconciler, its API and object store, its
// gossip) with a HollowLauncher: its workers are not processes. It is how the scale
// envelope is measured, as Kubernetes' kubemark measures a control plane with hollow
// kubelets: thousands of machines, many agents per process, against real heads over real
// sockets with mutual TLS. A hollow machine's GPUs are declared (Config.Simulated), and
// its load is what its workers hold (Config.Load), not the host's /proc.

// HollowLauncher starts hollow workers: a worker exists as a Handle only. It starts at
// once, the agent reports it ready (ReadyReporter), it ends when stopped or killed (or
// with Exit), and it runs no program, so it answers no actor call: what the control plane
// does for it (placement, readiness, stop, restart) is real, what a worker computes is not.
type HollowLauncher struct {
	// OnLaunch, when set, is called with every worker launched (tests, benchmarks).
	OnLaunch func(spec api.WorkerSpec)
	// Host, when set, hosts the workers it Hosts in this process instead (an SDK
	// WorkerHost on this agent's store): they run the program's actor and answer calls,
	// and the agent reports them ready with the address they Announce. Running and Exit
	// are about the hollow workers only.
	Host WorkerHost

	launched atomic.Int64
	mu       sync.Mutex
	running  map[string]*hollowHandle // by api.WorkerSpec.Key()
}

var (
	_ Launcher      = (*HollowLauncher)(nil)
	_ ReadyReporter = (*HollowLauncher)(nil)
)

// WorkerHost hosts workers in this process: a HollowLauncher's workers that must answer
// calls (the task workers of `atoll bench scale`).
type WorkerHost interface {
	// Hosts reports whether it hosts the worker (its program has the worker's kind).
	Hosts(spec api.WorkerSpec) bool
	// Host starts the worker and returns once it runs; its Handle is an Announcer.
	Host(ctx context.Context, spec api.WorkerSpec) (Handle, error)
}

// Announcer is a started worker that the agent announces ready (a ReadyReporter's) with
// the address and actor that calls reach it at.
type Announcer interface {
	Announce() (address, actorID string)
}

// ReadyReporter is implemented by launchers whose workers do not tell the leader they are
// ready themselves (a worker process's actor system does): the agent reports each one ready
// as soon as it is launched, as it does a submitted driver or a process gang's member.
type ReadyReporter interface {
	AgentReportsReady() bool
}

// AgentReportsReady implements ReadyReporter.
func (*HollowLauncher) AgentReportsReady() bool { return true }

// Launch implements Launcher: the worker is started at once.
func (l *HollowLauncher) Launch(ctx context.Context, spec api.WorkerSpec, _ api.Job) (Handle, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if l.Host != nil && l.Host.Hosts(spec) {
		h, err := l.Host.Host(ctx, spec)
		if err == nil {
			l.launched.Add(1)
			if l.OnLaunch != nil {
				l.OnLaunch(spec)
			}
		}
		return h, err
	}
	key := spec.Key()
	h := &hollowHandle{done: make(chan struct{})}
	h.onEnd = func() { // before Done closes: an ended worker is never counted running
		l.mu.Lock()
		if l.running[key] == h {
			delete(l.running, key)
		}
		l.mu.Unlock()
	}
	l.mu.Lock()
	if l.running == nil {
		l.running = map[string]*hollowHandle{}
	}
	l.running[key] = h
	l.mu.Unlock()
	l.launched.Add(1)
	if l.OnLaunch != nil {
		l.OnLaunch(spec)
	}
	return h, nil
}

// Launched counts the workers launched so far.
func (l *HollowLauncher) Launched() int64 { return l.launched.Load() }

// Running counts the hollow workers that have not ended.
func (l *HollowLauncher) Running() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.running)
}

// Exit ends a running worker (by api.WorkerSpec.Key()) as if its program had exited with
// err (nil: status 0): the agent reports the exit to the leader as any other. It reports
// whether such a worker ran.
func (l *HollowLauncher) Exit(key string, err error) bool {
	l.mu.Lock()
	h := l.running[key]
	l.mu.Unlock()
	if h == nil {
		return false
	}
	if err == nil {
		err = ErrExitedZero
	}
	h.end(err)
	return true
}

// errHollowStopped and errHollowKilled are a hollow worker's ends by Stop and Kill.
var (
	errHollowStopped = errors.New("hollow worker stopped")
	errHollowKilled  = errors.New("hollow worker killed")
)

type hollowHandle struct {
	onEnd func()
	done  chan struct{}
	once  sync.Once
	mu    sync.Mutex
	err   error
}

func (h *hollowHandle) end(err error) {
	h.once.Do(func() {
		h.mu.Lock()
		h.err = err
		h.mu.Unlock()
		h.onEnd()
		close(h.done)
	})
}

// PID is the hollow agents' process (a hollow worker has none of its own).
func (h *hollowHandle) PID() int              { return os.Getpid() }
func (h *hollowHandle) Done() <-chan struct{} { return h.done }
func (h *hollowHandle) Err() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}

// Stop ends the worker at once (it has nothing to wind down).
func (h *hollowHandle) Stop(context.Context, time.Duration) error {
	h.end(errHollowStopped)
	return nil
}

// Kill ends the worker at once, as a crash would.
func (h *hollowHandle) Kill() error {
	h.end(errHollowKilled)
	return nil
}

// HollowLoad is a hollow machine's load: no CPU, memory or network of its own (the host's
// /proc is shared by thousands of them); its GPU figure is the share its workers hold,
// filled in by the agent as for every machine.
func HollowLoad() api.Load { return api.Load{} }
