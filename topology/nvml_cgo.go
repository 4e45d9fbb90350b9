//go:build nvml && cgo

package topology

import (
	"fmt"
	"math"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// SystemNVML returns NVML through go-nvml, which loads libnvidia-ml.so.1 at Init. Where the
// library is absent, Init returns an error wrapping ErrNoNVML.
func SystemNVML() NVML { return &realNVML{lib: nvml.New()} }

type realNVML struct {
	lib nvml.Interface
}

var (
	_ NVML       = (*realNVML)(nil)
	_ NVMLDevice = realDevice{}
)

func nvmlErr(what string, ret nvml.Return) error {
	return fmt.Errorf("nvml: %s: %s", what, ret.Error())
}

func (r *realNVML) Init() (err error) {
	// go-nvml panics in a few corner cases (symbols missing from an old driver); never let
	// that cross the API.
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("topology: NVML init panicked: %v: %w", p, ErrNoNVML)
		}
	}()
	ret := r.lib.Init()
	switch ret {
	case nvml.SUCCESS:
		return nil
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return fmt.Errorf("topology: libnvidia-ml.so.1 not found (no NVIDIA driver on this machine): %w", ErrNoNVML)
	case nvml.ERROR_DRIVER_NOT_LOADED:
		return fmt.Errorf("topology: NVIDIA driver not loaded: %w", ErrNoNVML)
	}
	return fmt.Errorf("topology: NVML init: %s: %w", ret.Error(), ErrNoNVML)
}

func (r *realNVML) Shutdown() error {
	if ret := r.lib.Shutdown(); ret != nvml.SUCCESS {
		return nvmlErr("shutdown", ret)
	}
	return nil
}

func (r *realNVML) DriverVersion() (string, error) {
	v, ret := r.lib.SystemGetDriverVersion()
	if ret != nvml.SUCCESS {
		return "", nvmlErr("driver version", ret)
	}
	return v, nil
}

func (r *realNVML) DeviceCount() (int, error) {
	n, ret := r.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return 0, nvmlErr("device count", ret)
	}
	return n, nil
}

func (r *realNVML) Device(i int) (NVMLDevice, error) {
	d, ret := r.lib.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		return nil, nvmlErr(fmt.Sprintf("device %d", i), ret)
	}
	return realDevice{d}, nil
}

type realDevice struct{ d nvml.Device }

func (d realDevice) Name() (string, error) {
	v, ret := d.d.GetName()
	if ret != nvml.SUCCESS {
		return "", nvmlErr("name", ret)
	}
	return v, nil
}

func (d realDevice) UUID() (string, error) {
	v, ret := d.d.GetUUID()
	if ret != nvml.SUCCESS {
		return "", nvmlErr("uuid", ret)
	}
	return v, nil
}

func (d realDevice) MemoryMiB() (int64, error) {
	m, ret := d.d.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return 0, nvmlErr("memory", ret)
	}
	return int64(m.Total >> 20), nil
}

func (d realDevice) PCIBusID() (string, error) {
	p, ret := d.d.GetPciInfo()
	if ret != nvml.SUCCESS {
		return "", nvmlErr("pci info", ret)
	}
	return cString(p.BusId[:]), nil
}

func cString(b []int8) string {
	out := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		out = append(out, byte(c))
	}
	return string(out)
}

func (d realDevice) ComputeCapability() (int, int, error) {
	maj, min, ret := d.d.GetCudaComputeCapability()
	if ret != nvml.SUCCESS {
		return 0, 0, nvmlErr("compute capability", ret)
	}
	return maj, min, nil
}

func (d realDevice) NVLinks() ([]NVLinkRemote, error) {
	var out []NVLinkRemote
	for l := 0; l < nvml.NVLINK_MAX_LINKS; l++ {
		state, ret := d.d.GetNvLinkState(l)
		if ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_INVALID_ARGUMENT {
			// Past the last link, or no NVLink at all.
			break
		}
		if ret != nvml.SUCCESS || state != nvml.FEATURE_ENABLED {
			continue
		}
		r := NVLinkRemote{Link: l}
		if v, ret := d.d.GetNvLinkVersion(l); ret == nvml.SUCCESS {
			r.Version = int(v)
		}
		if p, ret := d.d.GetNvLinkRemotePciInfo(l); ret == nvml.SUCCESS {
			r.RemoteBusID = cString(p.BusId[:])
		}
		if t, ret := d.d.GetNvLinkRemoteDeviceType(l); ret == nvml.SUCCESS {
			r.RemoteIsSwitch = t == nvml.NVLINK_DEVICE_TYPE_SWITCH
		}
		out = append(out, r)
	}
	return out, nil
}

func (d realDevice) MIG() (bool, []MIGInstanceSpec, error) {
	cur, _, ret := d.d.GetMigMode()
	if ret == nvml.ERROR_NOT_SUPPORTED {
		return false, nil, nil
	}
	if ret != nvml.SUCCESS {
		return false, nil, nvmlErr("MIG mode", ret)
	}
	if cur != nvml.DEVICE_MIG_ENABLE {
		return false, nil, nil
	}
	max, ret := d.d.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return true, nil, nvmlErr("MIG device count", ret)
	}
	var out []MIGInstanceSpec
	for i := 0; i < max; i++ {
		md, ret := d.d.GetMigDeviceHandleByIndex(i)
		if ret == nvml.ERROR_NOT_FOUND || ret == nvml.ERROR_INVALID_ARGUMENT {
			continue
		}
		if ret != nvml.SUCCESS {
			return true, out, nvmlErr(fmt.Sprintf("MIG device %d", i), ret)
		}
		inst := MIGInstanceSpec{}
		if u, ret := md.GetUUID(); ret == nvml.SUCCESS {
			inst.UUID = u
		}
		attr, ret := md.GetAttributes()
		if ret != nvml.SUCCESS {
			return true, out, nvmlErr(fmt.Sprintf("MIG device %d attributes", i), ret)
		}
		// Profile names are "<slices>g.<GB>gb"; NVML gives slices and MB, so the GB figure
		// is rounded (9728 MB -> 10gb, 40192 MB -> 40gb).
		inst.Profile = fmt.Sprintf("%dg.%dgb", attr.GpuInstanceSliceCount, int(math.Round(float64(attr.MemorySizeMB)/1000)))
		out = append(out, inst)
	}
	return true, out, nil
}
