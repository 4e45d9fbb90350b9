package head

import (
	"slices"
	"time"

	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/store/meta"
)

// Retention of ended gangs. A gang's record stays in the log after it ends (stopped or
// failed): `atoll status`, its driver and the dashboard read how it ended. Kept for ever,
// they were every table's and every loop's bulk: a benchmark's 20,000 one-GPU gangs made
// the leader's sweeps, the dashboard, the agents' reconciliation and a new leader's load go
// over all of them, and the log and the heads' memory grew without bound. The leader keeps
// the newest KeepEndedGangs ended gangs and deletes the oldest beyond them, with their
// worker records, as Kubernetes' terminated-pod garbage collector does past its threshold
// (12,500 pods) and Ray's GCS past maximum_gcs_destroyed_actor_cached_count. A gang's
// checkpoints are not touched: a gang of the name can still resume from them.

// DefaultKeepEndedGangs is ControllerConfig.KeepEndedGangs' default.
const DefaultKeepEndedGangs = 10000

// endedRef names one ended gang in the order gangs ended; a ref whose gang has been
// replaced (a new gang of the name) or deleted since is skipped when it comes up.
type endedRef struct {
	key string
	uid string
	at  time.Time // the record's Updated when it ended
}

// endedGangs is the ledger's ended gangs: n counts the ended entries of the ledger (kept
// by putGang, dropGang and setRec), queue their refs oldest first from head on.
type endedGangs struct {
	n     int
	queue []endedRef
	head  int
}

// count counts rec (sign 1) or stops counting it (sign -1) when it is ended.
func (g *endedGangs) count(rec api.Gang, sign int) {
	if !rec.State.Live() {
		g.n += sign
	}
}

// push queues rec, which just ended (or was read ended from the log).
func (g *endedGangs) push(rec api.Gang) {
	g.queue = append(g.queue, endedRef{key: rec.Spec.Key(), uid: rec.UID, at: rec.Updated})
}

// pushEnded queues rec, which just ended and is the ledger's entry of its gang. Refs of
// gangs replaced since (a name reused: task workers, a driver that respawns a gang of one
// name) are only skipped when popped, and pops happen only past the bound: when they are
// most of the queue, they are dropped, so the queue stays within twice the ended gangs
// (amortized O(1) a push).
func (l *ledger) pushEnded(rec api.Gang) {
	g := &l.endedGangs
	g.push(rec)
	if len(g.queue)-g.head <= 2*g.n+1024 {
		return
	}
	kept := make([]endedRef, 0, g.n)
	for _, r := range g.queue[g.head:] {
		if l.endedEntry(r) != nil {
			kept = append(kept, r)
		}
	}
	g.queue, g.head = kept, 0
}

// endedEntry is the ledger's entry of r's gang while it is the ended gang r names, nil
// once it was replaced or deleted.
func (l *ledger) endedEntry(r endedRef) *gangEntry {
	e := l.gangs[r.key]
	if e == nil || e.rec.UID != r.uid || e.rec.State.Live() || !e.rec.Updated.Equal(r.at) {
		return nil
	}
	return e
}

// pop takes the oldest ref, ok false when none is left.
func (g *endedGangs) pop() (endedRef, bool) {
	if g.head == len(g.queue) {
		return endedRef{}, false
	}
	r := g.queue[g.head]
	g.queue[g.head] = endedRef{}
	g.head++
	if g.head > 1024 && g.head*2 > len(g.queue) {
		g.queue = slices.Clone(g.queue[g.head:])
		g.head = 0
	}
	return r, true
}

// sortByEnd orders the queue by the time the gangs ended (after a new leader read them
// from the log in key order).
func (g *endedGangs) sortByEnd() {
	q := g.queue[g.head:]
	slices.SortStableFunc(q, func(a, b endedRef) int { return a.at.Compare(b.at) })
}

// pruneEndedLocked deletes the oldest ended gangs past the configured number, each in a
// commit guarded by the version the ledger holds (with its worker records), and takes them
// out of the ledger.
func (c *Controller) pruneEndedLocked(t *term) []commitFn {
	keep := c.cfg.KeepEndedGangs
	switch {
	case keep < 0:
		return nil
	case keep == 0: // a Controller not made by NewController
		keep = DefaultKeepEndedGangs
	}
	var work []commitFn
	for t.endedGangs.n > keep {
		r, ok := t.endedGangs.pop()
		if !ok {
			break
		}
		e := t.endedEntry(r)
		if e == nil {
			continue // replaced or deleted since it ended
		}
		key := api.TableGangs + r.key
		ops := []meta.Op{{Type: meta.OpDelete, Key: key}}
		for _, kv := range c.sm.Range(api.TableWorkers + r.key + "/") {
			ops = append(ops, meta.Op{Type: meta.OpDelete, Key: kv.Key})
		}
		work = append(work, commitFn{what: "retention: ended gang " + r.key, cmp: []meta.Compare{{Key: key, Version: e.ver}}, ops: ops})
		t.dropGang(r.key)
		if c.obs != nil {
			c.obs.endedDeleted.Inc()
		}
	}
	return work
}
