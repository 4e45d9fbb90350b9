package objects

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/atoll-run/atoll/store/object"
	"github.com/atoll-run/atoll/store/transfer"
)

// Local is one machine's object store as the processes of that machine use it: puts and
// gets by named holders (a worker, the driver, the agent), references counted per holder,
// and freeing an object drops every reference this store holds to it. The agent serves it
// to its worker processes; the embedded default and a driver use it in process.
type Local struct {
	Node *transfer.Node

	mu      sync.Mutex
	holders map[object.ID]map[string]int
}

// NewLocal wraps a running node.
func NewLocal(n *transfer.Node) *Local {
	return &Local{Node: n, holders: map[object.ID]map[string]int{}}
}

func (l *Local) hold(id object.ID, holder string) {
	l.mu.Lock()
	if l.holders[id] == nil {
		l.holders[id] = map[string]int{}
	}
	l.holders[id][holder]++
	l.mu.Unlock()
}

// Put stores data as a new object held (and owned) by holder; its metadata is committed
// to the directory before Put returns.
func (l *Local) Put(ctx context.Context, holder string, data []byte) (object.ID, error) {
	id, err := l.Node.Store.Put(ctx, holder, data)
	if err != nil {
		return object.ID{}, err
	}
	l.hold(id, holder)
	return id, nil
}

// Get returns a view of an object, pulling it over the transfer plane into this store
// when it is elsewhere (holder then holds a reference to the local copy). The caller
// releases the view.
func (l *Local) Get(ctx context.Context, id object.ID, holder string) (*object.View, error) {
	if v, err := l.Node.Store.Get(ctx, id); err == nil {
		return v, nil
	} else if !errors.Is(err, object.ErrNotFound) {
		return nil, err
	}
	v, err := l.Node.Get(ctx, id, holder)
	if err != nil {
		return nil, err
	}
	l.hold(id, holder)
	return v, nil
}

// Replicate makes sure this store holds a copy of an object, held by holder (a second
// copy of a checkpoint, so that it survives the loss of the machine that wrote it).
func (l *Local) Replicate(ctx context.Context, id object.ID, holder string) error {
	if l.Node.Store.Contains(id) {
		if err := l.Node.Store.AddRef(ctx, id, holder); err != nil {
			return err
		}
		l.hold(id, holder)
		return nil
	}
	v, err := l.Get(ctx, id, holder)
	if err != nil {
		return err
	}
	v.Release()
	return nil
}

// Map pins an object for a worker process of this machine and says where to map it (read
// only, zero copy), pulling it here first when needed.
func (l *Local) Map(ctx context.Context, id object.ID, holder string) (object.Mapping, error) {
	m, err := l.Node.Store.Map(ctx, id, holder)
	if err == nil || !errors.Is(err, object.ErrNotFound) {
		return m, err
	}
	v, err := l.Get(ctx, id, holder)
	if err != nil {
		return object.Mapping{}, err
	}
	defer v.Release()
	return l.Node.Store.Map(ctx, id, holder)
}

// Unmap drops a mapping pin.
func (l *Local) Unmap(ctx context.Context, id object.ID, holder string) error {
	return l.Node.Store.Unmap(ctx, id, holder)
}

// Release drops one reference of holder.
func (l *Local) Release(ctx context.Context, id object.ID, holder string) error {
	l.mu.Lock()
	if l.holders[id][holder] > 0 {
		l.holders[id][holder]--
		if l.holders[id][holder] == 0 {
			delete(l.holders[id], holder)
		}
	}
	l.mu.Unlock()
	return l.Node.Store.Release(ctx, id, holder)
}

// Free drops every reference this store holds to an object: its copy goes once no view or
// mapping pins it, and its location leaves the directory.
func (l *Local) Free(ctx context.Context, id object.ID) error {
	l.mu.Lock()
	hs := l.holders[id]
	delete(l.holders, id)
	l.mu.Unlock()
	var errs []error
	for h, n := range hs {
		for i := 0; i < n; i++ {
			if err := l.Node.Store.Release(ctx, id, h); err != nil && !errors.Is(err, object.ErrNotFound) && !errors.Is(err, object.ErrNotHolder) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// ReleaseHolder drops every reference and mapping of a holder (a worker that stopped).
func (l *Local) ReleaseHolder(ctx context.Context, holder string) error {
	l.mu.Lock()
	var ids []object.ID
	counts := map[object.ID]int{}
	for id, hs := range l.holders {
		if n := hs[holder]; n > 0 {
			ids = append(ids, id)
			counts[id] = n
			delete(hs, holder)
		}
	}
	l.mu.Unlock()
	var errs []error
	for _, id := range ids {
		for i := 0; i < counts[id]; i++ {
			if err := l.Node.Store.Release(ctx, id, holder); err != nil && !errors.Is(err, object.ErrNotFound) && !errors.Is(err, object.ErrNotHolder) {
				errs = append(errs, fmt.Errorf("release %s: %w", id.Short(), err))
			}
		}
	}
	return errors.Join(errs...)
}

// Held reports whether this store holds references to an object.
func (l *Local) Held(id object.ID) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.holders[id]) > 0
}
