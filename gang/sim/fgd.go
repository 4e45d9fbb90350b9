package sim

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/atoll-run/atoll/gang"
)

// FGDPolicies are the policy names of the static packing mode, baselines first.
var FGDPolicies = []string{"random", "dotprod", "clustering", "packing", "bestfit", "fgd", "atoll"}

// FGDOptions configure the static packing experiment (the FGD protocol, ATC'23).
type FGDOptions struct {
	Loads     []float64 // arrived GPU requests as a share of cluster GPUs, e.g. 1.0, 1.3
	Seeds     int       // runs per policy; seeds FirstSeed, FirstSeed+1, ...
	FirstSeed uint64    // 42 as in the FGD artifact
	Policies  []string  // default FGDPolicies
	// CPUStrandFactor scales the atoll policy's CPU-stranding term (see AtollFragOptions);
	// 0 means the default, negative turns it off.
	CPUStrandFactor float64
}

// Bounds of the FGD options: arrivals up to 10 times the cluster's GPUs (the protocol
// reads 1.0 and 1.3), up to 1,000 seeds, a stranding factor within ±1,000.
const (
	MaxFGDLoad        = 10.0
	MaxFGDSeeds       = 1000
	MaxCPUStrandScale = 1000.0
)

// Validate checks the options against their bounds.
func (o FGDOptions) Validate() error {
	if len(o.Loads) == 0 {
		return fmt.Errorf("sim: fgd needs at least one load: %w", ErrBadSpec)
	}
	for _, l := range o.Loads {
		if !(l > 0 && l <= MaxFGDLoad) {
			return fmt.Errorf("sim: fgd load %v outside (0, %v]: %w", l, MaxFGDLoad, ErrBadSpec)
		}
	}
	if o.Seeds < 1 || o.Seeds > MaxFGDSeeds {
		return fmt.Errorf("sim: fgd seeds %d outside [1, %d]: %w", o.Seeds, MaxFGDSeeds, ErrBadSpec)
	}
	if !(math.Abs(o.CPUStrandFactor) <= MaxCPUStrandScale) {
		return fmt.Errorf("sim: cpu strand factor %v outside [-%v, %v]: %w", o.CPUStrandFactor, MaxCPUStrandScale, MaxCPUStrandScale, ErrBadSpec)
	}
	for _, p := range o.Policies {
		if !slices.Contains(FGDPolicies, p) {
			return fmt.Errorf("sim: unknown fgd policy %q (want one of %v): %w", p, FGDPolicies, ErrBadSpec)
		}
	}
	return nil
}

// AtollFragOptions is the atoll policy's fragmentation measure learnt from the pods given
// (in the simulator: the arrivals so far): memory-aware, and counting GPU share stranded by
// CPU exhaustion at factor times the CPU per GPU that the GPU pods among them ask (0 =
// DefaultCPUStrandFactor, negative = off).
func AtollFragOptions(pods []Pod, factor float64) gang.FragOptions {
	if factor == 0 {
		factor = DefaultCPUStrandFactor
	}
	opt := gang.FragOptions{Memory: true}
	var cpu, gpu float64
	for _, p := range pods {
		if p.NumGPU > 0 {
			cpu += float64(p.CPUMilli)
			gpu += float64(p.GPUMilliTotal())
		}
	}
	if factor > 0 && gpu > 0 {
		opt.CPUPerMilli = factor * cpu / gpu
	}
	return opt
}

// DefaultCPUStrandFactor is the default scale of the CPU-stranding term.
const DefaultCPUStrandFactor = 1

// FGDResult is one (load, policy) line: GPU allocation over the seeds.
type FGDResult struct {
	Load           float64 `json:"load"`
	Policy         string  `json:"policy"`
	AllocPctMean   float64 `json:"alloc_pct_mean"`
	AllocPctSD     float64 `json:"alloc_pct_sd"`
	UnallocPctMean float64 `json:"unalloc_pct_mean"`
	Seeds          int     `json:"seeds"`
}

// SampleWorkload builds one seeded arrival sequence: the pod list shuffled, then extended by
// pods drawn uniformly with replacement until the requested GPUs reach maxLoad of capacity.
func SampleWorkload(pods []Pod, capacityMilli int64, maxLoad float64, seed uint64) []Pod {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	out := append([]Pod(nil), pods...)
	rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	target := int64(maxLoad * float64(capacityMilli))
	var sum int64
	for i, p := range out {
		sum += p.GPUMilliTotal()
		if sum >= target {
			return out[:i+1]
		}
	}
	for sum < target && len(pods) > 0 {
		p := pods[rng.IntN(len(pods))]
		out = append(out, p)
		sum += p.GPUMilliTotal()
	}
	return out
}

// RunFGD replays the pods on the nodes for every policy and seed, without departures, and
// reports the share of GPUs allocated when the arrived requests reach each load.
func RunFGD(ctx context.Context, nodes []gang.Node, pods []Pod, opt FGDOptions) ([]FGDResult, error) {
	if err := opt.Validate(); err != nil {
		return nil, err
	}
	if !slices.ContainsFunc(pods, func(p Pod) bool { return p.GPUMilliTotal() > 0 }) {
		return nil, fmt.Errorf("sim: fgd: the pod list asks no GPU, so no load can be reached: %w", ErrBadSpec)
	}
	if opt.Policies == nil {
		opt.Policies = FGDPolicies
	}
	if opt.FirstSeed == 0 {
		opt.FirstSeed = 42
	}
	loads := append([]float64(nil), opt.Loads...)
	sort.Float64s(loads)
	var capMilli int64
	for _, n := range nodes {
		capMilli += int64(len(n.GPUs)) * gang.Milli
	}
	if capMilli == 0 {
		return nil, fmt.Errorf("sim: fgd: node list has no GPUs: %w", ErrBadSpec)
	}
	typical := TypicalWorkload(pods, false)
	strand := opt.CPUStrandFactor
	// Runs are independent: one goroutine per (policy, seed), at most GOMAXPROCS at a time,
	// each writing its own slot, so results do not depend on scheduling.
	type key struct{ pol, seed int }
	per := map[key][]float64{}
	var mu sync.Mutex
	var firstErr error
	sem := make(chan struct{}, max(1, runtime.GOMAXPROCS(0)))
	var wg sync.WaitGroup
	for pi, pol := range opt.Policies {
		for si := 0; si < opt.Seeds; si++ {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				shares, err := fgdRun(ctx, pol, nodes, pods, typical, strand, loads, capMilli, opt.FirstSeed+uint64(si))
				mu.Lock()
				defer mu.Unlock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				per[key{pi, si}] = shares
			}()
		}
	}
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	var out []FGDResult
	for pi, pol := range opt.Policies {
		for li, l := range loads {
			var xs []float64
			for si := 0; si < opt.Seeds; si++ {
				xs = append(xs, per[key{pi, si}][li])
			}
			m, sd := meanSD(xs)
			out = append(out, FGDResult{Load: l, Policy: pol, AllocPctMean: round2(m), AllocPctSD: round2(sd), UnallocPctMean: round2(100 - m), Seeds: opt.Seeds})
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Load < out[j].Load })
	return out, nil
}

// fgdRun is one seeded run of one policy; it returns the allocated share at each load.
func fgdRun(ctx context.Context, pol string, nodes []gang.Node, pods []Pod, typical gang.Workload, strand float64, loads []float64, capMilli int64, seed uint64) ([]float64, error) {
	arr := SampleWorkload(pods, capMilli, loads[len(loads)-1], seed)
	p, err := newPacker(pol, nodes, typical, strand, seed)
	if err != nil {
		return nil, err
	}
	out := make([]float64, 0, len(loads))
	var arrived int64
	for i, pod := range arr {
		if i%1024 == 0 {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
		}
		arrived += pod.GPUMilliTotal()
		p.place(pod)
		for len(out) < len(loads) && float64(arrived) >= loads[len(out)]*float64(capMilli) {
			out = append(out, 100*float64(p.allocated())/float64(capMilli))
		}
	}
	for len(out) < len(loads) {
		out = append(out, 100*float64(p.allocated())/float64(capMilli))
	}
	return out, nil
}

func meanSD(xs []float64) (float64, float64) {
	if len(xs) == 0 {
		return 0, 0
	}
	var s float64
	for _, x := range xs {
		s += x
	}
	m := s / float64(len(xs))
	var v float64
	for _, x := range xs {
		v += (x - m) * (x - m)
	}
	if len(xs) > 1 {
		v /= float64(len(xs) - 1)
	}
	return m, math.Sqrt(v)
}

func round2(x float64) float64 { return math.Round(x*100) / 100 }

// packer places pods one at a time and never releases them.
type packer interface {
	place(p Pod) bool
	allocated() int64 // milli-GPU
}

func newPacker(policy string, nodes []gang.Node, typical gang.Workload, strand float64, seed uint64) (packer, error) {
	if policy == "atoll" {
		return newAtollPacker(nodes, strand)
	}
	b := &baseline{
		policy: policy,
		nodes:  cloneNodes(nodes),
		rng:    rand.New(rand.NewPCG(seed, 7)),
		frag:   gang.NewFragCache(typical, gang.FragOptions{}),
	}
	switch policy {
	case "random", "dotprod", "clustering", "packing", "bestfit", "fgd":
	default:
		return nil, fmt.Errorf("sim: unknown fgd policy %q (want one of %v): %w", policy, FGDPolicies, ErrBadSpec)
	}
	for _, n := range nodes {
		b.maxCPU = max(b.maxCPU, n.CPUMilli)
		b.maxGPU = max(b.maxGPU, int64(len(n.GPUs))*gang.Milli)
	}
	b.affinity = make([]map[int]int, len(nodes))
	return b, nil
}

func cloneNodes(nodes []gang.Node) []gang.Node {
	out := make([]gang.Node, len(nodes))
	for i, n := range nodes {
		n.GPUs = append([]gang.GPU(nil), n.GPUs...)
		out[i] = n
	}
	return out
}

// baseline implements the FGD paper's comparison policies the way its simulator scores
// them: kube-scheduler scores in 0..100 (integers), the highest wins, ties go to the
// smallest node name as in the artifact's scheduler fork (random only for Random).
type baseline struct {
	policy         string
	nodes          []gang.Node
	rng            *rand.Rand
	frag           *gang.FragCache
	maxCPU, maxGPU int64
	affinity       []map[int]int // gpu_milli tags of pods on each node (clustering)
	alloc          int64
}

func (b *baseline) allocated() int64 { return b.alloc }

// fits returns the cards a pod would take on node n with the policy's card choice.
func (b *baseline) cards(n *gang.Node, p Pod) []int {
	if n.FreeCPU < p.CPUMilli || n.FreeMem < p.MemMiB {
		return nil
	}
	if p.NumGPU == 0 {
		return []int{}
	}
	var ok []int
	for i, g := range n.GPUs {
		if g.FreeMilli >= p.GPUMilli && gang.ModelAllowed(p.Models, g.Model) {
			ok = append(ok, i)
		}
	}
	if len(ok) < p.NumGPU {
		return nil
	}
	if p.GPUMilli < gang.Milli {
		switch b.policy {
		case "random":
			return []int{ok[b.rng.IntN(len(ok))]}
		case "fgd":
			best, bestF := -1, 0.0
			for _, i := range ok {
				if best >= 0 && n.GPUs[i].FreeMilli == n.GPUs[best].FreeMilli {
					continue
				}
				n.GPUs[i].FreeMilli -= p.GPUMilli
				n.FreeCPU -= p.CPUMilli
				f := b.frag.Frag(n)
				n.GPUs[i].FreeMilli += p.GPUMilli
				n.FreeCPU += p.CPUMilli
				if best < 0 || f < bestF {
					best, bestF = i, f
				}
			}
			return []int{best}
		default: // best fit card
			sort.SliceStable(ok, func(x, y int) bool { return n.GPUs[ok[x]].FreeMilli < n.GPUs[ok[y]].FreeMilli })
			return ok[:1]
		}
	}
	// Whole cards: idle ones in index order (AllocateExclusiveGpuId).
	return ok[:p.NumGPU]
}

// The paper simulator's fixed normalisation (utils.MaxSpecCpu, MaxSpecGpu): DotProd's
// "max" norm and GpuClustering's load term divide by these, not by the node's capacity.
const (
	maxSpecCPU  = 128000 // milli-CPU
	maxSpecGPU  = 8000   // milli-GPU
	shareGPUTag = -1     // GpuClustering's affinity tag of a GPU-share pod ("share-gpu")
)

// dot is DotProd's "merge" dimension with "max" normalisation: the node's free CPU and
// total free GPU against the pod's CPU and total GPU, each divided by the largest node
// spec, averaged over the two dimensions.
func (b *baseline) dot(n *gang.Node, p Pod) float64 {
	return (float64(n.FreeCPU)/maxSpecCPU*float64(p.CPUMilli)/maxSpecCPU +
		float64(freeMilli(n))/maxSpecGPU*float64(p.GPUMilliTotal())/maxSpecGPU) / 2
}

// affinityTag is GpuClustering's pod class: every GPU-share pod is one class
// ("share-gpu"), whole-card pods are classed by their card count ("N-gpu").
func affinityTag(p Pod) int {
	if p.NumGPU == 1 && p.GPUMilli < gang.Milli {
		return shareGPUTag
	}
	return p.NumGPU
}

func freeMilli(n *gang.Node) int64 {
	var f int64
	for _, g := range n.GPUs {
		f += int64(g.FreeMilli)
	}
	return f
}

func (b *baseline) apply(n *gang.Node, p Pod, cards []int, sign int) {
	for _, i := range cards {
		n.GPUs[i].FreeMilli -= sign * p.GPUMilli
	}
	n.FreeCPU -= int64(sign) * p.CPUMilli
	n.FreeMem -= int64(sign) * p.MemMiB
}

func (b *baseline) score(i int, n *gang.Node, p Pod, cards []int) int64 {
	switch b.policy {
	case "random":
		return 0
	case "dotprod":
		return int64(100 * (1 - b.dot(n, p)))
	case "bestfit":
		if p.NumGPU == 0 && len(n.GPUs) == 0 {
			return 100
		}
		s := 0.5*float64(n.FreeCPU-p.CPUMilli)/float64(b.maxCPU) + 0.5*float64(freeMilli(n)-p.GPUMilliTotal())/float64(b.maxGPU)
		return int64(100 * (1 - s))
	case "packing":
		return packingScore(n, p)
	case "clustering":
		if p.NumGPU == 0 {
			return 0
		}
		base := 25 * (maxSpecGPU - freeMilli(n)) / maxSpecGPU
		aff := b.affinity[i]
		tag := affinityTag(p)
		switch {
		case aff[tag] > 0 && len(aff) == 1:
			return base + 75
		case aff[tag] > 0:
			return base + 50
		case len(aff) == 0:
			return base + 25
		}
		return base
	case "fgd":
		// CPU-only pods are scored too: they change the node's CPU and so its fragmentation.
		before := b.frag.Frag(n)
		b.apply(n, p, cards, 1)
		after := b.frag.Frag(n)
		b.apply(n, p, cards, -1)
		return int64(100 / (1 + math.Exp(-(before-after)/1000)))
	}
	return 0
}

// packingScore follows GpuPacking: shared cards first, then free cards on used nodes, then
// idle nodes.
func packingScore(n *gang.Node, p Pod) int64 {
	if p.GPUMilli <= 0 {
		return 0
	}
	fully := 0
	for _, g := range n.GPUs {
		if g.FreeMilli == gang.Milli {
			fully++
		}
	}
	if fully == len(n.GPUs) {
		return max(int64(100/3-fully), int64(fully))
	}
	idx := make([]int, len(n.GPUs))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, c int) bool { return n.GPUs[idx[a]].FreeMilli < n.GPUs[idx[c]].FreeMilli })
	req, useFree := p.NumGPU, 0
	var used []int
	for _, i := range idx {
		if req == 0 {
			break
		}
		if n.GPUs[i].FreeMilli >= p.GPUMilli {
			req--
			used = append(used, i)
			if n.GPUs[i].FreeMilli == gang.Milli {
				useFree++
			}
		}
	}
	if req != 0 {
		return 0
	}
	if useFree > 0 {
		return max(int64(50-useFree), 100/3)
	}
	var ratio int64
	for _, i := range used {
		ratio += int64(n.GPUs[i].FreeMilli) * 100 / gang.Milli
	}
	return max(100-ratio/10, 50)
}

func (b *baseline) place(p Pod) bool {
	best := -1
	var bestScore int64
	var bestCards []int
	ties := 0
	for i := range b.nodes {
		n := &b.nodes[i]
		cards := b.cards(n, p)
		if cards == nil {
			continue
		}
		s := b.score(i, n, p, cards)
		switch {
		case best < 0 || s > bestScore:
			best, bestScore, bestCards, ties = i, s, cards, 1
		case s == bestScore && b.policy == "random":
			ties++
			if b.rng.IntN(ties) == 0 {
				best, bestCards = i, cards
			}
		case s == bestScore && n.Name < b.nodes[best].Name:
			// The FGD artifact's kube-scheduler fork (selectHost) breaks ties by the
			// smallest node name "for reproducibility", not at random.
			best, bestCards = i, cards
		}
	}
	if best < 0 {
		return false
	}
	b.apply(&b.nodes[best], p, bestCards, 1)
	b.alloc += int64(len(bestCards)) * int64(p.GPUMilli)
	if p.NumGPU > 0 {
		if b.affinity[best] == nil {
			b.affinity[best] = map[int]int{}
		}
		b.affinity[best][affinityTag(p)]++
	}
	return true
}

// atollPacker runs each pod through the gang scheduler core as a one-member gang.
type atollPacker struct {
	s         *gang.Scheduler
	seq       int
	now       time.Time
	nodes     []gang.Node
	seen      []Pod // arrivals so far, the only workload knowledge the policy has
	relearnAt int
	strand    float64 // CPUStrandFactor
}

// AtollFGDConfig is the core configuration of the atoll policy in the static mode: the
// memory-aware fragmentation measure with exact (unquantised) scores over every feasible
// node, binpack as the tie-breaker, no preemption (the protocol has no departures).
func AtollFGDConfig() gang.Config {
	cfg := gang.DefaultConfig()
	cfg.Weights = gang.Weights{Fragmentation: 1, Binpack: 0.001}
	cfg.MaxCandidates = 1 << 20
	cfg.Preemption, cfg.FairShareReclaim, cfg.Backfill = false, false, false
	cfg.AgingStep = 0
	return cfg
}

func newAtollPacker(nodes []gang.Node, strand float64) (*atollPacker, error) {
	s, err := gang.New(AtollFGDConfig(), gang.Snapshot{Nodes: nodes}, gang.WithFragOptions(AtollFragOptions(nil, strand)))
	if err != nil {
		return nil, err
	}
	a := &atollPacker{s: s, now: time.Unix(0, 0), nodes: nodes, relearnAt: 1, strand: strand}
	return a, nil
}

// relearn rebuilds the target workload and the CPU-per-GPU ratio from the pods seen so far (never from pods yet to
// arrive): at 1, 2, 4, ... 256 pods, then every 256.
func (a *atollPacker) relearn() {
	if len(a.seen) < a.relearnAt {
		return
	}
	a.s.SetWorkload(AtollWorkload(a.seen, a.nodes))
	a.s.SetFragOptions(AtollFragOptions(a.seen, a.strand))
	if a.relearnAt < 256 {
		a.relearnAt *= 2
	} else {
		a.relearnAt += 256
	}
}

func (a *atollPacker) allocated() int64 {
	return int64(a.s.Utilization()*float64(a.totalMilli()) + 0.5)
}

func (a *atollPacker) totalMilli() int64 {
	var t int64
	for i := 0; i < a.s.NumNodes(); i++ {
		t += int64(len(a.s.Node(i).GPUs)) * gang.Milli
	}
	return t
}

func (a *atollPacker) place(p Pod) bool {
	a.seen = append(a.seen, p)
	a.relearn()
	a.seq++
	id := fmt.Sprintf("p%d", a.seq)
	r := gang.Request{ID: id, Min: 1, Member: gang.Member{GPUs: p.NumGPU, GPUMilli: p.GPUMilli, CPUMilli: p.CPUMilli, MemMiB: p.MemMiB}, GPUModels: p.Models}
	st, _ := a.s.Submit(r, a.now)
	if st.State == gang.Rejected {
		return false
	}
	d := a.s.Cycle(a.now)
	if len(d.Placements) == 1 {
		return true
	}
	_ = a.s.Finish(id, a.now) // the protocol does not retry
	return false
}
