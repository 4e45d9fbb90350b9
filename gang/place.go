package gang

import (
	"fmt"
	"sort"
)

// candidate is one possible all-or-nothing placement of a gang.
type candidate struct {
	allocs []alloc
	in     ScoreInput
	scores []PluginScore
	total  float64
}

// nodeBefore remembers a node's fragmentation before a tentative placement touched it.
type nodeBefore struct {
	node int
	frag float64
}

func (s *Scheduler) workload() Workload {
	if s.fixedWorkload != nil {
		return s.fixedWorkload
	}
	return s.learner.workload()
}

func (s *Scheduler) fragOn() bool { return s.cfg.Weights.Fragmentation > 0 }

// nodeFrag is the memoised fragmentation of node i against the current workload.
func (s *Scheduler) nodeFrag(i int) float64 {
	w := s.workload()
	if s.frag == nil || len(w) == 0 || len(s.fragW) != len(w) || &s.fragW[0] != &w[0] {
		s.frag = NewFragCache(w, s.fragOpt)
		s.fragW = w
	}
	return s.frag.Frag(&s.c.nodes[i])
}

// place finds the best placement of members members of g, the gang of the current attempt
// (s.att), or returns nil (s.unfit says why). The cluster state is unchanged on return.
func (s *Scheduler) place(g *gangState, members int, excl map[int]bool) *candidate {
	m := g.req.Member
	if s.c.totalMilli-s.c.usedMilli < int64(members)*int64(m.TotalMilli()) {
		return nil // fast path: no index walk when capacity is short
	}
	var cands []*candidate
	if s.att.memberwise {
		// A Score plugin rates members relative to each other (spread): one at a time.
		if c := s.placeGreedy(g, members, excl, false); c != nil {
			cands = append(cands, c)
		}
	} else if !s.cfg.TopologyAware {
		if c := s.placeGreedy(g, members, excl, true); c != nil {
			cands = append(cands, c)
		}
	} else if w := m.wholeGPUs(); w > 0 {
		cands = s.wholePlans(g, members, w, excl)
	} else {
		if c := s.placeGreedy(g, members, excl, false); c != nil {
			cands = append(cands, c)
		}
	}
	if s.compactOnly {
		kept := cands[:0]
		for _, c := range cands {
			if c.in.Machines <= c.in.MinMachines {
				kept = append(kept, c)
			}
		}
		cands = kept
	}
	if g.req.SameIsland {
		// Request.SameIsland: every member's cards in one NVLink island, or the gang waits.
		kept := cands[:0]
		for _, c := range cands {
			if c.in.Islands <= 1 {
				kept = append(kept, c)
			}
		}
		cands = kept
	}
	if len(cands) == 0 {
		return nil
	}
	return s.pick(cands, nil)
}

// unfit says, with the numbers, why members members of g found no placement.
func (s *Scheduler) unfit(g *gangState, members int, excl map[int]bool) *Status {
	c := s.c
	m := g.req.Member
	need := int64(members) * int64(m.TotalMilli())
	free := c.totalMilli - c.usedMilli
	what := fmt.Sprintf("%d member(s) × %s", members, m.describe())
	if len(g.req.GPUModels) > 0 {
		what += fmt.Sprintf(" of models %v", g.req.GPUModels)
	}
	if free < need {
		return NewStatus(Unschedulable, WaitCapacity, fmt.Sprintf("needs %s GPUs (%s), %s free in the cluster", gpus(need), what, gpus(free)))
	}
	if len(excl) > 0 {
		holders := map[string]bool{}
		for _, r := range s.holds {
			holders[r.gang] = true
		}
		for _, r := range s.resvs {
			holders[r.gang] = true
		}
		names := make([]string, 0, len(holders))
		for h := range holders {
			if h != g.req.ID {
				names = append(names, h)
			}
		}
		sort.Strings(names)
		return NewStatus(Unschedulable, WaitReserved, fmt.Sprintf("no placement for %s outside the %d node(s) held for %v; %s GPUs free in the cluster",
			what, len(excl), names, gpus(free)))
	}
	if s.compactOnly {
		return NewStatus(Unschedulable, WaitTopology, fmt.Sprintf("no placement for %s on the fewest machines", what))
	}
	if g.req.SameIsland && m.GPUs > 0 {
		return NewStatus(Unschedulable, WaitTopology, fmt.Sprintf("no placement for %s in one NVLink island (the gang asks for one); %s GPUs free in the cluster", what, gpus(free)))
	}
	if r := s.att.rejected; r != nil {
		// A Filter plugin refused nodes that had room: its rule is the reason.
		return NewStatus(Unschedulable, WaitFragmented, fmt.Sprintf("no placement fits %s: %s (plugin %s); %s GPUs free in the cluster", what, r.Reason, r.Plugin, gpus(free)))
	}
	detail := ""
	switch {
	case m.MIG != "":
		detail = fmt.Sprintf("no MIG GPU with %d free slices on a node with the member's CPU and memory", migSlices(m.MIG))
	case m.GPUs > 0 && m.gpuMilli() < Milli:
		detail = fmt.Sprintf("no card with %d milli-GPU free on a node with the member's CPU and memory", m.GPUMilli)
	case m.GPUs > 0:
		idle, most := 0, 0
		for f := 1; f < len(c.byFree); f++ {
			if n := c.byFree[f].len(); n > 0 {
				idle += f * n
				most = f
			}
		}
		detail = fmt.Sprintf("%d idle cards in the cluster, at most %d on one machine, a member needs %d", idle, most, m.GPUs)
		if most >= m.GPUs {
			detail += "; the machines with idle cards lack the CPU, memory or GPU model"
		}
	default:
		detail = fmt.Sprintf("no node has %d milli-CPU and %d MiB free", m.CPUMilli, m.MemMiB)
	}
	return NewStatus(Unschedulable, WaitFragmented, fmt.Sprintf("no placement fits %s: %s", what, detail))
}

// gpus formats milli-GPU as GPUs.
func gpus(milli int64) string {
	if milli%Milli == 0 {
		return fmt.Sprintf("%d", milli/Milli)
	}
	return fmt.Sprintf("%.3g", float64(milli)/Milli)
}

func migSlices(profile string) int {
	n, _ := MIGSlices(profile)
	return n
}

// pick scores candidates with the weighted plugins of the attempt and returns the best
// (first on ties). Each candidate adds its members to prior, the members placed before.
func (s *Scheduler) pick(cands []*candidate, prior []alloc) *candidate {
	at := s.att
	if len(at.base) > 0 {
		prior = append(at.base[:len(at.base):len(at.base)], prior...)
	}
	best := cands[0].in.AllReduce
	for _, c := range cands[1:] {
		if c.in.AllReduce < best {
			best = c.in.AllReduce
		}
	}
	var top *candidate
	for _, c := range cands {
		c.in.BestAllReduce = best
		c.total = 0
		c.scores = c.scores[:0]
		pc := Candidate{placed: prior, add: c.allocs, Input: &c.in}
		for _, wp := range at.scores {
			sc := wp.p.Score(at.state, at.g, &pc)
			c.scores = append(c.scores, PluginScore{Plugin: wp.p.Name(), Score: sc, Weight: wp.w})
			c.total += wp.w * sc
		}
		if top == nil || c.total > top.total+1e-12 {
			top = c
		}
	}
	return top
}

// wholePlans proposes placements for members needing w whole cards each, smallest domain
// first: one machine (best fit from the free-card buckets), one NVLink island spanning
// machines, one rack, then the fewest racks. Only the first level that yields a placement
// is scored; at most MaxCandidates plans are tried per level.
func (s *Scheduler) wholePlans(g *gangState, members, w int, excl map[int]bool) []*candidate {
	c := s.c
	D := members * w
	K := s.cfg.MaxCandidates
	var out []*candidate
	if D <= c.maxGPUs {
		tries := 0
		for f := D; f <= c.maxGPUs && len(out) < K && tries < 4*K; f++ {
			c.byFree[f].each(func(n int) bool {
				if excl[n] {
					return true
				}
				tries++
				if cand := s.tryPlan(g, members, []int{n}); cand != nil {
					out = append(out, cand)
					if len(out) >= K {
						return false
					}
				}
				return tries < 4*K
			})
		}
		if len(out) > 0 {
			return out
		}
	}
	domainPlans := func(free []int, nodesOf [][]int) []*candidate {
		type dom struct{ id, free int }
		var doms []dom
		for id, f := range free {
			if f >= D {
				doms = append(doms, dom{id, f})
			}
		}
		sort.Slice(doms, func(i, j int) bool {
			if doms[i].free != doms[j].free {
				return doms[i].free < doms[j].free
			}
			return doms[i].id < doms[j].id
		})
		var res []*candidate
		for i, d := range doms {
			if i >= 2*K || len(res) >= K {
				break
			}
			if cand := s.tryPlan(g, members, s.sortedNodes(nodesOf[d.id], w, excl)); cand != nil {
				res = append(res, cand)
			}
		}
		return res
	}
	if c.multiNodeIslands {
		if out = domainPlans(c.islandFree, c.islandNodes); len(out) > 0 {
			return out
		}
	}
	if out = domainPlans(c.rackFree, c.rackNodes); len(out) > 0 {
		return out
	}
	// Fewest racks: fullest-free racks first, their freest nodes first.
	racks := make([]int, len(c.rackFree))
	for i := range racks {
		racks[i] = i
	}
	sort.Slice(racks, func(i, j int) bool {
		if c.rackFree[racks[i]] != c.rackFree[racks[j]] {
			return c.rackFree[racks[i]] > c.rackFree[racks[j]]
		}
		return racks[i] < racks[j]
	})
	var plan []int
	sum := 0
	for _, r := range racks {
		if c.rackFree[r] < w {
			break
		}
		plan = append(plan, s.sortedNodes(c.rackNodes[r], w, excl)...)
		sum += c.rackFree[r]
		if sum >= 2*D {
			break
		}
	}
	if cand := s.tryPlan(g, members, plan); cand != nil {
		return []*candidate{cand}
	}
	if sum >= 2*D { // the capped plan failed on constraints; try every rack once
		plan = plan[:0]
		for _, r := range racks {
			plan = append(plan, s.sortedNodes(c.rackNodes[r], w, excl)...)
		}
		if cand := s.tryPlan(g, members, plan); cand != nil {
			return []*candidate{cand}
		}
	}
	return nil
}

// sortedNodes returns the nodes with at least w idle cards, freest first.
func (s *Scheduler) sortedNodes(nodes []int, w int, excl map[int]bool) []int {
	out := make([]int, 0, len(nodes))
	for _, n := range nodes {
		if s.c.freeWhole[n] >= w && !excl[n] {
			out = append(out, n)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return s.c.freeWhole[out[i]] > s.c.freeWhole[out[j]] })
	return out
}

// tryPlan fills the plan's nodes in order with as many members as each takes.
func (s *Scheduler) tryPlan(g *gangState, members int, plan []int) *candidate {
	st := s.c.newStatement()
	defer st.discard()
	var allocs []alloc
	var befores []nodeBefore
	for _, n := range plan {
		first := true
		for len(allocs) < members {
			a, why := s.fit(n, g.req.Member, g.req.GPUModels, allocs)
			if why != "" {
				break
			}
			if first && s.fragOn() {
				befores = append(befores, nodeBefore{n, s.nodeFrag(n)})
			}
			first = false
			st.allocate(a)
			allocs = append(allocs, a)
		}
		if len(allocs) == members {
			break
		}
	}
	if len(allocs) < members {
		return nil
	}
	return s.measure(g, allocs, befores)
}

// placeGreedy places members one at a time. With blind set it follows the configured
// topology-blind policy; otherwise (GPU shares, MIG, CPU-only members) it scores up to
// MaxCandidates feasible nodes per member with the plugins.
func (s *Scheduler) placeGreedy(g *gangState, members int, excl map[int]bool, blind bool) *candidate {
	st := s.c.newStatement()
	defer st.discard()
	m := g.req.Member
	var allocs []alloc
	var befores []nodeBefore
	seen := map[int]bool{}
	for k := 0; k < members; k++ {
		var a alloc
		ok := false
		if blind {
			a, ok = s.blindPick(m, g.req.GPUModels, excl, allocs)
		} else {
			a, ok = s.scoredPick(g, excl, allocs)
		}
		if !ok {
			return nil
		}
		if s.fragOn() && !seen[a.node] {
			seen[a.node] = true
			befores = append(befores, nodeBefore{a.node, s.nodeFrag(a.node)})
		}
		st.allocate(a)
		allocs = append(allocs, a)
	}
	return s.measure(g, allocs, befores)
}

// candidateNodes yields node ids to consider for a member, most promising first, from the
// indexes: partly used cards for shares, MIG nodes for MIG, the free-card buckets otherwise.
// asc chooses fullest-first bucket order. yield returns false to stop.
func (s *Scheduler) candidateNodes(m Member, asc bool, yield func(n int) bool) {
	c := s.c
	switch {
	case m.MIG != "":
		for _, n := range c.migNodes {
			if !yield(n) {
				return
			}
		}
		return
	case m.GPUs > 0 && m.gpuMilli() < Milli:
		if !c.partial.each(yield) {
			return
		}
	}
	lo := m.wholeGPUs()
	if m.GPUs > 0 && lo == 0 {
		lo = 1
	}
	if asc {
		for f := lo; f <= c.maxGPUs; f++ {
			if !c.byFree[f].each(yield) {
				return
			}
		}
		return
	}
	for f := c.maxGPUs; f >= lo; f-- {
		if !c.byFree[f].each(yield) {
			return
		}
	}
}

func (s *Scheduler) blindPick(m Member, models []string, excl map[int]bool, placed []alloc) (alloc, bool) {
	var out alloc
	found := false
	try := func(n int) bool {
		if excl[n] {
			return true
		}
		a, why := s.fit(n, m, models, placed)
		if why == "" {
			out, found = a, true
			return false
		}
		return true
	}
	switch s.blind {
	case BlindFirstFit:
		for n := range s.c.nodes {
			if !try(n) {
				break
			}
		}
	case BlindSpread:
		s.candidateNodes(m, false, try)
	default:
		s.candidateNodes(m, true, try)
	}
	return out, found
}

// scoredPick picks the node of the next member, given those placed before it.
func (s *Scheduler) scoredPick(g *gangState, excl map[int]bool, placed []alloc) (alloc, bool) {
	K := s.cfg.MaxCandidates
	var cands []*candidate
	tries := 0
	s.candidateNodes(g.req.Member, true, func(n int) bool {
		if excl[n] {
			return true
		}
		tries++
		a, why := s.fit(n, g.req.Member, g.req.GPUModels, placed)
		if why == "" {
			var b []nodeBefore
			if s.fragOn() {
				b = []nodeBefore{{n, s.nodeFrag(n)}}
			}
			for _, a := range s.cardChoices(a, g.req.Member, g.req.GPUModels) {
				s.c.apply(a, -1)
				cands = append(cands, s.measure(g, []alloc{a}, b))
				s.c.apply(a, +1)
			}
		}
		return len(cands) < K && tries < 8*K
	})
	if len(cands) == 0 {
		return alloc{}, false
	}
	return s.pick(cands, placed).allocs[0], true
}

// measure computes the ScoreInput of allocations applied to the current state.
func (s *Scheduler) measure(g *gangState, allocs []alloc, befores []nodeBefore) *candidate {
	c := s.c
	cand := &candidate{allocs: append([]alloc(nil), allocs...)}
	in := &cand.in
	var refs []GPURef
	var nodes, islands, racks [8]int
	ns, is, rs := nodes[:0], islands[:0], racks[:0]
	add := func(xs []int, v int) []int {
		for _, x := range xs {
			if x == v {
				return xs
			}
		}
		return append(xs, v)
	}
	for _, a := range allocs {
		ns = add(ns, a.node)
		rs = add(rs, c.rackOf[a.node])
		for _, gi := range a.gpus {
			isl := c.islandOf[a.node][gi]
			is = add(is, isl)
			refs = append(refs, GPURef{Node: a.node, GPU: gi, Island: c.islandIDs[isl], Rack: c.rackIDs[c.rackOf[a.node]], Model: c.nodes[a.node].GPUs[gi].Model})
		}
	}
	in.GPUs = len(refs)
	in.Machines, in.Islands, in.Racks = len(ns), len(is), len(rs)
	ceil := func(a, b int) int {
		if b <= 0 {
			return 1
		}
		return max(1, (a+b-1)/b)
	}
	in.MinMachines = ceil(in.GPUs, c.maxGPUs)
	in.MinIslands = ceil(in.GPUs, s.maxIslandGPUs)
	in.MinRacks = ceil(in.GPUs, s.maxRackGPUs)
	if len(refs) > 1 {
		in.AllReduce = s.coll.AllReduceTime(refs, g.req.AllReduceBytes)
	}
	lw := s.cfg.LoadWeights
	for _, n := range ns {
		node := &c.nodes[n]
		l := node.Load
		in.Load += lw.CPU*l.CPU + lw.GPU*l.GPU + lw.Mem*l.Mem + lw.Net*l.Net
		if len(node.GPUs) > 0 {
			free := 0
			for _, gp := range node.GPUs {
				if gp.MIG {
					free += gp.FreeSlices * Milli / MIGSlicesPerGPU
				} else {
					free += gp.FreeMilli
				}
			}
			in.Fill += 1 - float64(free)/float64(len(node.GPUs)*Milli)
		} else if node.CPUMilli > 0 {
			in.Fill += 1 - float64(node.FreeCPU)/float64(node.CPUMilli)
		}
	}
	in.Load /= float64(len(ns))
	in.Fill /= float64(len(ns))
	if len(befores) > 0 {
		for _, b := range befores {
			in.FragDelta += s.nodeFrag(b.node) - b.frag
		}
	}
	return cand
}

// cardChoices returns the allocation fitMember chose plus, for a GPU share scored on
// fragmentation, the same share on each other card with a different free amount: which
// card a share lands on decides what the node can take next.
func (s *Scheduler) cardChoices(a alloc, m Member, models []string) []alloc {
	if !s.fragOn() || m.MIG != "" || m.GPUs != 1 || m.gpuMilli() >= Milli {
		return []alloc{a}
	}
	out := []alloc{a}
	n := &s.c.nodes[a.node]
	seen := map[int]bool{n.GPUs[a.gpus[0]].FreeMilli: true}
	for gi, g := range n.GPUs {
		if g.MIG || g.FreeMilli < m.GPUMilli || seen[g.FreeMilli] || !ModelAllowed(models, g.Model) {
			continue
		}
		seen[g.FreeMilli] = true
		b := a
		b.gpus = []int{gi}
		out = append(out, b)
	}
	return out
}
