package head

import (
	"context"
	"errors"
	"slices"
	"sort"
	"sync"

	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/store/meta"
	"github.com/atoll-run/atoll/store/meta/metaserver"
)

// placedHub wakes the agents' filtered watches of the gangs table (machine=NAME) only when
// an event concerns their machine. Each such watch used to wait on the state machine's
// own wakeup, which every committed transaction broadcasts to every waiter: at 2,000
// machines each commit made 2,000 goroutines runnable at once, each took the state
// machine's lock to scan the history and went back to sleep, and the replica's own apply
// and heartbeats waited behind them for seconds (the leadership moved again and again;
// the execution trace put 74% of the head's scheduling delay on that broadcast). One
// goroutine follows the table instead, decodes each record once, and wakes the machines a
// record places a member on, or every machine for a record that may concern any (a gang
// ended, requeued, or deleted: api.GangConcerns).
type placedHub struct {
	sm *metaserver.StateMachine

	mu sync.Mutex
	// last is the newest revision that concerned a machine, all the newest that
	// concerned every machine.
	last    map[string]int64
	all     int64
	waiters map[string][]chan struct{}
	// ended is the keys whose last record seen was an ended gang: every machine was woken
	// for that record, and agents drop an ended gang, so its deletion (the retention of
	// ended gangs, retention.go) concerns none. Only the dispatcher touches it.
	ended map[string]bool
	// placed is, by gang key, the machines of the last record that placed the gang, as the
	// dispatcher saw it: a gang requeued, ended or deleted concerns those machines only,
	// not every machine (15,000 task workers stopped at once were 15,000 records sent to
	// each of 2,000 agents). A gang the hub never saw placed concerns every machine.
	placed map[string][]string
	// revs are, by machine, the revisions (ascending) of the events that concern it, and
	// every those that concern every machine: a woken watch reads those revisions of the
	// history and no other (placedEvents). covered is the revision dispatched through.
	// A list holds the revisions after its floor only (floors, everyFloor: a list past
	// maxConcernRevs keeps its newer half; floor: the dispatcher fell behind the history
	// and lost events): a watch from before reads the whole history after it instead.
	revs       map[string][]int64
	every      []int64
	floors     map[string]int64
	everyFloor int64
	floor      int64
	covered    int64
}

// maxConcernRevs bounds a machine's list of revisions (and the list of those that concern
// every machine): past it the older half is dropped.
const maxConcernRevs = 2048

func newPlacedHub(sm *metaserver.StateMachine) *placedHub {
	h := &placedHub{sm: sm, last: map[string]int64{}, waiters: map[string][]chan struct{}{}, ended: map[string]bool{},
		placed: map[string][]string{}, revs: map[string][]int64{}, floors: map[string]int64{}}
	if sm != nil {
		h.covered = sm.Revision()
		h.floor = h.covered // what came before the hub is not in its lists
	}
	return h
}

// run follows the gangs table until ctx ends.
func (h *placedHub) run(ctx context.Context) {
	h.mu.Lock()
	rev := h.covered
	h.mu.Unlock()
	for ctx.Err() == nil {
		evs, covered, err := h.sm.EventsSince(ctx, api.TableGangs, rev, 4096)
		if errors.Is(err, meta.ErrCompacted) {
			// Fell behind the history: any machine may have missed its events.
			rev = h.sm.Revision()
			h.dispatch(nil, rev, true)
			continue
		}
		if err != nil {
			return
		}
		h.dispatch(evs, covered, false)
		rev = covered
	}
}

// dispatch records what the events up to covered concern and wakes those waiting.
func (h *placedHub) dispatch(evs []meta.Event, covered int64, everyone bool) {
	concerned := map[string]bool{}
	type concern struct {
		rev      int64
		machines []string
		every    bool
	}
	concerns := make([]concern, 0, len(evs))
	for _, ev := range evs {
		key := ev.KV.Key
		prev, seen := h.placed[key]
		if ev.Type == meta.EventDelete {
			switch {
			case h.ended[key]:
			case seen: // deleted while it may have held the machines it was placed on
				for _, m := range prev {
					concerned[m] = true
				}
				concerns = append(concerns, concern{rev: ev.Revision, machines: prev})
			default: // a gang deleted while it may have held machines the hub does not know
				everyone = true
				concerns = append(concerns, concern{rev: ev.Revision, every: true})
			}
			delete(h.ended, key)
			delete(h.placed, key)
			continue
		}
		machines, every, ended := api.GangConcernedMachines(ev.KV.Value)
		if every && (seen || len(machines) > 0) {
			// Requeued or ended: the machines it was placed on (the record's, and those of
			// the last record that placed it) are the ones that may run it.
			for _, m := range prev {
				if !slices.Contains(machines, m) {
					machines = append(machines, m)
				}
			}
			every = false
		}
		switch {
		case ended:
			h.ended[key] = true
			delete(h.placed, key)
		case len(machines) > 0:
			delete(h.ended, key)
			h.placed[key] = machines
		default:
			delete(h.ended, key)
		}
		for _, m := range machines {
			concerned[m] = true
		}
		everyone = everyone || every
		if every || len(machines) > 0 {
			concerns = append(concerns, concern{rev: ev.Revision, machines: machines, every: every})
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if evs == nil && everyone { // fell behind the history: the lists lost events
		h.floor = covered
		h.revs, h.every = map[string][]int64{}, nil
	}
	for _, c := range concerns {
		if c.every {
			h.every = appendRev(h.every, c.rev, &h.everyFloor)
		}
		for _, m := range c.machines {
			fl := h.floors[m]
			h.revs[m] = appendRev(h.revs[m], c.rev, &fl)
			h.floors[m] = fl
		}
	}
	h.covered = max(h.covered, covered)
	if everyone {
		h.all = covered
		for m, ws := range h.waiters {
			for _, w := range ws {
				close(w)
			}
			delete(h.waiters, m)
		}
		return
	}
	for m := range concerned {
		h.last[m] = covered
		for _, w := range h.waiters[m] {
			close(w)
		}
		delete(h.waiters, m)
	}
}

// appendRev adds rev to a list of ascending revisions (once); past maxConcernRevs it
// keeps the newer half and raises floor to the newest revision dropped.
func appendRev(list []int64, rev int64, floor *int64) []int64 {
	if n := len(list); n > 0 && list[n-1] >= rev {
		return list
	}
	if len(list) >= maxConcernRevs {
		half := len(list) / 2
		*floor = max(*floor, list[half-1])
		list = append(list[:0:0], list[half:]...)
	}
	return append(list, rev)
}

// concerning is the revisions after rev, up to what the hub has dispatched, of the events
// that may concern machine (its own and every machine's, merged), and the revision they
// cover; ok is false when the lists cannot say (rev is before a list's floor): the caller
// then reads the whole history after rev.
func (h *placedHub) concerning(machine string, rev int64) (revs []int64, covered int64, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if rev < h.floor || rev < h.floors[machine] || rev < h.everyFloor {
		return nil, 0, false
	}
	mine, all := h.revs[machine], h.every
	i := sort.Search(len(mine), func(i int) bool { return mine[i] > rev })
	j := sort.Search(len(all), func(j int) bool { return all[j] > rev })
	for i < len(mine) || j < len(all) {
		switch {
		case j == len(all) || i < len(mine) && mine[i] < all[j]:
			revs = append(revs, mine[i])
			i++
		case i == len(mine) || all[j] < mine[i]:
			revs = append(revs, all[j])
			j++
		default: // the same revision in both
			revs = append(revs, mine[i])
			i++
			j++
		}
	}
	return revs, max(h.covered, rev), true
}

// wait returns a channel closed once an event after rev may concern machine (at once when
// one already has), and a func that stops waiting.
func (h *placedHub) wait(machine string, rev int64) (<-chan struct{}, func()) {
	ch := make(chan struct{})
	h.mu.Lock()
	defer h.mu.Unlock()
	if max(h.last[machine], h.all) > rev {
		close(ch)
		return ch, func() {}
	}
	h.waiters[machine] = append(h.waiters[machine], ch)
	return ch, func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		ws := h.waiters[machine]
		for i, w := range ws {
			if w == ch {
				h.waiters[machine] = append(ws[:i], ws[i+1:]...)
				break
			}
		}
		if len(h.waiters[machine]) == 0 {
			delete(h.waiters, machine)
		}
	}
}
