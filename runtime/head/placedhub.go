package head

import (
	"context"
	"errors"
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
}

func newPlacedHub(sm *metaserver.StateMachine) *placedHub {
	return &placedHub{sm: sm, last: map[string]int64{}, waiters: map[string][]chan struct{}{}, ended: map[string]bool{}}
}

// run follows the gangs table until ctx ends.
func (h *placedHub) run(ctx context.Context) {
	rev := h.sm.Revision()
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
	for _, ev := range evs {
		if ev.Type == meta.EventDelete {
			if !h.ended[ev.KV.Key] {
				everyone = true // a gang deleted while it may have held machines
			}
			delete(h.ended, ev.KV.Key)
			continue
		}
		machines, every, ended := api.GangConcernedMachines(ev.KV.Value)
		if ended {
			h.ended[ev.KV.Key] = true
		} else {
			delete(h.ended, ev.KV.Key)
		}
		for _, m := range machines {
			concerned[m] = true
		}
		everyone = everyone || every
	}
	h.mu.Lock()
	defer h.mu.Unlock()
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
