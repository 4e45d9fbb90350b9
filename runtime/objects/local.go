package objects

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
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
	// SharedDir is the shared checkpoint directory this machine mounts (""): an object
	// with a copy there and none that can be pulled is read from it.
	SharedDir string

	mu      sync.Mutex
	holders map[object.ID]map[string]int
	// held indexes holders by holder: a worker's end releases what it holds without
	// going over every object of the machine.
	held map[string]map[object.ID]struct{}
	// borrowed are the copies this store pulled of objects others own, with their owner
	// once known ("" until the first check): a get of one asks the directory whether its
	// owner still lives.
	borrowed map[object.ID]string
	// writing are objects being written in place by another process of this machine
	// (Create), until it seals or aborts them.
	writing map[object.ID]pendingWrite
}

// pendingWrite is an object another process is writing into this store's shared memory.
type pendingWrite struct {
	w     *object.Writer
	owner string // who the object will belong to (the put's holder)
	lease string // the writing process's lease holder: its death aborts the write
}

// NewLocal wraps a running node.
func NewLocal(n *transfer.Node) *Local {
	return &Local{Node: n, holders: map[object.ID]map[string]int{}, held: map[string]map[object.ID]struct{}{}, borrowed: map[object.ID]string{},
		writing: map[object.ID]pendingWrite{}}
}

func (l *Local) borrow(id object.ID) {
	l.mu.Lock()
	if _, ok := l.borrowed[id]; !ok {
		l.borrowed[id] = ""
	}
	l.mu.Unlock()
}

// SharedLocation is the location of the copies in a shared checkpoint directory.
func SharedLocation(dir string) string { return SharedPrefix + dir }

// SharedPrefix starts the location of a copy in a shared checkpoint directory.
const SharedPrefix = "shared:"

// sharedCopy reports whether id's record lists a copy in this machine's shared directory.
func (l *Local) sharedCopy(ctx context.Context, id object.ID) bool {
	d, ok := l.Node.Store.Directory().(*Directory)
	if !ok {
		return false
	}
	rec, found, err := d.Record(ctx, id)
	return err == nil && found && rec.State == "" && slices.Contains(rec.Locations, SharedLocation(l.SharedDir))
}

// checkBorrowed refuses a copy this store pulled of an object whose owner has ended (its
// record says so): the copy is dropped and object.ErrOwnerDied returned. A copy of a
// durable object (detached, a checkpoint's part) is not checked; nor is a copy whose
// record cannot be read now (the copy is served).
func (l *Local) checkBorrowed(ctx context.Context, id object.ID) error {
	l.mu.Lock()
	owner, ok := l.borrowed[id]
	l.mu.Unlock()
	if !ok || DurableOwner(owner) {
		return nil
	}
	m, err := l.Node.Store.Directory().Lookup(ctx, id)
	switch {
	case errors.Is(err, object.ErrOwnerDied):
		_ = l.Drop(ctx, id, object.ErrOwnerDied)
		return err
	case err == nil && owner == "":
		l.mu.Lock()
		if _, ok := l.borrowed[id]; ok {
			l.borrowed[id] = m.Owner
		}
		l.mu.Unlock()
	}
	return nil
}

func (l *Local) hold(id object.ID, holder string) {
	l.mu.Lock()
	if l.holders[id] == nil {
		l.holders[id] = map[string]int{}
	}
	l.holders[id][holder]++
	if l.held[holder] == nil {
		l.held[holder] = map[object.ID]struct{}{}
	}
	l.held[holder][id] = struct{}{}
	l.mu.Unlock()
}

// unholdLocked forgets holder's references to id (all of them).
func (l *Local) unholdLocked(id object.ID, holder string) {
	delete(l.holders[id], holder)
	if ids := l.held[holder]; ids != nil {
		delete(ids, id)
		if len(ids) == 0 {
			delete(l.held, holder)
		}
	}
}

// forgetLocked forgets every holder's references to id.
func (l *Local) forgetLocked(id object.ID) {
	for h := range l.holders[id] {
		l.unholdLocked(id, h)
	}
	delete(l.holders, id)
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

// PutFrom stores size bytes read from r as a new object held (and owned) by holder,
// streamed into the store's shared memory: nothing is buffered on the way, and a body that
// fails gives its room back at once. See object.Store.PutFrom.
func (l *Local) PutFrom(ctx context.Context, holder string, size int64, r io.Reader) (object.Meta, error) {
	m, err := l.Node.Store.PutFrom(ctx, holder, object.NewID(), size, r)
	if err != nil {
		return object.Meta{}, err
	}
	l.hold(m.ID, holder)
	return m, nil
}

// Create admits size bytes for a new object that another process of this machine (whose
// lease holder is lease) writes straight into the store's shared memory, and returns its
// id and where to map it (object.MapFileRW). The object belongs to owner once sealed
// (Seal); until then it is invisible. If the writing process dies first (its lease
// expires, or ReleaseHolder(lease)), the write is aborted and its room given back. See
// object.Store.CreateFor.
//
// The segment may be one the process wrote before (the store keeps them for its next
// writes), so the process may keep its writable mappings; unmap lists the files of its
// segments the store has dropped since, which it should unmap.
func (l *Local) Create(ctx context.Context, owner, lease string, size int64) (id object.ID, m object.Mapping, unmap []string, err error) {
	id = object.NewID()
	w, err := l.Node.Store.CreateFor(ctx, owner, lease, id, size)
	if err != nil {
		return object.ID{}, object.Mapping{}, nil, err
	}
	l.mu.Lock()
	l.writing[id] = pendingWrite{w: w, owner: owner, lease: lease}
	l.mu.Unlock()
	return id, w.Mapping(), l.Node.Store.TakeUnmapped(lease), nil
}

// takeWrite removes the pending write of id for owner.
func (l *Local) takeWrite(id object.ID, owner string) (pendingWrite, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	p, ok := l.writing[id]
	if !ok {
		return p, fmt.Errorf("object %s is not being written here (never created, or already sealed or aborted): %w", id.Short(), object.ErrNotFound)
	}
	if p.owner != owner {
		return p, fmt.Errorf("object %s is not being written for %q: %w", id.Short(), owner, object.ErrNotFound)
	}
	delete(l.writing, id)
	return p, nil
}

// Seal makes an object written in place (Create) visible, owned and held by owner, its
// metadata committed to the directory as a put's; the writer has written it (it may keep it mapped).
func (l *Local) Seal(ctx context.Context, id object.ID, owner string) (object.Meta, error) {
	p, err := l.takeWrite(id, owner)
	if err != nil {
		return object.Meta{}, err
	}
	if err := p.w.Seal(ctx, false); err != nil {
		return object.Meta{}, err
	}
	l.hold(id, owner)
	return object.Meta{ID: id, Size: p.w.Mapping().Size, Owner: owner, Locations: []string{l.Node.Store.Location()}, Refs: 1}, nil
}

// Abort gives back the room of an object written in place that will not be sealed.
func (l *Local) Abort(id object.ID, owner string) error {
	p, err := l.takeWrite(id, owner)
	if err != nil {
		return err
	}
	p.w.Abort()
	return nil
}

// Persist makes this machine's copy of an object durable (fsync'd on disk, adopted again
// when the store restarts) and returns its metadata.
func (l *Local) Persist(ctx context.Context, id object.ID) (object.Meta, error) {
	return l.Node.Store.Persist(ctx, id)
}

// Get returns a view of an object, pulling it over the transfer plane into this store
// when it is elsewhere (holder then holds a reference to the local copy). The caller
// releases the view.
func (l *Local) Get(ctx context.Context, id object.ID, holder string) (*object.View, error) {
	if v, err := l.Node.Store.Get(ctx, id); err == nil {
		if err := l.checkBorrowed(ctx, id); err != nil {
			v.Release()
			return nil, err
		}
		return v, nil
	} else if !errors.Is(err, object.ErrNotFound) {
		return nil, err
	}
	held := l.Node.Store.Contains(id)
	v, err := l.Node.Get(ctx, id, holder)
	if err != nil && l.SharedDir != "" && !errors.Is(err, object.ErrOwnerDied) && l.sharedCopy(ctx, id) {
		if _, ierr := l.Node.Store.Import(ctx, holder, id, l.SharedDir); ierr == nil || errors.Is(ierr, object.ErrExists) {
			v, err = l.Node.Store.Get(ctx, id)
		} else {
			err = fmt.Errorf("%w; from the shared checkpoint directory: %w", err, ierr)
		}
	}
	if err != nil {
		return nil, err
	}
	if !held {
		l.borrow(id)
	}
	l.hold(id, holder)
	return v, nil
}

// Replicate makes sure this store holds a copy of an object, held by holder (a second
// copy of a checkpoint, so that it survives the loss of the machine that wrote it); with
// durable, the copy is persisted (fsync'd) before Replicate returns, and its metadata is
// returned.
func (l *Local) Replicate(ctx context.Context, id object.ID, holder string, durable bool) (object.Meta, error) {
	if l.Node.Store.Contains(id) {
		if err := l.Node.Store.AddRef(ctx, id, holder); err != nil {
			return object.Meta{}, err
		}
		l.hold(id, holder)
	} else {
		v, err := l.Get(ctx, id, holder)
		if err != nil {
			return object.Meta{}, err
		}
		v.Release()
		l.mu.Lock()
		if _, ok := l.borrowed[id]; ok && DurableOwner(holder) {
			l.borrowed[id] = holder // a durable copy, kept for its durable owner
		}
		l.mu.Unlock()
	}
	if !durable {
		return object.Meta{ID: id, Locations: []string{l.Node.Addr}}, nil
	}
	return l.Node.Store.Persist(ctx, id)
}

// Map pins an object for a worker process of this machine and says where to map it (read
// only, zero copy), pulling it here first when needed.
func (l *Local) Map(ctx context.Context, id object.ID, holder string) (object.Mapping, error) {
	m, err := l.Node.Store.Map(ctx, id, holder)
	if err == nil {
		if err := l.checkBorrowed(ctx, id); err != nil {
			_ = l.Node.Store.Unmap(ctx, id, holder)
			return object.Mapping{}, err
		}
		return m, nil
	}
	if !errors.Is(err, object.ErrNotFound) {
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
			l.unholdLocked(id, holder)
		}
	}
	l.mu.Unlock()
	err := l.Node.Store.Release(ctx, id, holder)
	l.forgetGone(id)
	return err
}

// forgetGone forgets what this Local knew of copies the store no longer holds.
func (l *Local) forgetGone(ids ...object.ID) {
	for _, id := range ids {
		if !l.Node.Store.Contains(id) {
			l.mu.Lock()
			delete(l.borrowed, id)
			if len(l.holders[id]) == 0 {
				delete(l.holders, id)
			}
			l.mu.Unlock()
		}
	}
}

// Free drops every reference this store holds to an object, those of a previous instance
// of the store (adopted at its Open) included: its copy is refused from now on and goes
// once no view or mapping pins it, and its location leaves the directory.
func (l *Local) Free(ctx context.Context, id object.ID) error {
	return l.Drop(ctx, id, nil)
}

// Drop is Free with the cause later gets are refused with (object.ErrOwnerDied: its owner
// ended).
func (l *Local) Drop(ctx context.Context, id object.ID, cause error) error {
	l.mu.Lock()
	l.forgetLocked(id)
	delete(l.borrowed, id)
	l.mu.Unlock()
	if err := l.Node.Store.Drop(ctx, id, cause); err != nil && !errors.Is(err, object.ErrNotFound) {
		return err
	}
	return nil
}

// ReleaseHolder drops every reference and mapping of a holder (a worker that stopped).
func (l *Local) ReleaseHolder(ctx context.Context, holder string) error {
	l.mu.Lock()
	for id, p := range l.writing { // its writes in place end with it
		if p.lease == holder {
			delete(l.writing, id)
			p.w.Abort()
		}
	}
	var ids []object.ID
	counts := map[object.ID]int{}
	for id := range l.held[holder] {
		if n := l.holders[id][holder]; n > 0 {
			ids = append(ids, id)
			counts[id] = n
		}
		delete(l.holders[id], holder)
	}
	delete(l.held, holder)
	l.mu.Unlock()
	l.Node.Store.ForgetWriter(holder)
	var errs []error
	for _, id := range ids {
		for i := 0; i < counts[id]; i++ {
			if err := l.Node.Store.Release(ctx, id, holder); err != nil && !errors.Is(err, object.ErrNotFound) && !errors.Is(err, object.ErrNotHolder) {
				errs = append(errs, fmt.Errorf("release %s: %w", id.Short(), err))
			}
		}
	}
	l.forgetGone(ids...)
	return errors.Join(errs...)
}

// Held reports whether this store holds references to an object.
func (l *Local) Held(id object.ID) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.holders[id]) > 0
}
