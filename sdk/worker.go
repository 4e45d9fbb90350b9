package sdk

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/atoll-run/atoll/actors"
	"github.com/atoll-run/atoll/internal/cudactx"
	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/runtime/authz"
	"github.com/atoll-run/atoll/runtime/coll"
	"github.com/atoll-run/atoll/runtime/objects"
	"github.com/atoll-run/atoll/sdk/internal/embed"
	"github.com/atoll-run/atoll/store/meta"
	"github.com/atoll-run/atoll/store/object"
)

// hosted is one gang worker hosted by this process: in a worker process (the only one), or
// in the driver's process in the embedded default.
type hosted struct {
	c     *conn
	spec  api.WorkerSpec
	store objectHost
	log   *zap.Logger
	group *actors.Group
	name  string
	ref   actors.Ref

	permanent bool // its actor could not be made (unknown kind, bad arguments)

	mu      sync.Mutex
	member  *coll.Member
	forming *formation // the current (or last) world's communicator while it forms
	skipped int        // collectives of the current world given up while it formed
	done    chan struct{}
	err     error
	ended   bool
	// epoch and members are the gang's world as this worker's program sees it (member
	// indices in rank order): an elastic gang's changes at each resize its driver takes.
	epoch   int
	members []int
	// svcLoad counts a service replica's calls (service.go); waiting counts the calls in
	// its actor's mailbox (set when the actor starts).
	svcLoad serviceLoad
	waiting atomic.Pointer[func() int]
}

var _ embed.Handle = (*hosted)(nil)

// permanentError marks an error a restart cannot cure.
type permanentError struct{ error }

func (permanentError) Permanent() bool { return true }
func (e permanentError) Unwrap() error { return e.error }

// host starts the worker's actor (restored from the gang's newest checkpoint), then tells
// the leader it is ready.
func (c *conn) host(ctx context.Context, spec api.WorkerSpec, store objectHost) (*hosted, error) {
	kd := c.s.kinds[spec.Kind]
	if kd == nil {
		known := make([]string, 0, len(c.s.kinds))
		for k := range c.s.kinds {
			known = append(known, k)
		}
		return nil, permanentError{fmt.Errorf("%w: %q is not a kind of this program (its kinds: %v): give it with sdk.Kind to Start/Local/Connect", ErrUnknownKind, spec.Kind, known)}
	}
	job, err := c.sys.Job(spec.Job)
	if err != nil {
		return nil, err
	}
	h := &hosted{c: c, spec: spec, store: store, done: make(chan struct{}), log: c.log}
	if !c.workerProc { // a worker process's logger names its worker already
		h.log = c.log.With(workerFields(spec)...)
	}
	h.initWorld()
	prod := func() actors.Handler {
		a, err := kd.make(spec.Args)
		if err != nil {
			h.permanent = true
		}
		return &cell{h: h, c: c, user: a, makeErr: err}
	}
	c.mu.Lock()
	c.hosted[workerKey(spec.Job, spec.Gang, spec.Rank)] = h
	c.mu.Unlock()
	gname := fmt.Sprintf("%s.g%d", spec.Gang, spec.Generation)
	h.group, err = job.EnsureGroup(ctx, actors.GroupSpec{Name: gname, OnFailure: func(f actors.Failure) {
		c.mu.Lock()
		w := c.hosted[workerKey(spec.Job, spec.Gang, f.Index)]
		c.mu.Unlock()
		if w != nil && w.spec.Generation == spec.Generation {
			w.exit(fmt.Errorf("worker %d failed: %v", f.Index, f.Reason))
		}
	}})
	if err != nil {
		h.forget()
		return nil, err
	}
	h.name = fmt.Sprintf("w%d", spec.Rank)
	ref, err := h.group.Add(ctx, actors.MemberSpec{Name: h.name, Kind: spec.Kind, Producer: prod, Index: spec.Rank})
	if err == nil {
		err = h.group.AwaitMember(ctx, h.name)
	}
	if err != nil {
		_ = h.group.StopMember(context.WithoutCancel(ctx), h.name)
		h.forget()
		if h.permanent {
			return nil, permanentError{err}
		}
		return nil, err
	}
	h.ref = ref
	w := api.Worker{Job: spec.Job, Gang: spec.Gang, Rank: spec.Rank, Generation: spec.Generation, GangUID: spec.GangUID, Machine: spec.Machine,
		Address: c.sys.Address(), ActorID: ref.ID(), PID: os.Getpid(), Started: time.Now()}
	if !c.agentAnnounces {
		if err := c.client.WorkerReady(ctx, w); err != nil {
			h.stop()
			return nil, err
		}
	}
	h.log.Debug("worker ready", zap.String("actor", w.ActorID), zap.String("address", w.Address))
	if h.rank() == 0 && spec.Member.GPUModel != "" && !spec.Driver {
		go h.measureCUDA()
	}
	if isServiceReplica(spec) {
		go h.reportLoad()
	}
	return h, nil
}

// measureCUDA measures what creating a CUDA context costs on the worker's GPU and reports
// it: nothing on a simulated GPU (there is no context to create: 0 is what a restart pays
// for it there), the driver's own time on a real one (with -tags nvml; a build without
// says so in the log and reports nothing).
func (h *hosted) measureCUDA() {
	if h.spec.Simulated {
		h.reportCost("cuda_context", 1, 0)
		return
	}
	r, err := cudactx.Measure()
	if err != nil {
		h.log.Info("the CUDA context's cost is not measured here: the scheduler keeps its default", zap.Error(err))
		return
	}
	h.log.Info("CUDA context measured", zap.Duration("create", r.Create), zap.Duration("destroy", r.Destroy), zap.String("device", r.Device))
	h.reportCost("cuda_context", 1, r.Total())
}

// reportCost gives the leader a measured restart cost of this worker's GPU model.
func (h *hosted) reportCost(kind string, ranks int, d time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := h.c.client.ReportCost(ctx, api.CostReport{Kind: kind, GPUModel: h.spec.Member.GPUModel, Ranks: ranks, Measured: api.Duration(d), Machine: h.spec.Machine})
	if err != nil {
		h.log.Debug("could not report a measured cost", zap.String("kind", kind), zap.Error(err))
	}
}

// workerFields name a gang worker in its logs.
func workerFields(spec api.WorkerSpec) []zap.Field {
	return []zap.Field{zap.String("job", spec.Job), zap.String("gang", spec.Gang), zap.Int("rank", spec.Rank), zap.Int("generation", spec.Generation)}
}

func workerKey(job, gang string, rank int) string { return fmt.Sprintf("%s/%s/%d", job, gang, rank) }

// exit ends the worker because it failed.
func (h *hosted) exit(err error) {
	h.mu.Lock()
	if h.ended {
		h.mu.Unlock()
		return
	}
	h.ended, h.err = true, err
	h.mu.Unlock()
	h.log.Warn("worker failed", zap.Error(err))
	h.teardown()
	close(h.done)
}

// stop ends the worker on request.
func (h *hosted) stop() {
	h.mu.Lock()
	if h.ended {
		h.mu.Unlock()
		return
	}
	h.ended, h.err = true, errors.New("stopped")
	h.mu.Unlock()
	h.teardown()
	close(h.done)
}

func (h *hosted) teardown() {
	h.stopForming()
	s := h.spec
	epoch, _ := h.world()
	h.c.plane.End(s.Job, s.Gang, ringID(s.Generation, epoch))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = h.group.StopMember(ctx, h.name)
	if h.forget() == 0 {
		_ = h.group.Stop(ctx) // the generation's last worker in this process
	}
}

// forget unregisters the worker and returns how many workers of its generation this
// process still hosts.
func (h *hosted) forget() int {
	s := h.spec
	h.c.mu.Lock()
	defer h.c.mu.Unlock()
	if h.c.hosted[workerKey(s.Job, s.Gang, s.Rank)] == h {
		delete(h.c.hosted, workerKey(s.Job, s.Gang, s.Rank))
	}
	n := 0
	for _, o := range h.c.hosted {
		if o.spec.Job == s.Job && o.spec.Gang == s.Gang && o.spec.Generation == s.Generation {
			n++
		}
	}
	return n
}

// PID implements embed.Handle.
func (h *hosted) PID() int { return os.Getpid() }

// Done implements embed.Handle.
func (h *hosted) Done() <-chan struct{} { return h.done }

// Err implements embed.Handle.
func (h *hosted) Err() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}

// Stop implements embed.Handle.
func (h *hosted) Stop(context.Context, time.Duration) error { h.stop(); return nil }

// Kill implements embed.Handle: the worker's actor crashes, as its process dying would.
func (h *hosted) Kill() error { return h.group.InjectMemberFailure(h.name, "killed") }

// formation is one world's communicator while it forms: once every member of the world is
// ready (their addresses are in the workers table), a first collective of one value
// connects each member to its neighbours, as a communicator's initialization does. It runs
// once per world, in the background, for as long as the world lasts: a caller that gives
// up waiting for it leaves it running, and the next caller waits for the same one. Its
// fields other than done and cancel are under hosted.mu.
type formation struct {
	epoch  int
	done   chan struct{} // closed when m or err is set
	cancel context.CancelFunc
	m      *coll.Member
	err    error
	retry  bool   // err came before any member was joined: the next caller forms again
	state  string // what it waits for, for a caller's error
}

// ring returns the worker's ring member for its current world, for a collective: a caller
// whose ctx ends while the world's communicator forms gives up its collective, which the
// member counts as skipped (coll.Member.Skip), so that the next collective has the same
// number on every member.
func (h *hosted) ring(ctx context.Context) (*coll.Member, error) { return h.ringFor(ctx, true) }

// ringFor returns the ring member of the worker's current world, waiting (as long as ctx
// allows) for it to form; collective says whether the caller is a collective.
func (h *hosted) ringFor(ctx context.Context, collective bool) (*coll.Member, error) {
	h.mu.Lock()
	if m := h.member; m != nil {
		h.mu.Unlock()
		return m, nil
	}
	f := h.forming
	if f == nil || f.epoch != h.epoch || (f.retry && isDone(f.done)) {
		fctx, cancel := context.WithCancel(context.Background())
		f = &formation{epoch: h.epoch, done: make(chan struct{}), cancel: cancel, state: "starting"}
		h.forming = f
		go h.form(fctx, f, slices.Clone(h.members))
	}
	h.mu.Unlock()
	select {
	case <-f.done:
		return f.m, f.err
	case <-ctx.Done():
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if isDone(f.done) {
		return f.m, f.err
	}
	if collective && f.epoch == h.epoch {
		h.skipped++
	}
	return nil, fmt.Errorf("sdk: the communicator of generation %d (world %d) is still forming: %s: %w", h.spec.Generation, f.epoch, f.state, ctx.Err())
}

func isDone(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// stopForming ends the formation of a world that ended (the worker's, or its epoch's).
func (h *hosted) stopForming() {
	h.mu.Lock()
	f := h.forming
	h.mu.Unlock()
	if f != nil {
		f.cancel()
	}
}

// form forms the communicator of world (member indices in rank order) and publishes it,
// with the collectives its callers gave up on counted as skipped.
func (h *hosted) form(ctx context.Context, f *formation, world []int) {
	m, err := h.formRing(ctx, f, world)
	h.mu.Lock()
	defer h.mu.Unlock()
	f.m, f.err = m, err
	f.retry = err != nil && m == nil && !errors.Is(err, ErrStale) && ctx.Err() == nil
	if err == nil && h.epoch == f.epoch {
		for range h.skipped {
			m.Skip()
		}
		h.skipped = 0
		if h.member == nil {
			h.member = m
		}
	}
	if err != nil {
		f.m = nil
	}
	close(f.done)
	f.cancel()
}

func (h *hosted) setState(f *formation, state string) {
	h.mu.Lock()
	f.state = state
	h.mu.Unlock()
}

func (h *hosted) formRing(ctx context.Context, f *formation, world []int) (*coll.Member, error) {
	s := h.spec
	rank := slices.Index(world, s.Rank)
	if rank < 0 {
		return nil, fmt.Errorf("%w: member %d is not in its gang's world %v", ErrStale, s.Rank, world)
	}
	n := len(world)
	errReady := errors.New("ready")
	got := map[int]api.Worker{}
	missing := func() []int {
		var out []int
		for r, m := range world {
			if _, ok := got[m]; !ok {
				out = append(out, r)
			}
		}
		return out
	}
	take := func(v []byte) error {
		var w api.Worker
		if json.Unmarshal(v, &w) != nil {
			return nil
		}
		switch {
		case w.GangUID != s.GangUID: // a worker of an earlier gang of the same names
		case w.Generation > s.Generation:
			return fmt.Errorf("%w: the gang is in generation %d, this worker is of %d", ErrStale, w.Generation, s.Generation)
		case w.Generation == s.Generation && slices.Contains(world, w.Rank):
			got[w.Rank] = w
		}
		if len(got) == n {
			return errReady
		}
		return nil
	}
	err := h.c.client.Watch(ctx, api.TableWorkers+s.Job+"/"+s.Gang+"/", func(reset bool, l api.Listing, evs []meta.Event) error {
		for _, kv := range l.KVs {
			if err := take(kv.Value); err != nil {
				return err
			}
		}
		for _, ev := range evs {
			if ev.Type == meta.EventPut {
				if err := take(ev.KV.Value); err != nil {
					return err
				}
			}
		}
		h.setState(f, fmt.Sprintf("ranks %v of %d are not ready yet", missing(), n))
		return nil
	})
	if !errors.Is(err, errReady) {
		return nil, fmt.Errorf("sdk: allreduce: ranks %v of generation %d never became ready: %w", missing(), s.Generation, err)
	}
	h.setState(f, fmt.Sprintf("every rank is ready; the ring of %d members connects", n))
	peers := make([]coll.Peer, n)
	for r, m := range world {
		peers[r] = coll.Peer{Address: got[m].Address, Machine: got[m].Machine}
	}
	start := time.Now()
	m, err := h.c.plane.Join(s.Job, s.Gang, ringID(s.Generation, f.epoch), rank, peers)
	if err != nil {
		return nil, err
	}
	// Its time is the set-up a restart or a resize pays, which the scheduler's cost model
	// learns. It counts as a collective on every member: one that fails here (a peer
	// that failed) leaves the member joined, and the next collective meets the failure.
	if err := m.AllReduce(ctx, []float32{0}); err != nil {
		if errors.Is(err, coll.ErrAborted) {
			return m, fmt.Errorf("%w: the world ended while its communicator formed: %w", ErrStale, err)
		}
		h.log.Warn("the communicator's first collective failed", zap.Int("world", f.epoch), zap.Error(err))
		return m, nil
	}
	if rank == 0 && n > 1 && s.Member.GPUModel != "" {
		h.reportCost("communicator", n, time.Since(start))
	}
	return m, nil
}

func (h *hosted) allReduce(ctx context.Context, data []float32) error {
	return h.collective(ctx, func(m *coll.Member) error { return m.AllReduce(ctx, data) })
}

// collective runs f on the worker's ring member and says ErrStale the same way for every
// collective when the gang's generation ended under it.
func (h *hosted) collective(ctx context.Context, f func(m *coll.Member) error) error {
	m, err := h.ring(ctx)
	if err != nil {
		return err
	}
	return h.collErr(ctx, f(m))
}

// collErr says ErrStale for a collective's error when the gang's generation ended under it.
func (h *hosted) collErr(ctx context.Context, err error) error {
	if err != nil {
		if errors.Is(err, coll.ErrAborted) {
			return fmt.Errorf("%w: %w", ErrStale, err)
		}
		if ctx.Err() == nil && h.generationEnds(ctx, staleGrace) {
			// A member died under the collective (its chunk is lost with its process): the
			// gang restarts, and every surviving rank says so the same way.
			return fmt.Errorf("%w: a member of generation %d failed during the collective: %w", ErrStale, h.spec.Generation, err)
		}
		return err
	}
	return nil
}

// staleGrace bounds how long a failed collective waits to learn whether its gang's
// generation ended (the leader commits a restart within milliseconds of a worker's exit,
// within seconds of a machine's loss).
const staleGrace = 15 * time.Second

// generationEnds reports whether the worker's generation ends (the gang restarts, stops or
// fails) within d or ctx, as the log says.
func (h *hosted) generationEnds(ctx context.Context, d time.Duration) bool {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	s := h.spec
	ended := errors.New("ended")
	err := h.c.client.Watch(ctx, api.TableGangs+s.Job+"/"+s.Gang, func(_ bool, l api.Listing, evs []meta.Event) error {
		check := func(v []byte) error {
			var g api.Gang
			if json.Unmarshal(v, &g) == nil && (g.Generation > s.Generation || !g.State.Live()) {
				return ended
			}
			return nil
		}
		for _, kv := range l.KVs {
			if kv.Key == api.TableGangs+s.Job+"/"+s.Gang {
				if err := check(kv.Value); err != nil {
					return err
				}
			}
		}
		for _, ev := range evs {
			if ev.Type == meta.EventPut && ev.KV.Key == api.TableGangs+s.Job+"/"+s.Gang {
				if err := check(ev.KV.Value); err != nil {
					return err
				}
			}
		}
		return nil
	})
	return errors.Is(err, ended)
}

// checkpointReq asks a worker for its state; the reply is the object id holding it.
type checkpointReq struct{ Step int64 }

// cell adapts a user Actor to actors.Handler.
type cell struct {
	h       *hosted
	c       *conn
	user    Actor
	makeErr error
	ctx     Context
}

func (w *cell) Started(ac *actors.Context) error {
	if w.makeErr != nil {
		return w.makeErr
	}
	w.ctx = Context{Context: context.Background(), ac: ac, c: w.c, w: w.h, restore: -1, log: ac.Logger()}
	if w.h != nil {
		waiting := ac.Waiting
		w.h.waiting.Store(&waiting)
	}
	if w.h != nil && !w.c.workerProc { // a worker process's logger names its worker already
		w.ctx.log = w.ctx.log.With(workerFields(w.h.spec)...)
	}
	if cp, ok := w.user.(Checkpointer); ok && w.h != nil {
		if err := w.restore(cp); err != nil {
			return err
		}
	}
	if s, ok := w.user.(Starter); ok {
		return s.Start(&w.ctx)
	}
	return nil
}

func (w *cell) restore(cp Checkpointer) error {
	s := w.h.spec
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m, ok, err := w.c.latestCheckpoint(ctx, s.Job, s.Gang)
	if err != nil || !ok {
		return err
	}
	// A checkpoint has one part per rank of the world it was taken in. A rank the checkpoint
	// has no part for (an elastic gang restarted larger) takes rank 0's: the state of a
	// data-parallel gang is the same on every rank.
	part := max(w.h.rank(), 0)
	if part >= len(m.Objects) {
		part = 0
	}
	if len(m.Objects) == 0 {
		return fmt.Errorf("sdk: checkpoint at step %d has no parts", m.Step)
	}
	id, err := object.ParseID(m.Objects[part])
	if err != nil {
		return err
	}
	b, release, err := w.h.store.get(ctx, id)
	if err != nil {
		return fmt.Errorf("sdk: restore rank %d from step %d: %w", s.Rank, m.Step, err)
	}
	defer release()
	if err := checkPart(m, part, b); err != nil {
		return fmt.Errorf("sdk: restore rank %d: %w", s.Rank, err)
	}
	if err := cp.Restore(b); err != nil {
		return fmt.Errorf("sdk: restore rank %d from step %d: %w", s.Rank, m.Step, err)
	}
	w.ctx.restore = m.Step
	w.ctx.Logger().Info("restored from checkpoint", zap.Int64("step", m.Step))
	return nil
}

func (w *cell) Receive(ac *actors.Context, msg any) (any, error) {
	// Each message gets its own Context: calls its handler started may still be winding
	// down in their goroutines after it returns, reading the context they were given.
	ctx := w.ctx
	ctx.Context = ac.Context()
	if req, ok := msg.(worldReq); ok {
		return struct{}{}, w.takeWorld(&ctx, req)
	}
	if req, ok := msg.(checkpointReq); ok {
		cp, ok := w.user.(Checkpointer)
		if !ok {
			return nil, fmt.Errorf("sdk: actor %T does not implement Checkpointer", w.user)
		}
		state, err := cp.Checkpoint()
		if err != nil {
			return nil, fmt.Errorf("sdk: checkpoint at step %d: %w", req.Step, err)
		}
		// The gang's checkpoints outlive this incarnation (pruning frees them); the driver
		// has this copy persisted, and a second one made, before it commits the checkpoint.
		s := w.h.spec
		id, err := ctx.store().putAs(ctx.Context, objects.CheckpointOwnerPrefix+s.Job+"/"+s.Gang, state)
		if err != nil {
			return nil, err
		}
		return id.String(), nil
	}
	if w.h != nil && w.h.spec.Service != "" {
		// A service replica counts the calls it serves for its load reports.
		w.h.svcLoad.begin()
		start := time.Now()
		defer func() { w.h.svcLoad.end(time.Since(start)) }()
	}
	return w.user.Receive(&ctx, msg)
}

// flushTimeout bounds how long a failed worker process waits for its last answers to
// reach their callers before it exits.
const flushTimeout = 2 * time.Second

// ExitPermanent is a worker process's exit status when a restart cannot help (an unknown
// kind, undecodable arguments, an unreadable spec): its agent reports the gang failed.
const ExitPermanent = api.ExitPermanent

// WorkerMain serves the worker this process was started for (InWorker) until its agent
// stops it, and returns the process's exit status: 0 after a stop it was asked for,
// ExitPermanent when a restart cannot help (an unknown kind, an unreadable spec), 1
// otherwise. It never exits the process itself, so the caller's deferred calls run:
//
//	func main() {
//		if sdk.InWorker() {
//			os.Exit(sdk.WorkerMain(kinds...))
//		}
//		c, err := local.Start(ctx, kinds...) // the driver
//		...
//	}
//
// opts are the same kinds and tasks the driver registers: the worker is the same program.
// SIGTERM or SIGINT asks the worker to stop.
func WorkerMain(opts ...Option) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	err := ServeWorker(ctx, opts...)
	switch {
	case err == nil:
		return 0
	case errors.Is(err, ErrWorkerPermanent):
		fmt.Fprintln(os.Stderr, err)
		return ExitPermanent
	}
	fmt.Fprintln(os.Stderr, err)
	return 1
}

// ErrWorkerPermanent: the worker cannot start and a restart cannot help (an unknown kind,
// undecodable arguments, an unreadable spec).
var ErrWorkerPermanent = errors.New("sdk: worker cannot start")

// ServeWorker serves the worker this process was started for (InWorker) until ctx ends
// (it was asked to stop: nil) or the worker fails (an error; ErrWorkerPermanent when a
// restart cannot help).
func ServeWorker(ctx context.Context, opts ...Option) error {
	if !InWorker() {
		return fmt.Errorf("%w: %s is not set: this process was not started by an agent", ErrInvalid, api.WorkerEnv)
	}
	s, err := apply(opts)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrWorkerPermanent, err)
	}
	return serveWorker(ctx, s)
}

func serveWorker(ctx context.Context, s settings) error {
	spec, err := api.ReadWorkerSpec(os.Getenv(api.WorkerEnv))
	if err != nil {
		return fmt.Errorf("%w: %v", ErrWorkerPermanent, err)
	}
	log := s.log
	var paLevel zapcore.Level
	if !s.logSet { // a worker's stderr is its log file on its agent
		if l, err := zap.NewProduction(); err == nil {
			log = l
		}
		// protoactor-go logs each connection it opens and closes at info: in a worker's
		// log they would bury the program's own lines.
		paLevel = zapcore.WarnLevel
	}
	log = log.With(workerFields(spec)...)
	defer log.Sync()
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	id, err := clusterIdentity(sctx, spec.Heads, spec.Token, []byte(spec.CACert), "worker/"+spec.Key())
	if err != nil {
		return fmt.Errorf("sdk: worker %s: no certificate from the heads: %w", spec.Key(), err)
	}
	cc := api.ClientConfig{Heads: spec.Heads, Token: spec.Token, Logger: log}
	secureLinks(id, &cc, nil, nil)
	client, err := api.NewClient(sctx, cc)
	if err != nil {
		return fmt.Errorf("sdk: worker %s: cannot reach the heads: %w", spec.Key(), err)
	}
	host, _, err := net.SplitHostPort(spec.Transfer)
	if err != nil || host == "" {
		host = "127.0.0.1"
	}
	link := []byte(spec.LinkKey) // the links' key; the token is this worker's own credential
	if len(link) == 0 {
		link = []byte(spec.Token)
	}
	sys, err := actors.NewSystem(actors.Config{Logger: log, ProtoactorLevel: paLevel, DefaultCallTimeout: s.callTimeout, Codec: s.codec, Errors: s.errors,
		Remote: remoteConfig(net.JoinHostPort(host, "0"), link, id, authz.Worker(spec.Job, spec.Gang, spec.Rank).String(), client)})
	if err != nil {
		return fmt.Errorf("sdk: worker %s: actor system: %w", spec.Key(), err)
	}
	defer sys.Shutdown(context.Background())
	plane, err := coll.NewPlane(sys, link, host, log)
	if err != nil {
		return fmt.Errorf("sdk: worker %s: collectives: %w", spec.Key(), err)
	}
	defer plane.Close()
	if spec.TrustedFabric {
		log.Info("collective links without TLS: the operator declared the fabric between machines trusted (atoll agent --trusted-fabric)")
	} else {
		secureLinks(id, nil, plane, nil)
	}
	store := &agentStore{url: spec.Agent, token: spec.Token, holder: spec.Holder, transfer: spec.Transfer, hc: httpClient(id), sameMachine: true}
	go store.renew(ctx, 2*time.Second)
	c := &conn{s: s, log: log.Named("sdk"), workerProc: true, client: client, sys: sys, plane: plane, token: spec.Token, owner: spec.Holder, objects: store, agents: store.hc,
		principal: authz.Worker(spec.Job, spec.Gang, spec.Rank).String()}
	c.init()
	c.followCA(id, api.Renewal{Heads: spec.Heads, Token: spec.Token, Name: "worker/" + spec.Key()})
	h, err := c.host(sctx, spec, store)
	if err != nil {
		var p interface{ Permanent() bool }
		if errors.As(err, &p) && p.Permanent() {
			return fmt.Errorf("%w: %s: %v", ErrWorkerPermanent, spec.Key(), err)
		}
		return fmt.Errorf("sdk: worker %s did not start: %w", spec.Key(), err)
	}
	select {
	case <-ctx.Done(): // asked to stop
		h.stop()
		return nil
	case <-h.done:
		// Its callers get its last answers (a panic's ErrActorFailed) before it exits.
		fctx, cancel := context.WithTimeout(context.Background(), flushTimeout)
		_ = sys.Flush(fctx)
		cancel()
		if err := h.Err(); err != nil {
			return fmt.Errorf("sdk: worker %s: %w", spec.Key(), err)
		}
		return fmt.Errorf("sdk: worker %s ended", spec.Key())
	}
}
