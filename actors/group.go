package actors

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"go.uber.org/zap"
)

// A process's share of a job's actor tree: a job root, groups under it (the members of one
// gang incarnation that live in this process), members under their group. Supervision
// inside a process only reports: a member that fails is stopped and its group's OnFailure
// is told, and the runtime's head, which sees every process, decides what restarts (a
// gang restarts all-for-one, across processes).

// MemberSpec is one actor of a group.
type MemberSpec struct {
	// Name is unique in the group ("w3").
	Name string
	// Kind is a registered kind; Producer, when set, is used instead.
	Kind     string
	Producer Producer
	// Index is what Context.Index reports (a gang member's rank).
	Index int
}

// GroupSpec describes a group of actors supervised together.
type GroupSpec struct {
	// Name is unique within its job ("dp.g0").
	Name string
	// Members are spawned in order.
	Members []MemberSpec
	// Data is attached to the group for its members (Context.Group().Data()).
	Data any
	// OnFailure is called when a member fails (panics, or fails to start); the member is
	// then stopped. It must not block.
	OnFailure func(Failure)
}

// Failure describes a member failure, as told to GroupSpec.OnFailure.
type Failure struct {
	// Index is the failed member's MemberSpec.Index; Name its name.
	Index int
	Name  string
	// Reason is what it panicked with.
	Reason any
}

// Group is a running group of members.
type Group struct {
	spec GroupSpec
	job  *Job
	sys  *System
	log  *zap.Logger

	mu       sync.Mutex
	changed  chan struct{}
	members  []Ref
	specs    []MemberSpec
	started  map[string]bool
	failed   map[string]*Failure
	cells    map[string]*cell // the members' actors, for InjectMemberFailure
	failure  *Failure
	sup      *actor.PID
	stopped  bool
	spawnErr error
}

// Spec is the group's spec.
func (g *Group) Spec() GroupSpec { return g.spec }

// Data is GroupSpec.Data.
func (g *Group) Data() any { return g.spec.Data }

// Members lists the member refs in spec order.
func (g *Group) Members() []Ref {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]Ref(nil), g.members...)
}

// Member is the ref of the i-th member (in spec order), or the zero Ref.
func (g *Group) Member(i int) Ref {
	g.mu.Lock()
	defer g.mu.Unlock()
	if i < 0 || i >= len(g.members) {
		return Ref{}
	}
	return g.members[i]
}

func (g *Group) notifyLocked() {
	close(g.changed)
	g.changed = make(chan struct{})
}

func (g *Group) memberStarted(name string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.started[name] = true
	g.notifyLocked()
}

// AwaitStarted waits until every member has started. It fails with the first member
// failure, when the group is stopped, or when ctx ends.
func (g *Group) AwaitStarted(ctx context.Context) error {
	for {
		g.mu.Lock()
		// A member may start before the supervisor has recorded every ref: wait for both.
		n, f, stopped, err, ch, want := min(len(g.started), len(g.members)), g.failure, g.stopped, g.spawnErr, g.changed, len(g.specs)
		g.mu.Unlock()
		switch {
		case err != nil:
			return err
		case f != nil:
			return fmt.Errorf("%w: group %q member %s: %v", ErrActorFailed, g.spec.Name, f.Name, f.Reason)
		case stopped:
			return fmt.Errorf("%w: group %q stopped", ErrActorDead, g.spec.Name)
		case n >= want:
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("actors: group %q: %d of %d members started: %w", g.spec.Name, n, want, ctx.Err())
		}
	}
}

// InjectFailure makes the i-th member crash, as InjectMemberFailure does. For tests and
// demonstrations in one process; another process's worker is killed by its agent.
func (g *Group) InjectFailure(i int, reason string) error {
	r := g.Member(i)
	if r.IsZero() {
		return fmt.Errorf("%w: group %q has no member %d", ErrUnknownActor, g.spec.Name, i)
	}
	g.mu.Lock()
	name := ""
	if i < len(g.specs) {
		name = g.specs[i].Name
	}
	g.mu.Unlock()
	return g.InjectMemberFailure(name, reason)
}

// Stop stops the group's members and its supervisor, and waits for them.
func (g *Group) Stop(ctx context.Context) error {
	g.mu.Lock()
	sup := g.sup
	g.stopped = true
	g.notifyLocked()
	g.mu.Unlock()
	g.job.forget(g.spec.Name, g)
	if sup == nil {
		return nil
	}
	return waitFuture(ctx, g.sys.sys.Root.StopFuture(sup))
}

// reportStrategy stops a failed member and tells the group's OnFailure; it never restarts.
type reportStrategy struct{ g *Group }

func (st reportStrategy) HandleFailure(_ *actor.ActorSystem, sup actor.Supervisor, child *actor.PID, _ *actor.RestartStatistics, reason, _ any) {
	g := st.g
	g.mu.Lock()
	f := Failure{Index: -1, Reason: reason}
	for i, m := range g.members {
		if m.pid != nil && m.pid.Equal(child) {
			f.Index, f.Name = g.specs[i].Index, g.specs[i].Name
		}
	}
	if f.Name == "" {
		f.Name = child.Id
	}
	if g.failure == nil {
		g.failure = &f
	}
	g.failed[f.Name] = &f
	g.notifyLocked()
	g.mu.Unlock()
	g.log.Warn("member failed", zap.String("member", f.Name), zap.Any("reason", reason))
	// The member is stopped before anyone is told, so that a call made after OnFailure
	// fails fast as a dead letter.
	stopped := g.sys.sys.Root.StopFuture(child)
	go func() {
		_ = stopped.Wait()
		if g.spec.OnFailure != nil {
			g.spec.OnFailure(f)
		}
	}()
}

// groupSupervisor is the actor above a group's members.
type groupSupervisor struct {
	g     *Group
	prods []Producer
}

// addMember asks a group's supervisor to spawn one more member.
type addMember struct {
	spec MemberSpec
	prod Producer
}

func (s *groupSupervisor) spawn(pc actor.Context, m MemberSpec, prod Producer) (Ref, error) {
	g := s.g
	index, name := m.Index, m.Name
	props := cellProps(g.sys, prod, g, index, name)
	pid, err := pc.SpawnNamed(props, m.Name)
	if err != nil {
		return Ref{}, fmt.Errorf("actors: group %q: spawn %s: %w", g.spec.Name, m.Name, err)
	}
	return Ref{pid: pid, kind: m.Kind}, nil
}

func (s *groupSupervisor) Receive(pc actor.Context) {
	g := s.g
	switch m := pc.Message().(type) {
	case *actor.Started:
		refs := make([]Ref, 0, len(g.spec.Members))
		for i, ms := range g.spec.Members {
			r, err := s.spawn(pc, ms, s.prods[i])
			if err != nil {
				g.mu.Lock()
				g.spawnErr = err
				g.notifyLocked()
				g.mu.Unlock()
				return
			}
			refs = append(refs, r)
		}
		g.mu.Lock()
		g.members = append(g.members, refs...)
		g.sup = pc.Self()
		g.notifyLocked()
		g.mu.Unlock()
	case *addMember:
		r, err := s.spawn(pc, m.spec, m.prod)
		if err == nil {
			g.mu.Lock()
			g.members = append(g.members, r)
			g.specs = append(g.specs, m.spec)
			g.notifyLocked()
			g.mu.Unlock()
		}
		pc.Respond(&spawned{pid: r.pid, err: err})
	}
}

// Add spawns one more member into a running group and returns its ref; AwaitMember waits
// for it to start.
func (g *Group) Add(ctx context.Context, m MemberSpec) (Ref, error) {
	prod := m.Producer
	if prod == nil {
		p, err := g.sys.Producer(m.Kind)
		if err != nil {
			return Ref{}, err
		}
		prod = p
	}
	if m.Name == "" {
		return Ref{}, fmt.Errorf("%w: group %q: a member needs a name", ErrInvalidSpec, g.spec.Name)
	}
	// The supervisor must be up before it takes requests.
	for {
		g.mu.Lock()
		sup, ch, err := g.sup, g.changed, g.spawnErr
		g.mu.Unlock()
		if err != nil {
			return Ref{}, err
		}
		if sup != nil {
			break
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return Ref{}, ctx.Err()
		}
	}
	timeout := g.sys.timeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = time.Until(dl)
	}
	res, err := g.sys.sys.Root.RequestFuture(g.sup, &addMember{spec: m, prod: prod}, timeout).Result()
	if err != nil {
		return Ref{}, fmt.Errorf("actors: group %q: add %s: %w", g.spec.Name, m.Name, err)
	}
	sp := res.(*spawned)
	if sp.err != nil {
		return Ref{}, sp.err
	}
	return Ref{pid: sp.pid, kind: m.Kind}, nil
}

// AwaitMember waits until the named member has started; it fails with ErrActorFailed when
// it failed first.
func (g *Group) AwaitMember(ctx context.Context, name string) error {
	for {
		g.mu.Lock()
		started, f, stopped, ch := g.started[name] && g.recordedLocked(name), g.failed[name], g.stopped, g.changed
		g.mu.Unlock()
		switch {
		case f != nil:
			return fmt.Errorf("%w: group %q member %s: %v", ErrActorFailed, g.spec.Name, name, f.Reason)
		case started:
			return nil
		case stopped:
			return fmt.Errorf("%w: group %q stopped", ErrActorDead, g.spec.Name)
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("actors: group %q member %s did not start: %w", g.spec.Name, name, ctx.Err())
		}
	}
}

// recordedLocked reports whether the supervisor has recorded the named member's ref.
func (g *Group) recordedLocked(name string) bool {
	for i, s := range g.specs {
		if s.Name == name {
			return i < len(g.members)
		}
	}
	return false
}

// MemberRef returns the ref of the named member, or the zero Ref.
func (g *Group) MemberRef(name string) Ref {
	g.mu.Lock()
	defer g.mu.Unlock()
	for i, s := range g.specs {
		if s.Name == name && i < len(g.members) {
			return g.members[i]
		}
	}
	return Ref{}
}

// StopMember stops one member and waits for it.
func (g *Group) StopMember(ctx context.Context, name string) error {
	r := g.MemberRef(name)
	if r.IsZero() {
		return nil
	}
	return waitFuture(ctx, g.sys.sys.Root.StopFuture(r.pid))
}

// InjectMemberFailure makes the named member crash, as its process dying would: a call it
// is handling has its context cancelled, and the member fails as soon as that handler
// returns (the call is answered ErrActorFailed); the calls waiting in its mailbox are
// answered ErrNotDelivered.
func (g *Group) InjectMemberFailure(name, reason string) error {
	r := g.MemberRef(name)
	if r.IsZero() {
		return fmt.Errorf("%w: group %q has no member %s", ErrUnknownActor, g.spec.Name, name)
	}
	if c := g.cell(name); c != nil {
		c.kills.kill(reason)
	}
	g.sys.sys.Root.Send(r.pid, &crash{reason: reason})
	return nil
}

// setCell records the cell of the named member's current actor.
func (g *Group) setCell(name string, c *cell) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cells == nil {
		g.cells = map[string]*cell{}
	}
	g.cells[name] = c
}

func (g *Group) cell(name string) *cell {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.cells[name]
}

// Job is the root of one job's actor tree in this process.
type Job struct {
	id   string
	sys  *System
	root *actor.PID

	mu     sync.Mutex
	groups map[string]*Group
}

// jobRoot is the job's root actor; it spawns groups and standalone actors as its children.
type jobRoot struct{}

type spawnChild struct {
	props *actor.Props
	name  string
}

type spawned struct {
	pid *actor.PID
	err error
}

func (jobRoot) Receive(pc actor.Context) {
	if m, ok := pc.Message().(*spawnChild); ok {
		pid, err := pc.SpawnNamed(m.props, m.name)
		pc.Respond(&spawned{pid: pid, err: err})
	}
}

// Job returns the job's root in this process, creating it on first use.
func (s *System) Job(id string) (*Job, error) {
	if id == "" {
		return nil, fmt.Errorf("%w: empty job id", ErrInvalidSpec)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down {
		return nil, ErrShutdown
	}
	if j, ok := s.jobs[id]; ok {
		return j, nil
	}
	root, err := s.sys.Root.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return jobRoot{} }), id)
	if err != nil {
		return nil, fmt.Errorf("actors: job %q: %w", id, err)
	}
	j := &Job{id: id, sys: s, root: root, groups: map[string]*Group{}}
	s.jobs[id] = j
	return j, nil
}

// ID is the job's id.
func (j *Job) ID() string { return j.id }

func (j *Job) spawn(ctx context.Context, props *actor.Props, name string) (*actor.PID, error) {
	timeout := j.sys.timeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = time.Until(dl)
	}
	if timeout <= 0 {
		return nil, fmt.Errorf("actors: spawn %s/%s: %w", j.id, name, context.DeadlineExceeded)
	}
	res, err := j.sys.sys.Root.RequestFuture(j.root, &spawnChild{props: props, name: name}, timeout).Result()
	if err != nil {
		return nil, fmt.Errorf("actors: spawn %s/%s: %w", j.id, name, err)
	}
	sp := res.(*spawned)
	if sp.err != nil {
		return nil, fmt.Errorf("actors: spawn %s/%s: %w", j.id, name, sp.err)
	}
	return sp.pid, nil
}

// Spawn starts a standalone actor of a kind under the job, named name.
func (j *Job) Spawn(ctx context.Context, kind, name string) (Ref, error) {
	p, err := j.sys.Producer(kind)
	if err != nil {
		return Ref{}, err
	}
	pid, err := j.spawn(ctx, cellProps(j.sys, p, nil, -1, name), name)
	if err != nil {
		return Ref{}, err
	}
	return Ref{pid: pid, kind: kind}, nil
}

// SpawnGroup starts a group under the job. It returns once the group's members are spawned;
// AwaitStarted waits until they have started.
func (j *Job) SpawnGroup(ctx context.Context, spec GroupSpec) (*Group, error) {
	if spec.Name == "" {
		return nil, fmt.Errorf("%w: a group needs a name", ErrInvalidSpec)
	}
	prods := make([]Producer, len(spec.Members))
	for i, m := range spec.Members {
		if m.Name == "" {
			return nil, fmt.Errorf("%w: group %q member %d has no name", ErrInvalidSpec, spec.Name, i)
		}
		prods[i] = m.Producer
		if prods[i] == nil {
			p, err := j.sys.Producer(m.Kind)
			if err != nil {
				return nil, fmt.Errorf("actors: group %q member %s: %w", spec.Name, m.Name, err)
			}
			prods[i] = p
		}
	}
	j.mu.Lock()
	if _, ok := j.groups[spec.Name]; ok {
		j.mu.Unlock()
		return nil, fmt.Errorf("%w: job %q already has a group %q", ErrInvalidSpec, j.id, spec.Name)
	}
	g := &Group{spec: spec, job: j, sys: j.sys, changed: make(chan struct{}), started: map[string]bool{}, failed: map[string]*Failure{},
		specs: append([]MemberSpec(nil), spec.Members...),
		log:   j.sys.log.With(zap.String("job", j.id), zap.String("group", spec.Name))}
	j.groups[spec.Name] = g
	j.mu.Unlock()
	props := actor.PropsFromProducer(func() actor.Actor { return &groupSupervisor{g: g, prods: prods} },
		actor.WithSupervisor(reportStrategy{g: g}))
	if _, err := j.spawn(ctx, props, spec.Name); err != nil {
		j.forget(spec.Name, g)
		return nil, err
	}
	return g, nil
}

// EnsureGroup returns the job's group of that name in this process, starting it (with the
// spec's members, often none: Add adds them) when there is none.
func (j *Job) EnsureGroup(ctx context.Context, spec GroupSpec) (*Group, error) {
	if g := j.Group(spec.Name); g != nil {
		return g, nil
	}
	g, err := j.SpawnGroup(ctx, spec)
	if err != nil {
		if other := j.Group(spec.Name); other != nil {
			return other, nil // another caller started it first
		}
		return nil, err
	}
	return g, nil
}

func (j *Job) forget(name string, g *Group) {
	j.mu.Lock()
	if j.groups[name] == g {
		delete(j.groups, name)
	}
	j.mu.Unlock()
}

// Group returns the job's group of that name in this process, or nil.
func (j *Job) Group(name string) *Group {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.groups[name]
}

// Stop stops the job's whole tree in this process and forgets the job.
func (j *Job) Stop(ctx context.Context) error {
	err := waitFuture(ctx, j.sys.sys.Root.StopFuture(j.root))
	j.mu.Lock()
	for _, g := range j.groups {
		g.mu.Lock()
		g.stopped = true
		g.notifyLocked()
		g.mu.Unlock()
	}
	j.groups = map[string]*Group{}
	j.mu.Unlock()
	j.sys.mu.Lock()
	delete(j.sys.jobs, j.id)
	j.sys.mu.Unlock()
	return err
}
