package topology

import (
	"errors"
	"fmt"
	"strings"
)

// NVML is the part of NVIDIA's management library that discovery uses. SystemNVML returns
// the real one (go-nvml) in binaries built with `-tags nvml` and cgo, and one that says
// how to get it otherwise; FakeNVML serves a declared machine for tests.
// Implementations need not be safe for concurrent use: Discover calls them from one
// goroutine, between Init and Shutdown.
type NVML interface {
	// Init loads and initialises the library; an error wrapping ErrNoNVML means it is absent.
	Init() error
	// Shutdown releases it.
	Shutdown() error
	// DriverVersion returns the driver version string.
	DriverVersion() (string, error)
	// DeviceCount returns the number of GPUs.
	DeviceCount() (int, error)
	// Device returns GPU i, 0 <= i < DeviceCount().
	Device(i int) (NVMLDevice, error)
}

// NVMLDevice is one GPU as NVML sees it.
type NVMLDevice interface {
	// Name is the marketing name ("NVIDIA H200").
	Name() (string, error)
	// UUID is "GPU-...".
	UUID() (string, error)
	// MemoryMiB is the total framebuffer memory.
	MemoryMiB() (int64, error)
	// PCIBusID returns the bus id in NVML's form ("00000000:18:00.0").
	PCIBusID() (string, error)
	// ComputeCapability is CUDA's (major, minor), e.g. (9, 0).
	ComputeCapability() (major, minor int, err error)
	// NVLinks returns the active NVLinks, one entry per link.
	NVLinks() ([]NVLinkRemote, error)
	// MIG returns MIG mode and, when enabled, the GPU instances.
	MIG() (enabled bool, instances []MIGInstanceSpec, err error)
}

// NVLinkRemote is the far end of one active NVLink.
type NVLinkRemote struct {
	// Link is the link number on this GPU.
	Link int
	// Version is the NVLink version NVML reports (informational).
	Version int
	// RemoteBusID is the PCI bus id of the far end.
	RemoteBusID string
	// RemoteIsSwitch says the far end is an NVSwitch (from NVML's remote device type, or
	// because no GPU has that bus id).
	RemoteIsSwitch bool
}

// FakeNVML serves a declared MachineSpec through the NVML interface, for tests and for
// exercising discovery without a GPU. It is not hardware: nothing uses it unless it is
// passed in DiscoverOptions.NVML.
type FakeNVML struct {
	// Spec is the machine served. GPUs without a UUID get "GPU-fake-<i>".
	Spec *MachineSpec
	// InitErr, if set, is returned by Init (e.g. to simulate a missing library).
	InitErr error
	// DeviceErr maps a GPU index to an error returned by Device(i).
	DeviceErr map[int]error
	inited    bool
}

var _ NVML = (*FakeNVML)(nil)

// Init implements NVML.
func (f *FakeNVML) Init() error {
	if f.InitErr != nil {
		return f.InitErr
	}
	f.inited = true
	return nil
}

// Shutdown implements NVML.
func (f *FakeNVML) Shutdown() error { f.inited = false; return nil }

// DriverVersion implements NVML.
func (f *FakeNVML) DriverVersion() (string, error) { return "fake", nil }

// DeviceCount implements NVML.
func (f *FakeNVML) DeviceCount() (int, error) {
	if !f.inited {
		return 0, errors.New("fake nvml: not initialised")
	}
	return len(f.Spec.GPUs), nil
}

// Device implements NVML.
func (f *FakeNVML) Device(i int) (NVMLDevice, error) {
	if !f.inited {
		return nil, errors.New("fake nvml: not initialised")
	}
	if err := f.DeviceErr[i]; err != nil {
		return nil, err
	}
	if i < 0 || i >= len(f.Spec.GPUs) {
		return nil, fmt.Errorf("fake nvml: no device %d", i)
	}
	return fakeDevice{f.Spec, i}, nil
}

var _ NVMLDevice = fakeDevice{}

type fakeDevice struct {
	spec *MachineSpec
	i    int
}

func (d fakeDevice) g() *GPUSpec { return &d.spec.GPUs[d.i] }

func (d fakeDevice) Name() (string, error) { return d.g().Model, nil }
func (d fakeDevice) UUID() (string, error) {
	if d.g().UUID != "" {
		return d.g().UUID, nil
	}
	return fmt.Sprintf("GPU-fake-%d", d.i), nil
}
func (d fakeDevice) MemoryMiB() (int64, error) { return d.g().MemoryMiB, nil }
func (d fakeDevice) PCIBusID() (string, error) {
	// NVML writes an 8-digit domain in upper case.
	b := strings.ToUpper(d.g().PCIBusID)
	if len(b) == 12 {
		b = "0000" + b
	}
	return b, nil
}
func (d fakeDevice) ComputeCapability() (int, int, error) {
	var maj, min int
	if _, err := fmt.Sscanf(d.g().ComputeCapability, "%d.%d", &maj, &min); err != nil {
		return 0, 0, fmt.Errorf("fake nvml: compute capability %q: %w", d.g().ComputeCapability, err)
	}
	return maj, min, nil
}
func (d fakeDevice) NVLinks() ([]NVLinkRemote, error) {
	var out []NVLinkRemote
	ver := 0
	if d.spec.NVLink != nil {
		ver = d.spec.NVLink.Generation
	}
	link := 0
	for _, l := range d.g().NVLinks {
		for k := 0; k < l.Count; k++ {
			out = append(out, NVLinkRemote{Link: link, Version: ver, RemoteBusID: strings.ToUpper("0000" + d.spec.GPUs[l.Peer].PCIBusID)})
			link++
		}
	}
	for k := 0; k < d.g().NVSwitchLinks; k++ {
		out = append(out, NVLinkRemote{Link: link, Version: ver, RemoteBusID: fmt.Sprintf("00000000:%02X:00.0", 0xE0+k%4), RemoteIsSwitch: true})
		link++
	}
	return out, nil
}
func (d fakeDevice) MIG() (bool, []MIGInstanceSpec, error) {
	m := d.g().MIG
	if m == nil || !m.Enabled {
		return false, nil, nil
	}
	out := make([]MIGInstanceSpec, len(m.Instances))
	for k, in := range m.Instances {
		out[k] = in
		if out[k].UUID == "" {
			out[k].UUID = fmt.Sprintf("MIG-fake-%d-%d", d.i, k)
		}
	}
	return true, out, nil
}

// normalizeBusID turns NVML's "00000000:18:00.0" into sysfs's "0000:18:00.0".
func normalizeBusID(s string) string {
	s = strings.ToLower(strings.TrimSpace(s))
	if i := strings.IndexByte(s, ':'); i > 4 {
		s = s[i-4:]
	}
	return s
}

// nvlinkGen maps a CUDA compute capability to the NVLink generation and per-link GB/s of
// the SXM parts of that architecture.
func nvlinkGen(major, minor int) (gen int, gbps float64) {
	switch {
	case major >= 10:
		return 5, 50
	case major == 9:
		return 4, 25
	case major == 8:
		return 3, 25
	case major == 7:
		return 2, 25
	case major == 6:
		return 1, 20
	}
	return 0, 0
}
