package objects

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/store/meta"
	"github.com/atoll-run/atoll/store/meta/metaserver"
	"github.com/atoll-run/atoll/store/object"
)

// memKV is the metadata log's state machine without the log: enough for the directory
// and reconciliation.
type memKV struct{ sm *metaserver.StateMachine }

func newMemKV() memKV { return memKV{metaserver.NewStateMachine(100)} }

func (m memKV) Get(_ context.Context, key string) (meta.KeyValue, bool, error) {
	kv, ok := m.sm.Get(key)
	return kv, ok, nil
}

func (m memKV) RangePage(_ context.Context, prefix, after string, limit int) (meta.Page, error) {
	kvs, next := m.sm.RangePage(prefix, after, limit)
	return meta.Page{KVs: kvs, Next: next}, nil
}

func (m memKV) Range(_ context.Context, prefix string) ([]meta.KeyValue, error) {
	return m.sm.Range(prefix), nil
}

func (m memKV) Txn(_ context.Context, cmp []meta.Compare, ops []meta.Op) (meta.Response, error) {
	r := m.sm.ApplyRequest(&meta.Request{Compares: cmp, Ops: ops})
	if r.Error != "" {
		return r, errors.New(r.Error)
	}
	return r, nil
}

func TestPlan(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	live := map[string]bool{"a:1": true, "b:1": true}
	ended := func(o string) bool { return o == "worker/j/g/0.g0" || o == "job/old" }
	w := World{Live: live, OwnerEnded: ended, Now: now, Keep: time.Hour, Unreferenced: func(key string) bool { return key == "objects/orphan" }}
	for _, tc := range []struct {
		name      string
		key       string
		rec       Record
		change    bool
		state     State
		locs      []string
		durable   []string
		drop      []string
		collected bool
	}{
		{name: "all live", rec: Record{Owner: "job/j", Locations: []string{"a:1", "b:1"}}},
		{name: "a dead incarnation's location is dropped", rec: Record{Owner: "job/j", Locations: []string{"a:0", "a:1"}, Durable: []string{"a:0", "a:1"}},
			change: true, locs: []string{"a:1"}, durable: []string{"a:1"}},
		{name: "no copy left: lost", rec: Record{Owner: DetachedOwner, Locations: []string{"a:0", "c:9"}, Durable: []string{"a:0"}},
			change: true, state: StateLost},
		{name: "an ordinary object of an owner that ended", rec: Record{Owner: "worker/j/g/0.g0", Locations: []string{"a:1", "z:0"}},
			change: true, state: StateOwnerDied, drop: []string{"a:1"}},
		{name: "a checkpoint outlives the worker that wrote it", rec: Record{Owner: "checkpoint/j/g", Locations: []string{"a:1"}}},
		{name: "a young tombstone stays", rec: Record{Owner: "job/old", State: StateOwnerDied, Ended: now.Add(-time.Minute)}},
		{name: "an old tombstone is collected", rec: Record{Owner: "x", State: StateLost, Ended: now.Add(-2 * time.Hour)}, change: true, collected: true},
		{name: "an orphan checkpoint part is freed", key: "objects/orphan", rec: Record{Owner: "checkpoint/j/g", Locations: []string{"a:1", "z:0"}},
			change: true, collected: true, drop: []string{"a:1"}},
		{name: "an orphan of no checkpoint is not", key: "objects/orphan", rec: Record{Owner: DetachedOwner, Locations: []string{"a:1"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := tc.key
			if key == "" {
				key = "objects/x"
			}
			a, ok := Plan(key, tc.rec, w)
			if ok != tc.change {
				t.Fatalf("change %v, want %v (%+v)", ok, tc.change, a)
			}
			if !ok {
				return
			}
			if tc.collected {
				if a.Record != nil || !slices.Equal(a.Drop, tc.drop) {
					t.Fatalf("want the record deleted and %v dropped, got %+v", tc.drop, a)
				}
				return
			}
			if a.Record.State != tc.state || !slices.Equal(a.Record.Locations, tc.locs) || !slices.Equal(a.Record.Durable, tc.durable) || !slices.Equal(a.Drop, tc.drop) {
				t.Fatalf("record %+v drop %v; want state %q locations %v durable %v drop %v", a.Record, a.Drop, tc.state, tc.locs, tc.durable, tc.drop)
			}
			if tc.state != "" && !a.Record.Ended.Equal(now) {
				t.Fatalf("ended %v, want %v", a.Record.Ended, now)
			}
		})
	}
}

// TestReconcileAndTombstones: a pass drops the locations of dead stores, marks what has no
// copy left lost (a reader gets object.ErrLost), marks an ended owner's objects (a reader
// gets object.ErrOwnerDied), collects old tombstones; a store that finds a lost copy again
// brings it back, and nothing takes in a copy of an object whose owner died.
func TestReconcileAndTombstones(t *testing.T) {
	ctx := context.Background()
	kv := newMemKV()
	d := NewDirectory(kv)
	ids := make([]object.ID, 4)
	for i := range ids {
		ids[i] = object.NewID()
	}
	reg := func(id object.ID, owner string, durable bool, locs ...string) {
		t.Helper()
		if err := d.Register(ctx, object.Meta{ID: id, Size: 10, Fingerprint: 7, Owner: owner, Locations: locs, Durable: durable}); err != nil {
			t.Fatal(err)
		}
	}
	reg(ids[0], DetachedOwner, true, "old:1", "b:1") // a restarted agent's old location, and a live copy
	reg(ids[1], DetachedOwner, true, "old:1")        // its only copy was at the old location
	reg(ids[2], "worker/j/g/0.g0", false, "b:1")     // its owner ended
	reg(ids[3], "job/j", false, "b:1")               // untouched
	now := time.Unix(1000, 0)
	w := World{Live: map[string]bool{"b:1": true}, OwnerEnded: func(o string) bool { return o == "worker/j/g/0.g0" }, Now: now, Keep: time.Minute}
	rep, acts, err := Reconcile(ctx, kv, w)
	if err != nil {
		t.Fatal(err)
	}
	want := Report{Records: 4, Lost: 1, OwnerDied: 1, DroppedLocations: 2, MarkedLost: 1, MarkedOwnerDied: 1}
	if rep != want {
		t.Fatalf("report %+v, want %+v", rep, want)
	}
	if len(acts) != 3 {
		t.Fatalf("%d actions, want 3", len(acts))
	}
	if m, err := d.Lookup(ctx, ids[0]); err != nil || !slices.Equal(m.Locations, []string{"b:1"}) {
		t.Fatalf("record of a dropped location: %+v %v", m, err)
	}
	if _, err := d.Lookup(ctx, ids[1]); !errors.Is(err, object.ErrLost) {
		t.Fatalf("lookup of a lost object: %v, want ErrLost", err)
	}
	if _, err := d.Lookup(ctx, ids[2]); !errors.Is(err, object.ErrOwnerDied) {
		t.Fatalf("lookup of an owner-died object: %v, want ErrOwnerDied", err)
	}
	// The restarted store registers its adopted copy: the object lives again.
	reg(ids[1], DetachedOwner, true, "new:2")
	if m, err := d.Lookup(ctx, ids[1]); err != nil || !slices.Equal(m.Locations, []string{"new:2"}) {
		t.Fatalf("lost object found again: %+v %v", m, err)
	}
	if err := d.Register(ctx, object.Meta{ID: ids[2], Size: 10, Owner: "worker/j/g/0.g0", Locations: []string{"c:1"}}); !errors.Is(err, object.ErrOwnerDied) {
		t.Fatalf("registering a copy of an owner-died object: %v", err)
	}
	// Freeing the last copy of a tombstone keeps the tombstone.
	if err := d.RemoveLocation(ctx, ids[2], "b:1"); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Lookup(ctx, ids[2]); !errors.Is(err, object.ErrOwnerDied) {
		t.Fatalf("tombstone after remove location: %v", err)
	}
	// Past Keep, the tombstone is collected.
	w.Now, w.Live["new:2"] = now.Add(2*time.Minute), true
	rep, _, err = Reconcile(ctx, kv, w)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Collected != 1 || rep.Records != 4 || rep.OwnerDied != 0 {
		t.Fatalf("second pass %+v", rep)
	}
	if _, ok := kv.sm.Get(api.TableObjects + ids[2].String()); ok {
		t.Fatal("the old tombstone is still there")
	}
}

// TestEndKeepsFirstCause: End tombstones a record and returns its locations; ending it
// again changes nothing.
func TestEndKeepsFirstCause(t *testing.T) {
	ctx := context.Background()
	kv := newMemKV()
	d := NewDirectory(kv)
	id := object.NewID()
	if err := d.Register(ctx, object.Meta{ID: id, Size: 1, Owner: "o", Locations: []string{"a:1", "b:1"}}); err != nil {
		t.Fatal(err)
	}
	locs, err := d.End(ctx, id, StateOwnerDied, time.Unix(5, 0))
	if err != nil || !slices.Equal(locs, []string{"a:1", "b:1"}) {
		t.Fatalf("end: %v %v", locs, err)
	}
	if _, err := d.End(ctx, id, StateLost, time.Unix(6, 0)); err != nil {
		t.Fatal(err)
	}
	kvv, _ := kv.sm.Get(api.TableObjects + id.String())
	var rec Record
	_ = json.Unmarshal(kvv.Value, &rec)
	if rec.State != StateOwnerDied || len(rec.Locations) != 0 || !rec.Ended.Equal(time.Unix(5, 0)) {
		t.Fatalf("record %+v", rec)
	}
}

// pagedKV counts the pages read and the largest.
type pagedKV struct {
	memKV
	pages, largest int
}

func (p *pagedKV) RangePage(ctx context.Context, prefix, after string, limit int) (meta.Page, error) {
	pg, err := p.memKV.RangePage(ctx, prefix, after, limit)
	p.pages++
	p.largest = max(p.largest, len(pg.KVs))
	return pg, err
}

// TestReconcileReadsInPages: a pass reads the objects table a page at a time and plans
// every record of every page: 7 records by 3 are three pages, the owner-died objects of
// each page marked.
func TestReconcileReadsInPages(t *testing.T) {
	defer func(n int) { reconcilePage = n }(reconcilePage)
	reconcilePage = 3
	ctx := context.Background()
	kv := &pagedKV{memKV: newMemKV()}
	d := NewDirectory(kv.memKV)
	for range 7 {
		if err := d.Register(ctx, object.Meta{ID: object.NewID(), Size: 10, Owner: "worker/j/g/0.g0", Locations: []string{"b:1"}}); err != nil {
			t.Fatal(err)
		}
	}
	w := World{Live: map[string]bool{"b:1": true}, OwnerEnded: func(string) bool { return true }, Now: time.Unix(1000, 0), Keep: time.Minute}
	rep, acts, err := Reconcile(ctx, kv, w)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Records != 7 || rep.MarkedOwnerDied != 7 || len(acts) != 7 {
		t.Fatalf("report %+v, %d actions; want 7 records, all marked owner-died", rep, len(acts))
	}
	if kv.pages != 3 || kv.largest != 3 {
		t.Fatalf("%d pages, the largest of %d records; want 3 of at most 3", kv.pages, kv.largest)
	}
}
