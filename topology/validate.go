package topology

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
)

// Bounds on what a spec may declare. Every number in a spec is checked against them, so that
// a typo fails with an error naming the field instead of exhausting memory or producing NaN
// (docs/topology.md lists them).
const (
	// MaxGPUs bounds a cluster: at most this many GPUs (machines without GPUs count as one),
	// about 300 MiB of model.
	MaxGPUs = 1 << 20

	maxGPUsPerMachine = 1024    // one machine type's link table has n*n entries
	maxNameLen        = 128     // machine type and machine names (checkName)
	maxIDLen          = 256     // models, UUIDs, bus ids, switch and NIC names
	maxTextLen        = 4096    // descriptions, cluster names, CPU lists
	maxNUMAID         = 1023    // the kernel's MAX_NUMNODES is at most 1024
	maxCPUs           = 1 << 16 // logical CPUs in one NUMA node
	maxGPUMemoryMiB   = 1 << 24 // 16 TiB
	maxHostMemoryMiB  = 1 << 30 // 1 PiB
	maxNVLinkGen      = 16
	maxLinksPerGPU    = 64      // NVLinks in one bundle, or into an NVSwitch fabric
	maxLinkGBps       = 10_000  // one NVLink, one direction
	maxNICGbps        = 100_000 // one NIC port
	maxOversub        = 1000    // leaf-to-spine oversubscription
	maxLatencyUs      = 1e6     // one second
	maxProblems       = 10      // problems an error lists
)

// checkName checks a machine type or machine name. Such names become file and directory
// names (an agent's object store, logs), so they are restricted to a portable file-name
// character set that cannot leave a directory: 1 to maxNameLen bytes of A-Z a-z 0-9 '.' '_'
// '-', not starting with '.' or '-'.
func checkName(s string) error {
	const rule = "names use only A-Z a-z 0-9 . _ -, do not start with '.' or '-', and are at most 128 bytes"
	switch {
	case s == "":
		return fmt.Errorf("name is empty (%s)", rule)
	case len(s) > maxNameLen:
		return fmt.Errorf("name %.32q... is %d bytes long (%s)", s, len(s), rule)
	case s[0] == '.' || s[0] == '-':
		return fmt.Errorf("name %q starts with %q (%s)", s, s[0], rule)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("name %q has %q at byte %d (%s)", s, c, i, rule)
		}
	}
	return nil
}

// problem is one validation failure at a JSON path.
type problem struct {
	path, msg string
}

// problems collects validation failures; it keeps the first maxProblems and counts the rest.
type problems struct {
	list  []problem
	extra int
	// unknown is set when a machine type was not found: the error then wraps
	// ErrUnknownMachine too.
	unknown bool
}

// alsoUnknown is an invalid-spec error that also wraps ErrUnknownMachine.
type alsoUnknown struct{ error }

func (e alsoUnknown) Unwrap() []error { return []error{e.error, ErrUnknownMachine} }

func (p *problems) addf(path, format string, args ...any) {
	if len(p.list) == maxProblems {
		p.extra++
		return
	}
	p.list = append(p.list, problem{path: path, msg: fmt.Sprintf(format, args...)})
}

// intIn checks lo <= v <= hi.
func (p *problems) intIn(path string, v, lo, hi int64) {
	if v < lo || v > hi {
		p.addf(path, "%d is out of range %d..%d", v, lo, hi)
	}
}

// floatIn checks that v is finite and lo < v <= hi (lo <= v <= hi when loIncluded).
func (p *problems) floatIn(path string, v, lo, hi float64, loIncluded bool) {
	switch {
	case math.IsNaN(v) || math.IsInf(v, 0):
		p.addf(path, "%v is not a finite number", v)
	case loIncluded && (v < lo || v > hi):
		p.addf(path, "%v is out of range %v..%v", v, lo, hi)
	case !loIncluded && (v <= lo || v > hi):
		p.addf(path, "%v is out of range: want more than %v and at most %v", v, lo, hi)
	}
}

// text checks a string's length.
func (p *problems) text(path, s string, max int) {
	if len(s) > max {
		p.addf(path, "is %d bytes long, at most %d", len(s), max)
	}
}

// id checks an identifier of a list (a switch id, a NIC name): not empty, not too long, and
// not in seen, to which it is added.
func (p *problems) id(path, kind, id string, seen map[string]bool) {
	switch {
	case id == "":
		p.addf(path, "is empty")
	case seen[id]:
		p.addf(path, "duplicate %s %.64q", kind, id)
	}
	p.text(path, id, maxIDLen)
	seen[id] = true
}

// name checks a machine type or machine name.
func (p *problems) name(path, s string) {
	if err := checkName(s); err != nil {
		p.addf(path, "%v", err)
	}
}

// err returns nil when nothing was found, else one error wrapping ErrInvalidSpec that lists
// the problems. With the spec's bytes, each problem is prefixed by file:line:col of its JSON
// path; otherwise `where` names the spec.
func (p *problems) err(where, file string, data []byte) error {
	if len(p.list) == 0 {
		return nil
	}
	var pos map[string][2]int
	if data != nil {
		paths := make([]string, len(p.list))
		for i, pr := range p.list {
			paths[i] = pr.path
		}
		pos = locate(data, paths)
	}
	parts := make([]string, len(p.list))
	for i, pr := range p.list {
		msg := pr.msg
		if pr.path != "" {
			msg = pr.path + ": " + msg
		}
		if lc, ok := pos[pr.path]; ok {
			msg = fmt.Sprintf("%s:%d:%d: %s", file, lc[0], lc[1], msg)
		}
		parts[i] = msg
	}
	more := ""
	if p.extra > 0 {
		more = fmt.Sprintf("; and %d more", p.extra)
	}
	if where != "" {
		where = " " + where
	}
	err := fmt.Errorf("topology: invalid spec%s: %s%s: %w", where, strings.Join(parts, "; "), more, ErrInvalidSpec)
	if p.unknown {
		return alsoUnknown{err}
	}
	return err
}

// join appends a field ("count") or an index ("[3]") to a JSON path.
func join(path, field string) string {
	if path == "" {
		return field
	}
	if strings.HasPrefix(field, "[") {
		return path + field
	}
	return path + "." + field
}

// joinKey appends an object key to a JSON path: .key when it is a plain name without dots,
// else ["key"].
func joinKey(path, key string) string {
	if checkName(key) == nil && !strings.Contains(key, ".") {
		return join(path, key)
	}
	return path + "[" + strconv.Quote(key) + "]"
}

var migProfileRE = regexp.MustCompile(`^([1-7])g\.(\d{1,4})gb(\+me)?$`)

// ParseMIGProfile splits a MIG profile name such as "3g.40gb" into its compute slices (of
// 7) and memory in GB (10^9 bytes).
func ParseMIGProfile(profile string) (computeSlices int, memoryGB int, err error) {
	m := migProfileRE.FindStringSubmatch(profile)
	if m == nil {
		return 0, 0, fmt.Errorf("topology: MIG profile %q is not <N>g.<M>gb with N in 1..7 and M in 1..9999: %w", profile, ErrInvalidSpec)
	}
	c, _ := strconv.Atoi(m[1])
	g, _ := strconv.Atoi(m[2])
	if g < 1 {
		return 0, 0, fmt.Errorf("topology: MIG profile %q: memory must be positive: %w", profile, ErrInvalidSpec)
	}
	return c, g, nil
}

// Validate checks a machine spec: its name, every number against the documented bounds, and
// contradictions (links to GPUs that do not exist, asymmetric link counts, unknown switches
// or NUMA nodes, MIG layouts that do not fit). The error wraps ErrInvalidSpec and names the
// JSON path of every problem found.
func (m *MachineSpec) Validate() error {
	var p problems
	m.validate("", &p)
	return p.err(fmt.Sprintf("machine %.64q", m.Name), "", nil)
}

func (m *MachineSpec) validate(path string, p *problems) {
	if m.Name != "" {
		p.name(join(path, "name"), m.Name)
	}
	p.text(join(path, "description"), m.Description, maxTextLen)
	p.intIn(join(path, "hostMemoryMiB"), m.HostMemoryMiB, 0, maxHostMemoryMiB)
	p.intIn(join(path, "nvlinkDomainSize"), int64(m.NVLinkDomainSize), 0, maxGPUsPerMachine)
	n := len(m.GPUs)
	if n > maxGPUsPerMachine {
		p.addf(join(path, "gpus"), "%d GPUs in one machine, at most %d", n, maxGPUsPerMachine)
		return // the checks below are quadratic in n
	}
	switches := map[string]bool{}
	for i, s := range m.PCIeSwitches {
		sp := join(path, fmt.Sprintf("pcieSwitches[%d]", i))
		p.id(join(sp, "id"), "switch id", s.ID, switches)
	}
	numa := map[int]bool{}
	for i, nn := range m.NUMANodes {
		np := join(path, fmt.Sprintf("numaNodes[%d]", i))
		p.intIn(join(np, "id"), int64(nn.ID), 0, maxNUMAID)
		if numa[nn.ID] {
			p.addf(join(np, "id"), "duplicate NUMA node id %d", nn.ID)
		}
		p.intIn(join(np, "cpus"), int64(nn.CPUs), 0, maxCPUs)
		p.intIn(join(np, "memoryMiB"), nn.MemoryMiB, 0, maxHostMemoryMiB)
		p.text(join(np, "cpuList"), nn.CPUList, maxTextLen)
		numa[nn.ID] = true
	}
	checkNUMA := func(fp string, id int) {
		if id < 0 || id > maxNUMAID {
			p.intIn(fp, int64(id), 0, maxNUMAID)
		} else if len(m.NUMANodes) > 0 && !numa[id] {
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
		p.intIn(join(lp, "generation"), int64(m.NVLink.Generation), 1, maxNVLinkGen)
		p.floatIn(join(lp, "linkGBps"), m.NVLink.LinkGBps, 0, maxLinkGBps, false)
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
		for _, f := range []struct{ field, v string }{{"model", g.Model}, {"uuid", g.UUID}, {"computeCapability", g.ComputeCapability}, {"pciBusId", g.PCIBusID}} {
			p.text(join(gp, f.field), f.v, maxIDLen)
		}
		if g.MemoryMiB <= 0 {
			p.addf(join(gp, "memoryMiB"), "must be positive, got %d", g.MemoryMiB)
		} else {
			p.intIn(join(gp, "memoryMiB"), g.MemoryMiB, 1, maxGPUMemoryMiB)
		}
		checkNUMA(join(gp, "numa"), g.NUMA)
		if g.PCIeSwitch != "" && !switches[g.PCIeSwitch] {
			p.addf(join(gp, "pcieSwitch"), "switch %q is not declared in pcieSwitches", g.PCIeSwitch)
		}
		if g.PCIeGen < 0 || g.PCIeGen > 7 {
			p.addf(join(gp, "pcieGen"), "must be 1..7 (0 means 4), got %d", g.PCIeGen)
		}
		if g.PCIeWidth < 0 || g.PCIeWidth > 32 {
			p.addf(join(gp, "pcieWidth"), "must be 1..32 (0 means 16), got %d", g.PCIeWidth)
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
			case l.Count < 1 || l.Count > maxLinksPerGPU:
				p.addf(join(lp, "count"), "%d is out of range 1..%d", l.Count, maxLinksPerGPU)
			case counts[i][l.Peer] != 0:
				p.addf(join(lp, "peer"), "peer %d listed twice", l.Peer)
			default:
				counts[i][l.Peer] = l.Count
			}
		}
		p.intIn(join(gp, "nvswitchLinks"), int64(g.NVSwitchLinks), 0, maxLinksPerGPU)
		if g.NVSwitchLinks > 0 && fabric != FabricNVSwitch && fabric != FabricRack {
			p.addf(join(gp, "nvswitchLinks"), "GPU has NVSwitch links but nvlink.fabric is %q", fabric)
		}
		if g.MIG != nil {
			validateMIG(join(gp, "mig"), g, p)
		}
	}
	for i := range counts {
		for j, c := range counts[i] {
			if back := counts[j][i]; back != c {
				p.addf(join(path, fmt.Sprintf("gpus[%d].nvlinks", i)),
					"asymmetric link count: GPU %d lists %d link(s) to GPU %d, but GPU %d lists %d back", i, c, j, j, back)
			}
		}
	}
	names := map[string]bool{}
	for i, nic := range m.NICs {
		np := join(path, fmt.Sprintf("nics[%d]", i))
		p.id(join(np, "name"), "NIC name", nic.Name, names)
		for _, f := range []struct{ field, v string }{{"netdev", nic.Netdev}, {"pciBusId", nic.PCIBusID}} {
			p.text(join(np, f.field), f.v, maxIDLen)
		}
		p.floatIn(join(np, "speedGbps"), nic.SpeedGbps, 0, maxNICGbps, false)
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
	if len(g.MIG.Instances) > 7 {
		p.addf(join(path, "instances"), "%d instances, a GPU has at most 7", len(g.MIG.Instances))
		return
	}
	compute, memGB := 0, 0
	for k, inst := range g.MIG.Instances {
		ip := join(path, fmt.Sprintf("instances[%d]", k))
		p.text(join(ip, "uuid"), inst.UUID, maxIDLen)
		c, m, err := ParseMIGProfile(inst.Profile)
		if err != nil {
			p.addf(join(ip, "profile"), "%.64q is not a MIG profile like \"1g.10gb\" (1..7 compute slices)", inst.Profile)
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

// Validate checks a cluster spec: names, every group names a known machine type (or carries
// an inline one), counts and rack sizes are within bounds, the cluster holds at most MaxGPUs
// GPUs, and every machine type is valid.
func (c *ClusterSpec) Validate() error {
	var p problems
	c.validate(&p, c.resolver())
	return p.err(clusterWhere(c), "", nil)
}

func clusterWhere(c *ClusterSpec) string {
	if c.Name == "" {
		return ""
	}
	return fmt.Sprintf("cluster %.64q", c.Name)
}

func (c *ClusterSpec) validate(p *problems, resolve func(*MachineGroup) (*MachineSpec, error)) {
	p.text("name", c.Name, maxTextLen)
	for _, name := range sortedKeys(c.MachineTypes) {
		mt := c.MachineTypes[name]
		mp := joinKey("machineTypes", name)
		if err := checkName(name); err != nil {
			p.addf(mp, "machine type %v", err)
			continue
		}
		if mt == nil {
			p.addf(mp, "is null")
			continue
		}
		if mt.Name != name {
			p.addf(join(mp, "name"), "%.64q differs from the machine type's key %q (give the same, or omit it in a file)", mt.Name, name)
		}
		mt.validate(mp, p)
	}
	if len(c.Machines) == 0 {
		p.addf("machines", "no machine groups")
	}
	total := 0
	for i := range c.Machines {
		g := &c.Machines[i]
		gp := fmt.Sprintf("machines[%d]", i)
		if g.Type != "" && checkName(g.Type) != nil {
			p.addf(join(gp, "type"), "machine type %v", checkName(g.Type))
			continue
		}
		ms, err := resolve(g)
		if err != nil {
			p.addf(gp, "%s", strings.TrimPrefix(err.Error(), "topology: "))
			p.unknown = p.unknown || errors.Is(err, ErrUnknownMachine)
			continue
		}
		if g.Machine != nil {
			ms.validate(join(gp, "machine"), p)
		}
		p.intIn(join(gp, "count"), int64(g.Count), 0, MaxGPUs)
		p.intIn(join(gp, "rackSize"), int64(g.RackSize), 0, MaxGPUs)
		if ms.NVLink != nil && ms.NVLink.Fabric == FabricRack && ms.NVLinkDomainSize > 0 && g.RackSize > ms.NVLinkDomainSize {
			p.addf(join(gp, "rackSize"), "%d machines per rack exceed the NVLink domain size %d of %q", g.RackSize, ms.NVLinkDomainSize, ms.Name)
		}
		if count, _ := g.layout(ms); count >= 0 && count <= MaxGPUs && total <= MaxGPUs {
			total += count * max(1, min(len(ms.GPUs), maxGPUsPerMachine))
			if total > MaxGPUs {
				p.addf(join(gp, "count"), "the cluster would hold more than %d GPUs (machines without GPUs count as one): a typo in a count?", MaxGPUs)
			}
		}
	}
	c.Network.validate("network", p)
}

func (n *NetworkSpec) validate(path string, p *problems) {
	p.floatIn(join(path, "oversubscription"), n.Oversubscription, 0, maxOversub, true)
	if o := n.Oversubscription; o > 0 && o < 1 {
		p.addf(join(path, "oversubscription"), "%v is below 1 (1 means non-blocking; 0 means 1)", o)
	}
	p.floatIn(join(path, "leafLatencyUs"), n.LeafLatencyUs, 0, maxLatencyUs, true)
	p.floatIn(join(path, "spineLatencyUs"), n.SpineLatencyUs, 0, maxLatencyUs, true)
}

// layout returns a group's machine count and rack size with defaults filled in: rack fabrics
// default to one NVLink domain, others to one machine in one rack.
func (g *MachineGroup) layout(ms *MachineSpec) (count, rackSize int) {
	count, rackSize = g.Count, g.RackSize
	if ms.NVLink != nil && ms.NVLink.Fabric == FabricRack {
		if count == 0 {
			count = ms.NVLinkDomainSize
		}
		if rackSize == 0 {
			rackSize = ms.NVLinkDomainSize
		}
	}
	if count == 0 {
		count = 1
	}
	if rackSize <= 0 {
		rackSize = count
	}
	return count, rackSize
}

// resolver returns a function giving the machine spec a group refers to. Each built-in type
// is read once per resolver, so groups of one type share one spec.
func (c *ClusterSpec) resolver() func(*MachineGroup) (*MachineSpec, error) {
	builtins := map[string]*MachineSpec{}
	return func(g *MachineGroup) (*MachineSpec, error) {
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
		if ms := builtins[g.Type]; ms != nil {
			return ms, nil
		}
		ms, err := BuiltinMachine(g.Type)
		if err != nil {
			return nil, err
		}
		builtins[g.Type] = ms
		return ms, nil
	}
}
