// Package topoadapt adapts a topology cluster to the gang scheduler core: the snapshot
// the core schedules on (Snapshot) and the collective cost model it scores AllReduce time
// with (Model, over topology's bandwidth model). The runtime and the simulator both use it.
//
// Usage sketch:
//
//	c, err := topology.Load("64xdgx-h100/8")
//	s, err := gang.New(gang.DefaultConfig(), topoadapt.Snapshot(c),
//		gang.WithCollectiveModel(topoadapt.NewModel(c, topology.Best)))
package topoadapt

import (
	"time"

	"github.com/atoll-run/atoll/gang"
	"github.com/atoll-run/atoll/topology"
)

// Snapshot turns a topology cluster into the scheduler's snapshot: node i is machine i,
// each GPU carries its NVLink island (topology.Cluster.IslandOf) and rack, CPU is the
// machine's logical CPUs (16 per GPU when the spec declares none), memory its host memory
// (128 GiB per GPU when undeclared). MIG-enabled GPUs are offered as 7 free compute slices
// (the operator's fixed layout is not modeled).
func Snapshot(c *topology.Cluster) gang.Snapshot {
	var s gang.Snapshot
	for _, m := range c.Machines {
		cpus := 0
		for _, n := range m.NUMANodes {
			cpus += n.CPUs
		}
		if cpus == 0 {
			cpus = 16 * len(m.GPUs)
		}
		mem := int64(0)
		if m.Spec != nil {
			mem = m.Spec.HostMemoryMiB
		}
		if mem == 0 {
			mem = int64(len(m.GPUs)) * 128 << 10
		}
		n := gang.Node{Name: m.Name, Rack: m.Rack, CPUMilli: int64(cpus) * 1000, MemMiB: mem, FreeCPU: int64(cpus) * 1000, FreeMem: mem}
		for _, g := range m.GPUs {
			gp := gang.GPU{Model: g.Model, Island: c.IslandOf(g.ID), FreeMilli: gang.Milli}
			if g.MIGEnabled {
				gp.MIG, gp.FreeSlices = true, gang.MIGSlicesPerGPU
			}
			n.GPUs = append(n.GPUs, gp)
		}
		s.Nodes = append(s.Nodes, n)
	}
	return s
}

// Model adapts topology.Cluster's bandwidth model to gang.CollectiveModel. It is
// read-only after construction and safe for concurrent use.
type Model struct {
	c     *topology.Cluster
	first []int
	algo  topology.Algo
}

var _ gang.CollectiveModel = (*Model)(nil)

// NewModel returns the adapter; algo is usually topology.Best.
func NewModel(c *topology.Cluster, algo topology.Algo) *Model {
	m := &Model{c: c, algo: algo}
	for _, mc := range c.Machines {
		m.first = append(m.first, mc.FirstGPU)
	}
	return m
}

// AllReduceTime implements gang.CollectiveModel.
func (m *Model) AllReduceTime(gpus []gang.GPURef, bytes int64) time.Duration {
	if len(gpus) <= 1 {
		return 0
	}
	ids := make([]int, len(gpus))
	for i, g := range gpus {
		ids[i] = m.first[g.Node] + g.GPU
	}
	return m.c.AllReduceTime(ids, bytes, m.algo)
}
