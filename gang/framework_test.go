package gang

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
)

// reverseSort is an out-of-tree QueueSort: latest arrival first.
type reverseSort struct{}

func (reverseSort) Name() string               { return "reverse" }
func (reverseSort) Less(a, b *QueuedGang) bool { return a.Seq > b.Seq }

// avoidNode is an out-of-tree Filter: never node 0.
type avoidNode struct{}

func (avoidNode) Name() string { return "avoid-n0" }
func (avoidNode) Filter(_ *CycleState, _ *QueuedGang, _ *Candidate, i int, _ *Node) *Status {
	if i == 0 {
		return NewStatus(Unschedulable, WaitFragmented, "node 0 is avoided")
	}
	return nil
}

func TestRegistry(t *testing.T) {
	r := InTreeRegistry()
	if err := r.Register(PluginPreemption, func(Handle) (Plugin, error) { return preemption{}, nil }); !errors.Is(err, ErrDuplicatePlugin) {
		t.Fatalf("duplicate register: %v", err)
	}
	if err := r.Register("", nil); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("empty register: %v", err)
	}
	if err := r.Merge(Registry{"reverse": func(Handle) (Plugin, error) { return reverseSort{}, nil }}); err != nil {
		t.Fatal(err)
	}
	if err := r.Merge(Registry{"reverse": func(Handle) (Plugin, error) { return reverseSort{}, nil }}); !errors.Is(err, ErrDuplicatePlugin) {
		t.Fatalf("duplicate merge: %v", err)
	}
	// Two registries are independent values: nothing is global.
	if _, ok := InTreeRegistry()["reverse"]; ok {
		t.Fatal("a merge leaked into a fresh in-tree registry")
	}
	tests := []struct {
		name    string
		plugins Plugins
		reg     Registry
		want    error
		saying  string
	}{
		{"unknown queue sort", Plugins{QueueSort: "nosuch"}, nil, ErrUnknownPlugin, `QueueSort plugin "nosuch"`},
		{"not a permit plugin", Plugins{Permit: []string{PluginBinpack}}, nil, ErrInvalidConfig, `"binpack" is not a Permit plugin`},
		{"out-of-tree name taken", Plugins{}, Registry{PluginFIFO: func(Handle) (Plugin, error) { return fifoSort{}, nil }}, ErrDuplicatePlugin, `"fifo"`},
		{"factory fails", Plugins{QueueSort: "broken"}, Registry{"broken": func(Handle) (Plugin, error) { return nil, errors.New("no") }}, nil, `build QueueSort plugin "broken": no`},
		{"score listed twice", Plugins{Score: []ScoreWeight{{PluginTopology, 1}}}, nil, ErrInvalidConfig, "listed twice"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Plugins = tt.plugins
			_, err := New(cfg, testSnapshot(1, 8, 1), WithRegistry(tt.reg))
			if err == nil || (tt.want != nil && !errors.Is(err, tt.want)) || !strings.Contains(err.Error(), tt.saying) {
				t.Fatalf("err %v, want %v saying %q", err, tt.want, tt.saying)
			}
		})
	}
}

// TestOutOfTreePlugins: registered plugins take part in the cycle at their points.
func TestOutOfTreePlugins(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Plugins = Plugins{QueueSort: "reverse", Filter: []string{"avoid-n0"}}
	reg := Registry{
		"reverse":  func(Handle) (Plugin, error) { return reverseSort{}, nil },
		"avoid-n0": func(Handle) (Plugin, error) { return avoidNode{}, nil },
	}
	s, err := New(cfg, testSnapshot(2, 8, 2), WithRegistry(reg))
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"first", "second"} {
		if _, err := s.Submit(Request{ID: id, Min: 1, Member: Member{GPUs: 8}}, epoch); err != nil {
			t.Fatal(err)
		}
	}
	d := s.Cycle(epoch)
	// Latest first, and never node 0: "second" takes n1, "first" has nowhere to go.
	if len(d.Placements) != 1 || d.Placements[0].Gang != "second" || d.Placements[0].Members[0].NodeName != "n1" {
		t.Fatalf("placements %+v, want second on n1", d.Placements)
	}
	if len(d.Waiting) != 1 || d.Waiting[0].Gang != "first" || d.Waiting[0].Kind != WaitFragmented {
		t.Fatalf("waiting %+v, want first (fragmented)", d.Waiting)
	}
}

func TestCostModelLearns(t *testing.T) {
	m := DefaultCostModel()
	if got := m.Estimate("H100", 8, CostCommunicator); got != 2*time.Second+8*36*time.Millisecond {
		t.Fatalf("default communicator for 8 ranks %s", got)
	}
	if got := m.Estimate("H100", 1, CostCommunicator); got != 0 {
		t.Fatalf("one rank needs no communicator, got %s", got)
	}
	if got := m.Estimate("H100", 8, CostCUDAContext); got != time.Second {
		t.Fatalf("default CUDA context %s", got)
	}
	// 8 ranks measured at twice the default: the factor is 2, for every size.
	if err := m.Observe("H100", 8, CostCommunicator, 2*(2*time.Second+288*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if got, want := m.Estimate("H100", 512, CostCommunicator), 2*(2*time.Second+512*36*time.Millisecond); got != want {
		t.Fatalf("512 ranks after one 8-rank measurement: %s, want %s", got, want)
	}
	// The next measurement (at the default) moves the factor by Alpha: 2 → 1.7.
	if err := m.Observe("H100", 8, CostCommunicator, 2*time.Second+288*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if got, want := m.Estimate("H100", 8, CostCommunicator), time.Duration(1.7*float64(2*time.Second+288*time.Millisecond)); got < want-time.Millisecond || got > want+time.Millisecond {
		t.Fatalf("after two measurements: %s, want %s", got, want)
	}
	if m.Observations("H100", CostCommunicator) != 2 || m.Observations("A100", CostCommunicator) != 0 {
		t.Fatal("observations counted per model")
	}
	// Another model keeps the default.
	if got := m.Estimate("A100", 8, CostCommunicator); got != 2*time.Second+288*time.Millisecond {
		t.Fatalf("A100 estimate moved: %s", got)
	}
	for _, bad := range []struct {
		ranks int
		kind  CostKind
		d     time.Duration
	}{{0, CostCUDAContext, time.Second}, {8, CostCUDAContext, -time.Second}, {8, CostCUDAContext, 2 * time.Hour}, {8, CostKind(99), time.Second}} {
		if err := m.Observe("H100", bad.ranks, bad.kind, bad.d); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("Observe(%d, %v, %s): %v, want ErrInvalidRequest", bad.ranks, bad.kind, bad.d, err)
		}
	}
	if _, err := New(DefaultConfig(), testSnapshot(1, 8, 1), WithCostModel(&CostModel{Alpha: 2})); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("Alpha 2 accepted: %v", err)
	}
}

// TestCUDACostDecidesVictim: two victims alike but for their GPU model; a measured CUDA
// context re-creation of 60 s on one model makes the other the victim.
func TestCUDACostDecidesVictim(t *testing.T) {
	snap := testSnapshot(2, 8, 2)
	for i := range snap.Nodes[0].GPUs {
		snap.Nodes[0].GPUs[i].Model = "slow"
	}
	for _, measured := range []string{"slow", "H100"} {
		cfg := DefaultConfig()
		cfg.Backfill = false
		s, err := New(cfg, snap)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.ObserveCost(measured, 8, CostCUDAContext, time.Minute); err != nil {
			t.Fatal(err)
		}
		for _, id := range []string{"a", "b"} {
			if _, err := s.Submit(Request{ID: id, Min: 1, Member: Member{GPUs: 8}, Checkpoint: Checkpoint{JustInTime: true, Save: 10 * time.Second}}, epoch); err != nil {
				t.Fatal(err)
			}
		}
		d := s.Cycle(epoch)
		onSlow := map[string]bool{}
		for _, p := range d.Placements {
			onSlow[p.Gang] = p.Members[0].NodeName == "n0"
		}
		now := epoch.Add(time.Hour)
		if _, err := s.Submit(Request{ID: "hi", Priority: 2, Min: 1, Member: Member{GPUs: 8}}, now); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 5; i++ {
			if d = s.Cycle(now); len(d.Preemptions) > 0 || d.NextCycle.IsZero() {
				break
			}
			now = d.NextCycle
		}
		if len(d.Preemptions) != 1 {
			t.Fatalf("measured %s: preemptions %+v", measured, d.Preemptions)
		}
		v := d.Preemptions[0]
		if onSlow[v.Victim] == (measured == "slow") {
			t.Fatalf("measured 60 s on %s, yet the victim %s runs there (costs %+v)", measured, v.Victim, v.Costs)
		}
		if v.Costs.CUDAContext != time.Second || v.Costs.Save != 10*time.Second || v.Costs.GPUs != 8 {
			t.Fatalf("victim costs %+v: want the default 1 s CUDA context, the 10 s save, 8 GPUs", v.Costs)
		}
	}
}

// TestGangStatusWaits: the time a gang waits is split by reason, and its latest reason is
// reported with the numbers.
func TestGangStatusWaits(t *testing.T) {
	s, err := New(DefaultConfig(), testSnapshot(1, 8, 1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Submit(Request{ID: "run", Min: 1, Member: Member{GPUs: 8}, NotPreemptible: true}, epoch); err != nil {
		t.Fatal(err)
	}
	s.Cycle(epoch)
	if _, err := s.Submit(Request{ID: "wait", Min: 1, Member: Member{GPUs: 4}}, epoch); err != nil {
		t.Fatal(err)
	}
	s.Cycle(epoch)
	s.Cycle(epoch.Add(time.Hour))
	st, err := s.GangStatus("wait")
	if err != nil {
		t.Fatal(err)
	}
	if st.State != GangPending || st.Waiting.Kind != WaitCapacity || !strings.Contains(st.Waiting.Reason, "needs 4 GPUs (1 member(s) × 4 GPUs), 0 free") {
		t.Fatalf("status %+v", st)
	}
	if !reflect.DeepEqual(st.WaitedByKind, map[WaitKind]time.Duration{WaitCapacity: time.Hour}) {
		t.Fatalf("waited %v, want an hour for capacity", st.WaitedByKind)
	}
	if _, err := s.GangStatus("nosuch"); !errors.Is(err, ErrUnknownGang) {
		t.Fatalf("unknown gang: %v", err)
	}
}
