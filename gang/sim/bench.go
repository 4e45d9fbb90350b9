package sim

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"time"

	"github.com/atoll-run/atoll/gang"
)

// BenchOptions configure the scheduler throughput benchmark.
type BenchOptions struct {
	Nodes       int    // machines of 8 GPUs (one NVSwitch island each), 8 per rack
	Gangs       int    // pending gangs submitted at once
	ChurnCycles int    // steady-state cycles after the initial fill (2% of gangs finish and are replaced each)
	Seed        uint64 // workload seed
	// BaselineGangs is how many gangs the baseline (every node scored per gang, as
	// kube-scheduler with percentageOfNodesToScore=100) places, on the same cluster.
	BaselineGangs int
}

// Bounds of the benchmark options (100,000 machines are 800,000 GPUs; a million gangs fit
// in a few hundred MiB).
const (
	MaxBenchNodes  = 100_000
	MaxBenchGangs  = 1_000_000
	MaxBenchCycles = 100_000
)

// Validate checks the options against their bounds.
func (o BenchOptions) Validate() error {
	switch {
	case o.Nodes < 1 || o.Nodes > MaxBenchNodes:
		return fmt.Errorf("sim: bench nodes %d outside [1, %d]: %w", o.Nodes, MaxBenchNodes, ErrBadSpec)
	case o.Gangs < 1 || o.Gangs > MaxBenchGangs:
		return fmt.Errorf("sim: bench gangs %d outside [1, %d]: %w", o.Gangs, MaxBenchGangs, ErrBadSpec)
	case o.ChurnCycles < 0 || o.ChurnCycles > MaxBenchCycles:
		return fmt.Errorf("sim: bench churn cycles %d outside [0, %d]: %w", o.ChurnCycles, MaxBenchCycles, ErrBadSpec)
	case o.BaselineGangs < 0 || o.BaselineGangs > MaxBenchGangs:
		return fmt.Errorf("sim: bench baseline gangs %d outside [0, %d]: %w", o.BaselineGangs, MaxBenchGangs, ErrBadSpec)
	}
	return nil
}

// BenchResult is the benchmark's output.
type BenchResult struct {
	MembersPerS    float64 `json:"members_per_s"`
	CycleP50ms     float64 `json:"cycle_p50_ms"`
	CycleP99ms     float64 `json:"cycle_p99_ms"`
	Cycles         int     `json:"cycles"`
	Members        int     `json:"members"`
	GangsPlaced    int     `json:"gangs_placed"`
	BaselineMPS    float64 `json:"baseline_members_per_s"`
	SpeedupVsScan  float64 `json:"speedup_vs_full_scan"`
	MeanMachines   float64 `json:"mean_machines_per_multi_gpu_gang"`
	Nodes          int     `json:"nodes"`
	PendingAtStart int     `json:"pending_at_start"`
}

// BenchCluster builds n DGX-H100-like machines (8 GPUs in one NVSwitch island), racks of 8.
func BenchCluster(n int) gang.Snapshot {
	var s gang.Snapshot
	s.Nodes = make([]gang.Node, n)
	for i := range s.Nodes {
		nd := gang.Node{Name: fmt.Sprintf("m%05d", i), Rack: i / 8, CPUMilli: 224000, MemMiB: 2 << 20, FreeCPU: 224000, FreeMem: 2 << 20}
		nd.GPUs = make([]gang.GPU, 8)
		for g := range nd.GPUs {
			nd.GPUs[g] = gang.GPU{Model: "H100", Island: i, FreeMilli: gang.Milli}
		}
		s.Nodes[i] = nd
	}
	return s
}

// benchGang draws a gang of 1..64 one-GPU members; the size is a power of two with
// probability proportional to 1/size (most gangs small, a few of 32 and 64).
func benchGang(rng *rand.Rand, id int) gang.Request {
	sizes := []int{1, 2, 4, 8, 16, 32, 64}
	var wsum float64
	for _, s := range sizes {
		wsum += 1 / float64(s)
	}
	x := rng.Float64() * wsum
	size := 64
	for _, s := range sizes {
		if x < 1/float64(s) {
			size = s
			break
		}
		x -= 1 / float64(s)
	}
	return gang.Request{
		ID: fmt.Sprintf("g%d", id), Min: size, Priority: rng.IntN(3),
		Member:   gang.Member{GPUs: 1, CPUMilli: 16000, MemMiB: 64 << 10},
		Duration: time.Duration(1+rng.IntN(8)) * time.Hour,
	}
}

// RunSchedBench measures placement throughput and cycle latency of the core.
func RunSchedBench(ctx context.Context, opt BenchOptions) (BenchResult, error) {
	if err := opt.Validate(); err != nil {
		return BenchResult{}, err
	}
	snap := BenchCluster(opt.Nodes)
	res := BenchResult{Nodes: opt.Nodes}
	cfg := gang.DefaultConfig()
	cfg.MaxPending = opt.Gangs + 1 // the benchmark measures cycles over the whole backlog
	s, err := gang.New(cfg, snap)
	if err != nil {
		return res, err
	}
	rng := rand.New(rand.NewPCG(opt.Seed, 11))
	now := time.Unix(0, 0)
	next := 0
	submit := func() error {
		r := benchGang(rng, next)
		next++
		_, err := s.Submit(r, now)
		return err
	}
	for i := 0; i < opt.Gangs; i++ {
		if err := submit(); err != nil {
			return res, err
		}
	}
	res.PendingAtStart = s.Pending()
	var cycles []time.Duration
	var total time.Duration
	running := map[string]int{}
	var runIDs []string
	var machines, multi int
	cycle := func() (int, error) {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		t0 := time.Now()
		d := s.Cycle(now)
		el := time.Since(t0)
		cycles = append(cycles, el)
		total += el
		placed := 0
		for _, p := range d.Placements {
			placed += len(p.Members)
			running[p.Gang] = len(p.Members)
			runIDs = append(runIDs, p.Gang)
			if len(p.Members) > 1 {
				machines += p.Machines
				multi++
			}
		}
		res.Members += placed
		res.GangsPlaced += len(d.Placements)
		now = now.Add(time.Second)
		return placed, nil
	}
	for s.Pending() > 0 {
		placed, err := cycle()
		if err != nil {
			return res, err
		}
		if placed == 0 {
			break
		}
	}
	for c := 0; c < opt.ChurnCycles; c++ {
		k := len(runIDs) / 50
		for j := 0; j < k && len(runIDs) > 0; j++ {
			i := rng.IntN(len(runIDs))
			id := runIDs[i]
			runIDs[i] = runIDs[len(runIDs)-1]
			runIDs = runIDs[:len(runIDs)-1]
			if err := s.Finish(id, now); err != nil {
				return res, err
			}
			delete(running, id)
			if err := submit(); err != nil {
				return res, err
			}
		}
		if _, err := cycle(); err != nil {
			return res, err
		}
	}
	res.Cycles = len(cycles)
	if total > 0 {
		res.MembersPerS = float64(res.Members) / total.Seconds()
	}
	sort.Slice(cycles, func(i, j int) bool { return cycles[i] < cycles[j] })
	res.CycleP50ms = ms(percentileDur(cycles, 0.50))
	res.CycleP99ms = ms(percentileDur(cycles, 0.99))
	if multi > 0 {
		res.MeanMachines = float64(machines) / float64(multi)
	}
	if opt.BaselineGangs > 0 {
		mps, err := scanBaseline(ctx, snap, opt)
		if err != nil {
			return res, err
		}
		res.BaselineMPS = mps
		if mps > 0 {
			res.SpeedupVsScan = res.MembersPerS / mps
		}
	}
	return res, nil
}

// scanBaseline places BaselineGangs gangs with candidate bounds lifted, so every feasible
// node is scored for every gang (the unindexed cost).
func scanBaseline(ctx context.Context, snap gang.Snapshot, opt BenchOptions) (float64, error) {
	cfg := gang.DefaultConfig()
	cfg.MaxPending = opt.BaselineGangs + 1
	cfg.MaxCandidates = 1 << 30
	cfg.MaxGangsPerCycle = 64
	s, err := gang.New(cfg, snap)
	if err != nil {
		return 0, err
	}
	rng := rand.New(rand.NewPCG(opt.Seed, 11))
	now := time.Unix(0, 0)
	for i := 0; i < opt.BaselineGangs; i++ {
		if _, err := s.Submit(benchGang(rng, i), now); err != nil {
			return 0, err
		}
	}
	var total time.Duration
	members := 0
	for s.Pending() > 0 {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		t0 := time.Now()
		d := s.Cycle(now)
		total += time.Since(t0)
		if len(d.Placements) == 0 {
			break
		}
		for _, p := range d.Placements {
			members += len(p.Members)
		}
	}
	if total == 0 {
		return 0, nil
	}
	return float64(members) / total.Seconds(), nil
}

func percentileDur(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q * float64(len(sorted)-1))
	return sorted[i]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
