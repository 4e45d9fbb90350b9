package head

import (
	"context"

	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/store/meta"
)

// Audit queues audit events (a refused request, an admin's write) for the event log,
// after the decisions queued before them, and returns without waiting for their commit.
// It fails when this head does not lead: only the leader commits events.
func (c *Controller) Audit(evs ...api.Event) error {
	t, err := c.lockTerm()
	if err != nil {
		return err
	}
	c.enqueueLocked(t, []commitFn{{what: "audit", events: evs}})
	c.mu.Unlock()
	return nil
}

// Revoke commits a credential's revocation (auth/revoked/<id>) with its event.
func (c *Controller) Revoke(ctx context.Context, rev api.Revocation, ev api.Event) error {
	t, err := c.lockTerm()
	if err != nil {
		return err
	}
	ch := c.enqueueLocked(t, []commitFn{{what: "revoke " + rev.ID, ops: []meta.Op{putJSON(api.RevokedKey(rev.ID), rev)}, events: []api.Event{ev}}})
	c.mu.Unlock()
	return await(ctx, ch)
}
