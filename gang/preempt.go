package gang

import (
	"slices"
	"sort"
	"time"
)

// PreemptConfig tunes the in-tree preemption plugin: when an eviction pays for itself.
type PreemptConfig struct {
	// GainRatio: evict only when the preemptor's weighted gain is at least GainRatio times
	// the victims' weighted cost (default 1: the eviction must pay for itself).
	GainRatio float64
	// MaxEvictions is each gang's eviction budget: a gang evicted that often is no longer a
	// victim (0: no budget). Default 2.
	MaxEvictions int
	// Backoff doubles a victim's protection after each eviction: a gang evicted k times
	// is not evicted again until it has run MinRunBeforePreempt × 2^k since its restart.
	Backoff bool
	// RemainingRatio, when positive, also lets a gang evict gangs of its own or a lower
	// class whose weighted remaining work is at least RemainingRatio times its own
	// (shortest-remaining-first preemption, cause "remaining"); both durations must be
	// known. 0 disables it.
	RemainingRatio float64
	// RemainingRule, when both durations are known, evicts a victim only when the
	// preemptor is more urgent per unit of remaining work (Smith's rule, which orders
	// work to minimise weighted completion time): w(preemptor) / remaining GPU-seconds of
	// the preemptor ≥ w(victim) / remaining GPU-seconds of the victim. A victim about to
	// finish is then left to finish.
	RemainingRule bool
	// StarvationWait bounds how long the preemption search budget can pass a gang over: a
	// gang of priority p ≥ StarvationPriority that has waited StarvationWait /
	// ClassWeight^p since it last queued is starving. Its preemption search then does not
	// count against MaxPreemptionSearches (the starving gangs of each class have as many
	// again of their own), and it is tried even when a gang of its shape and no more
	// members found no placement earlier in the cycle (its search may find victims the
	// other's could not). Without it, a large gang whose remaining work is predicted long
	// sorts behind a stream of smaller gangs that use up the cycle's searches, and waits
	// for days (BENCHMARKS.md, issue 22). Victims are chosen as for any gang, and once it
	// has waited OwnClassAfter a starving gang may also evict gangs of its own class that
	// were running when it queued, so have run at least as long as it has waited (cause
	// "starvation"; Smith's rule and the protections still apply): service within the
	// class then goes to the gang that has had none for longer, as Tiresias'
	// least-attained-service order gives it. Without that, a class whose small gangs sit
	// on every machine leaves its large gangs no machine to clear (on the Philly slice,
	// 8- and 16-GPU gangs waited days beside 77 running gangs of their class). Default
	// 64 h: one hour for priority 2 with ClassWeight 8. 0 disables it.
	StarvationWait time.Duration
	// StarvationPriority is the lowest priority StarvationWait applies to (default 2, the
	// simulator's high class: starving normal-class gangs measured worse, BENCHMARKS.md).
	StarvationPriority int
	// OwnClassAfter is the least a starving gang waits before it may evict gangs of its
	// own class (default 1 h, the simulator's high class's starvation bound): a live
	// cluster's priority values are whatever its operator chose, and ClassWeight^p of a
	// priority of 10 makes every gang of it starving at once; equal-priority work is never
	// evicted sooner than this. Latency-sensitive gangs (a service's replicas) neither
	// evict their own class nor are evicted by it.
	OwnClassAfter time.Duration
	// StarvationRetry is how long a starving gang whose search found no victims waits
	// before it searches from its class's starving budget again (default 10 min): the
	// budget then goes round the class's starving gangs instead of being spent, cycle
	// after cycle, by the first ones in the order that cannot be helped. Until then it is
	// tried as any gang is.
	StarvationRetry time.Duration
	// RetryResolution is the granularity of the time at which a preemption that does not
	// pay for itself yet is tried again (rounded up to a multiple of it, at least one
	// step). Default 1 s, the traces' resolution; a live cluster uses a finer one.
	RetryResolution time.Duration
}

// DefaultPreemptConfig returns the defaults above.
func DefaultPreemptConfig() PreemptConfig {
	return PreemptConfig{GainRatio: 1, Backoff: true, RemainingRule: true, StarvationWait: 64 * time.Hour, StarvationPriority: 2,
		OwnClassAfter: time.Hour, StarvationRetry: 10 * time.Minute, RetryResolution: time.Second}
}

// EvictionCost implements Handle: what stopping r at now costs, with the time it will have
// stopped by.
func (s *Scheduler) EvictionCost(r *RunningGang, now time.Time) EvictionCost {
	return s.evictionCost(r.g, now)
}

// preemption is the PostFilter that evicts whole gangs for a blocked one, only when that
// pays for itself:
//   - victims, as the action's Victims allow: lower-priority gangs (cause "priority",
//     action preempt) or, for a gang of an under-share queue, gangs of over-share queues
//     no more important than it ("fair-share reclaim", action reclaim);
//     not NotPreemptible, past their protection (MinRunBeforePreempt, doubled per earlier
//     eviction with Backoff), within their eviction budget, and, when durations are
//     known, not more urgent than the preemptor by Smith's rule (RemainingRule); a
//     starving preemptor (PreemptConfig.StarvationWait, OwnClassAfter) may also take
//     gangs of its own class that were running when it queued (cause "starvation");
//   - chosen cheapest first by weighted cost (the cost model: lost work or the
//     just-in-time save, restore, CUDA context, communicator set-up, times GPUs, times the
//     class weight), added until the preemptor fits, then pruned of any that turn out
//     unnecessary; nothing is evicted unless the freed capacity admits the preemptor;
//   - carried out only when the gain, the preemptor's weighted GPUs times the wait it is
//     spared (the longer of its wait so far and the wait until running gangs with known
//     durations free room for it), is at least GainRatio times that cost. Otherwise the
//     result says when the wait so far will make it worth it, so the cycle runs again then.
type preemption struct{}

func (preemption) Name() string { return PluginPreemption }

type victim struct {
	r        *RunningGang
	shrinkTo int // > 0: shrink to this many members instead of evicting
	// shrinkable: an eviction of an elastic gang that may be shrunk instead (to its Min,
	// past its resize protection), should that be enough after all.
	shrinkable bool
	cost       EvictionCost
	w          float64 // class weight
	wcost      float64 // cost.GPUSeconds × w
	reason     string
}

func (preemption) PostFilter(h Handle, state *CycleState, g *QueuedGang, may Victims, now time.Time) *PostFilterResult {
	cfg := h.Config()
	pc := cfg.Preempt
	under := cfg.FairShareReclaim && h.QueueRatio(g.Request.Queue) < 1
	wp := cfg.classWeight(g.Request.Priority)
	ownClass := may.Priority && cfg.starving(g) && g.Waited >= pc.OwnClassAfter && !g.Request.LatencySensitive
	if s, ok := h.(*Scheduler); ok && !s.mayHaveVictims(g, may, under, pc.RemainingRatio > 0 && g.RemainingGPUSeconds > 0 || ownClass) {
		return nil // what the loop below would find: no candidate, no victim
	}
	running := h.RunningGangs(now)
	var cands []victim
	for i := range running {
		v := &running[i]
		if v.NotPreemptible || v.Seq == g.Seq {
			continue
		}
		wv := cfg.classWeight(v.Priority)
		known := g.RemainingGPUSeconds > 0 && !v.ExpectedEnd.IsZero()
		rv := 0.0 // the victim's expected remaining GPU-seconds
		if known {
			rv = v.ExpectedEnd.Sub(now).Seconds() * float64(v.MilliGPU) / Milli
		}
		reason := ""
		switch {
		case may.Priority && v.Priority < g.Request.Priority:
			reason = "priority"
		case may.Reclaim && under && v.Queue != g.Request.Queue && v.QueueRatio > 1 && v.Priority <= g.Request.Priority:
			reason = "fair-share reclaim"
		case may.Priority && pc.RemainingRatio > 0 && known && v.Priority <= g.Request.Priority && wp*rv >= pc.RemainingRatio*wv*g.RemainingGPUSeconds:
			reason = "remaining"
		case ownClass && v.Priority == g.Request.Priority && now.Sub(v.Started) >= g.Waited && (v.Request == nil || !v.Request.LatencySensitive):
			reason = "starvation"
		default:
			continue
		}
		shrinkable := false
		if v.Members > v.Min {
			// An elastic gang above its minimum may be shrunk (to any size down to its
			// Min), which is tried before any eviction, or evicted whole like any gang
			// when shrinking it does not make room enough. A shrink is protected for
			// MinRunBeforePreempt after its start or its last resize.
			since := v.Started
			if v.LastResized.After(since) {
				since = v.LastResized
			}
			if now.Sub(since) >= cfg.MinRunBeforePreempt {
				c := h.ShrinkCost(v, v.Min, now)
				cands = append(cands, victim{r: v, shrinkTo: v.Min, cost: c, w: wv, wcost: c.GPUSeconds * wv, reason: reason})
				shrinkable = true
			}
		}
		protect := cfg.MinRunBeforePreempt
		if pc.Backoff {
			protect <<= min(v.Evictions, 16)
		}
		if now.Sub(v.Started) < protect || (pc.MaxEvictions > 0 && v.Evictions >= pc.MaxEvictions) {
			continue
		}
		if pc.RemainingRule && known && wp*rv < wv*g.RemainingGPUSeconds {
			continue // the victim is as urgent per unit of work left: let it finish
		}
		c := h.EvictionCost(v, now)
		cands = append(cands, victim{r: v, shrinkable: shrinkable, cost: c, w: wv, wcost: c.GPUSeconds * wv, reason: reason})
	}
	sortVictims(cands)
	// With a topology wait, only room for a compact placement admits the gang (it would
	// wait on in scattered room, and the evictions would be wasted): victims are then
	// taken machine by machine, the machines cheapest to free first (byMachine). Without
	// one, any room does, and the gang takes it as it is (Permit skipped).
	//
	// A gang of the classes that starve soonest (Preempt.StarvationPriority and above)
	// wants compact room only while its topology wait for unforeseen room
	// (TopologyWaitUnforeseen divided by its class weight) runs from its queueing: room
	// made by evictions cannot be foreseen, and past that wait its Permit takes scattered
	// room anyway. Without that, a high-priority gang among running gangs of its own
	// class, where no machine can be cleared of lower classes alone, waited until it
	// could evict its own class (BENCHMARKS.md, issue 22).
	compact := slices.Contains(cfg.resolved().Permit, PluginTopologyWait) && cfg.topologyWait(g.Request) > 0
	if compact && g.Request.Priority >= pc.StarvationPriority &&
		g.Waited >= cfg.topologyWaitUnforeseen(g.Request.Priority) {
		compact = false
	}
	if compact {
		cands = byMachine(h, g, cands, now)
	}
	found, chosen := chooseVictims(h, state, g, cands, now, compact)
	if found == nil {
		return nil
	}
	var wcost float64
	for _, c := range chosen {
		wcost += c.wcost
	}
	gpus := float64(g.Request.Min) * float64(g.Request.Member.TotalMilli()) / Milli
	wait := g.Waited
	if start, ok := shadowStart(h, state, g, compact, now); ok && start.Sub(now) > wait {
		wait = start.Sub(now)
	}
	if gain := wp * gpus * wait.Seconds(); gain < pc.GainRatio*wcost {
		// Worth it once the wait so far alone pays for the evictions (ski rental).
		worth := time.Duration(pc.GainRatio * wcost / (wp * gpus) * float64(time.Second))
		step := pc.RetryResolution
		if step <= 0 {
			step = time.Second
		}
		return &PostFilterResult{RetryAt: now.Add(max(ceilTo(worth-g.Waited, step), step))}
	}
	res := evictionResult(g, found, chosen)
	res.SkipPermit = !compact
	return res
}

// mayHaveVictims reports whether any running gang could be a victim of g in the
// preemption plugin: a preemptible gang, whole (not stopping, not shrinking), of g's class
// or below, and either below it (a priority preemption), of another queue (a reclaim for
// a queue under its share), or any such when the remaining-work rule or the own-class
// rule of starvation may apply (ownClass). A superset of the plugin's candidates, read
// from the gangs' state without their views: with thousands running and none a candidate
// (one class, one queue, durations unknown), viewing every running gang was 18% of a
// leader's CPU.
func (s *Scheduler) mayHaveVictims(g *QueuedGang, may Victims, under, ownClass bool) bool {
	p := g.Request.Priority
	for _, v := range s.running {
		if v.status != stRunning || v.shrinkTo != 0 || v.req.NotPreemptible || v.req.Priority > p {
			continue
		}
		if may.Priority && (v.req.Priority < p || ownClass) {
			return true
		}
		if may.Reclaim && under && v.req.Queue != g.Request.Queue {
			return true
		}
	}
	return false
}

// byMachine reorders victims for a gang that needs compact room: shrinks first (they cost
// least), then the evictions that clear a machine (its cards free or held by victims, and
// it open to the gang), the machines whose victims cost least together first (ties: the
// one whose first victim comes first), then the rest in their order. Cheapest first over
// the whole cluster frees scattered cards, which a compact placement cannot use; victims a
// smaller gang turns out not to need are dropped afterwards (chooseVictims).
func byMachine(h Handle, g *QueuedGang, cands []victim, now time.Time) []victim {
	s, ok := h.(*Scheduler)
	if !ok {
		return cands
	}
	excl := s.exclusion(g.g, now)
	type machine struct {
		node    int
		first   int   // position of its first victim in cands
		held    int64 // milli-GPU its victims hold on it
		cost    float64
		victims []int // indexes into cands, in their order
	}
	per := map[int]*machine{}
	var order []int
	for i, c := range cands {
		if c.shrinkTo > 0 {
			continue
		}
		seen := map[int]bool{}
		for _, a := range c.r.g.allocs {
			m := per[a.node]
			if m == nil {
				m = &machine{node: a.node, first: i}
				per[a.node] = m
				order = append(order, a.node)
			}
			m.held += int64(a.totalMilli())
			if !seen[a.node] {
				seen[a.node] = true
				m.cost += c.wcost
				m.victims = append(m.victims, i)
			}
		}
	}
	var clear []*machine
	for _, n := range order {
		m := per[n]
		node := &s.c.nodes[n]
		if node.Unschedulable || excl[n] {
			continue
		}
		var total, free int64
		for _, gp := range node.GPUs {
			if !gp.MIG {
				total += Milli
				free += int64(gp.FreeMilli)
			}
		}
		if free+m.held >= total {
			clear = append(clear, m)
		}
	}
	sort.SliceStable(clear, func(i, j int) bool {
		if clear[i].cost != clear[j].cost {
			return clear[i].cost < clear[j].cost
		}
		return clear[i].first < clear[j].first
	})
	out := make([]victim, 0, len(cands))
	taken := make([]bool, len(cands))
	for i, c := range cands {
		if c.shrinkTo > 0 {
			out = append(out, c)
			taken[i] = true
		}
	}
	for _, m := range clear {
		for _, i := range m.victims {
			if !taken[i] {
				taken[i] = true
				out = append(out, cands[i])
			}
		}
	}
	for i, c := range cands {
		if !taken[i] {
			out = append(out, c)
		}
	}
	return out
}

// ceilTo rounds d up to a multiple of step.
func ceilTo(d, step time.Duration) time.Duration {
	return (d + step - 1).Truncate(step)
}

// chooseVictims adds candidates, in the order given, until g fits, then drops the ones that
// turn out unnecessary (the last added first), turns evictions of elastic gangs back into
// shrinks where a shrink is enough, and shrinks no further than needed. An elastic gang
// may come twice, a shrink and an eviction: evicting it after it was shrunk replaces the
// shrink. It returns nil when evicting them all (or the first that
// Config.MaxPreemptionVictims and MaxPreemptionTries allow) would not admit g, or when g
// fits already (only a reservation holds it back).
//
// With compact set, only placements on the fewest machines count as admitting g (so that
// its topology wait does not hold it back from the capacity freed for it).
func chooseVictims(h Handle, state *CycleState, g *QueuedGang, cands []victim, now time.Time, compact bool) (*Fit, []victim) {
	if len(cands) == 0 {
		return nil, nil
	}
	cfg := h.Config()
	t := h.NewTrial()
	defer t.Discard()
	if t.Fits(state, g, g.Request.Min, compact) != nil {
		return nil, nil
	}
	if len(cands) > cfg.MaxPreemptionVictims {
		cands = cands[:cfg.MaxPreemptionVictims]
	}
	need := int64(g.Request.Min) * int64(g.Request.Member.TotalMilli())
	var chosen []victim
	var found *Fit
	tries := 0
	for _, c := range cands {
		if c.shrinkTo > 0 {
			t.Shrink(c.r, c.shrinkTo)
		} else {
			t.Evict(c.r)
			chosen = slices.DeleteFunc(chosen, func(o victim) bool { return o.r.g == c.r.g })
		}
		chosen = append(chosen, c)
		if t.FreeMilli() < need {
			continue
		}
		if tries++; tries > cfg.MaxPreemptionTries {
			break
		}
		if f := t.Fits(state, g, g.Request.Min, compact); f != nil {
			found = f
			break
		}
	}
	if found == nil {
		return nil, nil
	}
	for i := len(chosen) - 1; i >= 0 && len(chosen) > 1; i-- {
		m := t.Mark()
		if t.Retake(chosen[i].r) {
			if f := t.Fits(state, g, g.Request.Min, compact); f != nil {
				found = f
				chosen = append(chosen[:i], chosen[i+1:]...)
				continue
			}
		}
		t.Rollback(m)
	}
	// An elastic gang evicted whole is only shrunk when that is enough (with the others
	// chosen): the shrink costs less than the eviction.
	for i := range chosen {
		c := &chosen[i]
		if c.shrinkTo > 0 || !c.shrinkable || tries >= cfg.MaxPreemptionTries {
			continue
		}
		tries++
		m := t.Mark()
		old := t.rel[c.r.g]
		if !t.keepShrunk(c.r, c.r.Min) {
			continue
		}
		if f := t.Fits(state, g, g.Request.Min, compact); f != nil {
			found = f
			c.shrinkTo = c.r.Min
			continue
		}
		t.Rollback(m)
		t.rel[c.r.g] = old
	}
	// Shrink no further than needed: give members back, the last released first, while g
	// still fits.
	kept := chosen[:0]
	for i := range chosen {
		c := &chosen[i]
		for c.shrinkTo > 0 && c.shrinkTo < c.r.Members && tries < cfg.MaxPreemptionTries {
			tries++
			m := t.Mark()
			if !t.RetakeLast(c.r) {
				break
			}
			f := t.Fits(state, g, g.Request.Min, compact)
			if f == nil {
				t.Rollback(m)
				t.rel[c.r.g] = shrinkMembers(c.r.g, c.shrinkTo)
				break
			}
			found = f
			c.shrinkTo++
		}
		if c.shrinkTo == c.r.Members {
			continue // nothing of it was needed after all
		}
		if c.shrinkTo > 0 {
			c.cost = h.ShrinkCost(c.r, c.shrinkTo, now)
			c.wcost = c.cost.GPUSeconds * c.w
		}
		kept = append(kept, *c)
	}
	if len(kept) == 0 {
		return nil, nil
	}
	return found, kept
}

// evictionResult turns chosen victims into the plugin's result.
func evictionResult(g *QueuedGang, found *Fit, chosen []victim) *PostFilterResult {
	res := &PostFilterResult{Nodes: found.Nodes}
	for _, c := range chosen {
		dl := c.cost.StopBy
		if dl.After(res.ReadyAt) {
			res.ReadyAt = dl
		}
		if c.shrinkTo > 0 {
			rz := Resize{Gang: c.r.ID, From: c.r.Members, To: c.shrinkTo, For: g.Request.ID, Deadline: dl, Cost: c.cost, Cause: c.reason,
				Reason: "shrink for " + g.Request.ID + " (" + c.reason + ")", RemoveIndex: shrinkMembers(c.r.g, c.shrinkTo)}
			all := c.r.MemberPlacements()
			for _, i := range rz.RemoveIndex {
				rz.Remove = append(rz.Remove, all[i])
			}
			res.Resizes = append(res.Resizes, rz)
			continue
		}
		res.Preemptions = append(res.Preemptions, Preemption{
			Victim: c.r.ID, For: g.Request.ID, Deadline: dl, Cost: c.cost.GPUSeconds, Costs: c.cost, Reason: c.reason,
		})
	}
	return res
}

// sortVictims orders candidates: shrinks of elastic gangs first, then cheapest (weighted
// cost), then lowest priority, then latest arrival.
func sortVictims(cands []victim) {
	sort.Slice(cands, func(i, j int) bool {
		if si, sj := cands[i].shrinkTo > 0, cands[j].shrinkTo > 0; si != sj {
			return si
		}
		if cands[i].wcost != cands[j].wcost {
			return cands[i].wcost < cands[j].wcost
		}
		if cands[i].r.Priority != cands[j].r.Priority {
			return cands[i].r.Priority < cands[j].r.Priority
		}
		return cands[i].r.Seq > cands[j].r.Seq
	})
}

// rankPreemption is the PostFilter of the size-based baselines: it evicts running gangs
// that rank after the blocked gang (Tiresias: a gang of the first LAS queue evicts gangs
// demoted to the second; SRTF: a gang evicts gangs with more expected work left),
// cheapest first, whenever that admits it. It has no notion of priority classes and no
// cost-benefit test: the baselines preempt as their papers do.
type rankPreemption struct {
	name  string
	after func(g *QueuedGang, v *RunningGang, now time.Time) bool
}

func (p rankPreemption) Name() string { return p.name }

func (p rankPreemption) PostFilter(h Handle, state *CycleState, g *QueuedGang, may Victims, now time.Time) *PostFilterResult {
	if !may.Priority {
		return nil // its victims rank after the preemptor: a preemption, not a reclaim
	}
	var cands []victim
	running := h.RunningGangs(now)
	for i := range running {
		v := &running[i]
		if v.NotPreemptible || !p.after(g, v, now) {
			continue
		}
		c := h.EvictionCost(v, now)
		cands = append(cands, victim{r: v, cost: c, w: 1, wcost: c.GPUSeconds, reason: p.name})
	}
	sortVictims(cands)
	found, chosen := chooseVictims(h, state, g, cands, now, false)
	if found == nil {
		return nil
	}
	res := evictionResult(g, found, chosen)
	res.SkipPermit = true
	return res
}

// lasAfter: v has left Tiresias' first queue (attained GPU-seconds, this run included, at
// or above the threshold) while g is still in it.
func lasAfter(threshold float64) func(g *QueuedGang, v *RunningGang, now time.Time) bool {
	return func(g *QueuedGang, v *RunningGang, now time.Time) bool {
		return g.Attained < threshold && v.AttainedGPUSeconds >= threshold
	}
}

// srtfAfter: v has more expected GPU-seconds left than g (both known).
func srtfAfter(g *QueuedGang, v *RunningGang, now time.Time) bool {
	if g.RemainingGPUSeconds <= 0 || v.ExpectedEnd.IsZero() {
		return false
	}
	return v.ExpectedEnd.Sub(now).Seconds()*float64(v.MilliGPU)/Milli > g.RemainingGPUSeconds
}

// shadowStart returns when running gangs with known durations, released in end order,
// would leave room for g (the backfill shadow time), and false when they never would
// within Config.MaxReservationTries placement attempts.
func shadowStart(h Handle, state *CycleState, g *QueuedGang, compact bool, now time.Time) (time.Time, bool) {
	start, _ := shadowSearch(h, state, g, compact, now)
	return start, !start.IsZero()
}
