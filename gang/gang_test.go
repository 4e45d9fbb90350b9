package gang

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
)

func testSnapshot(nodes, gpus, perRack int) Snapshot {
	var s Snapshot
	for i := 0; i < nodes; i++ {
		n := Node{Name: fmt.Sprintf("n%d", i), Rack: i / perRack, CPUMilli: 64000, MemMiB: 512 << 10, FreeCPU: 64000, FreeMem: 512 << 10}
		for g := 0; g < gpus; g++ {
			n.GPUs = append(n.GPUs, GPU{Model: "H100", Island: i, FreeMilli: Milli})
		}
		s.Nodes = append(s.Nodes, n)
	}
	return s
}

func TestPluginScores(t *testing.T) {
	tests := []struct {
		name string
		p    ScorePlugin
		in   ScoreInput
		want float64
	}{
		{"topology single gpu", TopologyPlugin{}, ScoreInput{GPUs: 1}, 1},
		{"topology ideal", TopologyPlugin{}, ScoreInput{GPUs: 8, Islands: 1, Machines: 1, Racks: 1, MinIslands: 1, MinMachines: 1, MinRacks: 1, AllReduce: 10, BestAllReduce: 10}, 1},
		{"topology spread over 4 machines, 2x slower ring", TopologyPlugin{}, ScoreInput{GPUs: 8, Islands: 4, Machines: 4, Racks: 1, MinIslands: 1, MinMachines: 1, MinRacks: 1, AllReduce: 20, BestAllReduce: 10}, 0.5*(0.25+0.25+1)/3 + 0.5*0.5},
		{"fragmentation neutral", FragmentationPlugin{}, ScoreInput{FragDelta: 0}, 0.5},
		{"fragmentation worse", FragmentationPlugin{}, ScoreInput{FragDelta: 1000}, 1 / (1 + math.E)},
		{"load idle", LoadPlugin{}, ScoreInput{Load: 0}, 1},
		{"load busy", LoadPlugin{}, ScoreInput{Load: 0.75}, 0.25},
		{"load over", LoadPlugin{}, ScoreInput{Load: 1.5}, 0},
		{"binpack", BinpackPlugin{}, ScoreInput{Fill: 0.625}, 0.625},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.p.Score(nil, nil, &Candidate{Input: &tt.in}); math.Abs(got-tt.want) > 1e-9 {
				t.Fatalf("%s score = %v, want %v", tt.p.Name(), got, tt.want)
			}
		})
	}
}

func TestNodeFrag(t *testing.T) {
	node := func(free ...int) *Node {
		n := &Node{FreeCPU: 8000, FreeMem: 1000}
		for _, f := range free {
			n.GPUs = append(n.GPUs, GPU{FreeMilli: f})
		}
		return n
	}
	half := Shape{GPUs: 1, Milli: 500, CPUMilli: 1000, Freq: 1}
	whole2 := Shape{GPUs: 2, Milli: 1000, CPUMilli: 1000, Freq: 1}
	cpuHog := Shape{GPUs: 1, Milli: 500, CPUMilli: 9000, Freq: 1}
	memHog := Shape{GPUs: 1, Milli: 500, CPUMilli: 1000, MemMiB: 2000, Freq: 1}
	tests := []struct {
		name string
		n    *Node
		w    Workload
		opt  FragOptions
		want float64
	}{
		{"idle node, share fits", node(1000, 1000), Workload{half}, FragOptions{}, 0},
		{"card with 300 left is a fragment for 500", node(300, 1000), Workload{half}, FragOptions{}, 300},
		{"two whole cards needed, one partial: all fragmented", node(300, 1000), Workload{whole2}, FragOptions{}, 1300},
		{"cpu short: all fragmented", node(1000), Workload{cpuHog}, FragOptions{}, 1000},
		{"memory ignored by FGD", node(1000), Workload{memHog}, FragOptions{}, 0},
		{"memory counted by Atoll", node(1000), Workload{memHog}, FragOptions{Memory: true}, 1000},
		{"mixed popularity", node(300, 1000), Workload{{GPUs: 1, Milli: 500, Freq: 0.5}, {GPUs: 2, Milli: 1000, Freq: 0.5}}, FragOptions{}, 0.5*300 + 0.5*1300},
		{"full node", node(0, 0), Workload{half}, FragOptions{}, 0},
		// 8000 free CPU at 8 CPU-milli per GPU-milli feeds 1000 of the 2000 free.
		{"cpu stranding: half the free share unfed", node(1000, 1000), Workload{half}, FragOptions{CPUPerMilli: 8}, 1000},
		{"cpu stranding: enough cpu", node(1000, 1000), Workload{half}, FragOptions{CPUPerMilli: 4}, 0},
		{"cpu stranding adds to FGD's measure", node(300, 1000), Workload{half}, FragOptions{CPUPerMilli: 8}, 300 + 300},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := NodeFrag(tt.n, tt.w, tt.opt); math.Abs(got-tt.want) > 1e-9 {
				t.Fatalf("NodeFrag = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestStatementDiscardRestores checks all-or-nothing: any sequence of tentative operations
// undone by discard leaves the state and every index exactly as before.
func TestStatementDiscardRestores(t *testing.T) {
	c, err := newCluster(testSnapshot(6, 8, 2))
	if err != nil {
		t.Fatal(err)
	}
	type view struct {
		Nodes      []Node
		FreeWhole  []int
		RackFree   []int
		IslandFree []int
		Used       int64
		Buckets    []int
		Partial    int
	}
	snap := func() view {
		v := view{FreeWhole: append([]int(nil), c.freeWhole...), RackFree: append([]int(nil), c.rackFree...),
			IslandFree: append([]int(nil), c.islandFree...), Used: c.usedMilli, Partial: c.partial.len()}
		for _, n := range c.nodes {
			n.GPUs = append([]GPU(nil), n.GPUs...)
			v.Nodes = append(v.Nodes, n)
		}
		for _, b := range c.byFree {
			v.Buckets = append(v.Buckets, b.len())
		}
		return v
	}
	// Commit a share first so partial-card bookkeeping is exercised.
	base := c.newStatement()
	a0, why := c.fitMember(0, Member{GPUs: 1, GPUMilli: 300}, nil)
	if why != "" {
		t.Fatal(why)
	}
	base.allocate(a0)
	base.commit()
	before := snap()
	st := c.newStatement()
	for i := 0; i < 6; i++ {
		a, why := c.fitMember(i, Member{GPUs: 1 + i%4, CPUMilli: 1000, MemMiB: 10}, nil)
		if why != "" {
			t.Fatalf("node %d: %s", i, why)
		}
		st.allocate(a)
	}
	st.release(a0)
	a, _ := c.fitMember(1, Member{GPUs: 1, GPUMilli: 250}, nil)
	st.allocate(a)
	if reflect.DeepEqual(before, snap()) {
		t.Fatal("tentative allocations changed nothing")
	}
	st.discard()
	if after := snap(); !reflect.DeepEqual(before, after) {
		t.Fatalf("discard did not restore state:\nbefore %+v\nafter  %+v", before, after)
	}
}

// TestGangAtomicity: a gang that cannot be placed whole binds nothing; no two gangs end up
// holding halves of the cluster.
func TestGangAtomicity(t *testing.T) {
	s, err := New(DefaultConfig(), testSnapshot(4, 8, 4), WithLogger(zaptest.NewLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	now := epoch
	for i, members := range []int{3, 3} { // each wants 24 of the 32 GPUs
		if _, err := s.Submit(Request{ID: fmt.Sprintf("g%d", i), Min: members, Member: Member{GPUs: 8}}, now); err != nil {
			t.Fatal(err)
		}
	}
	d := s.Cycle(now)
	if len(d.Placements) != 1 || len(d.Placements[0].Members) != 3 {
		t.Fatalf("want exactly one whole gang placed, got %+v", d.Placements)
	}
	if got := s.Utilization(); got != 0.75 {
		t.Fatalf("utilization %v, want 0.75 (no partial gang bound)", got)
	}
	if s.Pending() != 1 {
		t.Fatalf("pending %d, want 1", s.Pending())
	}
}

func TestEvictionCost(t *testing.T) {
	start := epoch
	now := start.Add(95 * time.Minute)
	s, err := New(DefaultConfig(), testSnapshot(1, 8, 1))
	if err != nil {
		t.Fatal(err)
	}
	// Default model: CUDA context 1 s per GPU; communicator 2 s + 36 ms × 4 ranks.
	const model = 1 + 2 + 0.144
	mk := func(ck Checkpoint, last time.Time) *gangState {
		return &gangState{req: Request{Checkpoint: ck}, start: start, lastCkpt: last, milli: 4000, members: 4, gpuModel: "H100",
			allocs: []alloc{{gpus: []int{0}}}}
	}
	tests := []struct {
		name   string
		g      *gangState
		want   float64 // GPU-seconds
		stopBy time.Time
	}{
		{"no checkpoints: all work lost", mk(Checkpoint{}, time.Time{}), (95*60 + model) * 4, now},
		{"interval 30m: 5 minutes lost", mk(Checkpoint{Interval: 30 * time.Minute}, time.Time{}), (5*60 + model) * 4, now},
		{"reported checkpoint wins", mk(Checkpoint{Interval: 30 * time.Minute}, start.Add(94*time.Minute)), (60 + model) * 4, now},
		{"next periodic checkpoint within the grace: nothing lost", mk(Checkpoint{Interval: 19 * time.Minute, Save: 20 * time.Second}, time.Time{}), model * 4, now.Add(20 * time.Second)},
		{"just in time: save instead of lost work", mk(Checkpoint{Interval: 30 * time.Minute, Save: 10 * time.Second, JustInTime: true}, time.Time{}), (10 + model) * 4, now.Add(40 * time.Second)},
		{"declared CUDA costs replace the model's", mk(Checkpoint{Interval: 95 * time.Minute, Save: 10 * time.Second, Restore: 20 * time.Second, CUDATeardown: 2 * time.Second, CUDACreate: 3 * time.Second}, time.Time{}), (20 + 5 + 2.144) * 4, now.Add(10 * time.Second)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := s.evictionCost(tt.g, now)
			if math.Abs(c.GPUSeconds-tt.want) > 1e-6 {
				t.Fatalf("cost %v GPU-s (%+v), want %v", c.GPUSeconds, c, tt.want)
			}
			if !c.StopBy.Equal(tt.stopBy) {
				t.Fatalf("stop by %s, want %s", c.StopBy.Sub(start), tt.stopBy.Sub(start))
			}
		})
	}
}

// TestCheckpointMeasured: a measured checkpoint replaces the request's save time, and its
// restore is estimated from it unless declared.
func TestCheckpointMeasured(t *testing.T) {
	now := epoch.Add(time.Hour)
	s, err := New(DefaultConfig(), testSnapshot(1, 8, 1))
	if err != nil {
		t.Fatal(err)
	}
	s.gangs["jit"] = &gangState{req: Request{Checkpoint: Checkpoint{JustInTime: true, Save: time.Second}}, start: epoch, milli: 1000, members: 1, gpuModel: "H100",
		allocs: []alloc{{gpus: []int{0}}}}
	s.gangs["declared"] = &gangState{req: Request{Checkpoint: Checkpoint{JustInTime: true, Restore: 7 * time.Second}}, start: epoch, milli: 1000, members: 1, gpuModel: "H100",
		allocs: []alloc{{gpus: []int{1}}}}
	before := s.evictionCost(s.gangs["jit"], now)
	if err := s.CheckpointMeasured("jit", 4*time.Second, 1<<20); err != nil {
		t.Fatal(err)
	}
	after := s.evictionCost(s.gangs["jit"], now)
	if after.Save != 4*time.Second || after.Restore != 4*time.Second {
		t.Fatalf("after a 4 s checkpoint: save %s, restore %s; want 4s and 4s (estimated)", after.Save, after.Restore)
	}
	if d := after.GPUSeconds - before.GPUSeconds; math.Abs(d-7) > 1e-6 {
		t.Fatalf("cost grew by %.3f GPU-s, want 7 (3 s more save, 4 s restore)", d)
	}
	if err := s.CheckpointMeasured("declared", 2*time.Second, 0); err != nil {
		t.Fatal(err)
	}
	if c := s.evictionCost(s.gangs["declared"], now); c.Save != 2*time.Second || c.Restore != 7*time.Second {
		t.Fatalf("declared restore: save %s, restore %s; want 2s and the declared 7s", c.Save, c.Restore)
	}
	if err := s.CheckpointMeasured("nobody", time.Second, 0); !errors.Is(err, ErrUnknownGang) {
		t.Fatalf("unknown gang: %v, want ErrUnknownGang", err)
	}
}

// TestVictimChoice: among several lower-priority gangs, the cheapest set that admits the
// preemptor is evicted, and never more than needed.
func TestVictimChoice(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Backfill = false
	s, err := New(cfg, testSnapshot(3, 8, 3))
	if err != nil {
		t.Fatal(err)
	}
	now := epoch
	// Three 8-GPU gangs with different checkpoint recency.
	for i, iv := range []time.Duration{0, 10 * time.Minute, 30 * time.Minute} {
		r := Request{ID: fmt.Sprintf("v%d", i), Min: 1, Member: Member{GPUs: 8}, Checkpoint: Checkpoint{Interval: iv}}
		if _, err := s.Submit(r, now); err != nil {
			t.Fatal(err)
		}
	}
	if d := s.Cycle(now); len(d.Placements) != 3 {
		t.Fatalf("placed %d, want 3", len(d.Placements))
	}
	now = now.Add(100 * time.Minute)
	if _, err := s.Submit(Request{ID: "hi", Priority: 1, Min: 2, Member: Member{GPUs: 8}}, now); err != nil {
		t.Fatal(err)
	}
	// No durations are known, so the gain is the wait so far (ski rental): nothing is
	// evicted at once, and the cycle asks to run again when the wait pays for the cost.
	d := s.Cycle(now)
	if len(d.Preemptions) != 0 || d.NextCycle.IsZero() {
		t.Fatalf("preempted at once (%+v) or no retry time (%v)", d.Preemptions, d.NextCycle)
	}
	arrived := now
	for i := 0; i < 10 && len(d.Preemptions) == 0; i++ {
		if d.NextCycle.IsZero() {
			t.Fatalf("cycle %d: no retry time", i)
		}
		now = d.NextCycle
		d = s.Cycle(now)
	}
	// Victims lose work at 16 GPU-s/s while the preemptor's weighted wait grows at 8 × 16:
	// the costs (about 4,850 GPU-s at arrival) are paid back after about 43 s.
	if w := now.Sub(arrived); w < 40*time.Second || w > 50*time.Second {
		t.Fatalf("preempted after %s, want about 43 s", w)
	}
	var victims []string
	for _, p := range d.Preemptions {
		victims = append(victims, p.Victim)
	}
	// v1 loses under 2 min, v2 about 12 min, v0 everything: evict v1 and v2.
	if !reflect.DeepEqual(victims, []string{"v1", "v2"}) {
		t.Fatalf("victims %v, want [v1 v2]", victims)
	}
	if len(d.Reservations) != 1 || d.Reservations[0].Gang != "hi" || !d.Reservations[0].Preemptor {
		t.Fatalf("no hold for the preemptor: %+v", d.Reservations)
	}
	for _, v := range victims {
		if err := s.Evicted(v, now.Add(time.Minute), true); err != nil {
			t.Fatal(err)
		}
	}
	d = s.Cycle(now.Add(time.Minute))
	if len(d.Placements) != 1 || d.Placements[0].Gang != "hi" || !d.Placements[0].Preemptor {
		t.Fatalf("preemptor not placed after evictions: %+v", d.Placements)
	}
}

// TestBackpressure: past MaxPending a submission is refused with a retry hint; what is
// queued stays queued, an evicted gang always queues again, and room frees as gangs start.
func TestBackpressure(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxPending = 2
	cfg.Backfill = false
	s, err := New(cfg, testSnapshot(1, 1, 1))
	if err != nil {
		t.Fatal(err)
	}
	submit := func(id string, prio int, now time.Time) (SubmitStatus, error) {
		return s.Submit(Request{ID: id, Min: 1, Priority: prio, Member: Member{GPUs: 1}, Checkpoint: Checkpoint{JustInTime: true}}, now)
	}
	if _, err := submit("run", 0, epoch); err != nil {
		t.Fatal(err)
	}
	if d := s.Cycle(epoch); len(d.Placements) != 1 {
		t.Fatalf("placed %d", len(d.Placements))
	}
	for _, id := range []string{"a", "b"} {
		if st, err := submit(id, 0, epoch); err != nil || st.State != Queued {
			t.Fatalf("submit %s: %v %v", id, st, err)
		}
	}
	st, err := submit("c", 0, epoch)
	var se *SaturatedError
	if st.State != Saturated || !errors.Is(err, ErrSaturated) || !errors.As(err, &se) {
		t.Fatalf("third pending: state %v, err %v; want Saturated, ErrSaturated", st.State, err)
	}
	if se.Pending != 2 || se.Bound != 2 || se.RetryAfter != 30*time.Second {
		t.Fatalf("saturated error %+v: want 2 pending, bound 2, the 30 s hint before any rate is known", se)
	}
	if !strings.Contains(st.Reason, "retry in 30s") {
		t.Fatalf("reason %q has no retry hint", st.Reason)
	}
	if s.Pending() != 2 {
		t.Fatalf("pending %d, want 2: nothing queued is dropped, nothing refused is kept", s.Pending())
	}
	// An evicted gang queues again even past the bound.
	if err := s.Evicted("run", epoch.Add(time.Hour), true); err != nil {
		t.Fatal(err)
	}
	if s.Pending() != 3 {
		t.Fatalf("pending %d after an eviction, want 3", s.Pending())
	}
	// Gangs start as the GPU frees; once the queue is below the bound, submissions pass.
	now := epoch.Add(time.Hour)
	for _, id := range []string{"run", "a"} {
		d := s.Cycle(now)
		if len(d.Placements) != 1 {
			t.Fatalf("cycle placed %d, want 1", len(d.Placements))
		}
		if err := s.Finish(d.Placements[0].Gang, now.Add(time.Minute)); err != nil {
			t.Fatal(err)
		}
		now = now.Add(2 * time.Minute)
		_ = id
	}
	if st, err := submit("c", 0, now); err != nil || st.State != Queued {
		t.Fatalf("after the queue drained: %v %v", st, err)
	}
}

func TestSubmitErrors(t *testing.T) {
	s, err := New(DefaultConfig(), testSnapshot(2, 4, 2))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		r    Request
		want error
	}{
		{Request{ID: "", Min: 1}, ErrInvalidRequest},
		{Request{ID: "x", Min: 2, Max: 1}, ErrInvalidRequest},
		{Request{ID: "x", Min: 1, Member: Member{GPUs: 2, GPUMilli: 500}}, ErrInvalidRequest},
		{Request{ID: "x", Min: 1, Queue: "nope"}, ErrUnknownQueue},
		{Request{ID: "x", Min: 1, Member: Member{GPUs: 5}}, ErrNeverFits},
		{Request{ID: "x", Min: 3, Member: Member{GPUs: 4}}, ErrNeverFits},
		{Request{ID: "x", Min: 2, Member: Member{GPUs: 4}, SameIsland: true}, ErrNeverFits},
		{Request{ID: "x", Min: 1, Member: Member{MIG: "1g.10gb"}}, ErrNeverFits},
		{Request{ID: "x", Min: 1281, Member: Member{CPUMilli: 100}}, ErrNeverFits}, // over the cluster's 128 cores
		{Request{ID: "x", Min: 3, Member: Member{MemMiB: 400 << 10}}, ErrNeverFits},
	}
	for _, tt := range tests {
		st, err := s.Submit(tt.r, epoch)
		if !errors.Is(err, tt.want) || st.State != Rejected || st.Reason == "" {
			t.Errorf("%+v: got %v %v, want %v", tt.r, st, err, tt.want)
		}
	}
	if _, err := s.Submit(Request{ID: "ok", Min: 1}, epoch); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Submit(Request{ID: "ok", Min: 1}, epoch); !errors.Is(err, ErrDuplicate) {
		t.Fatalf("duplicate: %v", err)
	}
	if err := s.Finish("ghost", epoch); !errors.Is(err, ErrUnknownGang) {
		t.Fatalf("finish ghost: %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	bad := []func(*Config){
		func(c *Config) { c.Queues = nil },
		func(c *Config) { c.DefaultQueue = "x" },
		func(c *Config) { c.Queues = append(c.Queues, c.Queues[0]) },
		func(c *Config) { c.Weights.Load = -1 },
		func(c *Config) { c.MaxCandidates = 0 },
		func(c *Config) { c.Preemption = false },
	}
	for i, f := range bad {
		c := DefaultConfig()
		f(&c)
		if err := c.Validate(); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("case %d: %v", i, err)
		}
	}
}

func TestTieredModel(t *testing.T) {
	m := DefaultTieredModel()
	ring := func(refs ...GPURef) time.Duration { return m.AllReduceTime(refs, 1<<30) }
	one := ring(GPURef{Node: 0, Island: 0})
	inIsland := ring(GPURef{Node: 0, GPU: 0}, GPURef{Node: 0, GPU: 1})
	inRack := ring(GPURef{Node: 0}, GPURef{Node: 1, Island: 1})
	crossRack := ring(GPURef{Node: 0}, GPURef{Node: 1, Island: 1, Rack: 1})
	if one != 0 || !(inIsland < inRack && inRack < crossRack) {
		t.Fatalf("want 0 < island < rack < spine: %v %v %v %v", one, inIsland, inRack, crossRack)
	}
}

// TestTopologyBeatsBlind: topology-aware placement crosses fewer machines and models a
// shorter AllReduce than binpack on a fragmented cluster.
func TestTopologyBeatsBlind(t *testing.T) {
	run := func(aware bool) Placement {
		cfg := DefaultConfig()
		cfg.TopologyAware = aware
		s, err := New(cfg, testSnapshot(8, 8, 4), WithBlindPolicy(BlindBinpack))
		if err != nil {
			t.Fatal(err)
		}
		// Leave one card used on every node of rack 0.
		for i := 0; i < 4; i++ {
			if _, err := s.Submit(Request{ID: fmt.Sprint("f", i), Min: 1, Member: Member{GPUs: 1}}, epoch); err != nil {
				t.Fatal(err)
			}
			s.Cycle(epoch)
		}
		if _, err := s.Submit(Request{ID: "job", Min: 8, Member: Member{GPUs: 1}}, epoch); err != nil {
			t.Fatal(err)
		}
		d := s.Cycle(epoch)
		if len(d.Placements) != 1 {
			t.Fatalf("placements %+v", d.Placements)
		}
		return d.Placements[0]
	}
	aware, blind := run(true), run(false)
	if aware.Machines != 1 || blind.Machines <= 1 || aware.AllReduce >= blind.AllReduce {
		t.Fatalf("aware %d machines %v, blind %d machines %v", aware.Machines, aware.AllReduce, blind.Machines, blind.AllReduce)
	}
	if len(aware.Scores) == 0 || aware.Total <= 0 {
		t.Fatalf("no scores reported: %+v", aware)
	}
}

// TestOrdering: priority classes first, aging lifts old gangs one class per AgingStep, and
// between queues the under-served one (DRF) goes first.
func TestOrdering(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Queues = []QueueConfig{{Name: "a", Weight: 1}, {Name: "b", Weight: 1}}
	cfg.DefaultQueue = "a"
	cfg.AgingStep = time.Hour
	cfg.Preemption, cfg.FairShareReclaim, cfg.Backfill = false, false, false
	s, err := New(cfg, testSnapshot(1, 8, 1))
	if err != nil {
		t.Fatal(err)
	}
	sub := func(id, q string, prio int, at time.Time) {
		t.Helper()
		if _, err := s.Submit(Request{ID: id, Queue: q, Priority: prio, Min: 1, Member: Member{GPUs: 1}}, at); err != nil {
			t.Fatal(err)
		}
	}
	// Queue a already holds a GPU.
	sub("a-run", "a", 0, epoch)
	s.Cycle(epoch)
	now := epoch.Add(3 * time.Hour)
	sub("old-low", "a", 0, epoch)                  // aged 3h: class 3
	sub("fresh-high", "a", 2, now)                 // class 2
	sub("a-normal", "a", 1, now)                   // class 1, queue a over-served
	sub("b-normal", "b", 1, now.Add(-time.Second)) // class 1, queue b idle
	var got []string
	for i := 0; i < 4; i++ {
		d := s.Cycle(now)
		for _, p := range d.Placements {
			got = append(got, p.Gang)
		}
	}
	want := []string{"old-low", "fresh-high", "b-normal", "a-normal"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
}
