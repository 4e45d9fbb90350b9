// Package cudactx measures what creating a CUDA context costs on this machine's GPU: the
// term of a gang's restart that the scheduler's cost model learns per GPU model (a
// preempted or restarted worker pays it again). It calls the CUDA driver API through the
// library that ships with the driver (libcuda.so.1, loaded at run time: no CUDA toolkit is
// needed to build or run, and a binary without a GPU runs unchanged). It is built into
// binaries with -tags nvml (cgo), like NVML discovery; elsewhere Measure says so.
package cudactx

import (
	"errors"
	"time"
)

// ErrUnavailable reports that there is no CUDA driver to measure with: a build without
// -tags nvml, a machine without libcuda.so.1, or no visible GPU.
var ErrUnavailable = errors.New("cudactx: no CUDA driver")

// Result is one measurement: creating (cuCtxCreate, which initializes the device's state)
// and destroying a context on device 0 of the visible devices (CUDA_VISIBLE_DEVICES).
type Result struct {
	Init    time.Duration // cuInit: the driver's first initialization in this process
	Create  time.Duration
	Destroy time.Duration
	Device  string // the device's name, as the driver says it
}

// Total is the teardown and re-creation a restart pays.
func (r Result) Total() time.Duration { return r.Create + r.Destroy }
