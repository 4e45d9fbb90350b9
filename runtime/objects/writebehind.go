package objects

// Write-behind registration (group commit) of owned objects: a put's record is queued and
// committed with the others queued meanwhile in one transaction of the metadata log, and
// the put returns once its bytes are sealed in its store, without waiting for a consensus
// round of its own. Durable objects (detached, checkpoints) and every later change of a
// record (a copy's location, references, its end) stay synchronous.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/atoll-run/atoll/store/meta"
	"github.com/atoll-run/atoll/store/object"
)

// maxGroup bounds the records of one group commit.
const maxGroup = 256

// lookupGrace bounds how long a reader waits for a record that is not in the log yet: an
// owned object's record may still be on its way in its owner's next group commit when its
// id reaches another process. Past it, the object is unknown.
const lookupGrace = time.Second

// writeBehind is the queue of a directory's group commits.
type writeBehind struct {
	// pending are the registrations queued and not yet proposed; inflight those of the
	// group being committed, with the channel closed once it is.
	pending   map[object.ID]object.Meta
	order     []object.ID
	inflight  map[object.ID]chan struct{}
	group     map[object.ID]object.Meta // the group being committed
	running   bool                      // a committer goroutine runs (while anything is queued)
	drained   chan struct{}             // closed when the queue empties; nil while it is empty
	commits   int                       // group commits done (for tests and metrics)
	committed int                       // records committed by them
}

// WriteBehind makes the directory register owned objects (not durable, not scratch) by
// group commit: Register queues the record and returns; a committer goroutine, running
// while anything is queued, commits the queue in transactions of up to 256 records, one
// at a time, so that puts arriving during a commit form the next one. Until its record
// is committed an object is visible to this directory (Lookup, Record) and to its own
// store; other processes' directories wait for it up to a second (lookupGrace). Changes
// to a queued record (its references, a location removed, its end) are applied to the
// queue or wait for its commit, in order. It returns d.
func (d *Directory) WriteBehind() *Directory {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.wb == nil {
		d.wb = &writeBehind{pending: map[object.ID]object.Meta{}, inflight: map[object.ID]chan struct{}{}}
	}
	return d
}

// GroupCommits reports the group commits done and the records they committed.
func (d *Directory) GroupCommits() (commits, records int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.wb == nil {
		return 0, 0
	}
	return d.wb.commits, d.wb.committed
}

// behind reports whether m's registration goes through the group commit: a put's, of an
// owned object. A copy's (a pull, a replica) is synchronous, as is every durable one.
func (d *Directory) behind(m object.Meta) bool {
	return m.Put && !m.Durable && !DurableOwner(m.Owner) && len(m.Locations) == 1
}

// queue queues m's registration (a new record), or reports false when it must be written
// synchronously: the directory does not write behind, or the object is queued already.
func (d *Directory) queue(m object.Meta) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	wb := d.wb
	if wb == nil || !d.behind(m) {
		return false
	}
	if _, ok := wb.pending[m.ID]; ok {
		return false
	}
	if _, ok := wb.inflight[m.ID]; ok {
		return false
	}
	wb.pending[m.ID] = m
	wb.order = append(wb.order, m.ID)
	if wb.drained == nil {
		wb.drained = make(chan struct{})
	}
	if !wb.running {
		wb.running = true
		go d.commitLoop()
	}
	return true
}

// settle waits until id is neither queued nor being committed; a queued registration is
// taken out of the queue and returned (the caller applies its change to it and writes it),
// with ok true.
func (d *Directory) settle(ctx context.Context, id object.ID) (m object.Meta, ok bool, err error) {
	for {
		d.mu.Lock()
		wb := d.wb
		if wb == nil {
			d.mu.Unlock()
			return object.Meta{}, false, nil
		}
		if m, queued := wb.pending[id]; queued {
			delete(wb.pending, id)
			d.mu.Unlock()
			return m, true, nil
		}
		done, committing := wb.inflight[id]
		d.mu.Unlock()
		if !committing {
			return object.Meta{}, false, nil
		}
		select {
		case <-done:
		case <-ctx.Done():
			return object.Meta{}, false, ctx.Err()
		}
	}
}

// queued returns id's registration while it is queued or being committed.
func (d *Directory) queued(id object.ID) (object.Meta, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.wb == nil {
		return object.Meta{}, false
	}
	if m, ok := d.wb.pending[id]; ok {
		return m, true
	}
	if _, ok := d.wb.inflight[id]; ok {
		return d.wb.group[id], true
	}
	return object.Meta{}, false
}

// Unwritten reports whether id's record is still queued, not yet proposed, with location
// as its only location: nobody outside this directory's process can have found the
// object yet (a reader elsewhere waits for the record), so freeing it there frees it
// everywhere, and its record is never written (RemoveLocation).
func (d *Directory) Unwritten(id object.ID, location string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.wb == nil {
		return false
	}
	m, ok := d.wb.pending[id]
	return ok && len(m.Locations) == 1 && m.Locations[0] == location
}

// Flush waits until every registration queued before it is committed.
func (d *Directory) Flush(ctx context.Context) error {
	d.mu.Lock()
	if d.wb == nil || d.wb.drained == nil {
		d.mu.Unlock()
		return nil
	}
	drained := d.wb.drained
	d.mu.Unlock()
	select {
	case <-drained:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("objects: flush the group commits: %w", ctx.Err())
	}
}

// commitLoop commits the queue group by group until it is empty.
func (d *Directory) commitLoop() {
	for {
		d.mu.Lock()
		wb := d.wb
		var group []object.Meta
		for len(wb.order) > 0 && len(group) < maxGroup {
			id := wb.order[0]
			wb.order = wb.order[1:]
			if m, ok := wb.pending[id]; ok { // not taken out meanwhile
				delete(wb.pending, id)
				group = append(group, m)
			}
		}
		if len(group) == 0 {
			wb.running = false
			if wb.drained != nil && len(wb.pending) == 0 {
				close(wb.drained)
				wb.drained = nil
			}
			d.mu.Unlock()
			return
		}
		done := make(chan struct{})
		if wb.group == nil {
			wb.group = map[object.ID]object.Meta{}
		}
		for _, m := range group {
			wb.inflight[m.ID] = done
			wb.group[m.ID] = m
		}
		d.mu.Unlock()

		d.commitGroup(group)

		d.mu.Lock()
		for _, m := range group {
			delete(wb.inflight, m.ID)
			delete(wb.group, m.ID)
		}
		wb.commits++
		wb.committed += len(group)
		d.mu.Unlock()
		close(done)
	}
}

// commitGroup writes a group's new records in one transaction (each guarded on being
// absent); when that fails (a record exists: a copy registered it, or it ended), each is
// registered on its own. A registration that fails is tried again, with backoff, up to
// five times (the put it belongs to has returned; a record never written leaves the
// object to its own store, and to reconciliation).
func (d *Directory) commitGroup(group []object.Meta) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmps := make([]meta.Compare, 0, len(group))
	ops := make([]meta.Op, 0, len(group))
	for _, m := range group {
		b, err := json.Marshal(&Record{ID: m.ID.String(), Size: m.Size, Fingerprint: m.Fingerprint, Owner: m.Owner, Refs: m.Refs,
			Locations: m.Locations})
		if err != nil {
			continue
		}
		cmps = append(cmps, meta.Compare{Key: key(m.ID), Version: 0})
		ops = append(ops, meta.Op{Type: meta.OpPut, Key: key(m.ID), Value: b})
	}
	if r, err := d.kv.Txn(ctx, cmps, ops); err == nil && r.Succeeded {
		return
	}
	for _, m := range group {
		for try, wait := 1, 10*time.Millisecond; ; try, wait = try+1, 2*wait {
			err := d.register(ctx, m)
			if err == nil || errors.Is(err, object.ErrOwnerDied) || errors.Is(err, object.ErrFingerprint) || ctx.Err() != nil || try == 5 {
				break
			}
			select {
			case <-time.After(wait):
			case <-ctx.Done():
			}
		}
	}
}

// awaitRecord reads key, waiting up to lookupGrace (with backoff) while it is absent when
// the directory writes behind: its record may be in another process's group commit.
func (d *Directory) awaitRecord(ctx context.Context, k string) (meta.KeyValue, bool, error) {
	d.mu.Lock()
	grace := d.wb != nil
	d.mu.Unlock()
	deadline := time.Now().Add(lookupGrace)
	for wait := time.Millisecond; ; wait = min(2*wait, 64*time.Millisecond) {
		kv, ok, err := d.kv.Get(ctx, k)
		if ok || err != nil || !grace || time.Now().After(deadline) {
			return kv, ok, err
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return kv, ok, nil
		}
	}
}

// setQueuedRefs records refs on id's queued registration; false when it is not queued.
func (d *Directory) setQueuedRefs(id object.ID, refs int64) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.wb == nil {
		return false
	}
	m, ok := d.wb.pending[id]
	if ok {
		m.Refs = refs
		d.wb.pending[id] = m
	}
	return ok
}

// settleCommit waits while id's registration is being committed.
func (d *Directory) settleCommit(ctx context.Context, id object.ID) (bool, error) {
	d.mu.Lock()
	var done chan struct{}
	if d.wb != nil {
		done = d.wb.inflight[id]
	}
	d.mu.Unlock()
	if done == nil {
		return false, nil
	}
	select {
	case <-done:
		return true, nil
	case <-ctx.Done():
		return false, ctx.Err()
	}
}
