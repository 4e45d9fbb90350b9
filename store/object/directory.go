package object

import (
	"context"
	"fmt"
	"slices"
	"sync"
)

// Meta is what the cluster knows about an object.
type Meta struct {
	ID          ID
	Size        int64
	Fingerprint uint64 // xxhash64 of the whole object; 0 until first computed
	Owner       string
	Locations   []string // transfer addresses of stores holding a full copy
	Refs        int64    // logical references held at Locations[0]'s store (advisory)
	// Durable says the copies at Locations are durable (Persist): on disk, fsync'd,
	// adopted by the store's next Open. Register records it per location.
	Durable bool
	// Put says this registration is a put's (Put, PutFrom): the object's first, not a
	// copy's, persistence's or recovery's. A directory may commit it behind the put.
	Put bool
}

// Directory is the object metadata the store writes through. The store is its
// consumer and owns this interface; the Paxos-backed metadata log implements it,
// MemDirectory is the in-memory implementation used until then and in tests.
//
// Implementations must be safe for concurrent use. Register merges: registering an
// id that exists adds the location. Lookup returns a copy the caller may keep.
type Directory interface {
	Register(ctx context.Context, m Meta) error
	RemoveLocation(ctx context.Context, id ID, location string) error
	SetRefs(ctx context.Context, id ID, refs int64) error
	Lookup(ctx context.Context, id ID) (Meta, error)
}

// MemDirectory is an in-memory Directory. An entry is deleted when its last
// location is removed. The zero value is not usable; call NewMemDirectory.
type MemDirectory struct {
	mu sync.Mutex
	m  map[ID]*Meta
}

var _ Directory = (*MemDirectory)(nil)

// NewMemDirectory returns an empty in-memory directory.
func NewMemDirectory() *MemDirectory { return &MemDirectory{m: make(map[ID]*Meta)} }

// Register records m, merging its locations into an existing entry.
func (d *MemDirectory) Register(_ context.Context, m Meta) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	e, ok := d.m[m.ID]
	if !ok {
		c := m
		c.Locations = slices.Clone(m.Locations)
		d.m[m.ID] = &c
		return nil
	}
	if e.Fingerprint == 0 {
		e.Fingerprint = m.Fingerprint
	}
	if e.Size != m.Size || (m.Fingerprint != 0 && e.Fingerprint != m.Fingerprint) {
		return fmt.Errorf("object: directory register %s: size/fingerprint %d/%x differ from %d/%x: %w",
			m.ID.Short(), m.Size, m.Fingerprint, e.Size, e.Fingerprint, ErrFingerprint)
	}
	for _, l := range m.Locations {
		if !slices.Contains(e.Locations, l) {
			e.Locations = append(e.Locations, l)
		}
	}
	return nil
}

// RemoveLocation drops location from id's entry, deleting the entry when none remain.
func (d *MemDirectory) RemoveLocation(_ context.Context, id ID, location string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	e, ok := d.m[id]
	if !ok {
		return fmt.Errorf("object: directory remove location %s: %w", id.Short(), ErrNotFound)
	}
	e.Locations = slices.DeleteFunc(e.Locations, func(l string) bool { return l == location })
	if len(e.Locations) == 0 {
		delete(d.m, id)
	}
	return nil
}

// SetRefs records the reference count.
func (d *MemDirectory) SetRefs(_ context.Context, id ID, refs int64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	e, ok := d.m[id]
	if !ok {
		return fmt.Errorf("object: directory set refs %s: %w", id.Short(), ErrNotFound)
	}
	e.Refs = refs
	return nil
}

// Lookup returns a copy of id's entry or ErrNotFound.
func (d *MemDirectory) Lookup(_ context.Context, id ID) (Meta, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	e, ok := d.m[id]
	if !ok {
		return Meta{}, fmt.Errorf("object: directory lookup %s: %w", id.Short(), ErrNotFound)
	}
	c := *e
	c.Locations = slices.Clone(e.Locations)
	return c, nil
}
