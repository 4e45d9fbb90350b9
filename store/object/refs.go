// References: logical references and worker-process mappings per holder, and
// freeing an object once nothing holds it.

package object

import (
	"context"
	"errors"
	"fmt"

	"go.uber.org/zap"
)

// AddRef adds a logical reference held by holder.
func (s *Store) AddRef(ctx context.Context, id ID, holder string) error {
	s.mu.Lock()
	e, ok := s.objs[id]
	if !ok || e.state == statePending || e.state == stateAborted || e.freePending {
		s.mu.Unlock()
		return s.fail(reasonNotFound, fmt.Errorf("object: add ref %s: %w", id.Short(), ErrNotFound))
	}
	if e.dropped != nil {
		s.mu.Unlock()
		return fmt.Errorf("object: add ref %s: %w", id.Short(), e.dropped)
	}
	return s.addRefUnlock(ctx, e, holder)
}

// addRefUnlock adds a reference of holder to e, releases s.mu and records the
// new count in the directory under ctx.
func (s *Store) addRefUnlock(ctx context.Context, e *entry, holder string) error {
	if e.refs == nil {
		e.refs = map[string]int{}
	}
	e.refs[holder]++
	n := e.refTotal()
	s.mu.Unlock()
	return s.directory.SetRefs(ctx, e.id, int64(n))
}

// Release drops one logical reference of holder. When no reference, view or
// mapping remains, the object is freed: its shared memory, its spill file and its
// location in the directory.
func (s *Store) Release(ctx context.Context, id ID, holder string) error {
	s.mu.Lock()
	e, ok := s.objs[id]
	if !ok {
		s.mu.Unlock()
		return s.fail(reasonNotFound, fmt.Errorf("object: release %s: %w", id.Short(), ErrNotFound))
	}
	if e.refs[holder] == 0 {
		s.mu.Unlock()
		return fmt.Errorf("object: release %s by %q: %w", id.Short(), holder, ErrNotHolder)
	}
	e.refs[holder]--
	if e.refs[holder] == 0 {
		delete(e.refs, holder)
	}
	n := e.refTotal()
	freed := s.maybeFreeLocked(e)
	s.mu.Unlock()
	s.forget(ctx, freed)
	if len(freed) == 0 {
		return s.directory.SetRefs(ctx, id, int64(n))
	}
	return nil
}

// Map pins id for holder (a worker process) and returns where to map it. The pin
// lasts until Unmap, or until holder's lease expires (see Renew).
func (s *Store) Map(ctx context.Context, id ID, holder string) (Mapping, error) {
	s.mu.Lock()
	e, ok := s.objs[id]
	if !ok || e.state == statePending || e.state == stateAborted || e.freePending {
		s.mu.Unlock()
		return Mapping{}, s.fail(reasonNotFound, fmt.Errorf("object: map %s: %w", id.Short(), ErrNotFound))
	}
	if e.dropped != nil {
		s.mu.Unlock()
		return Mapping{}, fmt.Errorf("object: map %s: %w", id.Short(), e.dropped)
	}
	if e.maps == nil {
		e.maps = map[string]int{}
	}
	e.maps[holder]++
	if err := s.ensureHotLocked(ctx, e); err != nil {
		s.dropMapLocked(e, holder)
		s.mu.Unlock()
		return Mapping{}, err
	}
	m := Mapping{Path: e.mem.path, Offset: e.mem.off, Size: e.size}
	s.mu.Unlock()
	fp, err := s.fingerprint(ctx, e)
	if err != nil {
		_ = s.Unmap(ctx, id, holder)
		return Mapping{}, err
	}
	m.Fingerprint = fp
	return m, nil
}

func (s *Store) dropMapLocked(e *entry, holder string) {
	e.maps[holder]--
	if e.maps[holder] <= 0 {
		delete(e.maps, holder)
	}
}

// Unmap drops one mapping pin of holder. If that frees the object, its location
// is removed from the directory under ctx.
func (s *Store) Unmap(ctx context.Context, id ID, holder string) error {
	s.mu.Lock()
	e, ok := s.objs[id]
	if !ok || e.maps[holder] == 0 {
		s.mu.Unlock()
		return fmt.Errorf("object: unmap %s by %q: %w", id.Short(), holder, ErrNotHolder)
	}
	s.dropMapLocked(e, holder)
	freed := s.maybeFreeLocked(e)
	s.notifyLocked()
	s.mu.Unlock()
	s.forget(ctx, freed)
	return nil
}

// Drop lets this store's copy of id go whatever holds it: every reference is
// dropped, and from now on Get, Map, AddRef, Persist and Verify refuse it with
// cause (ErrNotFound when cause is nil: a plain free; ErrOwnerDied when its
// owner ended). Views and mappings taken before keep their bytes until they are
// released; the copy, its files and its location in the directory go then.
func (s *Store) Drop(ctx context.Context, id ID, cause error) error {
	if cause == nil {
		cause = ErrNotFound
	}
	s.mu.Lock()
	e, ok := s.objs[id]
	if !ok || e.state == statePending || e.state == stateAborted {
		s.mu.Unlock()
		return s.fail(reasonNotFound, fmt.Errorf("object: drop %s: %w", id.Short(), ErrNotFound))
	}
	freed := s.dropLocked(e, cause)
	s.mu.Unlock()
	s.forget(ctx, freed)
	return nil
}

func (s *Store) dropLocked(e *entry, cause error) []ID {
	if e.dropped == nil {
		e.dropped = cause
	}
	e.refs = nil
	freed := s.maybeFreeLocked(e)
	s.notifyLocked()
	return freed
}

// DropOwner drops (Drop) every object owner put in this store, with cause, and
// returns their ids: what an owner that ended leaves behind here.
func (s *Store) DropOwner(ctx context.Context, owner string, cause error) []ID {
	if cause == nil {
		cause = ErrOwnerDied
	}
	s.mu.Lock()
	var ids, freed []ID
	for id, e := range s.objs {
		if e.owner == owner && (e.state == stateHot || e.state == stateCold) && e.dropped == nil {
			ids = append(ids, id)
			freed = append(freed, s.dropLocked(e, cause)...)
		}
	}
	s.mu.Unlock()
	s.forget(ctx, freed)
	return ids
}

// Owned lists the sealed objects of owner in this store.
func (s *Store) Owned(owner string) []ID {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ids []ID
	for id, e := range s.owned[owner] {
		if (e.state == stateHot || e.state == stateCold) && e.dropped == nil && !e.freePending {
			ids = append(ids, id)
		}
	}
	return ids
}

// maybeFreeLocked frees e if nothing references it; it returns the freed ids.
func (s *Store) maybeFreeLocked(e *entry) []ID {
	if e.state == stateAborted {
		if e.views == 0 {
			return s.finishFreeLocked(e, nil)
		}
		return nil
	}
	if e.state == statePending || e.refTotal() > 0 || e.pinned() || e.restoring != nil {
		return nil
	}
	if e.spilling {
		e.freePending = true
		return nil
	}
	return s.finishFreeLocked(e, nil)
}

// finishFreeLocked gives e's memory and spill file back and drops it from the
// store (once; later calls do nothing). It returns freed with e's id appended
// if e was sealed: its location must then be removed from the directory, with
// forget, once s.mu is released.
func (s *Store) finishFreeLocked(e *entry, freed []ID) []ID {
	if e.freed {
		return freed
	}
	e.freed = true
	if !e.mem.none() {
		s.releaseMemLocked(e.mem, e.state == stateHot)
		e.mem = mem{}
	}
	if e.spilled {
		if err := s.spill.Remove(spillName(e.id)); err != nil {
			s.log.Warn("remove spill file failed", zap.Stringer("id", e.id), zap.Error(err))
		}
	}
	if e.durable {
		if err := s.durable.remove(e.id); err != nil {
			s.log.Warn("remove durable file failed", zap.Stringer("id", e.id), zap.Error(err))
		}
	}
	if e.lru != nil {
		s.lru.Remove(e.lru)
		e.lru = nil
	}
	wasSealed := e.state == stateHot || e.state == stateCold
	s.setStateLocked(e, stateAborted)
	close(e.progress)
	e.progress = make(chan struct{})
	s.removeLocked(e) // unless an aborted entry was replaced by a new Create meanwhile
	s.notifyLocked()
	s.m.frees.Inc()
	if wasSealed {
		freed = append(freed, e.id)
	}
	return freed
}

// forget removes this store's location for freed ids from the directory.
// Failures are logged: the object is gone here whatever the directory says.
func (s *Store) forget(ctx context.Context, ids []ID) {
	for _, id := range ids {
		err := s.directory.RemoveLocation(ctx, id, s.cfg.Location)
		switch {
		case errors.Is(err, ErrNotFound):
			s.log.Debug("directory remove location: already gone", zap.Stringer("id", id))
		case err != nil:
			s.log.Warn("directory remove location", zap.Stringer("id", id), zap.Error(err))
		}
	}
}

// forgetBackground is forget for frees that happen on nobody's behalf (a view's
// release, lease expiry): it runs under the store's lifetime, bounded by
// Config.DirectoryTimeout.
func (s *Store) forgetBackground(ids []ID) {
	if len(ids) == 0 {
		return
	}
	ctx, cancel := s.background()
	defer cancel()
	s.forget(ctx, ids)
}

// putLocked adds e to the store's table and its owner's index.
func (s *Store) putLocked(e *entry) {
	if old := s.objs[e.id]; old != nil {
		s.tallyLocked(old, -1)
	}
	s.objs[e.id] = e
	s.tallyLocked(e, 1)
	if s.owned[e.owner] == nil {
		s.owned[e.owner] = map[ID]*entry{}
	}
	s.owned[e.owner][e.id] = e
}

// removeLocked takes e out of the table and its owner's index, unless another entry of
// the same id has taken its place.
func (s *Store) removeLocked(e *entry) {
	if s.objs[e.id] != e {
		return
	}
	delete(s.objs, e.id)
	s.tallyLocked(e, -1)
	if ids := s.owned[e.owner]; ids != nil {
		delete(ids, e.id)
		if len(ids) == 0 {
			delete(s.owned, e.owner)
		}
	}
}

// tally counts the table's entries by state and durability, kept as they change so
// that Stats (every load report) does not go over every object with the store locked:
// at 200,000 objects that walk was a stall of every put on the machine, five times a
// second.
type tally struct {
	hot, cold, durable      int
	coldBytes, durableBytes int64
}

// tallyLocked adds (sign 1) or takes away (sign -1) e's share of the tally.
func (s *Store) tallyLocked(e *entry, sign int) {
	switch e.state {
	case stateHot:
		s.tally.hot += sign
	case stateCold:
		s.tally.cold += sign
		s.tally.coldBytes += int64(sign) * e.size
	}
	if e.durable {
		s.tally.durable += sign
		s.tally.durableBytes += int64(sign) * e.size
	}
}

// setStateLocked changes e's state, keeping the tally.
func (s *Store) setStateLocked(e *entry, st state) { s.updateLocked(e, st, e.durable) }

// setDurableLocked marks e durable, keeping the tally.
func (s *Store) setDurableLocked(e *entry) { s.updateLocked(e, e.state, true) }

// updateLocked sets e's state and durability, keeping the tally when e is in the table.
func (s *Store) updateLocked(e *entry, st state, durable bool) {
	in := s.objs[e.id] == e
	if in {
		s.tallyLocked(e, -1)
	}
	e.state, e.durable = st, durable
	if in {
		s.tallyLocked(e, 1)
	}
}
