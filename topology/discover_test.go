package topology

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
)

const fixture = "testdata/sys-2socket"

func TestReadSysfsFixture(t *testing.T) {
	info, err := ReadSysfs(fixture, nil)
	if err != nil {
		t.Fatal(err)
	}
	wantNUMA := []NUMANodeSpec{
		{ID: 0, CPUs: 8, CPUList: "0-3,8-11", MemoryMiB: 65856424 / 1024},
		{ID: 1, CPUs: 8, CPUList: "4-7,12-15", MemoryMiB: 65998848 / 1024},
	}
	if !reflect.DeepEqual(info.NUMANodes, wantNUMA) {
		t.Errorf("NUMA = %+v", info.NUMANodes)
	}
	wantGPUs := []PCIDevice{
		{BusID: "0000:03:00.0", Vendor: "0x10de", Class: "0x030200", NUMA: 0, Switch: "0000:01:00.0", LinkGen: 4, LinkWidth: 16},
		{BusID: "0000:04:00.0", Vendor: "0x10de", Class: "0x030200", NUMA: 0, Switch: "0000:01:00.0", LinkGen: 4, LinkWidth: 16},
		{BusID: "0000:81:00.0", Vendor: "0x10de", Class: "0x030000", NUMA: 1, LinkGen: 5, LinkWidth: 16},
	}
	if !reflect.DeepEqual(info.GPUs, wantGPUs) {
		t.Errorf("GPUs = %+v", info.GPUs)
	}
	wantNICs := []NICSpec{
		{Name: "enp130s0", Netdev: "enp130s0", SpeedGbps: 100, NUMA: 1, PCIBusID: "0000:82:00.0"},
		{Name: "mlx5_0", Netdev: "ib0", RDMA: true, SpeedGbps: 400, NUMA: 0, PCIeSwitch: "0000:01:00.0", PCIBusID: "0000:05:00.0"},
		// numa_node -1 falls back to node 0; no netdev: found through class/infiniband.
		{Name: "mlx5_1", RDMA: true, SpeedGbps: 200, NUMA: 0, PCIBusID: "0000:83:00.0"},
	}
	if !reflect.DeepEqual(info.NICs, wantNICs) {
		t.Errorf("NICs =\n%+v\nwant\n%+v", info.NICs, wantNICs)
	}
	if want := []PCIeSwitchSpec{{ID: "0000:01:00.0", NUMA: 0}}; !reflect.DeepEqual(info.Switches, want) {
		t.Errorf("switches = %+v", info.Switches)
	}
}

func TestReadSysfsNoNUMA(t *testing.T) {
	root := t.TempDir()
	cpu := filepath.Join(root, "devices", "system", "cpu")
	if err := os.MkdirAll(cpu, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cpu, "online"), []byte("0-5\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	info, err := ReadSysfs(root, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(info.NUMANodes) != 1 || info.NUMANodes[0].CPUs != 6 || len(info.GPUs) != 0 || len(info.Notes) == 0 {
		t.Fatalf("info = %+v", info)
	}
	// Nothing at all: a clear error.
	_, err = ReadSysfs(filepath.Join(root, "missing"), nil)
	if err == nil || !strings.Contains(err.Error(), "no NUMA nodes") {
		t.Fatalf("err = %v", err)
	}
	// A corrupt cpulist is reported with its path.
	node := filepath.Join(root, "devices", "system", "node", "node0")
	os.MkdirAll(node, 0o755)
	os.WriteFile(filepath.Join(node, "cpulist"), []byte("0-x"), 0o644)
	if _, err := ReadSysfs(root, nil); err == nil || !strings.Contains(err.Error(), "cpulist") {
		t.Fatalf("err = %v", err)
	}
}

func TestCountCPUList(t *testing.T) {
	for in, want := range map[string]int{"": 0, "0": 1, "0-3": 4, "0-3,8-11": 8, "0,2,4": 3} {
		if got, err := countCPUList(in); err != nil || got != want {
			t.Errorf("countCPUList(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"a", "3-1", "1-", "-"} {
		if _, err := countCPUList(bad); err == nil {
			t.Errorf("countCPUList(%q) accepted", bad)
		}
	}
}

// TestReadSysfsThisMachine reads the real /sys of the machine running the tests.
func TestReadSysfsThisMachine(t *testing.T) {
	if _, err := os.Stat("/sys/devices/system"); err != nil {
		t.Skipf("no sysfs on this machine (%v)", err)
	}
	info, err := ReadSysfs("/sys", SystemRDMA())
	if err != nil {
		t.Fatalf("ReadSysfs(/sys): %v", err)
	}
	cpus := 0
	for _, n := range info.NUMANodes {
		cpus += n.CPUs
	}
	if len(info.NUMANodes) < 1 || cpus < 1 {
		t.Fatalf("this machine: %d NUMA nodes, %d CPUs", len(info.NUMANodes), cpus)
	}
	for _, nic := range info.NICs {
		if nic.Name == "" || !(nic.SpeedGbps > 0) {
			t.Errorf("NIC %+v", nic)
		}
		if nic.Name == "lo" {
			t.Errorf("loopback reported as a NIC")
		}
	}
	t.Logf("this machine: %d NUMA node(s), %d CPU(s), %d NVIDIA GPU(s) on PCI, NICs %+v, notes %v", len(info.NUMANodes), cpus, len(info.GPUs), info.NICs, info.Notes)
}

// fixtureMachine is a declared machine whose GPUs sit at the fixture's PCI addresses: GPUs
// 0 and 1 joined by 4 NVLinks, GPU 2 alone and in MIG mode.
func fixtureMachine() *MachineSpec {
	return &MachineSpec{
		Name:   "fixture",
		NVLink: &NVLinkSpec{Generation: 3, LinkGBps: 25, Fabric: FabricDirect},
		GPUs: []GPUSpec{
			{Index: 0, Model: "NVIDIA A100 80GB PCIe", MemoryMiB: 81920, ComputeCapability: "8.0", PCIBusID: "0000:03:00.0", NVLinks: []NVLinkPeer{{Peer: 1, Count: 4}}},
			{Index: 1, Model: "NVIDIA A100 80GB PCIe", MemoryMiB: 81920, ComputeCapability: "8.0", PCIBusID: "0000:04:00.0", NVLinks: []NVLinkPeer{{Peer: 0, Count: 4}}},
			{Index: 2, Model: "NVIDIA A100 80GB PCIe", MemoryMiB: 81920, ComputeCapability: "8.0", PCIBusID: "0000:81:00.0",
				MIG: &MIGSpec{Enabled: true, Instances: []MIGInstanceSpec{{Profile: "3g.40gb"}, {Profile: "3g.40gb"}}}},
		},
	}
}

func TestDiscoverWithFakeNVML(t *testing.T) {
	opts := DiscoverOptions{SysRoot: fixture, NVML: &FakeNVML{Spec: fixtureMachine()}, Hostname: "node-a", Logger: zaptest.NewLogger(t)}
	c, rep, err := DiscoverCluster(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	m := c.Machines[0]
	if m.Simulated || m.Name != "node-a" || len(m.GPUs) != 3 {
		t.Fatalf("machine %+v", m)
	}
	if !rep.NVMLAvailable || rep.GPUs != 3 || rep.GPUsOnPCI != 3 || rep.CPUs != 16 || rep.NUMANodes != 2 || rep.NICs != 3 || rep.RDMANICs != 2 {
		t.Fatalf("report %+v", rep)
	}
	if want := [][]int{{0, 1}, {2}}; !reflect.DeepEqual(c.Islands(), want) {
		t.Fatalf("islands %v", c.Islands())
	}
	g0, g2 := m.GPUs[0], m.GPUs[2]
	if g0.UUID != "GPU-fake-0" || g0.PCIBusID != "0000:03:00.0" || g0.NUMA != 0 || g0.PCIeSwitch != "0000:01:00.0" || g0.NIC != "mlx5_0" || !g0.GPUDirect {
		t.Errorf("GPU 0 = %+v", g0)
	}
	if g2.NUMA != 1 || g2.PCIeSwitch != "" || !g2.MIGEnabled || len(g2.MIG) != 2 || g2.MIG[1].UUID != "MIG-fake-2-1" {
		t.Errorf("GPU 2 = %+v", g2)
	}
	if l := c.Link(0, 1); l.Tier != TierNVLink || l.GBps != 100 {
		t.Errorf("link 0-1 = %+v", l)
	}
	if l := c.Link(0, 2); l.Tier != TierCrossSocket {
		t.Errorf("link 0-2 = %+v", l)
	}
	if m.NVLink == nil || m.NVLink.Generation != 3 || m.NVLink.Fabric != FabricDirect {
		t.Errorf("nvlink = %+v", m.NVLink)
	}
	// Discover returns the same machine.
	m2, _, err := Discover(context.Background(), opts)
	if err != nil || len(m2.GPUs) != 3 {
		t.Fatalf("Discover: %v", err)
	}
}

func TestDiscoverNVSwitchRoundTrip(t *testing.T) {
	// A DGX H100 served through the fake NVML comes back as one island on an NVSwitch
	// fabric with SHARP, whatever sysfs says.
	spec, _ := BuiltinMachine("dgx-h100")
	c, rep, err := DiscoverCluster(context.Background(), DiscoverOptions{SysRoot: fixture, NVML: &FakeNVML{Spec: spec}, Hostname: "dgx"})
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Islands()) != 1 || c.NumGPUs() != 8 {
		t.Fatalf("islands %v", c.Islands())
	}
	nv := c.Machines[0].NVLink
	if nv.Fabric != FabricNVSwitch || !nv.SHARP || nv.Generation != 4 || c.GPU(0).NVSwitchLinks != 18 {
		t.Fatalf("nvlink %+v, GPU 0 %+v", nv, c.GPU(0))
	}
	// Bus ids not in the fixture's sysfs are noted, not fatal.
	if !strings.Contains(strings.Join(rep.Notes, "\n"), "not found in sysfs") {
		t.Errorf("notes %v", rep.Notes)
	}
}

func TestDiscoverWithoutNVML(t *testing.T) {
	tests := []struct {
		name string
		nvml NVML
		want string
	}{
		{"library missing", &FakeNVML{Spec: fixtureMachine(), InitErr: errors.New("libnvidia-ml.so.1: cannot open shared object file")}, "NVML: not available"},
		{"system", SystemNVML(), "NVML"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, rep, err := Discover(context.Background(), DiscoverOptions{SysRoot: fixture, NVML: tt.nvml, Hostname: "h"})
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(rep.NVML, tt.want) || strings.Contains(rep.NVML, "\n") || strings.Count(rep.NVML, "not available") > 1 {
				t.Fatalf("NVML line %q", rep.NVML)
			}
			if !rep.NVMLAvailable {
				if len(m.GPUs) != 0 {
					t.Fatalf("GPUs reported without NVML: %+v", m.GPUs)
				}
				lines := strings.Join(rep.Lines(), "\n")
				if !strings.Contains(lines, "3 NVIDIA GPU(s) are on the PCI bus but cannot be used without NVML") {
					t.Errorf("lines:\n%s", lines)
				}
			}
			if len(m.NICs) != 3 || len(m.NUMANodes) != 2 {
				t.Fatalf("CPU/NIC part missing: %+v", m)
			}
			t.Logf("%s", strings.Join(rep.Lines(), " | "))
		})
	}
}

func TestDiscoverSkipsBrokenGPU(t *testing.T) {
	f := &FakeNVML{Spec: fixtureMachine(), DeviceErr: map[int]error{1: errors.New("GPU is lost")}}
	c, rep, err := DiscoverCluster(context.Background(), DiscoverOptions{SysRoot: fixture, NVML: f, Hostname: "h"})
	if err != nil {
		t.Fatal(err)
	}
	// GPU 1 is gone: GPU 0's links to it lead nowhere and are ignored, not taken for an
	// NVSwitch; the machine builds and says why.
	notes := strings.Join(rep.Notes, "\n")
	if c.NumGPUs() != 2 || !strings.Contains(notes, "GPU 1 skipped: GPU is lost") || !strings.Contains(notes, "4 NVLink(s) to a GPU NVML could not report") {
		t.Fatalf("gpus %d notes %v", c.NumGPUs(), rep.Notes)
	}
	if c.GPU(0).NVSwitchLinks != 0 || len(c.Islands()) != 2 || c.Machines[0].NVLink != nil {
		t.Fatalf("GPU 0 = %+v, islands %v", c.GPU(0), c.Islands())
	}
}

// hungNVML's Init blocks until release is closed, as a hung driver would.
type hungNVML struct {
	FakeNVML
	release chan struct{}
}

func (h *hungNVML) Init() error { <-h.release; return nil }

func TestDiscoverHonoursDeadline(t *testing.T) {
	lib := &hungNVML{FakeNVML: FakeNVML{Spec: fixtureMachine()}, release: make(chan struct{})}
	defer close(lib.release) // let the abandoned NVML goroutine finish
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, _, err := Discover(ctx, DiscoverOptions{SysRoot: fixture, NVML: lib, Hostname: "h"})
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v, want the deadline", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Discover is still waiting for a hung NVML 30 s after its 50 ms deadline")
	}
}

func TestDiscoverRefusesABadHostname(t *testing.T) {
	// The host name becomes the machine's name, and so a directory name on the agent.
	for _, h := range []string{"../etc", "a b", strings.Repeat("h", 129)} {
		_, _, err := Discover(context.Background(), DiscoverOptions{SysRoot: fixture, NVML: &FakeNVML{Spec: fixtureMachine()}, Hostname: h})
		if !errors.Is(err, ErrInvalidSpec) || !strings.Contains(err.Error(), "DiscoverOptions.Hostname") {
			t.Errorf("hostname %.20q: err = %v", h, err)
		}
	}
}

func TestNormalizeBusID(t *testing.T) {
	for in, want := range map[string]string{"00000000:18:00.0": "0000:18:00.0", "0000:18:00.0": "0000:18:00.0", "00000001:AB:00.0": "0001:ab:00.0"} {
		if got := normalizeBusID(in); got != want {
			t.Errorf("normalizeBusID(%q) = %q", in, got)
		}
	}
}

// TestDiscoverRealGPU runs only where ATOLL_EXPECT_GPU=1 says a real NVIDIA GPU and driver
// are present (the device check in docs/topology.md); elsewhere it is skipped.
func TestDiscoverRealGPU(t *testing.T) {
	if os.Getenv("ATOLL_EXPECT_GPU") != "1" {
		t.Skip("set ATOLL_EXPECT_GPU=1 on a machine with an NVIDIA GPU and driver")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	opts := DefaultDiscoverOptions()
	opts.Logger = zaptest.NewLogger(t)
	c, rep, err := DiscoverCluster(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range rep.Lines() {
		t.Log(l)
	}
	if !rep.NVMLAvailable || c.NumGPUs() < 1 {
		t.Fatalf("expected a GPU: %+v", rep)
	}
	if rep.GPUsOnPCI < c.NumGPUs() {
		t.Errorf("NVML reports %d GPUs but sysfs shows %d on PCI", c.NumGPUs(), rep.GPUsOnPCI)
	}
	for _, g := range c.GPUs() {
		t.Logf("GPU %d: %s %d MiB cc %s bus %s NUMA %d switch %q NVLinks %v NVSwitchLinks %d MIG %v %v NIC %q",
			g.Index, g.Model, g.MemoryMiB, g.ComputeCapability, g.PCIBusID, g.NUMA, g.PCIeSwitch, g.NVLinks, g.NVSwitchLinks, g.MIGEnabled, g.MIG, g.NIC)
		if !strings.HasPrefix(g.UUID, "GPU-") || g.MemoryMiB <= 0 || g.Model == "" || !busIDRE.MatchString(g.PCIBusID) || g.ComputeCapability == "0.0" {
			t.Errorf("GPU %d looks wrong: %+v", g.Index, g)
		}
	}
	t.Logf("islands %v", c.Islands())
}
