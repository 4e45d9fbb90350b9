package topology

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// Algo is an AllReduce algorithm for the alpha-beta model. The zero value is Best.
type Algo int

// Algorithms.
const (
	// Best picks the fastest of the others for the given GPUs and size.
	Best Algo = iota
	// Ring: reduce-scatter then all-gather around a ring in global-id order;
	// T = 2(p-1)·α + 2(p-1)/p · n/B, with B the ring's slowest hop.
	Ring
	// Tree: NCCL's double binary tree; T = 2⌈log2 p⌉·α + 2n/B. Slower than Ring for large
	// messages, faster for small ones on many GPUs.
	Tree
	// Hierarchical: reduce-scatter inside each NVLink island, AllReduce of the shards across
	// islands (every GPU on its own NIC, in parallel), all-gather inside each island.
	Hierarchical
	// NVLS: NVLink SHARP, reduction inside the NVSwitch; only when every GPU of the set is in
	// one island on a SHARP-capable switch fabric (H100/H200/GB200); T = 2α + n/(B·e).
	NVLS
)

var algoNames = [...]string{"best", "ring", "tree", "hierarchical", "nvls"}

// String returns the algorithm's name.
func (a Algo) String() string {
	if a < 0 || int(a) >= len(algoNames) {
		return fmt.Sprintf("algo(%d)", int(a))
	}
	return algoNames[a]
}

// MarshalText writes the algorithm's name.
func (a Algo) MarshalText() ([]byte, error) { return []byte(a.String()), nil }

// ParseAlgo reads an algorithm name ("best", "ring", "tree", "hierarchical", "nvls").
func ParseAlgo(s string) (Algo, error) {
	for i, n := range algoNames {
		if n == s {
			return Algo(i), nil
		}
	}
	return 0, fmt.Errorf("topology: unknown AllReduce algorithm %q (want one of %v)", s, algoNames)
}

// Algos lists the concrete algorithms (not Best).
func Algos() []Algo { return []Algo{Ring, Tree, Hierarchical, NVLS} }

// Unreachable is the time returned for an AllReduce that cannot be estimated (unknown GPU
// ids, or NVLS on GPUs without a SHARP fabric): slower than anything real.
const Unreachable = time.Duration(math.MaxInt64)

// AllReduceEstimate is the model's estimate for one AllReduce.
type AllReduceEstimate struct {
	// Requested is the algorithm asked for; Algo the one estimated (for Best, the fastest).
	Requested Algo `json:"requested"`
	Algo      Algo `json:"algo"`
	// GPUs is the number of distinct GPUs; Bytes the message size.
	GPUs  int   `json:"gpus"`
	Bytes int64 `json:"bytes"`
	// Time is the estimated duration; Unreachable if the algorithm does not apply.
	Time time.Duration `json:"timeNs"`
	// AlgBWGBps is bytes/time; BusBWGBps is AlgBW·2(p-1)/p, as nccl-tests reports it.
	AlgBWGBps float64 `json:"algbwGBps"`
	BusBWGBps float64 `json:"busbwGBps"`
	// Bottleneck is the tier of the slowest hop.
	Bottleneck Tier `json:"bottleneck"`
	// Islands is the number of NVLink islands the GPUs span.
	Islands int `json:"islands"`
}

// AllReduceTime estimates the time of an AllReduce of `bytes` bytes over the given GPUs
// (global ids; duplicates are ignored). One GPU or zero bytes take 0; unknown ids, or an
// algorithm that does not apply (NVLS without a SHARP fabric), give Unreachable.
func (c *Cluster) AllReduceTime(gpus []int, bytes int64, algo Algo) time.Duration {
	return c.AllReduce(gpus, bytes, algo).Time
}

// AllReduce estimates an AllReduce and returns the details (bandwidths, bottleneck).
func (c *Cluster) AllReduce(gpus []int, bytes int64, algo Algo) AllReduceEstimate {
	ids := slices.Clone(gpus)
	slices.Sort(ids)
	ids = slices.Compact(ids)
	est := AllReduceEstimate{Requested: algo, Algo: algo, GPUs: len(ids), Bytes: bytes}
	for _, id := range ids {
		if c.GPU(id) == nil {
			est.Time = Unreachable
			return est
		}
	}
	est.Islands = c.countIslands(ids)
	if len(ids) <= 1 || bytes <= 0 {
		if algo == Best {
			est.Algo = Ring
		}
		return est
	}
	var rc ringCache
	if algo != Best {
		return c.estimate(est, ids, &rc)
	}
	best := est
	best.Time = Unreachable
	// On ties the simpler algorithm wins.
	for _, a := range []Algo{Ring, NVLS, Tree, Hierarchical} {
		e := est
		e.Algo = a
		if e = c.estimate(e, ids, &rc); e.Time < best.Time {
			best = e
		}
	}
	return best
}

// ringCache keeps one ring computation for the algorithms that share it.
type ringCache struct {
	done  bool
	b     float64
	alpha time.Duration
	tier  Tier
}

func (rc *ringCache) get(c *Cluster, ids []int) (float64, time.Duration, Tier) {
	if !rc.done {
		rc.b, rc.alpha, rc.tier = c.ring(ids)
		rc.done = true
	}
	return rc.b, rc.alpha, rc.tier
}

// estimate fills est for est.Algo over sorted, distinct, valid ids (at least two).
func (c *Cluster) estimate(est AllReduceEstimate, ids []int, rc *ringCache) AllReduceEstimate {
	bytes := est.Bytes
	switch est.Algo {
	case Ring:
		b, alpha, tier := rc.get(c, ids)
		est.Time = us(c.model.RingBaseLatencyUs) + ringTime(len(ids), bytes, b, alpha)
		est.Bottleneck = tier
	case Tree:
		b, alpha, tier := rc.get(c, ids)
		steps := math.Ceil(math.Log2(float64(len(ids))))
		est.Time = us(c.model.TreeBaseLatencyUs) + time.Duration(2*steps*float64(alpha)) + secs(2*float64(bytes)/(b*1e9))
		est.Bottleneck = tier
	case NVLS:
		b, ok := c.nvls(ids)
		if !ok {
			est.Time = Unreachable
			return est
		}
		est.Time = c.nvlsLatency() + secs(float64(bytes)/(b*1e9))
		est.Bottleneck = TierNVSwitch
	case Hierarchical:
		est.Time, est.Bottleneck = c.hierarchical(ids, bytes)
	default:
		est.Time = Unreachable
		return est
	}
	if est.Time > 0 && est.Time != Unreachable {
		p := float64(len(ids))
		est.AlgBWGBps = float64(bytes) / est.Time.Seconds() / 1e9
		est.BusBWGBps = est.AlgBWGBps * 2 * (p - 1) / p
	}
	return est
}

func secs(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// nvlsLatency is NVLS's fixed cost: its base latency and one step into and out of the switch.
func (c *Cluster) nvlsLatency() time.Duration {
	return us(c.model.NVLSBaseLatencyUs) + 2*us(c.model.NVSwitchLatencyUs)
}

// ringTime is a ring's step latencies plus its transfer time, without the base latency.
func ringTime(p int, bytes int64, b float64, alpha time.Duration) time.Duration {
	if p <= 1 {
		return 0
	}
	steps := 2 * float64(p-1)
	return time.Duration(steps*float64(alpha)) + secs(steps/float64(p)*float64(bytes)/(b*1e9))
}

func (c *Cluster) countIslands(ids []int) int {
	if len(ids) == 0 {
		return 0
	}
	ks := make([]int32, len(ids))
	for i, id := range ids {
		ks[i] = c.islandOf[id]
	}
	slices.Sort(ks)
	return len(slices.Compact(ks))
}

// ring returns the effective bottleneck bandwidth (GB/s), the largest per-step latency and
// the bottleneck tier of a ring over sorted ids. Hops inside a machine or an NVLink domain
// use the pair's link; hops between machines over the network carry one ring per rail
// (NCCL runs a ring per NIC), so their bandwidth is the sum of the distinct NICs the set's
// GPUs use on each side.
func (c *Cluster) ring(ids []int) (float64, time.Duration, Tier) {
	// ids are sorted, so each machine's GPUs form one run; rails[r] is the aggregate NIC
	// bandwidth of the distinct NICs used by run r's GPUs.
	var rails []float64
	for i := 0; i < len(ids); {
		machine := c.loc[ids[i]].machine
		mt := c.mach[machine].mt
		var seen uint64
		var extra map[int]bool
		rail := 0.0
		j := i
		for ; j < len(ids) && c.loc[ids[j]].machine == machine; j++ {
			local := int(c.loc[ids[j]].index)
			k := mt.nic[local] + 1 // 0 = no NIC
			if k < 64 {
				if seen&(1<<k) != 0 {
					continue
				}
				seen |= 1 << k
			} else {
				if extra == nil {
					extra = map[int]bool{}
				}
				if extra[k] {
					continue
				}
				extra[k] = true
			}
			rail += c.nicGBpsOf(mt, local)
		}
		rails = append(rails, rail)
		i = j
	}
	b := math.Inf(1)
	var alpha time.Duration
	tier := TierSelf
	run := 0
	for i := range ids {
		a, z := ids[i], ids[(i+1)%len(ids)]
		l := c.Link(a, z)
		bw := l.GBps * c.model.efficiency(l.Tier)
		next := run
		if c.loc[a].machine != c.loc[z].machine {
			next = (run + 1) % len(rails)
		}
		if l.Tier == TierNetLeaf || l.Tier == TierNetSpine {
			bw = min(rails[run], rails[next]) * c.model.NetEfficiency
			if l.Tier == TierNetSpine {
				bw /= c.Network.Oversubscription
			}
		}
		run = next
		if bw < b {
			b, tier = bw, l.Tier
		}
		alpha = max(alpha, l.Latency)
	}
	return b, alpha, tier
}

// nvls returns the NVLS algorithm bandwidth for ids, if they all sit in one island on a
// SHARP-capable switched fabric.
func (c *Cluster) nvls(ids []int) (float64, bool) {
	island := c.islandOf[ids[0]]
	bw := math.Inf(1)
	for _, id := range ids {
		g := c.gpus[id]
		m := c.Machines[g.Machine]
		if c.islandOf[id] != island || m.NVLink == nil || !m.NVLink.SHARP || g.NVSwitchLinks == 0 || g.MIGEnabled {
			return 0, false
		}
		bw = min(bw, float64(g.NVSwitchLinks)*m.NVLink.LinkGBps)
	}
	return bw * c.model.NVLSEfficiency, true
}

// hierarchical: intra-island AllReduce (as reduce-scatter + all-gather, its best of ring
// and NVLS) and an inter-island ring over shards of n/g, every GPU on its own path. NCCL
// pipelines chunks through the stages, so the bandwidth terms overlap (the slower stage
// dominates) while the latency terms add.
func (c *Cluster) hierarchical(ids []int, bytes int64) (time.Duration, Tier) {
	groups := map[int32][]int{}
	var order []int32
	for _, id := range ids {
		k := c.islandOf[id]
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], id)
	}
	var intra, intraLat time.Duration
	tier := TierSelf
	g := math.MaxInt
	for _, k := range order {
		grp := groups[k]
		g = min(g, len(grp))
		if len(grp) < 2 {
			continue
		}
		b, alpha, bt := c.ring(grp)
		t, lat := ringTime(len(grp), bytes, b, alpha), ringTime(len(grp), 0, b, alpha)
		if nb, ok := c.nvls(grp); ok {
			nl := c.nvlsLatency() - us(c.model.RingBaseLatencyUs)
			if tn := nl + secs(float64(bytes)/(nb*1e9)); tn < t {
				t, lat, bt = tn, nl, TierNVSwitch
			}
		}
		if t > intra {
			intra, intraLat, tier = t, lat, bt
		}
	}
	k := len(order)
	if k < 2 {
		return us(c.model.RingBaseLatencyUs) + intra, tier
	}
	// Inter-island ring: hop i joins group i and i+1; each of the g GPU positions runs its
	// own ring over its shard, sharing NICs where GPUs of a group share one.
	perGPU := make([]float64, k) // per-GPU network GB/s of each group
	for i, key := range order {
		grp := groups[key]
		users := map[[2]int]int{}
		for _, id := range grp {
			gp := c.gpus[id]
			users[[2]int{gp.Machine, c.Machines[gp.Machine].mt.nic[gp.Index]}]++
		}
		perGPU[i] = math.Inf(1)
		for _, id := range grp {
			gp := c.gpus[id]
			m := c.Machines[gp.Machine]
			n := users[[2]int{gp.Machine, m.mt.nic[gp.Index]}]
			perGPU[i] = min(perGPU[i], c.nicGBpsOf(m.mt, gp.Index)/float64(n))
		}
	}
	b := math.Inf(1)
	var alpha time.Duration
	interTier := TierSelf
	for i := 0; i < k; i++ {
		a, z := groups[order[i]][0], groups[order[(i+1)%k]][0]
		l := c.Link(a, z)
		bw := l.GBps * c.model.efficiency(l.Tier)
		switch l.Tier {
		case TierNetLeaf, TierNetSpine:
			bw = min(perGPU[i], perGPU[(i+1)%k]) * c.model.NetEfficiency
			if l.Tier == TierNetSpine {
				bw /= c.Network.Oversubscription
			}
		case TierPCIeSwitch, TierPCIeHostBridge, TierCrossSocket:
			// The g parallel rings share the PCIe uplink or the socket interconnect.
			bw /= float64(g)
		}
		if bw < b {
			b, interTier = bw, l.Tier
		}
		alpha = max(alpha, l.Latency)
	}
	shard := bytes / int64(g)
	if shard < 1 {
		shard = 1
	}
	inter, interLat := ringTime(k, shard, b, alpha), ringTime(k, 0, b, alpha)
	if inter-interLat > intra-intraLat {
		tier = interTier
	}
	return us(c.model.RingBaseLatencyUs) + intraLat + interLat + max(intra-intraLat, inter-interLat), tier
}
