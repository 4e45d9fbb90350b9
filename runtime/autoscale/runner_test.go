package autoscale

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/atoll-run/atoll/pools"
	"github.com/atoll-run/atoll/pools/provider"
	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/runtime/head"
)

// fakeCtl is a control plane whose view the test sets; it records cordons.
type fakeCtl struct {
	mu      sync.Mutex
	view    head.PoolView
	cordons map[string]bool
	drains  map[string]time.Time // machine -> the deadline its gangs were given
	down    []string             // machines declared dead, in order
}

func (f *fakeCtl) Leading() bool { return true }
func (f *fakeCtl) PoolView() (head.PoolView, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.view, nil
}
func (f *fakeCtl) Drain(_ context.Context, machine string, deadline time.Time, _ string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.drains[machine] = deadline
	f.cordons[machine] = true
	return nil
}
func (f *fakeCtl) MachineDown(_ context.Context, name, _ string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down = append(f.down, name)
	return nil
}
func (f *fakeCtl) Cordon(_ context.Context, name string, on bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cordons[name] = on
	return nil
}

// testRunner is a runner over one pool (poolJSON, a pool file's element) of the sim
// provider and a fake control plane, at the given clock; replicate may be nil.
func testRunner(t *testing.T, poolJSON string, clock func() time.Time, replicate func(context.Context, string, string, string) error) (*Runner, *provider.Sim, *fakeCtl) {
	t.Helper()
	set, err := pools.Parse([]byte(`{"pools": [`+poolJSON+`]}`), "p.json", "")
	if err != nil {
		t.Fatal(err)
	}
	sim := provider.NewSim(clock)
	ctl := &fakeCtl{cordons: map[string]bool{}, drains: map[string]time.Time{}}
	r, err := New(Config{Pools: set, Providers: map[string]Provider{set.Pools[0].Spec.Name: sim}, Clock: clock, Replicate: replicate}, ctl)
	if err != nil {
		t.Fatal(err)
	}
	return r, sim, ctl
}

// h100Pool is an on-demand pool of up to 4 DGX H100 with a 5-minute idle timeout.
const h100Pool = `{"name": "h100", "machine": "dgx-h100", "max": 4, "price_per_hour": 100, "idle_timeout": "5m", "provider": {"type": "sim"}}`

// TestRunnerLifecycle drives the runner through a gang's life: it arrives pending on an
// empty pool (two machines launched together), the machines register, the gang runs and
// ends, the machines idle past the timeout, are cordoned (drained) and terminated.
func TestRunnerLifecycle(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	r, sim, ctl := testRunner(t, h100Pool, clock, nil)
	ctx := context.Background()
	g := api.Gang{Spec: api.GangSpec{Job: "j", Name: "g", Workers: 2, Resources: api.Resources{GPUs: 8}, MaxRestarts: 3}, State: api.GangPending, Created: now}
	ctl.view = head.PoolView{Pending: []api.Gang{g}}
	if err := r.Step(ctx); err != nil {
		t.Fatal(err)
	}
	list, _ := sim.List(ctx)
	if len(list) != 2 {
		t.Fatalf("launched %+v, want two machines for the 16-GPU gang", list)
	}
	st := r.Status()
	if st.Pools[0].Launching != 2 || len(st.Events) != 2 || st.Events[0].Kind != "launch" || !strings.Contains(st.Events[0].Reason, "need 2 machines") {
		t.Fatalf("status %+v", st)
	}
	// Still pending while they launch: nothing more is launched.
	now = now.Add(time.Minute)
	if err := r.Step(ctx); err != nil {
		t.Fatal(err)
	}
	if l, _ := sim.List(ctx); len(l) != 2 {
		t.Fatalf("relaunched: %+v", l)
	}
	// They register; the gang runs on them.
	g.State = api.GangRunning
	var ms []head.PoolMachine
	for _, in := range list {
		ms = append(ms, head.PoolMachine{Name: in.Name, Alive: true, Gangs: map[string]int{"j/g": 1}})
	}
	ctl.view = head.PoolView{Machines: ms, Running: []api.Gang{g}}
	now = now.Add(time.Minute)
	if err := r.Step(ctx); err != nil {
		t.Fatal(err)
	}
	// The gang ends; the machines idle past the timeout.
	for i := range ms {
		ms[i].Gangs = map[string]int{}
	}
	ctl.view = head.PoolView{Machines: ms}
	now = now.Add(time.Minute)
	_ = r.Step(ctx)
	now = now.Add(6 * time.Minute)
	if err := r.Step(ctx); err != nil {
		t.Fatal(err)
	}
	if len(ctl.cordons) != 2 {
		t.Fatalf("cordons %v: want both machines drained", ctl.cordons)
	}
	if l, _ := sim.List(ctx); len(l) != 2 {
		t.Fatalf("terminated in the decision that drained them: %+v", l)
	}
	now = now.Add(time.Second)
	if err := r.Step(ctx); err != nil {
		t.Fatal(err)
	}
	if l, _ := sim.List(ctx); len(l) != 0 {
		t.Fatalf("still running after the drain: %+v", l)
	}
	// A machine terminated is declared dead at once, not when the failure detector
	// notices: clients stop reaching for its agent.
	if len(ctl.down) != 2 {
		t.Fatalf("machines declared down %v: want both terminated ones", ctl.down)
	}
	st = r.Status()
	kinds := map[string]int{}
	for _, e := range st.Events {
		kinds[e.Kind]++
	}
	if kinds["drain"] != 2 || kinds["remove"] != 2 || len(st.Pools[0].Machines) != 0 {
		t.Fatalf("events %+v", st.Events)
	}
	// Two machines from their launch to their removal (9m1s) at 100 USD/h.
	if c := st.Pools[0].CostUSD; c < 30.05 || c > 30.07 {
		t.Fatalf("cost so far %.2f, want 30.06", c)
	}
}

// TestSpotInterruptionDrainsItsGangs: a spot interruption notice gives the gangs on the
// machine the drain notice (checkpoint, stop, resume elsewhere) due before the machine goes.
func TestSpotInterruptionDrainsItsGangs(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	r, sim, ctl := testRunner(t, `{"name": "spot", "machine": "dgx-h100", "max": 2, "price_per_hour": 30, "capacity": "spot",
		"provider": {"type": "sim"}}`, clock, nil)
	ctx := context.Background()
	g := api.Gang{Spec: api.GangSpec{Job: "j", Name: "g", Workers: 1, Resources: api.Resources{GPUs: 8}, MaxRestarts: 3}, State: api.GangPending, Created: now}
	ctl.view = head.PoolView{Pending: []api.Gang{g}}
	if err := r.Step(ctx); err != nil {
		t.Fatal(err)
	}
	list, _ := sim.List(ctx)
	if len(list) != 1 {
		t.Fatalf("launched %+v, want one spot machine", list)
	}
	g.State = api.GangRunning
	ctl.view = head.PoolView{Machines: []head.PoolMachine{{Name: list[0].Name, Alive: true, Gangs: map[string]int{"j/g": 1}}}, Running: []api.Gang{g}}
	now = now.Add(time.Minute)
	if err := r.Step(ctx); err != nil {
		t.Fatal(err)
	}
	if len(ctl.drains) != 0 {
		t.Fatalf("drained %v before any notice", ctl.drains)
	}
	if err := sim.Interrupt(list[0].Name, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	now = now.Add(time.Second)
	if err := r.Step(ctx); err != nil {
		t.Fatal(err)
	}
	dl, ok := ctl.drains[list[0].Name]
	if !ok || dl.IsZero() || !dl.After(now.Add(-time.Second)) || !dl.Before(now.Add(2*time.Minute)) {
		t.Fatalf("drains %v: want %s drained with a deadline before it goes at %s", ctl.drains, list[0].Name, now.Add(2*time.Minute))
	}
}

// TestDrainMovesLastCopiesFirst: a machine idle past its timeout is drained; the objects
// whose only copy it holds are copied to a machine that stays (once each, while a copy is
// in flight), and only when none is left is the machine removed.
func TestDrainMovesLastCopiesFirst(t *testing.T) {
	var mu sync.Mutex // the copies run beside the test: the clock is shared
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	type call struct{ api, id, holder string }
	calls := make(chan call, 16)
	release := make(chan error)
	replicate := func(_ context.Context, agentAPI, id, holder string) error {
		calls <- call{agentAPI, id, holder}
		return <-release
	}
	r, sim, ctl := testRunner(t, h100Pool, clock, replicate)
	ctx := context.Background()
	g := api.Gang{Spec: api.GangSpec{Job: "j", Name: "g", Workers: 2, Resources: api.Resources{GPUs: 8}, MaxRestarts: 3}, State: api.GangPending, Created: clock()}
	ctl.view = head.PoolView{Pending: []api.Gang{g}}
	if err := r.Step(ctx); err != nil {
		t.Fatal(err)
	}
	list, _ := sim.List(ctx)
	if len(list) != 2 {
		t.Fatalf("launched %+v", list)
	}
	a, b := list[0].Name, list[1].Name
	// A keeps the last copy of an object; B runs another gang and stays.
	keep := api.Gang{Spec: api.GangSpec{Job: "k", Name: "g", Workers: 1, Resources: api.Resources{GPUs: 8}}, State: api.GangRunning, Created: clock()}
	view := func(copies int) head.PoolView {
		ma := head.PoolMachine{Name: a, Alive: true, Gangs: map[string]int{}, AgentAPI: "https://a", Cordoned: ctl.cordons[a], LastCopies: copies}
		if copies > 0 {
			ma.LastCopyObjects = []head.ObjectCopy{{ID: "obj-1", Owner: "ckpt/j/g"}}
		}
		return head.PoolView{Machines: []head.PoolMachine{ma, {Name: b, Alive: true, Gangs: map[string]int{"k/g": 1}, AgentAPI: "https://b"}}, Running: []api.Gang{keep}}
	}
	ctl.view = view(1)
	advance(time.Minute)
	_ = r.Step(ctx)
	advance(6 * time.Minute)
	ctl.view = view(1)
	if err := r.Step(ctx); err != nil {
		t.Fatal(err)
	}
	if !ctl.cordons[a] || ctl.cordons[b] {
		t.Fatalf("cordons %v: want %s drained, %s kept", ctl.cordons, a, b)
	}
	ctl.view = view(1)
	advance(time.Second)
	if err := r.Step(ctx); err != nil {
		t.Fatal(err)
	}
	c := <-calls
	if c != (call{"https://b", "obj-1", "ckpt/j/g"}) {
		t.Fatalf("replicate %+v: want obj-1 for its owner onto %s", c, b)
	}
	// While the copy is in flight: not asked again, and the machine stays.
	advance(time.Second)
	if err := r.Step(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case c := <-calls:
		t.Fatalf("a second copy of an object in flight: %+v", c)
	default:
	}
	if l, _ := sim.List(ctx); len(l) != 2 {
		t.Fatalf("removed with a last copy on it: %+v", l)
	}
	release <- nil
	for moved := false; !moved; { // the copy reports itself when it returns
		for _, e := range r.Status().Events {
			moved = moved || e.Kind == "move"
		}
		if !moved {
			time.Sleep(time.Millisecond)
		}
	}
	// The directory now has two locations: the machine goes.
	ctl.view = view(0)
	advance(time.Second)
	if err := r.Step(ctx); err != nil {
		t.Fatal(err)
	}
	advance(time.Second)
	if err := r.Step(ctx); err != nil {
		t.Fatal(err)
	}
	l, _ := sim.List(ctx)
	if len(l) != 1 || l[0].Name != b {
		t.Fatalf("machines %+v: want only %s", l, b)
	}
	kinds := map[string]int{}
	for _, e := range r.Status().Events {
		kinds[e.Kind]++
	}
	if kinds["move"] != 1 || kinds["remove"] != 1 {
		t.Fatalf("events %+v", r.Status().Events)
	}
}
