package actors

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"go.uber.org/zap"
)

// GangSpec describes a gang of workers of one kind, supervised all-for-one.
type GangSpec struct {
	// Name is unique within its job.
	Name string
	// Kind is the registered actor kind of every worker.
	Kind string
	// Size is the number of workers (ranks 0..Size-1).
	Size int
	// MaxRestarts is how many gang restarts are allowed within RestartWindow before the gang
	// is stopped and fails with ErrGangFailed. Zero means the gang is never restarted.
	MaxRestarts int
	// RestartWindow is the window over which restarts are counted. Default 1 minute.
	RestartWindow time.Duration
	// Backoff is the delay before the first restart; it doubles with every restart in the
	// window, up to MaxBackoff. Defaults 50 ms and 5 s.
	Backoff, MaxBackoff time.Duration
	// Data is attached to the gang for its workers (Context.Gang().Data()).
	Data any
	// OnFailure, if set, is called when a worker fails, before the gang restarts. It must not
	// block; the runtime uses it to abort the gang's collectives.
	OnFailure func(Failure)
}

// Failure describes a worker failure, as told to GangSpec.OnFailure.
type Failure struct {
	// Rank is the failed worker's rank.
	Rank int
	// Reason is what it panicked with.
	Reason any
	// Generation is the gang incarnation that ended with the failure (the next is +1).
	Generation int
	// Final says the gang used up its restarts and is stopped.
	Final bool
}

func (s *GangSpec) normalize() error {
	if s.Name == "" {
		return fmt.Errorf("%w: gang has no name", ErrInvalidSpec)
	}
	if s.Size <= 0 {
		return fmt.Errorf("%w: gang %q size %d, want at least 1", ErrInvalidSpec, s.Name, s.Size)
	}
	if s.MaxRestarts < 0 {
		return fmt.Errorf("%w: gang %q MaxRestarts %d is negative", ErrInvalidSpec, s.Name, s.MaxRestarts)
	}
	if s.RestartWindow == 0 {
		s.RestartWindow = time.Minute
	}
	if s.Backoff == 0 {
		s.Backoff = 50 * time.Millisecond
	}
	if s.MaxBackoff == 0 {
		s.MaxBackoff = 5 * time.Second
	}
	if s.RestartWindow < 0 || s.Backoff < 0 || s.MaxBackoff < s.Backoff {
		return fmt.Errorf("%w: gang %q restart window %v, backoff %v..%v", ErrInvalidSpec, s.Name, s.RestartWindow, s.Backoff, s.MaxBackoff)
	}
	return nil
}

// GangState is where a gang is in its life.
type GangState int

// Gang states.
const (
	GangStarting GangState = iota
	GangRunning
	GangRestarting
	GangFailed
	GangStopped
)

func (s GangState) String() string {
	return [...]string{"starting", "running", "restarting", "failed", "stopped"}[s]
}

// Gang is a running gang: its workers, its restart count and its state.
type Gang struct {
	spec GangSpec
	job  *Job
	sys  *System
	log  *zap.Logger

	mu         sync.Mutex
	changed    chan struct{} // closed and replaced on every state change
	state      GangState
	workers    []Ref
	started    []bool
	generation int // bumped on every restart
	restarts   int
	failures   []time.Time
	err        error
	supervisor *actor.PID
	failing    bool // out of restarts: stopping its workers, then GangFailed
	alive      int  // workers whose actor has started and not yet stopped
}

// Spec is the gang's spec (with defaults filled in).
func (g *Gang) Spec() GangSpec { return g.spec }

// Data is GangSpec.Data.
func (g *Gang) Data() any { return g.spec.Data }

// Size is the number of workers.
func (g *Gang) Size() int { return g.spec.Size }

// Worker is the Ref of the worker with the given rank (the zero Ref when out of range).
func (g *Gang) Worker(rank int) Ref {
	g.mu.Lock()
	defer g.mu.Unlock()
	if rank < 0 || rank >= len(g.workers) {
		return Ref{}
	}
	return g.workers[rank]
}

// Workers lists the worker Refs by rank.
func (g *Gang) Workers() []Ref {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]Ref(nil), g.workers...)
}

// Restarts is how many times the gang has been restarted.
func (g *Gang) Restarts() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.restarts
}

// Generation counts incarnations of the gang: 0 at first start, +1 per restart.
func (g *Gang) Generation() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.generation
}

// State is the gang's current state.
func (g *Gang) State() GangState {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.state
}

// Err is non-nil once the gang has failed for good.
func (g *Gang) Err() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}

func (g *Gang) notifyLocked() {
	close(g.changed)
	g.changed = make(chan struct{})
}

// AwaitRunning waits until the gang's generation is at least minGen and all its workers have
// started, and returns that generation. It fails when the gang fails or stops, or ctx ends.
func (g *Gang) AwaitRunning(ctx context.Context, minGen int) (int, error) {
	for {
		g.mu.Lock()
		state, gen, err, ch := g.state, g.generation, g.err, g.changed
		g.mu.Unlock()
		switch {
		case state == GangFailed:
			return gen, err
		case state == GangStopped:
			return gen, fmt.Errorf("actors: gang %q stopped", g.spec.Name)
		case state == GangRunning && gen >= minGen:
			return gen, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return gen, fmt.Errorf("actors: gang %q still %s (generation %d): %w", g.spec.Name, state, gen, ctx.Err())
		}
	}
}

// InjectFailure makes the worker of the given rank crash, as if its process had died: the gang
// restarts all-for-one. It is for tests and demonstrations.
func (g *Gang) InjectFailure(rank int, reason string) error {
	w := g.Worker(rank)
	if w.IsZero() {
		return fmt.Errorf("%w: gang %q has no rank %d", ErrUnknownActor, g.spec.Name, rank)
	}
	return Send(g.sys, w, &crash{reason: reason})
}

// Stop stops the gang's workers and its supervisor.
func (g *Gang) Stop(ctx context.Context) error {
	g.mu.Lock()
	sup := g.supervisor
	g.mu.Unlock()
	if sup == nil {
		return nil
	}
	err := waitFuture(ctx, g.sys.sys.Root.StopFuture(sup))
	g.mu.Lock()
	if g.state != GangFailed {
		g.state = GangStopped
	}
	g.notifyLocked()
	g.mu.Unlock()
	return err
}

// workerAlive counts worker actors that are up (+1 at start, -1 at stop, failed ones
// included: a failed actor is not stopped until the supervisor says so).
func (g *Gang) workerAlive(delta int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.alive += delta
	g.checkFailedLocked()
}

func (g *Gang) checkFailedLocked() {
	if g.failing && g.alive <= 0 && g.state != GangFailed {
		g.state = GangFailed
		g.notifyLocked()
	}
}

func (g *Gang) workerStarted(rank int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if rank < 0 || rank >= len(g.started) || g.started[rank] {
		return
	}
	g.started[rank] = true
	g.checkRunningLocked()
}

// checkRunningLocked moves a starting or restarting gang to running once every worker has
// been spawned and has started.
func (g *Gang) checkRunningLocked() {
	if len(g.workers) != g.spec.Size {
		return
	}
	for _, ok := range g.started {
		if !ok {
			return
		}
	}
	if g.state == GangStarting || g.state == GangRestarting {
		g.state = GangRunning
		g.log.Info("gang running", zap.Int("generation", g.generation))
		g.notifyLocked()
	}
}

// gangStrategy restarts all of a gang's workers together when one fails, after a backoff,
// and gives up after MaxRestarts within RestartWindow.
type gangStrategy struct{ g *Gang }

func (st gangStrategy) HandleFailure(_ *actor.ActorSystem, sup actor.Supervisor, child *actor.PID, _ *actor.RestartStatistics, reason, _ any) {
	g := st.g
	rank := -1
	g.mu.Lock()
	for i, w := range g.workers {
		if w.pid != nil && w.pid.Equal(child) {
			rank = i
		}
	}
	if g.state == GangRestarting || g.state == GangFailed || g.state == GangStopped || g.failing {
		// One restart (or the stop) already covers every worker.
		g.mu.Unlock()
		return
	}
	now := time.Now()
	kept := g.failures[:0]
	for _, t := range g.failures {
		if now.Sub(t) < g.spec.RestartWindow {
			kept = append(kept, t)
		}
	}
	g.failures = append(kept, now)
	n := len(g.failures)
	children := sup.Children()
	if n > g.spec.MaxRestarts {
		// The gang fails once every worker has stopped, so that a caller who sees
		// GangFailed gets ErrActorDead from the workers rather than a lost message.
		g.failing = true
		g.err = fmt.Errorf("%w: %q: worker %d failed (%v) after %d restarts within %v", ErrGangFailed, g.spec.Name, rank, reason, g.spec.MaxRestarts, g.spec.RestartWindow)
		g.log.Error("gang failed", zap.Int("rank", rank), zap.Any("reason", reason))
		gen := g.generation
		g.checkFailedLocked()
		g.mu.Unlock()
		if g.spec.OnFailure != nil {
			g.spec.OnFailure(Failure{Rank: rank, Reason: reason, Generation: gen, Final: true})
		}
		sup.StopChildren(children...)
		return
	}
	backoff := g.spec.Backoff << (n - 1)
	if backoff > g.spec.MaxBackoff || backoff <= 0 {
		backoff = g.spec.MaxBackoff
	}
	g.state = GangRestarting
	ended := g.generation
	g.generation++
	g.restarts++
	for i := range g.started {
		g.started[i] = false
	}
	g.log.Warn("worker failed; restarting the gang", zap.Int("rank", rank), zap.Any("reason", reason),
		zap.Int("restart", g.restarts), zap.Duration("backoff", backoff))
	g.notifyLocked()
	g.mu.Unlock()
	if g.spec.OnFailure != nil {
		g.spec.OnFailure(Failure{Rank: rank, Reason: reason, Generation: ended})
	}
	time.AfterFunc(backoff, func() { sup.RestartChildren(children...) })
}

// gangSupervisor is the actor above a gang's workers.
type gangSupervisor struct {
	g    *Gang
	prod Producer
}

func (s *gangSupervisor) Receive(pc actor.Context) {
	if _, ok := pc.Message().(*actor.Started); !ok {
		return
	}
	g := s.g
	g.mu.Lock()
	g.supervisor = pc.Self()
	g.mu.Unlock()
	refs := make([]Ref, g.spec.Size)
	for rank := range refs {
		rank := rank
		props := actor.PropsFromProducer(func() actor.Actor { return newCell(g.sys, s.prod, g, rank) })
		pid, err := pc.SpawnNamed(props, fmt.Sprintf("w%d", rank))
		if err != nil {
			g.mu.Lock()
			g.state, g.err = GangFailed, fmt.Errorf("actors: gang %q: spawn worker %d: %w", g.spec.Name, rank, err)
			g.notifyLocked()
			g.mu.Unlock()
			return
		}
		refs[rank] = Ref{pid: pid, kind: g.spec.Kind}
	}
	g.mu.Lock()
	g.workers = refs
	g.checkRunningLocked()
	g.mu.Unlock()
}

// Job is the root of one job's actor tree.
type Job struct {
	id   string
	sys  *System
	root *actor.PID

	mu    sync.Mutex
	gangs map[string]*Gang
}

// jobRoot is the job's root actor; it spawns gang supervisors as its children.
type jobRoot struct{}

type spawnGang struct {
	props *actor.Props
	name  string
}

func (jobRoot) Receive(pc actor.Context) {
	if m, ok := pc.Message().(*request); ok {
		if sg, ok := m.msg.(*spawnGang); ok {
			pid, err := pc.SpawnNamed(sg.props, sg.name)
			pc.Send(pc.Sender(), &response{val: pid, err: err})
		}
	}
}

// NewJob creates a job's root actor.
func (s *System) NewJob(id string) (*Job, error) {
	if id == "" {
		return nil, fmt.Errorf("%w: empty job id", ErrInvalidSpec)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down {
		return nil, ErrShutdown
	}
	if _, ok := s.jobs[id]; ok {
		return nil, fmt.Errorf("%w: job %q already exists", ErrInvalidSpec, id)
	}
	root, err := s.sys.Root.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return jobRoot{} }), "job-"+id)
	if err != nil {
		return nil, fmt.Errorf("actors: job %q: %w", id, err)
	}
	j := &Job{id: id, sys: s, root: root, gangs: map[string]*Gang{}}
	s.jobs[id] = j
	return j, nil
}

// ID is the job's id.
func (j *Job) ID() string { return j.id }

// SpawnGang starts a gang under the job and waits until all its workers have started.
func (j *Job) SpawnGang(ctx context.Context, spec GangSpec) (*Gang, error) {
	if err := spec.normalize(); err != nil {
		return nil, err
	}
	prod, err := j.sys.producer(spec.Kind)
	if err != nil {
		return nil, fmt.Errorf("actors: gang %q: %w", spec.Name, err)
	}
	j.mu.Lock()
	if _, ok := j.gangs[spec.Name]; ok {
		j.mu.Unlock()
		return nil, fmt.Errorf("%w: job %q already has a gang %q", ErrInvalidSpec, j.id, spec.Name)
	}
	g := &Gang{spec: spec, job: j, sys: j.sys, changed: make(chan struct{}),
		started: make([]bool, spec.Size),
		log:     j.sys.log.With(zap.String("job", j.id), zap.String("gang", spec.Name))}
	j.gangs[spec.Name] = g
	j.mu.Unlock()

	props := actor.PropsFromProducer(func() actor.Actor { return &gangSupervisor{g: g, prod: prod} },
		actor.WithSupervisor(gangStrategy{g: g}))
	if _, err := Call[*actor.PID](ctx, j.sys, Ref{pid: j.root}, &spawnGang{props: props, name: "gang-" + spec.Name}); err != nil {
		j.forget(spec.Name)
		return nil, fmt.Errorf("actors: spawn gang %q: %w", spec.Name, err)
	}
	if _, err := g.AwaitRunning(ctx, 0); err != nil {
		_ = g.Stop(context.WithoutCancel(ctx))
		j.forget(spec.Name)
		return nil, err
	}
	return g, nil
}

func (j *Job) forget(name string) {
	j.mu.Lock()
	delete(j.gangs, name)
	j.mu.Unlock()
}

// Gang returns the job's gang of that name, or nil.
func (j *Job) Gang(name string) *Gang {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.gangs[name]
}

// Stop stops the job's whole tree and forgets the job.
func (j *Job) Stop(ctx context.Context) error {
	err := waitFuture(ctx, j.sys.sys.Root.StopFuture(j.root))
	j.mu.Lock()
	for _, g := range j.gangs {
		g.mu.Lock()
		if g.state != GangFailed {
			g.state = GangStopped
		}
		g.notifyLocked()
		g.mu.Unlock()
	}
	j.mu.Unlock()
	j.sys.mu.Lock()
	delete(j.sys.jobs, j.id)
	j.sys.mu.Unlock()
	return err
}
