package sim

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/atoll-run/atoll/gang"
	"github.com/atoll-run/atoll/gang/topoadapt"
	"github.com/atoll-run/atoll/topology"
)

// LoadCluster builds the simulated cluster for --cluster: a topology spec file or
// shorthand ("64xdgx-h100/8"), or a Philly machine list CSV (machineId, number of GPUs,
// ...; gzip-compressed when the name ends in ".gz"). Philly machines are declared as PCIe
// machines without NVLink (each GPU its own island), 8 machines per rack, modeled with the
// tiered collective model at PCIe speeds.
func LoadCluster(spec string, skipBad bool, sk *Skipper) (gang.Snapshot, gang.CollectiveModel, string, error) {
	if st, err := os.Stat(spec); err == nil && !st.IsDir() && (strings.HasSuffix(strings.ToLower(spec), ".csv") || strings.HasSuffix(strings.ToLower(spec), ".csv.gz")) {
		return loadPhillyMachines(spec, skipBad, sk)
	}
	c, err := topology.Load(spec)
	if err != nil {
		return gang.Snapshot{}, nil, "", fmt.Errorf("sim: cluster %q: %w", spec, err)
	}
	desc := fmt.Sprintf("%s: %d machines, %d GPUs, %d NVLink islands (simulated from declared specs)", spec, len(c.Machines), c.NumGPUs(), len(c.Islands()))
	return topoadapt.Snapshot(c), topoadapt.NewModel(c, topology.Best), desc, nil
}

func loadPhillyMachines(path string, skipBad bool, sk *Skipper) (gang.Snapshot, gang.CollectiveModel, string, error) {
	t, err := readTable(path, skipBad, sk.add)
	if err != nil {
		return gang.Snapshot{}, nil, "", err
	}
	col := ""
	for h := range t.col {
		if strings.Contains(h, "number of gpus") {
			col = h
		}
	}
	if col == "" {
		return gang.Snapshot{}, nil, "", fmt.Errorf("sim: %s: machine list lacks a \"number of GPUs\" column: %w", path, ErrBadHeader)
	}
	var s gang.Snapshot
	gpus, island := 0, 0
	for i := range t.rows {
		n, err := t.num(i, col, 0)
		if err == nil {
			err = t.bounded(i, col, n, 0, MaxMachineGPUs, true)
		}
		if err == nil && gpus+int(n) > MaxClusterGPUs {
			err = t.rowErr(i, col, t.str(i, col), fmt.Sprintf("the machine list would hold more than %d GPUs", MaxClusterGPUs))
		}
		if err != nil {
			if skipBad {
				sk.add(err)
				continue
			}
			return gang.Snapshot{}, nil, "", err
		}
		if n == 0 {
			continue
		}
		name := t.str(i, "machineid")
		idx := len(s.Nodes)
		node := gang.Node{Name: name, Rack: idx / 8, CPUMilli: int64(n) * 8000, MemMiB: int64(n) * 64 << 10}
		node.FreeCPU, node.FreeMem = node.CPUMilli, node.MemMiB
		for g := 0; g < int(n); g++ {
			node.GPUs = append(node.GPUs, gang.GPU{Model: "philly-gpu", Island: island, FreeMilli: gang.Milli})
			island++
		}
		gpus += int(n)
		s.Nodes = append(s.Nodes, node)
	}
	if len(s.Nodes) == 0 {
		return gang.Snapshot{}, nil, "", fmt.Errorf("sim: %s: no machines with GPUs: %w", path, ErrBadSpec)
	}
	m := gang.TieredModel{IslandGBps: 16, MachineGBps: 16, RackGBps: 5, SpineGBps: 2.5, HopLatency: 10 * time.Microsecond}
	return s, m, fmt.Sprintf("%s: %d machines, %d GPUs (Philly list; PCIe, no NVLink, 8 per rack)", path, len(s.Nodes), gpus), nil
}
