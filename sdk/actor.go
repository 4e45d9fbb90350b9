package sdk

import (
	"bytes"
	"context"
	"encoding/gob"
	"errors"
	"fmt"
	"os"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/atoll-run/atoll/actors"
	"github.com/atoll-run/atoll/runtime/coll"
)

// Actor is what an actor kind implements. Receive handles one message at a time; its return
// values answer a Call. ctx carries the call's deadline and is cancelled when the caller
// gives up, even from another process. A panic fails the actor; in a gang every worker
// restarts together (from the newest checkpoint).
type Actor interface {
	Receive(ctx *Context, msg any) (any, error)
}

// Checkpointer is implemented by workers whose state survives restarts: Checkpoint returns
// the state to save (Gang.Checkpoint saves every worker's as one committed checkpoint),
// and Restore is called with that state at (re)start when the gang has a checkpoint.
type Checkpointer interface {
	Checkpoint() ([]byte, error)
	Restore(state []byte) error
}

// Starter is implemented by actors that set up state when they start (after Restore).
type Starter interface {
	Start(ctx *Context) error
}

// follow is the generation of a ref that addresses whichever incarnation of a placed actor
// is current (a handle, as Ray's actor handles are), not one incarnation.
const follow = -1

// ActorRef addresses an actor. It is a small value that crosses processes: put it in
// messages, constructor arguments and objects.
//
// A gang worker's ref (Gang.Worker) belongs to one incarnation of its gang: a call through
// it fails with ErrStale once that incarnation has ended. A placed actor's ref
// (Job.SpawnActor, Lookup) is a handle: each call goes to the actor's current incarnation,
// waiting while it restarts.
type ActorRef struct {
	ref     actors.Ref
	job     string // a placed actor's or a gang worker's job and gang ("" for an actor of Cluster.Spawn)
	gang    string
	rank    int
	gen     int // the incarnation addressed, or follow
	machine string
	pid     int
	uid     string // a placed actor's gang's UID: the actor, not a later one of its name
	g       *Gang  // this process's handle on the gang, when it has one
}

// ID is the actor's id in its process ("digits/dp.g0/w3": job, gang and generation,
// worker).
func (r ActorRef) ID() string { return r.ref.ID() }

// Name is the name Lookup finds a placed actor by ("job/name", or the name alone for a
// detached actor), and "job/gang/rank" for a gang worker; "" for an actor of
// Cluster.Spawn.
func (r ActorRef) Name() string {
	switch {
	case r.job == "":
		return ""
	case r.gen == follow && isDetachedJob(r.job):
		return r.gang
	case r.gen == follow:
		return r.job + "/" + r.gang
	}
	return fmt.Sprintf("%s/%s/%d", r.job, r.gang, r.rank)
}

// String describes the actor as a person reads it: "worker 3 of gang digits/dp
// (generation 0) on machine dgx-h100-1", "actor train/ps", "actor solo in process 4242".
func (r ActorRef) String() string {
	where := ""
	if r.machine != "" {
		where = " on machine " + r.machine
	}
	switch {
	case r.IsZero() && r.job == "":
		return "no actor"
	case r.gen == follow:
		return "actor " + r.Name() + where
	case r.job != "":
		return fmt.Sprintf("worker %d of gang %s/%s (generation %d)%s", r.rank, r.job, r.gang, r.gen, where)
	case r.pid != 0:
		return fmt.Sprintf("actor %s in process %d", r.ref.ID(), r.pid)
	}
	return "actor " + r.ref.String()
}

// IsZero reports whether the ref addresses nothing.
func (r ActorRef) IsZero() bool { return r.ref.IsZero() && r.gen != follow }

// actorRefWire is an ActorRef as it crosses a process.
type actorRefWire struct {
	Address, ID, Job, Gang, Machine, UID string
	Rank, Gen, PID                       int
}

// GobEncode implements gob.GobEncoder: a ref crosses processes in messages and objects.
func (r ActorRef) GobEncode() ([]byte, error) {
	var buf bytes.Buffer
	err := gob.NewEncoder(&buf).Encode(actorRefWire{Address: r.ref.Address(), ID: r.ref.ID(), Job: r.job, Gang: r.gang,
		Machine: r.machine, UID: r.uid, Rank: r.rank, Gen: r.gen, PID: r.pid})
	return buf.Bytes(), err
}

// GobDecode implements gob.GobDecoder.
func (r *ActorRef) GobDecode(b []byte) error {
	var w actorRefWire
	if err := gob.NewDecoder(bytes.NewReader(b)).Decode(&w); err != nil {
		return err
	}
	*r = ActorRef{job: w.Job, gang: w.Gang, machine: w.Machine, uid: w.UID, rank: w.Rank, gen: w.Gen, pid: w.PID}
	if w.ID != "" {
		r.ref = actors.NewRef(w.Address, w.ID)
	}
	return nil
}

// Caller is who makes a call: the driver (*Cluster) or an actor (*Context).
type Caller interface {
	conn() *conn
}

// Future is a result in flight: a call's reply or a task's result. It may be awaited any
// number of times, from any number of goroutines; every Await sees the same result.
type Future[Resp any] struct {
	direct *actors.Future[Resp] // a call that went out at once

	done chan struct{} // otherwise: completed by the goroutine that resolves it
	once sync.Once
	val  Resp
	err  error
}

func newFuture[Resp any]() *Future[Resp] { return &Future[Resp]{done: make(chan struct{})} }

func (f *Future[Resp]) complete(v Resp, err error) {
	f.once.Do(func() {
		f.val, f.err = v, err
		close(f.done)
	})
}

// Await waits for the result within ctx (ctx bounds only this wait; the call or task
// itself is bounded by the context that started it).
func (f *Future[Resp]) Await(ctx context.Context) (Resp, error) {
	if f.direct != nil {
		return f.direct.Await(ctx)
	}
	select {
	case <-f.done:
		return f.val, f.err
	default:
	}
	select {
	case <-f.done:
		return f.val, f.err
	case <-ctx.Done():
		var zero Resp
		return zero, fmt.Errorf("sdk: await: %w", ctx.Err())
	}
}

// Done is closed once the result (or the error) is known.
func (f *Future[Resp]) Done() <-chan struct{} {
	if f.direct != nil {
		return f.direct.Done()
	}
	return f.done
}

// Waitable is anything Wait can wait for: every *Future.
type Waitable interface {
	Done() <-chan struct{}
}

// Wait waits until n of the futures are ready (or ctx ends) and returns the indexes of n
// ready ones and of the rest, in order, as Ray's ray.wait does with num_returns: exactly n
// ready, even when more are (those already ready when it is called come first, in order;
// the others in the order they became ready), the rest pending. n larger than the number
// of futures means all of them. Awaiting a ready future then returns at once.
func Wait[W Waitable](ctx context.Context, futures []W, n int) (ready, pending []int, err error) {
	n = min(n, len(futures))
	cases := make([]reflect.SelectCase, 0, len(futures)+1)
	idx := make([]int, 0, len(futures))
	done := make([]bool, len(futures))
	count := 0
	for i, f := range futures {
		select {
		case <-f.Done():
			if count < n { // exactly n: the first ready ones, as ray.wait's num_returns
				done[i] = true
				count++
			}
		default:
			cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(f.Done())})
			idx = append(idx, i)
		}
	}
	cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ctx.Done())})
	for count < n {
		chosen, _, _ := reflect.Select(cases)
		if chosen == len(cases)-1 {
			err = fmt.Errorf("sdk: wait for %d of %d futures (%d ready): %w", n, len(futures), count, ctx.Err())
			break
		}
		done[idx[chosen]] = true
		count++
		cases = append(cases[:chosen], cases[chosen+1:]...)
		idx = append(idx[:chosen], idx[chosen+1:]...)
	}
	for i := range futures {
		if done[i] {
			ready = append(ready, i)
		} else {
			pending = append(pending, i)
		}
	}
	return ready, pending, err
}

// CallAsync sends req to the actor and returns at once with a Future for its reply of type
// Resp. ctx bounds and cancels the call (the handler's context is cancelled with it).
func CallAsync[Resp any](ctx context.Context, h Caller, to ActorRef, req any) *Future[Resp] {
	c := h.conn()
	if to.gen != follow {
		return callIncarnation[Resp](ctx, c, to, req, false)
	}
	// A placed actor: its current incarnation, once it runs.
	g := to.g
	if g == nil {
		g = c.follower(to.job, to.gang, to.uid)
	}
	f := newFuture[Resp]()
	spawn(func() { f.complete(callPlaced[Resp](ctx, c, g, to, req)) })
	return f
}

// callPlaced calls a placed actor's current incarnation once it runs. A call that never
// reached an incarnation (it had just failed, or its gang was restarting) goes to the next
// one, within ctx's deadline (the connection's call timeout when it has none); a call to a
// stopped or failed actor fails with ErrActorDead.
func callPlaced[Resp any](ctx context.Context, c *conn, g *Gang, to ActorRef, req any) (Resp, error) {
	var zero Resp
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.s.callTimeout)
		defer cancel()
	}
	minGen := 0
	for {
		gen, err := g.AwaitRunning(ctx, max(minGen, g.firstLive()))
		if err != nil {
			if errors.Is(err, ErrStopped) || errors.Is(err, ErrGangFailed) {
				err = fmt.Errorf("%w: %w", ErrActorDead, err)
			}
			return zero, fmt.Errorf("sdk: call %s: %w", to, err)
		}
		cur := g.Worker(to.rank)
		if cur.ref.IsZero() || cur.gen < gen {
			minGen = gen + 1 // its worker's record is of an older incarnation: the next
			continue
		}
		v, err := callIncarnation[Resp](ctx, c, cur, req, true).Await(context.WithoutCancel(ctx))
		if errors.Is(err, actors.ErrAnswererFailed) {
			// Its incarnation failed (a panic ends it): the next call waits for the next one,
			// though the log may not say so yet.
			g.noteFailed(cur.gen)
		}
		if err == nil || !errors.Is(err, actors.ErrNotDelivered) || ctx.Err() != nil {
			return v, err
		}
		minGen = cur.gen + 1
	}
}

// callIncarnation calls one incarnation of an actor: a call to a gang worker ends with its
// generation (ErrStale).
// placed says it is a placed actor's incarnation (see callPlaced).
func callIncarnation[Resp any](ctx context.Context, c *conn, to ActorRef, req any, placed bool) *Future[Resp] {
	if to.ref.IsZero() && to.job != "" {
		f := newFuture[Resp]()
		var zero Resp
		f.complete(zero, fmt.Errorf("%w: %s is not ready (its gang is starting or restarting)", actors.ErrNotDelivered, to))
		return f
	}
	if to.g == nil || to.job == "" {
		return &Future[Resp]{direct: actors.CallAsync[Resp](ctx, c.sys, to.ref, req)}
	}
	// A gang worker: the call ends with its incarnation (ErrStale). A worker whose process
	// went away is most often one its agent stopped because the gang restarts: the caller
	// learns it from the log within moments, and says ErrStale rather than ErrActorDead.
	gctx := to.g.generationContext(to.gen)
	if gctx.Err() != nil { // never sent: the incarnation had ended
		f := newFuture[Resp]()
		var zero Resp
		f.complete(zero, fmt.Errorf("sdk: call %s: %w (%w)", to, to.g.endCause(to.gen), actors.ErrNotDelivered))
		return f
	}
	cctx, ccancel := context.WithCancelCause(ctx)
	var stop func() bool
	if placed {
		// A placed actor's call waits a moment for its own answer when the incarnation ends
		// (its actor stopped: a dead letter says the call never reached it, and the caller
		// sends it to the next incarnation).
		stop = context.AfterFunc(gctx, func() {
			t := time.NewTimer(placedGrace)
			defer t.Stop()
			select {
			case <-cctx.Done():
			case <-t.C:
				ccancel(to.g.endCause(to.gen))
			}
		})
	} else {
		stop = context.AfterFunc(gctx, func() { ccancel(to.g.endCause(to.gen)) })
	}
	inner := actors.CallAsync[Resp](cctx, c.sys, to.ref, req)
	f := newFuture[Resp]()
	spawn(func() {
		defer func() { stop(); ccancel(nil) }()
		v, err := inner.Await(context.WithoutCancel(cctx))
		if err != nil && errors.Is(err, ErrActorDead) && !errors.Is(err, ErrStale) {
			t := time.NewTimer(staleGrace)
			defer t.Stop()
			select {
			case <-gctx.Done():
				err = fmt.Errorf("%w (%w)", to.g.endCause(to.gen), err)
			case <-t.C:
			case <-ctx.Done():
			}
		}
		f.complete(v, err)
	})
	return f
}

// placedGrace bounds how long a call to a placed actor's incarnation that has ended waits
// for its own answer (a dead letter, most often) before it fails with ErrStale.
const placedGrace = 2 * time.Second

// Call sends req to the actor and waits for its reply of type Resp within ctx. It fails
// fast with ErrActorDead when the actor is gone, and with ErrStale when it was a worker of
// a gang incarnation that has ended.
func Call[Resp any](ctx context.Context, h Caller, to ActorRef, req any) (Resp, error) {
	return CallAsync[Resp](ctx, h, to, req).Await(context.WithoutCancel(ctx))
}

// Send delivers msg to the actor without waiting for a reply (to a placed actor: to its
// current incarnation, if it runs).
func Send(h Caller, to ActorRef, msg any) error {
	if to.gen == follow {
		g := to.g
		if g == nil {
			g = h.conn().follower(to.job, to.gang, to.uid)
		}
		to = g.Worker(to.rank)
	}
	return actors.Send(h.conn().sys, to.ref, msg)
}

// Member is where one gang member runs and what it holds there.
type Member struct {
	// Machine is the machine's name.
	Machine string `json:"machine"`
	// GPUs are the member's card indices on its machine; UUIDs their UUIDs (NVML's, or
	// "GPU-sim-..." on simulated machines).
	GPUs  []int    `json:"gpus"`
	UUIDs []string `json:"uuids,omitempty"`
	// Islands are the global NVLink island ids of those cards.
	Islands []int `json:"islands,omitempty"`
	// Milli is the member's share of its card (1..999) when it holds a fraction of one.
	Milli int `json:"milli,omitempty"`
	// MIG is the MIG profile of the slice group it holds, if any.
	MIG string `json:"mig,omitempty"`
	// CPUMilli and MemMiB are the CPU (in thousandths of a core) and memory it reserves.
	CPUMilli int64 `json:"cpu_milli,omitempty"`
	MemMiB   int64 `json:"mem_mib,omitempty"`
	// Removed marks a member an elastic gang shrank away: its slot stays (members keep
	// their index for life) but nothing runs there.
	Removed bool `json:"removed,omitempty"`
	// GPUModel is the model of its cards (with a " (simulated)" suffix on a declared
	// machine).
	GPUModel string `json:"gpu_model,omitempty"`
}

// Placement is where the scheduler put a gang.
type Placement struct {
	// Members, by index: for a gang of fixed size its rank; an elastic gang's grows are
	// appended and its shrinks marked Removed.
	Members []Member `json:"members"`
	// Islands counts the distinct NVLink islands the gang spans; Machines lists its
	// machines.
	Islands  int      `json:"islands"`
	Machines []string `json:"machines"`
	// Scores are the scheduler's per-plugin scores, "total", and "allreduce_us", the
	// modeled AllReduce time of the placement.
	Scores map[string]float64 `json:"scores,omitempty"`
}

// Resources is what one gang member, placed actor or task asks for. The zero value asks
// for nothing: a CPU-only member that reserves no CPU.
type Resources struct {
	// GPUs is the number of whole cards, on one machine. With GPUMilli in 1..999 (and GPUs
	// 1): that share of one card, which other members share.
	GPUs     int
	GPUMilli int
	// MIG is a MIG profile ("1g.10gb", "3g.40gb", ...): one slice group of a MIG-enabled card.
	MIG string
	// CPUMilli is CPU in thousandths of a core; MemMiB host memory.
	CPUMilli int64
	MemMiB   int64
}

// Context is what an actor sees while it handles a message: the message's context (its
// caller's deadline and cancellation), its place in its gang, and the cluster (calls,
// spawns, tasks, puts and gets go through it, from the actor's own process and machine).
// It is valid only inside the actor's methods.
type Context struct {
	context.Context
	ac      *actors.Context
	c       *conn
	w       *hosted // nil for an actor of Cluster.Spawn
	restore int64
	owner   string      // who owns the objects it puts, when not the actor itself (a task's job)
	log     *zap.Logger // nil: the actor's own
}

func (c *Context) conn() *conn { return c.c }

func (c *Context) store() objectHost {
	st := c.c.objects
	if c.w != nil {
		st = c.w.store
	}
	if c.owner != "" {
		return ownedStore{objectHost: st, holder: c.owner}
	}
	return st
}

// Rank is the worker's rank in its gang (0..Size-1), or -1 for an actor of Cluster.Spawn.
// An elastic gang's ranks change when it resizes (see Resizer).
func (c *Context) Rank() int {
	if c.w == nil {
		return -1
	}
	return c.w.rank()
}

// Size is the gang's size (1 for a placed actor, a task or an actor of Cluster.Spawn): an
// elastic gang's current size.
func (c *Context) Size() int {
	if c.w == nil {
		return 1
	}
	_, members := c.w.world()
	return len(members)
}

// Self is the actor's own address.
func (c *Context) Self() ActorRef {
	if c.w == nil {
		return ActorRef{ref: c.ac.Self(), pid: os.Getpid()}
	}
	s := c.w.spec
	return ActorRef{ref: c.ac.Self(), job: s.Job, gang: s.Gang, rank: s.Rank, gen: s.Generation, machine: s.Machine}
}

// Job is the job the actor belongs to: it spawns gangs, placed actors and tasks from inside
// the actor. Nil for an actor of Cluster.Spawn, which belongs to no job.
func (c *Context) Job() *Job {
	if c.w == nil {
		return nil
	}
	return &Job{c: c.c, name: c.w.spec.Job, inTask: c.w.spec.Kind == taskKind}
}

// Logger is the actor's logger; a gang worker's names its job, gang, rank and generation
// in every line. In a worker process an agent started, it writes JSON lines to the
// process's stderr (unless WithLogger gave WorkerMain another logger): the worker's log
// on its agent, which atoll logs JOB --rank N prints.
func (c *Context) Logger() *zap.Logger {
	if c.log != nil {
		return c.log
	}
	return c.ac.Logger()
}

// Generation is the gang incarnation this worker belongs to: 0 for a new gang, +1 per
// restart (and a gang spawned again under an ended one's name goes on from its number).
func (c *Context) Generation() int {
	if c.w == nil {
		return 0
	}
	return c.w.spec.Generation
}

// RestoredStep is the step of the checkpoint this worker was restored from, and whether it
// was restored at all.
func (c *Context) RestoredStep() (int64, bool) { return c.restore, c.restore >= 0 }

// Placement is where this worker runs: its machine and its GPUs. An actor of
// Cluster.Spawn runs in its driver's process, with no GPU.
func (c *Context) Placement() Member {
	if c.w == nil {
		return Member{}
	}
	return fromAPIMember(c.w.spec.Member)
}

// AllReduce sums data element-wise across every worker of the gang, in place: workers of
// one machine (a process each) sum through the machine's shared memory and one leader per
// machine runs a ring with the other machines' over the transfer plane (mutual TLS);
// workers without such company take a flat ring (in memory between workers of one
// process, over the transfer plane between processes). Every worker must call it with a slice of the same length. It fails
// with ErrStale when a member has failed (the gang is restarting), names the ranks it waits
// for when ctx ends first, and honours ctx.
func (c *Context) AllReduce(ctx context.Context, data []float32) error {
	if c.w == nil {
		return ErrNotInGang
	}
	return c.w.allReduce(ctx, data)
}

// AllGather fills every worker's shard of data (Shard) with its owner's, in place: on
// entry each worker's data holds its own shard, on return every shard. Every worker must
// call it with a slice of the same length. Placement, errors and ctx as AllReduce.
func (c *Context) AllGather(ctx context.Context, data []float32) error {
	if c.w == nil {
		return ErrNotInGang
	}
	return c.w.collective(ctx, func(m *coll.Member) error { return m.AllGather(ctx, data) })
}

// ReduceScatter sums data element-wise across every worker of the gang and leaves each
// worker its own shard of the sum (Shard): on return data[lo:hi] of this worker's shard
// holds it, the rest of data is scratch. Every worker must call it with a slice of the
// same length. Placement, errors and ctx as AllReduce.
func (c *Context) ReduceScatter(ctx context.Context, data []float32) error {
	if c.w == nil {
		return ErrNotInGang
	}
	return c.w.collective(ctx, func(m *coll.Member) error { return m.ReduceScatter(ctx, data) })
}

// Broadcast copies the data of the worker of rank root to every worker's, in place. Every
// worker must call it with the same root and a slice of the same length. Placement,
// errors and ctx as AllReduce.
func (c *Context) Broadcast(ctx context.Context, root int, data []float32) error {
	if c.w == nil {
		return ErrNotInGang
	}
	return c.w.collective(ctx, func(m *coll.Member) error { return m.Broadcast(ctx, root, data) })
}

// Barrier returns once every worker of the gang has called it. Errors and ctx as
// AllReduce.
func (c *Context) Barrier(ctx context.Context) error {
	if c.w == nil {
		return ErrNotInGang
	}
	return c.w.collective(ctx, func(m *coll.Member) error { return m.Barrier(ctx) })
}

// Shard is the part [lo, hi) of a slice of length floats that the worker of a rank owns
// in AllGather and ReduceScatter: the slice cut into Size nearly equal, consecutive parts.
func (c *Context) Shard(length, rank int) (lo, hi int) {
	n := c.Size()
	return rank * length / n, (rank + 1) * length / n
}

// Spawn starts an actor of a kind in this process (the driver's), named name (unique
// among this process's actors; empty: a generated name), with its constructor arguments
// (nil: the zero value). It can call, put and get like any actor, and other processes
// reach it through its ref; it ends with this process. Job.SpawnActor places an actor on a
// machine of the cluster instead, with resources, restarts and a name others look up.
func (c *Cluster) Spawn(ctx context.Context, kind, name string, args any) (ActorRef, error) {
	kd, ok := c.c.s.kinds[kind]
	if !ok {
		return ActorRef{}, fmt.Errorf("sdk: spawn %q: %w: %q", name, ErrUnknownKind, kind)
	}
	p, err := encodePayload(c.c.s.codec, args)
	if err != nil {
		return ActorRef{}, fmt.Errorf("sdk: spawn %q arguments: %w", name, err)
	}
	a, err := kd.make(p)
	if err != nil {
		return ActorRef{}, err
	}
	j, err := c.c.sys.Job("actors")
	if err != nil {
		return ActorRef{}, err
	}
	if name == "" {
		name = fmt.Sprintf("%s-%d", kind, spawnSeq.Add(1))
	}
	g, err := j.SpawnGroup(ctx, actors.GroupSpec{Name: name, Members: []actors.MemberSpec{{Name: "a", Kind: kind, Index: -1,
		Producer: func() actors.Handler { return &cell{c: c.c, user: a} }}}})
	if err != nil {
		return ActorRef{}, err
	}
	if err := g.AwaitStarted(ctx); err != nil {
		return ActorRef{}, err
	}
	return ActorRef{ref: g.Member(0), pid: os.Getpid()}, nil
}

var spawnSeq atomic.Int64
