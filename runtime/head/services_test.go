package head

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/store/paxos"
)

// waitService watches a service's record in the log until ok holds of it.
func waitService(t *testing.T, c *api.Client, job, name, what string, ok func(api.Service) bool) api.Service {
	t.Helper()
	return waitRecord(t, c, api.ServiceKey(job, name), 20*time.Second, what, ok)
}

// serviceHeads starts three heads on the test's clock, with machine m0 and job j, and
// returns the spec of service j/s: 1 to 3 replicas of one GPU, target in flight per
// replica, cooldowns 1 s up and 10 s down.
func serviceHeads(t *testing.T, target int) (*fakeClock, []*Head, *api.Client, *paxos.MemNetwork, api.ServiceSpec) {
	t.Helper()
	clk := &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	heads, c, net := heads3(t, clk)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := c.RegisterMachine(ctx, machine(t, "m0")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SubmitJob(ctx, api.Job{Name: "j"}); err != nil {
		t.Fatal(err)
	}
	return clk, heads, c, net, api.ServiceSpec{Job: "j", Name: "s", Kind: "k", MinReplicas: 1, MaxReplicas: 3, Resources: api.Resources{GPUs: 1},
		TargetInFlight: target, ScaleUpCooldown: api.Duration(time.Second), ScaleDownCooldown: api.Duration(10 * time.Second)}
}

// TestServiceDecisionsSurviveLeaderChange scales a service up from its replicas' reported
// load, changes the leader, and checks that the new leader holds the committed decision
// (it has no loads yet: it does not scale down for want of reports) and scales it down
// when the replicas report a low load for the cooldown; the replica gangs follow each
// decision. The heads' clock is the test's.
func TestServiceDecisionsSurviveLeaderChange(t *testing.T) {
	clk, heads, c, net, spec := serviceHeads(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := c.SpawnService(ctx, spec); !errors.Is(err, api.ErrExists) && err != nil {
		t.Fatal(err)
	}
	if _, err := c.SpawnService(ctx, spec); !errors.Is(err, api.ErrExists) {
		t.Fatalf("a second service of the name: %v, want ErrExists", err)
	}
	waitGang(t, c, "j", "s.r0", func(g api.Gang) bool { return g.State.Live() && g.Spec.Service == "s" && g.Spec.NotPreemptible })
	report := func(inFlight int) {
		t.Helper()
		if err := c.ReportServiceLoad(ctx, api.ServiceLoad{Job: "j", Service: "s", Replica: 0, InFlight: inFlight}); err != nil {
			t.Fatal(err)
		}
	}
	report(5) // 5 in flight at a target of 2: 3 replicas
	up := waitService(t, c, "j", "s", "scaled up", func(s api.Service) bool { return s.Replicas == 3 })
	if up.ScaleUps != 1 || up.Scaled.IsZero() {
		t.Fatalf("after the scale up: %+v", up)
	}
	for _, r := range []string{"s.r1", "s.r2"} {
		g := waitGang(t, c, "j", r, func(g api.Gang) bool { return g.State.Live() })
		if g.Spec.NotPreemptible {
			t.Fatalf("replica %s above the minimum is not preemptible", r)
		}
	}
	// The dashboard's state shows it, from the log.
	if ds := leader(t, heads).obs.state(); len(ds.Services) != 1 || ds.Services[0].Replicas != 3 || ds.Services[0].ScaleUps != 1 {
		t.Fatalf("the dashboard's services: %+v", ds.Services)
	}
	nl := changeLeader(t, heads, net)
	// The new leader has no reports: it holds the service at 3 for sweeps on end.
	for range 3 {
		ch := nl.Controller().Changed()
		tick := time.NewTimer(3 * 200 * time.Millisecond) // three of its sweeps
		select {
		case <-ch:
		case <-tick.C:
		}
		tick.Stop()
		st, err := c.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Services) != 1 || st.Services[0].Replicas != 3 {
			t.Fatalf("the new leader's services: %+v, want s at 3", st.Services)
		}
	}
	// A low load marks the service low; after the cooldown (and a fresh report) it goes
	// down to its minimum, and the replicas above stop.
	report(0)
	marked := func() bool {
		nl.Controller().svc.mu.Lock()
		defer nl.Controller().svc.mu.Unlock()
		return !nl.Controller().svc.low["j/s"].IsZero()
	}
	poll := time.NewTicker(20 * time.Millisecond) // the mark is the leader's memory: no change to wait on
	defer poll.Stop()
	for !marked() {
		select {
		case <-poll.C:
		case <-ctx.Done():
			t.Fatal("the new leader never marked the load low")
		}
	}
	clk.Advance(11 * time.Second)
	report(0)
	down := waitService(t, c, "j", "s", "scaled down", func(s api.Service) bool { return s.Replicas == 1 })
	if down.ScaleDowns != 1 || down.ScaleUps != 1 {
		t.Fatalf("after the scale down: %+v", down)
	}
	for _, r := range []string{"s.r1", "s.r2"} {
		waitGang(t, c, "j", r, func(g api.Gang) bool { return g.State == api.GangStopped })
	}
	if err := c.StopService(ctx, "j", "s"); err != nil {
		t.Fatal(err)
	}
	waitGang(t, c, "j", "s.r0", func(g api.Gang) bool { return g.State == api.GangStopped })
	if st, err := c.Status(ctx); err != nil || len(st.Services) != 0 {
		t.Fatalf("services after the stop: %+v, %v", st.Services, err)
	}
}

// TestServiceReplicaPreemptsTrainingByNotice: on a machine that a lower-priority training
// gang (of fixed size) fills, a service's replica waits, and the scheduler gives the
// training gang a stop notice for it, with the cost model's estimate: the same path as any
// preemption.
func TestServiceReplicaPreemptsTrainingByNotice(t *testing.T) {
	c := setup(t, 1, api.SchedulerConfig{NoticeGrace: api.Duration(time.Minute)}, "j")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	train := island("j", "train", "")
	train.JustInTime = true
	if _, err := c.SpawnGang(ctx, train); err != nil {
		t.Fatal(err)
	}
	awaitGang(t, c, "j", "train", "placed", placed)
	if _, err := c.SpawnService(ctx, api.ServiceSpec{Job: "j", Name: "s", Kind: "k", MinReplicas: 1, MaxReplicas: 2,
		Resources: api.Resources{GPUs: 1}, Priority: 1}); err != nil {
		t.Fatal(err)
	}
	g := awaitGang(t, c, "j", "train", "given a stop notice", func(g api.Gang) bool { return g.Notice != nil })
	if n := g.Notice; n.Kind != api.NoticePreempt || n.For != "j/s.r0" || n.Deadline.IsZero() || n.Costs == nil {
		t.Fatalf("the training gang's notice %+v: want a preempt notice for j/s.r0 with a deadline and costs", n)
	}
	if r, _, err := c.Gang(ctx, "j", "s.r0"); err != nil || r.State != api.GangPending {
		t.Fatalf("the replica before the training stopped: %+v, %v; want it pending", r, err)
	}
}

// TestServiceScaleDownDrainsReplicas: a replica that a scale down retires is stopped only
// once it reports no call in flight after the decision, or once the drain's bound has
// passed while it still reports some; callers stop choosing it meanwhile (they route below
// Replicas). The heads' clock is the test's.
func TestServiceScaleDownDrainsReplicas(t *testing.T) {
	clk, heads, c, _, spec := serviceHeads(t, 4)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := c.SpawnService(ctx, spec); err != nil {
		t.Fatal(err)
	}
	report := func(replica, inFlight int) {
		t.Helper()
		if err := c.ReportServiceLoad(ctx, api.ServiceLoad{Job: "j", Service: "s", Replica: replica, InFlight: inFlight}); err != nil {
			t.Fatal(err)
		}
	}
	waitGang(t, c, "j", "s.r0", func(g api.Gang) bool { return g.State.Live() })
	report(0, 9) // 9 in flight at a target of 4: 3 replicas
	waitService(t, c, "j", "s", "scaled up", func(s api.Service) bool { return s.Replicas == 3 })
	for _, r := range []string{"s.r1", "s.r2"} {
		waitGang(t, c, "j", r, func(g api.Gang) bool { return g.State.Live() })
	}
	// 2 in flight fits one replica at half the target: after the cooldown, down to 1,
	// with a call in flight on each of the two replicas it retires.
	lead := leader(t, heads).Controller()
	low := func() bool {
		lead.svc.mu.Lock()
		defer lead.svc.mu.Unlock()
		return !lead.svc.low["j/s"].IsZero()
	}
	poll := time.NewTicker(20 * time.Millisecond) // the mark is the leader's memory: no change to wait on
	defer poll.Stop()
	for report(0, 0); !low(); report(0, 0) {
		report(1, 1)
		report(2, 1)
		select {
		case <-poll.C:
		case <-ctx.Done():
			t.Fatal("the leader never marked the load low")
		}
	}
	clk.Advance(11 * time.Second)
	report(0, 0)
	report(1, 1)
	report(2, 1)
	waitService(t, c, "j", "s", "scaled down", func(s api.Service) bool { return s.Replicas == 1 })
	// Past the settle, r2 reports its calls done and stops; r1, still busy, keeps running
	// (the sweep that stopped r2 passed r1 first).
	clk.Advance(serviceDrainSettle + 500*time.Millisecond)
	report(1, 1)
	report(2, 0)
	waitGang(t, c, "j", "s.r2", func(g api.Gang) bool { return g.State == api.GangStopped })
	if g, _, err := c.Gang(ctx, "j", "s.r1"); err != nil || !g.State.Live() {
		t.Fatalf("replica 1, with a call in flight, after the sweep that stopped replica 2: %+v, %v; want it still live", g, err)
	}
	// Busy past the drain's bound (its reports fresh all along), it is stopped anyway.
	for passed := serviceDrainSettle + 500*time.Millisecond; passed < serviceDrain; passed += 2 * time.Second {
		clk.Advance(2 * time.Second)
		report(1, 1)
	}
	waitGang(t, c, "j", "s.r1", func(g api.Gang) bool { return g.State == api.GangStopped })
	if g, _, err := c.Gang(ctx, "j", "s.r0"); err != nil || !g.State.Live() {
		t.Fatalf("replica 0 after the drain: %+v, %v", g, err)
	}
}
