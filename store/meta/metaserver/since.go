package metaserver

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/atoll-run/atoll/store/meta"
)

// EventsSince returns the events after fromRev whose key has the prefix, in order, waiting
// until ctx ends for the first one, and the revision the answer covers: read again from it.
// An answer never splits a revision (a transaction's events come together); it stops at a
// revision boundary once it holds at least max events (max <= 0: no bound). With no event
// (ctx ended first) the covered revision is the current one, so a watcher of a quiet prefix
// moves forward. It fails with ErrCompacted when events after fromRev are no longer kept.
func (s *StateMachine) EventsSince(ctx context.Context, prefix string, fromRev int64, max int) ([]meta.Event, int64, error) {
	stop := context.AfterFunc(ctx, func() {
		s.mu.Lock()
		s.cond.Broadcast()
		s.mu.Unlock()
	})
	defer stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	next := fromRev
	for {
		out, covered, err := s.eventsAfterLocked(prefix, next, max)
		if err != nil || len(out) > 0 || ctx.Err() != nil {
			return out, covered, err
		}
		next = covered
		for ctx.Err() == nil && s.revision <= next {
			s.cond.Wait()
		}
	}
}

// EventsView is what the history holds after revision next now (perhaps nothing, covering
// the current revision), every prefix, without a copy: EventsSince without the wait, for
// a caller that learns of new revisions otherwise (a dispatcher that wakes only the
// watchers an event concerns). The slice shares the history's array: the caller reads
// it and must not write it (a full slice expression keeps an append from reaching the
// history's later elements). It is safe because the history is only appended to and cut
// by copying into a new array, so the elements a view sees are never written again. A
// filtered watch reads many events for each one it keeps: copying them all, under the
// state machine's lock, was most of the cost of a cluster's agents' watches.
func (s *StateMachine) EventsView(next int64) ([]meta.Event, int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if next < s.compact {
		return nil, next, fmt.Errorf("meta: events after revision %d (history starts after %d): %w", next, s.compact, meta.ErrCompacted)
	}
	i := sort.Search(len(s.history), func(i int) bool { return s.history[i].Revision > next })
	n := len(s.history)
	return s.history[i:n:n], max(s.revision, next), nil
}

func (s *StateMachine) eventsAfterLocked(prefix string, next int64, limit int) ([]meta.Event, int64, error) {
	if next < s.compact {
		return nil, next, fmt.Errorf("meta: events after revision %d (history starts after %d): %w", next, s.compact, meta.ErrCompacted)
	}
	i := sort.Search(len(s.history), func(i int) bool { return s.history[i].Revision > next })
	var out []meta.Event
	// A replica behind the revision asked for (a watch resumed on a head that lags) covers
	// that revision, never an older one: reading again from there repeats nothing.
	covered := max(s.revision, next)
	for ; i < len(s.history); i++ {
		ev := s.history[i]
		if limit > 0 && len(out) >= limit && ev.Revision != out[len(out)-1].Revision {
			covered = out[len(out)-1].Revision
			break
		}
		if strings.HasPrefix(ev.KV.Key, prefix) {
			out = append(out, ev)
		}
	}
	return out, covered, nil
}
