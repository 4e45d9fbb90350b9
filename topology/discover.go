package topology

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"

	"go.uber.org/zap"
)

// DiscoverOptions configures Discover. Its zero value reads the live machine: empty or nil
// fields take DefaultDiscoverOptions' values (RDMA from SysRoot when it is not /sys).
type DiscoverOptions struct {
	// SysRoot is the sysfs root ("/sys"); tests point it at a recorded tree.
	SysRoot string
	// NVML is the GPU library; SystemNVML() by default. FakeNVML serves a declared machine.
	NVML NVML
	// RDMA lists RDMA devices; SystemRDMA() (rdmamap) for "/sys", else read from SysRoot.
	RDMA RDMA
	// Hostname names the machine (a valid machine name: it names directories); empty means
	// os.Hostname().
	Hostname string
	// Logger receives one debug line per step; zap.NewNop() by default.
	Logger *zap.Logger
}

// DefaultDiscoverOptions reads the live machine: /sys, the system NVML and rdmamap.
func DefaultDiscoverOptions() DiscoverOptions {
	return DiscoverOptions{SysRoot: "/sys", NVML: SystemNVML(), RDMA: SystemRDMA(), Logger: zap.NewNop()}
}

// DiscoveryReport says what discovery found and what it could not read, in lines a person
// can act on.
type DiscoveryReport struct {
	Hostname string `json:"hostname"`
	// NVML is one line on the GPU library: the driver and GPU count, or why it is absent
	// ("built without NVML", "libnvidia-ml.so.1 not found ...").
	NVML string `json:"nvml"`
	// NVMLAvailable says NVML initialised.
	NVMLAvailable bool   `json:"nvmlAvailable"`
	DriverVersion string `json:"driverVersion,omitempty"`
	// GPUs is the number reported by NVML; GPUsOnPCI the NVIDIA GPUs seen on the PCI bus.
	GPUs      int `json:"gpus"`
	GPUsOnPCI int `json:"gpusOnPci"`
	CPUs      int `json:"cpus"`
	NUMANodes int `json:"numaNodes"`
	NICs      int `json:"nics"`
	RDMANICs  int `json:"rdmaNics"`
	// Notes are further one-line remarks (unknown link speeds, links dropped, ...).
	Notes []string `json:"notes,omitempty"`
}

// Lines renders the report as readable lines.
func (r *DiscoveryReport) Lines() []string {
	out := []string{
		fmt.Sprintf("host %s: %d CPU(s) in %d NUMA node(s), %d NIC(s) (%d RDMA)", r.Hostname, r.CPUs, r.NUMANodes, r.NICs, r.RDMANICs),
		r.NVML,
	}
	if !r.NVMLAvailable && r.GPUsOnPCI > 0 {
		out = append(out, fmt.Sprintf("%d NVIDIA GPU(s) are on the PCI bus but cannot be used without NVML", r.GPUsOnPCI))
	}
	return append(out, r.Notes...)
}

// Discover reads the machine it runs on: GPUs, NVLinks and MIG through NVML; NUMA nodes,
// PCIe switches and NICs through sysfs; RDMA devices through rdmamap. Without NVML (no
// driver, or a build without the nvml tag) the report says so in one line and the machine
// has no GPUs but its CPU/NUMA/NIC part. It returns an error only if ctx ends or sysfs has
// no CPU information; it never pretends a GPU exists.
func Discover(ctx context.Context, opts DiscoverOptions) (*Machine, *DiscoveryReport, error) {
	c, rep, err := DiscoverCluster(ctx, opts)
	if err != nil {
		return nil, rep, err
	}
	return c.Machines[0], rep, nil
}

// DiscoverCluster is Discover wrapped in a one-machine cluster named after the host, for
// printing and for computing islands and link tiers.
func DiscoverCluster(ctx context.Context, opts DiscoverOptions) (*Cluster, *DiscoveryReport, error) {
	spec, rep, err := DiscoverSpec(ctx, opts)
	if err != nil {
		return nil, rep, err
	}
	c, err := BuildMachines([]MachineInstance{{Name: rep.Hostname, Spec: spec, Discovered: true}}, NetworkSpec{})
	if err != nil {
		return nil, rep, err
	}
	c.Name = rep.Hostname
	return c, rep, nil
}

// DiscoverSpec is Discover's first half: it returns the discovered machine as a MachineSpec
// (what an agent sends to the head), always valid.
func DiscoverSpec(ctx context.Context, opts DiscoverOptions) (*MachineSpec, *DiscoveryReport, error) {
	if opts.SysRoot == "" {
		opts.SysRoot = "/sys"
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if opts.NVML == nil {
		opts.NVML = SystemNVML()
	}
	if opts.RDMA == nil {
		if opts.SysRoot == "/sys" {
			opts.RDMA = SystemRDMA()
		} else {
			opts.RDMA = SysfsRDMA{Root: opts.SysRoot}
		}
	}
	log := opts.Logger.Named("topology")
	rep := &DiscoveryReport{Hostname: opts.Hostname}
	if rep.Hostname == "" {
		h, err := os.Hostname()
		if err != nil {
			h = "localhost"
		}
		rep.Hostname = h
	}
	if err := checkName(rep.Hostname); err != nil {
		return nil, rep, fmt.Errorf("topology: discover: the host's %v; give DiscoverOptions.Hostname: %w", err, ErrInvalidSpec)
	}
	if err := ctx.Err(); err != nil {
		return nil, rep, fmt.Errorf("topology: discover: %w", err)
	}

	sys, err := ReadSysfs(opts.SysRoot, opts.RDMA)
	if err != nil {
		return nil, rep, fmt.Errorf("topology: discover %s: %w", opts.SysRoot, err)
	}
	log.Debug("sysfs read", zap.Int("numa", len(sys.NUMANodes)), zap.Int("gpusOnPci", len(sys.GPUs)), zap.Int("nics", len(sys.NICs)))
	rep.Notes = append(rep.Notes, sys.Notes...)
	rep.GPUsOnPCI = len(sys.GPUs)

	spec := &MachineSpec{Name: rep.Hostname, Description: "discovered", NUMANodes: sys.NUMANodes, NICs: sys.NICs}
	for _, n := range sys.NUMANodes {
		rep.CPUs += n.CPUs
		spec.HostMemoryMiB += n.MemoryMiB
	}
	rep.NUMANodes = len(sys.NUMANodes)
	rep.NICs = len(sys.NICs)
	for _, n := range sys.NICs {
		if n.RDMA {
			rep.RDMANICs++
		}
	}

	gpus, driver, err := readNVML(ctx, opts.NVML)
	switch {
	case err != nil && ctx.Err() != nil:
		return nil, rep, fmt.Errorf("topology: discover: NVML: %w", ctx.Err())
	case err != nil:
		msg := strings.TrimPrefix(err.Error(), "topology: ")
		msg = strings.TrimSuffix(strings.TrimPrefix(msg, ErrNoNVML.Error()+": "), ": "+ErrNoNVML.Error())
		rep.NVML = "NVML: not available: " + msg
		log.Debug("nvml unavailable", zap.Error(err))
	default:
		rep.NVMLAvailable = true
		rep.DriverVersion = driver
		rep.NVML = fmt.Sprintf("NVML: driver %s, %d GPU(s)", driver, len(gpus))
	}
	rep.GPUs = len(gpus)
	addGPUs(spec, gpus, sys, rep)
	if err := spec.Validate(); err != nil {
		// Never fail on what the hardware says: drop the parts that contradict themselves.
		rep.Notes = append(rep.Notes, "discovered NVLink/MIG data was inconsistent and was dropped: "+err.Error())
		spec.NVLink = nil
		for i := range spec.GPUs {
			spec.GPUs[i].NVLinks, spec.GPUs[i].NVSwitchLinks, spec.GPUs[i].MIG = nil, 0, nil
		}
		if err := spec.Validate(); err != nil {
			return nil, rep, fmt.Errorf("topology: discover: %w", err)
		}
	}
	return spec, rep, nil
}

// nvmlGPU is what NVML said about one GPU.
type nvmlGPU struct {
	name, uuid, busID string
	memMiB            int64
	major, minor      int
	links             []NVLinkRemote
	mig               bool
	instances         []MIGInstanceSpec
	err               error
}

// readNVML queries NVML in a goroutine so that a hung driver cannot hang discovery past
// ctx's deadline (the goroutine then finishes on its own).
func readNVML(ctx context.Context, lib NVML) ([]nvmlGPU, string, error) {
	type result struct {
		gpus   []nvmlGPU
		driver string
		err    error
	}
	ch := make(chan result, 1)
	go func() {
		var r result
		defer func() {
			if p := recover(); p != nil {
				r = result{err: fmt.Errorf("topology: NVML panicked: %v: %w", p, ErrNoNVML)}
			}
			ch <- r
		}()
		r.gpus, r.driver, r.err = queryNVML(lib)
	}()
	select {
	case r := <-ch:
		return r.gpus, r.driver, r.err
	case <-ctx.Done():
		return nil, "", ctx.Err()
	}
}

func queryNVML(lib NVML) ([]nvmlGPU, string, error) {
	if err := lib.Init(); err != nil {
		if !errors.Is(err, ErrNoNVML) {
			err = fmt.Errorf("%w: %v", ErrNoNVML, err)
		}
		return nil, "", err
	}
	defer lib.Shutdown()
	driver, _ := lib.DriverVersion()
	n, err := lib.DeviceCount()
	if err != nil {
		return nil, driver, fmt.Errorf("topology: NVML device count: %w", err)
	}
	gpus := make([]nvmlGPU, 0, n)
	for i := 0; i < n; i++ {
		var g nvmlGPU
		d, err := lib.Device(i)
		if err != nil {
			g.err = err
			gpus = append(gpus, g)
			continue
		}
		g.name, g.err = d.Name()
		if g.err == nil {
			g.uuid, g.err = d.UUID()
		}
		if g.err == nil {
			g.memMiB, g.err = d.MemoryMiB()
		}
		if g.err == nil {
			g.busID, g.err = d.PCIBusID()
		}
		if g.err == nil {
			g.major, g.minor, g.err = d.ComputeCapability()
		}
		if g.err == nil {
			g.links, _ = d.NVLinks()
			g.mig, g.instances, _ = d.MIG()
		}
		gpus = append(gpus, g)
	}
	return gpus, driver, nil
}

// addGPUs turns NVML's answers into GPUSpecs, with NUMA and PCIe switch from sysfs, and
// NVLinks grouped by peer (a remote bus id that is no GPU's is an NVSwitch).
func addGPUs(spec *MachineSpec, gpus []nvmlGPU, sys *SysfsInfo, rep *DiscoveryReport) {
	pci := map[string]PCIDevice{}
	for _, d := range sys.GPUs {
		pci[d.BusID] = d
	}
	byBus := map[string]int{}
	var ok []nvmlGPU
	for i, g := range gpus {
		if g.err != nil {
			rep.Notes = append(rep.Notes, fmt.Sprintf("GPU %d skipped: %v", i, g.err))
			continue
		}
		byBus[normalizeBusID(g.busID)] = len(ok)
		ok = append(ok, g)
	}
	switches := map[string]bool{}
	for _, s := range sys.Switches {
		switches[s.ID] = true
	}
	anySwitch, anyDirect := false, false
	for i, g := range ok {
		bus := normalizeBusID(g.busID)
		gs := GPUSpec{
			Index: i, UUID: g.uuid, Model: g.name, MemoryMiB: g.memMiB,
			ComputeCapability: fmt.Sprintf("%d.%d", g.major, g.minor), PCIBusID: bus,
		}
		if d, found := pci[bus]; found {
			gs.NUMA, gs.PCIeGen, gs.PCIeWidth = d.NUMA, d.LinkGen, d.LinkWidth
			if switches[d.Switch] {
				gs.PCIeSwitch = d.Switch
			}
		} else if len(spec.NUMANodes) > 0 {
			gs.NUMA = spec.NUMANodes[0].ID
			rep.Notes = append(rep.Notes, fmt.Sprintf("GPU %d (%s) not found in sysfs; NUMA node assumed %d", i, bus, gs.NUMA))
		}
		peers := map[int]int{}
		lost := 0
		for _, l := range g.links {
			remote := normalizeBusID(l.RemoteBusID)
			p, isGPU := byBus[remote]
			_, onPCI := pci[remote]
			switch {
			case isGPU && !l.RemoteIsSwitch && p != i:
				peers[p]++
			case onPCI && !l.RemoteIsSwitch:
				lost++ // a GPU NVML could not report: the link leads nowhere usable
			default:
				gs.NVSwitchLinks++
			}
		}
		if lost > 0 {
			rep.Notes = append(rep.Notes, fmt.Sprintf("GPU %d: %d NVLink(s) to a GPU NVML could not report were ignored", i, lost))
		}
		for _, p := range sortedInts(peers) {
			gs.NVLinks = append(gs.NVLinks, NVLinkPeer{Peer: p, Count: peers[p]})
		}
		anySwitch = anySwitch || gs.NVSwitchLinks > 0
		anyDirect = anyDirect || len(gs.NVLinks) > 0
		if g.mig {
			gs.MIG = &MIGSpec{Enabled: true, Instances: g.instances}
		}
		spec.GPUs = append(spec.GPUs, gs)
	}
	symmetrize(spec, rep)
	if anySwitch || anyDirect {
		gen, gbps := nvlinkGen(ok[0].major, ok[0].minor)
		if gen == 0 {
			gen, gbps = 1, 20
		}
		fabric := FabricDirect
		if anySwitch {
			fabric = FabricNVSwitch
		}
		spec.NVLink = &NVLinkSpec{Generation: gen, LinkGBps: gbps, Fabric: fabric, SHARP: anySwitch && ok[0].major >= 9}
	}
	for _, s := range sys.Switches {
		spec.PCIeSwitches = append(spec.PCIeSwitches, s)
	}
}

// symmetrize makes direct link counts agree on both ends (taking the smaller), noting any
// disagreement; NVML should never disagree, but a spec must be consistent.
func symmetrize(spec *MachineSpec, rep *DiscoveryReport) {
	count := func(i, j int) int {
		for _, l := range spec.GPUs[i].NVLinks {
			if l.Peer == j {
				return l.Count
			}
		}
		return 0
	}
	for i := range spec.GPUs {
		var keep []NVLinkPeer
		for _, l := range spec.GPUs[i].NVLinks {
			back := count(l.Peer, i)
			if back != l.Count {
				rep.Notes = append(rep.Notes, fmt.Sprintf("GPU %d reports %d NVLink(s) to GPU %d, which reports %d; using %d", i, l.Count, l.Peer, back, min(back, l.Count)))
			}
			if c := min(back, l.Count); c > 0 {
				keep = append(keep, NVLinkPeer{Peer: l.Peer, Count: c})
			}
		}
		spec.GPUs[i].NVLinks = keep
	}
}

func sortedInts(m map[int]int) []int {
	out := make([]int, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Ints(out)
	return out
}
