package gang

import (
	"math"
	"sort"
	"time"
)

// ScoreInput is what the scheduler measured about one candidate placement (Candidate.Input);
// score plugins turn it into a number in [0, 1]. Candidates of one gang are scored together, so Best*
// fields hold the best value among them (for normalisation, as kube-scheduler's NormalizeScore).
type ScoreInput struct {
	GPUs                              int // GPUs the gang holds (cards touched)
	Islands, Machines, Racks          int
	MinIslands, MinMachines, MinRacks int // the fewest any placement of this size could cross
	AllReduce, BestAllReduce          time.Duration
	// FragDelta is the change in fragmented milli-GPU (FGD's measure against the workload's
	// typical requests) on the nodes the placement touches: after minus before.
	FragDelta float64
	// Load is the weighted measured load (Config.LoadWeights) averaged over touched nodes.
	Load float64
	// Fill is the allocated share of GPUs on touched nodes after the placement, averaged.
	Fill float64
}

// TopologyPlugin prefers placements crossing few islands, machines and racks, and with a
// short modeled AllReduce (AllReduce-aware): half locality, half AllReduce time relative to
// the best candidate.
type TopologyPlugin struct{}

// Name implements ScorePlugin.
func (TopologyPlugin) Name() string { return "topology" }

// Score implements ScorePlugin.
func (TopologyPlugin) Score(_ *CycleState, _ *QueuedGang, c *Candidate) float64 {
	in := c.Input
	if in.GPUs <= 1 {
		return 1
	}
	ratio := func(best, got int) float64 {
		if got <= 0 {
			return 1
		}
		return math.Min(1, float64(max(best, 1))/float64(got))
	}
	loc := (ratio(in.MinIslands, in.Islands) + ratio(in.MinMachines, in.Machines) + ratio(in.MinRacks, in.Racks)) / 3
	ar := 1.0
	if in.AllReduce > 0 {
		ar = math.Min(1, float64(in.BestAllReduce)/float64(in.AllReduce))
	}
	return 0.5*loc + 0.5*ar
}

// FragmentationPlugin prefers placements that fragment least (FGD: the sigmoid of the
// fragmentation decrease, in units of one GPU).
type FragmentationPlugin struct{}

// Name implements ScorePlugin.
func (FragmentationPlugin) Name() string { return "fragmentation" }

// Score implements ScorePlugin.
func (FragmentationPlugin) Score(_ *CycleState, _ *QueuedGang, c *Candidate) float64 {
	return 1 / (1 + math.Exp(c.Input.FragDelta/Milli))
}

// LoadPlugin prefers lightly loaded nodes by their measured use.
type LoadPlugin struct{}

// Name implements ScorePlugin.
func (LoadPlugin) Name() string { return "load" }

// Score implements ScorePlugin.
func (LoadPlugin) Score(_ *CycleState, _ *QueuedGang, c *Candidate) float64 {
	return clamp01(1 - c.Input.Load)
}

// BinpackPlugin prefers fuller nodes (Volcano's binpack), leaving whole machines free.
type BinpackPlugin struct{}

// Name implements ScorePlugin.
func (BinpackPlugin) Name() string { return "binpack" }

// Score implements ScorePlugin.
func (BinpackPlugin) Score(_ *CycleState, _ *QueuedGang, c *Candidate) float64 {
	return clamp01(c.Input.Fill)
}

func clamp01(x float64) float64 {
	switch {
	case x < 0:
		return 0
	case x > 1:
		return 1
	}
	return x
}

// weightedPlugin pairs a score plugin with its configured weight.
type weightedPlugin struct {
	p ScorePlugin
	w float64
}

func pluginsFor(w Weights) []weightedPlugin {
	var out []weightedPlugin
	for _, wp := range []weightedPlugin{
		{TopologyPlugin{}, w.Topology},
		{FragmentationPlugin{}, w.Fragmentation},
		{LoadPlugin{}, w.Load},
		{BinpackPlugin{}, w.Binpack},
	} {
		if wp.w > 0 {
			out = append(out, wp)
		}
	}
	return out
}

// Shape is a typical member request, for fragmentation accounting.
type Shape struct {
	GPUs     int   // cards (1 for a share)
	Milli    int   // per card; 1000 = whole; 0 = CPU-only
	CPUMilli int64 // CPU
	MemMiB   int64 // memory
	Models   []string
	Freq     float64 // popularity, summing to 1 over a Workload
}

// Workload is the set of typical requests fragmentation is measured against.
type Workload []Shape

// FragOptions select the fragmentation measure.
type FragOptions struct {
	// Memory counts a node whose memory cannot host a shape as fragmented for that shape
	// (FGD only looks at CPU and GPU).
	Memory bool
	// CPUPerMilli, when positive, is the workload's CPU (milli-CPU) per milli-GPU: free
	// GPU share that the node's free CPU could not feed at that ratio is counted as
	// fragmented too (GPUs stranded by CPU exhaustion; FGD only sees a node as CPU-starved
	// once a single typical request no longer fits).
	CPUPerMilli float64
}

// NodeFrag returns the node's fragmented milli-GPU against the workload: for each typical
// shape, weighted by its popularity, the free GPU share that the shape could not use
// (all of it when the shape cannot run on the node at all, else the cards with less free
// share than the shape asks per card). This is FGD's measure (Weng et al., ATC'23), with
// memory added when opt.Memory is set.
func NodeFrag(n *Node, w Workload, opt FragOptions) float64 {
	total := 0
	for _, g := range n.GPUs {
		if !g.MIG {
			total += g.FreeMilli
		}
	}
	if total == 0 {
		return 0
	}
	var f float64
	for _, s := range w {
		f += s.Freq * float64(shapeFrag(n, &s, total, opt))
	}
	if opt.CPUPerMilli > 0 {
		f += max(0, float64(total)-float64(n.FreeCPU)/opt.CPUPerMilli)
	}
	return f
}

func shapeFrag(n *Node, s *Shape, total int, opt FragOptions) int {
	if s.Milli == 0 || n.FreeCPU < s.CPUMilli || (opt.Memory && n.FreeMem < s.MemMiB) {
		return total
	}
	fit, small := 0, 0
	for _, g := range n.GPUs {
		if g.MIG {
			continue
		}
		if g.FreeMilli >= s.Milli && ModelAllowed(s.Models, g.Model) {
			fit++
		} else {
			small += g.FreeMilli
		}
	}
	if fit < s.GPUs {
		return total
	}
	return small
}

// workloadLearner keeps the popularity of member shapes seen at submission. The workload
// it offers is rebuilt at each of the first learnEvery observations, then at every
// learnEvery-th: it is a function of the sequence of observations alone (not of when
// cycles asked for it), so that a scheduler given back its learned state (SetLearnedWorkload)
// scores fragmentation as the original did; between rebuilds fragmentation values stay
// comparable and cacheable.
type workloadLearner struct {
	counts map[shapeKey]float64
	total  float64
	n      int // observations
	since  int // observations since the workload was built
	cached Workload
}

// learnEvery is how many observations pass between rebuilds of the learned workload once
// the first ones are in; maxLearnedShapes bounds the shapes remembered (the least popular
// goes), so that the learned state stays small enough to be recorded with each admission.
const (
	learnEvery       = 64
	maxLearnedShapes = 128
)

type shapeKey struct {
	gpus, milli int
	cpu, mem    int64
}

func (a shapeKey) less(b shapeKey) bool {
	if a.gpus != b.gpus {
		return a.gpus < b.gpus
	}
	if a.milli != b.milli {
		return a.milli < b.milli
	}
	if a.cpu != b.cpu {
		return a.cpu < b.cpu
	}
	return a.mem < b.mem
}

func (l *workloadLearner) observe(m Member, n int) {
	if m.MIG != "" {
		return
	}
	if l.counts == nil {
		l.counts = map[shapeKey]float64{}
	}
	k := shapeKey{gpus: m.GPUs, milli: m.gpuMilli(), cpu: m.CPUMilli, mem: m.MemMiB}
	l.counts[k] += float64(n)
	l.total += float64(n)
	l.n++
	l.since++
	if len(l.counts) > maxLearnedShapes {
		var drop shapeKey
		first := true
		for s, c := range l.counts {
			if s == k {
				continue
			}
			if first || c < l.counts[drop] || c == l.counts[drop] && drop.less(s) {
				drop, first = s, false
			}
		}
		l.total -= l.counts[drop]
		delete(l.counts, drop)
	}
	if l.n <= learnEvery || l.since >= learnEvery {
		l.cached = l.build()
		l.since = 0
	}
}

// workload returns the shapes covering 95% of observed members (at most 16), as last built.
func (l *workloadLearner) workload() Workload { return l.cached }

func (l *workloadLearner) build() Workload {
	type kv struct {
		k shapeKey
		v float64
	}
	var all []kv
	for k, v := range l.counts {
		all = append(all, kv{k, v})
	}
	sort.Slice(all, func(i, j int) bool {
		if all[i].v != all[j].v {
			return all[i].v > all[j].v
		}
		return all[i].k.less(all[j].k)
	})
	var w Workload
	cum := 0.0
	for _, e := range all {
		if cum >= 0.95*l.total || len(w) >= 16 {
			break
		}
		w = append(w, Shape{GPUs: e.k.gpus, Milli: e.k.milli, CPUMilli: e.k.cpu, MemMiB: e.k.mem, Freq: e.v})
		cum += e.v
	}
	for i := range w {
		w[i].Freq /= cum
	}
	return w
}

// FragCache memoises NodeFrag by node state (model, free CPU and memory, the multiset of
// free card shares): nodes in the same state fragment the same way, and clusters have few
// distinct states. It is not safe for concurrent use.
type FragCache struct {
	w    Workload
	opt  FragOptions
	memo map[fragKey]float64
}

type fragKey struct {
	cpu, mem int64
	model    string
	n        int
	free     [8]int16
}

// NewFragCache returns a cache for one workload and measure.
func NewFragCache(w Workload, opt FragOptions) *FragCache {
	return &FragCache{w: w, opt: opt, memo: map[fragKey]float64{}}
}

// Frag returns NodeFrag(n, w, opt), from the cache when the state was seen before.
func (c *FragCache) Frag(n *Node) float64 {
	if len(n.GPUs) > 8 || len(n.GPUs) == 0 {
		return NodeFrag(n, c.w, c.opt)
	}
	k := fragKey{cpu: n.FreeCPU, model: n.GPUs[0].Model, n: len(n.GPUs)}
	if c.opt.Memory {
		k.mem = n.FreeMem
	}
	for i, g := range n.GPUs {
		if g.MIG || g.Model != k.model {
			return NodeFrag(n, c.w, c.opt)
		}
		// insertion sort: the measure does not depend on card order
		v := int16(g.FreeMilli)
		j := i
		for j > 0 && k.free[j-1] > v {
			k.free[j] = k.free[j-1]
			j--
		}
		k.free[j] = v
	}
	if f, ok := c.memo[k]; ok {
		return f
	}
	if len(c.memo) > 1<<20 {
		clear(c.memo)
	}
	f := NodeFrag(n, c.w, c.opt)
	c.memo[k] = f
	return f
}
