package head

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/atoll-run/atoll/internal/pki"
	"github.com/atoll-run/atoll/runtime/authz"
	"github.com/atoll-run/atoll/store/paxos"
)

// TestMaxAPIConns: the API's connection bound is the configured one, or half of the
// process's open-file limit (at least 256), leaving the other half to the Paxos links, the
// log and the gossip.
func TestMaxAPIConns(t *testing.T) {
	if got := maxAPIConns(100); got != 100 {
		t.Fatalf("configured 100: %d", got)
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Skip(err)
	}
	want := max(256, int(lim.Cur/2))
	if lim.Cur > 1<<30 {
		want = 1 << 14
	}
	if got := maxAPIConns(0); got != want || uint64(got) > max(256, lim.Cur) {
		t.Fatalf("default: %d, want %d (open-file limit %d)", got, want, lim.Cur)
	}
}

// TestMaxInflight: over its bound of requests in flight, the API makes a request wait for a
// slot (served once one frees), or answers 503 naming the bound after its wait; long polls
// are not counted.
func TestMaxInflight(t *testing.T) {
	h, err := Start(Config{ID: 1, Initial: []uint64{1}, Transport: paxos.NewMemNetwork(1).Transport(1), DataDir: t.TempDir(),
		NoSync: true, Token: testToken, Logger: zaptest.NewLogger(t), MaxInflight: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = h.Close() }()
	if cap(h.api.inflight) != 1 {
		t.Fatalf("bound %d, want the configured 1", cap(h.api.inflight))
	}
	h.api.inflightWait = 50 * time.Millisecond
	h.api.inflight <- struct{}{} // a request in flight holds the only slot
	if code, body := getHead(t, h, "/v1/status"); code != http.StatusServiceUnavailable || !strings.Contains(body, "max_inflight") || !strings.Contains(body, `"kind":"unavailable"`) {
		t.Fatalf("over the bound: %d %s; want 503 unavailable naming max_inflight", code, body)
	}
	if code, body := getHead(t, h, "/v1/watch?prefix=jobs/&rev=0&wait_ms=10"); code != http.StatusOK {
		t.Fatalf("a long poll over the bound: %d %s; want it served", code, body)
	}
	if code, body := requestHead(t, h, http.MethodPost, "/v1/machines/load", `{"machine":"nowhere"}`); strings.Contains(body, "max_inflight") {
		t.Fatalf("a load report while the other slots are taken: %d %s; want it past the bound (its own slots)", code, body)
	}
	h.api.inflightWait = time.Minute
	served := make(chan int, 1)
	go func() {
		code, _ := getHead(t, h, "/v1/status")
		served <- code
	}()
	select {
	case code := <-served:
		t.Fatalf("a request was served (%d) while the slot was held", code)
	case <-time.After(100 * time.Millisecond): // still waiting: proves nothing alone, the next step does
	}
	<-h.api.inflight // the request in flight ends
	if code := <-served; code != http.StatusOK {
		t.Fatalf("the waiting request, once the slot freed: %d; want 200", code)
	}
	if n := DefaultMaxInflight(2); n != 32 {
		t.Fatalf("default for 2 cores: %d, want 32", n)
	}
}

// TestAwaitGivesBackTheSlot: a request that waits for a commit gives its API slot back
// while it waits, once only (the request's own release at its end is then nothing); one
// whose commit is already answered keeps it.
func TestAwaitGivesBackTheSlot(t *testing.T) {
	slots := make(chan struct{}, 1)
	slots <- struct{}{} // the request's slot
	s := &apiSlot{slots: slots}
	ctx := context.WithValue(context.Background(), slotKey{}, s)
	ch := make(chan error)
	done := make(chan error, 1)
	go func() { done <- await(ctx, ch) }()
	select {
	case slots <- struct{}{}: // another request takes the slot the waiting one gave back
	case <-time.After(10 * time.Second):
		t.Fatal("the slot was not given back while the request waited for its commit")
	}
	ch <- nil
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	s.release() // the request ends
	if len(slots) != 1 {
		t.Fatalf("after the request's end %d slots are taken, want the other request's 1", len(slots))
	}

	held := make(chan struct{}, 1)
	held <- struct{}{}
	answered := make(chan error, 1)
	answered <- nil
	if err := await(context.WithValue(context.Background(), slotKey{}, &apiSlot{slots: held}), answered); err != nil || len(held) != 1 {
		t.Fatalf("a commit already answered: %v, %d slots taken; want the slot kept", err, len(held))
	}
}

// TestShedReportIsAHeartbeat: a load report shed for want of a slot is kept as a heartbeat
// of the machine its client certificate names, if that is one machine's agent whose
// credential stands; any other certificate, or none, records nothing.
func TestShedReportIsAHeartbeat(t *testing.T) {
	h, err := Start(Config{ID: 1, Initial: []uint64{1}, Transport: paxos.NewMemNetwork(1).Transport(1), DataDir: t.TempDir(),
		NoSync: true, Token: testToken, Logger: zaptest.NewLogger(t), MaxInflight: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = h.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ctl := h.Controller()
	for _, m := range []string{"m0", "m1"} {
		for { // once the head leads
			if _, err := ctl.RegisterMachine(ctx, machine(t, m)); err == nil {
				break
			} else if ctx.Err() != nil {
				t.Fatal(err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	ca, err := pki.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	shed := func(p authz.Principal, tokenID string) {
		t.Helper()
		id, err := ca.IssueIdentityGrant(p.String(), pki.Grant{URI: authz.Grant(p, tokenID, false)})
		if err != nil {
			t.Fatal(err)
		}
		r := httptest.NewRequest(http.MethodPost, "/v1/machines/load", nil)
		r.TLS = &tls.ConnectionState{PeerCertificates: []*x509.Certificate{id.Leaf()}}
		h.api.shedReport(r)
	}
	heard := func(m string) time.Time {
		ctl.liveMu.Lock()
		defer ctl.liveMu.Unlock()
		return ctl.live.detect.watch(m).heard
	}
	before0, before1 := heard("m0"), heard("m1")
	h.api.authn.Revoked = func(id string) bool { return id == "gone" }
	shed(authz.Agent("m1"), "gone")                                                  // a revoked credential's certificate
	shed(authz.Agent(authz.AnyMachine), "")                                          // every machine's
	shed(authz.Driver("train"), "")                                                  // not an agent's
	h.api.shedReport(httptest.NewRequest(http.MethodPost, "/v1/machines/load", nil)) // no TLS
	if got := heard("m1"); !got.Equal(before1) {
		t.Fatalf("m1 heard at %v (was %v) from a certificate that may not stand for it", got, before1)
	}
	shed(authz.Agent("m0"), "")
	if got := heard("m0"); !got.After(before0) {
		t.Fatalf("m0's shed report: heard at %v, was %v; want it kept as a heartbeat", got, before0)
	}
}
