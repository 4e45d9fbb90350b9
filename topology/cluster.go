package topology

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// Cluster is a built, validated set of machines with global GPU ids 0..N-1 in machine
// order. It is immutable after Build and safe for concurrent use; Link, IslandOf and
// AllReduceTime are cheap (no tables over all GPU pairs: a pair's link is computed from the
// two machines' precomputed per-type tables and the rack layout).
type Cluster struct {
	// Name is the spec's name or shorthand.
	Name string
	// Machines in order; Machines[i].Index == i.
	Machines []*Machine
	// Racks in order; each holds consecutive machines.
	Racks []*Rack
	// Network is the leaf/spine description, with defaults filled in.
	Network NetworkSpec

	model    ModelParams
	gpus     []*GPU
	islands  [][]int
	islandOf []int32
	loc      []gpuLoc  // per GPU, compact, for Link
	mach     []machLoc // per machine, compact, for Link
}

// gpuLoc places a GPU: its machine and local index.
type gpuLoc struct {
	machine int32
	index   int32
}

// machLoc is what Link needs of a machine.
type machLoc struct {
	mt         *machineType
	rack       int32
	rackDomain bool
}

// Rack is a group of machines under one leaf switch; for rack NVLink fabrics (GB200 NVL72)
// it is also one NVLink domain.
type Rack struct {
	// Index is the rack's position in Cluster.Racks.
	Index int `json:"index"`
	// Machines are indexes into Cluster.Machines.
	Machines []int `json:"machines"`
	// NVLinkDomain says the rack's machines share one NVSwitch fabric.
	NVLinkDomain bool `json:"nvlinkDomain"`
}

// Machine is one machine of a cluster.
type Machine struct {
	// Index is the machine's position in Cluster.Machines.
	Index int `json:"index"`
	// Name is the host name (discovered) or "<type>-<n>" (declared).
	Name string `json:"name"`
	// Type is the machine type (MachineSpec.Name).
	Type string `json:"type"`
	// Rack is the index of the machine's rack.
	Rack int `json:"rack"`
	// Simulated is true for machines built from a declared spec rather than discovered.
	Simulated bool `json:"simulated"`
	// FirstGPU is the global id of the machine's GPU 0.
	FirstGPU int `json:"firstGpu"`
	// GPUs of the machine, by local index.
	GPUs []*GPU `json:"gpus"`
	// NICs, NUMANodes, PCIeSwitches and NVLink are the spec's, shared read-only.
	NICs         []NICSpec        `json:"nics,omitempty"`
	NUMANodes    []NUMANodeSpec   `json:"numaNodes,omitempty"`
	PCIeSwitches []PCIeSwitchSpec `json:"pcieSwitches,omitempty"`
	NVLink       *NVLinkSpec      `json:"nvlink,omitempty"`
	// Spec is the machine type it was built from; read-only.
	Spec *MachineSpec `json:"-"`

	mt *machineType
}

// GPU is one GPU of a cluster.
type GPU struct {
	// ID is the global id, 0..NumGPUs()-1.
	ID int `json:"id"`
	// Machine is the index of the machine; Index the GPU's local (CUDA/NVML) index there.
	Machine int `json:"machine"`
	Index   int `json:"index"`
	// UUID is NVML's, or "GPU-sim-..." for declared machines.
	UUID              string `json:"uuid"`
	Model             string `json:"model"`
	MemoryMiB         int64  `json:"memoryMiB"`
	ComputeCapability string `json:"computeCapability,omitempty"`
	PCIBusID          string `json:"pciBusId,omitempty"`
	NUMA              int    `json:"numa"`
	PCIeSwitch        string `json:"pcieSwitch,omitempty"`
	// NVLinks are direct links to peers (local indexes); NVSwitchLinks links into a switch.
	NVLinks       []NVLinkPeer `json:"nvlinks,omitempty"`
	NVSwitchLinks int          `json:"nvswitchLinks,omitempty"`
	// MIGEnabled is MIG mode; MIG lists the GPU instances.
	MIGEnabled bool          `json:"migEnabled,omitempty"`
	MIG        []MIGInstance `json:"mig,omitempty"`
	// NIC is the name of the GPU's nearest NIC ("" when the machine has none) and
	// GPUDirect says the NIC shares the GPU's PCIe switch (a GPUDirect RDMA path).
	NIC       string `json:"nic,omitempty"`
	GPUDirect bool   `json:"gpuDirect,omitempty"`
}

// MIGInstance is one MIG GPU instance of a GPU.
type MIGInstance struct {
	Profile       string `json:"profile"`
	UUID          string `json:"uuid"`
	ComputeSlices int    `json:"computeSlices"`
	MemoryMiB     int64  `json:"memoryMiB"`
}

// MachineInstance places one machine of a given type in a cluster; BuildMachines takes a
// list of them (the head builds its cluster this way from what agents report).
type MachineInstance struct {
	// Name is the machine's name; empty means "<type>-<n>".
	Name string
	// Rack is the rack number; machines of one rack must be consecutive.
	Rack int
	// Spec is the machine type.
	Spec *MachineSpec
	// Discovered marks a real machine (Simulated false).
	Discovered bool
}

// machineType holds what is precomputed once per machine spec and shared by every machine
// of that type.
type machineType struct {
	spec     *MachineSpec
	n        int
	local    []LinkInfo // n*n, row-major
	nic      []int      // per GPU: index into spec.NICs, -1 for none
	direct   []bool     // per GPU: NIC shares the GPU's PCIe switch
	rackPort []bool     // per GPU: joined to a rack NVLink fabric
	nicGBps  []float64  // per NIC: GB/s (speed/8)
}

// Build validates a cluster spec and builds the cluster. Errors wrap ErrInvalidSpec or
// ErrUnknownMachine and name the JSON path of what was wrong.
func Build(spec *ClusterSpec) (*Cluster, error) {
	if spec == nil {
		return nil, fmt.Errorf("topology: nil cluster spec: %w", ErrInvalidSpec)
	}
	resolve := spec.resolver()
	var p problems
	spec.validate(&p, resolve)
	if err := p.err(clusterWhere(spec), "", nil); err != nil {
		return nil, err
	}
	var insts []MachineInstance
	perType := map[string]int{}
	rack := 0
	for i := range spec.Machines {
		g := &spec.Machines[i]
		ms, err := resolve(g)
		if err != nil { // cannot happen after validate; keep the check
			return nil, fmt.Errorf("topology: machines[%d]: %w: %v", i, ErrInvalidSpec, err)
		}
		count, rackSize := g.layout(ms)
		typeName := ms.Name
		if typeName == "" {
			typeName = "machine"
		}
		for k := 0; k < count; k++ {
			if k > 0 && k%rackSize == 0 {
				rack++
			}
			insts = append(insts, MachineInstance{
				Name: fmt.Sprintf("%s-%d", typeName, perType[typeName]),
				Rack: rack,
				Spec: ms,
			})
			perType[typeName]++
		}
		rack++
	}
	c, err := BuildMachines(insts, spec.Network)
	if err != nil {
		return nil, err
	}
	c.Name = spec.Name
	return c, nil
}

// BuildMachines builds a cluster from machines placed in racks. Each distinct spec is
// validated once. Machine names must be valid (see docs/topology.md) and distinct; rack
// numbers must not decrease along the list; the cluster holds at most MaxGPUs GPUs.
func BuildMachines(machines []MachineInstance, network NetworkSpec) (*Cluster, error) {
	var p problems
	network.validate("network", &p)
	if err := p.err("", "", nil); err != nil {
		return nil, err
	}
	if len(machines) > MaxGPUs {
		return nil, fmt.Errorf("topology: %d machines, at most %d: %w", len(machines), MaxGPUs, ErrInvalidSpec)
	}
	c := &Cluster{model: DefaultModelParams(), Network: network}
	if c.Network.Oversubscription == 0 {
		c.Network.Oversubscription = 1
	}
	if c.Network.LeafLatencyUs == 0 {
		c.Network.LeafLatencyUs = c.model.LeafLatencyUs
	}
	if c.Network.SpineLatencyUs == 0 {
		c.Network.SpineLatencyUs = c.model.SpineLatencyUs
	}
	types := map[*MachineSpec]*machineType{}
	names := make(map[string]int, len(machines))
	lastRack := -1
	total := 0
	for i, mi := range machines {
		name := mi.Name
		if name == "" && mi.Spec != nil {
			name = fmt.Sprintf("%s-%d", cmp.Or(mi.Spec.Name, "machine"), i)
		}
		if err := checkName(name); err != nil {
			return nil, fmt.Errorf("topology: machine %d: %w: %w", i, err, ErrInvalidSpec)
		}
		if k, dup := names[name]; dup {
			return nil, fmt.Errorf("topology: machine %d: name %q is already machine %d's: %w", i, name, k, ErrInvalidSpec)
		}
		names[name] = i
		if mi.Spec == nil {
			return nil, fmt.Errorf("topology: machine %d (%q) has no spec: %w", i, name, ErrInvalidSpec)
		}
		if total += max(1, len(mi.Spec.GPUs)); total > MaxGPUs {
			return nil, fmt.Errorf("topology: machine %d (%q): the cluster would hold more than %d GPUs: %w", i, name, MaxGPUs, ErrInvalidSpec)
		}
		mt := types[mi.Spec]
		if mt == nil {
			if err := mi.Spec.Validate(); err != nil {
				return nil, err
			}
			mt = newMachineType(mi.Spec)
			types[mi.Spec] = mt
		}
		if mi.Rack < lastRack {
			return nil, fmt.Errorf("topology: machine %d (%q) is in rack %d after rack %d: machines of a rack must be consecutive: %w", i, mi.Name, mi.Rack, lastRack, ErrInvalidSpec)
		}
		if mi.Rack != lastRack {
			c.Racks = append(c.Racks, &Rack{Index: len(c.Racks)})
			lastRack = mi.Rack
		}
		r := c.Racks[len(c.Racks)-1]
		r.Machines = append(r.Machines, i)
		m := &Machine{
			Index: i, Name: name, Type: mi.Spec.Name, Rack: r.Index, Simulated: !mi.Discovered,
			FirstGPU: len(c.gpus), NICs: mi.Spec.NICs, NUMANodes: mi.Spec.NUMANodes,
			PCIeSwitches: mi.Spec.PCIeSwitches, NVLink: mi.Spec.NVLink, Spec: mi.Spec, mt: mt,
		}
		for k := range mi.Spec.GPUs {
			g := newGPU(m, k, len(c.gpus), mi.Discovered)
			m.GPUs = append(m.GPUs, g)
			c.gpus = append(c.gpus, g)
		}
		c.Machines = append(c.Machines, m)
	}
	for _, r := range c.Racks {
		r.NVLinkDomain = true
		for _, mi := range r.Machines {
			nv := c.Machines[mi].NVLink
			if nv == nil || nv.Fabric != FabricRack {
				r.NVLinkDomain = false
			}
		}
		if r.NVLinkDomain {
			ms := c.Machines[r.Machines[0]].Spec
			if len(r.Machines) > ms.NVLinkDomainSize {
				return nil, fmt.Errorf("topology: rack %d holds %d %q machines, more than its NVLink domain size %d: %w",
					r.Index, len(r.Machines), ms.Name, ms.NVLinkDomainSize, ErrInvalidSpec)
			}
		}
	}
	c.loc = make([]gpuLoc, len(c.gpus))
	for i, g := range c.gpus {
		c.loc[i] = gpuLoc{machine: int32(g.Machine), index: int32(g.Index)}
	}
	c.mach = make([]machLoc, len(c.Machines))
	for i, m := range c.Machines {
		c.mach[i] = machLoc{mt: m.mt, rack: int32(m.Rack), rackDomain: c.Racks[m.Rack].NVLinkDomain}
	}
	c.computeIslands()
	return c, nil
}

func newGPU(m *Machine, k, global int, discovered bool) *GPU {
	s := &m.Spec.GPUs[k]
	g := &GPU{
		ID: global, Machine: m.Index, Index: k, UUID: s.UUID, Model: s.Model, MemoryMiB: s.MemoryMiB,
		ComputeCapability: s.ComputeCapability, PCIBusID: s.PCIBusID, NUMA: s.NUMA, PCIeSwitch: s.PCIeSwitch,
		NVLinks: s.NVLinks, NVSwitchLinks: s.NVSwitchLinks,
	}
	if g.UUID == "" && !discovered {
		g.UUID = fmt.Sprintf("GPU-sim-%s-%d", m.Name, k)
	}
	if s.MIG != nil && s.MIG.Enabled {
		g.MIGEnabled = true
		for j, inst := range s.MIG.Instances {
			cs, gb, _ := ParseMIGProfile(inst.Profile) // validated
			u := inst.UUID
			if u == "" && !discovered {
				u = fmt.Sprintf("MIG-sim-%s-%d-%d", m.Name, k, j)
			}
			g.MIG = append(g.MIG, MIGInstance{Profile: inst.Profile, UUID: u, ComputeSlices: cs, MemoryMiB: int64(float64(gb) * 1e9 / (1 << 20))})
		}
	}
	if ni := m.mt.nic[k]; ni >= 0 {
		g.NIC = m.NICs[ni].Name
		g.GPUDirect = m.mt.direct[k]
	}
	return g
}

// newMachineType precomputes a machine type's local link table and NIC affinity.
func newMachineType(s *MachineSpec) *machineType {
	n := len(s.GPUs)
	mt := &machineType{spec: s, n: n, local: make([]LinkInfo, n*n), nic: make([]int, n), direct: make([]bool, n), rackPort: make([]bool, n)}
	for _, nic := range s.NICs {
		mt.nicGBps = append(mt.nicGBps, nic.SpeedGbps/8)
	}
	fabric := FabricNone
	if s.NVLink != nil {
		fabric = s.NVLink.Fabric
	}
	mig := func(i int) bool { return s.GPUs[i].MIG != nil && s.GPUs[i].MIG.Enabled }
	for i := 0; i < n; i++ {
		mt.rackPort[i] = fabric == FabricRack && s.GPUs[i].NVSwitchLinks > 0 && !mig(i)
		for j := 0; j < n; j++ {
			mt.local[i*n+j] = localLink(s, i, j, fabric, mig(i) || mig(j))
		}
	}
	// NIC affinity: a NIC under the GPU's PCIe switch (shared round-robin among that
	// switch's GPUs), else one on its NUMA node, else the first NIC.
	perSwitch := map[string]int{}
	for i := 0; i < n; i++ {
		g := &s.GPUs[i]
		mt.nic[i] = -1
		if g.PCIeSwitch != "" {
			var under []int
			for k, nic := range s.NICs {
				if nic.PCIeSwitch == g.PCIeSwitch {
					under = append(under, k)
				}
			}
			if len(under) > 0 {
				mt.nic[i] = under[perSwitch[g.PCIeSwitch]%len(under)]
				mt.direct[i] = true
				perSwitch[g.PCIeSwitch]++
				continue
			}
		}
		for k, nic := range s.NICs {
			if nic.NUMA == g.NUMA {
				mt.nic[i] = k
				break
			}
		}
		if mt.nic[i] < 0 && len(s.NICs) > 0 {
			mt.nic[i] = 0
		}
	}
	return mt
}

// localLink is the best path between GPUs i and j of one machine, with raw link bandwidth;
// Cluster.Link applies the model's factors and latencies.
func localLink(s *MachineSpec, i, j int, fabric string, anyMIG bool) LinkInfo {
	if i == j {
		return LinkInfo{Tier: TierSelf}
	}
	a, b := &s.GPUs[i], &s.GPUs[j]
	best := LinkInfo{}
	if !anyMIG && s.NVLink != nil {
		for _, l := range a.NVLinks {
			if l.Peer == j {
				best = LinkInfo{Tier: TierNVLink, GBps: float64(l.Count) * s.NVLink.LinkGBps, Links: l.Count}
			}
		}
		if (fabric == FabricNVSwitch || fabric == FabricRack) && a.NVSwitchLinks > 0 && b.NVSwitchLinks > 0 {
			links := min(a.NVSwitchLinks, b.NVSwitchLinks)
			if bw := float64(links) * s.NVLink.LinkGBps; bw > best.GBps {
				best = LinkInfo{Tier: TierNVSwitch, GBps: bw, Links: links}
			}
		}
		if best.GBps > 0 {
			return best
		}
	}
	bw := min(pcieGBps(a.PCIeGen, a.PCIeWidth), pcieGBps(b.PCIeGen, b.PCIeWidth))
	switch {
	case a.PCIeSwitch != "" && a.PCIeSwitch == b.PCIeSwitch:
		return LinkInfo{Tier: TierPCIeSwitch, GBps: bw}
	case a.NUMA == b.NUMA:
		return LinkInfo{Tier: TierPCIeHostBridge, GBps: bw}
	default:
		return LinkInfo{Tier: TierCrossSocket, GBps: bw}
	}
}

// pcieGBps is the raw one-direction bandwidth of a PCIe link (defaults gen 4 x16).
func pcieGBps(gen, width int) float64 {
	if gen == 0 {
		gen = 4
	}
	if width == 0 {
		width = 16
	}
	perLane := []float64{0, 0.25, 0.5, 0.985, 1.969, 3.938, 7.563, 15.125}
	if gen >= len(perLane) {
		gen = len(perLane) - 1
	}
	return perLane[gen] * float64(width)
}

// computeIslands joins GPUs by NVLink (direct or through NVSwitch, inside a machine or
// across a rack fabric) with union-find. GPUs in MIG mode join nothing.
func (c *Cluster) computeIslands() {
	n := len(c.gpus)
	parent := make([]int32, n)
	for i := range parent {
		parent[i] = int32(i)
	}
	var find func(int32) int32
	find = func(x int32) int32 {
		for parent[x] != x {
			parent[x] = parent[parent[x]]
			x = parent[x]
		}
		return x
	}
	union := func(a, b int) {
		ra, rb := find(int32(a)), find(int32(b))
		if ra == rb {
			return
		}
		if ra < rb {
			parent[rb] = ra
		} else {
			parent[ra] = rb
		}
	}
	for _, m := range c.Machines {
		mt := m.mt
		for i := 0; i < mt.n; i++ {
			for j := i + 1; j < mt.n; j++ {
				if t := mt.local[i*mt.n+j].Tier; t == TierNVLink || t == TierNVSwitch {
					union(m.FirstGPU+i, m.FirstGPU+j)
				}
			}
		}
	}
	for _, r := range c.Racks {
		if !r.NVLinkDomain {
			continue
		}
		first := -1
		for _, mi := range r.Machines {
			m := c.Machines[mi]
			for i := 0; i < m.mt.n; i++ {
				if !m.mt.rackPort[i] {
					continue
				}
				if first < 0 {
					first = m.FirstGPU + i
				} else {
					union(first, m.FirstGPU+i)
				}
			}
		}
	}
	c.islandOf = make([]int32, n)
	index := map[int32]int{}
	for g := 0; g < n; g++ {
		root := find(int32(g))
		k, ok := index[root]
		if !ok {
			k = len(c.islands)
			index[root] = k
			c.islands = append(c.islands, nil)
		}
		c.islands[k] = append(c.islands[k], g)
		c.islandOf[g] = int32(k)
	}
	// GPUs are visited in ascending order, so each island is sorted and islands are ordered
	// by their smallest member.
}

// NumGPUs returns the number of GPUs in the cluster.
func (c *Cluster) NumGPUs() int { return len(c.gpus) }

// GPU returns the GPU with a global id, or nil if there is none.
func (c *Cluster) GPU(global int) *GPU {
	if global < 0 || global >= len(c.gpus) {
		return nil
	}
	return c.gpus[global]
}

// GPUs returns all GPUs by global id. The slice is shared: do not modify it.
func (c *Cluster) GPUs() []*GPU { return c.gpus }

// Islands returns the NVLink islands as sorted lists of global GPU ids, ordered by their
// smallest member. The slices are shared: do not modify them.
func (c *Cluster) Islands() [][]int { return c.islands }

// IslandOf returns the index (into Islands) of a GPU's island, or -1 for an unknown id.
func (c *Cluster) IslandOf(global int) int {
	if global < 0 || global >= len(c.islandOf) {
		return -1
	}
	return int(c.islandOf[global])
}

// CheckGPUs returns an error wrapping ErrNoGPU naming the first id outside 0..NumGPUs()-1,
// or a duplicate id; nil if every id names a distinct GPU.
func (c *Cluster) CheckGPUs(ids []int) error {
	seen := make(map[int]bool, len(ids))
	for i, id := range ids {
		if id < 0 || id >= len(c.gpus) {
			return fmt.Errorf("topology: GPU id %d at position %d: the cluster has GPUs 0..%d: %w", id, i, len(c.gpus)-1, ErrNoGPU)
		}
		if seen[id] {
			return fmt.Errorf("topology: GPU id %d listed twice (position %d): %w", id, i, ErrNoGPU)
		}
		seen[id] = true
	}
	return nil
}

// IslandsOf groups GPUs by island: one sorted list per island touched, ordered by island
// index. Unknown ids are left out. len(IslandsOf(gang)) is the number of islands a gang spans.
func (c *Cluster) IslandsOf(gpus []int) [][]int {
	byIsland := map[int][]int{}
	for _, id := range gpus {
		if k := c.IslandOf(id); k >= 0 {
			byIsland[k] = append(byIsland[k], id)
		}
	}
	keys := make([]int, 0, len(byIsland))
	for k := range byIsland {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out := make([][]int, 0, len(keys))
	for _, k := range keys {
		ids := byIsland[k]
		slices.Sort(ids)
		out = append(out, slices.Compact(ids))
	}
	return out
}

// DescribePlacement says in one line where a set of GPUs sits, e.g.
// "16 GPU(s) on 2 island(s): island 0 = dgx-h100-0 GPUs 0-7; island 1 = dgx-h100-1 GPUs 0-7".
// The demo prints it for the islands its gang landed on.
func (c *Cluster) DescribePlacement(gpus []int) string {
	groups := c.IslandsOf(gpus)
	n := 0
	var parts []string
	for _, g := range groups {
		n += len(g)
		// Within an island, list GPUs per machine by local index.
		var per []string
		for i := 0; i < len(g); {
			m := c.gpus[g[i]].Machine
			var local []int
			for ; i < len(g) && c.gpus[g[i]].Machine == m; i++ {
				local = append(local, c.gpus[g[i]].Index)
			}
			per = append(per, fmt.Sprintf("%s GPUs %s", c.Machines[m].Name, FormatIDs(local)))
		}
		parts = append(parts, fmt.Sprintf("island %d = %s", c.IslandOf(g[0]), strings.Join(per, ", ")))
	}
	return fmt.Sprintf("%d GPU(s) on %d island(s): %s", n, len(groups), strings.Join(parts, "; "))
}

// MachineOf returns the machine holding a GPU, or nil.
func (c *Cluster) MachineOf(global int) *Machine {
	g := c.GPU(global)
	if g == nil {
		return nil
	}
	return c.Machines[g.Machine]
}

// Model returns the bandwidth model parameters in use.
func (c *Cluster) Model() ModelParams { return c.model }

// WithModel returns a copy of the cluster that uses other model parameters (for
// calibration); machines, GPUs and islands are shared.
func (c *Cluster) WithModel(p ModelParams) (*Cluster, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	cc := *c
	cc.model = p
	return &cc, nil
}

// FormatIDs writes sorted GPU ids as runs, "0-7,9", the form DescribePlacement prints and
// `atoll topology --allreduce` reads.
func FormatIDs(ids []int) string {
	var parts []string
	for i := 0; i < len(ids); {
		j := i
		for j+1 < len(ids) && ids[j+1] == ids[j]+1 {
			j++
		}
		if j > i {
			parts = append(parts, fmt.Sprintf("%d-%d", ids[i], ids[j]))
		} else {
			parts = append(parts, fmt.Sprint(ids[i]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}
