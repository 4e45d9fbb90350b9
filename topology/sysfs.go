package topology

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// SysfsInfo is what discovery reads from sysfs: NUMA nodes, NVIDIA GPUs seen on the PCI bus,
// network adapters with their PCI position, and the PCIe switches above them.
type SysfsInfo struct {
	NUMANodes []NUMANodeSpec
	// GPUs are NVIDIA display/3D controllers on the PCI bus (seen even without a driver).
	GPUs []PCIDevice
	// NICs are network interfaces backed by a PCI device (virtual ones are skipped), plus
	// RDMA devices without a network interface.
	NICs []NICSpec
	// Switches are the PCIe switches (by upstream port bus id) above any GPU or NIC.
	Switches []PCIeSwitchSpec
	// Notes are one-line remarks about what could not be read.
	Notes []string
}

// PCIDevice is one PCI function.
type PCIDevice struct {
	BusID  string // "0000:18:00.0"
	Vendor string // "0x10de"
	Class  string // "0x030200"
	NUMA   int
	// Switch is the bus id of the upstream port of the topmost PCIe switch above the
	// device, or "" if it sits directly on a root port.
	Switch string
	// LinkGen and LinkWidth are the device's maximum PCIe link (0 when unknown).
	LinkGen, LinkWidth int
}

var busIDRE = regexp.MustCompile(`^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$`)

// ReadSysfs reads NUMA, PCI and network topology from a sysfs tree rooted at root ("/sys"
// on a live machine; a recorded tree under testdata in tests). rdma lists RDMA devices per
// PCI function; nil means read <root>/bus/pci/devices/<bdf>/infiniband. It fails only if the
// tree has no CPU information at all.
func ReadSysfs(root string, rdma RDMA) (*SysfsInfo, error) {
	if rdma == nil {
		rdma = SysfsRDMA{Root: root}
	}
	info := &SysfsInfo{}
	nodes, err := readNUMA(root)
	if err != nil {
		return nil, err
	}
	info.NUMANodes = nodes
	numaOK := map[int]bool{}
	for _, n := range nodes {
		numaOK[n.ID] = true
	}
	fixNUMA := func(n int) int {
		if n < 0 || !numaOK[n] {
			return nodes[0].ID
		}
		return n
	}

	switches := map[string]int{} // switch -> NUMA
	pciDir := filepath.Join(root, "bus", "pci", "devices")
	entries, err := os.ReadDir(pciDir)
	if err != nil {
		info.Notes = append(info.Notes, fmt.Sprintf("PCI: cannot list %s: %v", pciDir, err))
	}
	for _, e := range entries {
		dev, ok := readPCIDevice(root, e.Name())
		if !ok {
			continue
		}
		dev.NUMA = fixNUMA(dev.NUMA)
		if dev.Vendor == "0x10de" && (strings.HasPrefix(dev.Class, "0x0300") || strings.HasPrefix(dev.Class, "0x0302")) {
			info.GPUs = append(info.GPUs, dev)
			if dev.Switch != "" {
				switches[dev.Switch] = dev.NUMA
			}
		}
	}
	sort.Slice(info.GPUs, func(i, j int) bool { return info.GPUs[i].BusID < info.GPUs[j].BusID })

	rdmaSeen := map[string]bool{}
	netDir := filepath.Join(root, "class", "net")
	nets, err := os.ReadDir(netDir)
	if err != nil {
		info.Notes = append(info.Notes, fmt.Sprintf("network: cannot list %s: %v", netDir, err))
	}
	for _, e := range nets {
		name := e.Name()
		devLink := filepath.Join(netDir, name, "device")
		target, err := filepath.EvalSymlinks(devLink)
		if err != nil {
			continue // virtual interface (lo, bridges, veth, docker0, ...)
		}
		bdf := lastBusID(target)
		nic := NICSpec{Name: name, Netdev: name}
		if bdf != "" {
			nic.PCIBusID = bdf
			if dev, ok := readPCIDevice(root, bdf); ok {
				nic.NUMA = fixNUMA(dev.NUMA)
				nic.PCIeSwitch = dev.Switch
			}
			if devs := rdma.DevicesForPCI(bdf); len(devs) > 0 {
				sort.Strings(devs)
				nic.RDMA = true
				nic.Name = devs[0]
				for _, d := range devs {
					rdmaSeen[d] = true
				}
			}
		} else {
			nic.NUMA = nodes[0].ID
		}
		speed, ok := readInt(filepath.Join(netDir, name, "speed"))
		if !ok || speed <= 0 || speed > maxNICGbps*1000 { // unknown, or a driver's nonsense
			if r := rdmaRate(root, nic.Name); nic.RDMA && r > 0 && r <= maxNICGbps {
				speed = int(r * 1000)
			} else {
				info.Notes = append(info.Notes, fmt.Sprintf("NIC %s: link speed unknown (down or virtual function); assumed 1 Gb/s", name))
				speed = 1000
			}
		}
		nic.SpeedGbps = float64(speed) / 1000
		info.NICs = append(info.NICs, nic)
	}
	// RDMA devices without a network interface (InfiniBand without IPoIB).
	for _, d := range rdma.Devices() {
		if rdmaSeen[d] {
			continue
		}
		nic := NICSpec{Name: d, RDMA: true, NUMA: nodes[0].ID, SpeedGbps: rdmaRate(root, d)}
		if target, err := filepath.EvalSymlinks(filepath.Join(root, "class", "infiniband", d, "device")); err == nil && lastBusID(target) != "" {
			nic.PCIBusID = lastBusID(target)
			if dev, ok := readPCIDevice(root, nic.PCIBusID); ok {
				nic.NUMA = fixNUMA(dev.NUMA)
				nic.PCIeSwitch = dev.Switch
			}
		}
		if nic.SpeedGbps <= 0 || nic.SpeedGbps > maxNICGbps {
			nic.SpeedGbps = 1
			info.Notes = append(info.Notes, fmt.Sprintf("RDMA device %s: rate unknown; assumed 1 Gb/s", d))
		}
		info.NICs = append(info.NICs, nic)
	}
	sort.Slice(info.NICs, func(i, j int) bool { return info.NICs[i].Name < info.NICs[j].Name })
	// Keep only switches that hold a GPU; a NIC's switch is recorded only if shared with a GPU.
	for i := range info.NICs {
		if _, ok := switches[info.NICs[i].PCIeSwitch]; !ok {
			info.NICs[i].PCIeSwitch = ""
		}
	}
	for _, id := range sortedKeys(switches) {
		info.Switches = append(info.Switches, PCIeSwitchSpec{ID: id, NUMA: switches[id]})
	}
	return info, nil
}

// lastBusID returns the last PCI bus id on a sysfs device path (a virtio NIC's device is
// ".../0000:00:03.0/virtio2": its PCI function is 0000:00:03.0), or "".
func lastBusID(path string) string {
	parts := strings.Split(filepath.ToSlash(path), "/")
	for i := len(parts) - 1; i >= 0; i-- {
		if busIDRE.MatchString(parts[i]) {
			return parts[i]
		}
	}
	return ""
}

// readNUMA reads <root>/devices/system/node/node*/cpulist (and meminfo); without NUMA
// support in the kernel it makes one node of <root>/devices/system/cpu/online.
func readNUMA(root string) ([]NUMANodeSpec, error) {
	nodeDir := filepath.Join(root, "devices", "system", "node")
	entries, _ := os.ReadDir(nodeDir)
	var nodes []NUMANodeSpec
	for _, e := range entries {
		id, err := strconv.Atoi(strings.TrimPrefix(e.Name(), "node"))
		if !strings.HasPrefix(e.Name(), "node") || err != nil {
			continue
		}
		list, err := os.ReadFile(filepath.Join(nodeDir, e.Name(), "cpulist"))
		if err != nil {
			continue
		}
		cpus, err := countCPUList(strings.TrimSpace(string(list)))
		if err != nil {
			return nil, fmt.Errorf("topology: %s: %w", filepath.Join(nodeDir, e.Name(), "cpulist"), err)
		}
		n := NUMANodeSpec{ID: id, CPUs: cpus, CPUList: strings.TrimSpace(string(list))}
		n.MemoryMiB = readNodeMemMiB(filepath.Join(nodeDir, e.Name(), "meminfo"))
		nodes = append(nodes, n)
	}
	if len(nodes) == 0 {
		online := filepath.Join(root, "devices", "system", "cpu", "online")
		list, err := os.ReadFile(online)
		if err != nil {
			return nil, fmt.Errorf("topology: no NUMA nodes under %s and no %s: %w", nodeDir, online, err)
		}
		cpus, err := countCPUList(strings.TrimSpace(string(list)))
		if err != nil {
			return nil, fmt.Errorf("topology: %s: %w", online, err)
		}
		nodes = append(nodes, NUMANodeSpec{ID: 0, CPUs: cpus, CPUList: strings.TrimSpace(string(list))})
	}
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].ID < nodes[j].ID })
	return nodes, nil
}

// countCPUList counts the CPUs of a kernel cpulist such as "0-3,8-11,16".
func countCPUList(s string) (int, error) {
	if s == "" {
		return 0, nil
	}
	n := 0
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return 0, fmt.Errorf("bad cpulist %q", s)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return 0, fmt.Errorf("bad cpulist %q", s)
			}
		}
		n += b - a + 1
	}
	return n, nil
}

func readNodeMemMiB(path string) int64 {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		// "Node 0 MemTotal:       65856424 kB"
		if i := strings.Index(line, "MemTotal:"); i >= 0 {
			f := strings.Fields(line[i+len("MemTotal:"):])
			if len(f) > 0 {
				kb, _ := strconv.ParseInt(f[0], 10, 64)
				return kb / 1024
			}
		}
	}
	return 0
}

func readInt(path string) (int, bool) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(data)))
	return v, err == nil
}

func readString(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(data))
}

// readPCIDevice reads one PCI function and finds the PCIe switch above it from its real
// path: /sys/devices/pci0000:00/<root port>/<switch upstream>/<switch downstream>/<device>.
func readPCIDevice(root, bdf string) (PCIDevice, bool) {
	link := filepath.Join(root, "bus", "pci", "devices", bdf)
	target, err := filepath.EvalSymlinks(link)
	if err != nil {
		return PCIDevice{}, false
	}
	dev := PCIDevice{
		BusID:  bdf,
		Vendor: readString(filepath.Join(target, "vendor")),
		Class:  readString(filepath.Join(target, "class")),
		NUMA:   -1,
	}
	if n, ok := readInt(filepath.Join(target, "numa_node")); ok {
		dev.NUMA = n
	}
	dev.LinkGen = pcieGenOf(readString(filepath.Join(target, "max_link_speed")))
	dev.LinkWidth, _ = readInt(filepath.Join(target, "max_link_width"))
	// Bus ids on the path from the host bridge down to the device.
	var chain []string
	for _, part := range strings.Split(filepath.ToSlash(target), "/") {
		if busIDRE.MatchString(part) {
			chain = append(chain, part)
		}
	}
	// chain = [root port, switch upstream, switch downstream, ..., device]. A device with at
	// least two bridges between it and the root port sits under a switch.
	if len(chain) >= 4 {
		dev.Switch = chain[1]
	}
	return dev, true
}

// leadingNumber reads the number a sysfs value starts with ("16.0 GT/s PCIe",
// "400 Gb/sec (4X NDR)"); 0 when there is none or it is not a finite, positive number.
func leadingNumber(s string) float64 {
	f := strings.Fields(s)
	if len(f) == 0 {
		return 0
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil || !(v > 0 && v < math.MaxFloat64) {
		return 0
	}
	return v
}

// pcieGenOf maps sysfs's "16.0 GT/s PCIe" to the PCIe generation (4); 0 when unknown.
func pcieGenOf(s string) int {
	v := leadingNumber(s)
	if v == 0 {
		return 0
	}
	for gen, rate := range []float64{2.5, 5, 8, 16, 32, 64, 128} {
		if v <= rate+0.01 {
			return gen + 1
		}
	}
	return 7
}

// rdmaRate reads an RDMA device's port 1 rate ("400 Gb/sec (4X NDR)") in Gb/s.
func rdmaRate(root, dev string) float64 {
	return leadingNumber(readString(filepath.Join(root, "class", "infiniband", dev, "ports", "1", "rate")))
}

// RDMA lists RDMA devices. SystemRDMA uses github.com/Mellanox/rdmamap on the live /sys;
// SysfsRDMA reads a sysfs tree at any root (recorded fixtures).
type RDMA interface {
	// Devices lists all RDMA devices ("mlx5_0", ...).
	Devices() []string
	// DevicesForPCI lists the RDMA devices of a PCI function ("0000:05:00.0").
	DevicesForPCI(bdf string) []string
}

// SysfsRDMA reads RDMA devices from a sysfs tree rooted at Root.
type SysfsRDMA struct{ Root string }

// Devices implements RDMA.
func (s SysfsRDMA) Devices() []string { return dirNames(filepath.Join(s.Root, "class", "infiniband")) }

// DevicesForPCI implements RDMA.
func (s SysfsRDMA) DevicesForPCI(bdf string) []string {
	return dirNames(filepath.Join(s.Root, "bus", "pci", "devices", bdf, "infiniband"))
}

func dirNames(dir string) []string {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	sort.Strings(out)
	return out
}
