package sdk

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/atoll-run/atoll/actors"
	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/runtime/objects"
	"github.com/atoll-run/atoll/store/meta"
	"github.com/atoll-run/atoll/store/object"
)

// Job is a submitted job: the root of its gangs, placed actors and tasks. A driver's jobs
// stop when it shuts down.
type Job struct {
	c    *conn
	name string
	// inTask says the job was reached from inside a task (Context.Job on a task worker):
	// its tasks are not pipelined behind others on a leased worker, since a task that
	// waits for a task queued behind itself would wait forever.
	inTask bool
}

// Name is the job's name.
func (j *Job) Name() string { return j.name }

// Strategy is how a gang's members spread over machines, as Ray's placement group
// strategies say it.
type Strategy string

// Placement strategies (GangSpec.Strategy).
const (
	// Pack puts the members on as few machines and NVLink islands as it can: the scheduler's
	// topology-aware placement, also what no strategy gets.
	Pack = Strategy(api.StrategyPack)
	// Spread puts the members on as many machines as it can.
	Spread = Strategy(api.StrategySpread)
	// StrictPack puts every member on one machine, or the gang does not start.
	StrictPack = Strategy(api.StrategyStrictPack)
	// StrictSpread puts every member on a different machine, or the gang does not start.
	StrictSpread = Strategy(api.StrategyStrictSpread)
)

// GangSpec describes a gang of workers placed all-or-nothing.
type GangSpec struct {
	// Name is unique within the job: 1-63 characters of [A-Za-z0-9._-].
	Name string
	// Kind is the registered actor kind of every worker; Args its constructor arguments
	// (of the type its KindOf declared), kept by the runtime and given again on restart.
	Kind string
	Args any
	// Workers is the gang's size: its largest, for an elastic gang.
	Workers int
	// MinWorkers, when set (1..Workers-1), makes the gang elastic: it starts with MinWorkers
	// when only that fits, grows toward Workers when capacity frees and shrinks toward
	// MinWorkers when a more important gang needs room, before anyone evicts it whole. Its
	// driver takes each change at a step boundary (Notices, Yield); its workers learn their
	// new rank and size there (Context.Rank, Size, and Resizer).
	MinWorkers int
	// GPUsPerWorker is how many whole GPUs each worker gets, on one machine; Resources
	// asks for more (a share of a card, a MIG profile, CPU, memory) and wins when set.
	// Neither: CPU-only workers.
	GPUsPerWorker int
	Resources     Resources
	// SameIsland keeps the whole gang inside one NVLink island (AllReduce on NVLink).
	SameIsland bool
	// Strategy spreads or packs the workers over machines (Pack, Spread, StrictPack,
	// StrictSpread); empty: the scheduler's topology-aware placement (Pack).
	Strategy Strategy
	// Machines, when set, pins the workers to these machines (their names, as
	// Cluster.Machines and Placement report them): the gang is placed by its Strategy on
	// them alone, and waits while they are full; none of them in the cluster is
	// ErrNeverFits. It queues, preempts and is preempted like every gang (Ray's hard node
	// affinity).
	Machines []string
	// Priority orders gangs for the scheduler (higher first); PriorityClass names one of
	// the operator's classes instead (atoll queues). A gang of a higher priority preempts
	// lower ones when it does not fit (unless they are NotPreemptible): they are given a
	// notice (Notices), checkpoint, stop, and queue again.
	Priority      int
	PriorityClass string
	// Queue is the operator's queue the gang waits in (empty: the default queue).
	Queue string
	// NotPreemptible keeps the gang from being preempted or shrunk for another.
	NotPreemptible bool
	// CheckpointOnNotice says the driver takes its notices: on a stop notice it checkpoints
	// at once (Checkpoint) and yields (Yield), so a preemption loses no work; the scheduler
	// counts the save, not the lost work, in what evicting it costs.
	CheckpointOnNotice bool
	// CheckpointEvery is how often the driver checkpoints (for what a stop without notice
	// loses); Duration the expected run time (0: unknown), for the queue order.
	CheckpointEvery, Duration time.Duration
	// TimeLimit is an upper bound on the run time (Slurm's --time; 0: none): the
	// scheduler's run-time predictor caps its guesses by it and learns per limit, and
	// backfill relies on it. The gang is held to it: reaching it fails the gang; with
	// CheckpointOnNotice a NoticeTimeLimit comes one notice grace before, and a Yield
	// stops the gang there.
	TimeLimit time.Duration
	// AllReduceBytes is the size of the gang's gradients, for the scheduler's modeled
	// AllReduce time of each candidate placement. Zero: the scheduler's default.
	AllReduceBytes int64
	// MaxRestarts bounds gang restarts within RestartWindow (default 1 minute); past it the
	// gang fails and frees its GPUs. Backoff is the delay before the first restart (default
	// 50 ms), doubling per restart in the window.
	MaxRestarts            int
	RestartWindow, Backoff time.Duration
	// KeepCheckpoints is how many complete checkpoints to keep (default 2).
	KeepCheckpoints int
	// Resume starts the gang from the newest checkpoint an ended gang of the same name
	// left (in this job): the way to carry training on after a driver stopped. Without it
	// those checkpoints are freed, and the gang starts afresh.
	Resume bool
}

// Gang is a gang of workers: this process's view of its record in the cluster's log,
// kept up to date.
type Gang struct {
	c    *conn
	job  string
	name string
	key  string
	size int
	keep int

	mu      sync.Mutex
	rec     api.Gang
	workers map[int]api.Worker // by member index
	// recRev and workerRevs are the log revisions of rec and of each worker (0: the
	// spawn's answer): an older copy never replaces a newer one. One transaction may put a
	// record twice, at one revision: the later put comes later.
	recRev     int64
	workerRevs map[int]int64
	changed    chan struct{}
	gens       map[int]genCtx
	// notices delivers the notices given to the gang (Notices); seen is the newest one's
	// issue time. lastCkpt and lastStep are this process's newest checkpoint of it.
	notices  chan Notice
	seen     time.Time
	lastCkpt time.Time
	lastStep int64
	stop     context.CancelFunc
	done     chan struct{}
	// endedBelow: the generations below it are known to have ended in this process before
	// the log says so (a call answered that its actor failed: a panic ends its incarnation).
	endedBelow int
}

// noteFailed records that generation gen's actor failed (a call's answer said so).
func (g *Gang) noteFailed(gen int) {
	g.mu.Lock()
	g.endedBelow = max(g.endedBelow, gen+1)
	g.mu.Unlock()
}

// firstLive is the first generation not known to have ended.
func (g *Gang) firstLive() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.endedBelow
}

type genCtx struct {
	ctx    context.Context
	cancel context.CancelFunc
}

// newGang returns a handle on a gang that follows its record and workers in the log until
// stop (or the end of the process's connection).
func (c *conn) newGang(job, name string, size, keep int, rec api.Gang) *Gang {
	g := &Gang{c: c, job: job, name: name, key: job + "/" + name, size: size, keep: keep, rec: rec, workers: map[int]api.Worker{}, workerRevs: map[int]int64{},
		changed: make(chan struct{}), gens: map[int]genCtx{}, done: make(chan struct{}), notices: make(chan Notice, 16)}
	wctx, cancel := context.WithCancel(c.life)
	g.stop = cancel
	c.mu.Lock()
	c.gangs[g] = true
	c.mu.Unlock()
	go g.follow(wctx)
	return g
}

// follower is this process's handle on a placed actor's gang (the gang of that UID), made
// on first use.
func (c *conn) follower(job, name, uid string) *Gang {
	key := job + "/" + name
	c.mu.Lock()
	for g := range c.gangs {
		if g.key == key && g.size > 0 && g.uid() == uid {
			c.mu.Unlock()
			return g
		}
	}
	c.mu.Unlock()
	return c.newGang(job, name, 1, 0, api.Gang{UID: uid})
}

// uid is the UID of the gang the handle follows.
func (g *Gang) uid() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.rec.UID
}

// SpawnGang asks the scheduler for the gang's GPUs (all members or none), then waits until
// every worker has started (and been restored from the gang's newest checkpoint, if any).
// A gang that does not fit now waits in its queue, with the scheduler's reason (State,
// Reason), until it is placed or ctx ends (then it is withdrawn). A gang that can never fit
// fails with ErrNeverFits, with the scheduler's numbers; a submission past the cluster's
// bound of waiting gangs with ErrSaturated (RetryAfter says when to try again).
func (j *Job) SpawnGang(ctx context.Context, spec GangSpec) (*Gang, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("sdk: spawn gang %q: %w", spec.Name, err)
	}
	c := j.c
	if spec.KeepCheckpoints == 0 {
		spec.KeepCheckpoints = 2
	}
	if spec.KeepCheckpoints < 0 {
		return nil, fmt.Errorf("%w: gang %q KeepCheckpoints %d is negative", ErrInvalid, spec.Name, spec.KeepCheckpoints)
	}
	if _, ok := c.s.kinds[spec.Kind]; !ok {
		return nil, fmt.Errorf("sdk: gang %q: %w: %q (give it with sdk.Kind to Start/Local/Connect)", spec.Name, ErrUnknownKind, spec.Kind)
	}
	args, err := encodePayload(c.s.codec, spec.Args)
	if err != nil {
		return nil, fmt.Errorf("sdk: gang %q arguments: %w", spec.Name, err)
	}
	res := spec.Resources
	if res == (Resources{}) {
		res.GPUs = spec.GPUsPerWorker
	}
	as := api.GangSpec{Job: j.name, Name: spec.Name, Kind: spec.Kind, Args: args, Workers: spec.Workers, MinWorkers: spec.MinWorkers, Resources: api.Resources(res),
		SameIsland: spec.SameIsland, Strategy: api.Strategy(spec.Strategy), Machines: spec.Machines, Priority: spec.Priority, PriorityClass: spec.PriorityClass, Queue: spec.Queue,
		NotPreemptible: spec.NotPreemptible, JustInTime: spec.CheckpointOnNotice, CheckpointEvery: api.Duration(spec.CheckpointEvery), Duration: api.Duration(spec.Duration), TimeLimit: api.Duration(spec.TimeLimit),
		AllReduceBytes: spec.AllReduceBytes, MaxRestarts: spec.MaxRestarts,
		RestartWindow: api.Duration(spec.RestartWindow), Backoff: api.Duration(spec.Backoff)}
	if err := as.Normalize(); err != nil {
		return nil, err
	}
	if !spec.Resume {
		if err := c.dropEndedCheckpoints(ctx, j.name, spec.Name); err != nil {
			return nil, fmt.Errorf("sdk: gang %q: the checkpoints of an ended gang of its name: %w", spec.Name, err)
		}
	}
	rec, err := c.client.SpawnGang(ctx, as)
	if err != nil {
		if ctx.Err() != nil { // the answer may have been lost after the admission: withdraw
			_ = c.client.StopGang(context.WithoutCancel(ctx), j.name, spec.Name)
		}
		return nil, err
	}
	g := c.newGang(j.name, spec.Name, spec.Workers, spec.KeepCheckpoints, rec)
	if _, err := g.AwaitRunning(ctx, rec.Generation); err != nil {
		if ctx.Err() != nil {
			_ = c.client.StopGang(context.WithoutCancel(ctx), j.name, spec.Name) // free its GPUs
		}
		g.stop()
		return nil, fmt.Errorf("sdk: gang %q did not start: %w", spec.Name, err)
	}
	return g, nil
}

// Gang returns a handle on a gang of the job by name (one spawned earlier, by this process
// or another, or a placed actor's), following its record from now on. It fails with
// ErrNotFound when the job has no such gang.
func (j *Job) Gang(ctx context.Context, name string) (*Gang, error) {
	var rec api.Gang
	found, err := j.c.client.Get(ctx, api.TableGangs+j.name+"/"+name, &rec)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, fmt.Errorf("%w: gang %s/%s", ErrNotFound, j.name, name)
	}
	return j.c.newGang(j.name, name, rec.Spec.Workers, 2, rec), nil
}

// follow keeps the gang's record and workers up to date from the log (through its job's
// feed) until ctx ends.
func (g *Gang) follow(ctx context.Context) {
	defer close(g.done)
	c := g.c
	c.attach(g)
	<-ctx.Done()
	c.detach(g)
	g.mu.Lock()
	for _, gc := range g.gens {
		gc.cancel()
	}
	g.mu.Unlock()
	c.mu.Lock()
	delete(c.gangs, g)
	c.mu.Unlock()
}

func (g *Gang) setRecord(kv meta.KeyValue) {
	if kv.Key != api.TableGangs+g.key {
		return // another gang whose name starts with this one's
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if kv.ModRevision != 0 && kv.ModRevision < g.recRev {
		return // the feed's copy from before (a transaction may put the record twice: the same revision is taken)
	}
	var rec api.Gang
	if json.Unmarshal(kv.Value, &rec) != nil {
		return
	}
	if rec.UID != g.rec.UID || rec.Generation < g.rec.Generation {
		return
	}
	g.rec, g.recRev = rec, kv.ModRevision
	for gen, gc := range g.gens {
		if gen < rec.Generation || !rec.State.Live() {
			gc.cancel()
			delete(g.gens, gen)
		}
	}
	if n := rec.Notice; n != nil && n.Issued.After(g.seen) {
		g.seen = n.Issued
		select {
		case g.notices <- noticeOf(rec):
		default:
			g.c.log.Warn("a gang notice was not taken: its channel is full", zap.String("gang", g.key), zap.String("kind", string(n.Kind)))
		}
	}
	close(g.changed)
	g.changed = make(chan struct{})
}

func (g *Gang) setWorker(kv meta.KeyValue) {
	var w api.Worker
	if json.Unmarshal(kv.Value, &w) != nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if w.GangUID != g.rec.UID {
		return // a worker of an earlier gang of the same names
	}
	if old, ok := g.workers[w.Rank]; ok && (old.Generation > w.Generation || kv.ModRevision != 0 && kv.ModRevision < g.workerRevs[w.Rank]) {
		return
	}
	g.workers[w.Rank] = w
	g.workerRevs[w.Rank] = kv.ModRevision
	close(g.changed)
	g.changed = make(chan struct{})
}

// generationContext is a context cancelled when generation gen of the gang ends.
func (g *Gang) generationContext(gen int) context.Context {
	g.mu.Lock()
	defer g.mu.Unlock()
	if gc, ok := g.gens[gen]; ok {
		return gc.ctx
	}
	ctx, cancel := context.WithCancel(context.Background())
	if gen < g.rec.Generation || !g.rec.State.Live() {
		cancel()
		return ctx
	}
	g.gens[gen] = genCtx{ctx, cancel}
	return ctx
}

// endCause is why generation gen of the gang ended: ErrStale, with ErrStopped or
// ErrGangFailed when the gang ended for good.
func (g *Gang) endCause(gen int) error {
	g.mu.Lock()
	rec := g.rec
	g.mu.Unlock()
	switch rec.State {
	case api.GangStopped:
		return fmt.Errorf("%w: %w: gang %s: %s", ErrStale, ErrStopped, g.key, rec.Reason)
	case api.GangFailed:
		return fmt.Errorf("%w: %w: gang %s: %s", ErrStale, ErrGangFailed, g.key, rec.Reason)
	}
	return fmt.Errorf("%w: gang %s generation %d ended", ErrStale, g.key, gen)
}

// Name is the gang's name.
func (g *Gang) Name() string { return g.name }

// Size is the number of workers: an elastic gang's current size (its world, as its driver
// last took a resize).
func (g *Gang) Size() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.ranksLocked())
}

// ranksLocked maps ranks to member indices: the gang's world, or 0..size-1 before it is
// placed.
func (g *Gang) ranksLocked() []int {
	if r := g.rec.Ranks(); len(r) > 0 {
		return r
	}
	out := make([]int, g.size)
	for i := range out {
		out[i] = i
	}
	return out
}

// member is the member index of a rank (-1 when there is no such rank).
func (g *Gang) member(rank int) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	r := g.ranksLocked()
	if rank < 0 || rank >= len(r) {
		return -1
	}
	return r[rank]
}

// Worker is the address of the worker of the given rank in the gang's current incarnation
// (a zero ActorRef when that worker is not ready).
func (g *Gang) Worker(rank int) ActorRef {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.workerLocked(rank)
}

func (g *Gang) workerLocked(rank int) ActorRef {
	ranks := g.ranksLocked()
	if rank < 0 || rank >= len(ranks) {
		return ActorRef{g: g, job: g.job, gang: g.name, rank: rank, gen: g.rec.Generation}
	}
	return g.memberRefLocked(ranks[rank])
}

// memberRefLocked is the address of a member (by index) of the current incarnation.
func (g *Gang) memberRefLocked(m int) ActorRef {
	w, ok := g.workers[m]
	if !ok || w.Generation != g.rec.Generation {
		return ActorRef{g: g, job: g.job, gang: g.name, rank: m, gen: g.rec.Generation}
	}
	return ActorRef{ref: actors.NewRef(w.Address, w.ActorID), g: g, job: g.job, gang: g.name, rank: m, gen: w.Generation,
		machine: w.Machine, pid: w.PID}
}

// Placement is where the scheduler put the gang (its current incarnation).
func (g *Gang) Placement() Placement {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.rec.Placement == nil {
		return Placement{}
	}
	return fromAPIPlacement(*g.rec.Placement)
}

// Report sends the gang's training progress (the step reached and metrics such as
// "loss") to the leader, which shows the newest on the dashboard and plots them, run by
// run. Reports are kept in the leader's memory only; a report that fails changes nothing
// of the gang (a caller in a training loop may drop it and go on).
func (g *Gang) Report(ctx context.Context, step int64, metrics map[string]float64) error {
	p := api.Progress{Job: g.job, Gang: g.name, Step: step, Metrics: metrics}
	if err := p.Validate(); err != nil {
		return err
	}
	return g.c.client.ReportProgress(ctx, p)
}

// Restarts counts gang restarts so far.
func (g *Gang) Restarts() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.rec.Restarts
}

// Generation is the gang's current incarnation: 0 for a new gang, +1 per restart (a gang
// spawned again under an ended one's name goes on from its number).
func (g *Gang) Generation() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.rec.Generation
}

// GangState is where a gang is.
type GangState string

// Gang states.
const (
	// GangPending: accepted, waiting for capacity (its status's Reason says for what).
	GangPending GangState = "pending"
	// GangStarting: placed; its workers are starting.
	GangStarting GangState = "starting"
	// GangRunning: every worker of its current generation is ready.
	GangRunning GangState = "running"
	// GangRestarting: a worker failed; the gang restarts as its next generation.
	GangRestarting GangState = "restarting"
	// GangFailed: out of restarts (or a permanent error); its GPUs are free.
	GangFailed GangState = "failed"
	// GangStopped: stopped by its driver (or its job ended); its GPUs are free.
	GangStopped GangState = "stopped"
)

// State is the gang's state: pending, starting, running, restarting, failed or stopped.
func (g *Gang) State() GangState {
	g.mu.Lock()
	defer g.mu.Unlock()
	return GangState(g.rec.State)
}

// Err is non-nil once the gang has failed for good (wrapping ErrGangFailed, with the
// reason).
func (g *Gang) Err() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.rec.State == api.GangFailed {
		return fmt.Errorf("%w: %s: %s", ErrGangFailed, g.key, g.rec.Reason)
	}
	return nil
}

// AwaitRunning waits until the gang runs in generation minGen or later (every worker
// started, restored and ready), and returns that generation. It fails when the gang fails
// or stops, or ctx ends.
func (g *Gang) AwaitRunning(ctx context.Context, minGen int) (int, error) {
	for {
		g.mu.Lock()
		rec, ch := g.rec, g.changed
		ranks := g.ranksLocked()
		ready := 0
		for _, m := range ranks {
			if w, ok := g.workers[m]; ok && w.Generation == rec.Generation {
				ready++
			}
		}
		g.mu.Unlock()
		switch {
		case rec.State == api.GangFailed:
			return rec.Generation, fmt.Errorf("%w: %s: %s", ErrGangFailed, g.key, rec.Reason)
		case rec.State == api.GangStopped:
			return rec.Generation, fmt.Errorf("%w: gang %s: %s", ErrStopped, g.key, rec.Reason)
		case rec.State == api.GangRunning && rec.Generation >= minGen && ready == len(ranks):
			return rec.Generation, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return rec.Generation, fmt.Errorf("sdk: gang %s is %s in generation %d (%d of %d workers ready; %s): %w",
				g.key, rec.State, rec.Generation, ready, len(ranks), rec.Reason, ctx.Err())
		}
	}
}

// Kill crashes one worker, as its process dying would (on a cluster its agent kills its
// process; in the embedded default the context of the call it handles ends, and its actor
// fails once that handler returns): the call it was handling fails (ErrActorFailed), and
// the gang restarts all-for-one from its newest checkpoint. For tests and demonstrations.
func (g *Gang) Kill(ctx context.Context, rank int) error {
	c := g.c
	c.mu.Lock()
	h := c.hosted[workerKey(g.job, g.name, g.member(rank))]
	c.mu.Unlock()
	if h != nil {
		return h.Kill()
	}
	p := g.Placement()
	m := g.member(rank)
	if m < 0 || m >= len(p.Members) {
		return fmt.Errorf("%w: gang %s has no rank %d", ErrInvalid, g.key, rank)
	}
	machine := p.Members[m].Machine
	rank = m // the agent knows its workers by member index
	u, err := c.agentURL(ctx, func(m api.Machine) bool { return m.Name == machine })
	if err != nil {
		return fmt.Errorf("sdk: kill rank %d on %s: %w", rank, machine, err)
	}
	return c.agentCall(ctx, u, fmt.Sprintf("/v1/workers/kill?job=%s&gang=%s&rank=%d", g.job, g.name, rank), nil)
}

// Checkpoint asks every worker for its state (Checkpointer.Checkpoint), stores each in its
// machine's object store, and commits them as one checkpoint at step. It commits only once
// every part is durable twice: each worker's store persists its part (fsync'd) before
// answering, and the shared checkpoint directory its machine mounts (agent
// --checkpoint-dir), or else a second machine, takes a durable copy of it; the checkpoint
// records each part's size and checksum. A checkpoint so committed survives the restart
// of any agent, the loss of a machine, and a restart of the whole cluster; a cluster of a
// single machine without a shared directory cannot commit one (ErrNotDurable). Older
// checkpoints beyond KeepCheckpoints are freed (a failure to free one is logged: the
// checkpoint is committed).
func (g *Gang) Checkpoint(ctx context.Context, step int64) error {
	c := g.c
	start := time.Now()
	gen := g.Generation()
	refs := make([]ActorRef, g.Size())
	for r := range refs {
		refs[r] = g.Worker(r)
		if r == 0 {
			gen = refs[0].gen
		} else if refs[r].gen != gen {
			return fmt.Errorf("sdk: checkpoint of gang %q at step %d: %w: its workers are of generations %d and %d (it is restarting)", g.name, step, ErrStale, gen, refs[r].gen)
		}
	}
	futures := make([]*Future[string], len(refs))
	for r, to := range refs {
		futures[r] = CallAsync[string](ctx, c, to, checkpointReq{Step: step})
	}
	ids := make([]string, len(refs))
	var errs []error
	for r, f := range futures {
		id, err := f.Await(ctx)
		if err != nil {
			errs = append(errs, fmt.Errorf("rank %d: %w", r, err))
		}
		ids[r] = id
	}
	freeParts := func() {
		for _, id := range ids {
			if oid, perr := object.ParseID(id); perr == nil {
				_ = c.freeEverywhere(context.WithoutCancel(ctx), c.objects, oid)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		freeParts()
		return fmt.Errorf("sdk: checkpoint of gang %q at step %d: %w", g.name, step, err)
	}
	parts, shared, err := g.replicate(ctx, ids)
	if err != nil {
		freeParts()
		return fmt.Errorf("sdk: checkpoint of gang %q at step %d: %w", g.name, step, err)
	}
	// The save's duration is in the manifest, so that a new leader prices a stop of the
	// gang from the log as the old one did from the report below.
	save := api.Duration(time.Since(start))
	cp := api.Checkpoint{Job: g.job, Gang: g.name, Step: step, Objects: ids, Parts: parts, Copies: 2, Time: time.Now(), Save: save}
	for _, p := range parts {
		cp.Bytes += p.Size
	}
	if len(shared) > 0 && shared[0] != "" && !slices.ContainsFunc(shared, func(d string) bool { return d != shared[0] }) {
		cp.SharedDir = shared[0]
	}
	b, _ := json.Marshal(cp)
	if checkpointCommitHook != nil {
		checkpointCommitHook(g)
	}
	if err := g.commitCheckpoint(ctx, gen, step, b); err != nil {
		if errors.Is(err, ErrStale) {
			freeParts() // never committed: nothing restores from them
		}
		return err
	}
	g.mu.Lock()
	g.lastCkpt, g.lastStep = cp.Time, step
	uid := g.rec.UID
	g.mu.Unlock()
	// The leader counts an eviction's lost work from here, and learns what a save costs.
	if err := c.client.ReportCheckpoint(ctx, api.CheckpointReport{Job: g.job, Gang: g.name, UID: uid, Step: step, At: cp.Time,
		Save: save}); err != nil {
		c.log.Debug("could not report a checkpoint to the leader", zap.String("gang", g.key), zap.Error(err))
	}
	// The checkpoint is committed: a failure to free older ones (a store that does not
	// answer) does not undo it.
	if err := g.prune(ctx); err != nil {
		c.log.Warn("older checkpoints not all freed", zap.String("gang", g.key), zap.Int64("step", step), zap.Error(err))
	}
	return nil
}

// checkpointCommitHook, when set (tests), runs in Checkpoint once the parts are durable,
// before the commit.
var checkpointCommitHook func(*Gang)

// commitCheckpoint commits a checkpoint whose parts the gang's workers of generation gen
// gave, only while the gang is still in that generation: its record is read and the
// checkpoint written in one transaction guarded by the record's version. A gang that
// restarted meanwhile has had its workers restore, each on its own, from the newest
// committed checkpoint; a commit landing among their restores would leave ranks at
// different steps (a stop on notice whose deadline passed while the parts were being
// saved did this), so it is refused with ErrStale and the new generation keeps the
// checkpoint it restored. A change of the record within the generation (a notice, a
// resize) is read again.
func (g *Gang) commitCheckpoint(ctx context.Context, gen int, step int64, cp []byte) error {
	m := g.c.client.Meta()
	gangKey := api.TableGangs + g.key
	for {
		kv, found, err := m.Get(ctx, gangKey)
		if err != nil {
			return fmt.Errorf("sdk: commit checkpoint of gang %q at step %d: %w", g.name, step, err)
		}
		var rec api.Gang
		if found {
			if err := json.Unmarshal(kv.Value, &rec); err != nil {
				return fmt.Errorf("sdk: commit checkpoint of gang %q at step %d: its record: %w", g.name, step, err)
			}
		}
		if !found || rec.Generation != gen || !rec.State.Live() {
			return fmt.Errorf("sdk: checkpoint of gang %q at step %d not committed: %w: the gang left generation %d while its parts were saved (now generation %d, %s); it resumes from an earlier checkpoint",
				g.name, step, ErrStale, gen, rec.Generation, rec.State)
		}
		r, err := m.Txn(ctx, []meta.Compare{{Key: gangKey, Version: kv.Version}},
			[]meta.Op{{Type: meta.OpPut, Key: api.TableCheckpoints + api.CheckpointKey(g.job, g.name, step), Value: cp}})
		if err != nil {
			return fmt.Errorf("sdk: commit checkpoint of gang %q at step %d: %w", g.name, step, err)
		}
		if r.Succeeded {
			return nil
		}
		// The record changed between the read and the commit: read it again.
	}
}

// replicate makes every part of a checkpoint durable twice: the copy its worker put is
// persisted on its machine while a second durable copy is made in the shared checkpoint
// directory that machine mounts, or else on a second machine (another than the writer's,
// spread over the machines by rank), so that the gang restarts from it even when a
// machine of its is lost. It returns the parts as the checkpoint records them, with the
// shared directory of each part's second copy ("" for a second machine), and fails with
// ErrNotDurable when a part cannot be made durable twice.
func (g *Gang) replicate(ctx context.Context, ids []string) ([]api.CheckpointPart, []string, error) {
	c := g.c
	holder := objects.CheckpointOwnerPrefix + g.job + "/" + g.name
	parts := make([]api.CheckpointPart, len(ids))
	shared := make([]string, len(ids)) // the shared directory holding a part's second copy, if any
	errs := make([]error, len(ids))
	var wg sync.WaitGroup
	for r, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			oid, err := object.ParseID(id)
			if err != nil {
				errs[r] = err
				return
			}
			var rec objects.Record
			found, err := c.client.Get(ctx, api.TableObjects+id, &rec)
			switch {
			case err != nil:
				errs[r] = err
				return
			case !found || rec.State != "" || len(rec.Locations) == 0:
				errs[r] = fmt.Errorf("%w: rank %d's part %s has no copy", ErrNotDurable, r, shortID(id))
				return
			}
			in, err := c.makeDurable(ctx, nil, oid, rec.Locations[0], holder, r)
			if err != nil {
				errs[r] = fmt.Errorf("rank %d's part: %w", r, err)
				return
			}
			parts[r] = api.CheckpointPart{ID: id, Size: in.Size, Fingerprint: in.Fingerprint}
			if d, ok := strings.CutPrefix(in.Location, objects.SharedPrefix); ok {
				shared[r] = d
			}
		}()
	}
	wg.Wait()
	return parts, shared, errors.Join(errs...)
}

// prune keeps the newest KeepCheckpoints checkpoints and frees the others' objects.
func (g *Gang) prune(ctx context.Context) error {
	return g.c.dropCheckpoints(ctx, g.job, g.name, g.keep)
}

// dropEndedCheckpoints frees the checkpoints that an ended gang of this name left (none
// when a gang of the name is live: spawning it again fails).
func (c *conn) dropEndedCheckpoints(ctx context.Context, job, name string) error {
	var rec api.Gang
	found, err := c.client.Get(ctx, api.TableGangs+job+"/"+name, &rec)
	if err != nil || (found && rec.State.Live()) {
		return err
	}
	return c.dropCheckpoints(ctx, job, name, 0)
}

// dropCheckpoints keeps a gang's newest keep checkpoints and frees the others.
func (c *conn) dropCheckpoints(ctx context.Context, job, name string, keep int) error {
	kvs, err := c.client.Meta().Range(ctx, api.TableCheckpoints+job+"/"+name+"/")
	if err != nil {
		return err
	}
	var errs []error
	for i := 0; i < len(kvs)-keep; i++ {
		var cp api.Checkpoint
		if err := json.Unmarshal(kvs[i].Value, &cp); err != nil {
			errs = append(errs, fmt.Errorf("checkpoint %s: %w", kvs[i].Key, err))
			continue
		}
		if _, err := c.client.Meta().Delete(ctx, kvs[i].Key); err != nil {
			errs = append(errs, err)
			continue
		}
		for _, id := range cp.Objects {
			if oid, err := object.ParseID(id); err == nil {
				if err := c.freeEverywhere(ctx, c.objects, oid); err != nil && !errors.Is(err, ErrUnknownObject) {
					errs = append(errs, err)
				}
			}
		}
	}
	return errors.Join(errs...)
}

// ReadCheckpoint returns the contents of the gang's complete checkpoint at step (a negative
// step: the newest one whose every part can be read back), one part per rank as each
// worker's Checkpointer.Checkpoint returned it, each checked against the checksum the
// checkpoint recorded, and the step it read. It fails with ErrNotFound when there is no
// such checkpoint, and with ErrObjectLost when a part is gone or does not match.
func (g *Gang) ReadCheckpoint(ctx context.Context, step int64) ([][]byte, int64, error) {
	c := g.c
	var cp api.Checkpoint
	if step < 0 {
		latest, ok, err := c.latestCheckpoint(ctx, g.job, g.name)
		if err != nil {
			return nil, 0, err
		}
		if !ok {
			return nil, 0, fmt.Errorf("%w: gang %s has no checkpoint", ErrNotFound, g.key)
		}
		cp = latest
	} else {
		found, err := c.client.Get(ctx, api.TableCheckpoints+api.CheckpointKey(g.job, g.name, step), &cp)
		if err != nil {
			return nil, 0, err
		}
		if !found {
			return nil, 0, fmt.Errorf("%w: gang %s has no checkpoint at step %d", ErrNotFound, g.key, step)
		}
	}
	parts := make([][]byte, len(cp.Objects))
	for r, id := range cp.Objects {
		b, err := Get(ctx, c, Ref[[]byte]{ID: id})
		if err != nil {
			return nil, cp.Step, fmt.Errorf("sdk: checkpoint of gang %s at step %d, rank %d: %w", g.key, cp.Step, r, err)
		}
		if err := checkPart(cp, r, b); err != nil {
			return nil, cp.Step, fmt.Errorf("sdk: gang %s: %w", g.key, err)
		}
		parts[r] = b
	}
	return parts, cp.Step, nil
}

// LatestCheckpoint is the step of the gang's newest complete checkpoint.
func (g *Gang) LatestCheckpoint(ctx context.Context) (int64, bool, error) {
	cp, ok, err := g.c.latestCheckpoint(ctx, g.job, g.name)
	return cp.Step, ok, err
}

// DropCheckpoints frees every checkpoint of the gang, its records and every copy of its
// parts, and the parts of checkpoints that were never committed (a checkpoint cut short by
// a stop: its workers had put their parts): for a gang whose work is done. Checkpoints
// outlive their gang and job (a gang of the same name resumes from them), and their
// durable copies hold disk and, in the pools, the machines that keep the last copy of a
// part.
func (g *Gang) DropCheckpoints(ctx context.Context) error {
	c := g.c
	err := c.dropCheckpoints(ctx, g.job, g.name, 0)
	// What is left under the gang's checkpoint owner belongs to no checkpoint.
	holder := objects.CheckpointOwnerPrefix + g.job + "/" + g.name
	l, lerr := c.client.List(ctx, api.TableObjects)
	if lerr != nil {
		err = errors.Join(err, lerr)
	}
	for _, kv := range l.KVs {
		var rec objects.Record
		if json.Unmarshal(kv.Value, &rec) != nil || rec.Owner != holder || rec.State != "" {
			continue
		}
		if oid, perr := object.ParseID(rec.ID); perr == nil {
			if ferr := c.freeEverywhere(ctx, c.objects, oid); ferr != nil && !errors.Is(ferr, ErrUnknownObject) {
				err = errors.Join(err, ferr)
			}
		}
	}
	if err != nil {
		return fmt.Errorf("sdk: drop the checkpoints of gang %s: %w", g.key, err)
	}
	return nil
}

// Stop stops the gang's workers and frees its GPUs.
func (g *Gang) Stop(ctx context.Context) error {
	err := g.c.client.StopGang(ctx, g.job, g.name)
	if err == nil {
		g.stopped("stopped by its driver")
	}
	g.stop()
	return err
}

// stopped records, in this process, that the head committed the gang's stop: calls to its
// workers fail from now on with ErrStale (ErrStopped), though the agents may take a moment
// to stop them.
func (g *Gang) stopped(reason string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.rec.State.Live() {
		return
	}
	g.rec.State, g.rec.Reason = api.GangStopped, reason
	for gen, gc := range g.gens {
		gc.cancel()
		delete(g.gens, gen)
	}
	close(g.changed)
	g.changed = make(chan struct{})
}

// Stop stops the job's gangs, placed actors and task workers (freeing their GPUs), frees
// the objects its tasks put, and stops the job. Detached actors live on.
func (j *Job) Stop(ctx context.Context) error {
	c := j.c
	c.closePool(j.name)
	err := c.client.StopJob(ctx, j.name)
	c.mu.Lock()
	var mine []*Gang
	for g := range c.gangs {
		if g.job == j.name {
			mine = append(mine, g)
		}
	}
	c.mu.Unlock()
	for _, g := range mine {
		if err == nil {
			g.stopped("its job stopped")
		}
		g.stop()
	}
	return errors.Join(err, c.endOwnedBy(ctx, jobOwner(j.name)))
}

// WorkerInfo is where a gang member runs: its machine, its process, its actor.
type WorkerInfo struct {
	Job        string `json:"job"`
	Gang       string `json:"gang"`
	Rank       int    `json:"rank"`
	Generation int    `json:"generation"`
	// GangUID tells the gang from an earlier one of the same job and gang names.
	GangUID string `json:"gang_uid"`
	Machine string `json:"machine"`
	// Address is the worker's actor system (host:port, or "nonhost" for a worker inside
	// the driver's process); ActorID its actor's id there.
	Address string `json:"address"`
	ActorID string `json:"actor_id"`
	// Collective is the id of the worker's collective endpoint actor, on the same system.
	Collective string `json:"collective,omitempty"`
	// Transfer is where the worker serves its collective chunks (host:port), if it does.
	Transfer string `json:"transfer,omitempty"`
	// PID is the worker's process id; Started when it became ready.
	PID     int       `json:"pid"`
	Started time.Time `json:"started"`
	// Exit, for a process gang's member that ended without failing: "completed" (status
	// 0) or "yielded" (its yield code after a notice).
	Exit string `json:"exit,omitempty"`
}

// Workers describes the workers of the gang's current incarnation that are ready, by rank.
func (g *Gang) Workers() []WorkerInfo {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []WorkerInfo
	for _, m := range g.ranksLocked() {
		if w, ok := g.workers[m]; ok && w.Generation == g.rec.Generation {
			out = append(out, fromAPIWorker(w))
		}
	}
	return out
}
