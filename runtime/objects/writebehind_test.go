package objects

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/atoll-run/atoll/store/meta"
	"github.com/atoll-run/atoll/store/object"
)

// gatedKV hands every transaction to the test (its ops on txns) and applies it only when
// the test says so (release), so that the test sees the group commits one by one.
type gatedKV struct {
	memKV
	txns    chan []meta.Op
	release chan struct{}
}

func (g gatedKV) Txn(ctx context.Context, cmp []meta.Compare, ops []meta.Op) (meta.Response, error) {
	g.txns <- ops
	<-g.release
	return g.memKV.Txn(ctx, cmp, ops)
}

func newID(b byte) object.ID { return object.ID{b} }

func owned(id object.ID) object.Meta {
	return object.Meta{ID: id, Size: 8, Owner: "driver/d1", Locations: []string{"store-a"}, Refs: 1, Put: true}
}

// TestWriteBehindGroupCommit: a put's registration returns before its record is in the
// log; what is queued during a commit is the next commit, as one transaction; the
// directory that queued it sees it meanwhile, another waits for it; a record freed
// before it was written is never written; Flush waits for the queue.
func TestWriteBehindGroupCommit(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv := gatedKV{memKV: newMemKV(), txns: make(chan []meta.Op), release: make(chan struct{})}
	d := NewDirectory(kv).WriteBehind()
	plain := NewDirectory(kv.memKV) // another process's directory, reading the log

	if err := d.Register(ctx, owned(newID(1))); err != nil { // returns at once
		t.Fatal(err)
	}
	if ops := <-kv.txns; len(ops) != 1 || ops[0].Key != key(newID(1)) {
		t.Fatalf("the first commit: %+v", ops)
	}
	// While it commits, three more puts queue and one is freed before its record is written.
	for _, b := range []byte{2, 3, 4} {
		if err := d.Register(ctx, owned(newID(b))); err != nil {
			t.Fatal(err)
		}
	}
	// Unwritten: queued and not proposed, with the store as its only location (the SDK's
	// Free then frees the store's copy alone); not a record being committed, nor another
	// store's.
	if !d.Unwritten(newID(4), "store-a") || d.Unwritten(newID(4), "store-b") || d.Unwritten(newID(1), "store-a") {
		t.Fatalf("Unwritten: queued %v, another location %v, being committed %v; want true, false, false",
			d.Unwritten(newID(4), "store-a"), d.Unwritten(newID(4), "store-b"), d.Unwritten(newID(1), "store-a"))
	}
	if err := d.RemoveLocation(ctx, newID(4), "store-a"); err != nil {
		t.Fatal(err)
	}
	if d.Unwritten(newID(4), "store-a") {
		t.Fatal("Unwritten after its free")
	}
	if m, err := d.Lookup(ctx, newID(2)); err != nil || m.Owner != "driver/d1" {
		t.Fatalf("the queueing directory's lookup of a queued record: %+v, %v", m, err)
	}
	if _, ok := kv.memKV.sm.Get(key(newID(2))); ok {
		t.Fatal("a queued record is in the log before its commit")
	}
	kv.release <- struct{}{}
	ops := <-kv.txns // the next group: the two queued and not freed, in one transaction
	if len(ops) != 2 || ops[0].Key != key(newID(2)) || ops[1].Key != key(newID(3)) {
		t.Fatalf("the second commit: %+v; want the records of 2 and 3 together", ops)
	}
	// A reader elsewhere waits for a record on its way (within lookupGrace).
	looked := make(chan error, 1)
	go func() {
		_, err := NewDirectory(kv.memKV).WriteBehind().Lookup(ctx, newID(3))
		looked <- err
	}()
	kv.release <- struct{}{}
	if err := d.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-looked; err != nil {
		t.Fatalf("a reader elsewhere of a record being committed: %v", err)
	}
	for _, b := range []byte{1, 2, 3} {
		if m, err := plain.Lookup(ctx, newID(b)); err != nil || m.Size != 8 || m.Locations[0] != "store-a" {
			t.Fatalf("record %d after Flush: %+v, %v", b, m, err)
		}
	}
	if _, err := plain.Lookup(ctx, newID(4)); !errors.Is(err, object.ErrNotFound) {
		t.Fatalf("an object freed before its record was written: %v; want ErrNotFound", err)
	}
	if c, r := d.GroupCommits(); c != 2 || r != 3 {
		t.Fatalf("%d group commits of %d records; want 2 of 3", c, r)
	}
}

// TestWriteBehindKeepsDurableSynchronous: a durable object's registration (detached, a
// checkpoint's part, a persisted copy) and a copy's are in the log when Register returns.
func TestWriteBehindKeepsDurableSynchronous(t *testing.T) {
	ctx := context.Background()
	kv := newMemKV()
	d := NewDirectory(kv).WriteBehind()
	for i, m := range []object.Meta{
		{ID: newID(1), Size: 1, Owner: DetachedOwner, Locations: []string{"a"}, Put: true},
		{ID: newID(2), Size: 1, Owner: CheckpointOwnerPrefix + "j/g", Locations: []string{"a"}, Put: true},
		{ID: newID(3), Size: 1, Owner: "driver/d1", Locations: []string{"a"}, Durable: true},
		{ID: newID(4), Size: 1, Owner: "driver/d1", Locations: []string{"b"}}, // a copy pulled
	} {
		if err := d.Register(ctx, m); err != nil {
			t.Fatal(err)
		}
		if _, ok := kv.sm.Get(key(m.ID)); !ok {
			t.Fatalf("durable registration %d is not in the log when Register returns", i)
		}
	}
	if c, _ := d.GroupCommits(); c != 0 {
		t.Fatalf("%d group commits for durable objects", c)
	}
}
