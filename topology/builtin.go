package topology

import (
	"fmt"
	"strings"
)

// Built-in machine types. Figures come from NVIDIA's public data sheets and user guides; the
// machines are declared, not discovered: a cluster built from them is simulated.
//
//   - dgx-a100: DGX A100 (640 GB): 8x A100-SXM4-80GB, NVLink 3 (12 links x 25 GB/s per GPU)
//     through 6 NVSwitches, 2x AMD EPYC 7742, 8x ConnectX-6 200 Gb/s HDR InfiniBand, four
//     PCIe 4 switches each holding 2 GPUs and 2 NICs.
//   - dgx-a100-mig: the same machine partitioned as an operator might: GPUs 0-3 in MIG mode
//     as 7x 1g.10gb, GPUs 4-5 as 3g.40gb + 2x 2g.20gb, GPUs 6-7 whole. A GPU in MIG mode
//     has no NVLink peer-to-peer, so each MIG GPU is an island of its own; 6-7 form one.
//   - dgx-h100: DGX H100: 8x H100 SXM5 80GB, NVLink 4 (18 links x 25 GB/s) through 4
//     NVSwitches with NVLink SHARP, 2x Xeon 8480C, 8x ConnectX-7 400 Gb/s, one NIC per GPU.
//   - hgx-h200: HGX H200 8-GPU: as dgx-h100 with H200 141 GB.
//   - pcie-l40s-8: 8x L40S 48 GB on PCIe 4 switches, no NVLink, 2x 200 Gb/s RoCE NICs.
//   - a100-pcie-nvlink-pairs: 8x A100 PCIe 80GB, pairs joined by NVLink bridges (3 bridges =
//     12 links x 25 GB/s per pair), PCIe 4.
//   - gb200-nvl72: one GB200 NVL72 compute tray: 4 B200 GPUs and 2 Grace CPUs, NVLink 5
//     (18 links x 50 GB/s per GPU) into the rack's NVSwitch trays; 18 trays form one
//     72-GPU NVLink domain, so a bare "gb200-nvl72" means 18 trays in one rack.
var builtinNames = []string{
	"a100-pcie-nvlink-pairs",
	"dgx-a100",
	"dgx-a100-mig",
	"dgx-h100",
	"gb200-nvl72",
	"hgx-h200",
	"pcie-l40s-8",
}

// BuiltinNames returns the names of the built-in machine types, sorted.
func BuiltinNames() []string {
	return append([]string(nil), builtinNames...)
}

// BuiltinMachine returns a fresh copy of a built-in machine type; the caller may change it.
// An unknown name gives an error wrapping ErrUnknownMachine that lists the known names.
func BuiltinMachine(name string) (*MachineSpec, error) {
	var m *MachineSpec
	switch name {
	case "dgx-a100":
		m = dgxA100(false)
	case "dgx-a100-mig":
		m = dgxA100(true)
	case "dgx-h100":
		m = hopper8("dgx-h100", "DGX H100: 8x H100 SXM5 80GB, NVLink 4 via 4 NVSwitches (SHARP), 8x 400 Gb/s ConnectX-7",
			"NVIDIA H100 80GB HBM3", 81559, 2*1024*1024)
	case "hgx-h200":
		m = hopper8("hgx-h200", "HGX H200 8-GPU: 8x H200 141GB, NVLink 4 via 4 NVSwitches (SHARP), 8x 400 Gb/s ConnectX-7",
			"NVIDIA H200", 143771, 2*1024*1024)
	case "pcie-l40s-8":
		m = pcieL40S()
	case "a100-pcie-nvlink-pairs":
		m = a100Pairs()
	case "gb200-nvl72":
		m = gb200Tray()
	default:
		return nil, fmt.Errorf("topology: machine type %q: %w (built-in: %s)", name, ErrUnknownMachine, strings.Join(builtinNames, ", "))
	}
	return m, nil
}

// twoSockets returns NUMA nodes 0 and 1 with the given cores per node.
func twoSockets(cpusPerNode int, memMiBPerNode int64) []NUMANodeSpec {
	return []NUMANodeSpec{
		{ID: 0, CPUs: cpusPerNode, CPUList: fmt.Sprintf("0-%d", cpusPerNode-1), MemoryMiB: memMiBPerNode},
		{ID: 1, CPUs: cpusPerNode, CPUList: fmt.Sprintf("%d-%d", cpusPerNode, 2*cpusPerNode-1), MemoryMiB: memMiBPerNode},
	}
}

// fourSwitches returns PCIe switches sw0..sw3, the first two on NUMA 0.
func fourSwitches() []PCIeSwitchSpec {
	return []PCIeSwitchSpec{{ID: "sw0", NUMA: 0}, {ID: "sw1", NUMA: 0}, {ID: "sw2", NUMA: 1}, {ID: "sw3", NUMA: 1}}
}

// busIDs are plausible PCI addresses for 8 GPUs (those of a DGX H100).
var busIDs = []string{"0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0", "0000:9a:00.0", "0000:ab:00.0", "0000:ba:00.0", "0000:db:00.0"}

func dgxA100(mig bool) *MachineSpec {
	m := &MachineSpec{
		Name:          "dgx-a100",
		Description:   "DGX A100 640GB: 8x A100-SXM4-80GB, NVLink 3 via 6 NVSwitches, 8x 200 Gb/s HDR InfiniBand",
		NVLink:        &NVLinkSpec{Generation: 3, LinkGBps: 25, Fabric: FabricNVSwitch},
		PCIeSwitches:  fourSwitches(),
		NUMANodes:     twoSockets(128, 1024*1024),
		HostMemoryMiB: 2 * 1024 * 1024,
	}
	for i := 0; i < 8; i++ {
		sw := i / 2
		m.GPUs = append(m.GPUs, GPUSpec{
			Index: i, Model: "NVIDIA A100-SXM4-80GB", MemoryMiB: 81920, ComputeCapability: "8.0",
			PCIBusID: busIDs[i], NUMA: sw / 2, PCIeSwitch: fmt.Sprintf("sw%d", sw), PCIeGen: 4, PCIeWidth: 16,
			NVSwitchLinks: 12,
		})
		m.NICs = append(m.NICs, NICSpec{Name: fmt.Sprintf("mlx5_%d", i), Netdev: fmt.Sprintf("ibp%d", i), RDMA: true, SpeedGbps: 200, NUMA: sw / 2, PCIeSwitch: fmt.Sprintf("sw%d", sw)})
	}
	if mig {
		m.Name = "dgx-a100-mig"
		m.Description = "DGX A100 640GB with MIG: GPUs 0-3 as 7x 1g.10gb, GPUs 4-5 as 3g.40gb + 2x 2g.20gb, GPUs 6-7 whole"
		for i := 0; i < 6; i++ {
			spec := &MIGSpec{Enabled: true}
			if i < 4 {
				for k := 0; k < 7; k++ {
					spec.Instances = append(spec.Instances, MIGInstanceSpec{Profile: "1g.10gb"})
				}
			} else {
				spec.Instances = []MIGInstanceSpec{{Profile: "3g.40gb"}, {Profile: "2g.20gb"}, {Profile: "2g.20gb"}}
			}
			m.GPUs[i].MIG = spec
		}
	}
	return m
}

func hopper8(name, desc, model string, memMiB, hostMiB int64) *MachineSpec {
	m := &MachineSpec{
		Name:          name,
		Description:   desc,
		NVLink:        &NVLinkSpec{Generation: 4, LinkGBps: 25, Fabric: FabricNVSwitch, SHARP: true},
		PCIeSwitches:  fourSwitches(),
		NUMANodes:     twoSockets(112, hostMiB/2),
		HostMemoryMiB: hostMiB,
	}
	for i := 0; i < 8; i++ {
		sw := i / 2
		m.GPUs = append(m.GPUs, GPUSpec{
			Index: i, Model: model, MemoryMiB: memMiB, ComputeCapability: "9.0",
			PCIBusID: busIDs[i], NUMA: sw / 2, PCIeSwitch: fmt.Sprintf("sw%d", sw), PCIeGen: 5, PCIeWidth: 16,
			NVSwitchLinks: 18,
		})
		m.NICs = append(m.NICs, NICSpec{Name: fmt.Sprintf("mlx5_%d", i), Netdev: fmt.Sprintf("ibp%d", i), RDMA: true, SpeedGbps: 400, NUMA: sw / 2, PCIeSwitch: fmt.Sprintf("sw%d", sw)})
	}
	return m
}

func pcieL40S() *MachineSpec {
	m := &MachineSpec{
		Name:          "pcie-l40s-8",
		Description:   "8x L40S 48GB on PCIe 4 switches, no NVLink, 2x 200 Gb/s RoCE",
		PCIeSwitches:  fourSwitches(),
		NUMANodes:     twoSockets(64, 512*1024),
		HostMemoryMiB: 1024 * 1024,
	}
	for i := 0; i < 8; i++ {
		sw := i / 2
		m.GPUs = append(m.GPUs, GPUSpec{
			Index: i, Model: "NVIDIA L40S", MemoryMiB: 46068, ComputeCapability: "8.9",
			PCIBusID: busIDs[i], NUMA: sw / 2, PCIeSwitch: fmt.Sprintf("sw%d", sw), PCIeGen: 4, PCIeWidth: 16,
		})
	}
	m.NICs = []NICSpec{
		{Name: "mlx5_0", Netdev: "ens1f0np0", RDMA: true, SpeedGbps: 200, NUMA: 0, PCIeSwitch: "sw0"},
		{Name: "mlx5_1", Netdev: "ens2f0np0", RDMA: true, SpeedGbps: 200, NUMA: 1, PCIeSwitch: "sw2"},
	}
	return m
}

func a100Pairs() *MachineSpec {
	m := &MachineSpec{
		Name:          "a100-pcie-nvlink-pairs",
		Description:   "8x A100 PCIe 80GB, 4 NVLink-bridged pairs (3 bridges, 12 links each), PCIe 4",
		NVLink:        &NVLinkSpec{Generation: 3, LinkGBps: 25, Fabric: FabricDirect},
		PCIeSwitches:  fourSwitches(),
		NUMANodes:     twoSockets(64, 512*1024),
		HostMemoryMiB: 1024 * 1024,
	}
	for i := 0; i < 8; i++ {
		sw := i / 2
		m.GPUs = append(m.GPUs, GPUSpec{
			Index: i, Model: "NVIDIA A100 80GB PCIe", MemoryMiB: 81920, ComputeCapability: "8.0",
			PCIBusID: busIDs[i], NUMA: sw / 2, PCIeSwitch: fmt.Sprintf("sw%d", sw), PCIeGen: 4, PCIeWidth: 16,
			NVLinks: []NVLinkPeer{{Peer: i ^ 1, Count: 12}},
		})
	}
	m.NICs = []NICSpec{
		{Name: "mlx5_0", Netdev: "ens1f0np0", RDMA: true, SpeedGbps: 100, NUMA: 0, PCIeSwitch: "sw0"},
		{Name: "mlx5_1", Netdev: "ens2f0np0", RDMA: true, SpeedGbps: 100, NUMA: 1, PCIeSwitch: "sw2"},
	}
	return m
}

func gb200Tray() *MachineSpec {
	m := &MachineSpec{
		Name: "gb200-nvl72",
		Description: "GB200 NVL72 compute tray: 4x B200 + 2x Grace, NVLink 5 (18x 50 GB/s per GPU) into the rack's NVSwitch trays; " +
			"18 trays = one 72-GPU NVLink domain; 4x 400 Gb/s ConnectX-7",
		NVLink:           &NVLinkSpec{Generation: 5, LinkGBps: 50, Fabric: FabricRack, SHARP: true},
		NVLinkDomainSize: 18,
		PCIeSwitches:     []PCIeSwitchSpec{{ID: "c2c0", NUMA: 0}, {ID: "c2c1", NUMA: 1}},
		NUMANodes:        twoSockets(72, 480*1024),
		HostMemoryMiB:    960 * 1024,
	}
	for i := 0; i < 4; i++ {
		numa := i / 2
		m.GPUs = append(m.GPUs, GPUSpec{
			// NVML memory for a GB200 B200 is approximate (186 GB HBM3e usable).
			Index: i, Model: "NVIDIA GB200", MemoryMiB: 189471, ComputeCapability: "10.0",
			PCIBusID: fmt.Sprintf("000%d:01:00.0", 8+i), NUMA: numa, PCIeSwitch: fmt.Sprintf("c2c%d", numa), PCIeGen: 5, PCIeWidth: 16,
			NVSwitchLinks: 18,
		})
		m.NICs = append(m.NICs, NICSpec{Name: fmt.Sprintf("mlx5_%d", i), Netdev: fmt.Sprintf("ibp%d", i), RDMA: true, SpeedGbps: 400, NUMA: numa, PCIeSwitch: fmt.Sprintf("c2c%d", numa)})
	}
	return m
}
