package runtime

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"
)

// ObjectID names an immutable object in the cluster.
type ObjectID string

// NewObjectID returns a fresh random id.
func NewObjectID() ObjectID {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return ObjectID(hex.EncodeToString(b[:]))
}

// ObjectStore is one machine's object store as the runtime uses it. Implementations are
// safe for concurrent use. The view returned by Get is read-only and valid until release is
// called; release must be called exactly once.
type ObjectStore interface {
	// Put stores a copy of data as a new immutable object owned by owner, with one reference.
	Put(ctx context.Context, id ObjectID, owner string, data []byte) error
	// Get returns a read-only view of the object's bytes.
	Get(ctx context.Context, id ObjectID) (view []byte, release func(), err error)
	// Free drops the owner's reference; the bytes go when no view is held.
	Free(ctx context.Context, id ObjectID) error
	// Has reports whether the store holds the object.
	Has(id ObjectID) bool
}

// MemStore is an in-memory ObjectStore: the walking skeleton's store, replaced by the
// shared-memory store of package store/object.
type MemStore struct {
	mu      sync.Mutex
	objects map[ObjectID]*memObject
}

type memObject struct {
	data  []byte
	refs  int
	owner string
}

var _ ObjectStore = (*MemStore)(nil)

// NewMemStore returns an empty store.
func NewMemStore() *MemStore { return &MemStore{objects: map[ObjectID]*memObject{}} }

// Put implements ObjectStore.
func (s *MemStore) Put(ctx context.Context, id ObjectID, owner string, data []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.objects[id]; ok {
		return fmt.Errorf("%w: object %s already exists (objects are immutable)", ErrInvalidRequest, id)
	}
	s.objects[id] = &memObject{data: append([]byte(nil), data...), refs: 1, owner: owner}
	return nil
}

// Get implements ObjectStore.
func (s *MemStore) Get(ctx context.Context, id ObjectID) ([]byte, func(), error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	o, ok := s.objects[id]
	if !ok {
		return nil, nil, fmt.Errorf("%w: %s", ErrUnknownObject, id)
	}
	o.refs++
	var once sync.Once
	return o.data, func() { once.Do(func() { s.unref(id) }) }, nil
}

// Free implements ObjectStore.
func (s *MemStore) Free(ctx context.Context, id ObjectID) error {
	s.mu.Lock()
	_, ok := s.objects[id]
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: %s", ErrUnknownObject, id)
	}
	s.unref(id)
	return nil
}

// Has implements ObjectStore.
func (s *MemStore) Has(id ObjectID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.objects[id]
	return ok
}

func (s *MemStore) unref(id ObjectID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if o, ok := s.objects[id]; ok {
		o.refs--
		if o.refs <= 0 {
			delete(s.objects, id)
		}
	}
}
