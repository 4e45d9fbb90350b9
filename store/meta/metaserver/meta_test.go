package metaserver

import (
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/atoll-run/atoll/store/meta"
	"go.uber.org/zap/zaptest"
)

// TestRangeOrdersItsPrefix: Range answers exactly the keys under its prefix, in order,
// after puts, deletes and a restore (the ordered index stays the map's twin).
func TestRangeOrdersItsPrefix(t *testing.T) {
	sm := NewStateMachine(0)
	keys := []string{"gangs/j/b", "gangs/", "gangs0", "gang", "gangs/j/a", "gangs/k", "jobs/j", "gangs/j/c"}
	for _, k := range keys {
		sm.ApplyRequest(&meta.Request{Ops: []meta.Op{{Type: meta.OpPut, Key: k, Value: []byte(k)}}})
	}
	sm.ApplyRequest(&meta.Request{Ops: []meta.Op{{Type: meta.OpDelete, Key: "gangs/j/c"}, {Type: meta.OpPut, Key: "gangs/j/a", Value: []byte("v2")}}})
	names := func(kvs []meta.KeyValue) []string {
		var out []string
		for _, kv := range kvs {
			out = append(out, kv.Key)
		}
		return out
	}
	want := map[string][]string{
		"gangs/":   {"gangs/", "gangs/j/a", "gangs/j/b", "gangs/k"},
		"gangs/j/": {"gangs/j/a", "gangs/j/b"},
		"gangs":    {"gangs/", "gangs/j/a", "gangs/j/b", "gangs/k", "gangs0"},
		"gangs/x":  nil,
		"":         {"gang", "gangs/", "gangs/j/a", "gangs/j/b", "gangs/k", "gangs0", "jobs/j"},
	}
	snap, _, err := sm.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	restored := NewStateMachine(0)
	if err := restored.Restore(snap); err != nil {
		t.Fatal(err)
	}
	for name, m := range map[string]*StateMachine{"live": sm, "restored": restored} {
		for prefix, w := range want {
			if got := names(m.Range(prefix)); !slices.Equal(got, w) {
				t.Errorf("%s: Range(%q) = %q, want %q", name, prefix, got, w)
			}
		}
		if kvs := m.Range("gangs/j/a"); len(kvs) != 1 || string(kvs[0].Value) != "v2" || kvs[0].Version != 2 {
			t.Errorf("%s: Range(gangs/j/a) = %+v, want the second version", name, kvs)
		}
	}
}

// TestHistoryCutInSteps: the watch history stays between its limit and an eighth over
// it, and is cut back once per eighth of its limit, not at every transaction (each cut
// copies what it keeps).
func TestHistoryCutInSteps(t *testing.T) {
	const limit = 800
	sm := NewStateMachine(limit)
	cuts, last := 0, int64(0)
	for i := range 10000 {
		sm.ApplyRequest(&meta.Request{Ops: []meta.Op{{Type: meta.OpPut, Key: "jobs/" + strconv.Itoa(i%7)}}})
		sm.mu.Lock()
		n, compact := len(sm.history), sm.compact
		sm.mu.Unlock()
		if compact != last {
			cuts, last = cuts+1, compact
		}
		if i >= limit && (n < limit || n > limit+limit/8) {
			t.Fatalf("after %d transactions the history holds %d events: want %d..%d", i+1, n, limit, limit+limit/8)
		}
	}
	if want := (10000 - limit) / (limit / 8); cuts > want+1 {
		t.Fatalf("the history was cut %d times in 10,000 transactions: want at most %d", cuts, want+1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	evs, _, err := sm.EventsSince(ctx, "jobs/", sm.Revision()-limit, 0)
	if err != nil || len(evs) != limit {
		t.Fatalf("the last %d revisions: %d events, %v; want all of them", limit, len(evs), err)
	}
}

func TestStateMachineTxn(t *testing.T) {
	sm := NewStateMachine(0)
	steps := []struct {
		name    string
		req     meta.Request
		wantOK  bool
		wantRev int64
		wantErr bool
	}{
		{"put", meta.Request{Ops: []meta.Op{{Type: meta.OpPut, Key: "nodes/a", Value: []byte("1")}}}, true, 1, false},
		{"cas-absent-fails", meta.Request{Compares: []meta.Compare{{Key: "nodes/a", Version: 0}}, Ops: []meta.Op{{Type: meta.OpPut, Key: "nodes/a", Value: []byte("x")}}}, false, 1, false},
		{"cas-v1", meta.Request{Compares: []meta.Compare{{Key: "nodes/a", Version: 1}}, Ops: []meta.Op{{Type: meta.OpPut, Key: "nodes/a", Value: []byte("2")}}}, true, 2, false},
		{"multi-key", meta.Request{Compares: []meta.Compare{{Key: "jobs/j", Version: 0}}, Ops: []meta.Op{{Type: meta.OpPut, Key: "jobs/j", Value: []byte("j")}, {Type: meta.OpPut, Key: "gangs/g", Value: []byte("g")}}}, true, 3, false},
		{"delete", meta.Request{Ops: []meta.Op{{Type: meta.OpDelete, Key: "gangs/g"}}}, true, 4, false},
		{"dedup-first", meta.Request{ClientID: "c", Seq: 1, Ops: []meta.Op{{Type: meta.OpPut, Key: "objects/o", Value: []byte("1")}}}, true, 5, false},
		{"dedup-retry", meta.Request{ClientID: "c", Seq: 1, Ops: []meta.Op{{Type: meta.OpPut, Key: "objects/o", Value: []byte("1")}}}, true, 5, false},
		{"dedup-next-acks", meta.Request{ClientID: "c", Seq: 2, AckBelow: 2, Ops: []meta.Op{{Type: meta.OpPut, Key: "objects/p", Value: []byte("1")}}}, true, 6, false},
		{"stale", meta.Request{ClientID: "c", Seq: 1, Ops: []meta.Op{{Type: meta.OpPut, Key: "objects/o", Value: []byte("1")}}}, false, 6, true},
		{"bad-empty-key", meta.Request{Ops: []meta.Op{{Type: meta.OpPut}}}, false, 6, true},
		{"bad-op", meta.Request{Ops: []meta.Op{{Type: "frob", Key: "k"}}}, false, 6, true},
	}
	for _, s := range steps {
		resp := sm.ApplyRequest(&s.req)
		if resp.Succeeded != s.wantOK || resp.Revision != s.wantRev || (resp.Error != "") != s.wantErr {
			t.Fatalf("%s: got %+v, want ok=%v rev=%d err=%v", s.name, resp, s.wantOK, s.wantRev, s.wantErr)
		}
	}
	kv, ok := sm.Get("nodes/a")
	if !ok || string(kv.Value) != "2" || kv.Version != 2 || kv.CreateRevision != 1 || kv.ModRevision != 2 {
		t.Fatalf("nodes/a = %+v", kv)
	}
	if o, _ := sm.Get("objects/o"); o.Version != 1 {
		t.Fatalf("deduplicated put applied twice: version %d", o.Version)
	}
	if _, ok := sm.Get("gangs/g"); ok {
		t.Fatal("deleted key present")
	}
	// Snapshot and restore give the same state, dedup table included.
	snap, _, err := sm.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	sm2 := NewStateMachine(0)
	if err := sm2.Restore(snap); err != nil {
		t.Fatal(err)
	}
	if sm2.Revision() != 6 || len(sm2.Range("")) != len(sm.Range("")) {
		t.Fatalf("restored rev %d keys %d", sm2.Revision(), len(sm2.Range("")))
	}
	if r := sm2.ApplyRequest(&meta.Request{ClientID: "c", Seq: 2, Ops: []meta.Op{{Type: meta.OpPut, Key: "objects/p"}}}); r.Revision != 6 {
		t.Fatalf("dedup lost across snapshot: %+v", r)
	}
	if err := sm2.Restore([]byte("{garbage")); err == nil {
		t.Fatal("garbage snapshot accepted")
	}
}

func TestWatchOrderedFromRevision(t *testing.T) {
	sm := NewStateMachine(1000)
	for i := 0; i < 10; i++ {
		sm.ApplyRequest(&meta.Request{Ops: []meta.Op{{Type: meta.OpPut, Key: fmt.Sprintf("jobs/%d", i%3), Value: []byte{byte(i)}}}})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ch, err := sm.Watch(ctx, "jobs/", 4)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for i := 10; i < 40; i++ {
			sm.ApplyRequest(&meta.Request{Ops: []meta.Op{{Type: meta.OpPut, Key: fmt.Sprintf("jobs/%d", i%3)}, {Type: meta.OpPut, Key: "nodes/x"}}})
		}
	}()
	want := int64(5)
	for ev := range ch {
		if ev.Revision != want {
			t.Fatalf("event at revision %d, want %d", ev.Revision, want)
		}
		if ev.KV.Key[:5] != "jobs/" {
			t.Fatalf("event for %q outside the prefix", ev.KV.Key)
		}
		want++
		if want > 40 {
			break
		}
	}
	if want != 41 {
		t.Fatalf("watch ended at %d", want)
	}
	// History is bounded: an old revision is compacted.
	small := NewStateMachine(5)
	for i := 0; i < 10; i++ {
		small.ApplyRequest(&meta.Request{Ops: []meta.Op{{Type: meta.OpPut, Key: "jobs/x"}}})
	}
	if _, err := small.Watch(ctx, "", 1); !errors.Is(err, meta.ErrCompacted) {
		t.Fatalf("watch from compacted revision: %v", err)
	}
}

// flakyConn proposes but then reports a failure, the first time: the client must retry
// and the state machine must apply the write once.
type flakyConn struct {
	meta.Conn
	mu    sync.Mutex
	fails int
}

func (f *flakyConn) Propose(ctx context.Context, req []byte) ([]byte, error) {
	out, err := f.Conn.Propose(ctx, req)
	f.mu.Lock()
	defer f.mu.Unlock()
	if err == nil && f.fails > 0 {
		f.fails--
		return nil, context.DeadlineExceeded
	}
	return out, err
}

func TestClusterClientRetriesOnceEffect(t *testing.T) {
	c, l, ctx := startTestCluster(t, nil)
	conns := c.Conns()
	conns[l] = &flakyConn{Conn: conns[l], fails: 3}
	cl, err := meta.NewClient(meta.DefaultClientConfig(), conns)
	if err != nil {
		t.Fatal(err)
	}
	// The client starts at replica 1: a follower redirects it.
	for i := 0; i < 5; i++ {
		if _, err := cl.Put(ctx, "objects/x", []byte(fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	kv, ok, err := cl.Get(ctx, "objects/x")
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	if kv.Version != 5 || string(kv.Value) != "4" {
		t.Fatalf("after 5 puts with 3 ambiguous failures: version %d value %q", kv.Version, kv.Value)
	}
	ok, err = cl.CAS(ctx, "objects/x", 4, []byte("stale"))
	if err != nil || ok {
		t.Fatalf("CAS with stale version: ok=%v err=%v", ok, err)
	}
	obj := meta.Object{ID: "o1", Size: 128, Fingerprint: "xxh:1", Locations: []string{"n1"}, Owner: "driver", Refcount: 1}
	if err := cl.PutObject(ctx, obj); err != nil {
		t.Fatal(err)
	}
	got, err := cl.GetObject(ctx, "o1")
	if err != nil || got.Size != 128 || got.Locations[0] != "n1" {
		t.Fatalf("object %+v %v", got, err)
	}
	if _, err := cl.GetObject(ctx, "nope"); !errors.Is(err, meta.ErrNotFound) {
		t.Fatalf("missing object: %v", err)
	}
	if _, err := cl.Txn(ctx, nil, []meta.Op{{Type: meta.OpPut}}); !errors.Is(err, meta.ErrBadRequest) {
		t.Fatalf("bad txn: %v", err)
	}
	// All replicas converge on the same revision.
	deadline := time.Now().Add(5 * time.Second)
	for {
		r1, r2, r3 := c.SMs[1].Revision(), c.SMs[2].Revision(), c.SMs[3].Revision()
		if r1 == r2 && r2 == r3 && r1 == c.SMs[l].Revision() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("revisions %d %d %d", r1, r2, r3)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestEventsSince(t *testing.T) {
	sm := NewStateMachine(0)
	put := func(ops ...meta.Op) int64 {
		r := sm.ApplyRequest(&meta.Request{Ops: ops})
		return r.Revision
	}
	r1 := put(meta.Op{Type: meta.OpPut, Key: "gangs/a", Value: []byte("1")})
	put(meta.Op{Type: meta.OpPut, Key: "jobs/x", Value: []byte("1")})
	r3 := put(meta.Op{Type: meta.OpPut, Key: "gangs/b", Value: []byte("1")}, meta.Op{Type: meta.OpPut, Key: "gangs/c", Value: []byte("1")})
	ctx := context.Background()
	evs, rev, err := sm.EventsSince(ctx, "gangs/", 0, 0)
	if err != nil || len(evs) != 3 || rev != r3 {
		t.Fatalf("all: %v events, rev %d (want 3, %d), %v", len(evs), rev, r3, err)
	}
	// A bound stops at a revision boundary: the transaction's two events come together.
	evs, rev, err = sm.EventsSince(ctx, "gangs/", 0, 2)
	if err != nil || len(evs) != 3 {
		t.Fatalf("bounded: %d events, %v", len(evs), err)
	}
	evs, rev, _ = sm.EventsSince(ctx, "gangs/", 0, 1)
	if len(evs) != 1 || rev != r1 {
		t.Fatalf("bound 1: %d events covering %d, want 1 covering %d", len(evs), rev, r1)
	}
	// A quiet prefix waits, then reports the current revision so the watcher moves on.
	wctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	evs, rev, err = sm.EventsSince(wctx, "nodes/", 0, 0)
	cancel()
	if err != nil || len(evs) != 0 || rev != r3 {
		t.Fatalf("quiet prefix: %d events, rev %d, %v", len(evs), rev, err)
	}
	// A waiter wakes for a new event.
	got := make(chan []meta.Event, 1)
	go func() {
		evs, _, _ := sm.EventsSince(ctx, "nodes/", r3, 0)
		got <- evs
	}()
	put(meta.Op{Type: meta.OpPut, Key: "nodes/n1", Value: []byte("1")})
	if evs := <-got; len(evs) != 1 || evs[0].KV.Key != "nodes/n1" {
		t.Fatalf("woken with %v", evs)
	}
}

// The table list is AllTables: every Table constant is in it, names end with "/", and no
// table is a prefix of another (a key belongs to one table).
func TestTables(t *testing.T) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "../types.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	all := meta.AllTables()
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, spec := range g.Specs {
			vs := spec.(*ast.ValueSpec)
			if id, ok := vs.Type.(*ast.Ident); !ok || id.Name != "meta.Table" {
				continue
			}
			for _, v := range vs.Values {
				name, _ := strconv.Unquote(v.(*ast.BasicLit).Value)
				if !slices.Contains(all, meta.Table(name)) {
					t.Errorf("meta.Table constant %q is not in meta.AllTables", name)
				}
			}
		}
	}
	for i, a := range all {
		if !strings.HasSuffix(string(a), "/") {
			t.Errorf("table %q does not end with /", a)
		}
		for j, b := range all {
			if i != j && strings.HasPrefix(string(b), string(a)) {
				t.Errorf("table %q is a prefix of %q", a, b)
			}
		}
	}
	for _, key := range []string{"nodes/n1", "objects/o"} {
		if err := (&meta.Request{Ops: []meta.Op{{Type: meta.OpPut, Key: key}}}).Validate(); err != nil {
			t.Errorf("key %q: %v", key, err)
		}
	}
	for _, key := range []string{"n1", "nodes", "nodes/", "/nodes/x", "no-such-table/x"} {
		if err := (&meta.Request{Ops: []meta.Op{{Type: meta.OpPut, Key: key}}}).Validate(); !errors.Is(err, meta.ErrBadRequest) {
			t.Errorf("key %q: %v, want meta.ErrBadRequest", key, err)
		}
	}
}

// startTestCluster starts an in-process cluster for a test (fsync off, 2 ms ticks; mod
// adjusts the config) and waits for its leader. The cluster closes with the test; ctx ends
// 20 s after the start.
func startTestCluster(t *testing.T, mod func(*ClusterConfig)) (c *Cluster, leader uint64, ctx context.Context) {
	t.Helper()
	cfg := DefaultClusterConfig()
	cfg.NoSync = true
	cfg.TickInterval = 2 * time.Millisecond
	cfg.Logger = zaptest.NewLogger(t)
	if mod != nil {
		mod(&cfg)
	}
	c, err := StartCluster(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	if leader, err = c.WaitLeader(ctx); err != nil {
		t.Fatal(err)
	}
	return c, leader, ctx
}

// TestRangePagesWalkThePrefix: the pages of a prefix, each read after the last key of the
// one before, are its Range in order and in whole, at every page size; only the last page
// says there is no more, and a page is empty only when the prefix is.
func TestRangePagesWalkThePrefix(t *testing.T) {
	sm := NewStateMachine(0)
	for _, k := range []string{"gangs/j/b", "gangs/", "gangs0", "gang", "gangs/j/a", "gangs/k", "jobs/j", "gangs/j/c", "gangs/j/d"} {
		sm.ApplyRequest(&meta.Request{Ops: []meta.Op{{Type: meta.OpPut, Key: k, Value: []byte(k)}}})
	}
	for _, prefix := range []string{"gangs/", "gangs/j/", "gangs", "gangs/x", "", "jobs/"} {
		whole := sm.Range(prefix)
		for _, limit := range []int{1, 2, 3, 4, 100} {
			var got []meta.KeyValue
			after, pages := "", 0
			for {
				kvs, next := sm.RangePage(prefix, after, limit)
				pages++
				if len(kvs) > limit || (len(kvs) == 0 && len(whole) > 0) {
					t.Fatalf("RangePage(%q, %q, %d) = %d keys", prefix, after, limit, len(kvs))
				}
				got = append(got, kvs...)
				if next == "" {
					break
				}
				if pages > len(whole) {
					t.Fatalf("RangePage(%q, limit %d) does not end", prefix, limit)
				}
				after = next
			}
			if len(got) != len(whole) {
				t.Fatalf("pages of %q by %d: %d keys, Range has %d", prefix, limit, len(got), len(whole))
			}
			for i := range got {
				if got[i].Key != whole[i].Key {
					t.Fatalf("pages of %q by %d: key %d is %q, Range's %q", prefix, limit, i, got[i].Key, whole[i].Key)
				}
			}
			if want := max(1, (len(whole)+limit-1)/limit); pages != want {
				t.Fatalf("pages of %q (%d keys) by %d: %d pages, want %d", prefix, len(whole), limit, pages, want)
			}
		}
	}
}

// TestEventsView: the view is the history after a revision, every prefix, without a copy;
// what it holds stays as it was while the history grows and is cut, and an append to it
// never reaches the history.
func TestEventsView(t *testing.T) {
	const limit = 16
	sm := NewStateMachine(limit)
	put := func(key string) int64 {
		return sm.ApplyRequest(&meta.Request{Ops: []meta.Op{{Type: meta.OpPut, Key: key, Value: []byte(key)}}}).Revision
	}
	r1 := put("gangs/a")
	put("jobs/x")
	r3 := put("gangs/b")
	view, covered, err := sm.EventsView(r1)
	if err != nil || covered != r3 || len(view) != 2 || view[0].KV.Key != "jobs/x" || view[1].KV.Key != "gangs/b" {
		t.Fatalf("after %d: %+v covering %d, %v; want jobs/x and gangs/b covering %d", r1, view, covered, err, r3)
	}
	_ = append(view, meta.Event{KV: meta.KeyValue{Key: "written"}})
	put("gangs/c")
	later, _, _ := sm.EventsView(r3)
	if len(later) != 1 || later[0].KV.Key != "gangs/c" {
		t.Fatalf("an append to a view reached the history: %+v", later)
	}
	for i := range 4 * limit { // cut the history several times
		put("jobs/" + strconv.Itoa(i))
	}
	if view[0].KV.Key != "jobs/x" || view[1].KV.Key != "gangs/b" || string(view[1].KV.Value) != "gangs/b" {
		t.Fatalf("a view changed under its reader: %+v", view)
	}
	if _, _, err := sm.EventsView(r1); !errors.Is(err, meta.ErrCompacted) {
		t.Fatalf("a view from before the history: %v, want ErrCompacted", err)
	}
}

// TestEventsSinceWakesOnlyItsPrefix: of many watchers asleep on prefixes of their own, a
// commit wakes those a key of it falls under (and the watcher of every key), and each gets
// its event; the others sleep on.
func TestEventsSinceWakesOnlyItsPrefix(t *testing.T) {
	sm := NewStateMachine(0)
	rev := sm.ApplyRequest(&meta.Request{Ops: []meta.Op{{Type: meta.OpPut, Key: "jobs/j", Value: []byte("j")}}}).Revision
	type answer struct {
		prefix string
		events []meta.Event
		err    error
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	answers := make(chan answer, 64)
	prefixes := []string{"", "gangs/j/", "gangs/j/g7"}
	for i := range 50 {
		if i != 7 {
			prefixes = append(prefixes, fmt.Sprintf("gangs/j/g%d", i))
		}
	}
	for _, p := range prefixes {
		go func() {
			evs, _, err := sm.EventsSince(ctx, p, rev, 0)
			answers <- answer{p, evs, err}
		}()
	}
	asleep := func() int { // watchers registered
		sm.mu.Lock()
		defer sm.mu.Unlock()
		n := 0
		for _, set := range sm.sleepers {
			n += len(set)
		}
		return n
	}
	for asleep() < len(prefixes) {
		time.Sleep(time.Millisecond)
	}
	sm.ApplyRequest(&meta.Request{Ops: []meta.Op{{Type: meta.OpPut, Key: "gangs/j/g7", Value: []byte("g7")}}})
	got := map[string]bool{}
	for range 3 {
		a := <-answers
		if a.err != nil || len(a.events) != 1 || a.events[0].KV.Key != "gangs/j/g7" {
			t.Fatalf("watcher of %q: %+v, %v; want the put of gangs/j/g7", a.prefix, a.events, a.err)
		}
		got[a.prefix] = true
	}
	if !got[""] || !got["gangs/j/"] || !got["gangs/j/g7"] {
		t.Fatalf("woken: %v, want the watchers of \"\", gangs/j/ and gangs/j/g7", got)
	}
	sm.mu.Lock()
	woken := sm.woken
	sm.mu.Unlock()
	if woken != 3 || asleep() != len(prefixes)-3 {
		t.Fatalf("%d watchers woken and %d asleep; want 3 woken and the other %d asleep", woken, asleep(), len(prefixes)-3)
	}
	select {
	case a := <-answers:
		t.Fatalf("the watcher of %q answered: %+v, %v", a.prefix, a.events, a.err)
	default:
	}
	cancel()
	for range len(prefixes) - 3 {
		if a := <-answers; a.err != nil || len(a.events) != 0 {
			t.Fatalf("watcher of %q after its context ended: %+v, %v; want no event", a.prefix, a.events, a.err)
		}
	}
	if n := asleep(); n != 0 {
		t.Fatalf("%d watchers still registered after their contexts ended", n)
	}
}
