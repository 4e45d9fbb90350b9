package gang

import (
	"fmt"
	"math/bits"
)

// alloc is one member's hold on one node.
type alloc struct {
	node   int
	gpus   []int // card indices
	milli  int   // per card (whole = 1000); 0 for CPU-only
	slices int   // MIG slices (on gpus[0]) when > 0
	cpu    int64
	mem    int64
}

func (a alloc) totalMilli() int {
	if a.slices > 0 {
		return a.slices * Milli / MIGSlicesPerGPU
	}
	return a.milli * len(a.gpus)
}

// nodeSet is a set of node ids with O(1) add and remove, iterated in ascending id order: a
// placement search that walks it visits nodes in the same order whatever the history of
// allocations was, so that a scheduler rebuilt from a record of its gangs decides as the
// original would have.
type nodeSet struct {
	words []uint64
	n     int
}

func (b *nodeSet) add(i int) {
	w := i >> 6
	for len(b.words) <= w {
		b.words = append(b.words, 0)
	}
	if b.words[w]&(1<<(uint(i)&63)) == 0 {
		b.words[w] |= 1 << (uint(i) & 63)
		b.n++
	}
}

func (b *nodeSet) remove(i int) {
	w := i >> 6
	if w < len(b.words) && b.words[w]&(1<<(uint(i)&63)) != 0 {
		b.words[w] &^= 1 << (uint(i) & 63)
		b.n--
	}
}

// len returns the number of nodes in the set.
func (b *nodeSet) len() int { return b.n }

// each calls yield with the set's nodes in ascending order until it returns false; it
// reports whether it went through them all. The set must not change meanwhile.
func (b *nodeSet) each(yield func(int) bool) bool {
	for w, word := range b.words {
		for word != 0 {
			t := bits.TrailingZeros64(word)
			if !yield(w<<6 | t) {
				return false
			}
			word &= word - 1
		}
	}
	return true
}

// cluster is the scheduler's mutable view of the machines plus the free-capacity indexes
// that keep placement from scanning every node per member:
//   - byFree[c]: nodes with exactly c idle whole (non-MIG) cards;
//   - rack and island free whole-card counts, and their node lists;
//   - partial: nodes with a card that is partly allocated (for GPU shares);
//   - migNodes: nodes with MIG-enabled cards.
type cluster struct {
	nodes     []Node
	freeWhole []int
	byFree    []nodeSet
	maxGPUs   int

	rackOf           []int // dense rack index per node
	rackIDs          []int // dense -> snapshot rack id
	rackNodes        [][]int
	rackFree         []int
	rackGPUs         []int
	islandOf         [][]int // per node, per card: dense island index
	islandIDs        []int
	islandNodes      [][]int
	islandFree       []int
	islandGPUs       []int
	multiNodeIslands bool

	partial  nodeSet // nodes with a partly allocated card
	migNodes []int

	totalMilli int64
	totalCPU   int64
	totalMem   int64
	usedMilli  int64
	usedCPU    int64
	usedMem    int64
	models     map[string]int // GPUs per model
}

func newCluster(s Snapshot) (*cluster, error) {
	c := &cluster{
		nodes:     make([]Node, len(s.Nodes)),
		freeWhole: make([]int, len(s.Nodes)),
		rackOf:    make([]int, len(s.Nodes)),
		islandOf:  make([][]int, len(s.Nodes)),
		models:    map[string]int{},
	}
	rackIdx := map[int]int{}
	islIdx := map[int]int{}
	for i, n := range s.Nodes {
		if n.CPUMilli < 0 || n.MemMiB < 0 || n.FreeCPU < 0 || n.FreeMem < 0 || n.FreeCPU > n.CPUMilli || n.FreeMem > n.MemMiB {
			return nil, fmt.Errorf("gang: node %d (%s) cpu %d/%d mem %d/%d: %w", i, n.Name, n.FreeCPU, n.CPUMilli, n.FreeMem, n.MemMiB, ErrInvalidSnapshot)
		}
		n.GPUs = append([]GPU(nil), n.GPUs...)
		c.nodes[i] = n
		r, ok := rackIdx[n.Rack]
		if !ok {
			r = len(c.rackIDs)
			rackIdx[n.Rack] = r
			c.rackIDs = append(c.rackIDs, n.Rack)
			c.rackNodes = append(c.rackNodes, nil)
			c.rackFree = append(c.rackFree, 0)
			c.rackGPUs = append(c.rackGPUs, 0)
		}
		c.rackOf[i] = r
		c.rackNodes[r] = append(c.rackNodes[r], i)
		c.islandOf[i] = make([]int, len(n.GPUs))
		seenIsl := map[int]bool{}
		for gi, g := range n.GPUs {
			if g.FreeMilli < 0 || g.FreeMilli > Milli || (g.MIG && (g.FreeSlices < 0 || g.FreeSlices > MIGSlicesPerGPU)) {
				return nil, fmt.Errorf("gang: node %s gpu %d free %d milli / %d slices: %w", n.Name, gi, g.FreeMilli, g.FreeSlices, ErrInvalidSnapshot)
			}
			is, ok := islIdx[g.Island]
			if !ok {
				is = len(c.islandIDs)
				islIdx[g.Island] = is
				c.islandIDs = append(c.islandIDs, g.Island)
				c.islandNodes = append(c.islandNodes, nil)
				c.islandFree = append(c.islandFree, 0)
				c.islandGPUs = append(c.islandGPUs, 0)
			}
			c.islandOf[i][gi] = is
			if !seenIsl[is] {
				seenIsl[is] = true
				if len(c.islandNodes[is]) > 0 {
					c.multiNodeIslands = true
				}
				c.islandNodes[is] = append(c.islandNodes[is], i)
			}
			c.islandGPUs[is]++
			c.rackGPUs[r]++
			c.models[g.Model]++
			c.totalMilli += Milli
			if g.MIG {
				c.usedMilli += int64((MIGSlicesPerGPU - g.FreeSlices) * Milli / MIGSlicesPerGPU)
			} else {
				c.usedMilli += int64(Milli - g.FreeMilli)
			}
		}
		c.totalCPU += n.CPUMilli
		c.totalMem += n.MemMiB
		c.usedCPU += n.CPUMilli - n.FreeCPU
		c.usedMem += n.MemMiB - n.FreeMem
		if len(n.GPUs) > c.maxGPUs {
			c.maxGPUs = len(n.GPUs)
		}
	}
	c.byFree = make([]nodeSet, c.maxGPUs+1)
	for i := range c.nodes {
		c.freeWhole[i] = c.countWhole(i)
		c.bucketAdd(i)
		c.rackFree[c.rackOf[i]] += c.freeWhole[i]
		for gi, g := range c.nodes[i].GPUs {
			if !g.MIG && g.FreeMilli == Milli {
				c.islandFree[c.islandOf[i][gi]]++
			}
			if g.MIG {
				if len(c.migNodes) == 0 || c.migNodes[len(c.migNodes)-1] != i {
					c.migNodes = append(c.migNodes, i)
				}
			}
		}
		c.updatePartial(i)
	}
	return c, nil
}

func (c *cluster) countWhole(i int) int {
	n := 0
	if c.nodes[i].Unschedulable {
		return 0
	}
	for _, g := range c.nodes[i].GPUs {
		if !g.MIG && g.FreeMilli == Milli {
			n++
		}
	}
	return n
}

func (c *cluster) bucketAdd(i int) { c.byFree[c.freeWhole[i]].add(i) }

func (c *cluster) bucketRemove(i int) { c.byFree[c.freeWhole[i]].remove(i) }

func (c *cluster) updatePartial(i int) {
	part := false
	if !c.nodes[i].Unschedulable {
		for _, g := range c.nodes[i].GPUs {
			if !g.MIG && g.FreeMilli > 0 && g.FreeMilli < Milli {
				part = true
				break
			}
		}
	}
	if part {
		c.partial.add(i)
	} else {
		c.partial.remove(i)
	}
}

// apply takes (sign = -1) or returns (sign = +1) an allocation and keeps the indexes right.
func (c *cluster) apply(a alloc, sign int) {
	n := &c.nodes[a.node]
	c.bucketRemove(a.node)
	oldWhole := c.freeWhole[a.node]
	for _, gi := range a.gpus {
		g := &n.GPUs[gi]
		wasIdle := !g.MIG && g.FreeMilli == Milli
		if a.slices > 0 {
			g.FreeSlices += sign * a.slices
		} else {
			g.FreeMilli += sign * a.milli
		}
		isIdle := !g.MIG && g.FreeMilli == Milli
		if wasIdle != isIdle {
			d := 1
			if wasIdle {
				d = -1
			}
			c.islandFree[c.islandOf[a.node][gi]] += d
		}
	}
	n.FreeCPU += int64(sign) * a.cpu
	n.FreeMem += int64(sign) * a.mem
	c.usedMilli -= int64(sign * a.totalMilli())
	c.usedCPU -= int64(sign) * a.cpu
	c.usedMem -= int64(sign) * a.mem
	c.freeWhole[a.node] = c.countWhole(a.node)
	c.rackFree[c.rackOf[a.node]] += c.freeWhole[a.node] - oldWhole
	c.bucketAdd(a.node)
	if a.slices == 0 && a.milli > 0 && a.milli < Milli {
		c.updatePartial(a.node)
	}
}

// statement collects tentative allocations and releases; Commit keeps them, Discard undoes
// them in reverse order (Volcano's Statement), so a gang is bound whole or not at all.
type statement struct {
	c   *cluster
	ops []stmtOp
}

type stmtOp struct {
	a       alloc
	release bool
}

func (c *cluster) newStatement() *statement { return &statement{c: c} }

func (s *statement) allocate(a alloc) {
	s.c.apply(a, -1)
	s.ops = append(s.ops, stmtOp{a: a})
}

func (s *statement) release(a alloc) {
	s.c.apply(a, +1)
	s.ops = append(s.ops, stmtOp{a: a, release: true})
}

// discard undoes every operation, newest first.
func (s *statement) discard() {
	for i := len(s.ops) - 1; i >= 0; i-- {
		op := s.ops[i]
		if op.release {
			s.c.apply(op.a, -1)
		} else {
			s.c.apply(op.a, +1)
		}
	}
	s.ops = s.ops[:0]
}

// commit keeps every operation.
func (s *statement) commit() { s.ops = s.ops[:0] }

// ModelAllowed reports whether a card of model m is allowed by a request's GPU models
// (an empty list allows every model).
func ModelAllowed(models []string, m string) bool {
	if len(models) == 0 {
		return true
	}
	for _, x := range models {
		if x == m {
			return true
		}
	}
	return false
}

// fitMember finds cards on node i for member m, without changing anything; it returns the
// allocation and true, or a reason. Whole cards are taken inside as few islands as possible.
func (c *cluster) fitMember(i int, m Member, models []string) (alloc, string) {
	n := &c.nodes[i]
	if n.Unschedulable {
		return alloc{}, "node cordoned"
	}
	if n.FreeCPU < m.CPUMilli {
		return alloc{}, "cpu"
	}
	if n.FreeMem < m.MemMiB {
		return alloc{}, "memory"
	}
	a := alloc{node: i, cpu: m.CPUMilli, mem: m.MemMiB}
	switch {
	case m.GPUs == 0:
		return a, ""
	case m.MIG != "":
		s, _ := MIGSlices(m.MIG)
		best, bestFree := -1, MIGSlicesPerGPU+1
		for gi, g := range n.GPUs {
			if g.MIG && g.FreeSlices >= s && g.FreeSlices < bestFree && ModelAllowed(models, g.Model) {
				best, bestFree = gi, g.FreeSlices
			}
		}
		if best < 0 {
			return alloc{}, "no MIG slices"
		}
		a.gpus = []int{best}
		a.slices = s
		return a, ""
	case m.gpuMilli() < Milli:
		best, bestFree := -1, Milli+1
		for gi, g := range n.GPUs {
			if !g.MIG && g.FreeMilli >= m.GPUMilli && g.FreeMilli < bestFree && ModelAllowed(models, g.Model) {
				best, bestFree = gi, g.FreeMilli
			}
		}
		if best < 0 {
			return alloc{}, "no card with enough free share"
		}
		a.gpus = []int{best}
		a.milli = m.GPUMilli
		return a, ""
	}
	want := m.GPUs
	if c.freeWhole[i] < want {
		return alloc{}, "gpus"
	}
	// Group idle allowed cards by island; take the island that fits best, else largest first.
	var idle [16]int
	ids := idle[:0]
	for gi, g := range n.GPUs {
		if !g.MIG && g.FreeMilli == Milli && ModelAllowed(models, g.Model) {
			ids = append(ids, gi)
		}
	}
	if len(ids) < want {
		return alloc{}, "gpu model"
	}
	isl := c.islandOf[i]
	sameIsland := true
	for _, gi := range ids {
		if isl[gi] != isl[ids[0]] {
			sameIsland = false
			break
		}
	}
	if sameIsland || want == len(ids) {
		a.gpus = append([]int(nil), ids[:want]...)
		a.milli = Milli
		return a, ""
	}
	counts := map[int]int{}
	for _, gi := range ids {
		counts[isl[gi]]++
	}
	bestIsl, bestCnt := -1, 1<<30
	for is, cnt := range counts {
		if cnt >= want && (cnt < bestCnt || cnt == bestCnt && is < bestIsl) {
			bestIsl, bestCnt = is, cnt
		}
	}
	out := make([]int, 0, want)
	if bestIsl >= 0 {
		for _, gi := range ids {
			if isl[gi] == bestIsl && len(out) < want {
				out = append(out, gi)
			}
		}
	} else {
		// Largest islands first.
		for len(out) < want {
			bi, bc := -1, 0
			for is, cnt := range counts {
				if cnt > bc || cnt == bc && is < bi {
					bi, bc = is, cnt
				}
			}
			for _, gi := range ids {
				if isl[gi] == bi && len(out) < want {
					out = append(out, gi)
				}
			}
			delete(counts, bi)
		}
	}
	a.gpus = out
	a.milli = Milli
	return a, ""
}
