// Package topoview renders a topology.Cluster for people and tools: the JSON summary that
// `atoll topology --format json` prints, a readable text map and a Graphviz graph. It reads
// only the cluster's exported API; the model itself lives in package topology.
package topoview

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/atoll-run/atoll/topology"
)

// summarySizes are the message sizes of the AllReduce estimates in a Summary.
var summarySizes = []int64{1 << 20, 64 << 20, 1 << 30}

// Summary is the JSON view of a cluster printed by `atoll topology --format json`.
type Summary struct {
	Name string `json:"name"`
	// Machines, GPUs and Racks are counts.
	Machines int `json:"machines"`
	GPUs     int `json:"gpus"`
	Racks    int `json:"racks"`
	// Simulated is true when any machine is declared rather than discovered.
	Simulated bool `json:"simulated"`
	// Islands lists the NVLink islands as global GPU ids; IslandSizes counts islands by size.
	Islands     [][]int     `json:"islands"`
	IslandSizes map[int]int `json:"islandSizes"`
	// Network is the leaf/spine description.
	Network topology.NetworkSpec `json:"network"`
	// MachineTypes describes each machine type once, with its GPUs, link matrix and NICs.
	MachineTypes []MachineTypeSummary `json:"machineTypes"`
	// Tiers lists the link tiers present, with bandwidth and latency.
	Tiers []TierSummary `json:"tiers"`
	// AllReduceScope says which GPUs AllReduce covers (the whole of machine 0).
	AllReduceScope string                       `json:"allreduceScope"`
	AllReduce      []topology.AllReduceEstimate `json:"allreduce"`
	// AllReduceCluster covers every GPU of the cluster, when it has more than one machine.
	AllReduceCluster []topology.AllReduceEstimate `json:"allreduceCluster,omitempty"`
}

// MachineTypeSummary describes one machine type of a cluster.
type MachineTypeSummary struct {
	Type        string `json:"type"`
	Description string `json:"description,omitempty"`
	Count       int    `json:"count"`
	// Example is the first machine of the type.
	Example   string                  `json:"example"`
	NVLink    *topology.NVLinkSpec    `json:"nvlink,omitempty"`
	NUMANodes []topology.NUMANodeSpec `json:"numaNodes,omitempty"`
	NICs      []topology.NICSpec      `json:"nics,omitempty"`
	GPUs      []*topology.GPU         `json:"gpus"`
	// Matrix is the GPU-by-GPU path matrix in `nvidia-smi topo -m` notation (X, NV#, PIX,
	// NODE, SYS).
	Matrix [][]string `json:"matrix"`
	// LocalIslands are the islands inside one machine of this type, as local indexes.
	LocalIslands [][]int `json:"localIslands"`
}

// TierSummary is one link tier present in a cluster.
type TierSummary struct {
	Tier    topology.Tier `json:"tier"`
	GBps    float64       `json:"gbps"`
	Latency time.Duration `json:"latencyNs"`
	Example [2]int        `json:"example"`
}

// Summarize builds the JSON view of a cluster.
func Summarize(c *topology.Cluster) Summary {
	s := Summary{
		Name: c.Name, Machines: len(c.Machines), GPUs: c.NumGPUs(), Racks: len(c.Racks),
		Islands: c.Islands(), IslandSizes: map[int]int{}, Network: c.Network,
	}
	if s.Islands == nil {
		s.Islands = [][]int{}
	}
	for _, isl := range c.Islands() {
		s.IslandSizes[len(isl)]++
	}
	seen := map[*topology.MachineSpec]int{}
	for _, m := range c.Machines {
		s.Simulated = s.Simulated || m.Simulated
		if k, ok := seen[m.Spec]; ok {
			s.MachineTypes[k].Count++
			continue
		}
		seen[m.Spec] = len(s.MachineTypes)
		s.MachineTypes = append(s.MachineTypes, typeSummary(c, m))
	}
	s.Tiers = tiers(c)
	if len(c.Machines) > 0 {
		m := c.Machines[0]
		ids := seq(m.FirstGPU, len(m.GPUs))
		s.AllReduceScope = fmt.Sprintf("machine %s (%d GPUs)", m.Name, len(ids))
		s.AllReduce = estimates(c, ids)
		if len(c.Machines) > 1 {
			s.AllReduceCluster = estimates(c, seq(0, c.NumGPUs()))
		}
	}
	return s
}

// seq returns from, from+1, ..., from+n-1.
func seq(from, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = from + i
	}
	return out
}

func estimates(c *topology.Cluster, ids []int) []topology.AllReduceEstimate {
	var out []topology.AllReduceEstimate
	if len(ids) < 2 {
		return []topology.AllReduceEstimate{}
	}
	for _, size := range summarySizes {
		for _, a := range append(topology.Algos(), topology.Best) {
			e := c.AllReduce(ids, size, a)
			if e.Time == topology.Unreachable {
				continue
			}
			out = append(out, e)
		}
	}
	return out
}

func typeSummary(c *topology.Cluster, m *topology.Machine) MachineTypeSummary {
	ts := MachineTypeSummary{
		Type: m.Type, Description: m.Spec.Description, Count: 1, Example: m.Name,
		NVLink: m.NVLink, NUMANodes: m.NUMANodes, NICs: m.NICs, GPUs: m.GPUs,
	}
	n := len(m.GPUs)
	for i := 0; i < n; i++ {
		row := make([]string, n)
		for j := 0; j < n; j++ {
			row[j] = matrixCell(c.Link(m.FirstGPU+i, m.FirstGPU+j))
		}
		ts.Matrix = append(ts.Matrix, row)
	}
	local := map[int][]int{}
	var order []int
	for i := 0; i < n; i++ {
		k := c.IslandOf(m.FirstGPU + i)
		if _, ok := local[k]; !ok {
			order = append(order, k)
		}
		local[k] = append(local[k], i)
	}
	for _, k := range order {
		ts.LocalIslands = append(ts.LocalIslands, local[k])
	}
	return ts
}

func matrixCell(l topology.LinkInfo) string {
	switch l.Tier {
	case topology.TierSelf:
		return "X"
	case topology.TierNVLink, topology.TierNVSwitch:
		return fmt.Sprintf("NV%d", l.Links)
	case topology.TierPCIeSwitch:
		return "PIX"
	case topology.TierPCIeHostBridge:
		return "NODE"
	case topology.TierCrossSocket:
		return "SYS"
	}
	return l.Tier.String()
}

// tiers finds one example pair per tier present, looking inside each machine type and
// between the first machines of the first two racks.
func tiers(c *topology.Cluster) []TierSummary {
	found := map[topology.Tier]TierSummary{}
	add := func(a, b int) {
		l := c.Link(a, b)
		if l.Tier == topology.TierSelf || l.Tier == topology.TierUnknown {
			return
		}
		if _, ok := found[l.Tier]; !ok {
			found[l.Tier] = TierSummary{Tier: l.Tier, GBps: l.GBps, Latency: l.Latency, Example: [2]int{a, b}}
		}
	}
	seen := map[*topology.MachineSpec]bool{}
	for _, m := range c.Machines {
		if seen[m.Spec] {
			continue
		}
		seen[m.Spec] = true
		for i := range m.GPUs {
			for j := i + 1; j < len(m.GPUs); j++ {
				add(m.FirstGPU+i, m.FirstGPU+j)
			}
		}
	}
	// Across machines: within a rack, and across racks.
	for _, r := range c.Racks {
		if len(r.Machines) > 1 {
			a, b := c.Machines[r.Machines[0]], c.Machines[r.Machines[1]]
			if len(a.GPUs) > 0 && len(b.GPUs) > 0 {
				add(a.FirstGPU, b.FirstGPU)
			}
			break
		}
	}
	if len(c.Racks) > 1 {
		a, b := c.Machines[c.Racks[0].Machines[0]], c.Machines[c.Racks[1].Machines[0]]
		if len(a.GPUs) > 0 && len(b.GPUs) > 0 {
			add(a.FirstGPU, b.FirstGPU)
		}
	}
	out := make([]TierSummary, 0, len(found))
	for _, t := range found {
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Tier < out[j].Tier })
	return out
}

// WriteText writes a readable map of a cluster: machines, islands, GPUs per island, NIC
// affinity, link tiers and AllReduce estimates. Long lists are cut after `limit` entries
// (0 means 16).
func WriteText(w io.Writer, c *topology.Cluster, limit int) error {
	if limit <= 0 {
		limit = 16
	}
	s := Summarize(c)
	b := &strings.Builder{}
	kind := "declared (simulated)"
	if !s.Simulated {
		kind = "discovered"
	}
	fmt.Fprintf(b, "cluster %s: %d machine(s), %d GPU(s), %d rack(s), %d NVLink island(s); %s\n",
		s.Name, s.Machines, s.GPUs, s.Racks, len(s.Islands), kind)
	if s.Racks > 1 {
		fmt.Fprintf(b, "network: leaf per rack, spine oversubscription %.3g:1, latency leaf %.1fus spine %.1fus\n",
			s.Network.Oversubscription, s.Network.LeafLatencyUs, s.Network.SpineLatencyUs)
	}
	for _, t := range s.MachineTypes {
		fmt.Fprintf(b, "\nmachine type %s x%d (e.g. %s)", t.Type, t.Count, t.Example)
		if t.Description != "" {
			fmt.Fprintf(b, ": %s", t.Description)
		}
		b.WriteString("\n")
		if t.NVLink != nil {
			fmt.Fprintf(b, "  NVLink %d, %.0f GB/s per link per direction, fabric %s", t.NVLink.Generation, t.NVLink.LinkGBps, t.NVLink.Fabric)
			if t.NVLink.SHARP {
				b.WriteString(", NVLink SHARP")
			}
			b.WriteString("\n")
		} else {
			b.WriteString("  no NVLink (PCIe only)\n")
		}
		for _, nn := range t.NUMANodes {
			fmt.Fprintf(b, "  NUMA %d: %d CPUs %s", nn.ID, nn.CPUs, nn.CPUList)
			if nn.MemoryMiB > 0 {
				fmt.Fprintf(b, ", %d GiB", nn.MemoryMiB/1024)
			}
			b.WriteString("\n")
		}
		if len(t.GPUs) > 0 {
			fmt.Fprintf(b, "  %-4s %-26s %9s %4s %-6s %-8s %-10s %s\n", "GPU", "model", "memory", "NUMA", "switch", "island", "NIC", "MIG")
		}
		for _, g := range t.GPUs {
			nic := g.NIC
			if nic == "" {
				nic = "-"
			} else if g.GPUDirect {
				nic += "*"
			}
			mig := "-"
			if g.MIGEnabled {
				var ps []string
				for _, in := range g.MIG {
					ps = append(ps, in.Profile)
				}
				mig = compactList(ps)
			}
			sw := g.PCIeSwitch
			if sw == "" {
				sw = "-"
			}
			fmt.Fprintf(b, "  %-4d %-26s %6d MiB %4d %-6s %-8d %-10s %s\n", g.Index, trim(g.Model, 26), g.MemoryMiB, g.NUMA, sw, c.IslandOf(g.ID), nic, mig)
		}
		if len(t.GPUs) > 0 {
			b.WriteString("  (* = NIC on the GPU's PCIe switch: GPUDirect RDMA path)\n")
		}
		for _, nic := range t.NICs {
			rdma := "no RDMA"
			if nic.RDMA {
				rdma = "RDMA"
			}
			fmt.Fprintf(b, "  NIC %-10s %6.0f Gb/s %-7s NUMA %d switch %s\n", nic.Name, nic.SpeedGbps, rdma, nic.NUMA, orDash(nic.PCIeSwitch))
		}
		if n := len(t.Matrix); n > 0 && n <= 16 {
			b.WriteString("  paths:")
			for j := 0; j < n; j++ {
				fmt.Fprintf(b, " %5s", fmt.Sprintf("GPU%d", j))
			}
			b.WriteString("\n")
			for i, row := range t.Matrix {
				fmt.Fprintf(b, "  %5s ", fmt.Sprintf("GPU%d", i))
				for _, cell := range row {
					fmt.Fprintf(b, " %5s", cell)
				}
				b.WriteString("\n")
			}
		}
	}
	sizes := make([]int, 0, len(s.IslandSizes))
	for k := range s.IslandSizes {
		sizes = append(sizes, k)
	}
	sort.Sort(sort.Reverse(sort.IntSlice(sizes)))
	var parts []string
	for _, k := range sizes {
		parts = append(parts, fmt.Sprintf("%d of %d GPU(s)", s.IslandSizes[k], k))
	}
	if len(parts) == 0 {
		parts = []string{"none (no GPUs)"}
	}
	fmt.Fprintf(b, "\nislands: %s\n", strings.Join(parts, ", "))
	for i, isl := range s.Islands {
		if i == limit {
			fmt.Fprintf(b, "  ... %d more\n", len(s.Islands)-limit)
			break
		}
		ms := map[int]bool{}
		for _, g := range isl {
			ms[c.GPU(g).Machine] = true
		}
		fmt.Fprintf(b, "  island %d: GPUs %s (%d GPU(s) on %d machine(s))\n", i, topology.FormatIDs(isl), len(isl), len(ms))
	}
	b.WriteString("\nlink tiers:\n")
	if len(s.Tiers) == 0 {
		b.WriteString("  none (fewer than two GPUs)\n")
	}
	for _, t := range s.Tiers {
		fmt.Fprintf(b, "  %-17s %7.1f GB/s  %6.1f us   e.g. GPU %d - GPU %d\n", t.Tier, t.GBps, float64(t.Latency)/1e3, t.Example[0], t.Example[1])
	}
	writeEstimates(b, "AllReduce over "+s.AllReduceScope, s.AllReduce)
	if len(s.AllReduceCluster) > 0 {
		writeEstimates(b, fmt.Sprintf("AllReduce over the whole cluster (%d GPUs)", s.GPUs), s.AllReduceCluster)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func writeEstimates(b *strings.Builder, title string, es []topology.AllReduceEstimate) {
	if len(es) == 0 {
		return
	}
	fmt.Fprintf(b, "\n%s (alpha-beta model; busbw as nccl-tests reports it):\n", title)
	fmt.Fprintf(b, "  %-8s %-18s %12s %12s  %s\n", "size", "algorithm", "time", "busbw GB/s", "bottleneck")
	for _, e := range es {
		name := e.Algo.String()
		if e.Requested == topology.Best {
			name = "best=" + name
		}
		fmt.Fprintf(b, "  %-8s %-18s %12s %12.1f  %s\n", humanBytes(e.Bytes), name, e.Time.Round(100*time.Nanosecond), e.BusBWGBps, e.Bottleneck)
	}
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%dGiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}

func trim(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-1] + "~"
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// compactList writes ["1g.10gb","1g.10gb","3g.40gb"] as "2x1g.10gb,3g.40gb".
func compactList(ps []string) string {
	var out []string
	for i := 0; i < len(ps); {
		j := i
		for j < len(ps) && ps[j] == ps[i] {
			j++
		}
		if j-i > 1 {
			out = append(out, fmt.Sprintf("%dx%s", j-i, ps[i]))
		} else {
			out = append(out, ps[i])
		}
		i = j
	}
	return strings.Join(out, ",")
}

// WriteDOT writes a cluster as a Graphviz graph: one cluster box per machine with its GPUs, NVLink
// bundles as edges, NVSwitch fabrics as switch nodes (one per rack for rack fabrics), and
// NICs joined to the GPUs that use them. Machines after the first `limit` (0 means 64) are
// left out, with a note.
func WriteDOT(w io.Writer, c *topology.Cluster, limit int) error {
	if limit <= 0 {
		limit = 64
	}
	b := &strings.Builder{}
	fmt.Fprintf(b, "graph %q {\n  compound=true; node [shape=box, fontsize=10];\n", "atoll-"+c.Name)
	rackSwitch := map[int]bool{}
	for mi, m := range c.Machines {
		if mi == limit {
			fmt.Fprintf(b, "  more [shape=note, label=\"%d more machines\"];\n", len(c.Machines)-limit)
			break
		}
		fmt.Fprintf(b, "  subgraph \"cluster_m%d\" {\n    label=%q;\n", m.Index, fmt.Sprintf("%s (%s, rack %d)", m.Name, m.Type, m.Rack))
		for _, g := range m.GPUs {
			label := fmt.Sprintf("GPU%d (#%d)\\n%s", g.Index, g.ID, g.Model)
			if g.MIGEnabled {
				label += "\\nMIG"
			}
			fmt.Fprintf(b, "    g%d [label=\"%s\", style=filled, fillcolor=\"#c8e6c9\"];\n", g.ID, label)
		}
		for k, nic := range m.NICs {
			fmt.Fprintf(b, "    n%d_%d [label=\"%s\\n%.0f Gb/s\", shape=ellipse];\n", m.Index, k, nic.Name, nic.SpeedGbps)
		}
		if m.NVLink != nil && m.NVLink.Fabric == topology.FabricNVSwitch {
			fmt.Fprintf(b, "    s%d [label=\"NVSwitch\", shape=diamond];\n", m.Index)
		}
		b.WriteString("  }\n")
		for _, g := range m.GPUs {
			for _, l := range g.NVLinks {
				if l.Peer > g.Index && !g.MIGEnabled && !m.GPUs[l.Peer].MIGEnabled {
					fmt.Fprintf(b, "  g%d -- g%d [label=\"NV%d\", penwidth=2];\n", g.ID, m.FirstGPU+l.Peer, l.Count)
				}
			}
			if g.NVSwitchLinks > 0 && !g.MIGEnabled && m.NVLink != nil {
				switch m.NVLink.Fabric {
				case topology.FabricNVSwitch:
					fmt.Fprintf(b, "  g%d -- s%d [label=\"NV%d\"];\n", g.ID, m.Index, g.NVSwitchLinks)
				case topology.FabricRack:
					if c.Racks[m.Rack].NVLinkDomain {
						if !rackSwitch[m.Rack] {
							fmt.Fprintf(b, "  r%d [label=\"rack %d NVSwitch fabric\", shape=diamond];\n", m.Rack, m.Rack)
							rackSwitch[m.Rack] = true
						}
						fmt.Fprintf(b, "  g%d -- r%d [label=\"NV%d\"];\n", g.ID, m.Rack, g.NVSwitchLinks)
					}
				}
			}
			if k := nicIndex(m, g); k >= 0 {
				style := "dashed"
				if g.GPUDirect {
					style = "solid"
				}
				fmt.Fprintf(b, "  g%d -- n%d_%d [style=%s, color=gray];\n", g.ID, m.Index, k, style)
			}
		}
	}
	b.WriteString("}\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// nicIndex is the index in m.NICs of the NIC that GPU g uses (NIC names are unique within a
// machine), or -1 when it has none.
func nicIndex(m *topology.Machine, g *topology.GPU) int {
	for k, nic := range m.NICs {
		if g.NIC != "" && nic.Name == g.NIC {
			return k
		}
	}
	return -1
}
