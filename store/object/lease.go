// Leases: holders that renew keep what they hold; the reaper releases what a
// holder that stopped renewing held.

package object

import (
	"context"
	"time"

	"go.uber.org/zap"
)

// Renew gives holder a lease of LeaseTTL from now. A holder with a lease that
// expires (a worker process that died) loses all its references and mappings at
// the next ExpireLeases. Holders that never call Renew have no lease.
func (s *Store) Renew(holder string) {
	s.mu.Lock()
	s.leases[holder] = s.cfg.Clock().Add(s.cfg.LeaseTTL)
	s.mu.Unlock()
}

// ExpireLeases releases every reference and mapping of holders whose lease ended
// before now, freeing what that leaves unreferenced, and aborts the objects they
// were writing from their own process (CreateFor). It returns the holders expired.
// The agent calls it periodically.
func (s *Store) ExpireLeases(now time.Time) []string {
	s.mu.Lock()
	var expired []string
	for h, t := range s.leases {
		if now.After(t) {
			expired = append(expired, h)
			delete(s.leases, h)
		}
	}
	var freed []ID
	for _, h := range expired {
		s.m.errors.WithLabelValues(reasonLeaseExpiry).Inc()
		s.forgetWriterLocked(h)
		for _, e := range s.objs {
			if e.state == statePending && e.writer == h {
				// It was writing an object from its own process (CreateFor):
				// abort it, as Writer.Abort does.
				s.abortLocked(e)
				continue
			}
			_, r := e.refs[h]
			_, m := e.maps[h]
			if !r && !m {
				continue
			}
			delete(e.refs, h)
			delete(e.maps, h)
			freed = append(freed, s.maybeFreeLocked(e)...)
		}
	}
	if len(expired) > 0 {
		s.notifyLocked()
	}
	s.mu.Unlock()
	s.forgetBackground(freed)
	return expired
}

// StartLeaseReaper calls ExpireLeases(Clock()) every interval in a goroutine, so
// that holders which Renew and then die (a worker process, an actor) lose their
// references and mappings without anyone having to remember to expire them. It
// runs until ctx ends, the returned stop is called, or the store closes; stop
// waits for the goroutine to finish and may be called more than once. The time
// compared against leases is the store's Clock, so tests drive expiry with an
// injected clock; interval only sets how often it looks (at most LeaseTTL/2 is
// sensible). A non-positive interval uses LeaseTTL/4.
func (s *Store) StartLeaseReaper(ctx context.Context, interval time.Duration) (stop func()) {
	if interval <= 0 {
		interval = max(s.cfg.LeaseTTL/4, time.Millisecond)
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-s.closing:
				return
			case <-t.C:
				if exp := s.ExpireLeases(s.cfg.Clock()); len(exp) > 0 {
					s.log.Info("leases expired, references released", zap.Strings("holders", exp))
				}
			}
		}
	}()
	return func() { cancel(); <-done }
}
