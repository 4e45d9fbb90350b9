// Package objects connects machines' object stores to the cluster: a Directory that writes
// object metadata through the Paxos metadata log, and the scratch objects that stay
// machine-local.
package objects

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/store/meta"
	"github.com/atoll-run/atoll/store/object"
)

// ScratchOwnerPrefix marks transient objects (a collective's chunks in flight) whose
// metadata stays in the machine-local directory instead of the metadata log: they live for
// microseconds and no other machine looks them up by id.
const ScratchOwnerPrefix = "scratch/"

// Record is an object's metadata as the metadata log stores it.
type Record struct {
	ID          string   `json:"id"`
	Size        int64    `json:"size"`
	Fingerprint uint64   `json:"fingerprint"`
	Owner       string   `json:"owner"`
	Locations   []string `json:"locations"`
	Refs        int64    `json:"refs"`
	// Durable lists the Locations whose copy is durable (fsync'd on disk, adopted again
	// when their store restarts).
	Durable []string `json:"durable,omitempty"`
	// State is empty for a live object. A dead one is kept for a while as a tombstone,
	// so that a reader learns why it is gone: StateLost (no copy is left anywhere) or
	// StateOwnerDied (its owner ended, and it with it). Ended is when it died.
	State State     `json:"state,omitempty"`
	Ended time.Time `json:"ended,omitempty"`
}

// State is a dead object record's cause of death.
type State string

// States of a dead record.
const (
	StateLost      State = "lost"
	StateOwnerDied State = "owner_died"
)

// Err is the error a reader of a dead record gets (object.ErrLost or
// object.ErrOwnerDied), nil for a live one.
func (r *Record) Err() error {
	switch r.State {
	case StateLost:
		return fmt.Errorf("objects: %s (%d bytes, owner %s) was lost at %s: no copy is left: %w",
			shortID(r.ID), r.Size, r.Owner, r.Ended.Format(time.RFC3339), object.ErrLost)
	case StateOwnerDied:
		return fmt.Errorf("objects: %s: its owner %s ended at %s: %w", shortID(r.ID), r.Owner, r.Ended.Format(time.RFC3339), object.ErrOwnerDied)
	}
	return nil
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// KV is what the directory needs of the metadata log: linearizable reads and guarded
// writes. *meta.Client implements it.
type KV interface {
	Get(ctx context.Context, key string) (meta.KeyValue, bool, error)
	Txn(ctx context.Context, compares []meta.Compare, ops []meta.Op) (meta.Response, error)
}

var _ KV = (*meta.Client)(nil)

// Directory is object.Directory written through the metadata log: every object's id,
// size, fingerprint, owner, locations and reference count is committed there before the
// store hands out a reference. Scratch objects go to a local MemDirectory.
type Directory struct {
	kv      KV
	scratch *object.MemDirectory

	mu         sync.Mutex
	scratchIDs map[object.ID]bool
	wb         *writeBehind // nil: every registration is synchronous (WriteBehind)
}

var _ object.Directory = (*Directory)(nil)

// NewDirectory returns a directory over the metadata log.
func NewDirectory(kv KV) *Directory {
	return &Directory{kv: kv, scratch: object.NewMemDirectory(), scratchIDs: map[object.ID]bool{}}
}

func (d *Directory) isScratch(id object.ID) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.scratchIDs[id]
}

func key(id object.ID) string { return api.TableObjects + id.String() }

// errNoChange, returned by an update function, leaves the key as it is.
var errNoChange = errors.New("objects: no change")

// update replaces a record with fn(old) under compare-and-swap on its version, retrying
// while other writers win the race. fn returning nil deletes the record.
func (d *Directory) update(ctx context.Context, id object.ID, fn func(old *Record) (*Record, error)) error {
	k := key(id)
	for {
		kv, ok, err := d.kv.Get(ctx, k)
		if err != nil {
			return err
		}
		var old *Record
		if ok {
			old = &Record{}
			if err := json.Unmarshal(kv.Value, old); err != nil {
				return fmt.Errorf("objects: record of %s: %w", id.Short(), err)
			}
		}
		rec, err := fn(old)
		switch {
		case errors.Is(err, errNoChange):
			return nil
		case err != nil:
			return err
		}
		op := meta.Op{Type: meta.OpDelete, Key: k}
		if rec != nil {
			b, err := json.Marshal(rec)
			if err != nil {
				return err
			}
			op = meta.Op{Type: meta.OpPut, Key: k, Value: b}
		} else if !ok {
			return nil
		}
		r, err := d.kv.Txn(ctx, []meta.Compare{{Key: k, Version: kv.Version}}, []meta.Op{op})
		if err != nil {
			return err
		}
		if r.Succeeded {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("objects: update %s: %w", id.Short(), err)
		}
	}
}

// Register implements object.Directory: it merges the location into the record.
func (d *Directory) Register(ctx context.Context, m object.Meta) error {
	if strings.HasPrefix(m.Owner, ScratchOwnerPrefix) {
		d.mu.Lock()
		d.scratchIDs[m.ID] = true
		d.mu.Unlock()
		return d.scratch.Register(ctx, m)
	}
	if d.queue(m) {
		return nil
	}
	if q, ok, err := d.settle(ctx, m.ID); err != nil {
		return err
	} else if ok { // queued still: write it with this registration's location merged
		if err := d.register(ctx, q); err != nil {
			return err
		}
	}
	return d.register(ctx, m)
}

// register merges m into its record in the log.
func (d *Directory) register(ctx context.Context, m object.Meta) error {
	return d.update(ctx, m.ID, func(old *Record) (*Record, error) {
		rec := &Record{ID: m.ID.String(), Size: m.Size, Fingerprint: m.Fingerprint, Owner: m.Owner, Refs: m.Refs}
		if old != nil && old.State == StateOwnerDied {
			return nil, old.Err() // its owner ended: no copy of it is taken in again
		}
		if old != nil {
			rec = old
			rec.State, rec.Ended = "", time.Time{} // a copy thought lost is found again (its store restarted)
			if rec.Size != m.Size || (m.Fingerprint != 0 && rec.Fingerprint != 0 && rec.Fingerprint != m.Fingerprint) {
				return nil, fmt.Errorf("objects: %s registered as %d bytes/%x, now %d bytes/%x: %w",
					m.ID.Short(), rec.Size, rec.Fingerprint, m.Size, m.Fingerprint, object.ErrFingerprint)
			}
			if rec.Fingerprint == 0 {
				rec.Fingerprint = m.Fingerprint
			}
		}
		changed := old == nil || old.State != "" || (old.Fingerprint == 0 && m.Fingerprint != 0)
		for _, l := range m.Locations {
			if !slices.Contains(rec.Locations, l) {
				rec.Locations = append(rec.Locations, l)
				changed = true
			}
			if m.Durable && !slices.Contains(rec.Durable, l) {
				rec.Durable = append(rec.Durable, l)
				changed = true
			}
		}
		if !changed {
			return nil, errNoChange
		}
		return rec, nil
	})
}

// RemoveLocation implements object.Directory; the record goes with its last location.
func (d *Directory) RemoveLocation(ctx context.Context, id object.ID, location string) error {
	if d.isScratch(id) {
		err := d.scratch.RemoveLocation(ctx, id, location)
		if _, lerr := d.scratch.Lookup(ctx, id); lerr != nil {
			d.mu.Lock()
			delete(d.scratchIDs, id)
			d.mu.Unlock()
		}
		return err
	}
	if q, ok, err := d.settle(ctx, id); err != nil {
		return err
	} else if ok && len(q.Locations) == 1 && q.Locations[0] == location {
		return nil // freed before its record was written: it never will be
	} else if ok {
		if err := d.register(ctx, q); err != nil {
			return err
		}
	}
	return d.update(ctx, id, func(old *Record) (*Record, error) {
		if old == nil {
			return nil, fmt.Errorf("objects: remove location of %s: %w", id.Short(), object.ErrNotFound)
		}
		n := len(old.Locations) + len(old.Durable)
		old.Locations = slices.DeleteFunc(old.Locations, func(l string) bool { return l == location })
		old.Durable = slices.DeleteFunc(old.Durable, func(l string) bool { return l == location })
		switch {
		case len(old.Locations) == 0 && old.State == "":
			return nil, nil // freed everywhere
		case len(old.Locations)+len(old.Durable) == n:
			return nil, errNoChange
		}
		return old, nil // a tombstone stays, without the location
	})
}

// End marks an object dead (StateLost or StateOwnerDied) at now, keeping its record as a
// tombstone without locations; it returns the locations it listed, whose stores may still
// hold a copy to let go. A record already dead keeps its first cause.
func (d *Directory) End(ctx context.Context, id object.ID, state State, now time.Time) ([]string, error) {
	if q, ok, err := d.settle(ctx, id); err != nil {
		return nil, err
	} else if ok {
		if err := d.register(ctx, q); err != nil {
			return nil, err
		}
	}
	var locs []string
	err := d.update(ctx, id, func(old *Record) (*Record, error) {
		locs = nil
		if old == nil {
			return nil, errNoChange
		}
		locs = old.Locations
		if old.State != "" {
			return nil, errNoChange
		}
		old.State, old.Ended, old.Locations, old.Durable, old.Refs = state, now, nil, nil, 0
		return old, nil
	})
	return locs, err
}

// Record reads an object's record, dead or alive.
func (d *Directory) Record(ctx context.Context, id object.ID) (Record, bool, error) {
	if m, ok := d.queued(id); ok {
		return Record{ID: id.String(), Size: m.Size, Fingerprint: m.Fingerprint, Owner: m.Owner, Locations: m.Locations, Refs: m.Refs}, true, nil
	}
	kv, ok, err := d.awaitRecord(ctx, key(id))
	if err != nil || !ok {
		return Record{}, ok, err
	}
	var rec Record
	if err := json.Unmarshal(kv.Value, &rec); err != nil {
		return Record{}, false, fmt.Errorf("objects: record of %s: %w", id.Short(), err)
	}
	return rec, true, nil
}

// SetRefs implements object.Directory.
func (d *Directory) SetRefs(ctx context.Context, id object.ID, refs int64) error {
	if d.isScratch(id) {
		return d.scratch.SetRefs(ctx, id, refs)
	}
	if d.setQueuedRefs(id, refs) {
		return nil
	}
	if _, err := d.settleCommit(ctx, id); err != nil {
		return err
	}
	return d.update(ctx, id, func(old *Record) (*Record, error) {
		if old == nil {
			return nil, fmt.Errorf("objects: set refs of %s: %w", id.Short(), object.ErrNotFound)
		}
		if old.Refs == refs || old.State != "" {
			return nil, errNoChange
		}
		old.Refs = refs
		return old, nil
	})
}

// Lookup implements object.Directory.
func (d *Directory) Lookup(ctx context.Context, id object.ID) (object.Meta, error) {
	if d.isScratch(id) {
		return d.scratch.Lookup(ctx, id)
	}
	if m, ok := d.queued(id); ok {
		m.Locations = slices.Clone(m.Locations)
		return m, nil
	}
	kv, ok, err := d.awaitRecord(ctx, key(id))
	if err != nil {
		return object.Meta{}, err
	}
	if !ok {
		return object.Meta{}, fmt.Errorf("objects: lookup %s: %w", id.Short(), object.ErrNotFound)
	}
	var rec Record
	if err := json.Unmarshal(kv.Value, &rec); err != nil {
		return object.Meta{}, fmt.Errorf("objects: record of %s: %w", id.Short(), err)
	}
	if err := rec.Err(); err != nil {
		return object.Meta{}, err
	}
	return object.Meta{ID: id, Size: rec.Size, Fingerprint: rec.Fingerprint, Owner: rec.Owner, Locations: rec.Locations, Refs: rec.Refs}, nil
}
