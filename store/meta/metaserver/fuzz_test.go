package metaserver

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/atoll-run/atoll/store/meta"
)

// Fuzzers of the decoders of outside bytes in this package: the head API's HTTP requests
// and the state machine's commands and snapshots. `go test` runs the seeds; run one for
// longer with e.g.
//
//	go test -run '^$' -fuzz '^FuzzHandler$' -fuzztime 60s ./store/meta/

// FuzzHandler sends any method, path, query and body to a one-replica head: the handler
// answers every request with a status of its API (never a panic, never a hang past the
// request's deadline), and a 200 to a propose is a request that Validate accepts.
func FuzzHandler(f *testing.F) {
	cfg := DefaultClusterConfig()
	cfg.Replicas = 1
	cfg.NoSync = true
	cfg.TickInterval = time.Millisecond
	c, err := StartCluster(cfg)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.WaitLeader(ctx); err != nil {
		f.Fatal(err)
	}
	h := &Handler{Replica: c.Replicas[1], SM: c.SMs[1], Token: "tok", RequestTimeout: time.Second}
	methods := []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodHead}
	f.Add(uint8(1), "/v1/propose", `{"ops":[{"t":"put","k":"nodes/a","v":"AQI="}]}`)
	f.Add(uint8(1), "/v1/propose?timeout_ms=50", `{"c":"x","s":1,"a":1,"if":[{"k":"jobs/j","ver":0}],"ops":[{"t":"del","k":"jobs/j"}]}`)
	f.Add(uint8(0), "/v1/get?key=nodes/a", "")
	f.Add(uint8(0), "/v1/range?prefix=nodes/", "")
	f.Add(uint8(0), "/v1/status", "")
	f.Add(uint8(1), "/v1/members/remove?id=9&timeout_ms=10", "")
	f.Add(uint8(1), "/v1/members/add?id=2&addr=bad&timeout_ms=10", "")
	f.Add(uint8(0), "/v1/propose", `{"ops":[{"t":"put","k":"a"}]}`)
	f.Fuzz(func(t *testing.T, m uint8, target, body string) {
		if _, err := url.ParseRequestURI(target); err != nil || !strings.HasPrefix(target, "/") || strings.ContainsAny(target, " \r\n#") {
			return // not a request target a client can send
		}
		req := httptest.NewRequest(methods[int(m)%len(methods)], target, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer tok")
		rec := httptest.NewRecorder()
		start := time.Now()
		h.ServeHTTP(rec, req)
		if d := time.Since(start); d > MaxRequestTimeout {
			t.Fatalf("%s %s took %v", req.Method, target, d)
		}
		switch rec.Code {
		case http.StatusOK, http.StatusNotFound, http.StatusBadRequest, http.StatusMethodNotAllowed,
			http.StatusServiceUnavailable, http.StatusMisdirectedRequest:
		default:
			t.Fatalf("%s %s %q: status %d %s", req.Method, target, body, rec.Code, rec.Body)
		}
		if rec.Code == http.StatusOK && req.URL.Path == "/v1/propose" {
			var r meta.Request
			if err := json.Unmarshal([]byte(body), &r); err != nil || r.Validate() != nil {
				t.Fatalf("propose %q accepted though invalid", body)
			}
		}
	})
}

// FuzzStateMachine applies any command and restores any snapshot: both either work or
// report an error; a successful Apply's answer is a Response, and a state that restored
// from bytes snapshots again.
func FuzzStateMachine(f *testing.F) {
	sm := NewStateMachine(0)
	sm.ApplyRequest(&meta.Request{ClientID: "c", Seq: 1, Ops: []meta.Op{{Type: meta.OpPut, Key: "nodes/a", Value: []byte("v")}}})
	snap, _, err := sm.Snapshot()
	if err != nil {
		f.Fatal(err)
	}
	f.Add([]byte(`{"c":"c","s":2,"a":2,"ops":[{"t":"put","k":"jobs/x"}]}`), snap)
	f.Add([]byte(`{"ops":[]}`), []byte(`{"rev":-1,"kv":[{"k":""}],"clients":{"c":null}}`))
	f.Add([]byte(`null`), []byte(`null`))
	// A client entry without answers used to panic the next Apply of that client.
	f.Add([]byte(`{"c":"c","s":1,"ops":[{"t":"put","k":"x"}]}`), []byte(`{"clients":{"c":{}}}`))
	f.Fuzz(func(t *testing.T, cmd, snapshot []byte) {
		sm := NewStateMachine(16)
		var resp meta.Response
		if err := json.Unmarshal(sm.Apply(1, cmd), &resp); err != nil {
			t.Fatalf("Apply answered a non-Response: %v", err)
		}
		if err := sm.Restore(snapshot); err != nil {
			return
		}
		if err := json.Unmarshal(sm.Apply(2, cmd), &resp); err != nil {
			t.Fatalf("Apply after restore answered a non-Response: %v", err)
		}
		if _, _, err := sm.Snapshot(); err != nil {
			t.Fatalf("snapshot after restore: %v", err)
		}
	})
}
