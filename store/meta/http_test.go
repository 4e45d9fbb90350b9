package meta

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/atoll-run/atoll/store/paxos"
)

func TestHTTPHandlerBadInputAndRedirect(t *testing.T) {
	cfg := DefaultClusterConfig()
	cfg.NoSync = true
	cfg.TickInterval = 2 * time.Millisecond
	c, err := StartCluster(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := c.WaitLeader(ctx)
	if err != nil {
		t.Fatal(err)
	}
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
		{"no-token", l, "", `{"ops":[{"t":"put","k":"a"}]}`, http.StatusUnauthorized},
		{"wrong-token", l, "nope", `{"ops":[{"t":"put","k":"a"}]}`, http.StatusUnauthorized},
		{"not-json", l, "tok", `{"ops":`, http.StatusBadRequest},
		{"empty-key", l, "tok", `{"ops":[{"t":"put","k":""}]}`, http.StatusBadRequest},
		{"oversized", l, "tok", `{"ops":[{"t":"put","k":"a","v":"` + strings.Repeat("A", MaxRequestBytes) + `"}]}`, http.StatusBadRequest},
		{"follower-redirects", follower, "tok", `{"ops":[{"t":"put","k":"a"}]}`, http.StatusMisdirectedRequest},
		{"leader-ok", l, "tok", `{"ops":[{"t":"put","k":"a"}]}`, http.StatusOK},
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
	_, err = HTTPConn{BaseURL: srv[follower].URL, Token: "tok"}.Propose(ctx, []byte(`{"ops":[{"t":"put","k":"b"}]}`))
	var nl *paxos.NotLeaderError
	if !errors.As(err, &nl) || nl.Leader != l {
		t.Fatalf("follower propose over HTTP: %v", err)
	}
	kv, ok, err := HTTPConn{BaseURL: srv[l].URL, Token: "tok"}.Get(ctx, "a")
	if err != nil || !ok || kv.Version != 1 {
		t.Fatalf("get a: %+v %v %v", kv, ok, err)
	}
}
