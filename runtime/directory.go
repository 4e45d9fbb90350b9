package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/atoll-run/atoll/store/object"
)

// ScratchOwnerPrefix marks transient objects (a collective's chunks in flight) whose
// metadata stays in the machine-local directory instead of the metadata log: they live for
// microseconds, between one rank's put and its neighbour's read, and no other machine ever
// looks them up by id.
const ScratchOwnerPrefix = "scratch/"

// objectRecord is an object's metadata as the metadata log stores it.
type objectRecord struct {
	ID          string   `json:"id"`
	Size        int64    `json:"size"`
	Fingerprint uint64   `json:"fingerprint"`
	Owner       string   `json:"owner"`
	Locations   []string `json:"locations"`
	Refs        int64    `json:"refs"`
}

// metaDirectory is the object store's Directory written through the metadata log: every
// object's id, size, fingerprint, owner, locations and reference count is committed there
// before the store hands out a reference. Scratch objects go to a local MemDirectory.
type metaDirectory struct {
	meta    MetaStore
	scratch *object.MemDirectory

	mu         sync.Mutex
	scratchIDs map[object.ID]bool
}

var _ object.Directory = (*metaDirectory)(nil)

func newMetaDirectory(m MetaStore) *metaDirectory {
	return &metaDirectory{meta: m, scratch: object.NewMemDirectory(), scratchIDs: map[object.ID]bool{}}
}

func (d *metaDirectory) isScratch(id object.ID) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.scratchIDs[id]
}

func (d *metaDirectory) Register(ctx context.Context, m object.Meta) error {
	if strings.HasPrefix(m.Owner, ScratchOwnerPrefix) {
		d.mu.Lock()
		d.scratchIDs[m.ID] = true
		d.mu.Unlock()
		return d.scratch.Register(ctx, m)
	}
	return d.meta.Update(ctx, TableObjects, m.ID.String(), func(old []byte, ok bool) ([]byte, error) {
		rec := objectRecord{ID: m.ID.String(), Size: m.Size, Fingerprint: m.Fingerprint, Owner: m.Owner, Refs: m.Refs}
		if ok {
			if err := json.Unmarshal(old, &rec); err != nil {
				return nil, fmt.Errorf("runtime: object %s metadata: %w", m.ID.Short(), err)
			}
			if rec.Size != m.Size || (m.Fingerprint != 0 && rec.Fingerprint != 0 && rec.Fingerprint != m.Fingerprint) {
				return nil, fmt.Errorf("runtime: object %s registered as %d bytes/%x, now %d bytes/%x: %w",
					m.ID.Short(), rec.Size, rec.Fingerprint, m.Size, m.Fingerprint, object.ErrFingerprint)
			}
			if rec.Fingerprint == 0 {
				rec.Fingerprint = m.Fingerprint
			}
		}
		for _, l := range m.Locations {
			if !slices.Contains(rec.Locations, l) {
				rec.Locations = append(rec.Locations, l)
			}
		}
		return json.Marshal(rec)
	})
}

func (d *metaDirectory) RemoveLocation(ctx context.Context, id object.ID, location string) error {
	if d.isScratch(id) {
		err := d.scratch.RemoveLocation(ctx, id, location)
		if _, lerr := d.scratch.Lookup(ctx, id); lerr != nil {
			d.mu.Lock()
			delete(d.scratchIDs, id)
			d.mu.Unlock()
		}
		return err
	}
	return d.meta.Update(ctx, TableObjects, id.String(), func(old []byte, ok bool) ([]byte, error) {
		if !ok {
			return nil, fmt.Errorf("runtime: remove location of object %s: %w", id.Short(), object.ErrNotFound)
		}
		var rec objectRecord
		if err := json.Unmarshal(old, &rec); err != nil {
			return nil, err
		}
		rec.Locations = slices.DeleteFunc(rec.Locations, func(l string) bool { return l == location })
		if len(rec.Locations) == 0 {
			return nil, nil // the last copy went: forget the object
		}
		return json.Marshal(rec)
	})
}

func (d *metaDirectory) SetRefs(ctx context.Context, id object.ID, refs int64) error {
	if d.isScratch(id) {
		return d.scratch.SetRefs(ctx, id, refs)
	}
	return d.meta.Update(ctx, TableObjects, id.String(), func(old []byte, ok bool) ([]byte, error) {
		if !ok {
			return nil, fmt.Errorf("runtime: set refs of object %s: %w", id.Short(), object.ErrNotFound)
		}
		var rec objectRecord
		if err := json.Unmarshal(old, &rec); err != nil {
			return nil, err
		}
		if rec.Refs == refs {
			return nil, ErrNoChange
		}
		rec.Refs = refs
		return json.Marshal(rec)
	})
}

func (d *metaDirectory) Lookup(ctx context.Context, id object.ID) (object.Meta, error) {
	if d.isScratch(id) {
		return d.scratch.Lookup(ctx, id)
	}
	v, ok, err := d.meta.Get(ctx, TableObjects, id.String())
	if err != nil {
		return object.Meta{}, err
	}
	if !ok {
		return object.Meta{}, fmt.Errorf("runtime: lookup object %s: %w", id.Short(), object.ErrNotFound)
	}
	var rec objectRecord
	if err := json.Unmarshal(v, &rec); err != nil {
		return object.Meta{}, fmt.Errorf("runtime: object %s metadata: %w", id.Short(), err)
	}
	return object.Meta{ID: id, Size: rec.Size, Fingerprint: rec.Fingerprint, Owner: rec.Owner, Locations: rec.Locations, Refs: rec.Refs}, nil
}

func isNotFound(err error) bool { return errors.Is(err, object.ErrNotFound) }
