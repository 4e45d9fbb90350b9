package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/atoll-run/atoll/store/meta"
)

const testToken = "the-cluster-token"

// fakeHeads plays a cluster's heads: each answers GET /v1/status with its id and the
// leader's; a head that does not lead answers everything else 421 with its hint of the
// leader; the leader answers with answer. Every request needs the token.
type fakeHeads struct {
	t    *testing.T
	srvs []*httptest.Server

	mu     sync.Mutex
	leader uint64                     // the replica id that leads (heads are 1..n)
	hint   map[uint64]uint64          // a head's hint of the leader, when not the leader itself
	hits   map[uint64][]string        // the paths each head was asked, but /v1/status
	mute   map[uint64]bool            // heads that answer /v1/status 503 (not up yet)
	status map[uint64]int             // the /v1/status requests each head had
	from   map[uint64]map[string]bool // the client addresses (connections) they came from
	// statusSeen, when set, is told the id of each head asked its status.
	statusSeen chan uint64
	answer     func(id uint64, w http.ResponseWriter, r *http.Request)
}

func newFakeHeads(t *testing.T, n int, leader uint64) *fakeHeads {
	f := &fakeHeads{t: t, leader: leader, hint: map[uint64]uint64{}, hits: map[uint64][]string{}, mute: map[uint64]bool{}, status: map[uint64]int{}, from: map[uint64]map[string]bool{},
		answer: func(uint64, http.ResponseWriter, *http.Request) {}}
	for i := 1; i <= n; i++ {
		id := uint64(i)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { f.serve(id, w, r) }))
		t.Cleanup(srv.Close)
		f.srvs = append(f.srvs, srv)
	}
	return f
}

func (f *fakeHeads) urls() []string {
	var out []string
	for _, s := range f.srvs {
		out = append(out, s.URL)
	}
	return out
}

func (f *fakeHeads) serve(id uint64, w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Authorization") != "Bearer "+testToken {
		writeTestJSON(w, http.StatusUnauthorized, ErrorBody{Error: "unauthenticated: missing or wrong bearer token", Kind: "unauthenticated"})
		return
	}
	f.mu.Lock()
	leader, answer := f.leader, f.answer
	hint, ok := f.hint[id]
	if !ok {
		hint = leader
	}
	if r.URL.Path != "/v1/status" {
		f.hits[id] = append(f.hits[id], r.URL.Path)
	} else {
		f.status[id]++
		if f.from[id] == nil {
			f.from[id] = map[string]bool{}
		}
		f.from[id][r.RemoteAddr] = true
	}
	mute, seen := f.mute[id], f.statusSeen
	f.mu.Unlock()
	if seen != nil && r.URL.Path == "/v1/status" {
		seen <- id
	}
	switch {
	case r.URL.Path == "/v1/status" && mute:
		writeTestJSON(w, http.StatusServiceUnavailable, ErrorBody{Error: "starting", Kind: "unavailable"})
	case r.URL.Path == "/v1/status":
		writeTestJSON(w, http.StatusOK, map[string]uint64{"id": id, "leader": leader})
	case id != leader:
		writeTestJSON(w, http.StatusMisdirectedRequest, ErrorBody{Error: "not the leader", Leader: hint})
	default:
		answer(id, w, r)
	}
}

func (f *fakeHeads) set(fn func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn()
}

// asked returns how many requests (but status) each head had.
func (f *fakeHeads) asked() map[uint64]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[uint64]int{}
	for id, h := range f.hits {
		out[id] = len(h)
	}
	return out
}

func writeTestJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func newTestClient(t *testing.T, heads []string) *Client {
	t.Helper()
	c, err := NewClient(ctxT(t, 10*time.Second), ClientConfig{Heads: heads, Token: testToken, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestNewClientRefuses(t *testing.T) {
	cases := []struct {
		name  string
		heads []string
		says  string
	}{
		{name: "no heads", says: "no head addresses"},
		{name: "not http", heads: []string{"ftp://h:1"}, says: `head address 1 "ftp://h:1"`},
		{name: "no host", heads: []string{"http://h:1", "http://"}, says: "head address 2"},
		{name: "not a URL", heads: []string{"http://h:1/%zz"}, says: "head address 1"},
		{name: "a bare host:port", heads: []string{"h:1"}, says: "want http(s)://host:port"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := NewClient(context.Background(), ClientConfig{Heads: c.heads, Token: testToken})
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.says) {
				t.Errorf("error %v, want ErrInvalid saying %q", err, c.says)
			}
		})
	}
}

func TestNewClientWithoutHeads(t *testing.T) {
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close()
	_, err := NewClient(ctxT(t, 200*time.Millisecond), ClientConfig{Heads: []string{down.URL}, Token: testToken})
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "no head answered") {
		t.Fatalf("error %v, want ErrUnavailable", err)
	}
}

// TestNewClientWrongToken: a head that refuses the token (401) ends NewClient at once, long
// before its context, with ErrUnauthenticated saying so, also when another head is down.
func TestNewClientWrongToken(t *testing.T) {
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close()
	f := newFakeHeads(t, 2, 1)
	cases := []struct {
		name  string
		heads []string
	}{
		{name: "one head", heads: f.urls()[:1]},
		{name: "two heads", heads: f.urls()},
		{name: "one head down, one refusing", heads: []string{down.URL, f.urls()[1]}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := ctxT(t, 3*time.Second)
			_, err := NewClient(ctx, ClientConfig{Heads: c.heads, Token: "wrong"})
			if !errors.Is(err, ErrUnauthenticated) || errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "refused the cluster token") {
				t.Fatalf("error %v, want ErrUnauthenticated naming the token", err)
			}
			if ctx.Err() != nil {
				t.Fatalf("NewClient returned only once its context ended: %v", ctx.Err())
			}
		})
	}
}

func TestNewClientFindsTheLeader(t *testing.T) {
	f := newFakeHeads(t, 3, 2)
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close()
	heads := append(f.urls(), down.URL+"/") // a head that does not answer is tolerated
	given := append([]string(nil), heads...)
	c := newTestClient(t, heads)
	if !reflect.DeepEqual(heads, given) {
		t.Errorf("the caller's heads were changed: %v", heads)
	}
	if got := c.Heads(); len(got) != 4 || got[3] != down.URL {
		t.Errorf("heads %v: want the trailing slash trimmed", got)
	}
	var st Status
	if err := c.Do(ctxT(t, 5*time.Second), http.MethodGet, "/v1/cluster", nil, &st); err != nil {
		t.Fatal(err)
	}
	if got := f.asked(); !reflect.DeepEqual(got, map[uint64]int{2: 1}) {
		t.Errorf("requests per head %v: want one, to the leader (2)", got)
	}
}

// TestFollowsTheLeader moves the leadership after the client learnt it, in different ways.
func TestFollowsTheLeader(t *testing.T) {
	cases := []struct {
		name   string
		change func(f *fakeHeads)
		asked  map[uint64]int // requests per head for the first call
	}{
		{name: "a 421 with the new leader's id: straight there", change: func(f *fakeHeads) { f.leader = 3 },
			asked: map[uint64]int{1: 1, 3: 1}},
		{name: "a 421 without a hint (an election): the next head, which knows",
			change: func(f *fakeHeads) { f.leader, f.hint[1] = 3, 0 }, asked: map[uint64]int{1: 1, 2: 1, 3: 1}},
		{name: "a hint of an unknown head: the next head", change: func(f *fakeHeads) { f.leader, f.hint[1] = 2, 9 },
			asked: map[uint64]int{1: 1, 2: 1}},
		{name: "the old leader does not answer: the next head", change: func(f *fakeHeads) { f.leader = 2; f.srvs[0].Close() },
			asked: map[uint64]int{2: 1}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFakeHeads(t, 3, 1)
			cl := newTestClient(t, f.urls())
			f.set(func() { c.change(f) })
			ctx := ctxT(t, 5*time.Second)
			if err := cl.Do(ctx, http.MethodPost, "/v1/jobs", Job{Name: "j"}, nil); err != nil {
				t.Fatal(err)
			}
			if got := f.asked(); !reflect.DeepEqual(got, c.asked) {
				t.Errorf("requests per head %v, want %v", got, c.asked)
			}
			// The client now goes to the leader at once.
			before := f.asked()
			if err := cl.Do(ctx, http.MethodPost, "/v1/jobs", Job{Name: "j"}, nil); err != nil {
				t.Fatal(err)
			}
			after := f.asked()
			for id := range after {
				if d := after[id] - before[id]; d != 0 && id != f.leader || id == f.leader && d != 1 {
					t.Errorf("second call: head %d asked %d times", id, d)
				}
			}
		})
	}
}

// TestRetriesWhileUnavailable: a leader that answers 503 (no quorum yet) is asked again
// with backoff, and after every fourth refusal another head is tried.
func TestRetriesWhileUnavailable(t *testing.T) {
	f := newFakeHeads(t, 2, 1)
	c := newTestClient(t, f.urls())
	refusals := 3
	f.set(func() {
		f.answer = func(_ uint64, w http.ResponseWriter, _ *http.Request) {
			if refusals > 0 {
				refusals--
				writeTestJSON(w, http.StatusServiceUnavailable, ErrorBody{Error: "no quorum", Kind: "unavailable"})
				return
			}
			writeTestJSON(w, http.StatusOK, Job{Name: "done"})
		}
	})
	var j Job
	if err := c.Do(ctxT(t, 5*time.Second), http.MethodPost, "/v1/jobs", Job{Name: "j"}, &j); err != nil || j.Name != "done" {
		t.Fatalf("%+v %v", j, err)
	}
	if got := f.asked(); got[1] != 4 {
		t.Errorf("requests %v: want 3 refusals and the answer from head 1", got)
	}
	// A head that still believes it leads but has lost its quorum answers 503 while head 2
	// leads: after four refusals the client tries head 2.
	var refused int
	unavailable := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/status" {
			writeTestJSON(w, http.StatusOK, map[string]uint64{"id": 1, "leader": 1})
			return
		}
		f.set(func() { refused++ })
		writeTestJSON(w, http.StatusServiceUnavailable, ErrorBody{Error: "no quorum", Kind: "unavailable"})
	}))
	defer unavailable.Close()
	f.set(func() {
		f.hits = map[uint64][]string{}
		f.answer = func(id uint64, w http.ResponseWriter, _ *http.Request) {
			writeTestJSON(w, http.StatusOK, Job{Name: fmt.Sprint(id)})
		}
	})
	c2 := newTestClient(t, []string{unavailable.URL, f.srvs[1].URL}) // head 2 says 1 leads
	f.set(func() { f.leader = 2 })
	if err := c2.Do(ctxT(t, 5*time.Second), http.MethodGet, "/v1/cluster", nil, &j); err != nil || j.Name != "2" {
		t.Fatalf("%+v %v", j, err)
	}
	f.set(func() {
		if refused != 4 || len(f.hits[2]) != 1 {
			t.Errorf("refused %d times, then %d requests to head 2: want 4, 1", refused, len(f.hits[2]))
		}
	})
	// Always unavailable: the call ends with its context, as ErrUnavailable.
	c3 := newTestClient(t, []string{unavailable.URL})
	err := c3.Do(ctxT(t, time.Second), http.MethodGet, "/v1/cluster", nil, nil) // long enough for a refusal on a loaded machine
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "context deadline exceeded") || !strings.Contains(err.Error(), "no quorum") {
		t.Fatalf("error %v, want ErrUnavailable with the deadline and the last refusal", err)
	}
}

// TestErrorAnswers maps the heads' error answers to the API's errors; none is retried.
func TestErrorAnswers(t *testing.T) {
	cases := []struct {
		name     string
		code     int
		body     string
		sentinel error
		text     string
	}{
		{name: "invalid", code: 400, body: `{"error":"job name \"\" is bad","kind":"invalid"}`, sentinel: ErrInvalid, text: `job name "" is bad`},
		{name: "never fits", code: 422, body: `{"error":"16 GPUs in one island","kind":"never_fits"}`, sentinel: ErrNeverFits, text: "16 GPUs in one island"},
		{name: "no capacity", code: 409, body: `{"error":"busy","kind":"no_capacity"}`, sentinel: ErrNoCapacity, text: "busy"},
		{name: "not found", code: 404, body: `{"error":"no job x","kind":"not_found"}`, sentinel: ErrNotFound, text: "no job x"},
		{name: "exists", code: 409, body: `{"error":"job j exists","kind":"exists"}`, sentinel: ErrExists, text: "job j exists"},
		{name: "stale", code: 410, body: `{"error":"generation 1 ended","kind":"stale"}`, sentinel: ErrStale, text: "generation 1 ended"},
		{name: "saturated", code: 429, body: `{"error":"queue full","kind":"saturated","retry_after_ms":1500}`, sentinel: ErrSaturated, text: "queue full"},
		{name: "the kind decides, not the status", code: 400, body: `{"error":"gone","kind":"not_found"}`, sentinel: ErrNotFound, text: "gone"},
		{name: "an unknown kind", code: 500, body: `{"error":"boom","kind":"mystery"}`, text: "api: head answered 500: boom"},
		{name: "no body", code: 500, text: "api: head answered 500: Internal Server Error"},
		{name: "a body that is not JSON", code: 502, body: "bad gateway\n", text: "api: head answered 502: bad gateway"},
		{name: "the token refused", code: 401, body: `{"error":"unauthenticated: missing or wrong bearer token"}`, sentinel: ErrUnauthenticated,
			text: "refused the cluster token"},
		{name: "a client certificate refused", code: 401, body: `{"error":"unauthenticated: a client certificate of the cluster CA is required"}`,
			sentinel: ErrUnauthenticated, text: "a client certificate of the cluster CA is required"},
	}
	all := []error{ErrInvalid, ErrNeverFits, ErrNoCapacity, ErrSaturated, ErrNotFound, ErrExists, ErrStale, ErrUnavailable, ErrUnauthenticated}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFakeHeads(t, 1, 1)
			f.set(func() {
				f.answer = func(_ uint64, w http.ResponseWriter, _ *http.Request) {
					w.WriteHeader(c.code)
					_, _ = w.Write([]byte(c.body))
				}
			})
			cl := newTestClient(t, f.urls())
			_, err := cl.SpawnGang(ctxT(t, 5*time.Second), GangSpec{Job: "j", Name: "g"})
			if err == nil || !strings.Contains(err.Error(), c.text) {
				t.Fatalf("error %v, want one saying %q", err, c.text)
			}
			for _, s := range all {
				if errors.Is(err, s) != (s == c.sentinel) {
					t.Errorf("errors.Is(%v, %v) = %v", err, s, errors.Is(err, s))
				}
			}
			if got := f.asked()[1]; got != 1 {
				t.Errorf("asked %d times: an answered error is not retried", got)
			}
			if c.sentinel == ErrSaturated {
				if d, ok := RetryAfter(err); !ok || d != 1500*time.Millisecond {
					t.Errorf("retry after %v %v, want 1.5s", d, ok)
				}
			}
		})
	}
}

// TestErrorBodyRoundTrip: what a head answers for an error is what the client maps back.
func TestErrorBodyRoundTrip(t *testing.T) {
	for _, s := range []error{ErrInvalid, ErrNeverFits, ErrNoCapacity, ErrNotFound, ErrExists, ErrStale, ErrUnavailable, ErrUnauthenticated} {
		err := fmt.Errorf("controller: %w: details", s)
		code, body := Body(err)
		back := errorFromBody(body, code)
		if !errors.Is(back, s) || back.Error() != err.Error() || code/100 != 4 && code != 503 {
			t.Errorf("%v: answered %d %+v, read back as %v", s, code, body, back)
		}
	}
	code, body := Body(&SaturatedError{Msg: "full", RetryAfter: 2 * time.Second})
	if d, ok := RetryAfter(errorFromBody(body, code)); code != 429 || !ok || d != 2*time.Second {
		t.Errorf("saturated: %d %+v, retry after %v %v", code, body, d, ok)
	}
	if code, body := Body(errors.New("disk on fire")); code != 500 || body.Kind != "" {
		t.Errorf("an unknown error: %d %+v", code, body)
	}
}

func TestParseAddress(t *testing.T) {
	cases := []struct {
		in   string
		want []string
		bad  string
	}{
		{in: "http://h1:7001", want: []string{"http://h1:7001"}},
		{in: "h1:7001, h2:7002 ,", want: []string{"http://h1:7001", "http://h2:7002"}},
		{in: "https://h1:7001/,https://[::1]:7002", want: []string{"https://h1:7001", "https://[::1]:7002"}},
		{in: "", bad: "empty address"},
		{in: " , ", bad: "empty address"},
		{in: "http://h1", bad: `address entry 1 "http://h1" has no port`},
		{in: "h1:7001,h2", bad: "address entry 2"},
		{in: "http://:7001/%zz", bad: "address entry 1"},
		{in: "http://h1:port", bad: "address entry 1"},
	}
	for _, c := range cases {
		t.Run(c.in, func(t *testing.T) {
			got, err := ParseAddress(c.in)
			if c.bad != "" {
				if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.bad) {
					t.Errorf("ParseAddress(%q) = %v, %v; want ErrInvalid saying %q", c.in, got, err, c.bad)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, c.want) {
				t.Fatalf("ParseAddress(%q) = %v, %v; want %v", c.in, got, err, c.want)
			}
			again, err := ParseAddress(FormatAddress(got))
			if err != nil || !reflect.DeepEqual(again, got) {
				t.Errorf("round trip: %v, %v", again, err)
			}
		})
	}
}

// TestWatch plays a head through a watch's life: the listing, events, an empty wait, a
// compaction (listed again), a failed wait and a head that does not answer (each resumed
// from its revision: no listing), and fn's error ending it.
func TestWatch(t *testing.T) {
	kv := func(k string) meta.KeyValue { return meta.KeyValue{Key: TableGangs + k, Value: []byte(`{}`)} }
	type answer struct {
		path string // "/v1/list" or "/v1/watch"
		rev  string // the rev asked, for a watch
		code int
		body any
	}
	script := []answer{
		{path: "/v1/list", code: 200, body: Listing{Revision: 5, KVs: []meta.KeyValue{kv("j/a")}}},
		{path: "/v1/watch", rev: "5", code: 200, body: WatchAnswer{Revision: 7, Events: []meta.Event{{Type: meta.EventPut, Revision: 7, KV: kv("j/b")}}}},
		{path: "/v1/watch", rev: "7", code: 200, body: WatchAnswer{Revision: 9}},
		{path: "/v1/watch", rev: "9", code: 200, body: WatchAnswer{Revision: 9, Compacted: true}},
		{path: "/v1/list", code: 200, body: Listing{Revision: 12, KVs: []meta.KeyValue{kv("j/a"), kv("j/b")}}},
		{path: "/v1/watch", rev: "12", code: 500, body: ErrorBody{Error: "head restarting"}},
		{path: "/v1/watch", rev: "12", code: 503, body: ErrorBody{Error: "no leader", Kind: "unavailable"}},
		{path: "/v1/watch", rev: "12", code: -1}, // the connection drops: no answer
		{path: "/v1/watch", rev: "12", code: 200, body: WatchAnswer{Revision: 14, Events: []meta.Event{{Type: meta.EventDelete, Revision: 14, KV: kv("j/a")}}}},
	}
	f := newFakeHeads(t, 1, 1)
	var mu sync.Mutex
	step := 0
	f.set(func() {
		f.answer = func(_ uint64, w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			defer mu.Unlock()
			if step >= len(script) {
				t.Errorf("request %s past the script", r.URL)
				writeTestJSON(w, 500, ErrorBody{Error: "past the script"})
				return
			}
			a := script[step]
			step++
			q := r.URL.Query()
			if r.URL.Path != a.path || q.Get("prefix") != TableGangs || a.rev != "" && (q.Get("rev") != a.rev || q.Get("wait_ms") != "10000") {
				t.Errorf("step %d: %s, want %s rev %s", step, r.URL, a.path, a.rev)
			}
			if a.code < 0 {
				hj, ok := w.(http.Hijacker)
				if !ok {
					t.Errorf("step %d: cannot drop the connection", step)
					return
				}
				conn, _, _ := hj.Hijack()
				conn.Close()
				return
			}
			writeTestJSON(w, a.code, a.body)
		}
	})
	c := newTestClient(t, f.urls())
	type call struct {
		reset bool
		rev   int64
		n     int // keys listed or events
	}
	var calls []call
	stop := errors.New("enough")
	err := c.Watch(ctxT(t, 10*time.Second), TableGangs, func(reset bool, l Listing, evs []meta.Event) error {
		n := len(evs)
		if reset {
			n = len(l.KVs)
		}
		calls = append(calls, call{reset, l.Revision, n})
		if len(calls) == 4 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) {
		t.Fatalf("Watch returned %v, want fn's error", err)
	}
	want := []call{{true, 5, 1}, {false, 7, 1}, {true, 12, 2}, {false, 14, 1}}
	if !reflect.DeepEqual(calls, want) {
		t.Errorf("fn saw %+v, want %+v", calls, want)
	}
	if step != len(script) {
		t.Errorf("%d of %d answers asked for", step, len(script))
	}
	// A watch whose listing fails ends with the error; one whose context ends, with that.
	f.set(func() {
		f.answer = func(_ uint64, w http.ResponseWriter, r *http.Request) {
			writeTestJSON(w, http.StatusBadRequest, ErrorBody{Error: "bad prefix", Kind: "invalid"})
		}
	})
	if err := c.Watch(ctxT(t, 5*time.Second), "nope/", func(bool, Listing, []meta.Event) error { return nil }); !errors.Is(err, ErrInvalid) {
		t.Errorf("a refused listing: %v", err)
	}
}

// TestWatchEndsWithItsContext: the client gives up a wait when its context ends.
func TestWatchEndsWithItsContext(t *testing.T) {
	f := newFakeHeads(t, 1, 1)
	waiting := make(chan struct{})
	f.set(func() {
		f.answer = func(_ uint64, w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/v1/list" {
				writeTestJSON(w, 200, Listing{Revision: 1})
				return
			}
			close(waiting)
			<-r.Context().Done() // a head with nothing to say holds the wait
		}
	})
	c := newTestClient(t, f.urls())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Watch(ctx, TableGangs, func(bool, Listing, []meta.Event) error { return nil }) }()
	<-waiting
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Watch returned %v, want context.Canceled", err)
	}
}

// TestReads goes through the metadata reads (GET /v1/get and /v1/range at the leader).
func TestReads(t *testing.T) {
	f := newFakeHeads(t, 2, 2)
	gang, _ := json.Marshal(Gang{Spec: GangSpec{Job: "j", Name: "g"}, Generation: 3})
	w0, _ := json.Marshal(Worker{Job: "j", Gang: "g", Rank: 0, Generation: 3})
	w1, _ := json.Marshal(Worker{Job: "j", Gang: "g", Rank: 1, Generation: 2})
	f.set(func() {
		f.answer = func(_ uint64, w http.ResponseWriter, r *http.Request) {
			q := r.URL.Query()
			switch {
			case r.URL.Path == "/v1/get" && q.Get("key") == TableGangs+"j/g":
				writeTestJSON(w, 200, meta.KeyValue{Key: q.Get("key"), Value: gang, ModRevision: 41})
			case r.URL.Path == "/v1/get" && q.Get("key") == TableJobs+"bad":
				writeTestJSON(w, 200, meta.KeyValue{Key: q.Get("key"), Value: []byte("{")})
			case r.URL.Path == "/v1/get":
				writeTestJSON(w, 404, meta.KeyValue{})
			case r.URL.Path == "/v1/range" && q.Get("prefix") == TableWorkers+"j/g/":
				writeTestJSON(w, 200, []meta.KeyValue{{Key: "w0", Value: w0}, {Key: "w1", Value: w1}})
			default:
				writeTestJSON(w, 200, []meta.KeyValue{})
			}
		}
	})
	c := newTestClient(t, f.urls())
	ctx := ctxT(t, 5*time.Second)
	g, rev, err := c.Gang(ctx, "j", "g")
	if err != nil || g.Generation != 3 || rev != 41 {
		t.Errorf("gang %+v at %d, %v", g, rev, err)
	}
	if _, _, err := c.Gang(ctx, "j", "none"); !errors.Is(err, ErrNotFound) {
		t.Errorf("a missing gang: %v", err)
	}
	var j Job
	if found, err := c.Get(ctx, TableJobs+"none", &j); found || err != nil {
		t.Errorf("a missing key: %v %v", found, err)
	}
	if found, err := c.Get(ctx, TableJobs+"bad", &j); !found || err == nil || !strings.Contains(err.Error(), "decode "+TableJobs+"bad") {
		t.Errorf("an undecodable record: %v %v", found, err)
	}
	ws, err := c.Workers(ctx, "j", "g")
	if err != nil || len(ws) != 2 || ws[0].Generation != 3 || ws[1].Generation != 2 {
		t.Errorf("workers %+v, %v", ws, err)
	}
	if ws, err := c.Workers(ctx, "j", "none"); err != nil || len(ws) != 0 {
		t.Errorf("no workers: %+v, %v", ws, err)
	}
}

func TestSecure(t *testing.T) {
	cases := []struct {
		heads  []string
		secure bool
		bad    bool
	}{
		{heads: nil},
		{heads: []string{"http://a:1", "http://b:1"}},
		{heads: []string{"https://a:1", "https://b:1"}, secure: true},
		{heads: []string{"https://a:1", "http://b:1"}, bad: true},
	}
	for _, c := range cases {
		got, err := Secure(c.heads)
		if got != c.secure || (err != nil) != c.bad || c.bad && !errors.Is(err, ErrInvalid) {
			t.Errorf("Secure(%v) = %v, %v", c.heads, got, err)
		}
	}
}

func TestDecodeEvents(t *testing.T) {
	ev := func(seq int64) meta.KeyValue {
		b, _ := json.Marshal(Event{Seq: seq, Kind: EventGangRunning})
		return meta.KeyValue{Key: TableEvents + EventKey(seq), Value: b}
	}
	cases := []struct {
		name  string
		kvs   []meta.KeyValue
		after int64
		want  []int64
		bad   bool
	}{
		{name: "all", kvs: []meta.KeyValue{ev(1), ev(2)}, want: []int64{1, 2}},
		{name: "after a sequence number", kvs: []meta.KeyValue{ev(1), ev(2), ev(3)}, after: 2, want: []int64{3}},
		{name: "deleted entries are skipped", kvs: []meta.KeyValue{ev(1), {Key: "x"}, ev(2)}, want: []int64{1, 2}},
		{name: "a bad entry stops there", kvs: []meta.KeyValue{ev(1), {Key: "x", Value: []byte("{")}, ev(2)}, want: []int64{1}, bad: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			evs, err := DecodeEvents(c.kvs, c.after)
			var got []int64
			for _, e := range evs {
				got = append(got, e.Seq)
			}
			if !reflect.DeepEqual(got, c.want) || (err != nil) != c.bad {
				t.Errorf("events %v, %v; want %v", got, err, c.want)
			}
		})
	}
}

// TestMetaFindsALeaderItDidNotLearn: a client made while the leader did not answer its
// status knows only the followers' replica ids; its metadata writes, which the followers
// send to the leader by id, must still reach it (CI: a worker's registration went from
// one follower to the other for a minute, "not the leader (replica 1 leads)").
func TestMetaFindsALeaderItDidNotLearn(t *testing.T) {
	f := newFakeHeads(t, 3, 1)
	f.set(func() {
		f.mute[1] = true
		f.answer = func(_ uint64, w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/v1/txn" {
				writeTestJSON(w, http.StatusOK, meta.Response{Succeeded: true, Revision: 7})
			}
		}
	})
	c := newTestClient(t, f.urls())
	if _, ok := c.urlOf(1); ok {
		t.Fatal("the client learned the muted leader's id: the case did not happen")
	}
	f.set(func() { f.mute[1] = false })
	rev, err := c.Meta().Put(ctxT(t, 5*time.Second), TableConfig+"k", []byte("v"))
	if err != nil || rev != 7 {
		t.Fatalf("a put through the followers: revision %d, %v; want 7 from the leader", rev, err)
	}
	if n := f.asked()[1]; n != 1 {
		t.Fatalf("the leader was asked %d times, want 1", n)
	}
}

// A load report is periodic: a head that answers "unavailable" (no leader elected yet) is
// not asked again, the next report takes its place. Retried like any request, every
// agent's reports multiplied the requests the heads left after a leader's death served
// while they elected a new one.
func TestReportLoadIsNotRetriedWhileUnavailable(t *testing.T) {
	f := newFakeHeads(t, 2, 1)
	c := newTestClient(t, f.urls())
	f.set(func() {
		f.answer = func(_ uint64, w http.ResponseWriter, _ *http.Request) {
			writeTestJSON(w, http.StatusServiceUnavailable, ErrorBody{Error: "no leader", Kind: "unavailable"})
		}
	})
	_, err := c.ReportLoad(ctxT(t, 5*time.Second), LoadReport{Machine: "m"})
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("report: %v, want ErrUnavailable", err)
	}
	if got := f.asked(); got[1]+got[2] != 1 {
		t.Fatalf("requests %v: want one, not retried", got)
	}
	// Any other request retries while the heads are unavailable.
	f.set(func() { f.hits = map[uint64][]string{} })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second) // several attempts, on a loaded machine too
	defer cancel()
	if err := c.Do(ctx, http.MethodPost, "/v1/jobs", Job{Name: "j"}, nil); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("do: %v, want ErrUnavailable", err)
	}
	if got := f.asked(); got[1]+got[2] < 2 {
		t.Fatalf("requests %v: want retries", got)
	}
}

// TestKeepWarm: a client that keeps warm asks every head but the one it believes leads for
// its status, again and again, over connections it keeps (one per follower).
func TestKeepWarm(t *testing.T) {
	f := newFakeHeads(t, 3, 1)
	c := newTestClient(t, f.urls())
	seen := make(chan uint64, 64)
	f.set(func() { f.statusSeen = seen })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.KeepWarm(ctx, 10*time.Millisecond) }()
	asked := map[uint64]int{}
	for asked[2] < 3 || asked[3] < 3 {
		select {
		case id := <-seen:
			asked[id]++
		case <-time.After(10 * time.Second):
			t.Fatalf("status asked of the heads: %v; want 3 rounds of each follower", asked)
		}
	}
	cancel()
	f.set(func() { f.statusSeen = nil })
	for len(seen) > 0 {
		asked[<-seen]++
	}
	<-done
	if asked[1] != 0 {
		t.Fatalf("the leader was asked its status %d times by the warm-keeping; want 0", asked[1])
	}
	f.set(func() {
		if len(f.from[2]) != 1 || len(f.from[3]) != 1 {
			t.Fatalf("connections the followers were asked over: %v; want one each, kept", f.from)
		}
	})
}

// holdingHead is a head of one replica that tells seen of every request; /v1/hold
// answers once release is closed, /v1/stuck only by its context's end (each says on
// arrived that it arrived), and the rest at once.
func holdingHead(arrived chan<- struct{}, release <-chan struct{}, seen func(*http.Request)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		seen(r)
		switch r.URL.Path {
		case "/v1/status":
			writeTestJSON(w, http.StatusOK, map[string]uint64{"id": 1, "leader": 1})
		case "/v1/hold":
			arrived <- struct{}{}
			<-release
			writeTestJSON(w, http.StatusOK, map[string]string{})
		case "/v1/stuck":
			arrived <- struct{}{}
			<-r.Context().Done()
		default:
			writeTestJSON(w, http.StatusOK, map[string]string{})
		}
	}
}

// sendHeld sends n requests to /v1/hold at once; their errors come on the channel.
func sendHeld(ctx context.Context, c *Client, n int) <-chan error {
	done := make(chan error, n)
	for range n {
		go func() { done <- c.Do(ctx, http.MethodGet, "/v1/hold", nil, nil) }()
	}
	return done
}

// TestRequestsShareOneConnection: a client speaks HTTP/2 to a head that offers it (heads
// with --http2: head.apiTLS), so its requests in flight at once share one connection, and a
// request given up resets its stream without closing the connection the next one uses.
func TestRequestsShareOneConnection(t *testing.T) {
	const n = 8
	arrived, release := make(chan struct{}, 2*n), make(chan struct{})
	var mu sync.Mutex
	from, protos := map[string]bool{}, map[string]bool{}
	srv := httptest.NewUnstartedServer(holdingHead(arrived, release, func(r *http.Request) {
		mu.Lock()
		from[r.RemoteAddr], protos[r.Proto] = true, true
		mu.Unlock()
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	tlsc := srv.Client().Transport.(*http.Transport).TLSClientConfig.Clone()
	c, err := NewClient(ctxT(t, 10*time.Second), ClientConfig{Heads: []string{srv.URL}, Token: testToken, TLS: tlsc, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 20*time.Second)
	done := sendHeld(ctx, c, n)
	for range n { // every request is in flight at once
		select {
		case <-arrived:
		case <-ctx.Done():
			t.Fatal("the requests did not all arrive")
		}
	}
	close(release)
	for range n {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	// A request given up resets its stream only.
	short, cancel := context.WithCancel(ctx)
	go func() { <-arrived; cancel() }()
	if err := c.Do(short, http.MethodGet, "/v1/stuck", nil, nil); err == nil {
		t.Fatal("a request given up succeeded")
	}
	if err := c.Do(ctx, http.MethodGet, "/v1/after", nil, nil); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(protos) != 1 || !protos["HTTP/2.0"] {
		t.Fatalf("protocols: %v, want HTTP/2.0 only", protos)
	}
	if len(from) != 1 {
		t.Fatalf("connections: %v, want one shared by %d requests at once, one given up, and one after", from, n)
	}
}

// TestConnsPerHeadBounded: over HTTP/1.1 a client bounded to two connections per head has
// at most two requests at the head at once; a third waits for a connection (here past its
// time, while the two are held), and once they are answered every request completes on
// the same two connections.
func TestConnsPerHeadBounded(t *testing.T) {
	const n, bound = 6, 2
	arrived, release := make(chan struct{}, n), make(chan struct{})
	var mu sync.Mutex
	from := map[string]bool{}
	srv := httptest.NewUnstartedServer(holdingHead(arrived, release, func(r *http.Request) {
		mu.Lock()
		from[r.RemoteAddr] = true
		mu.Unlock()
	}))
	srv.StartTLS() // HTTP/1.1 only
	t.Cleanup(srv.Close)
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	t.Cleanup(free) // before the server's close, which waits for its handlers
	tlsc := srv.Client().Transport.(*http.Transport).TLSClientConfig.Clone()
	if _, err := NewClient(ctxT(t, 5*time.Second), ClientConfig{Heads: []string{srv.URL}, Token: testToken, TLS: tlsc, MaxConnsPerHead: -1}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a negative bound: %v, want ErrInvalid", err)
	}
	c, err := NewClient(ctxT(t, 10*time.Second), ClientConfig{Heads: []string{srv.URL}, Token: testToken, TLS: tlsc, MaxConnsPerHead: bound, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 20*time.Second)
	done := sendHeld(ctx, c, n)
	for range bound {
		select {
		case <-arrived:
		case <-ctx.Done():
			t.Fatal("the first requests did not arrive")
		}
	}
	// Both connections are held: a request that would be answered at once waits for one.
	short, cancel := context.WithTimeout(ctx, time.Second)
	err = c.Do(short, http.MethodGet, "/v1/quick", nil, nil)
	cancel()
	if err == nil {
		t.Fatalf("a request was answered while %d requests held the client's %d connections", bound, bound)
	}
	free()
	for range n {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Do(ctx, http.MethodGet, "/v1/after", nil, nil); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(from) > bound {
		t.Fatalf("connections: %v, want at most %d", from, bound)
	}
}

// TestAnswerCutShortIsTriedAgain: an answer whose body does not come within the attempt's
// time (its headers did) is no answer: the request is tried again, not failed.
func TestAnswerCutShortIsTriedAgain(t *testing.T) {
	f := newFakeHeads(t, 1, 1)
	var tries atomic.Int32
	f.set(func() {
		f.answer = func(_ uint64, w http.ResponseWriter, r *http.Request) {
			if tries.Add(1) == 1 {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusOK)
				w.(http.Flusher).Flush() // the headers go; the body waits past the attempt
				<-r.Context().Done()
				return
			}
			writeTestJSON(w, http.StatusOK, map[string]string{"ok": "yes"})
		}
	})
	c, err := NewClient(ctxT(t, 10*time.Second), ClientConfig{Heads: f.urls(), Token: testToken, AttemptTimeout: 200 * time.Millisecond, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]string
	if err := c.Do(ctxT(t, 10*time.Second), http.MethodPost, "/v1/gangs", map[string]string{}, &out); err != nil {
		t.Fatalf("a request whose first answer was cut short: %v; want it tried again", err)
	}
	if out["ok"] != "yes" || tries.Load() != 2 {
		t.Fatalf("answer %v after %d tries; want the second's", out, tries.Load())
	}
}
