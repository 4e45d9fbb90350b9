package head

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/atoll-run/atoll/internal/pki"
	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/runtime/authz"
	"github.com/atoll-run/atoll/store/meta"
)

// TestEveryRouteHasARule: every route the API registers (in http.go and authz.go) has a
// rule of runtime/authz's table; a route without one would be admin only, and is a
// mistake.
func TestEveryRouteHasARule(t *testing.T) {
	handle := regexp.MustCompile(`m\.Handle(?:Func)?\("([^"]+)"`)
	list := regexp.MustCompile(`range \[\]string\{([^}]*)\}`)
	quoted := regexp.MustCompile(`"([^"]+)"`)
	n := 0
	for _, f := range []string{"http.go", "authz.go"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var patterns []string
		for _, m := range handle.FindAllStringSubmatch(string(b), -1) {
			patterns = append(patterns, m[1])
		}
		for _, m := range list.FindAllStringSubmatch(string(b), -1) {
			for _, q := range quoted.FindAllStringSubmatch(m[1], -1) {
				patterns = append(patterns, q[1])
			}
		}
		for _, p := range patterns {
			n++
			r, ok := routeRules[p]
			if !ok {
				t.Errorf("%s: route %q has no rule in routeRules", f, p)
				continue
			}
			if r.check == nil && r.key == "" { // a log read's action is its key's (authz.ReadOf)
				if _, known := ruleOf(r.action); !known {
					t.Errorf("route %q: action %q is not in runtime/authz's table", p, r.action)
				}
			}
		}
	}
	if n < 30 {
		t.Fatalf("found %d routes: the scan is broken", n)
	}
}

func ruleOf(a authz.Action) (authz.Rule, bool) {
	for _, r := range authz.Table() {
		if r.Action == a {
			return r, true
		}
	}
	return authz.Rule{}, false
}

// credHolder is a process holding one credential: a scoped token (or the cluster token) and
// the certificate the head signed for it.
type credHolder struct {
	t     *testing.T
	base  string
	token string
	hc    *http.Client
}

func newCaller(t *testing.T, ctx context.Context, h *Head, ca *pki.CA, token string) *credHolder {
	t.Helper()
	id, err := api.RequestIdentity(ctx, []string{h.Address()}, token, ca.CertPEM, "test-process")
	if err != nil {
		t.Fatal(err)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = id.Client()
	t.Cleanup(tr.CloseIdleConnections)
	return &credHolder{t: t, base: h.Address(), token: token, hc: &http.Client{Transport: tr, Timeout: 10 * time.Second}}
}

func (c *credHolder) do(method, path string, body any) (int, string) {
	c.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		j, _ := json.Marshal(b)
		rd = bytes.NewReader(j)
	}
	req, _ := http.NewRequest(method, c.base+path, rd)
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := c.hc.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(out)
}

func txn(ops ...meta.Op) meta.Request { return meta.Request{Ops: ops} }

func put(key, value string) meta.Op { return meta.Op{Type: meta.OpPut, Key: key, Value: []byte(value)} }

// TestScopedCredentials: on one head with mutual TLS, a driver's credential for job a
// writes within job a, and every write outside it is refused (403 naming the role and the
// action) with an audit event and nothing written; a worker's credential is refused what
// is not its own; revoked and job-ended credentials are refused everything (401).
func TestScopedCredentials(t *testing.T) {
	ca, err := pki.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	h, err := Start(Config{ID: 1, Peers: map[uint64]string{1: freeAddr(t)}, DataDir: t.TempDir(), NoSync: true, Token: testToken,
		CA: ca, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	adm := newCaller(t, ctx, h, ca, string(testToken))
	for { // once the head leads
		code, out := adm.do("POST", "/v1/jobs", api.Job{Name: "b"})
		if code == 200 {
			break
		}
		if code != http.StatusServiceUnavailable || ctx.Err() != nil {
			t.Fatalf("admin submits job b: %d %s", code, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
	dtok, dclaims, err := authz.NewToken(testToken, authz.Claims{Principal: "driver/a", Expires: time.Now().Add(time.Hour).Unix()})
	if err != nil {
		t.Fatal(err)
	}
	drv := newCaller(t, ctx, h, ca, dtok)

	code, out := drv.do("GET", "/v1/whoami", nil)
	var who api.WhoAmI
	_ = json.Unmarshal([]byte(out), &who)
	if code != 200 || who.Principal != "driver/a" || who.LinkKey != string(authz.LinkKey(testToken)) || who.TokenID != dclaims.ID {
		t.Fatalf("whoami: %d %s", code, out)
	}
	// Its own work.
	for _, ok := range []struct {
		method, path string
		body         any
	}{
		{"POST", "/v1/jobs", api.Job{Name: "a"}},
		{"POST", "/v1/txn", txn(put(api.TableCheckpoints+"a/g/00000001", "{}"))},
		{"POST", "/v1/txn", txn(put(api.TableOwners+"driver/h/1", `{"name":"driver/h/1","principal":"driver/a"}`))},
		{"POST", "/v1/txn", txn(put(api.TableObjects+"o1", `{"id":"o1","owner":"driver/h/1"}`))},
		{"POST", "/v1/txn", txn(put(api.TableObjects+"o2", `{"id":"o2","owner":"job/a"}`))},
		{"GET", "/v1/list?prefix=jobs/", nil},
	} {
		if code, out := drv.do(ok.method, ok.path, ok.body); code/100 != 2 {
			t.Errorf("driver/a: %s %s: %d %s", ok.method, ok.path, code, out)
		}
	}
	beforeRange := func() string { _, out := adm.do("GET", "/v1/range?prefix=", nil); return out }
	snapshot := beforeRange()
	refusals := []struct {
		method, path string
		body         any
		action       authz.Action
	}{
		{"POST", "/v1/propose", txn(put(api.TableGangs+"b/x", "{}")), authz.ActPropose},
		{"POST", "/v1/members/add?id=9&addr=127.0.0.1:1", nil, authz.ActMembers},
		{"POST", "/v1/members/remove?id=1", nil, authz.ActMembers},
		{"POST", "/v1/jobs", api.Job{Name: "b"}, authz.ActJobSubmit},
		{"POST", "/v1/jobs/stop?job=b", nil, authz.ActJobWrite},
		{"POST", "/v1/gangs", api.GangSpec{Job: "b", Name: "g", Kind: "k", Workers: 1}, authz.ActGangWrite},
		{"POST", "/v1/gangs/stop?job=b&gang=g", nil, authz.ActGangWrite},
		{"POST", "/v1/workers/ready", api.Worker{Job: "a", Gang: "g", Rank: 0}, authz.ActWorkerReady},
		{"POST", "/v1/machines/register", machine(t, "m9"), authz.ActMachineReport},
		{"PUT", "/v1/scheduler", api.SchedulerConfig{}, authz.ActConfigWrite},
		{"POST", "/v1/machines/drain", api.DrainRequest{Machine: "m1"}, authz.ActMachineDrain},
		{"POST", "/v1/tokens", api.TokenRequest{Principal: "worker/a/g/0"}, authz.ActTokenMint},
		{"POST", "/v1/tokens/revoke", api.Revocation{ID: "x"}, authz.ActTokenRevoke},
		{"POST", "/v1/txn", txn(put(api.TableGangs+"a/g", "{}")), authz.ActKVControl},
		{"POST", "/v1/txn", txn(put(api.TableConfig+"scheduler", "{}")), authz.ActKVControl},
		{"POST", "/v1/txn", txn(put(api.TableCheckpoints+"b/g/00000001", "{}")), authz.ActKVCheckpoints},
		{"POST", "/v1/txn", txn(put(api.TableObjects+"o3", `{"id":"o3","owner":"job/b"}`)), authz.ActKVObjects},
		{"POST", "/v1/txn", txn(put(api.TableObjects+"o1", `{"id":"o1","owner":"job/b"}`)), authz.ActKVObjects},
		{"POST", "/v1/txn", txn(put(api.TableOwners+"driver/h/2", `{"name":"driver/h/2"}`)), authz.ActKVOwners},
		{"POST", "/v1/certs", api.CertRequest{Name: "x", Principal: "admin"}, authz.ActCertSign},
		{"GET", "/debug/pprof/", nil, authz.ActDebug},
		{"GET", "/v1/get?key=jobs/b", nil, authz.ActReadJob},
		{"GET", "/v1/range?prefix=gangs/b/", nil, authz.ActReadJob},
		{"GET", "/v1/list?prefix=events/", nil, authz.ActReadControl},
		{"GET", "/v1/list?prefix=", nil, authz.ActReadControl},
		{"GET", "/v1/range?prefix=auth/", nil, authz.ActReadControl},
		{"GET", "/v1/watch?prefix=owners/&rev=0&wait_ms=0", nil, authz.ActReadControl},
	}
	for _, r := range refusals {
		code, out := drv.do(r.method, r.path, r.body)
		if code != http.StatusForbidden || !strings.Contains(out, "driver/a") || !strings.Contains(out, "role driver") || !strings.Contains(out, string(r.action)) {
			t.Errorf("driver/a: %s %s: %d %s; want 403 naming the role and %s", r.method, r.path, code, out, r.action)
		}
	}
	// Reads: a job's records are its jobs' only; a range over every job's answers its own.
	if code, out := drv.do("GET", "/v1/get?key=jobs/a", nil); code != 200 || !strings.Contains(out, `"jobs/a"`) {
		t.Errorf("driver/a reads jobs/a: %d %s", code, out)
	}
	var listing api.Listing
	if code, out := drv.do("GET", "/v1/list?prefix=jobs/", nil); code != 200 || json.Unmarshal([]byte(out), &listing) != nil ||
		len(listing.KVs) != 1 || listing.KVs[0].Key != "jobs/a" {
		t.Errorf("driver/a lists jobs/: %d %s; want jobs/a alone (jobs/b is admin's)", code, out)
	}
	var ranged []meta.KeyValue
	if code, out := drv.do("GET", "/v1/range?prefix=jobs/", nil); code != 200 || json.Unmarshal([]byte(out), &ranged) != nil ||
		len(ranged) != 1 || ranged[0].Key != "jobs/a" {
		t.Errorf("driver/a ranges over jobs/: %d %s; want jobs/a alone", code, out)
	}
	var watched api.WatchAnswer
	if code, out := drv.do("GET", "/v1/watch?prefix=jobs/&rev=0&wait_ms=0", nil); code != 200 || json.Unmarshal([]byte(out), &watched) != nil {
		t.Errorf("driver/a watches jobs/: %d %s", code, out)
	} else {
		for _, ev := range watched.Events {
			if ev.KV.Key != "jobs/a" {
				t.Errorf("driver/a's watch of jobs/ shows %s", ev.KV.Key)
			}
		}
	}
	if code, out := adm.do("GET", "/v1/list?prefix=jobs/", nil); code != 200 || !strings.Contains(out, `"jobs/b"`) {
		t.Errorf("admin lists jobs/: %d %s; want every job", code, out)
	}
	var nonEvents = func(s string) []meta.KeyValue {
		var kvs []meta.KeyValue
		_ = json.Unmarshal([]byte(s), &kvs)
		out := kvs[:0]
		for _, kv := range kvs {
			if !strings.HasPrefix(kv.Key, api.TableEvents) {
				out = append(out, kv)
			}
		}
		return out
	}
	if a, b := nonEvents(snapshot), nonEvents(beforeRange()); fmt.Sprint(a) != fmt.Sprint(b) {
		t.Errorf("the refused requests changed the log:\nbefore %v\nafter  %v", a, b)
	}
	// Each refusal is an audit event.
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, out := adm.do("GET", "/v1/list?prefix=events/", nil)
		var l api.Listing
		_ = json.Unmarshal([]byte(out), &l)
		n := 0
		for _, kv := range l.KVs {
			var ev api.Event
			if json.Unmarshal(kv.Value, &ev) == nil && ev.Kind == api.EventRefused && ev.By == "driver/a" {
				n++
			}
		}
		if n == len(refusals) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d refusal events of driver/a, want %d", n, len(refusals))
		}
		time.Sleep(50 * time.Millisecond)
	}

	// A worker's credential (minted by admin here, as an agent's is): its own readiness
	// only, and it ends with its job.
	code, out = adm.do("POST", "/v1/tokens", api.TokenRequest{Principal: "worker/a/g/0"})
	var minted api.TokenReply
	if err := json.Unmarshal([]byte(out), &minted); code != 200 || err != nil {
		t.Fatalf("mint: %d %s", code, out)
	}
	wrk := newCaller(t, ctx, h, ca, minted.Token)
	for _, r := range []struct {
		method, path string
		body         any
	}{
		{"POST", "/v1/workers/ready", api.Worker{Job: "a", Gang: "g", Rank: 1}},
		{"POST", "/v1/gangs/stop?job=b&gang=g", nil},
		{"POST", "/v1/jobs/stop?job=a", nil},
		{"POST", "/v1/txn", txn(put(api.TableObjects+"o4", `{"id":"o4","owner":"worker/a/g/1.g0"}`))},
		{"POST", "/v1/txn", txn(put(api.TableCheckpoints+"b/g/00000002", "{}"))},
		{"POST", "/v1/txn", txn(put(api.TableGangs+"a/g", "{}"))},
	} {
		if code, out := wrk.do(r.method, r.path, r.body); code != http.StatusForbidden || !strings.Contains(out, "role worker") {
			t.Errorf("worker/a/g/0: %s %s: %d %s; want 403", r.method, r.path, code, out)
		}
	}
	if code, out := wrk.do("POST", "/v1/txn", txn(put(api.TableObjects+"o5", `{"id":"o5","owner":"worker/a/g/0.g0"}`))); code != 200 {
		t.Errorf("worker/a/g/0 writes its own object's record: %d %s", code, out)
	}

	// Revoked: refused everything, on the token and on the certificate made for it.
	if code, out := adm.do("POST", "/v1/tokens/revoke", api.Revocation{ID: dclaims.ID, Principal: "driver/a"}); code/100 != 2 {
		t.Fatalf("revoke: %d %s", code, out)
	}
	if code, out := drv.do("GET", "/v1/whoami", nil); code != http.StatusUnauthorized || !strings.Contains(out, "revoked") {
		t.Errorf("a revoked credential: %d %s", code, out)
	}
	if _, err := api.RequestIdentity(ctx, []string{h.Address()}, dtok, ca.CertPEM, "again"); !errors.Is(err, api.ErrUnauthenticated) {
		t.Errorf("a revoked token got a certificate: %v", err)
	}
	// Job-bound: the worker's credential ends with job a.
	if code, out := adm.do("POST", "/v1/jobs/stop?job=a", nil); code/100 != 2 {
		t.Fatalf("stop a: %d %s", code, out)
	}
	if code, out := wrk.do("GET", "/v1/whoami", nil); code != http.StatusUnauthorized || !strings.Contains(out, "ended with its job") {
		t.Errorf("a worker of a stopped job: %d %s", code, out)
	}
	// The admin's writes are audited.
	kinds := map[api.EventKind]int{}
	_, out = adm.do("GET", "/v1/list?prefix=events/", nil)
	var l api.Listing
	_ = json.Unmarshal([]byte(out), &l)
	for _, kv := range l.KVs {
		var ev api.Event
		if json.Unmarshal(kv.Value, &ev) == nil && ev.By == "admin" {
			kinds[ev.Kind]++
		}
	}
	if kinds[api.EventCredentialRevoked] != 1 || kinds[api.EventAdminWrite] < 1 {
		t.Errorf("admin's audit events: %v; want a revocation and the admin writes", kinds)
	}
}
