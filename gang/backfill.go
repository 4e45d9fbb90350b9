package gang

import (
	"container/heap"
	"time"
)

// backfill is the Reserve plugin of Slurm-style backfill: it holds capacity for a blocked
// gang at the earliest time running gangs with known durations free enough of it (the
// shadow time); others may use the held nodes only if they end before it.
type backfill struct{}

func (backfill) Name() string { return PluginBackfill }

func (backfill) Reserve(h Handle, state *CycleState, g *QueuedGang, compact bool, now time.Time) *Reservation {
	if !compact && g.Waited < h.Config().BackfillAfter {
		return nil
	}
	start, f := shadowSearch(h, state, g, compact, now)
	if f == nil {
		return nil
	}
	return &Reservation{Gang: g.Request.ID, Start: start, Nodes: f.Nodes}
}

// shadowSearch releases running gangs with known durations in end order until g fits,
// within Config.MaxReservationTries placement attempts; it returns when (never before
// now) and where, or a zero time and nil.
func shadowSearch(h Handle, state *CycleState, g *QueuedGang, compact bool, now time.Time) (time.Time, *Fit) {
	all := h.RunningGangs(now)
	running := make([]*RunningGang, 0, len(all))
	for i := range all {
		if !all[i].ExpectedEnd.IsZero() {
			running = append(running, &all[i])
		}
	}
	if len(running) == 0 {
		return time.Time{}, nil
	}
	// A heap, not a sort: the search usually stops after a few hundred of many thousands.
	eh := &endHeap{gs: running}
	heap.Init(eh)
	need := int64(g.Request.Min) * int64(g.Request.Member.TotalMilli())
	t := h.NewTrial()
	defer t.Discard()
	limit := h.Config().MaxReservationTries
	tries := 0
	for eh.Len() > 0 {
		v := heap.Pop(eh).(*RunningGang)
		t.Evict(v)
		if t.FreeMilli() < need {
			continue
		}
		if tries++; tries > limit {
			return time.Time{}, nil
		}
		if f := t.Fits(state, g, g.Request.Min, compact); f != nil {
			if v.ExpectedEnd.Before(now) {
				return now, f
			}
			return v.ExpectedEnd, f
		}
	}
	return time.Time{}, nil
}

// endHeap orders running gangs by expected end, then arrival.
type endHeap struct {
	gs []*RunningGang
}

func (h *endHeap) Len() int { return len(h.gs) }
func (h *endHeap) Less(i, j int) bool {
	ei, ej := h.gs[i].ExpectedEnd, h.gs[j].ExpectedEnd
	if !ei.Equal(ej) {
		return ei.Before(ej)
	}
	return h.gs[i].Seq < h.gs[j].Seq
}
func (h *endHeap) Swap(i, j int) { h.gs[i], h.gs[j] = h.gs[j], h.gs[i] }
func (h *endHeap) Push(x any)    { h.gs = append(h.gs, x.(*RunningGang)) }
func (h *endHeap) Pop() any {
	x := h.gs[len(h.gs)-1]
	h.gs = h.gs[:len(h.gs)-1]
	return x
}
