package sdk

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/store/meta"
)

// testFeed is a connection with job j's feed, which has no watch of its own (the test
// delivers), and the feed's context; both end with the test.
func testFeed(t *testing.T) (*conn, *jobFeed, context.Context) {
	c := &conn{log: zap.NewNop()}
	c.init()
	t.Cleanup(c.endLife)
	ctx, stop := context.WithCancel(context.Background())
	t.Cleanup(stop)
	f := &jobFeed{c: c, job: "j", stop: stop, handles: map[string]map[*Gang]bool{}, recs: map[string]meta.KeyValue{},
		workers: map[string]map[string]meta.KeyValue{}}
	c.feeds["j"] = f
	return c, f, ctx
}

// TestJobFeed: one feed serves every handle of a job's gangs: each handle gets its own
// gang's records and workers, a record put twice in one transaction (one revision) ends
// as the later put (with its notice), an older copy never replaces a newer one, a handle
// made after the changes starts from the newest the feed saw, and the job's last handle
// ends the feed.
func TestJobFeed(t *testing.T) {
	c, f, ctx := testFeed(t)
	rec := func(name string, rev int64, g api.Gang) meta.KeyValue {
		g.UID = "u-" + name
		b, err := json.Marshal(g)
		if err != nil {
			t.Fatal(err)
		}
		return meta.KeyValue{Key: api.TableGangs + "j/" + name, Value: b, ModRevision: rev}
	}
	worker := func(name string, rank int, rev int64) meta.KeyValue {
		b, _ := json.Marshal(api.Worker{Job: "j", Gang: name, Rank: rank, GangUID: "u-" + name, Address: "addr"})
		return meta.KeyValue{Key: api.TableWorkers + "j/" + name + "/" + string(rune('0'+rank)), Value: b, ModRevision: rev}
	}
	handle := func(name string) *Gang {
		g := &Gang{c: c, job: "j", name: name, key: "j/" + name, size: 1, rec: api.Gang{UID: "u-" + name}, workers: map[int]api.Worker{},
			workerRevs: map[int]int64{}, changed: make(chan struct{}), gens: map[int]genCtx{}, notices: make(chan Notice, 4)}
		c.attach(g)
		return g
	}
	a1, a2, b := handle("a"), handle("a"), handle("b")
	issued := time.Unix(100, 0)
	f.deliver(api.TableGangs+"j/", false, false, []meta.KeyValue{
		rec("a", 5, api.Gang{State: api.GangRunning}),
		rec("b", 6, api.Gang{State: api.GangStarting}),
		rec("a", 7, api.Gang{State: api.GangRunning, World: &api.World{Epoch: 1}}),
		rec("a", 7, api.Gang{State: api.GangRunning, World: &api.World{Epoch: 1}, Notice: &api.Notice{Kind: api.NoticeShrink, Issued: issued}}),
	}, nil)
	f.deliver(api.TableWorkers+"j/", true, false, []meta.KeyValue{worker("b", 0, 8)}, nil)
	for _, g := range []*Gang{a1, a2} {
		select {
		case n := <-g.notices:
			if n.Kind != NoticeShrink || n.epoch != 1 {
				t.Fatalf("notice %+v, want the shrink of epoch 1", n)
			}
		default:
			t.Fatal("the second put of a's record in one transaction (its notice) did not reach a handle")
		}
	}
	if b.State() != GangStarting || b.Worker(0).IsZero() {
		t.Fatalf("b: %s, worker %v; want starting with its worker 0", b.State(), b.Worker(0))
	}
	f.deliver(api.TableGangs+"j/", false, false, []meta.KeyValue{rec("b", 4, api.Gang{State: api.GangStopped})}, nil)
	if b.State() != GangStarting {
		t.Fatalf("an older record of b (revision 4 after 6) made it %s", b.State())
	}
	late := handle("a")
	if late.rec.World == nil || late.rec.World.Epoch != 1 || late.rec.Notice == nil {
		t.Fatalf("a handle made after the changes starts from %+v, want a's newest record", late.rec)
	}
	for _, g := range []*Gang{a1, a2, b, late} {
		c.detach(g)
	}
	if c.feeds["j"] != nil || ctx.Err() == nil {
		t.Fatal("the job's last handle did not end its feed")
	}
}

// TestServiceRelaysTheFeedsFirstChange: a replica's worker that the job's feed hands its
// new handle at once (the feed already follows the job) wakes the service's waiters, even
// when the handle gets it before the goroutine relaying the handle's changes runs. Each
// round races the two; a lost wake-up leaves AwaitReady waiting for ever.
func TestServiceRelaysTheFeedsFirstChange(t *testing.T) {
	for round := range 200 {
		func() {
			c, f, ctx := testFeed(t)
			rec := api.Gang{UID: "u-r0", State: api.GangRunning, Spec: api.GangSpec{Name: api.ReplicaName("svc", 0), Service: "svc"}}
			b, _ := json.Marshal(api.Worker{Job: "j", Gang: rec.Spec.Name, Rank: 0, GangUID: rec.UID, Address: "addr"})
			f.deliver(api.TableWorkers+"j/", true, false, []meta.KeyValue{{Key: api.TableWorkers + "j/" + rec.Spec.Name + "/0", Value: b, ModRevision: 3}}, nil)
			s := &Service{c: c, job: "j", name: "svc", rec: api.Service{UID: "s", Replicas: 1}, replicas: map[int]*Gang{},
				inflight: map[int]int{}, changed: make(chan struct{})}
			v, _ := json.Marshal(rec)
			s.setReplica(ctx, v)
			wait, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			if err := s.AwaitReady(wait, 1); err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
			s.mu.Lock()
			for _, g := range s.replicas {
				g.stop()
				<-g.done
			}
			s.mu.Unlock()
		}()
	}
}
