package head

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/atoll-run/atoll/gang"
	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/store/meta"
	"github.com/atoll-run/atoll/store/paxos"
)

// These tests change the leader in the middle of things (the in-process heads of the other
// tests, on real Paxos with its WAL, the leader cut off from the others until they elect
// another) and check that the new leader decides as the old one would have.

// fakeClock is the heads' clock: it moves only when the test moves it, so that two runs of
// a scenario see the same times.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// heads3 starts three heads on an in-memory network the test can cut, with the clock.
func heads3(t *testing.T, clk *fakeClock) ([]*Head, *api.Client, *paxos.MemNetwork) {
	t.Helper()
	net := paxos.NewMemNetwork(1)
	var heads []*Head
	var urls []string
	dir := t.TempDir()
	for id := uint64(1); id <= 3; id++ {
		cc := ControllerConfig{Clock: clk.Now, HeartbeatTimeout: time.Hour}
		h, err := Start(Config{ID: id, Initial: []uint64{1, 2, 3}, Transport: net.Transport(id), DataDir: fmt.Sprintf("%s/h%d", dir, id),
			NoSync: true, Token: testToken, Logger: zaptest.NewLogger(t), Controller: cc})
		if err != nil {
			t.Fatal(err)
		}
		heads = append(heads, h)
		urls = append(urls, h.Address())
	}
	t.Cleanup(func() {
		for _, h := range heads {
			_ = h.Close()
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := api.NewClient(ctx, api.ClientConfig{Heads: urls, Token: string(testToken)})
	if err != nil {
		t.Fatal(err)
	}
	return heads, c, net
}

// heads3WithJob is heads3 on a fake clock with machines m0 and m1 registered and job j
// submitted; the context ends with the test, a minute at most.
func heads3WithJob(t *testing.T) ([]*Head, *api.Client, *paxos.MemNetwork, context.Context) {
	t.Helper()
	clk := &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	heads, c, net := heads3(t, clk)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	for _, n := range []string{"m0", "m1"} {
		if _, err := c.RegisterMachine(ctx, machine(t, n)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.SubmitJob(ctx, api.Job{Name: "j"}); err != nil {
		t.Fatal(err)
	}
	return heads, c, net, ctx
}

// awaitHeads waits, on the controllers' change notifications, until ok holds of the heads.
func awaitHeads(t *testing.T, heads []*Head, what string, ok func() bool) {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		cases := []reflect.SelectCase{{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(deadline)}}
		for _, h := range heads {
			cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(h.Controller().Changed())})
		}
		if ok() {
			return
		}
		if i, _, _ := reflect.Select(cases); i == 0 {
			t.Fatalf("never %s", what)
		}
	}
}

// leading returns the head whose controller leads, or nil.
func leading(heads []*Head) *Head {
	for _, h := range heads {
		if h.Controller().Leading() {
			return h
		}
	}
	return nil
}

// changeLeader cuts the leader off until another head leads, then lets it back as a
// follower; it returns the new leader.
func changeLeader(t *testing.T, heads []*Head, net *paxos.MemNetwork) *Head {
	t.Helper()
	var old *Head
	awaitHeads(t, heads, "a head leads", func() bool { old = leading(heads); return old != nil })
	net.Isolate(old.ID())
	var nl *Head
	awaitHeads(t, heads, "another head leads", func() bool {
		for _, h := range heads {
			if h != old && h.Controller().Leading() {
				nl = h
				return true
			}
		}
		return false
	})
	net.Heal()
	awaitHeads(t, heads, "the old leader steps down", func() bool { return !old.Controller().Leading() })
	return nl
}

// queueScenario fills three machines past their capacity with gangs of two queues, then
// ends the placed gangs one at a time, oldest first; it returns, step by step, which gangs
// were placed where. flips lists the steps before which the leader changes.
func queueScenario(t *testing.T, flips ...int) []string {
	clk := &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	heads, c, net := heads3(t, clk)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, n := range []string{"m0", "m1", "m2"} {
		if _, err := c.RegisterMachine(ctx, machine(t, n)); err != nil {
			t.Fatal(err)
		}
	}
	conf := api.SchedulerConfig{Queues: []api.QueueSpec{{Name: "a", Weight: 2}, {Name: "b", Weight: 1}}, DefaultQueue: "a",
		PriorityClasses:     []api.PriorityClass{{Name: "low", Value: 0, Default: true}, {Name: "high", Value: 1}},
		MinRunBeforePreempt: api.Duration(24 * time.Hour)} // a queue, not preemption
	if _, err := c.SetSchedulerConfig(ctx, conf); err != nil {
		t.Fatal(err)
	}
	for _, j := range []string{"ja", "jb"} {
		if _, err := c.SubmitJob(ctx, api.Job{Name: j}); err != nil {
			t.Fatal(err)
		}
	}
	// Many gangs of one shape, duration and class in each queue: among them the order is
	// the submission order alone.
	shapes := []struct{ workers, gpus int }{{1, 4}, {1, 4}, {2, 2}, {1, 4}, {1, 8}, {2, 2}, {1, 4}, {1, 4}, {2, 2}, {1, 4}, {2, 4}, {2, 2},
		{1, 4}, {1, 4}, {2, 2}, {1, 4}, {1, 4}, {2, 2}, {1, 4}, {1, 4}}
	for i, sh := range shapes {
		job, queue, class := "ja", "a", ""
		if sh.workers == 2 && sh.gpus == 2 {
			job, queue = "jb", "b"
		}
		if i == 10 {
			class = "high"
		}
		// Names out of submission order: the order is the log's sequence, not the keys'.
		spec := api.GangSpec{Job: job, Name: fmt.Sprintf("g%02d", (i*7+3)%len(shapes)), Kind: "k", Workers: sh.workers, Resources: api.Resources{GPUs: sh.gpus},
			Queue: queue, PriorityClass: class, Duration: api.Duration(30 * time.Minute)}
		if _, err := c.SpawnGang(ctx, spec); err != nil {
			t.Fatal(err)
		}
		clk.Advance(time.Second)
	}
	var trace []string
	seen := map[string]bool{}
	var placedOrder []string
	record := func(step int) {
		st, err := c.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var lines []string
		for _, gs := range st.Gangs {
			key := gs.Job + "/" + gs.Name
			if seen[key] || gs.State != api.GangStarting {
				continue
			}
			g, _, err := c.Gang(ctx, gs.Job, gs.Name)
			if err != nil {
				t.Fatal(err)
			}
			var where []string
			for _, m := range g.Placement.Members {
				where = append(where, fmt.Sprintf("%s%v", m.Machine, m.GPUs))
			}
			seen[key] = true
			placedOrder = append(placedOrder, key)
			lines = append(lines, fmt.Sprintf("%s seq %d on %s", key, g.Sched.Seq, strings.Join(where, " ")))
		}
		sort.Strings(lines)
		trace = append(trace, fmt.Sprintf("step %d: %s", step, strings.Join(lines, "; ")))
	}
	record(0)
	ended := 0
	for step := 1; ended < len(placedOrder) || step == 1; step++ {
		for _, f := range flips {
			if f == step {
				changeLeader(t, heads, net)
				st, err := c.Status(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if st.Term < 2 {
					t.Fatalf("term %d after a change of leader", st.Term)
				}
			}
		}
		if ended >= len(placedOrder) {
			break
		}
		key := placedOrder[ended]
		ended++
		job, name, _ := strings.Cut(key, "/")
		clk.Advance(time.Minute)
		if err := c.StopGang(ctx, job, name); err != nil {
			t.Fatal(err)
		}
		record(step)
	}
	if len(placedOrder) != len(shapes) {
		t.Fatalf("only %d of %d gangs were ever placed:\n%s", len(placedOrder), len(shapes), strings.Join(trace, "\n"))
	}
	return trace
}

// TestLeaderChangesKeepQueueOrderAndPlacements: with a queue of gangs of two queues and
// two priority classes waiting on a full cluster, gangs start in the same order and on
// the same cards when the leader changes in the middle of the queue (three times) as when it
// does not: the new leader restores each gang's submission sequence, aging inputs and
// attained service from the log.
func TestLeaderChangesKeepQueueOrderAndPlacements(t *testing.T) {
	want := queueScenario(t)
	got := queueScenario(t, 2, 5, 9)
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("placements with leader changes before steps 2, 5 and 9:\n%s\n\nwithout:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestMachineLossOnFullClusterWaits: a gang that holds the whole cluster loses a machine;
// what is left can never hold it, yet it is not failed: it waits in its queue with its
// reason, and runs again when the machine comes back.
func TestMachineLossOnFullClusterWaits(t *testing.T) {
	heads, c := group(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, n := range []string{"m0", "m1"} {
		if _, err := c.RegisterMachine(ctx, machine(t, n)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.SubmitJob(ctx, api.Job{Name: "j"}); err != nil {
		t.Fatal(err)
	}
	g, err := c.SpawnGang(ctx, api.GangSpec{Job: "j", Name: "all", Kind: "k", Workers: 2, Resources: api.Resources{GPUs: 8}})
	if err != nil || g.State != api.GangStarting {
		t.Fatalf("the gang over the whole cluster: %+v, %v", g, err)
	}
	if err := leader(t, heads).Controller().MachineDown(ctx, "m1", "test: its agent failed"); err != nil {
		t.Fatal(err)
	}
	g = waitGang(t, c, "j", "all", func(g api.Gang) bool { return g.Generation == 1 })
	if g.State != api.GangPending || !strings.Contains(g.Reason, "m1") || g.Placement != nil {
		t.Fatalf("after losing m1 the gang is %s (%q): want it waiting in its queue, naming m1", g.State, g.Reason)
	}
	st, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Gangs) != 1 || st.Gangs[0].State != api.GangPending || !strings.Contains(st.Gangs[0].Reason, "GPU") {
		t.Fatalf("status %+v: want the gang pending, waiting for GPUs", st.Gangs)
	}
	if _, err := c.RegisterMachine(ctx, machine(t, "m1")); err != nil {
		t.Fatal(err)
	}
	g = waitGang(t, c, "j", "all", func(g api.Gang) bool { return g.State == api.GangStarting })
	if g.Generation != 1 || len(g.Placement.Machines) != 2 {
		t.Fatalf("after m1 came back: %+v", g)
	}
}

// TestDrainSurvivesLeaderChanges: an operator's drain is in the log: after two changes of
// leader the machine is still cordoned (with who and why), nothing lands on it, the
// status shows it and the term counted both changes; undrain lifts it and gangs land on
// it again.
func TestDrainSurvivesLeaderChanges(t *testing.T) {
	heads, c, net, ctx := heads3WithJob(t)
	if err := c.Drain(ctx, api.DrainRequest{Machine: "m0", Reason: "bad fan", By: "alice"}); err != nil {
		t.Fatal(err)
	}
	before, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	changeLeader(t, heads, net)
	changeLeader(t, heads, net)
	var raw map[string]any
	if err := c.Do(ctx, "GET", "/v1/cluster", nil, &raw); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(raw)
	var st struct {
		Term     int64 `json:"term"`
		Machines []struct {
			Name     string  `json:"name"`
			Cordoned *bool   `json:"cordoned"`
			Reason   *string `json:"cordon_reason"`
			By       string  `json:"cordoned_by"`
		} `json:"machines"`
	}
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	if st.Term < before.Term+2 {
		t.Fatalf("term %d after two changes of leader from %d", st.Term, before.Term)
	}
	for _, m := range st.Machines {
		if m.Cordoned == nil || m.Reason == nil {
			t.Fatalf("machine %s in the status without cordoned or cordon_reason:\n%s", m.Name, b)
		}
		want := m.Name == "m0"
		if *m.Cordoned != want || (want && (*m.Reason != "bad fan" || !strings.Contains(m.By, "alice"))) {
			t.Fatalf("after two changes of leader machine %s cordoned %v (%q by %q)", m.Name, *m.Cordoned, *m.Reason, m.By)
		}
	}
	g, err := c.SpawnGang(ctx, api.GangSpec{Job: "j", Name: "a", Kind: "k", Workers: 1, Resources: api.Resources{GPUs: 8}})
	if err != nil || g.State != api.GangStarting || g.Placement.Machines[0] != "m1" {
		t.Fatalf("a gang while m0 is drained: %+v, %v; want it on m1", g, err)
	}
	g, err = c.SpawnGang(ctx, api.GangSpec{Job: "j", Name: "b", Kind: "k", Workers: 1, Resources: api.Resources{GPUs: 8}})
	if err != nil || g.State != api.GangPending {
		t.Fatalf("a second gang while m0 is drained: %+v, %v; want it waiting", g, err)
	}
	if err := c.Undrain(ctx, api.UndrainRequest{Machine: "m0", By: "bob"}); err != nil {
		t.Fatal(err)
	}
	g = waitGang(t, c, "j", "b", func(g api.Gang) bool { return g.State == api.GangStarting })
	if g.Placement.Machines[0] != "m0" {
		t.Fatalf("after undrain: %+v, want it on m0", g.Placement)
	}
	after, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range after.Machines {
		if m.Cordoned {
			t.Fatalf("machine %s still cordoned after undrain", m.Name)
		}
	}
	if err := c.Undrain(ctx, api.UndrainRequest{Machine: "nosuch"}); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("undrain of an unknown machine: %v", err)
	}
}

// TestRefusedCommitIsADelta: a record the leader's decision read changes under it (an
// admin's raw write): the log refuses the decision, the leader reads that record back and
// gives it to the scheduler, and goes on in the same term.
func TestRefusedCommitIsADelta(t *testing.T) {
	heads, c := group(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.RegisterMachine(ctx, machine(t, "m0")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SubmitJob(ctx, api.Job{Name: "j"}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"a", "b"} {
		if _, err := c.SpawnGang(ctx, api.GangSpec{Job: "j", Name: n, Kind: "k", Workers: 1, Resources: api.Resources{GPUs: 8}}); err != nil {
			t.Fatal(err)
		}
	}
	ctl := leader(t, heads).Controller()
	term := ctl.Term()
	// An admin rewrites a's record (same content, new version) behind the leader's back.
	kv, ok, err := c.Meta().Get(ctx, api.TableGangs+"j/a")
	if err != nil || !ok {
		t.Fatalf("get j/a: %v %v", ok, err)
	}
	if _, err := c.Meta().Put(ctx, api.TableGangs+"j/a", kv.Value); err != nil {
		t.Fatal(err)
	}
	if err := ctl.StopGang(ctx, "j", "a"); !errors.Is(err, errConflict) {
		t.Fatalf("a stop decided on a stale record: %v, want it refused", err)
	}
	if !ctl.Leading() || ctl.Term() != term {
		t.Fatalf("after the refused commit: leading %v, term %d (was %d): want the same term", ctl.Leading(), ctl.Term(), term)
	}
	// Read back: the stop goes through now, and b takes the machine.
	if err := ctl.StopGang(ctx, "j", "a"); err != nil {
		t.Fatal(err)
	}
	waitGang(t, c, "j", "b", func(g api.Gang) bool { return g.State == api.GangStarting })
	if ctl.Term() != term {
		t.Fatalf("term %d after the read back, was %d", ctl.Term(), term)
	}
}

// TestLearnedCostsSurviveLeaderChange: restart costs measured on the leader are committed
// per GPU model, the measurements of a moment in one commit, and a new leader estimates
// them as the old one did.
func TestLearnedCostsSurviveLeaderChange(t *testing.T) {
	clk := &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	heads, c, net := heads3(t, clk)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := c.RegisterMachine(ctx, machine(t, "m0")); err != nil {
		t.Fatal(err)
	}
	const model = "H100 (test)"
	for _, d := range []time.Duration{300, 500, 400} {
		if err := c.ReportCost(ctx, api.CostReport{Kind: "cuda_context", GPUModel: model, Ranks: 8, Measured: api.Duration(d * time.Millisecond)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.ReportCost(ctx, api.CostReport{Kind: "communicator", GPUModel: model, Ranks: 16, Measured: api.Duration(9 * time.Second)}); err != nil {
		t.Fatal(err)
	}
	estimates := func(h *Head) [2]time.Duration {
		ctl := h.Controller()
		ctl.mu.Lock()
		defer ctl.mu.Unlock()
		if ctl.t == nil || ctl.t.sched == nil {
			t.Fatalf("head %d has no scheduler", h.ID())
		}
		cm := ctl.t.sched.Costs()
		return [2]time.Duration{cm.Estimate(model, 8, gang.CostCUDAContext), cm.Estimate(model, 64, gang.CostCommunicator)}
	}
	want := estimates(leader(t, heads))
	if def := gang.DefaultCostModel(); want[0] == def.Estimate(model, 8, gang.CostCUDAContext) || want[1] == def.Estimate(model, 64, gang.CostCommunicator) {
		t.Fatalf("the measurements taught the leader nothing: %v", want)
	}
	// Committed once, for the four measurements.
	found := errors.New("found")
	var ver int64
	err := c.Watch(ctx, api.CostsPrefix, func(reset bool, l api.Listing, evs []meta.Event) error {
		for _, kv := range l.KVs {
			ver = kv.Version
			return found
		}
		for _, ev := range evs {
			ver = ev.KV.Version
			return found
		}
		return nil
	})
	if !errors.Is(err, found) || ver != 1 {
		t.Fatalf("the learned costs in the log: version %d, %v; want one commit", ver, err)
	}
	nl := changeLeader(t, heads, net)
	if got := estimates(nl); got != want {
		t.Fatalf("the new leader estimates %v, the old one %v", got, want)
	}
}

// TestTakeOfficeWithAStaleTermRecord: a new leader commits its term without a read
// barrier first, guarded by the term record's version as its own replica last applied it.
// When that view is stale (here a hook commits another term record just before), the
// guard refuses the commit, and the head reads the log and takes the next term after the
// one it had not seen, in the same takeover (a takeover started again would run the hook
// a second time).
func TestTakeOfficeWithAStaleTermRecord(t *testing.T) {
	clk := &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	heads, _, net := heads3(t, clk)
	var old *Head
	awaitHeads(t, heads, "a head leads", func() bool { old = leading(heads); return old != nil })

	var mu sync.Mutex
	var hooked []int64 // the term the hook wrote, at each call
	hook := func(c *Controller) {
		if c == old.Controller() {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if len(hooked) > 0 { // a second attempt from scratch: counted, nothing written
			hooked = append(hooked, 0)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		// The hook's own view must be current (the takeover's need not be: that is the
		// case under test), or its commit would be refused as the takeover's is.
		if err := c.rep.Read(ctx); err != nil {
			t.Errorf("the hook's read: %v", err)
			return
		}
		kv, ok := c.sm.Get(api.TermKey)
		if !ok {
			t.Error("no term record before a takeover")
			return
		}
		var prev api.ControlTerm
		if err := json.Unmarshal(kv.Value, &prev); err != nil {
			t.Error(err)
			return
		}
		if err := c.logw.commit(ctx, []meta.Compare{{Key: api.TermKey, Version: kv.Version}},
			[]meta.Op{putJSON(api.TermKey, api.ControlTerm{Term: prev.Term + 1, Leader: 99, Since: clk.Now()})}); err != nil {
			t.Errorf("the hook's term record: %v", err)
			return
		}
		hooked = append(hooked, prev.Term+1)
	}
	termCommitHook.Store(&hook)
	t.Cleanup(func() { termCommitHook.Store(nil) })

	nl := changeLeader(t, heads, net)
	term := func() api.ControlTerm {
		var cur api.ControlTerm
		if kv, ok := nl.Controller().sm.Get(api.TermKey); ok {
			_ = json.Unmarshal(kv.Value, &cur)
		}
		return cur
	}
	awaitHeads(t, heads, "the new leader takes office", func() bool { return term().Leader == nl.ID() })
	mu.Lock()
	defer mu.Unlock()
	if len(hooked) != 1 {
		t.Fatalf("the takeover ran the hook %d times, want once (%v): it was started again", len(hooked), hooked)
	}
	if got := term().Term; got != hooked[0]+1 {
		t.Fatalf("the new leader took term %d, want %d: the one after the record it had not seen", got, hooked[0]+1)
	}
}
