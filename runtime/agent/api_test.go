package agent

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/runtime/authz"
	"github.com/atoll-run/atoll/runtime/objects"
	"github.com/atoll-run/atoll/store/object"
	"github.com/atoll-run/atoll/store/transfer"
	"github.com/atoll-run/atoll/topology"
)

const testToken = "cluster-token-of-the-tests"

// newTestAgent is an agent without heads: its object store (on a directory of its own, so
// objects stay on this machine), API handler and metrics, as Start would set them up.
func newTestAgent(t *testing.T, capacity int64) *Agent {
	t.Helper()
	tc, err := topology.Load("dgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	log := zaptest.NewLogger(t)
	obs := newAgentObs(nil)
	nc := transfer.DefaultNodeConfig()
	nc.Name, nc.Dir, nc.Token, nc.Logger, nc.Registerer = "m1", t.TempDir(), []byte(testToken), log, obs.reg
	nc.Store.Capacity, nc.Store.ShmDir, nc.LeaseReapInterval = capacity, t.TempDir(), -1
	node, err := transfer.StartNode(nc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = node.Shutdown(ctx)
	})
	a := &Agent{cfg: Config{Name: "m1", Token: []byte(testToken), Dir: t.TempDir(), Spec: tc.Machines[0].Spec}, keys: derivedKeys([]byte(testToken)), log: log, node: node,
		local: objects.NewLocal(node), obs: obs, gangs: map[string]api.Gang{}, workers: map[string]*worker{}, exited: map[string]bool{},
		changed: make(chan struct{}), binaries: map[string]*sync.Once{}, binErr: map[string]error{}}
	a.registerMetrics()
	return a
}

// call sends one request to the handler and returns its status and body.
func call(t *testing.T, h http.Handler, method, target, token string, body []byte) (int, []byte, http.Header) {
	t.Helper()
	req := httptest.NewRequest(method, target, bytes.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code, rec.Body.Bytes(), rec.Header()
}

func errorBody(t *testing.T, b []byte) api.ErrorBody {
	t.Helper()
	var eb api.ErrorBody
	if err := json.Unmarshal(b, &eb); err != nil {
		t.Fatalf("error body %q: %v", b, err)
	}
	return eb
}

func TestAPIErrors(t *testing.T) {
	a := newTestAgent(t, 1<<20)
	h := a.apiHandler()
	unknown := object.NewID().String()
	ref := func(id, holder string) []byte { b, _ := json.Marshal(api.ObjectRef{ID: id, Holder: holder}); return b }
	cases := []struct {
		name         string
		method, path string
		token        string
		body         []byte
		code         int
		kind         string // the error body's kind ("" for answers that are not JSON errors)
		says         string // in the error's text
	}{
		{name: "no token", method: "POST", path: "/v1/objects/put?holder=w", code: 401, kind: "unauthenticated"},
		{name: "a wrong token", method: "POST", path: "/v1/objects/put?holder=w", token: "nope", code: 401, kind: "unauthenticated"},
		{name: "a longer token", method: "GET", path: "/v1/workers", token: testToken + "x", code: 401, kind: "unauthenticated"},
		{name: "unknown paths need the token too", method: "GET", path: "/v1/nope", code: 401, kind: "unauthenticated"},
		{name: "an unknown path", method: "GET", path: "/v1/nope", token: testToken, code: 404},
		{name: "a wrong method", method: "GET", path: "/v1/objects/put", token: testToken, code: 405},
		{name: "a put needs a holder", method: "POST", path: "/v1/objects/put", token: testToken, body: []byte("x"), code: 400, kind: "invalid", says: "needs a holder"},
		{name: "a put over the store's capacity", method: "POST", path: "/v1/objects/put?holder=w", token: testToken, body: make([]byte, 2<<20),
			code: 413, kind: api.KindTooLarge, says: "object size limit of 1048576 bytes"},
		{name: "bad JSON", method: "POST", path: "/v1/objects/map", token: testToken, body: []byte("{"), code: 400, kind: "invalid", says: "/v1/objects/map"},
		{name: "a field of the wrong type is named", method: "POST", path: "/v1/objects/map", token: testToken, body: []byte(`{"id": 5}`),
			code: 400, kind: "invalid", says: "ObjectRef.id"},
		{name: "a bad object id", method: "POST", path: "/v1/objects/release", token: testToken, body: ref("zz", "w"), code: 400, kind: "invalid", says: `object id "zz"`},
		{name: "an unknown object", method: "POST", path: "/v1/objects/map", token: testToken, body: ref(unknown, "w"), code: 404, kind: "not_found"},
		{name: "a replica needs a holder", method: "POST", path: "/v1/objects/replicate", token: testToken, body: ref(unknown, ""), code: 400, kind: "invalid",
			says: "a replica needs a holder"},
		{name: "a lease renewal needs a holder", method: "POST", path: "/v1/leases/renew", token: testToken, body: []byte(`{}`), code: 400, kind: "invalid"},
		{name: "a lease renewal", method: "POST", path: "/v1/leases/renew", token: testToken, body: ref("", "w"), code: 204},
		{name: "a kill needs a rank", method: "POST", path: "/v1/workers/kill?job=j&gang=g&rank=x", token: testToken, code: 400, kind: "invalid", says: `rank "x"`},
		{name: "a kill of no worker", method: "POST", path: "/v1/workers/kill?job=j&gang=g&rank=0", token: testToken, code: 404, kind: "not_found"},
		{name: "no workers", method: "GET", path: "/v1/workers", token: testToken, code: 200},
		{name: "a create needs a lease", method: "POST", path: "/v1/objects/create?holder=w&size=10", token: testToken, code: 400, kind: "invalid", says: "a holder and a lease"},
		{name: "a create needs a size", method: "POST", path: "/v1/objects/create?holder=w&lease=w&size=x", token: testToken, code: 400, kind: "invalid", says: `?size=, a number of bytes >= 0 (got "x")`},
		{name: "a create over the store's capacity", method: "POST", path: "/v1/objects/create?holder=w&lease=w&size=2097152", token: testToken,
			code: 413, kind: api.KindTooLarge},
		{name: "a seal of nothing being written", method: "POST", path: "/v1/objects/seal", token: testToken, body: ref(unknown, "w"), code: 404, kind: "not_found", says: "not being written here"},
		{name: "an abort of nothing being written", method: "POST", path: "/v1/objects/abort", token: testToken, body: ref(unknown, "w"), code: 404, kind: "not_found"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, body, _ := call(t, h, c.method, c.path, c.token, c.body)
			if code != c.code {
				t.Fatalf("status %d (%s), want %d", code, body, c.code)
			}
			if c.kind == "" {
				return
			}
			eb := errorBody(t, body)
			if eb.Kind != c.kind || !strings.Contains(eb.Error, c.says) {
				t.Errorf("error %+v, want kind %q saying %q", eb, c.kind, c.says)
			}
		})
	}
}

// TestAPIPutOverTheBound: a put whose declared length passes the store's object size
// limit is refused before its body is read, with a 413 naming the limit; one that declares
// no length is refused too (411): a body is streamed into the store, never buffered.
func TestAPIPutOverTheBound(t *testing.T) {
	a := newTestAgent(t, 1<<20)
	body := &countReader{}
	req := httptest.NewRequest("POST", "/v1/objects/put?holder=w", body)
	req.Header.Set("Authorization", "Bearer "+testToken)
	req.ContentLength = 1<<20 + 1
	rec := httptest.NewRecorder()
	a.apiHandler().ServeHTTP(rec, req)
	if eb := errorBody(t, rec.Body.Bytes()); rec.Code != 413 || eb.Kind != api.KindTooLarge || !strings.Contains(eb.Error, "limit of 1048576 bytes") {
		t.Errorf("%d %+v, want 413 too_large naming the limit", rec.Code, eb)
	}
	if body.n != 0 {
		t.Errorf("%d bytes of a refused body were read", body.n)
	}
	req = httptest.NewRequest("POST", "/v1/objects/put?holder=w", strings.NewReader("small"))
	req.Header.Set("Authorization", "Bearer "+testToken)
	req.ContentLength = -1
	rec = httptest.NewRecorder()
	a.apiHandler().ServeHTTP(rec, req)
	if rec.Code != http.StatusLengthRequired {
		t.Errorf("a put of undeclared length: %d, want 411", rec.Code)
	}
}

// countReader is an endless body that counts what was read of it.
type countReader struct{ n int }

func (r *countReader) Read(p []byte) (int, error) { r.n += len(p); return len(p), nil }

// TestAPIObjects follows an object through the API: put by one holder, mapped and read,
// replicated to a second holder, released, freed.
func TestAPIObjects(t *testing.T) {
	a := newTestAgent(t, 4<<20)
	h := a.apiHandler()
	post := func(path string, body any) (int, []byte) {
		b, ok := body.([]byte)
		if !ok {
			b, _ = json.Marshal(body)
		}
		code, out, _ := call(t, h, "POST", path, testToken, b)
		return code, out
	}
	code, out := post("/v1/objects/put?holder=worker/j/g/0.g0", []byte("hello objects"))
	var ref api.ObjectRef
	if code != 200 || json.Unmarshal(out, &ref) != nil || ref.Holder != "worker/j/g/0.g0" {
		t.Fatalf("put: %d %s", code, out)
	}
	id, err := object.ParseID(ref.ID)
	if err != nil || !a.local.Held(id) {
		t.Fatalf("put answered id %q (%v), held %v", ref.ID, err, a.local.Held(id))
	}
	code, out = post("/v1/objects/map", api.ObjectRef{ID: ref.ID, Holder: ref.Holder})
	var m object.Mapping
	if code != 200 || json.Unmarshal(out, &m) != nil || m.Size != int64(len("hello objects")) {
		t.Fatalf("map: %d %s", code, out)
	}
	b, unmap, err := object.MapFile(m)
	if err != nil || string(b) != "hello objects" {
		t.Fatalf("mapped %q, %v", b, err)
	}
	if err := unmap(); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		path string
		ref  api.ObjectRef
		code int
	}{
		{"/v1/objects/unmap", api.ObjectRef{ID: ref.ID, Holder: ref.Holder}, 204},
		{"/v1/objects/replicate", api.ObjectRef{ID: ref.ID, Holder: "worker/j/g/1.g0"}, 200},
		{"/v1/objects/release", api.ObjectRef{ID: ref.ID, Holder: "worker/j/g/1.g0"}, 204},
		{"/v1/objects/free", api.ObjectRef{ID: ref.ID}, 204},
		{"/v1/objects/map", api.ObjectRef{ID: ref.ID, Holder: ref.Holder}, 404},
	}
	for _, s := range steps {
		if code, out := post(s.path, s.ref); code != s.code {
			t.Fatalf("%s %+v: %d %s, want %d", s.path, s.ref, code, out, s.code)
		}
	}
	if a.local.Held(id) {
		t.Error("a freed object is still held")
	}
}

// fakeHandle is a started worker that does nothing.
type fakeHandle struct {
	pid    int
	killed bool
	done   chan struct{}
}

func (h *fakeHandle) PID() int                                  { return h.pid }
func (h *fakeHandle) Done() <-chan struct{}                     { return h.done }
func (h *fakeHandle) Err() error                                { return nil }
func (h *fakeHandle) Stop(context.Context, time.Duration) error { return nil }
func (h *fakeHandle) Kill() error                               { h.killed = true; return nil }

func TestAPIWorkers(t *testing.T) {
	a := newTestAgent(t, 1<<20)
	h := a.apiHandler()
	fh := &fakeHandle{pid: 4242, done: make(chan struct{})}
	a.workers["j/b/0"] = &worker{spec: api.WorkerSpec{Job: "j", Gang: "b", Rank: 0, Generation: 2, Member: api.Member{GPUs: []int{3}}}, h: fh}
	a.workers["j/a/1"] = &worker{spec: api.WorkerSpec{Job: "j", Gang: "a", Rank: 1, Member: api.Member{GPUs: []int{0, 1}}}} // launching
	code, out, _ := call(t, h, "GET", "/v1/workers", testToken, nil)
	var ws []WorkerInfo
	if code != 200 || json.Unmarshal(out, &ws) != nil {
		t.Fatalf("workers: %d %s", code, out)
	}
	want := []WorkerInfo{{Key: "j/a/1.g0", Job: "j", Gang: "a", Rank: 1, GPUs: []int{0, 1}},
		{Key: "j/b/0.g2", Job: "j", Gang: "b", Rank: 0, Generation: 2, PID: 4242, GPUs: []int{3}}}
	if len(ws) != 2 || ws[0].Key != want[0].Key || ws[0].PID != 0 || ws[1].Key != want[1].Key || ws[1].PID != 4242 || ws[1].Generation != 2 {
		t.Errorf("workers %+v, want %+v", ws, want)
	}
	// A worker still launching cannot be killed; a running one can.
	if code, out, _ := call(t, h, "POST", "/v1/workers/kill?job=j&gang=a&rank=1", testToken, nil); code != 404 {
		t.Errorf("kill of a launching worker: %d %s", code, out)
	}
	code, out, _ = call(t, h, "POST", "/v1/workers/kill?job=j&gang=b&rank=0", testToken, nil)
	if code != 200 || strings.TrimSpace(string(out)) != `{"pid":4242}` || !fh.killed {
		t.Errorf("kill: %d %s, killed %v", code, out, fh.killed)
	}
}

func TestAPILogs(t *testing.T) {
	a := newTestAgent(t, 1<<20)
	h := a.apiHandler()
	write := func(gen int, s string) {
		p := LogPath(a.cfg.Dir, "j", "g", 0, gen)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(1, "first\n")
	write(10, "tenth\n") // newer than 1 by number, not by name
	cases := []struct {
		name  string
		query string
		code  int
		body  string
		gen   string
	}{
		{name: "the newest generation by default", query: "job=j&gang=g&rank=0", code: 200, body: "tenth\n", gen: "10"},
		{name: "a generation asked", query: "job=j&gang=g&rank=0&gen=1", code: 200, body: "first\n", gen: "1"},
		{name: "a generation without a log", query: "job=j&gang=g&rank=0&gen=2", code: 404},
		{name: "a rank without a log", query: "job=j&gang=g&rank=5", code: 404},
		{name: "a bad job name", query: "job=../etc&gang=g&rank=0", code: 400},
		{name: "a bad gang name", query: "job=j&gang=&rank=0", code: 400},
		{name: "a negative rank", query: "job=j&gang=g&rank=-1", code: 400},
		{name: "a bad generation", query: "job=j&gang=g&rank=0&gen=-1", code: 400},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, body, hdr := call(t, h, "GET", "/v1/logs?"+c.query, testToken, nil)
			if code != c.code || c.code == 200 && (string(body) != c.body || hdr.Get("X-Atoll-Generation") != c.gen) {
				t.Errorf("%d %q (generation %q), want %d %q (%q)", code, body, hdr.Get("X-Atoll-Generation"), c.code, c.body, c.gen)
			}
		})
	}
}

// TestAPILogsFollow streams a log as it grows, until the client goes away.
func TestAPILogsFollow(t *testing.T) {
	a := newTestAgent(t, 1<<20)
	srv := httptest.NewServer(a.apiHandler())
	defer srv.Close()
	p := LogPath(a.cfg.Dir, "j", "g", 0, 0)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte("one\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/v1/logs?job=j&gang=g&rank=0&follow=1", nil)
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	rd := bufio.NewReader(resp.Body)
	if line, err := rd.ReadString('\n'); err != nil || line != "one\n" {
		t.Fatalf("first line %q, %v", line, err)
	}
	f, err := os.OpenFile(p, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("two\n"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if line, err := rd.ReadString('\n'); err != nil || line != "two\n" {
		t.Fatalf("followed line %q, %v", line, err)
	}
	cancel()
	if _, err := io.ReadAll(rd); err == nil {
		t.Error("the stream did not end with its client")
	}
}

func TestAPIMetrics(t *testing.T) {
	a := newTestAgent(t, 1<<20)
	h := a.apiHandler()
	dash := api.DashboardToken([]byte(testToken))
	cases := []struct {
		name, method, token string
		code                int
	}{
		{name: "no token", method: "GET", code: 401},
		{name: "a wrong token", method: "GET", token: "x", code: 401},
		{name: "the dashboard's read-only token", method: "GET", token: dash, code: 200},
		{name: "the cluster token", method: "GET", token: testToken, code: 200},
		{name: "read only", method: "POST", token: testToken, code: 401},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, body, hdr := call(t, h, c.method, "/metrics", c.token, nil)
			if code != c.code {
				t.Fatalf("%d %s, want %d", code, body, c.code)
			}
			if code == 401 && hdr.Get("WWW-Authenticate") == "" {
				t.Error("no WWW-Authenticate on a 401")
			}
			if code == 200 && (!strings.Contains(string(body), `atoll_agent_gpus{state="free"} 8`) || !strings.Contains(string(body), "atoll_agent_object_store_capacity_bytes 1.048576e+06")) {
				t.Errorf("metrics lack the agent's gauges:\n%s", body)
			}
		})
	}
}

// TestBinaryFetch fetches a job's executable from the object store by its hash.
func TestBinaryFetch(t *testing.T) {
	a := newTestAgent(t, 1<<20)
	content := []byte("#!/bin/sh\nexit 0\n")
	sum := sha256.Sum256(content)
	hash := hex.EncodeToString(sum[:])
	id, err := a.local.Put(context.Background(), "driver", content)
	if err != nil {
		t.Fatal(err)
	}
	path, err := a.binary(context.Background(), api.Job{Name: "j", Binary: &api.Binary{SHA256: hash, Size: int64(len(content)), Object: id.String()}})
	if err != nil || path != filepath.Join(a.cfg.Dir, "bin", hash) {
		t.Fatalf("binary %q, %v", path, err)
	}
	if b, err := os.ReadFile(path); err != nil || !bytes.Equal(b, content) || mode(t, path) != 0o700 {
		t.Fatalf("fetched %q (%v), mode %v", b, err, mode(t, path))
	}
	// An object whose bytes are not the executable's hash is refused for good.
	wrongSum := sha256.Sum256([]byte("other"))
	_, err = a.binary(context.Background(), api.Job{Name: "j", Binary: &api.Binary{SHA256: hex.EncodeToString(wrongSum[:]), Size: int64(len(content)), Object: id.String()}})
	if !isPermanent(err) || !strings.Contains(err.Error(), "does not match its hash") {
		t.Fatalf("a mismatched executable: %v", err)
	}
}

// TestAPIScopedCredentials: on an agent's API a worker's credential puts, maps and frees
// its own objects and is refused (403, naming the role and the action) another worker's,
// another job's, and the operator's routes; a driver's credential acts within its job.
func TestAPIScopedCredentials(t *testing.T) {
	a := newTestAgent(t, 1<<20)
	h := a.apiHandler()
	tok := func(p string) string {
		s, _, err := authz.NewToken([]byte(testToken), authz.Claims{Principal: p})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	w0, w1, da, db := tok("worker/a/g/0"), tok("worker/a/g/1"), tok("driver/a"), tok("driver/b")
	ref := func(id, holder string) []byte { b, _ := json.Marshal(api.ObjectRef{ID: id, Holder: holder}); return b }
	put := func(token, holder string) (int, string) {
		code, body, _ := call(t, h, "POST", "/v1/objects/put?holder="+holder, token, []byte("bytes"))
		var in api.ObjectInfo
		_ = json.Unmarshal(body, &in)
		return code, in.ID
	}
	code, mine := put(w0, "worker/a/g/0.g0")
	if code != 200 {
		t.Fatalf("a worker puts its own object: %d", code)
	}
	code, jobs := put(w0, "job/a")
	if code != 200 {
		t.Fatalf("a worker puts its job's task result: %d", code)
	}
	code, bs := put(db, "job/b")
	if code != 200 {
		t.Fatalf("driver/b puts job b's object: %d", code)
	}
	cases := []struct {
		name         string
		token        string
		method, path string
		body         []byte
		code         int
	}{
		{"a worker maps its own object", w0, "POST", "/v1/objects/map", ref(mine, "worker/a/g/0.g0"), 200},
		{"another worker of its job maps it", w1, "POST", "/v1/objects/map", ref(mine, "worker/a/g/1.g0"), 200},
		{"a worker maps in another's name", w1, "POST", "/v1/objects/map", ref(mine, "worker/a/g/0.g0"), 403},
		{"a worker puts in another's name", w1, "POST", "/v1/objects/put?holder=worker/a/g/0.g0", []byte("x"), 403},
		{"a worker puts in another job's name", w0, "POST", "/v1/objects/put?holder=job/b", []byte("x"), 403},
		{"a worker maps another job's object", w0, "POST", "/v1/objects/map", ref(bs, "worker/a/g/0.g0"), 403},
		{"a worker frees another worker's object", w1, "POST", "/v1/objects/free", ref(mine, ""), 403},
		{"a driver of another job frees it", db, "POST", "/v1/objects/free", ref(jobs, ""), 403},
		{"a driver of another job replicates it", db, "POST", "/v1/objects/replicate", ref(jobs, "job/b"), 403},
		{"a worker kills a worker", w0, "POST", "/v1/workers/kill?job=a&gang=g&rank=1", nil, 403},
		{"a driver kills another job's worker", db, "POST", "/v1/workers/kill?job=a&gang=g&rank=1", nil, 403},
		{"a driver reads another job's logs", db, "GET", "/v1/logs?job=a&gang=g&rank=0", nil, 403},
		{"a driver reads its job's logs", da, "GET", "/v1/logs?job=a&gang=g&rank=0", nil, 404},
		{"a driver renews another's lease", da, "POST", "/v1/leases/renew", ref("", "job/b"), 403},
		{"a driver frees its job's object", da, "POST", "/v1/objects/free", ref(jobs, ""), 204},
		{"a worker frees its own object", w0, "POST", "/v1/objects/free", ref(mine, ""), 204},
	}
	for _, c := range cases {
		code, body, _ := call(t, h, c.method, c.path, c.token, c.body)
		if code != c.code {
			t.Errorf("%s: %d %s, want %d", c.name, code, body, c.code)
			continue
		}
		if code == 403 {
			eb := errorBody(t, body)
			if eb.Kind != "forbidden" || !strings.Contains(eb.Error, "role ") {
				t.Errorf("%s: %+v: want a refusal naming the role", c.name, eb)
			}
		}
	}
}

// TestEveryAgentRouteHasARule: every route of the agent's API has a rule (a route without
// one would be admin only, and is a mistake).
func TestEveryAgentRouteHasARule(t *testing.T) {
	b, err := os.ReadFile("api.go")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, m := range regexp.MustCompile(`m\.HandleFunc\("([^"]+)"`).FindAllStringSubmatch(string(b), -1) {
		n++
		if _, ok := agentRules[m[1]]; !ok {
			t.Errorf("route %q has no rule in agentRules", m[1])
		}
	}
	if n < 15 {
		t.Fatalf("found %d routes: the scan is broken", n)
	}
}

// TestAPIPutInPlace: a worker process's large put through the agent's API writes the
// store's shared memory itself (create, write, seal): the object is what it wrote, owned
// by the holder it named; a seal in another holder's name is refused and leaves the write
// pending; an aborted write gives its room back; the writer's next put of the size gets
// the segment it wrote before.
func TestAPIPutInPlace(t *testing.T) {
	a := newTestAgent(t, 4<<20)
	h := a.apiHandler()
	ref := func(id, holder string) []byte { b, _ := json.Marshal(api.ObjectRef{ID: id, Holder: holder}); return b }
	create := func(size int) api.ObjectWrite {
		t.Helper()
		code, body, _ := call(t, h, "POST", fmt.Sprintf("/v1/objects/create?holder=w&lease=w&size=%d", size), testToken, nil)
		var cw api.ObjectWrite
		if code != 200 || json.Unmarshal(body, &cw) != nil || cw.Size != int64(size) || cw.Unmap == nil {
			t.Fatalf("create: %d %s", code, body)
		}
		return cw
	}
	a.node.Store.Renew("w")
	cw := create(1 << 20)
	f, err := object.MapWritable(cw.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b, ok := f.Range(object.Mapping{Path: cw.Path, Offset: cw.Offset, Size: cw.Size})
	if !ok {
		t.Fatalf("the create's range is not in %s", cw.Path)
	}
	for i := range b {
		b[i] = byte(i % 251)
	}
	if code, body, _ := call(t, h, "POST", "/v1/objects/seal", testToken, ref(cw.ID, "v")); code != 404 {
		t.Fatalf("a seal in another holder's name: %d %s", code, body)
	}
	code, body, _ := call(t, h, "POST", "/v1/objects/seal", testToken, ref(cw.ID, "w"))
	if code != 200 {
		t.Fatalf("seal: %d %s", code, body)
	}
	id, _ := object.ParseID(cw.ID)
	v, err := a.local.Get(context.Background(), id, "reader")
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range v.Bytes() {
		if c != byte(i%251) {
			t.Fatalf("byte %d of the sealed object is %d, want %d", i, c, i%251)
		}
	}
	v.Release()
	if m, err := a.node.Store.Directory().Lookup(context.Background(), id); err != nil || m.Owner != "w" {
		t.Fatalf("the directory says %+v, %v: want owner w", m, err)
	}
	if err := a.local.Free(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	next := create(1 << 20)
	if next.Path != cw.Path {
		t.Errorf("the writer's next put is in %s, want the segment it wrote before (%s)", next.Path, cw.Path)
	}
	before := a.node.Store.Stats().HotBytes
	if code, body, _ := call(t, h, "POST", "/v1/objects/abort", testToken, ref(next.ID, "w")); code/100 != 2 {
		t.Fatalf("abort: %d %s", code, body)
	}
	if after := a.node.Store.Stats(); after.HotBytes-after.Recycled >= before {
		t.Errorf("an aborted write kept its room: %+v (before: %d bytes hot)", after, before)
	}
}
