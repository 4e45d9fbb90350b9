package topology

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// problems collects validation failures, each with the JSON path where it was found.
type problems struct {
	list []string
}

func (p *problems) addf(path, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if path != "" {
		msg = path + ": " + msg
	}
	p.list = append(p.list, msg)
}

// err returns nil when nothing was found, else one error wrapping ErrInvalidSpec that lists
// (at most 10 of) the problems.
func (p *problems) err(where string) error {
	if len(p.list) == 0 {
		return nil
	}
	list := p.list
	more := ""
	if len(list) > 10 {
		more = fmt.Sprintf("; and %d more", len(list)-10)
		list = list[:10]
	}
	if where != "" {
		where = " " + where
	}
	return fmt.Errorf("topology: invalid spec%s: %s%s: %w", where, strings.Join(list, "; "), more, ErrInvalidSpec)
}

func join(path, field string) string {
	if path == "" {
		return field
	}
	if strings.HasPrefix(field, "[") {
		return path + field
	}
	return path + "." + field
}

var migProfileRE = regexp.MustCompile(`^(\d+)g\.(\d+)gb(\+me)?$`)

// ParseMIGProfile splits a MIG profile name such as "3g.40gb" into its compute slices (of
// 7) and memory in GB (10^9 bytes).
func ParseMIGProfile(profile string) (computeSlices int, memoryGB int, err error) {
	m := migProfileRE.FindStringSubmatch(profile)
	if m == nil {
		return 0, 0, fmt.Errorf("topology: MIG profile %q is not <N>g.<M>gb: %w", profile, ErrInvalidSpec)
	}
	c, _ := strconv.Atoi(m[1])
	g, _ := strconv.Atoi(m[2])
	if c < 1 || c > 7 || g < 1 {
		return 0, 0, fmt.Errorf("topology: MIG profile %q: compute slices must be 1..7 and memory positive: %w", profile, ErrInvalidSpec)
	}
	return c, g, nil
}

// Validate checks a machine spec for contradictions: links to GPUs that do not exist,
// asymmetric link counts, unknown switches or NUMA nodes, MIG layouts that do not fit. The
// error wraps ErrInvalidSpec and names the JSON path of every problem found.
func (m *MachineSpec) Validate() error {
	var p problems
	m.validate("", &p)
	return p.err(fmt.Sprintf("machine %q", m.Name))
}

func (m *MachineSpec) validate(path string, p *problems) {
	n := len(m.GPUs)
	switches := map[string]bool{}
	for i, s := range m.PCIeSwitches {
		sp := join(path, fmt.Sprintf("pcieSwitches[%d]", i))
		if s.ID == "" {
			p.addf(sp, "id is empty")
		} else if switches[s.ID] {
			p.addf(sp, "duplicate switch id %q", s.ID)
		}
		switches[s.ID] = true
	}
	numa := map[int]bool{}
	for i, nn := range m.NUMANodes {
		np := join(path, fmt.Sprintf("numaNodes[%d]", i))
		if nn.ID < 0 {
			p.addf(np, "id %d is negative", nn.ID)
		}
		if numa[nn.ID] {
			p.addf(np, "duplicate NUMA node id %d", nn.ID)
		}
		if nn.CPUs < 0 {
			p.addf(np, "cpus %d is negative", nn.CPUs)
		}
		numa[nn.ID] = true
	}
	checkNUMA := func(fp string, id int) {
		if len(m.NUMANodes) > 0 && !numa[id] {
			p.addf(fp, "NUMA node %d is not declared in numaNodes", id)
		}
	}
	fabric := FabricNone
	if m.NVLink != nil {
		fabric = m.NVLink.Fabric
		lp := join(path, "nvlink")
		switch fabric {
		case FabricDirect, FabricNVSwitch, FabricRack:
		default:
			p.addf(join(lp, "fabric"), "%q is not one of %q, %q, %q", fabric, FabricDirect, FabricNVSwitch, FabricRack)
		}
		if m.NVLink.Generation < 1 {
			p.addf(join(lp, "generation"), "must be at least 1, got %d", m.NVLink.Generation)
		}
		if !(m.NVLink.LinkGBps > 0) {
			p.addf(join(lp, "linkGBps"), "must be positive, got %v", m.NVLink.LinkGBps)
		}
		if fabric == FabricRack && m.NVLinkDomainSize < 1 {
			p.addf(join(path, "nvlinkDomainSize"), "a rack fabric needs the domain size (machines per NVLink domain), got %d", m.NVLinkDomainSize)
		}
	}
	// counts[i][j] = links i declares to j.
	counts := make([]map[int]int, n)
	for i := range m.GPUs {
		g := &m.GPUs[i]
		gp := join(path, fmt.Sprintf("gpus[%d]", i))
		if g.Index != i {
			p.addf(join(gp, "index"), "is %d but the GPU is listed at position %d (list GPUs in index order)", g.Index, i)
		}
		if g.Model == "" {
			p.addf(join(gp, "model"), "is empty")
		}
		if g.MemoryMiB <= 0 {
			p.addf(join(gp, "memoryMiB"), "must be positive, got %d", g.MemoryMiB)
		}
		checkNUMA(join(gp, "numa"), g.NUMA)
		if g.PCIeSwitch != "" && !switches[g.PCIeSwitch] {
			p.addf(join(gp, "pcieSwitch"), "switch %q is not declared in pcieSwitches", g.PCIeSwitch)
		}
		if g.PCIeGen < 0 || g.PCIeGen > 7 {
			p.addf(join(gp, "pcieGen"), "must be 1..7, got %d", g.PCIeGen)
		}
		if g.PCIeWidth < 0 || g.PCIeWidth > 32 {
			p.addf(join(gp, "pcieWidth"), "must be 1..32, got %d", g.PCIeWidth)
		}
		counts[i] = map[int]int{}
		for k, l := range g.NVLinks {
			lp := join(gp, fmt.Sprintf("nvlinks[%d]", k))
			switch {
			case m.NVLink == nil:
				p.addf(lp, "GPU has NVLinks but the machine has no nvlink section")
			case l.Peer < 0 || l.Peer >= n:
				p.addf(join(lp, "peer"), "GPU %d does not exist (the machine has %d GPUs)", l.Peer, n)
			case l.Peer == i:
				p.addf(join(lp, "peer"), "a GPU cannot link to itself")
			case l.Count < 1:
				p.addf(join(lp, "count"), "must be at least 1, got %d", l.Count)
			case counts[i][l.Peer] != 0:
				p.addf(join(lp, "peer"), "peer %d listed twice", l.Peer)
			default:
				counts[i][l.Peer] = l.Count
			}
		}
		if g.NVSwitchLinks < 0 {
			p.addf(join(gp, "nvswitchLinks"), "must not be negative, got %d", g.NVSwitchLinks)
		}
		if g.NVSwitchLinks > 0 && fabric != FabricNVSwitch && fabric != FabricRack {
			p.addf(join(gp, "nvswitchLinks"), "GPU has NVSwitch links but nvlink.fabric is %q", fabric)
		}
		if g.MIG != nil {
			validateMIG(join(gp, "mig"), g, p)
		}
	}
	for i := range counts {
		for j, c := range counts[i] {
			if j < 0 || j >= n {
				continue
			}
			if back := counts[j][i]; back != c {
				p.addf(join(path, fmt.Sprintf("gpus[%d].nvlinks", i)),
					"asymmetric link count: GPU %d lists %d link(s) to GPU %d, but GPU %d lists %d back", i, c, j, j, back)
			}
		}
	}
	names := map[string]bool{}
	for i, nic := range m.NICs {
		np := join(path, fmt.Sprintf("nics[%d]", i))
		if nic.Name == "" {
			p.addf(join(np, "name"), "is empty")
		} else if names[nic.Name] {
			p.addf(join(np, "name"), "duplicate NIC name %q", nic.Name)
		}
		names[nic.Name] = true
		if !(nic.SpeedGbps > 0) {
			p.addf(join(np, "speedGbps"), "must be positive, got %v", nic.SpeedGbps)
		}
		checkNUMA(join(np, "numa"), nic.NUMA)
		if nic.PCIeSwitch != "" && !switches[nic.PCIeSwitch] {
			p.addf(join(np, "pcieSwitch"), "switch %q is not declared in pcieSwitches", nic.PCIeSwitch)
		}
	}
	for i, s := range m.PCIeSwitches {
		checkNUMA(join(path, fmt.Sprintf("pcieSwitches[%d].numa", i)), s.NUMA)
	}
}

func validateMIG(path string, g *GPUSpec, p *problems) {
	if !g.MIG.Enabled {
		if len(g.MIG.Instances) > 0 {
			p.addf(join(path, "instances"), "MIG is disabled but %d instance(s) are listed", len(g.MIG.Instances))
		}
		return
	}
	compute, memGB := 0, 0
	for k, inst := range g.MIG.Instances {
		c, m, err := ParseMIGProfile(inst.Profile)
		if err != nil {
			p.addf(join(path, fmt.Sprintf("instances[%d].profile", k)), "%q is not a MIG profile like \"1g.10gb\"", inst.Profile)
			continue
		}
		compute += c
		memGB += m
	}
	if compute > 7 {
		p.addf(join(path, "instances"), "instances use %d compute slices, a GPU has 7", compute)
	}
	if float64(memGB)*1e9 > float64(g.MemoryMiB)*(1<<20) {
		p.addf(join(path, "instances"), "instances use %d GB, the GPU has %d MiB", memGB, g.MemoryMiB)
	}
}

// Validate checks a cluster spec: every group names a known machine type (or carries an
// inline one), counts and rack sizes are sane, and every machine type is valid.
func (c *ClusterSpec) Validate() error {
	var p problems
	c.validate(&p)
	return p.err(clusterWhere(c))
}

func clusterWhere(c *ClusterSpec) string {
	if c.Name == "" {
		return ""
	}
	return fmt.Sprintf("cluster %q", c.Name)
}

func (c *ClusterSpec) validate(p *problems) {
	for _, name := range sortedKeys(c.MachineTypes) {
		mt := c.MachineTypes[name]
		mp := "machineTypes." + name
		if mt == nil {
			p.addf(mp, "is null")
			continue
		}
		mt.validate(mp, p)
	}
	if len(c.Machines) == 0 {
		p.addf("machines", "no machine groups")
	}
	for i, g := range c.Machines {
		gp := fmt.Sprintf("machines[%d]", i)
		ms, err := c.resolve(&g)
		if err != nil {
			p.addf(gp, "%v", err)
			continue
		}
		if g.Machine != nil {
			ms.validate(join(gp, "machine"), p)
		} else if c.MachineTypes[g.Type] == nil {
			// A built-in: valid by construction, but check anyway so a broken built-in
			// fails loudly.
			ms.validate(join(gp, "type="+g.Type), p)
		}
		if g.Count < 0 {
			p.addf(join(gp, "count"), "must not be negative, got %d", g.Count)
		}
		if g.RackSize < 0 {
			p.addf(join(gp, "rackSize"), "must not be negative, got %d", g.RackSize)
		}
		if ms.NVLink != nil && ms.NVLink.Fabric == FabricRack && ms.NVLinkDomainSize > 0 && g.RackSize > ms.NVLinkDomainSize {
			p.addf(join(gp, "rackSize"), "%d machines per rack exceed the NVLink domain size %d of %q", g.RackSize, ms.NVLinkDomainSize, ms.Name)
		}
	}
	if c.Network.Oversubscription < 0 {
		p.addf("network.oversubscription", "must not be negative, got %v", c.Network.Oversubscription)
	}
	if c.Network.LeafLatencyUs < 0 || c.Network.SpineLatencyUs < 0 {
		p.addf("network", "latencies must not be negative")
	}
}

// resolve returns the machine spec a group refers to.
func (c *ClusterSpec) resolve(g *MachineGroup) (*MachineSpec, error) {
	switch {
	case g.Machine != nil && g.Type != "":
		return nil, fmt.Errorf("give either type (%q) or an inline machine, not both", g.Type)
	case g.Machine != nil:
		return g.Machine, nil
	case g.Type == "":
		return nil, fmt.Errorf("neither type nor machine is given")
	}
	if mt := c.MachineTypes[g.Type]; mt != nil {
		return mt, nil
	}
	return BuiltinMachine(g.Type)
}
