package api

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/atoll-run/atoll/internal/pki"
)

// TestFollowIdentityByHints checks how a process that hears the heads' trust tag follows
// the cluster CA: it polls until it hears a tag; then a hint of the tag it followed asks
// nothing, and one of another tag asks the heads at once (a rotation's step: its trust
// moves to the new bundle). That it then polls only every TrustHintedPoll is not timed
// here. A hint is a synchronous hand-over here, so that a hint's send
// returns only once the follower took it, and the next send only once it dealt with it.
func TestFollowIdentityByHints(t *testing.T) {
	ca, err := pki.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	id, err := ca.IssueIdentity("agent/m0")
	if err != nil {
		t.Fatal(err)
	}
	next, err := pki.NewCA("test-next")
	if err != nil {
		t.Fatal(err)
	}
	bundle := string(ca.TrustPEM())
	both := bundle + string(next.TrustPEM()) // a rotation's first step: trust both, sign with the old
	f := newFakeHeads(t, 1, 1)
	var mu sync.Mutex
	served := bundle
	polled := make(chan struct{}, 16)
	f.set(func() {
		f.answer = func(_ uint64, w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			b := served
			mu.Unlock()
			writeTestJSON(w, http.StatusOK, TrustInfo{Bundle: b, Signing: string(ca.CertPEM), Phase: "steady", Tag: TrustTag(b, string(ca.CertPEM))})
			select {
			case polled <- struct{}{}:
			default:
			}
		}
	})
	c := newTestClient(t, f.urls())
	ctx, cancel := context.WithCancel(context.Background())
	hints := make(chan string)
	done := make(chan struct{})
	go func() {
		defer close(done)
		FollowIdentity(ctx, c, id, Renewal{Heads: f.urls(), Token: testToken, Name: "agent/m0"}, 10*time.Millisecond, hints, nil)
	}()
	defer func() { cancel(); <-done }()
	wait := func(what string) {
		t.Helper()
		select {
		case <-polled:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: the heads were not asked for the CAs", what)
		}
	}
	// No tag heard yet: it polls every 10 ms.
	wait("the first poll")
	wait("the second poll")
	tag := TrustTag(bundle, string(ca.CertPEM))
	// The tag it followed asks nothing. Once the first hint is taken no round is under
	// way (the follower takes hints between rounds), so the count is final.
	hints <- tag
	asked := f.asked()[1]
	for range 5 {
		hints <- tag
	}
	if got := f.asked()[1]; got != asked {
		t.Fatalf("after hints of the tag it followed: the heads were asked %d times, %d before", got, asked)
	}
	if string(id.TrustPEM()) != bundle {
		t.Fatal("the trust changed without a rotation")
	}
	// A rotation's step: a new tag asks at once, and the trust follows.
	for len(polled) > 0 {
		<-polled // the polls before the hints
	}
	mu.Lock()
	served = both
	mu.Unlock()
	hints <- TrustTag(both, string(ca.CertPEM))
	wait("the hint of a new tag")
	hints <- TrustTag(both, string(ca.CertPEM)) // taken once the round above is done
	if string(id.TrustPEM()) != both {
		t.Fatalf("after the hint of a new tag the identity trusts %d bytes of CAs, want the %d of both", len(id.TrustPEM()), len(both))
	}
	if got := f.asked()[1]; got != asked+1 {
		t.Fatalf("the hint of a new tag asked %d times, want once", got-asked)
	}
}
