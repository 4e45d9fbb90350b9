package metaserver

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/atoll-run/atoll/store/meta"
)

func TestHTTPHandlerBadInputAndRedirect(t *testing.T) {
	c, l, ctx := startTestCluster(t, nil)
	var follower uint64 = 1
	if l == 1 {
		follower = 2
	}
	srv := map[uint64]*httptest.Server{}
	for _, id := range []uint64{l, follower} {
		srv[id] = httptest.NewServer(&Handler{Replica: c.Replicas[id], SM: c.SMs[id], Token: "tok", Logger: zaptest.NewLogger(t)})
		defer srv[id].Close()
	}
	cases := []struct {
		name   string
		id     uint64
		token  string
		body   string
		status int
	}{
		{"no-token", l, "", `{"ops":[{"t":"put","k":"nodes/a"}]}`, http.StatusUnauthorized},
		{"wrong-token", l, "nope", `{"ops":[{"t":"put","k":"nodes/a"}]}`, http.StatusUnauthorized},
		{"not-json", l, "tok", `{"ops":`, http.StatusBadRequest},
		{"empty-key", l, "tok", `{"ops":[{"t":"put","k":""}]}`, http.StatusBadRequest},
		{"key-in-no-table", l, "tok", `{"ops":[{"t":"put","k":"a"}]}`, http.StatusBadRequest},
		{"key-is-only-a-table", l, "tok", `{"ops":[{"t":"put","k":"nodes/"}]}`, http.StatusBadRequest},
		{"compare-key-in-no-table", l, "tok", `{"if":[{"k":"x","ver":0}],"ops":[{"t":"put","k":"nodes/a"}]}`, http.StatusBadRequest},
		{"oversized", l, "tok", `{"ops":[{"t":"put","k":"nodes/a","v":"` + strings.Repeat("A", MaxRequestBytes) + `"}]}`, http.StatusBadRequest},
		{"follower-redirects", follower, "tok", `{"ops":[{"t":"put","k":"nodes/a"}]}`, http.StatusMisdirectedRequest},
		{"leader-ok", l, "tok", `{"ops":[{"t":"put","k":"nodes/a"}]}`, http.StatusOK},
	}
	for _, tc := range cases {
		req, _ := http.NewRequest(http.MethodPost, srv[tc.id].URL+"/v1/propose", strings.NewReader(tc.body))
		if tc.token != "" {
			req.Header.Set("Authorization", "Bearer "+tc.token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.status {
			t.Errorf("%s: status %d, want %d", tc.name, resp.StatusCode, tc.status)
		}
	}
	// HTTPConn maps the redirect to a NotLeaderError carrying the leader id.
	_, err := meta.HTTPConn{BaseURL: srv[follower].URL, Token: "tok"}.Propose(ctx, []byte(`{"ops":[{"t":"put","k":"nodes/b"}]}`))
	var nl *meta.NotLeaderError
	if !errors.As(err, &nl) || nl.Leader != l {
		t.Fatalf("follower propose over HTTP: %v", err)
	}
	kv, ok, err := meta.HTTPConn{BaseURL: srv[l].URL, Token: "tok"}.Get(ctx, "nodes/a")
	if err != nil || !ok || kv.Version != 1 {
		t.Fatalf("get a: %+v %v %v", kv, ok, err)
	}
	// A range read in pages over HTTP: nodes/a (above) and nodes/c, nodes/d, by two.
	conn := meta.HTTPConn{BaseURL: srv[l].URL, Token: "tok"}
	for _, k := range []string{"nodes/c", "nodes/d"} {
		if _, err := conn.Propose(ctx, []byte(`{"ops":[{"t":"put","k":"`+k+`"}]}`)); err != nil {
			t.Fatal(err)
		}
	}
	p1, err := conn.RangePage(ctx, "nodes/", "", 2)
	if err != nil || len(p1.KVs) != 2 || p1.KVs[0].Key != "nodes/a" || p1.Next != "nodes/c" {
		t.Fatalf("first page: %+v, %v; want nodes/a and nodes/c, next after nodes/c", p1, err)
	}
	p2, err := conn.RangePage(ctx, "nodes/", p1.Next, 2)
	if err != nil || len(p2.KVs) != 1 || p2.KVs[0].Key != "nodes/d" || p2.Next != "" {
		t.Fatalf("second page: %+v, %v; want nodes/d and no more", p2, err)
	}
	for _, limit := range []int{0, MaxPage + 1} {
		if _, err := conn.RangePage(ctx, "nodes/", "", limit); !errors.Is(err, meta.ErrBadRequest) {
			t.Fatalf("a page of %d keys: %v, want ErrBadRequest", limit, err)
		}
	}
}

// Methods, deadlines and tokens (issue 14, finding 8): a write is never a GET; a request
// without timeout_ms still has a deadline; a wrong token is reported as the client's.
func TestHTTPHandlerMethodsDeadlinesAndToken(t *testing.T) {
	c, l, ctx := startTestCluster(t, nil)
	h := &Handler{Replica: c.Replicas[l], SM: c.SMs[l], Token: "tok", Logger: zaptest.NewLogger(t), RequestTimeout: 300 * time.Millisecond}
	srv := httptest.NewServer(h)
	defer srv.Close()
	do := func(method, path, body string) (int, string) {
		req, _ := http.NewRequestWithContext(ctx, method, srv.URL+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer tok")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	put := `{"ops":[{"t":"put","k":"jobs/j"}]}`
	for _, tc := range []struct {
		method, path, body string
		status             int
	}{
		{http.MethodGet, "/v1/propose?" + url.Values{"body": {put}}.Encode(), "", http.StatusMethodNotAllowed},
		{http.MethodGet, "/v1/propose", put, http.StatusMethodNotAllowed},
		{http.MethodPut, "/v1/propose", put, http.StatusMethodNotAllowed},
		{http.MethodGet, "/v1/members/remove?id=2", "", http.StatusMethodNotAllowed},
		{http.MethodPost, "/v1/get?key=jobs/j", "", http.StatusMethodNotAllowed},
		{http.MethodGet, "/v1/nosuch", "", http.StatusNotFound},
		{http.MethodPost, "/v1/propose?timeout_ms=soon", put, http.StatusBadRequest},
		{http.MethodPost, "/v1/propose?timeout_ms=-5", put, http.StatusBadRequest},
		{http.MethodGet, "/v1/get?key=jobs/j", "", http.StatusNotFound},
		{http.MethodPost, "/v1/propose?timeout_ms=999999999999", put, http.StatusOK},
	} {
		if code, body := do(tc.method, tc.path, tc.body); code != tc.status {
			t.Errorf("%s %s: %d %s, want %d", tc.method, tc.path, code, body, tc.status)
		}
	}
	if kv, ok := c.SMs[l].Get("jobs/j"); !ok || kv.Version != 1 {
		t.Fatalf("writes: jobs/j %+v %v, want exactly the one POST applied", kv, ok)
	}

	// A wrong token: ErrUnauthenticated at once, not retried until the deadline.
	client, err := meta.NewClient(meta.DefaultClientConfig(), map[uint64]meta.Conn{l: meta.HTTPConn{BaseURL: srv.URL, Token: "wrong"}})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = client.Put(ctx, "jobs/k", []byte("v"))
	if !errors.Is(err, meta.ErrUnauthenticated) || !strings.Contains(err.Error(), "refused this client's token") {
		t.Fatalf("wrong token: %v, want meta.ErrUnauthenticated naming the client's token", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("wrong token retried for %v", d)
	}

	// No quorum: a request without timeout_ms ends at the server's deadline (503).
	for id, r := range c.Replicas {
		if id != l {
			r.Close()
		}
	}
	start = time.Now()
	code, body := do(http.MethodPost, "/v1/propose", `{"ops":[{"t":"put","k":"jobs/late"}]}`)
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "deadline") {
		t.Fatalf("propose without quorum: %d %s, want 503 at the deadline", code, body)
	}
	if d := time.Since(start); d < h.RequestTimeout {
		t.Fatalf("propose without quorum answered after %v, before the %v deadline", d, h.RequestTimeout)
	}
}
