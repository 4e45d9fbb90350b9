package topology

import "errors"

// Sentinel errors. Functions wrap them with the file, JSON path or value that was wrong;
// check them with errors.Is.
var (
	// ErrUnknownMachine means a machine type name is neither built in nor declared in the
	// cluster spec's machineTypes.
	ErrUnknownMachine = errors.New("unknown machine type")
	// ErrSyntax means a spec file is not well-formed JSON or has a value of the wrong type
	// or an unknown field; the message names the file and line:col or JSON path.
	ErrSyntax = errors.New("malformed spec")
	// ErrInvalidSpec means a spec is well-formed but contradicts itself (a link to a GPU
	// that does not exist, asymmetric link counts, a MIG layout that does not fit, ...).
	ErrInvalidSpec = errors.New("invalid spec")
	// ErrShorthand means a cluster shorthand such as "64xdgx-h100/8" could not be parsed.
	ErrShorthand = errors.New("bad cluster shorthand")
	// ErrNoGPU is returned for a GPU id outside 0..NumGPUs()-1.
	ErrNoGPU = errors.New("no such GPU")
	// ErrNoNVML means NVML could not be used: the binary was built without the nvml tag or
	// without cgo, or libnvidia-ml is not installed, or it failed to initialise. Discovery still reports
	// the CPU, NUMA, PCIe and NIC parts it could read.
	ErrNoNVML = errors.New("NVML not available")
)
