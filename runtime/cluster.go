package runtime

import (
	"errors"
	"fmt"
	"sort"

	"github.com/atoll-run/atoll/topology"
)

// Errors of the runtime. Check them with errors.Is.
var (
	// ErrInvalidRequest: a request is malformed (zero or negative GPUs, empty names, ...).
	ErrInvalidRequest = errors.New("runtime: invalid request")
	// ErrNeverFits: a gang can never be placed on this cluster, even when it is empty.
	ErrNeverFits = errors.New("runtime: gang can never fit on this cluster")
	// ErrNoCapacity: a gang does not fit now (other work holds the GPUs it needs).
	ErrNoCapacity = errors.New("runtime: not enough free GPUs now")
	// ErrUnknownObject: no object with that id (never created, or freed).
	ErrUnknownObject = errors.New("runtime: unknown object")
	// ErrUnknownMachine: no machine of that name.
	ErrUnknownMachine = errors.New("runtime: unknown machine")
)

// GPU is one GPU of the cluster as the head sees it.
type GPU struct {
	// Global is the GPU's id in the whole cluster (0..N-1, machine by machine).
	Global int
	// Machine is the index of its machine; Index its index inside the machine.
	Machine, Index int
	// Island is the global id of the NVLink island the GPU belongs to.
	Island int
	// Model is the GPU model name.
	Model string
	// MemoryMiB is its memory.
	MemoryMiB int64
	// UUID is NVML's UUID, or a made-up "GPU-sim-..." for a simulated GPU.
	UUID string
}

// Machine is one machine of the cluster.
type Machine struct {
	// Name is unique in the cluster, e.g. "node-0".
	Name string
	// Type is the machine type, e.g. "dgx-h100".
	Type string
	// Rack is the machine's rack index.
	Rack int
	// Simulated says the machine's GPUs are declared, not real hardware.
	Simulated bool
	// GPUs are the machine's GPUs in index order.
	GPUs []GPU
}

// Cluster is the head's picture of the machines: GPUs, islands, racks.
type Cluster struct {
	Machines []Machine
	// Islands lists, for each island id, the global ids of its GPUs.
	Islands [][]int
	// Topology is the full machine model the cluster was built from (links, NICs, the
	// bandwidth model), or nil for a cluster declared without one.
	Topology *topology.Cluster
}

// FromTopology makes the head's picture of a topology cluster. GPU ids, islands and
// machine order are the topology's.
func FromTopology(tc *topology.Cluster) *Cluster {
	c := &Cluster{Topology: tc, Islands: tc.Islands()}
	for _, m := range tc.Machines {
		rm := Machine{Name: m.Name, Type: m.Type, Rack: m.Rack, Simulated: m.Simulated}
		for _, g := range m.GPUs {
			rm.GPUs = append(rm.GPUs, GPU{Global: g.ID, Machine: m.Index, Index: g.Index, Island: tc.IslandOf(g.ID),
				Model: g.Model, MemoryMiB: g.MemoryMiB, UUID: g.UUID})
		}
		c.Machines = append(c.Machines, rm)
	}
	return c
}

// LoadCluster builds the head's cluster from a topology spec: a built-in machine name, a
// shorthand such as "4xdgx-h100" or "64xdgx-h100/8", or a spec file.
func LoadCluster(spec string) (*Cluster, error) {
	tc, err := topology.Load(spec)
	if err != nil {
		return nil, err
	}
	return FromTopology(tc), nil
}

// NumGPUs is the number of GPUs in the cluster.
func (c *Cluster) NumGPUs() int {
	n := 0
	for _, m := range c.Machines {
		n += len(m.GPUs)
	}
	return n
}

// GPU returns the GPU with the given global id.
func (c *Cluster) GPU(global int) (GPU, bool) {
	for _, m := range c.Machines {
		if len(m.GPUs) > 0 && global >= m.GPUs[0].Global && global <= m.GPUs[len(m.GPUs)-1].Global {
			return m.GPUs[global-m.GPUs[0].Global], true
		}
	}
	return GPU{}, false
}

// LargestIsland is the size of the cluster's largest NVLink island.
func (c *Cluster) LargestIsland() int {
	best := 0
	for _, is := range c.Islands {
		best = max(best, len(is))
	}
	return best
}

// Validate checks that the cluster is self-consistent.
func (c *Cluster) Validate() error {
	if len(c.Machines) == 0 {
		return fmt.Errorf("%w: cluster has no machines", ErrInvalidRequest)
	}
	names := map[string]bool{}
	next := 0
	for mi, m := range c.Machines {
		if m.Name == "" || names[m.Name] {
			return fmt.Errorf("%w: machine %d has an empty or duplicate name %q", ErrInvalidRequest, mi, m.Name)
		}
		names[m.Name] = true
		for gi, g := range m.GPUs {
			if g.Global != next || g.Machine != mi || g.Index != gi {
				return fmt.Errorf("%w: machine %q GPU %d has ids (global %d, machine %d, index %d), want (%d, %d, %d)",
					ErrInvalidRequest, m.Name, gi, g.Global, g.Machine, g.Index, next, mi, gi)
			}
			if g.Island < 0 || g.Island >= len(c.Islands) {
				return fmt.Errorf("%w: machine %q GPU %d is on island %d of %d", ErrInvalidRequest, m.Name, gi, g.Island, len(c.Islands))
			}
			next++
		}
	}
	for id, is := range c.Islands {
		if !sort.IntsAreSorted(is) {
			return fmt.Errorf("%w: island %d is not sorted", ErrInvalidRequest, id)
		}
	}
	return nil
}
