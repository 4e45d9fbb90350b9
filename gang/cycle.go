package gang

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"go.uber.org/zap"
)

// Cycle runs one scheduling cycle at time now. QueueSort orders the pending gangs; each,
// with a fresh CycleState, goes through Config.Actions in order (actions.go): enqueue
// (PreFilter), allocate (Filter, Score, Permit), preempt and reclaim (PostFilter), backfill
// (Reserve). Then running elastic gangs grow. It returns the decisions; placements are
// already accounted in the scheduler's state.
func (s *Scheduler) Cycle(now time.Time) Decisions {
	d := Decisions{Now: now}
	s.cycles++
	// A backfill reservation is recomputed every cycle; a preemptor's hold stands until it
	// is placed, gone, or HoldTimeout past its start (the victims should have stopped by
	// then; if the preemptor still does not fit, the world changed and it queues as any).
	s.resvs = nil
	s.now = now
	for id, h := range s.holds {
		if g, ok := s.gangs[id]; !ok || g.status != stPending || now.Sub(h.start) > s.cfg.HoldTimeout {
			delete(s.holds, id)
		}
	}
	if len(s.pending) == 0 {
		s.grow(&d, now)
		return d
	}
	q := s.sortPending(now)
	c := cycleRun{d: &d, now: now, failed: map[shapeKeyModels]*Status{}, failedMin: map[shapeKeyModels]int{}, preemptTries: map[int]int{}, starvingTries: map[int]int{}}
	for q.Len() > 0 && !c.stop {
		if d.Attempts >= s.cfg.MaxGangsPerCycle || c.scanned >= s.cfg.MaxScanFactor*s.cfg.MaxGangsPerCycle {
			break
		}
		c.scanned++
		qg := q.pop()
		g := qg.g
		excl, exclKey := s.exclusionKeyed(g, now)
		sk := shapeKeyModels{m: g.req.Member, models: g.placeInputs(), excl: exclKey, strategy: g.req.Strategy}
		if s.cfg.Preemption {
			sk.priority = g.req.Priority // its victims are not the other class's
		}
		// A starving gang with a preemption search left is tried even when its shape
		// failed: its search may find victims the other's could not. One whose last such
		// search found none waits StarvationRetry before the next, leaving its class's
		// budget to the starving gangs behind it.
		starving := s.cfg.starving(qg) && c.starvingTries[g.req.Priority] < s.cfg.MaxPreemptionSearches &&
			(g.starveFruitless.IsZero() || now.Sub(g.starveFruitless) >= s.cfg.Preempt.StarvationRetry)
		if f, ok := c.failed[sk]; ok && g.req.Min >= c.failedMin[sk] && !s.cfg.StrictFIFO && !starving {
			s.addWaiting(&d, g, f) // the reason of the gang of its shape that was tried
			continue
		}
		d.Attempts++
		t := &gangTry{excl: excl, shape: sk, starving: starving}
		s.att = s.newAttempt(qg, NewCycleState(), nil)
		for _, st := range s.steps {
			if t.settled || c.stop {
				break
			}
			s.runStep(&c, t, st)
		}
		s.att = nil
	}
	if len(c.placed) > 0 {
		for _, g := range c.placed {
			s.queues.addPending(g.q, -1)
		}
		s.pending = slices.DeleteFunc(s.pending, func(g *gangState) bool { return g.status != stPending })
	}
	s.notePlacements(len(c.placed), now)
	s.grow(&d, now)
	d.Reservations = s.reservations()
	for _, g := range s.pending {
		if g.waitCycle != s.cycles {
			g.wait = Waiting{Gang: g.req.ID, Kind: WaitNotReached, Reason: "not reached: the cycle's bounds ended it first"}
			g.waitCycle = s.cycles
		}
	}
	return d
}

// gangTry is where one gang's attempt stands between actions.
type gangTry struct {
	excl  map[int]bool
	shape shapeKeyModels
	// settled: an action placed it, refused it, or made it wait for something specific
	// (victims, a reservation); later actions leave it alone.
	settled bool
	// blocked: allocate found no placement (preempt, reclaim and backfill act on it).
	blocked bool
	// held: allocate found a placement a Permit plugin holds (backfill reserves compact
	// room for it).
	held bool
	// starving: Config.starving, with a search of its class's starving budget left.
	starving bool
}

// runStep runs one action for the gang of the current attempt.
func (s *Scheduler) runStep(c *cycleRun, t *gangTry, st step) {
	a := s.att
	qg, g, d, now := a.g, a.g.g, c.d, c.now
	switch st.action {
	case ActionEnqueue:
		if res := s.runPreFilter(a, now); !res.IsSuccess() {
			s.addWaiting(d, g, res)
			t.settled = true
		}
	case ActionAllocate:
		cand, members, why := s.placeElastic(g, t.excl)
		if cand != nil {
			if g.fitSince.IsZero() {
				g.fitSince = now
				qg.FitSince = now
			}
			if h, held := s.holds[g.req.ID]; held && h.skipPermit {
				// The room freed for it is not compact: it takes it as it is.
			} else if res := s.runPermit(a, cand, now); !res.IsSuccess() {
				s.addWaiting(d, g, res)
				d.wakeAt(res.RetryAt)
				t.held = true
				return
			}
			p := s.commitPlacement(g, cand, members, now)
			s.dropReservation(g.req.ID)
			for _, r := range s.resvs {
				p.Backfill = p.Backfill || touches(cand.allocs, r.nodes)
			}
			if _, ok := s.holds[g.req.ID]; ok {
				p.Preemptor = true
				delete(s.holds, g.req.ID)
			}
			d.Placements = append(d.Placements, p)
			c.placed = append(c.placed, g)
			t.settled = true
			return
		}
		s.addWaiting(d, g, why)
		if s.cfg.StrictFIFO {
			c.stop = true
			return
		}
		if _, ok := c.failed[t.shape]; !ok || g.req.Min < c.failedMin[t.shape] {
			c.failed[t.shape] = why
			c.failedMin[t.shape] = g.req.Min
		}
		if h, held := s.holds[g.req.ID]; held {
			s.replaceWaiting(d, g, NewStatus(Unschedulable, WaitPreempting, fmt.Sprintf("gangs preempted for it are stopping, expected in %s", max(0, h.start.Sub(now)))))
			t.settled = true
			return
		}
		t.blocked = true
	case ActionPreempt: // preempt, reclaim or both (step.may)
		// A gang with no placement, or one its topology wait holds for a compact one (the
		// preemption then looks for compact room only), may make room by preemption.
		budget := c.preemptTries
		if t.starving {
			budget = c.starvingTries
		}
		if !(t.blocked || t.held) || len(s.prof.postFilter) == 0 || budget[g.req.Priority] >= s.cfg.MaxPreemptionSearches {
			return
		}
		budget[g.req.Priority]++
		res := s.runPostFilter(a, st.may, now)
		if t.starving {
			g.starveFruitless = time.Time{}
			if res == nil || len(res.Preemptions)+len(res.Resizes) == 0 {
				g.starveFruitless = now
			}
		}
		if res == nil {
			return
		}
		if len(res.Preemptions)+len(res.Resizes) == 0 {
			d.wakeAt(res.RetryAt)
			return
		}
		d.Preemptions = append(d.Preemptions, res.Preemptions...)
		d.Resizes = append(d.Resizes, res.Resizes...)
		s.replaceWaiting(d, g, NewStatus(Unschedulable, WaitPreempting, fmt.Sprintf("%d gang(s) stopping and %d shrinking to make room, expected in %s",
			len(res.Preemptions), len(res.Resizes), res.ReadyAt.Sub(now))))
		t.settled = true
	case ActionBackfill:
		if len(s.prof.reserve) == 0 {
			return
		}
		switch {
		case t.held:
			if len(s.resvs) < s.cfg.MaxReservations && c.compactTries < s.cfg.MaxReservations {
				// Hold the machines that free up first for a compact placement, or
				// one-GPU work would refill every card the moment it frees.
				c.compactTries++
				s.runReserve(a, true, now)
			}
			t.settled = true
		case t.blocked && !c.reserveTried && len(s.resvs) < s.cfg.MaxReservations:
			c.reserveTried = true // one reservation search per cycle bounds its latency
			t.settled = s.runReserve(a, false, now) != nil
		}
	}
}

// reservations lists the preemptors' holds (by gang) and the backfill reservation.
func (s *Scheduler) reservations() []Reservation {
	var out []Reservation
	add := func(r *reservation) {
		x := Reservation{Gang: r.gang, Start: r.start, Preemptor: r.preemptor}
		for n := range r.nodes {
			x.Nodes = append(x.Nodes, n)
		}
		sort.Ints(x.Nodes)
		out = append(out, x)
	}
	ids := make([]string, 0, len(s.holds))
	for id := range s.holds {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		add(s.holds[id])
	}
	for _, r := range s.resvs {
		add(r)
	}
	return out
}

// dropReservation removes the reservation (not a hold) of gang id, if any.
func (s *Scheduler) dropReservation(id string) {
	for i, r := range s.resvs {
		if r.gang == id {
			s.resvs = append(s.resvs[:i], s.resvs[i+1:]...)
			return
		}
	}
}

// cycleRun is what one cycle remembers between gangs.
type cycleRun struct {
	d       *Decisions
	now     time.Time
	placed  []*gangState
	stop    bool // StrictFIFO: the first gang that did not fit ends the cycle
	scanned int
	// preemptTries counts the preemption searches per priority class
	// (MaxPreemptionSearches each): the gangs of a high class, which the urgency order
	// may put behind shorter work of lower classes, are not passed over because those
	// spent the cycle's searches on their own victims.
	preemptTries map[int]int
	// starvingTries counts the preemption searches of starving gangs
	// (Preempt.StarvationWait) per priority class, apart from preemptTries.
	starvingTries map[int]int
	reserveTried  bool // one blocked-gang reservation search per cycle
	compactTries  int  // compact reservation searches (at most MaxReservations)
	// failed remembers, per member shape, strategy and set of reservations holding nodes
	// from it, the fewest members that found no placement this cycle: a gang of that
	// shape, under the same reservations, asking as many or more cannot fit either and is
	// passed over without a search. (Placements in between only take capacity.) Such skips
	// do not count against MaxGangsPerCycle, so a backlog of blocked large gangs does not
	// hide the small ones behind it; MaxScanFactor bounds the whole loop.
	failed    map[shapeKeyModels]*Status
	failedMin map[shapeKeyModels]int
}

type shapeKeyModels struct {
	m        Member
	models   string // gangState.placeInputs: models, pinned machines, one island
	excl     string // the reservations that exclude nodes from the gang
	strategy Strategy
	// priority: with preemption on, a gang of another class may find victims where the
	// one that failed could not (its own class's, or none), so its class is part of the key.
	priority int
}

// queuedHeap yields pending gangs in QueueSort order, ties by arrival. A heap, not a sort:
// a cycle usually takes a few hundred of many thousands. Its entries carry what the order
// compares, so that a comparison reads one small entry and not two gangs' views: with
// 10,000 pending a cycle pops thousands (MaxScanFactor × MaxGangsPerCycle), each a dozen
// levels down. It is container/heap's algorithm on a typed slice: the same comparisons in
// the same order, so the same gangs come out in the same order.
type queuedHeap struct {
	es   []heapEntry
	less func(a, b *QueuedGang) bool
	// urgency is the "urgency" sort, whose order the entries' fields give without a
	// call (nil for any other QueueSort, which is asked through less).
	urgency *urgencySort
}

type heapEntry struct {
	key, dyn   float64 // QueuedGang.sortKey (urgency) and Dynamic
	class, seq int
	under      bool
	qg         *QueuedGang
}

func (h *queuedHeap) Len() int { return len(h.es) }

// lessEntries is queuedHeap's order: within a class, a gang under its queue's fair share
// first, then the QueueSort, then arrival.
func (h *queuedHeap) lessEntries(a, b *heapEntry) bool {
	if a.under != b.under && a.class == b.class {
		// Fair share between queues: within a class, a gang whose queue holds less than
		// its fair share goes before one whose queue would borrow (Volcano's proportion,
		// Kueue's fair sharing). One queue alone is never over its share.
		return a.under
	}
	if u := h.urgency; u != nil {
		if u.lessEntries(a, b) {
			return true
		}
		if u.lessEntries(b, a) {
			return false
		}
	} else {
		if h.less(a.qg, b.qg) {
			return true
		}
		if h.less(b.qg, a.qg) {
			return false
		}
	}
	return a.seq < b.seq
}

// init heaps the entries (container/heap.Init).
func (h *queuedHeap) init() {
	n := len(h.es)
	for i := n/2 - 1; i >= 0; i-- {
		h.down(i, n)
	}
}

// pop removes and returns the first gang (container/heap.Pop).
func (h *queuedHeap) pop() *QueuedGang {
	n := len(h.es) - 1
	h.es[0], h.es[n] = h.es[n], h.es[0]
	h.down(0, n)
	qg := h.es[n].qg
	h.es = h.es[:n]
	return qg
}

func (h *queuedHeap) down(i0, n int) {
	i := i0
	for {
		j1 := 2*i + 1
		if j1 >= n || j1 < 0 { // j1 < 0 after int overflow
			break
		}
		j := j1 // left child
		if j2 := j1 + 1; j2 < n && h.lessEntries(&h.es[j2], &h.es[j1]) {
			j = j2 // = 2*i + 2  // right child
		}
		if !h.lessEntries(&h.es[j], &h.es[i]) {
			break
		}
		h.es[i], h.es[j] = h.es[j], h.es[i]
		i = j
	}
}

// sortPending fills the per-cycle view of every pending gang and heaps them.
func (s *Scheduler) sortPending(now time.Time) *queuedHeap {
	s.queues.computeFair()
	// The views and the heap's entries reuse the last cycle's arrays: with 10,000 pending a
	// cycle allocated 1.7 MB for them, and a leader running a cycle per admission spent
	// 13% of its CPU collecting garbage. A view is valid for its cycle only (plugins are
	// given it for the cycle's calls).
	n := len(s.pending)
	if cap(s.viewBuf) < n {
		s.viewBuf, s.heapBuf = make([]QueuedGang, n, n+n/4), make([]heapEntry, n, n+n/4)
	}
	clear(s.viewBuf[n:cap(s.viewBuf)]) // no gang kept alive by an old view
	clear(s.heapBuf[n:cap(s.heapBuf)])
	infos, es := s.viewBuf[:n], s.heapBuf[:n]
	h := &queuedHeap{es: es, less: s.prof.queueSort.Less}
	if u, ok := s.prof.queueSort.(urgencySort); ok {
		h.urgency = &u
	}
	ks, keyed := s.prof.queueSort.(keyedSort)
	for i, g := range s.pending {
		g.accountWait(now)
		v := &infos[i]
		*v = s.queuedView(g, now)
		if keyed {
			v.sortKey, v.keyed = ks.key(v), true
		}
		h.es[i] = heapEntry{key: v.sortKey, dyn: v.Dynamic, class: v.Class, seq: v.Seq, under: v.UnderShare, qg: v}
	}
	h.init()
	return h
}

func (s *Scheduler) queuedView(g *gangState, now time.Time) QueuedGang {
	// What dynamicPriority reads, computed once for the view: it runs for every pending
	// gang at every cycle.
	age := s.age(g, now)
	left, known := s.expectedLeftAt(g, age)
	ratio := g.q.ratio(s.c)
	v := QueuedGang{
		Request: &g.req, Seq: g.seq, Submitted: g.submit,
		Class: s.effClass(g, now), Dynamic: s.dynamicPriorityOf(g, age, left, known, ratio),
		Attained: g.attained, Evictions: g.evictions, FitSince: g.fitSince, g: g,
		UnderShare: ratio < 1,
	}
	if !g.queued.IsZero() && now.After(g.queued) {
		v.Waited = now.Sub(g.queued)
	}
	if known && left > 0 {
		v.RemainingGPUSeconds = left.Seconds() * float64(g.req.Min) * float64(g.req.Member.TotalMilli()) / Milli
	}
	return v
}

func (s *Scheduler) runPreFilter(a *attempt, now time.Time) *Status {
	for _, p := range s.prof.preFilter {
		if st := p.PreFilter(s, a.state, a.g, now); !st.IsSuccess() {
			st.Plugin = p.Name()
			return st
		}
	}
	return nil
}

func (s *Scheduler) runPermit(a *attempt, best *candidate, now time.Time) *Status {
	c := &Candidate{placed: a.base, add: best.allocs, Input: &best.in}
	for _, p := range s.prof.permit {
		if st := p.Permit(s, a.state, a.g, c, now); !st.IsSuccess() {
			st.Plugin = p.Name()
			return st
		}
	}
	return nil
}

// runPostFilter asks the PostFilter plugins in turn; the first result with preemptions is
// carried out: victims are marked as stopping and the freed nodes are held for g. Without
// one, it returns the earliest retry time any plugin gave (or nil).
func (s *Scheduler) runPostFilter(a *attempt, may Victims, now time.Time) *PostFilterResult {
	g := a.g
	var retry *PostFilterResult
	for _, p := range s.prof.postFilter {
		res := p.PostFilter(s, a.state, g, may, now)
		if res == nil {
			continue
		}
		if len(res.Preemptions)+len(res.Resizes) == 0 {
			if !res.RetryAt.IsZero() && (retry == nil || res.RetryAt.Before(retry.RetryAt)) {
				retry = &PostFilterResult{RetryAt: res.RetryAt}
			}
			continue
		}
		for _, pr := range res.Preemptions {
			if v, ok := s.gangs[pr.Victim]; ok && v.status == stRunning {
				v.status = stTerminating
				v.keptUntil = pr.Costs.Kept
			}
		}
		for _, rz := range res.Resizes {
			if v, ok := s.gangs[rz.Gang]; ok && v.status == stRunning && rz.To >= v.req.Min && rz.To < v.members {
				v.shrinkTo, v.shrinkIdx = rz.To, rz.RemoveIndex
				v.lastResize = now
			}
		}
		nodes := make(map[int]bool, len(res.Nodes))
		for _, n := range res.Nodes {
			nodes[n] = true
		}
		s.holds[g.Request.ID] = &reservation{gang: g.Request.ID, start: res.ReadyAt, nodes: nodes, preemptor: true, skipPermit: res.SkipPermit}
		s.log.Debug("preempting", zap.String("for", g.Request.ID), zap.Int("victims", len(res.Preemptions)), zap.String("plugin", p.Name()))
		return res
	}
	return retry
}

// wakeAt asks for a cycle at t (the earliest asked for wins).
func (d *Decisions) wakeAt(t time.Time) {
	if !t.IsZero() && t.After(d.Now) && (d.NextCycle.IsZero() || t.Before(d.NextCycle)) {
		d.NextCycle = t
	}
}

// runReserve asks the Reserve plugins in turn; the first reservation is installed and
// returned.
func (s *Scheduler) runReserve(a *attempt, compact bool, now time.Time) *reservation {
	for _, p := range s.prof.reserve {
		if r := p.Reserve(s, a.state, a.g, compact, now); r != nil {
			nodes := make(map[int]bool, len(r.Nodes))
			for _, n := range r.Nodes {
				nodes[n] = true
			}
			s.dropReservation(r.Gang)
			res := &reservation{gang: r.Gang, start: r.Start, nodes: nodes}
			s.resvs = append(s.resvs, res)
			return res
		}
	}
	return nil
}

// addWaiting records why g waits and reports it in the decisions.
func (s *Scheduler) addWaiting(d *Decisions, g *gangState, st *Status) {
	s.setWaiting(g, st)
	if len(d.Waiting) < s.cfg.MaxWaitingReported {
		d.Waiting = append(d.Waiting, g.wait)
	}
}

// replaceWaiting records a better reason for g than the one just reported.
func (s *Scheduler) replaceWaiting(d *Decisions, g *gangState, st *Status) {
	s.setWaiting(g, st)
	if n := len(d.Waiting); n > 0 && d.Waiting[n-1].Gang == g.req.ID {
		d.Waiting[n-1] = g.wait
	}
}

// setWaiting records why g waits, from this cycle on.
func (s *Scheduler) setWaiting(g *gangState, st *Status) {
	g.wait = Waiting{Gang: g.req.ID, Kind: st.Kind, Reason: st.Reason}
	g.waitCycle = s.cycles
}

func touches(allocs []alloc, nodes map[int]bool) bool {
	for _, a := range allocs {
		if nodes[a.node] {
			return true
		}
	}
	return false
}

// exclusion returns the nodes gang g may not use now: those held for preemptors and those
// of this cycle's reservations, unless held for g itself, or for a gang of lower priority
// (a reservation does not hold back more important work), or, for a reservation, when g
// is bound to finish before it starts (backfill: its declared Duration or TimeLimit says
// so; a prediction does not).
func (s *Scheduler) exclusion(g *gangState, now time.Time) map[int]bool {
	excl, _ := s.exclusionKeyed(g, now)
	return excl
}

// exclusionKeyed is exclusion plus a key naming the reservations that apply ("" for none).
func (s *Scheduler) exclusionKeyed(g *gangState, now time.Time) (map[int]bool, string) {
	var excl map[int]bool
	var key []string
	n := 0
	add := func(r *reservation) {
		if r.gang == g.req.ID {
			return
		}
		if rg, ok := s.gangs[r.gang]; ok && g.req.Priority > rg.req.Priority {
			return
		}
		if b, ok := s.upperBound(g); ok && !r.preemptor && !now.Add(b).After(r.start) {
			return // it ends before the reservation starts: backfill
		}
		key = append(key, r.gang)
		switch n++; n {
		case 1:
			excl = r.nodes // shared, read-only: most cycles have one reservation
		case 2:
			u := make(map[int]bool, len(excl)+len(r.nodes))
			for k := range excl {
				u[k] = true
			}
			excl = u
			fallthrough
		default:
			for k := range r.nodes {
				excl[k] = true
			}
		}
	}
	for _, r := range s.holds {
		add(r)
	}
	for _, r := range s.resvs {
		add(r)
	}
	if len(key) > 1 {
		sort.Strings(key)
	}
	return excl, strings.Join(key, "\x00")
}

// placeElastic tries Max members, then (elastic gangs) as many as the free capacity could
// hold, then Min; it takes the first compact placement (on the fewest machines its size
// needs), else the largest found. Without a placement it says why Min does not fit.
func (s *Scheduler) placeElastic(g *gangState, excl map[int]bool) (*candidate, int, *Status) {
	sizes := []int{g.req.Max}
	if g.req.Min < g.req.Max {
		if per := int64(g.req.Member.TotalMilli()); per > 0 {
			if k := int((s.c.totalMilli - s.c.usedMilli) / per); k > g.req.Min && k < g.req.Max {
				sizes = append(sizes, k)
			}
		}
		sizes = append(sizes, g.req.Min)
	}
	var best *candidate
	bestN := 0
	for _, n := range sizes {
		cand := s.place(g, n, excl)
		if cand == nil {
			continue
		}
		if cand.in.Machines <= cand.in.MinMachines {
			return cand, n, nil
		}
		if best == nil {
			best, bestN = cand, n
		}
	}
	if best != nil {
		return best, bestN, nil
	}
	return nil, 0, s.unfit(g, g.req.Min, excl)
}

func (s *Scheduler) commitPlacement(g *gangState, cand *candidate, members int, now time.Time) Placement {
	g.accountWait(now)
	s.bind(g, cand.allocs, members, now)
	p := Placement{
		Gang:      g.req.ID,
		Scores:    cand.scores,
		Total:     cand.total,
		Islands:   cand.in.Islands,
		Machines:  cand.in.Machines,
		Racks:     cand.in.Racks,
		AllReduce: cand.in.AllReduce,
	}
	for _, a := range cand.allocs {
		p.Members = append(p.Members, s.memberPlacement(g, a))
	}
	s.log.Debug("placed", zap.String("gang", g.req.ID), zap.Int("members", members), zap.Int("machines", p.Machines), zap.Duration("allreduce", p.AllReduce))
	return p
}
