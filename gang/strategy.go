package gang

import (
	"fmt"
	"slices"
)

// The placement strategies (Request.Strategy) as plugins, each keyed on the gang's
// strategy and skipped (SkipPlugin) for every other gang:
//
//	strict-spread  Filter: a node that holds a member of the candidate already is refused.
//	strict-pack    Filter: a node other than the first member's is refused.
//	spread         Score (and MemberwisePlugin): members are placed one at a time, each
//	               preferring a machine with fewer of the gang's members.
//
// Being plugins of the core, strategy gangs queue, wait, preempt and are preempted like
// every gang: the preemption and reservation trials run the same filters.

// strictSpread is the Filter of StrategyStrictSpread: every member on a different machine.
type strictSpread struct{}

func (strictSpread) Name() string { return PluginStrictSpread }

func (strictSpread) Skip(_ *CycleState, g *QueuedGang) bool {
	return g.Request.Strategy != StrategyStrictSpread
}

func (strictSpread) Filter(_ *CycleState, _ *QueuedGang, c *Candidate, node int, _ *Node) *Status {
	if c.On(node) > 0 {
		return NewStatus(Unschedulable, WaitFragmented, "every member on a different machine")
	}
	return nil
}

// strictPack is the Filter of StrategyStrictPack: every member on one machine.
type strictPack struct{}

func (strictPack) Name() string { return PluginStrictPack }

func (strictPack) Skip(_ *CycleState, g *QueuedGang) bool {
	return g.Request.Strategy != StrategyStrictPack
}

func (strictPack) Filter(_ *CycleState, _ *QueuedGang, c *Candidate, node int, _ *Node) *Status {
	if c.Members() > 0 && c.Node(0) != node {
		return NewStatus(Unschedulable, WaitFragmented, "every member on one machine")
	}
	return nil
}

// pinned is the Filter of gangs pinned to machines (Request.Machines): every other node is
// refused.
type pinned struct{}

func (pinned) Name() string { return PluginMachines }

func (pinned) Skip(_ *CycleState, g *QueuedGang) bool { return len(g.Request.Machines) == 0 }

func (pinned) Filter(_ *CycleState, g *QueuedGang, _ *Candidate, _ int, n *Node) *Status {
	if !slices.Contains(g.Request.Machines, n.Name) {
		return NewStatus(Unschedulable, WaitFragmented, fmt.Sprintf("pinned to machines %v", g.Request.Machines))
	}
	return nil
}

// spreadScore is the Score of StrategySpread: the mean, over the members a candidate adds,
// of 1/k for a member that is the k-th of the gang on its machine (counting the members
// placed before). All on distinct machines scores 1; a member placed on its own scores 1
// on an unused machine, 1/2 next to one member of its gang. Its default weight (10)
// outweighs the other plugins together, so a spread gang's members take distinct machines
// whenever the candidates hold one with room.
type spreadScore struct{}

func (spreadScore) Name() string { return PluginSpread }

func (spreadScore) Skip(_ *CycleState, g *QueuedGang) bool {
	return g.Request.Strategy != StrategySpread
}

func (spreadScore) Memberwise(*CycleState, *QueuedGang) bool { return true }

func (spreadScore) Score(_ *CycleState, _ *QueuedGang, c *Candidate) float64 {
	if c.Added() == 0 {
		return 1
	}
	var sum float64
	for k := len(c.placed); k < c.Members(); k++ {
		node, on := c.Node(k), 1
		for j := range k {
			if c.Node(j) == node {
				on++
			}
		}
		sum += 1 / float64(on)
	}
	return sum / float64(c.Added())
}

// defaultSpreadWeight is the spread score's weight when Plugins.Score is nil: above the
// sum of the default weights of the other plugins (1.8), so that the 1/2 between an
// unused machine and one holding a member of the gang decides.
const defaultSpreadWeight = 10

// strategyNeverFits returns why no state of the cluster could ever place r under its
// strict strategy (when the strategy's plugin is configured), or "": a strict spread over
// more machines than could each hold one member, a strict pack larger than any machine
// could hold. It looks at every node's capacity, cordoned ones included (a cordon ends).
func (s *Scheduler) strategyNeverFits(r *Request) string {
	pin := len(r.Machines) > 0 && s.prof.has(PluginMachines)
	var on bool
	switch r.Strategy {
	case StrategyStrictSpread:
		on = s.prof.has(PluginStrictSpread)
	case StrategyStrictPack:
		on = s.prof.has(PluginStrictPack)
	}
	if !on && !pin {
		return ""
	}
	hosts, most, named := 0, 0, 0
	for i := range s.c.nodes {
		n := &s.c.nodes[i]
		if pin && !slices.Contains(r.Machines, n.Name) {
			continue
		}
		named++
		k := holds(n, r.Member, r.GPUModels)
		if k > 0 {
			hosts++
		}
		most = max(most, k)
	}
	switch {
	case pin && named == 0:
		return fmt.Sprintf("pinned to machines %v, none of which is in the cluster", r.Machines)
	case r.Strategy == StrategyStrictSpread && on && hosts < r.Min:
		return fmt.Sprintf("strict spread of %d members over distinct machines: %d machine(s) can hold one", r.Min, hosts)
	case r.Strategy == StrategyStrictPack && on && most < r.Min:
		return fmt.Sprintf("strict pack of %d members on one machine: a machine holds at most %d", r.Min, most)
	}
	return ""
}

// holds returns how many members m an empty n could hold (capped at 1<<20).
func holds(n *Node, m Member, models []string) int {
	k := 1 << 20
	if m.CPUMilli > 0 {
		k = min(k, int(n.CPUMilli/m.CPUMilli))
	}
	if m.MemMiB > 0 {
		k = min(k, int(n.MemMiB/m.MemMiB))
	}
	if m.GPUs == 0 {
		return k
	}
	gpus := 0
	slices, _ := MIGSlices(m.MIG)
	for _, g := range n.GPUs {
		if !ModelAllowed(models, g.Model) {
			continue
		}
		switch {
		case m.MIG != "":
			if g.MIG {
				gpus += MIGSlicesPerGPU / slices
			}
		case g.MIG:
		case m.gpuMilli() < Milli:
			gpus += Milli / m.gpuMilli()
		default:
			gpus++
		}
	}
	if m.MIG == "" && m.gpuMilli() == Milli {
		gpus /= m.GPUs
	}
	return min(k, gpus)
}
