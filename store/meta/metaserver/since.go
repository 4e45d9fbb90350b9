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
	next := fromRev
	for {
		s.mu.Lock()
		out, covered, err := s.eventsAfterLocked(prefix, next, max)
		if err != nil || len(out) > 0 || ctx.Err() != nil {
			s.mu.Unlock()
			return out, covered, err
		}
		next = covered
		ch := s.sleepLocked(prefix)
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			s.mu.Lock()
			s.unsleepLocked(prefix, ch)
			s.mu.Unlock()
		}
	}
}

// sleepLocked registers a watcher of prefix that found nothing after the current
// revision: the channel closes at the next event whose key has the prefix (or at a
// Restore).
func (s *StateMachine) sleepLocked(prefix string) chan struct{} {
	set := s.sleepers[prefix]
	if set == nil {
		set = map[chan struct{}]struct{}{}
		s.sleepers[prefix] = set
	}
	ch := make(chan struct{})
	set[ch] = struct{}{}
	return ch
}

// unsleepLocked forgets a watcher that stopped waiting (its context ended).
func (s *StateMachine) unsleepLocked(prefix string, ch chan struct{}) {
	if set := s.sleepers[prefix]; set != nil {
		delete(set, ch)
		if len(set) == 0 {
			delete(s.sleepers, prefix)
		}
	}
}

// wakeLocked wakes the watchers of the history's events from index first on: those whose
// prefix is a prefix of one of their keys. Thousands of watchers of one gang each (a
// driver's gang handles) were all woken by every commit and each scanned the new events,
// one after another under the lock: a commit now costs a map lookup per byte of its keys.
func (s *StateMachine) wakeLocked(first int) {
	if len(s.sleepers) == 0 {
		return
	}
	for _, ev := range s.history[first:] {
		key := ev.KV.Key
		for l := 0; l <= len(key) && len(s.sleepers) > 0; l++ {
			set := s.sleepers[key[:l]]
			if set == nil {
				continue
			}
			for ch := range set {
				close(ch)
				s.woken++
			}
			delete(s.sleepers, key[:l])
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
