package sdk

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/store/object"
)

// NoticeKind says what a notice asks of a gang.
type NoticeKind string

// Notice kinds.
const (
	// NoticePreempt: a more important gang needs the GPUs. Checkpoint, then Yield: the gang
	// stops, queues again and resumes from that checkpoint when placed (AwaitRunning).
	NoticePreempt NoticeKind = "preempt"
	// NoticeDrain: the same, because a machine of the gang goes (an operator's drain, a spot
	// interruption, a scale-down).
	NoticeDrain NoticeKind = "drain"
	// NoticeShrink: an elastic gang gives up members (From -> To). Yield at a step boundary:
	// the others keep running and learn their new rank and size.
	NoticeShrink NoticeKind = "shrink"
	// NoticeGrow: capacity freed and an elastic gang's new members are starting (From ->
	// To). Yield at a step boundary: they join with a copy of rank 0's state.
	NoticeGrow NoticeKind = "grow"
	// NoticeTimeLimit: the gang's TimeLimit ends at the deadline (a CheckpointOnNotice gang
	// is told one notice grace before). Checkpoint, then Yield: the gang stops there
	// (stopped, not queued again); past the deadline it fails.
	NoticeTimeLimit NoticeKind = "time_limit"
)

// EvictionCosts is the scheduler's estimate of what stopping a gang costs, in seconds (of
// the whole gang: multiply by its GPUs for GPU-seconds).
type EvictionCosts struct {
	// WorkLost is the work since the newest checkpoint; Checkpoint, Restore, CUDAContext
	// and Communicator the times to save, to load, to create the CUDA contexts and to set
	// up the collective at the gang's size.
	WorkLost     float64 `json:"work_lost"`
	Checkpoint   float64 `json:"checkpoint"`
	Restore      float64 `json:"restore"`
	CUDAContext  float64 `json:"cuda_context"`
	Communicator float64 `json:"communicator"`
	// GPUSeconds is the cost over all the gang's GPUs, in GPU-seconds.
	GPUSeconds float64 `json:"gpu_seconds"`
}

// Notice asks a running gang to change. Its driver takes it at a step boundary (select on
// Gang.Notices between steps) and answers with Yield; a stop notice is best answered after
// a just-in-time Checkpoint. Past Deadline the cluster acts alone: a stopped gang then
// resumes from its newest checkpoint (the steps since are lost), a shrink restarts the gang
// at its new size.
type Notice struct {
	Kind NoticeKind
	// Generation is the incarnation it was given to; Issued when the cluster gave it.
	Generation int
	Issued     time.Time
	Deadline   time.Time
	// For is the gang the room is made for ("job/gang"); Reason says why.
	For, Reason string
	// From and To are the sizes of a resize.
	From, To int
	// Costs is the scheduler's estimate of the eviction's cost (stop and shrink notices).
	Costs *EvictionCosts

	uid     string
	issued  time.Time
	remove  []int
	add     []int
	epoch   int
	members []int
}

func noticeOf(rec api.Gang) Notice {
	n := rec.Notice
	epoch := 0
	if rec.World != nil {
		epoch = rec.World.Epoch
	}
	return Notice{Kind: NoticeKind(n.Kind), Generation: rec.Generation, Issued: n.Issued, Deadline: n.Deadline, For: n.For, Reason: n.Reason, From: n.From, To: n.To,
		Costs: fromAPIEvictionCosts(n.Costs), uid: rec.UID, issued: n.Issued, remove: slices.Clone(n.Remove), add: slices.Clone(n.Add), epoch: epoch, members: rec.Ranks()}
}

// Notices delivers the notices given to the gang, in order. A driver that never reads them
// still runs: the cluster acts on each at its deadline.
func (g *Gang) Notices() <-chan Notice { return g.notices }

// Yield answers a notice at a step boundary (no call to the gang's workers in flight):
//   - a stop (NoticePreempt, NoticeDrain): the gang stops now and queues again; it
//     resumes from the checkpoint taken since the notice (Checkpoint), if any, else from its
//     newest. Wait for it with AwaitRunning(ctx, n.Generation+1).
//   - a time limit (NoticeTimeLimit): the gang stops now, for good (State: stopped).
//   - a shrink: the members dropped stop, the others keep their processes; when Yield
//     returns, Size is the new size and each worker has its new rank (Resizer.Resized).
//   - a grow: once the new members are up, each gets a copy of rank 0's state (Checkpointer)
//     and the gang takes them in: ranks From..To-1 are the new ones.
func (g *Gang) Yield(ctx context.Context, n Notice) error {
	c := g.c
	switch n.Kind {
	case NoticePreempt, NoticeDrain, NoticeTimeLimit:
		g.mu.Lock()
		checkpointed := !g.lastCkpt.IsZero() && !g.lastCkpt.Before(n.issued)
		step := g.lastStep
		g.mu.Unlock()
		if err := c.client.Yield(ctx, api.Yield{Job: g.job, Gang: g.name, UID: n.uid, Generation: n.Generation, Checkpointed: checkpointed, Step: step}); err != nil {
			return fmt.Errorf("sdk: yield gang %s: %w", g.key, staleToo(err))
		}
		return g.awaitRecord(ctx, func(r api.Gang) bool { return r.Generation > n.Generation || !r.State.Live() })
	case NoticeShrink:
		var members []int
		for _, m := range n.members {
			if !slices.Contains(n.remove, m) {
				members = append(members, m)
			}
		}
		return g.takeWorld(ctx, n, members, "")
	case NoticeGrow:
		// Grows not taken yet merge into one notice, whose newest issue names every new
		// member (another may merge while this one is taken): take the newest.
		for {
			var taken bool
			n, taken = g.newestGrow(n)
			if taken {
				return nil
			}
			err := g.takeGrow(ctx, n)
			if err == nil || !errors.Is(err, ErrInvalid) {
				return err
			}
			if m, _ := g.newestGrow(n); !m.issued.After(n.issued) {
				return err // not a grow that merged under it
			}
		}
	}
	return fmt.Errorf("%w: notice kind %q", ErrInvalid, n.Kind)
}

// newestGrow is the newest grow notice of n's incarnation that includes n (n itself when
// none newer was given), and whether a merged grow that includes it was already taken.
func (g *Gang) newestGrow(n Notice) (Notice, bool) {
	g.mu.Lock()
	rec := g.rec
	g.mu.Unlock()
	if rec.UID != n.uid || rec.Generation != n.Generation {
		return n, false
	}
	cur := rec.Notice
	switch {
	case cur != nil && cur.Kind == api.NoticeGrow && cur.Issued.After(n.issued):
		return noticeOf(rec), false
	case cur == nil && rec.World != nil && rec.World.Epoch > n.epoch && len(n.add) > 0 &&
		!slices.ContainsFunc(n.add, func(m int) bool { return !slices.Contains(rec.World.Members, m) }):
		return n, true
	}
	return n, false
}

// takeGrow takes a grow: once its new members are up, each gets a copy of rank 0's state
// and the gang's world takes them in.
func (g *Gang) takeGrow(ctx context.Context, n Notice) error {
	c := g.c
	if err := g.awaitMembers(ctx, n.Generation, n.add); err != nil {
		return err
	}
	// The new members start from rank 0's state, as it is now.
	state, err := Call[string](ctx, c, g.Worker(0), checkpointReq{Step: -1})
	if err != nil {
		return fmt.Errorf("sdk: grow gang %s: rank 0's state for the new members: %w", g.key, err)
	}
	defer func() {
		if id, err := object.ParseID(state); err == nil {
			_ = c.freeEverywhere(context.WithoutCancel(ctx), c.objects, id)
		}
	}()
	return g.takeWorld(ctx, n, append(slices.Clone(n.members), n.add...), state)
}

// takeWorld commits the gang's new world and tells every member of it its rank: members
// that are new restore from state first (an object id; "" for none).
func (g *Gang) takeWorld(ctx context.Context, n Notice, members []int, state string) error {
	c := g.c
	epoch := n.epoch + 1
	if err := c.client.TakeWorld(ctx, api.WorldChange{Job: g.job, Gang: g.name, UID: n.uid, Generation: n.Generation, Epoch: epoch, Members: members}); err != nil {
		return fmt.Errorf("sdk: resize gang %s: %w", g.key, staleToo(err))
	}
	if err := g.awaitRecord(ctx, func(r api.Gang) bool {
		return r.Generation != n.Generation || (r.World != nil && r.World.Epoch >= epoch)
	}); err != nil {
		return err
	}
	req := worldReq{Epoch: epoch, Members: members}
	refs := make([]ActorRef, len(members))
	g.mu.Lock()
	for i, m := range members {
		refs[i] = g.memberRefLocked(m)
	}
	g.mu.Unlock()
	// The calls go out with g.mu released: a call looks up its incarnation under it.
	futures := make([]*Future[struct{}], len(members))
	for i, m := range members {
		r := req
		if slices.Contains(n.add, m) {
			r.Restore = state
		}
		futures[i] = CallAsync[struct{}](ctx, c, refs[i], r)
	}
	var errs []error
	for i, f := range futures {
		if _, err := f.Await(ctx); err != nil {
			errs = append(errs, fmt.Errorf("rank %d: %w", i, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("sdk: resize gang %s: telling the workers their new ranks: %w", g.key, err)
	}
	c.log.Info("gang resized", zap.String("gang", g.key), zap.Int("from", n.From), zap.Int("to", len(members)), zap.Int("epoch", epoch))
	return nil
}

// awaitRecord waits until the gang's record satisfies ok.
func (g *Gang) awaitRecord(ctx context.Context, ok func(api.Gang) bool) error {
	for {
		g.mu.Lock()
		rec, ch := g.rec, g.changed
		g.mu.Unlock()
		if ok(rec) {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("sdk: gang %s (%s, generation %d): %w", g.key, rec.State, rec.Generation, ctx.Err())
		}
	}
}

// awaitMembers waits until the given members of generation gen are ready.
func (g *Gang) awaitMembers(ctx context.Context, gen int, members []int) error {
	for {
		g.mu.Lock()
		rec, ch := g.rec, g.changed
		missing := 0
		for _, m := range members {
			if w, ok := g.workers[m]; !ok || w.Generation != gen {
				missing++
			}
		}
		g.mu.Unlock()
		switch {
		case missing == 0:
			return nil
		case rec.Generation != gen || !rec.State.Live():
			return fmt.Errorf("%w: gang %s generation %d ended before its new members were up", ErrStale, g.key, gen)
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("sdk: gang %s: %d new members not up: %w", g.key, missing, ctx.Err())
		}
	}
}

// worldReq tells a worker its gang's new world (member indices in rank order) at epoch;
// Restore, when set, is an object holding the state it restores first (a new member's).
type worldReq struct {
	Epoch   int
	Members []int
	Restore string
}

// Resizer is implemented by workers of elastic gangs that act when their gang's size
// changes (re-shard their data): Resized runs in the worker, between messages, with the
// new Rank and Size in ctx.
type Resizer interface {
	Resized(ctx *Context) error
}

// world is the worker's gang as its program sees it: member indices in rank order.
func (h *hosted) world() (epoch int, members []int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.epoch, h.members
}

// initWorld sets the worker's first world from its spec.
func (h *hosted) initWorld() {
	s := h.spec
	h.members = slices.Clone(s.World)
	h.epoch = s.Epoch
	if len(h.members) == 0 {
		for i, m := range s.Placement.Members {
			if !m.Removed {
				h.members = append(h.members, i)
			}
		}
	}
}

// setWorld takes a new world: the collective of the old one ends here.
func (h *hosted) setWorld(epoch int, members []int) {
	h.mu.Lock()
	old, forming := h.epoch, h.forming
	if old != epoch {
		h.skipped = 0
	}
	h.epoch, h.members, h.member = epoch, slices.Clone(members), nil
	h.mu.Unlock()
	if old != epoch {
		if forming != nil && forming.epoch == old {
			forming.cancel()
		}
		s := h.spec
		h.c.plane.End(s.Job, s.Gang, ringID(s.Generation, old))
	}
}

// ringID names a collective of one world of one generation.
func ringID(gen, epoch int) int64 { return int64(gen)<<20 | int64(epoch) }

// rank is the worker's rank in its world (-1 when it is not in it).
func (h *hosted) rank() int {
	_, members := h.world()
	return slices.Index(members, h.spec.Rank)
}

// restoreFrom restores a worker from an object holding a state.
func (w *cell) restoreFrom(ctx context.Context, cp Checkpointer, id string) error {
	oid, err := object.ParseID(id)
	if err != nil {
		return err
	}
	b, release, err := w.h.store.get(ctx, oid)
	if err != nil {
		return err
	}
	defer release()
	return cp.Restore(b)
}

// takeWorld handles a worldReq in the worker.
func (w *cell) takeWorld(ctx *Context, req worldReq) error {
	if req.Restore != "" {
		cp, ok := w.user.(Checkpointer)
		if !ok {
			return fmt.Errorf("sdk: actor %T does not implement Checkpointer: a new member of a grown gang has no state to start from", w.user)
		}
		if err := w.restoreFrom(ctx.Context, cp, req.Restore); err != nil {
			return fmt.Errorf("sdk: a new member's state: %w", err)
		}
	}
	w.h.setWorld(req.Epoch, req.Members)
	if r, ok := w.user.(Resizer); ok {
		return r.Resized(ctx)
	}
	return nil
}

// staleToo makes the head's answer that a generation has ended (api.ErrStale) also wrap
// the SDK's ErrStale: a notice the leader carried out itself, past its deadline, is
// answered so.
func staleToo(err error) error {
	if errors.Is(err, api.ErrStale) && !errors.Is(err, ErrStale) {
		return fmt.Errorf("%w: %w", ErrStale, err)
	}
	return err
}
