package pools

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/atoll-run/atoll/topology"
)

// Shape is what the autoscaler needs to know of a machine type: its whole cards, how they
// group into NVLink islands, and its CPU and memory.
type Shape struct {
	// Type is the machine type's name.
	Type string `json:"type"`
	// Models are the GPU models of the machine (usually one).
	Models []string `json:"models"`
	// GPUs is the number of whole cards (MIG-mode cards excluded).
	GPUs int `json:"gpus"`
	// Islands are the card counts of the machine's NVLink islands, as seen inside one
	// machine (one island of 8 on an NVSwitch box, four of 2 on NVLink pairs, eight of 1 on
	// a PCIe-only box).
	Islands []int `json:"islands"`
	// DomainMachines is how many machines join one NVLink island through a rack fabric (18
	// for GB200 NVL72); 1 when islands stay inside a machine.
	DomainMachines int `json:"domain_machines"`
	// CPUMilli and MemMiB are the machine's CPU and host memory.
	CPUMilli int64 `json:"cpu_milli"`
	MemMiB   int64 `json:"mem_mib"`
}

// LoadShape resolves a pool's machine type (a built-in name, a shorthand, or a spec file,
// looked up in dir when relative) and returns its spec and shape.
func LoadShape(machine, dir string) (*topology.MachineSpec, Shape, error) {
	src := machine
	if !filepath.IsAbs(src) && dir != "" {
		if st, err := os.Stat(filepath.Join(dir, src)); err == nil && !st.IsDir() {
			src = filepath.Join(dir, src)
		}
	}
	c, err := topology.Load(src)
	if err != nil {
		return nil, Shape{}, err
	}
	if len(c.Machines) == 0 {
		return nil, Shape{}, fmt.Errorf("%q declares no machine", machine)
	}
	for _, m := range c.Machines[1:] {
		if m.Type != c.Machines[0].Type {
			return nil, Shape{}, fmt.Errorf("%q declares machines of types %s and %s: a pool has one machine type", machine, c.Machines[0].Type, m.Type)
		}
	}
	ms := c.Machines[0].Spec
	sh, err := ShapeOf(ms)
	return ms, sh, err
}

// ShapeOf derives a machine type's shape from its topology spec.
func ShapeOf(ms *topology.MachineSpec) (Shape, error) {
	one, err := topology.BuildMachines([]topology.MachineInstance{{Spec: ms}}, topology.NetworkSpec{})
	if err != nil {
		return Shape{}, err
	}
	m := one.Machines[0]
	sh := Shape{Type: ms.Name, DomainMachines: 1}
	sizes := map[int]int{}
	var order []int
	for _, g := range m.GPUs {
		if !slices.Contains(sh.Models, g.Model) {
			sh.Models = append(sh.Models, g.Model)
		}
		if g.MIGEnabled {
			continue
		}
		sh.GPUs++
		is := one.IslandOf(g.ID)
		if _, ok := sizes[is]; !ok {
			order = append(order, is)
		}
		sizes[is]++
	}
	for _, is := range order {
		sh.Islands = append(sh.Islands, sizes[is])
	}
	if ms.NVLink != nil && ms.NVLink.Fabric == topology.FabricRack && ms.NVLinkDomainSize > 1 {
		sh.DomainMachines = ms.NVLinkDomainSize
	}
	cpus := 0
	for _, n := range ms.NUMANodes {
		cpus += n.CPUs
	}
	if cpus == 0 {
		cpus = 16 * len(m.GPUs)
	}
	sh.CPUMilli = int64(cpus) * 1000
	sh.MemMiB = ms.HostMemoryMiB
	if sh.MemMiB == 0 {
		sh.MemMiB = int64(len(m.GPUs)) * 128 << 10
	}
	return sh, nil
}

// largestIsland is the most cards of one NVLink island on one machine.
func (s Shape) largestIsland() int {
	best := 0
	for _, n := range s.Islands {
		best = max(best, n)
	}
	return best
}

// hasModel reports whether the machine has a card of one of the models (any when empty).
func (s Shape) hasModel(models []string) bool {
	if len(models) == 0 {
		return true
	}
	for _, m := range models {
		if slices.Contains(s.Models, m) {
			return true
		}
	}
	return false
}
