package topology

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// Fabric kinds for NVLinkSpec.Fabric.
const (
	// FabricNone: the machine has no NVLink (PCIe only).
	FabricNone = "none"
	// FabricDirect: GPUs are joined only by point-to-point NVLinks (bridges or a mesh),
	// listed per GPU in GPUSpec.NVLinks.
	FabricDirect = "direct"
	// FabricNVSwitch: every GPU with NVSwitchLinks > 0 reaches every other such GPU of the
	// machine through NVSwitch chips inside the machine (DGX/HGX).
	FabricNVSwitch = "nvswitch"
	// FabricRack: the NVSwitch chips sit outside the machine, in the rack, and join the GPUs
	// of every machine of that rack (GB200 NVL72: 18 trays of 4 GPUs).
	FabricRack = "rack"
)

// MachineSpec declares one machine type: its GPUs, their links, PCIe switches, NUMA nodes
// and NICs. Built-in specs come from BuiltinMachine; files are read by ParseSpecFile;
// Discover produces one for the machine it runs on. A MachineSpec is read-only once
// handed to Build.
type MachineSpec struct {
	// Name is the machine type, e.g. "dgx-h100". It names machines ("dgx-h100-3"), which
	// name directories, so it is 1..128 bytes of A-Z a-z 0-9 . _ - not starting with '.' or
	// '-'; empty in a file means the machineTypes key, or "machine" for an inline machine.
	Name string `json:"name"`
	// Description is free text shown by the CLI.
	Description string `json:"description,omitempty"`
	// GPUs are listed in index order (GPU i has index i).
	GPUs []GPUSpec `json:"gpus"`
	// NVLink describes the NVLink generation and fabric; nil means no NVLink.
	NVLink *NVLinkSpec `json:"nvlink,omitempty"`
	// PCIeSwitches lists the PCIe switches GPUs and NICs may sit under.
	PCIeSwitches []PCIeSwitchSpec `json:"pcieSwitches,omitempty"`
	// NUMANodes lists the NUMA nodes (CPU sockets or sub-socket domains).
	NUMANodes []NUMANodeSpec `json:"numaNodes,omitempty"`
	// NICs lists the network adapters.
	NICs []NICSpec `json:"nics,omitempty"`
	// NVLinkDomainSize is, for FabricRack, the most machines one rack-level NVLink domain
	// holds (18 for GB200 NVL72). A shorthand or group without a count uses it as the count.
	NVLinkDomainSize int `json:"nvlinkDomainSize,omitempty"`
	// HostMemoryMiB is the machine's main memory.
	HostMemoryMiB int64 `json:"hostMemoryMiB,omitempty"`
}

// GPUSpec declares one GPU of a machine.
type GPUSpec struct {
	// Index is the GPU's position in the machine (CUDA/NVML index). It may be omitted in
	// files; if given it must equal the GPU's position in the list.
	Index int `json:"index"`
	// UUID is NVML's UUID ("GPU-..."); for declared machines Build makes up a
	// deterministic one starting with "GPU-sim-".
	UUID string `json:"uuid,omitempty"`
	// Model is the marketing name, e.g. "NVIDIA H100 80GB HBM3".
	Model string `json:"model"`
	// MemoryMiB is the GPU memory as NVML reports it.
	MemoryMiB int64 `json:"memoryMiB"`
	// ComputeCapability is CUDA's "major.minor", e.g. "9.0".
	ComputeCapability string `json:"computeCapability,omitempty"`
	// PCIBusID is "domain:bus:device.function", e.g. "0000:18:00.0".
	PCIBusID string `json:"pciBusId,omitempty"`
	// NUMA is the NUMA node the GPU's PCIe root complex belongs to.
	NUMA int `json:"numa"`
	// PCIeSwitch is the id of the PCIe switch (in MachineSpec.PCIeSwitches) the GPU sits
	// under; empty means directly on the root complex.
	PCIeSwitch string `json:"pcieSwitch,omitempty"`
	// PCIeGen and PCIeWidth give the GPU's PCIe link (defaults: gen 4, x16).
	PCIeGen   int `json:"pcieGen,omitempty"`
	PCIeWidth int `json:"pcieWidth,omitempty"`
	// NVLinks lists direct NVLinks to peer GPUs of the same machine, with the number of
	// links to each. Every link must be listed on both ends with the same count.
	NVLinks []NVLinkPeer `json:"nvlinks,omitempty"`
	// NVSwitchLinks is the number of NVLinks from this GPU into the NVSwitch fabric.
	NVSwitchLinks int `json:"nvswitchLinks,omitempty"`
	// MIG is the GPU's MIG configuration; nil or disabled means a whole GPU.
	MIG *MIGSpec `json:"mig,omitempty"`
}

// NVLinkPeer is a bundle of direct NVLinks from one GPU to a peer GPU.
type NVLinkPeer struct {
	// Peer is the peer GPU's index in the same machine.
	Peer int `json:"peer"`
	// Count is the number of links in the bundle.
	Count int `json:"count"`
}

// NVLinkSpec gives a machine's NVLink generation, per-link speed and fabric.
type NVLinkSpec struct {
	// Generation is the NVLink generation (3 for A100, 4 for H100/H200, 5 for B200).
	Generation int `json:"generation"`
	// LinkGBps is the bandwidth of one link in one direction, GB/s (25 for NVLink 3 and 4,
	// 50 for NVLink 5).
	LinkGBps float64 `json:"linkGBps"`
	// Fabric is FabricDirect, FabricNVSwitch or FabricRack.
	Fabric string `json:"fabric"`
	// SHARP says the NVSwitches reduce in the switch (NVLink SHARP, "NVLS", NVSwitch gen 3+).
	SHARP bool `json:"sharp,omitempty"`
}

// PCIeSwitchSpec declares a PCIe switch.
type PCIeSwitchSpec struct {
	// ID names the switch inside the machine, e.g. "sw0" or a PCI bus id.
	ID string `json:"id"`
	// NUMA is the NUMA node of the root complex the switch hangs off.
	NUMA int `json:"numa"`
}

// NUMANodeSpec declares a NUMA node.
type NUMANodeSpec struct {
	// ID is the kernel's node number.
	ID int `json:"id"`
	// CPUs is the number of logical CPUs in the node.
	CPUs int `json:"cpus"`
	// CPUList is the kernel's cpulist ("0-55,112-167"); optional.
	CPUList string `json:"cpuList,omitempty"`
	// MemoryMiB is the node's memory; optional.
	MemoryMiB int64 `json:"memoryMiB,omitempty"`
}

// NICSpec declares a network adapter.
type NICSpec struct {
	// Name is the RDMA device ("mlx5_0") or the netdev ("eth0").
	Name string `json:"name"`
	// Netdev is the kernel network interface, if known.
	Netdev string `json:"netdev,omitempty"`
	// RDMA says the NIC does RDMA (InfiniBand or RoCE), so GPUDirect RDMA is possible.
	RDMA bool `json:"rdma"`
	// SpeedGbps is the port speed in Gb/s.
	SpeedGbps float64 `json:"speedGbps"`
	// NUMA is the NIC's NUMA node.
	NUMA int `json:"numa"`
	// PCIeSwitch is the PCIe switch the NIC sits under; GPUs under the same switch have a
	// GPUDirect RDMA path through it.
	PCIeSwitch string `json:"pcieSwitch,omitempty"`
	// PCIBusID is the NIC's PCI address, if known.
	PCIBusID string `json:"pciBusId,omitempty"`
}

// MIGSpec is a GPU's MIG mode and its GPU instances.
type MIGSpec struct {
	// Enabled is MIG mode. A GPU in MIG mode has no NVLink peer-to-peer: it forms an island
	// of its own.
	Enabled bool `json:"enabled"`
	// Instances are the GPU instances, by profile.
	Instances []MIGInstanceSpec `json:"instances,omitempty"`
}

// MIGInstanceSpec is one MIG GPU instance.
type MIGInstanceSpec struct {
	// Profile is NVIDIA's profile name, "<compute slices>g.<memory GB>gb", e.g. "1g.10gb",
	// "3g.40gb", optionally with "+me".
	Profile string `json:"profile"`
	// UUID is the MIG device UUID ("MIG-..."); made up for declared machines.
	UUID string `json:"uuid,omitempty"`
}

// ClusterSpec declares a cluster: machine types times counts, in racks.
type ClusterSpec struct {
	// Name is free text.
	Name string `json:"name,omitempty"`
	// MachineTypes declares machine types by name (a valid machine type name, equal to the
	// spec's name if it gives one), for use in Machines[i].Type; they shadow built-ins of the
	// same name.
	MachineTypes map[string]*MachineSpec `json:"machineTypes,omitempty"`
	// Machines are groups of identical machines.
	Machines []MachineGroup `json:"machines"`
	// Network describes the leaf/spine network between racks.
	Network NetworkSpec `json:"network,omitempty"`
}

// MachineGroup is Count machines of one type, placed in racks of RackSize.
type MachineGroup struct {
	// Type names a built-in machine or one of ClusterSpec.MachineTypes.
	Type string `json:"type,omitempty"`
	// Machine is an inline machine spec (instead of Type).
	Machine *MachineSpec `json:"machine,omitempty"`
	// Count is the number of machines, at most MaxGPUs; 0 means 1, or NVLinkDomainSize for
	// rack fabrics. A cluster holds at most MaxGPUs GPUs.
	Count int `json:"count,omitempty"`
	// RackSize is machines per rack; 0 means all in one rack (NVLinkDomainSize for rack
	// fabrics). Each group starts a new rack.
	RackSize int `json:"rackSize,omitempty"`
}

// NetworkSpec describes the network between machines: one leaf (top-of-rack) switch per
// rack, and spines above the leaves.
type NetworkSpec struct {
	// Oversubscription is the leaf-to-spine oversubscription ratio, 1..1000 (1 =
	// non-blocking, 2 = 2:1). Zero means 1.
	Oversubscription float64 `json:"oversubscription,omitempty"`
	// LeafLatencyUs and SpineLatencyUs are one-way latencies between machines of the same
	// rack and of different racks, in microseconds, at most 10^6. Zero means the model
	// defaults.
	LeafLatencyUs  float64 `json:"leafLatencyUs,omitempty"`
	SpineLatencyUs float64 `json:"spineLatencyUs,omitempty"`
}

// ParseShorthand parses a cluster shorthand: "dgx-h100" (one machine, or one NVLink domain
// for rack fabrics such as gb200-nvl72), "4xdgx-h100" (four in one rack) or
// "64xdgx-h100/8" (64 in racks of 8). Several groups may be joined with "+":
// "16xdgx-h100/8+8xpcie-l40s-8". Only built-in machine types are known to shorthands. Counts
// and rack sizes are whole numbers in 1..MaxGPUs, and the cluster may hold at most MaxGPUs
// GPUs. Errors name the part and its byte offset and wrap ErrShorthand, ErrUnknownMachine or
// (for a cluster over the bound) ErrInvalidSpec.
func ParseShorthand(s string) (*ClusterSpec, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, fmt.Errorf("topology: shorthand is empty: %w", ErrShorthand)
	}
	spec := &ClusterSpec{Name: s}
	at := 0
	for i, part := range strings.Split(s, "+") {
		g, err := parseShorthandPart(part, at)
		if err != nil {
			return nil, fmt.Errorf("topology: shorthand %.64q: part %d (%.64q): %w", s, i+1, strings.TrimSpace(part), err)
		}
		spec.Machines = append(spec.Machines, g)
		at += len(part) + 1
	}
	var p problems
	spec.validate(&p, spec.resolver())
	if err := p.err(fmt.Sprintf("shorthand %.64q", s), "", nil); err != nil {
		return nil, err
	}
	return spec, nil
}

// parseShorthandPart parses "[COUNTx]TYPE[/RACKSIZE]"; at is the part's byte offset in the
// whole shorthand, for errors.
func parseShorthandPart(part string, at int) (MachineGroup, error) {
	var g MachineGroup
	if strings.TrimSpace(part) == "" {
		return g, fmt.Errorf("is empty, want [COUNTx]TYPE[/RACKSIZE]: %w", ErrShorthand)
	}
	rest := part
	if k := strings.LastIndexByte(rest, '/'); k >= 0 {
		n, err := shorthandNumber("rack size", rest[k+1:], at+k+1)
		if err != nil {
			return g, err
		}
		g.RackSize, rest = n, rest[:k]
	}
	// A count precedes the first 'x' when what comes before it looks like a number; built-in
	// type names start with a letter.
	if k := strings.IndexByte(rest, 'x'); k > 0 {
		if lead := strings.TrimSpace(rest[:k]); lead != "" && strings.IndexByte("0123456789+-.", lead[0]) >= 0 {
			n, err := shorthandNumber("count", rest[:k], at)
			if err != nil {
				return g, err
			}
			g.Count, rest, at = n, rest[k+1:], at+k+1
		}
	}
	g.Type = strings.TrimSpace(rest)
	if err := checkName(g.Type); err != nil {
		return g, fmt.Errorf("machine type at byte %d: %v, want [COUNTx]TYPE[/RACKSIZE]: %w", at, err, ErrShorthand)
	}
	if _, err := BuiltinMachine(g.Type); err != nil {
		return g, err
	}
	return g, nil
}

// shorthandNumber reads a count or rack size: a whole number in 1..MaxGPUs.
func shorthandNumber(what, s string, at int) (int, error) {
	t := strings.TrimSpace(s)
	n, err := strconv.Atoi(t)
	if err != nil || n < 1 || n > MaxGPUs || strings.Trim(t, "0123456789") != "" {
		return 0, fmt.Errorf("%s %.32q at byte %d must be a whole number in 1..%d: %w", what, t, at, MaxGPUs, ErrShorthand)
	}
	return n, nil
}

// sortedKeys returns the keys of m in order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
