package head

import (
	"fmt"
	"sort"
	"time"

	"github.com/atoll-run/atoll/gang"
	"github.com/atoll-run/atoll/runtime/api"
)

// The scheduler core places a gang on as few islands and machines as it can (which is the
// pack strategy); it has no filter that spreads members over machines or pins them to one.
// Gangs with those strategies, and gangs pinned to named machines (GangSpec.Machines), are
// placed here, on the core's current free capacity, and handed to the core with Adopt, so
// the core still accounts for every card they hold.

// headPlaced reports whether the head, not the core's cycle, places gangs of this spec.
func headPlaced(s api.GangSpec) bool {
	if len(s.Machines) > 0 {
		return true
	}
	switch s.Strategy {
	case api.StrategySpread, api.StrategyStrictSpread, api.StrategyStrictPack:
		return true
	}
	return false
}

// strategyNode is one node's free capacity while a placement is being tried.
type strategyNode struct {
	index   int
	n       gang.Node
	members int // members placed on it so far
}

// fit takes one member's resources from the node, and returns its placement, or false.
func (sn *strategyNode) fit(m gang.Member) (gang.MemberPlacement, bool) {
	n := &sn.n
	if n.Unschedulable || n.FreeCPU < m.CPUMilli || n.FreeMem < m.MemMiB {
		return gang.MemberPlacement{}, false
	}
	mp := gang.MemberPlacement{Node: sn.index, NodeName: n.Name, CPUMilli: m.CPUMilli, MemMiB: m.MemMiB}
	switch {
	case m.MIG != "":
		slices, _ := gang.MIGSlices(m.MIG)
		best := -1
		for i, g := range n.GPUs {
			if g.MIG && g.FreeSlices >= slices && (best < 0 || g.FreeSlices < n.GPUs[best].FreeSlices) {
				best = i
			}
		}
		if best < 0 {
			return gang.MemberPlacement{}, false
		}
		n.GPUs[best].FreeSlices -= slices
		mp.GPUs, mp.MIG = []int{best}, m.MIG
	case m.GPUs > 0 && m.GPUMilli > 0 && m.GPUMilli < gang.Milli:
		best := -1
		for i, g := range n.GPUs {
			if !g.MIG && g.FreeMilli >= m.GPUMilli && (best < 0 || g.FreeMilli < n.GPUs[best].FreeMilli) {
				best = i
			}
		}
		if best < 0 {
			return gang.MemberPlacement{}, false
		}
		n.GPUs[best].FreeMilli -= m.GPUMilli
		mp.GPUs, mp.Milli = []int{best}, m.GPUMilli
	case m.GPUs > 0:
		var cards []int
		for i, g := range n.GPUs {
			if !g.MIG && g.FreeMilli == gang.Milli && len(cards) < m.GPUs {
				cards = append(cards, i)
			}
		}
		if len(cards) < m.GPUs {
			return gang.MemberPlacement{}, false
		}
		for _, i := range cards {
			n.GPUs[i].FreeMilli = 0
		}
		mp.GPUs, mp.Milli = cards, gang.Milli
	}
	n.FreeCPU -= m.CPUMilli
	n.FreeMem -= m.MemMiB
	sn.members++
	return mp, true
}

// free is a node's free capacity, for ordering: whole idle cards, then GPU share, then CPU.
func (sn *strategyNode) free() (int, int, int64) {
	whole, milli := 0, 0
	for _, g := range sn.n.GPUs {
		if g.MIG {
			milli += g.FreeSlices * gang.Milli / gang.MIGSlicesPerGPU
			continue
		}
		milli += g.FreeMilli
		if g.FreeMilli == gang.Milli {
			whole++
		}
	}
	return whole, milli, sn.n.FreeCPU
}

func moreFree(a, b *strategyNode) bool {
	aw, am, ac := a.free()
	bw, bm, bc := b.free()
	switch {
	case aw != bw:
		return aw > bw
	case am != bm:
		return am > bm
	case ac != bc:
		return ac > bc
	}
	return a.index < b.index
}

// placeByStrategy finds members for a gang of this spec on the scheduler's free capacity:
// the placement, or why there is none now, and whether there can never be one (it does
// not fit the same machines empty either).
func placeByStrategy(s *gang.Scheduler, spec api.GangSpec) ([]gang.MemberPlacement, string, bool) {
	nodes := make([]gang.Node, s.NumNodes())
	for i := range nodes {
		nodes[i] = s.Node(i)
	}
	members, reason := placeOn(nodes, spec)
	if members != nil {
		return members, "", false
	}
	if allowed, _ := allowedNodes(nodes, spec.Machines); len(allowed) == 0 {
		return nil, reason, true
	}
	for i := range nodes { // the same machines, empty
		n := &nodes[i]
		n.FreeCPU, n.FreeMem = n.CPUMilli, n.MemMiB
		for g := range n.GPUs {
			n.GPUs[g].FreeMilli, n.GPUs[g].FreeSlices = gang.Milli, gang.MIGSlicesPerGPU
		}
	}
	if empty, _ := placeOn(nodes, spec); empty == nil {
		return nil, reason + ", even on empty machines", true
	}
	return nil, reason, false
}

// placeOn places a gang by its strategy on nodes (copies: they are not changed): on the
// machines it is pinned to, when it names some.
func placeOn(snapshot []gang.Node, spec api.GangSpec) ([]gang.MemberPlacement, string) {
	m := coreMember(spec)
	if m.MIG != "" {
		m.GPUs = 1
	}
	allowed, on := allowedNodes(snapshot, spec.Machines)
	if len(allowed) == 0 {
		return nil, fmt.Sprintf("none of the machines %v it is pinned to is in the cluster", spec.Machines)
	}
	fresh := func() []*strategyNode {
		nodes := make([]*strategyNode, len(allowed))
		for k, i := range allowed {
			n := snapshot[i]
			n.GPUs = append([]gang.GPU(nil), n.GPUs...)
			nodes[k] = &strategyNode{index: i, n: n}
		}
		return nodes
	}
	members, reason := placeOnNodes(fresh, m, spec)
	if members == nil {
		reason += on
	}
	return members, reason
}

// allowedNodes returns the indices of the nodes a gang pinned to machines may use (every
// node when it names none), and how a reason says so.
func allowedNodes(snapshot []gang.Node, machines []string) ([]int, string) {
	var out []int
	if len(machines) == 0 {
		for i := range snapshot {
			out = append(out, i)
		}
		return out, ""
	}
	pinned := make(map[string]bool, len(machines))
	for _, name := range machines {
		pinned[name] = true
	}
	for i, n := range snapshot {
		if pinned[n.Name] {
			out = append(out, i)
		}
	}
	return out, fmt.Sprintf(" on the machines it is pinned to %v", machines)
}

// placeOnNodes places the members by the spec's strategy on the nodes fresh makes.
func placeOnNodes(fresh func() []*strategyNode, m gang.Member, spec api.GangSpec) ([]gang.MemberPlacement, string) {
	n := spec.Workers
	switch spec.Strategy {
	case api.StrategyStrictSpread:
		nodes := fresh()
		if n > len(nodes) {
			return nil, fmt.Sprintf("strict spread of %d members over %d machines", n, len(nodes))
		}
		sort.Slice(nodes, func(i, j int) bool { return moreFree(nodes[i], nodes[j]) })
		var out []gang.MemberPlacement
		for _, sn := range nodes {
			if len(out) == n {
				break
			}
			if mp, ok := sn.fit(m); ok {
				out = append(out, mp)
			}
		}
		if len(out) < n {
			return nil, fmt.Sprintf("strict spread: only %d of %d machines have room for a member (%+v)", len(out), n, spec.Resources)
		}
		return out, ""
	case api.StrategyStrictPack:
		nodes := fresh()
		// The fullest machine that takes them all (best fit), so that big holes stay whole.
		sort.Slice(nodes, func(i, j int) bool { return moreFree(nodes[j], nodes[i]) })
		for _, sn := range nodes {
			out := make([]gang.MemberPlacement, 0, n)
			for len(out) < n {
				mp, ok := sn.fit(m)
				if !ok {
					break
				}
				out = append(out, mp)
			}
			if len(out) == n {
				return out, ""
			}
		}
		return nil, fmt.Sprintf("strict pack: no machine has room for all %d members (%+v)", n, spec.Resources)
	case "", api.StrategyPack: // a pinned gang: as few of its machines as it can
		nodes := fresh()
		sort.Slice(nodes, func(i, j int) bool { return moreFree(nodes[j], nodes[i]) })
		for _, sn := range nodes { // the fullest machine that takes them all
			probe := *sn
			probe.n.GPUs = append([]gang.GPU(nil), sn.n.GPUs...)
			k := 0
			for ; k < n; k++ {
				if _, ok := probe.fit(m); !ok {
					break
				}
			}
			if k == n {
				out := make([]gang.MemberPlacement, 0, n)
				for len(out) < n {
					mp, _ := sn.fit(m)
					out = append(out, mp)
				}
				return out, ""
			}
		}
		// None takes them all: fill the machines with the most room first.
		sort.Slice(nodes, func(i, j int) bool { return moreFree(nodes[i], nodes[j]) })
		out := make([]gang.MemberPlacement, 0, n)
		for _, sn := range nodes {
			for len(out) < n {
				mp, ok := sn.fit(m)
				if !ok {
					break
				}
				out = append(out, mp)
			}
		}
		if len(out) < n {
			return nil, fmt.Sprintf("pack: room for %d of %d members (%+v)", len(out), n, spec.Resources)
		}
		return out, ""
	default: // spread
		nodes := fresh()
		out := make([]gang.MemberPlacement, 0, n)
		for len(out) < n {
			sort.Slice(nodes, func(i, j int) bool {
				if nodes[i].members != nodes[j].members {
					return nodes[i].members < nodes[j].members
				}
				return moreFree(nodes[i], nodes[j])
			})
			placed := false
			for _, sn := range nodes {
				if mp, ok := sn.fit(m); ok {
					out = append(out, mp)
					placed = true
					break
				}
			}
			if !placed {
				return nil, fmt.Sprintf("spread: room for %d of %d members (%+v)", len(out), n, spec.Resources)
			}
		}
		return out, ""
	}
}

// placeHeadLocked places a head-placed gang by its strategy, adopts it into the core and
// returns its commit; or the reason it cannot be placed now, and whether it never can.
func (c *Controller) placeHeadLocked(t *term, e *gangEntry, now time.Time) (*commitFn, string, bool) {
	if t.sched == nil {
		return nil, "no machine is alive", false
	}
	spec := e.rec.Spec
	members, reason, never := placeByStrategy(t.sched, spec)
	if members == nil {
		return nil, reason, never
	}
	req, err := c.coreRequestLocked(t, spec)
	if err != nil {
		return nil, err.Error(), true
	}
	if err := t.sched.Adopt(req, members, now); err != nil {
		return nil, err.Error(), false
	}
	p := gang.Placement{Gang: spec.Key(), Members: members}
	machines, islands := map[int]bool{}, map[int]bool{}
	for _, m := range members {
		machines[m.Node] = true
		if t.topo != nil && m.Node < len(t.topo.Machines) {
			tm := t.topo.Machines[m.Node]
			for _, g := range m.GPUs {
				if g >= 0 && g < len(tm.GPUs) {
					islands[t.topo.IslandOf(tm.GPUs[g].ID)] = true
				}
			}
		}
	}
	p.Machines, p.Islands = len(machines), len(islands)
	rec := e.rec
	rec.Placement = c.placementLocked(t, p)
	rec.State, rec.Reason, rec.Updated = api.GangStarting, "", now
	e.ready = map[int]api.Worker{}
	w := gangCommitLocked(e, rec, "placement of "+spec.Key()+" ("+string(spec.Strategy)+")")
	return &w, "", false
}

// placeHeadPendingLocked places the pending head-placed gangs that fit now.
func (c *Controller) placeHeadPendingLocked(t *term, now time.Time) []commitFn {
	var keys []string
	for k, e := range t.gangs {
		if e.rec.State == api.GangPending && headPlaced(e.rec.Spec) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var work []commitFn
	for _, k := range keys {
		e := t.gangs[k]
		if w, reason, _ := c.placeHeadLocked(t, e, now); w != nil {
			work = append(work, *w)
		} else {
			e.rec.Reason = reason
		}
	}
	return work
}
