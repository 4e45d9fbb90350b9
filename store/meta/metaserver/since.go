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
		if next < s.compact {
			return nil, next, fmt.Errorf("meta: events after revision %d (history starts after %d): %w", next, s.compact, meta.ErrCompacted)
		}
		i := sort.Search(len(s.history), func(i int) bool { return s.history[i].Revision > next })
		var out []meta.Event
		covered := s.revision
		for ; i < len(s.history); i++ {
			ev := s.history[i]
			if max > 0 && len(out) >= max && ev.Revision != out[len(out)-1].Revision {
				covered = out[len(out)-1].Revision
				break
			}
			if strings.HasPrefix(ev.KV.Key, prefix) {
				out = append(out, ev)
			}
		}
		if len(out) > 0 || ctx.Err() != nil {
			return out, covered, nil
		}
		next = covered
		for ctx.Err() == nil && s.revision <= next {
			s.cond.Wait()
		}
	}
}
