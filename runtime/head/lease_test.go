package head

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/store/paxos"
)

// A leader cut off from the others still believes it leads until check-quorum makes it
// step down (up to two election timeouts); its lease runs out sooner. In between, its view
// may be stale (another head may lead already): its controller answers nothing and
// decides nothing.
func TestLeaderWithoutLeaseDecidesNothing(t *testing.T) {
	net := paxos.NewMemNetwork(1)
	dir := t.TempDir()
	var heads []*Head
	for id := uint64(1); id <= 3; id++ {
		h, err := Start(Config{ID: id, Initial: []uint64{1, 2, 3}, Transport: net.Transport(id), DataDir: fmt.Sprintf("%s/h%d", dir, id),
			NoSync: true, Token: testToken, Logger: zaptest.NewLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		heads = append(heads, h)
	}
	t.Cleanup(func() {
		for _, h := range heads {
			_ = h.Close()
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l := leader(t, heads)
	if _, err := l.Controller().RegisterMachine(ctx, machine(t, "m0")); err != nil {
		t.Fatal(err)
	}
	net.Isolate(l.ID())
	for l.Replica().Leading() { // the stale window opens when the lease runs out
		if l.Replica().Status().Role != paxos.Leader {
			t.Fatal("the cut-off leader stepped down before its lease ran out")
		}
		select {
		case <-ctx.Done():
			t.Fatal("the cut-off leader's lease never ran out")
		case <-time.After(5 * time.Millisecond):
		}
	}
	if l.Replica().Status().Role != paxos.Leader {
		t.Skip("the leader stepped down as its lease ran out: no stale window to test this time")
	}
	if _, err := l.Controller().Status(); !errors.Is(err, api.ErrUnavailable) {
		t.Errorf("status from a leader without a lease: %v, want ErrUnavailable", err)
	}
	if err := l.Controller().MachineDown(ctx, "m0", "test"); !errors.Is(err, api.ErrUnavailable) {
		t.Errorf("a decision of a leader without a lease: %v, want ErrUnavailable", err)
	}
	// A load report is refused as unavailable, but it is a heartbeat all the same: the
	// leader does not count that silence against the machine if its lease comes back.
	c := l.Controller()
	heardAt := func() time.Time {
		c.liveMu.Lock()
		defer c.liveMu.Unlock()
		if c.live == nil {
			return time.Time{}
		}
		return c.live.detect.watch("m0").heard
	}
	before := heardAt()
	if before.IsZero() {
		t.Skip("the cut-off leader's term ended before the report: no stale window to test this time")
	}
	if _, err := c.ReportLoad(api.LoadReport{Machine: "m0", Incarnation: 1}); !errors.Is(err, api.ErrUnavailable) {
		t.Errorf("a load report to a leader without a lease: %v, want ErrUnavailable", err)
	}
	if _, err := c.ReportLoad(api.LoadReport{Machine: "nosuch", Incarnation: 1}); !errors.Is(err, api.ErrUnavailable) {
		t.Errorf("a report of a machine it does not know, to a leader without a lease: %v, want ErrUnavailable (never 'register again')", err)
	}
	if after := heardAt(); !after.After(before) {
		t.Errorf("the report to a leader without a lease was not kept as a heartbeat (heard %v, before %v)", after, before)
	}
}
