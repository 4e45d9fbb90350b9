package sdk

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/atoll-run/atoll/actors"
	"github.com/atoll-run/atoll/internal/codec"
	"github.com/atoll-run/atoll/proto/actorspb"
	"github.com/atoll-run/atoll/runtime/api"
)

// Tasks are stateless functions run on workers of the cluster, as Ray's remote functions
// are. A job keeps a pool of task workers per shape of resources: each is a gang of one
// worker of the built-in kind taskKind, placed by the scheduler like any gang, spawned when
// tasks wait and none is idle, reused by the next task, and stopped after it has been idle
// for a while (WithTaskIdle) or with its job. A task whose worker fails (its process dies,
// or the task panics) runs again on another worker, up to its MaxRetries; an error the
// function returns is the task's result and is not retried.

// taskKind is the actor kind of task workers; every program registers it.
const taskKind = "atoll.task"

// DefaultTaskRetries is how many times a task runs again after its worker failed, unless
// TaskOptions says otherwise (Ray's max_retries default).
const DefaultTaskRetries = 3

// DefaultTaskResources is what a task holds unless TaskOptions says otherwise: one CPU
// (Ray's num_cpus=1 default).
var DefaultTaskResources = Resources{CPUMilli: 1000}

// TaskOptions are how a task runs.
type TaskOptions struct {
	// Resources is what each run holds on its worker (zero: DefaultTaskResources).
	Resources Resources
	// MaxRetries is how many times a run whose worker failed starts again on another
	// worker; 0: DefaultTaskRetries, negative: never. A task is charged only with its own
	// runs: a pooled worker that an earlier task's failure ended before this task reached
	// it does not count.
	MaxRetries int
}

func (o TaskOptions) normalized() TaskOptions {
	if o.Resources == (Resources{}) {
		o.Resources = DefaultTaskResources
	}
	switch {
	case o.MaxRetries == 0:
		o.MaxRetries = DefaultTaskRetries
	case o.MaxRetries < 0:
		o.MaxRetries = 0
	}
	return o
}

// TaskFunc is a task: a function of arguments A to a result R, registered by name, that
// runs on a worker of the cluster. Declare it once (a package-level variable is the usual
// place), give it to Start/Local/Connect with Tasks, and run it with Remote.
type TaskFunc[A, R any] struct {
	name string
	fn   func(ctx *Context, args A) (R, error)
	opts TaskOptions
}

// Task declares a task named name (unique in the program) that runs fn. fn gets the
// worker's Context (calls, puts and gets; what it puts belongs to the task's job, so a
// result stored as an object outlives the task worker) and the arguments; its result and
// its error are the task's. A and R must cross processes (see Put).
func Task[A, R any](name string, fn func(ctx *Context, args A) (R, error)) *TaskFunc[A, R] {
	return &TaskFunc[A, R]{name: name, fn: fn}
}

// Name is the task's name.
func (t *TaskFunc[A, R]) Name() string { return t.name }

// With returns the task with other options (resources, retries), as Ray's .options().
func (t *TaskFunc[A, R]) With(o TaskOptions) *TaskFunc[A, R] {
	c := *t
	c.opts = o
	return &c
}

// TaskDef is a task declared with Task, for Tasks.
type TaskDef interface {
	register(s *settings) error
}

// taskEntry is a registered task as a worker runs it.
type taskEntry struct {
	run func(ctx *Context, args *actorspb.Payload) (any, error)
}

func (t *TaskFunc[A, R]) register(s *settings) error {
	if t == nil || t.name == "" || t.fn == nil {
		return fmt.Errorf("sdk: Tasks: a task needs a name and a function")
	}
	if _, dup := s.tasks[t.name]; dup {
		return fmt.Errorf("sdk: task %q registered twice", t.name)
	}
	var zero A
	if reflect.TypeFor[A]().Kind() != reflect.Interface {
		if err := s.codec.Register(zero); err != nil {
			return fmt.Errorf("sdk: task %q arguments: %w", t.name, err)
		}
	}
	if rt := reflect.TypeFor[R](); rt.Kind() != reflect.Interface {
		if err := codec.Check(rt); err != nil {
			return fmt.Errorf("sdk: task %q result: %w", t.name, err)
		}
	}
	fn := t.fn
	s.tasks[t.name] = &taskEntry{run: func(ctx *Context, p *actorspb.Payload) (any, error) {
		var a A
		if err := codec.DecodeInto(p, &a); err != nil {
			return nil, fmt.Errorf("sdk: task %q arguments: %w", t.name, err)
		}
		return fn(ctx, a)
	}}
	return nil
}

// Tasks registers tasks (declared with Task) with the program: the driver runs them with
// Remote, and the task workers (this same program) find them by name.
func Tasks(ts ...TaskDef) Option {
	return func(s *settings) error {
		for _, t := range ts {
			if t == nil {
				return fmt.Errorf("sdk: Tasks(nil)")
			}
			if err := t.register(s); err != nil {
				return err
			}
		}
		return nil
	}
}

// A task's request crosses to its worker as one protobuf message (an actorspb.Payload: its
// Type is the task's name, a NUL, and its arguments' type; its codec and data are the
// arguments'), so that the per-task cost of the wire is a protobuf's, not a gob encoder's
// and decoder's type descriptors (which were most of a warm task's CPU).
const taskNameSep = "\x00"

// taskRequest is the wire form of a run of task name with the encoded arguments args.
func taskRequest(name string, args *actorspb.Payload) *actorspb.Payload {
	return &actorspb.Payload{Type: name + taskNameSep + args.Type, Codec: args.Codec, Data: args.Data}
}

// splitTaskRequest is taskRequest's inverse: the task's name and its arguments.
func splitTaskRequest(p *actorspb.Payload) (string, *actorspb.Payload, bool) {
	name, argType, ok := strings.Cut(p.Type, taskNameSep)
	return name, &actorspb.Payload{Type: argType, Codec: p.Codec, Data: p.Data}, ok
}

// taskRunner is the actor of a task worker.
type taskRunner struct{}

func (taskRunner) Receive(ctx *Context, msg any) (any, error) {
	req, ok := msg.(*actorspb.Payload)
	if !ok {
		return nil, fmt.Errorf("sdk: a task worker got %T", msg)
	}
	name, args, ok := splitTaskRequest(req)
	if !ok {
		return nil, fmt.Errorf("sdk: a task worker got a %s message, not a task", req.Type)
	}
	t := ctx.c.s.tasks[name]
	if t == nil {
		known := make([]string, 0, len(ctx.c.s.tasks))
		for k := range ctx.c.s.tasks {
			known = append(known, k)
		}
		sort.Strings(known)
		return nil, fmt.Errorf("%w: %q is not a task of this program (its tasks: %v): give it with sdk.Tasks to Start/Local/Connect", ErrUnknownTask, name, known)
	}
	if ctx.w != nil {
		ctx.owner = jobOwner(ctx.w.spec.Job)
		defer func() { ctx.owner = "" }()
	}
	return t.run(ctx, args)
}

// taskDeadline bounds a task whose context has none: tasks, unlike calls, run as long as
// they need.
const taskDeadline = 30 * 24 * time.Hour

// Remote runs the task on a worker of the job's cluster and returns at once with a Future
// for its result. ctx bounds and cancels the run (the function's Context is cancelled with
// it, in whatever process it runs). Remote works from a driver and from inside an actor
// (Context.Job).
func (t *TaskFunc[A, R]) Remote(ctx context.Context, j *Job, args A) *Future[R] {
	f := newFuture[R]()
	var zero R
	if j == nil {
		f.complete(zero, fmt.Errorf("%w: task %q: no job (an actor of Cluster.Spawn has none)", ErrInvalid, t.name))
		return f
	}
	c := j.c
	if _, ok := c.s.tasks[t.name]; !ok {
		f.complete(zero, fmt.Errorf("sdk: task %q: %w: give it with sdk.Tasks to Start/Local/Connect", t.name, ErrUnknownTask))
		return f
	}
	p, err := c.s.codec.Encode(args)
	if err != nil {
		f.complete(zero, fmt.Errorf("sdk: task %q arguments: %w", t.name, err))
		return f
	}
	req := taskRequest(t.name, p)
	opts := t.opts.normalized()
	pool := c.pool(j.name)
	spawn(func() {
		if _, ok := ctx.Deadline(); !ok {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, taskDeadline)
			defer cancel()
		}
		var failures []string
		lost := 0 // workers lost before the task reached them: not the task's failures
		for {
			s, err := pool.acquire(ctx, opts.Resources, !j.inTask)
			if err != nil {
				f.complete(zero, fmt.Errorf("sdk: task %q: %w", t.name, err))
				return
			}
			var v R
			sent := false
			gen, err := s.g.AwaitRunning(ctx, s.minGen)
			if err == nil {
				to := s.g.Worker(0)
				gen = to.gen
				sent = true
				v, err = Call[R](ctx, c, to, req)
			}
			failed := workerFailure(err) && ctx.Err() == nil
			pool.release(s, failed, gen)
			if !failed {
				if err != nil {
					err = fmt.Errorf("sdk: task %q: %w", t.name, callErr(err))
				}
				f.complete(v, err)
				return
			}
			if !sent || errors.Is(err, actors.ErrNotDelivered) {
				// The worker failed before the task reached it (an earlier task's failure
				// ended it): another worker takes the task, whatever its MaxRetries.
				if lost++; lost <= maxLostWorkers {
					continue
				}
			}
			failures = append(failures, err.Error())
			if len(failures) > opts.MaxRetries {
				f.complete(zero, fmt.Errorf("sdk: task %q: its worker failed %d times (MaxRetries %d); the last time: %w", t.name, len(failures), opts.MaxRetries, err))
				return
			}
			c.log.Info("task worker failed; the task runs again", zap.String("task", t.name), zap.Int("attempt", len(failures)+1), zap.Error(err))
		}
	})
	return f
}

// maxLostWorkers bounds how many task workers a task may find failed before it reaches
// them (each an earlier task's failure, not its own) before that counts against it too.
const maxLostWorkers = 8

// callErr is the error a call's handler returned, without the call's own wrapping (which
// names the task worker's actor).
func callErr(err error) error {
	if inner := errors.Unwrap(err); inner != nil && strings.HasPrefix(err.Error(), "call ") {
		return inner
	}
	return err
}

// workerFailure reports whether a task's error came from its worker failing (a retry may
// succeed) rather than from the task's function.
func workerFailure(err error) bool {
	return err != nil && (errors.Is(err, ErrStale) || errors.Is(err, ErrActorDead) || errors.Is(err, ErrActorFailed) ||
		errors.Is(err, ErrGangFailed) || errors.Is(err, ErrStopped))
}

// taskPool is a job's task workers in this process, by shape of resources.
type taskPool struct {
	c    *conn
	job  string
	idle time.Duration
	life context.Context
	end  context.CancelFunc

	mu     sync.Mutex
	shapes map[Resources]*shape
	seq    int
	closed bool
}

// shape is the task workers of one shape of resources.
type shape struct {
	key      string
	res      Resources
	idle     []*slot // oldest first
	slots    map[*slot]bool
	waiting  []*waiter
	nested   int // of waiting, the tasks run from inside tasks (not pipelined)
	spawning int
	retry    *time.Timer
	backoff  time.Duration

	// How the pool decides to start workers (see wantLocked): startup is a moving average
	// of the time from asking for a worker to its running; busy is how long tasks waited
	// since the window began at window (marked at mark), done how many tasks ended
	// meanwhile; decided is when the pool last judged, lastRate the rate it saw then, grew
	// how many workers it then started beside grewFrom; ceiling is a number of workers
	// that growth did not pay beyond, held since ceilingAt.
	startup   time.Duration
	window    time.Time
	mark      time.Time
	busy      time.Duration
	done      int
	decided   time.Time
	lastRate  float64
	grew      int
	grewFrom  int
	ceiling   int
	ceilingAt time.Time
	recheck   *time.Timer // armed while tasks wait for workers it did not start
}

// slot is one task worker.
type slot struct {
	sh        *shape
	g         *Gang
	minGen    int // the generation it must reach (after a failure) before it takes a task
	idleSince time.Time
	inflight  int       // tasks pushed to it and not yet answered
	progress  time.Time // when it last answered a task (zero: never)
	failing   bool      // a run on it failed: it takes no pipelined task until it is idle again
}

// waiter is a task waiting for a task worker; pipelined says it may share one (see
// taskPipeline).
type waiter struct {
	ch        chan grant
	pipelined bool
}

type grant struct {
	s   *slot
	err error
}

// maxSpawning bounds the task workers of one shape being started at once.
const maxSpawning = 16

// taskPipeline is how many tasks a driver pushes to one leased task worker before the
// first is answered (Ray's max_tasks_in_flight_per_worker): the worker runs them one at a
// time, in order, and is never idle between them waiting for the next request. A task is
// pipelined only behind a worker that answered within pipelineWindow: short tasks flow
// through the workers the driver holds, while a task that would queue behind long ones
// waits for the first worker free instead, and the pool leases more (as without
// pipelining).
const (
	taskPipeline   = 16
	pipelineWindow = 5 * time.Millisecond
)

func (c *conn) pool(job string) *taskPool {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.pools[job]
	if p == nil {
		p = &taskPool{c: c, job: job, idle: c.s.taskIdle, shapes: map[Resources]*shape{}}
		p.life, p.end = context.WithCancel(c.life)
		c.pools[job] = p
		go p.reap()
	}
	return p
}

// closePool ends a job's task pool: waiting tasks fail with ErrStopped (its workers stop
// with the job).
func (c *conn) closePool(job string) {
	c.mu.Lock()
	p := c.pools[job]
	delete(c.pools, job)
	c.mu.Unlock()
	if p == nil {
		return
	}
	p.mu.Lock()
	p.closed = true
	for _, sh := range p.shapes {
		for _, w := range sh.waiting {
			w.ch <- grant{err: fmt.Errorf("%w: job %s", ErrStopped, job)}
		}
		sh.waiting, sh.nested = nil, 0
		if sh.retry != nil {
			sh.retry.Stop()
		}
		if sh.recheck != nil {
			sh.recheck.Stop()
		}
	}
	p.mu.Unlock()
	p.end()
}

func shapeKey(r Resources) string {
	var parts []string
	switch {
	case r.MIG != "":
		parts = append(parts, "mig"+r.MIG)
	case r.GPUs > 0 && r.GPUMilli > 0 && r.GPUMilli < 1000:
		parts = append(parts, fmt.Sprintf("g%dm", r.GPUMilli))
	case r.GPUs > 0:
		parts = append(parts, fmt.Sprintf("g%d", r.GPUs))
	}
	if r.CPUMilli > 0 {
		parts = append(parts, fmt.Sprintf("c%d", r.CPUMilli))
	}
	if r.MemMiB > 0 {
		parts = append(parts, fmt.Sprintf("r%d", r.MemMiB))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, "-")
}

// acquire takes a task worker of the shape: an idle one; else, when pipelined, the least
// busy one with room in its pipeline (asking for one more worker meanwhile); else it
// starts one and waits for it (or for any that frees up).
func (p *taskPool) acquire(ctx context.Context, res Resources, pipelined bool) (*slot, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, fmt.Errorf("%w: job %s", ErrStopped, p.job)
	}
	sh := p.shapes[res]
	if sh == nil {
		sh = &shape{key: shapeKey(res), res: res, slots: map[*slot]bool{}}
		p.shapes[res] = sh
	}
	if n := len(sh.idle); n > 0 {
		s := sh.idle[n-1] // the most recently used: the others may go idle for good
		sh.idle = sh.idle[:n-1]
		s.inflight++
		p.mu.Unlock()
		return s, nil
	}
	if pipelined {
		if s := sh.pipelineToLocked(time.Now()); s != nil {
			s.inflight++
			p.mu.Unlock()
			return s, nil
		}
	}
	w := &waiter{ch: make(chan grant, 1), pipelined: pipelined}
	sh.enqueue(w, time.Now())
	p.growLocked(sh)
	p.mu.Unlock()
	select {
	case g := <-w.ch:
		return g.s, g.err
	case <-ctx.Done():
		p.mu.Lock()
		for i, o := range sh.waiting {
			if o == w {
				sh.dequeue(i, time.Now())
				break
			}
		}
		p.mu.Unlock()
		select {
		case g := <-w.ch: // granted meanwhile: give it back
			if g.s != nil {
				p.release(g.s, false, 0)
			}
		default:
		}
		return nil, ctx.Err()
	}
}

// pipelineToLocked is the busy task worker of the shape that a task is pipelined to at
// now: of those with room in their pipeline, not failing, and answering within
// pipelineWindow, the one with the fewest tasks in flight (the earliest to answer among
// equals); nil when none is.
func (sh *shape) pipelineToLocked(now time.Time) *slot {
	var best *slot
	for s := range sh.slots {
		if s.failing || s.inflight == 0 || s.inflight >= taskPipeline || now.Sub(s.progress) >= pipelineWindow {
			continue
		}
		if best == nil || s.inflight < best.inflight || (s.inflight == best.inflight && s.progress.After(best.progress)) {
			best = s
		}
	}
	return best
}

// growLocked starts the task workers that the tasks waiting need (see wantLocked), and
// looks again later while tasks wait that it started none for: a worker's task that runs
// longer than it looked makes more workers worth starting.
func (p *taskPool) growLocked(sh *shape) {
	if p.closed || sh.retry != nil {
		return
	}
	for want := sh.wantLocked(time.Now()); want > 0 && sh.spawning < maxSpawning; want-- {
		p.spawnLocked(sh)
	}
	if len(sh.waiting) > sh.spawning && sh.recheck == nil {
		sh.recheck = time.AfterFunc(min(max(sh.startup, pipelineWindow), time.Second), func() {
			p.mu.Lock()
			defer p.mu.Unlock()
			sh.recheck = nil
			p.growLocked(sh)
		})
	}
}

// wantLocked is how many more task workers of the shape the tasks waiting need at now.
//
// More workers help only while the workers are what the tasks wait for; where the driver,
// the network or the machine is the bottleneck they only add processes (each start costs
// a process's start on a machine's cores), and the cluster's declared CPUs do not say
// which it is. So the pool grows by steps, each judged by the rate it brought, as TCP's
// congestion control and a thread pool's hill climbing do. It starts one worker when it
// has none. After that it judges at most once per max(sh.startup, minJudge), once the
// workers it started last run, and only when tasks waited for workers at least half of
// the time since it last judged; it then measures the rate at which tasks ended while
// tasks waited. It starts as many workers as run (doubling, as Ray's autoscaler bounds its
// pending nodes by upscaling_speed) until a step does not pay: a step after which the
// rate did not rise by half the new workers' share sets a ceiling at the size before it,
// held for ceilingHold; past it, the pool probes one worker at a time. A window in which
// no task ended (every worker on a task longer than it) judges no step and holds no
// ceiling: the pool doubles. A task run from inside a task always gets a worker (bounded
// by maxSpawning only): its caller may hold a worker while it waits for it.
func (sh *shape) wantLocked(now time.Time) int {
	sh.account(now)
	greedy := len(sh.waiting) - sh.spawning
	if greedy <= 0 {
		return 0
	}
	floor := sh.nested - sh.spawning
	workers := 0
	for s := range sh.slots {
		if !s.failing {
			workers++
		}
	}
	if workers == 0 && sh.spawning == 0 {
		return min(max(floor, 1), greedy)
	}
	if sh.spawning > 0 || sh.startup <= 0 || now.Sub(sh.decided) < max(sh.startup, minJudge) {
		return min(max(floor, 0), greedy)
	}
	if waited := sh.busy; waited < now.Sub(sh.window)/2 {
		// Tasks waited less than half the time: the workers keep up. Judge again later,
		// over a new window.
		sh.decided = now
		sh.restartWindow(now)
		return min(max(floor, 0), greedy)
	}
	rate := 0.0 // tasks a second while tasks waited
	if sh.busy > 0 {
		rate = float64(sh.done) / sh.busy.Seconds()
	}
	if sh.grew > 0 && rate > 0 && rate < sh.lastRate*(1+0.5*float64(sh.grew)/float64(max(sh.grewFrom, 1))) {
		sh.ceiling, sh.ceilingAt = sh.grewFrom, now
	}
	sh.grew, sh.lastRate, sh.decided = 0, rate, now
	sh.restartWindow(now)
	// No task ended while tasks waited: every worker is on a task longer than the window,
	// and only more workers serve the waiting ones (a ceiling learned on short tasks does
	// not hold).
	long := rate == 0
	if sh.ceiling > 0 && workers >= sh.ceiling && now.Sub(sh.ceilingAt) < ceilingHold && !long {
		return min(max(floor, 0), greedy)
	}
	grow := workers // slow start
	if sh.ceiling > 0 && !long {
		grow = 1 // a ceiling was found once: probe past it a worker at a time
	}
	n := min(max(floor, grow), greedy, maxSpawning)
	sh.grew, sh.grewFrom = n, workers
	return n
}

// minJudge is the shortest window the pool judges its rate over: a few milliseconds of
// tasks (what a worker in the driver's process takes to start) say little.
const minJudge = 100 * time.Millisecond

// ceilingHold is how long the pool holds a ceiling that growth did not pay beyond.
const ceilingHold = 10 * time.Second

// account adds the time since its last mark to the window's busy time while tasks wait.
// Call it before the waiting list changes.
func (sh *shape) account(now time.Time) {
	if len(sh.waiting) > 0 && !sh.mark.IsZero() {
		sh.busy += now.Sub(sh.mark)
	}
	sh.mark = now
}

// enqueue adds a task that waits for a worker at now.
func (sh *shape) enqueue(w *waiter, now time.Time) {
	sh.account(now)
	sh.waiting = append(sh.waiting, w)
	if !w.pipelined {
		sh.nested++
	}
}

// dequeue removes the i-th task waiting, at now.
func (sh *shape) dequeue(i int, now time.Time) *waiter {
	w := sh.waiting[i]
	sh.account(now)
	if i == 0 {
		sh.waiting = sh.waiting[1:]
	} else {
		sh.waiting = append(sh.waiting[:i], sh.waiting[i+1:]...)
	}
	if !w.pipelined {
		sh.nested--
	}
	return w
}

// restartWindow begins a new window of measurement at now.
func (sh *shape) restartWindow(now time.Time) {
	sh.window, sh.mark, sh.busy, sh.done = now, now, 0, 0
}

// measureAlpha is the weight of a new sample in the shape's moving averages.
const measureAlpha = 0.125

func movingAverage(avg, sample time.Duration) time.Duration {
	if avg <= 0 {
		return sample
	}
	return avg + time.Duration(measureAlpha*float64(sample-avg))
}

// spawnLocked starts one more task worker of the shape.
func (p *taskPool) spawnLocked(sh *shape) {
	if p.closed || sh.retry != nil {
		return
	}
	sh.spawning++
	p.seq++
	go p.spawn(sh, fmt.Sprintf("task-%s-%d", sh.key, p.seq))
}

func (p *taskPool) spawn(sh *shape, name string) {
	start := time.Now()
	g, err := (&Job{c: p.c, name: p.job}).SpawnGang(p.life, GangSpec{Name: name, Kind: taskKind, Workers: 1, Resources: sh.res,
		MaxRestarts: 3, Backoff: 10 * time.Millisecond})
	p.mu.Lock()
	defer p.mu.Unlock()
	sh.spawning--
	switch {
	case err == nil && p.closed:
		go func() { _ = g.Stop(context.Background()) }()
	case err == nil:
		sh.backoff = 0
		now := time.Now() // SpawnGang returns once the worker runs
		sh.startup = movingAverage(sh.startup, now.Sub(start))
		if sh.spawning == 0 { // what the pool started runs: judge it from here
			sh.decided = now
			sh.restartWindow(now)
		}
		s := &slot{sh: sh, g: g}
		sh.slots[s] = true
		p.giveLocked(s)
	case p.closed:
	case errors.Is(err, ErrNoCapacity) || errors.Is(err, ErrExists) || errors.Is(err, api.ErrUnavailable):
		// Not now: the workers it has serve the queue, and it tries to grow again later.
		sh.backoff = min(max(2*sh.backoff, 50*time.Millisecond), 2*time.Second)
		if sh.retry == nil && len(sh.waiting) > sh.spawning {
			sh.retry = time.AfterFunc(sh.backoff, func() {
				p.mu.Lock()
				sh.retry = nil
				p.growLocked(sh)
				p.mu.Unlock()
			})
		}
	default: // it can never run (ErrNeverFits, bad resources): the tasks waiting fail
		if len(sh.slots) == 0 {
			for _, w := range sh.waiting {
				w.ch <- grant{err: fmt.Errorf("a task worker with %+v: %w", sh.res, err)}
			}
			sh.waiting, sh.nested = nil, 0
		}
	}
}

// giveLocked hands an idle task worker to the first task waiting, or keeps it idle. A
// worker that has just answered (within pipelineWindow) takes the pipelined tasks behind
// that one too, up to taskPipeline; one that never answered, or not lately, takes one: a
// burst of long tasks must not queue behind each other on the first workers while the pool
// starts more.
func (p *taskPool) giveLocked(s *slot) {
	sh := s.sh
	s.failing = false
	if len(sh.waiting) > 0 {
		now := time.Now()
		w := sh.dequeue(0, now)
		s.inflight++
		w.ch <- grant{s: s}
		for now.Sub(s.progress) < pipelineWindow && s.inflight < taskPipeline && len(sh.waiting) > 0 && sh.waiting[0].pipelined {
			w := sh.dequeue(0, now)
			s.inflight++
			w.ch <- grant{s: s}
		}
		return
	}
	s.idleSince = time.Now()
	sh.idle = append(sh.idle, s)
}

// release gives a task worker back after a run in generation gen; failed says its worker
// failed during it (its gang restarts it, and it takes no task before its next generation
// runs).
func (p *taskPool) release(s *slot, failed bool, gen int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	s.inflight--
	if sh := s.sh; !failed {
		sh.account(now)
		if len(sh.waiting) > 0 {
			sh.done++
		}
	}
	s.progress = now
	if failed {
		s.minGen = max(s.minGen, gen+1)
		s.failing = true
	}
	state := s.g.State()
	if p.closed || state == GangFailed || state == GangStopped {
		delete(s.sh.slots, s)
		s.failing = true
		p.growLocked(s.sh)
		return
	}
	if s.inflight == 0 {
		p.giveLocked(s)
		return
	}
	// Busy still: a pipelined task waiting for room takes it.
	if sh := s.sh; !s.failing && s.inflight < taskPipeline {
		for i, w := range sh.waiting {
			if w.pipelined {
				sh.dequeue(i, now)
				s.inflight++
				w.ch <- grant{s: s}
				return
			}
		}
	}
}

// reap stops the task workers idle for longer than the pool's idle time.
func (p *taskPool) reap() {
	t := time.NewTicker(max(p.idle/4, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-p.life.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		var stale []*slot
		p.mu.Lock()
		for _, sh := range p.shapes {
			keep := sh.idle[:0]
			for _, s := range sh.idle {
				if now.Sub(s.idleSince) >= p.idle {
					stale = append(stale, s)
					delete(sh.slots, s)
				} else {
					keep = append(keep, s)
				}
			}
			sh.idle = keep
		}
		p.mu.Unlock()
		for _, s := range stale {
			ctx, cancel := context.WithTimeout(p.life, 10*time.Second)
			if err := s.g.Stop(ctx); err != nil && p.life.Err() == nil {
				p.c.log.Warn("could not stop an idle task worker", zap.String("gang", s.g.key), zap.Error(err))
			}
			cancel()
		}
	}
}
