//go:build !nvml || !cgo

package topology

import "fmt"

// noNVMLMessage is what discovery reports about NVML in a binary built without it.
const noNVMLMessage = "this atoll was built without NVML; build with -tags nvml (and cgo) on GPU machines " +
	"(or declare the machine with --machine SPEC)"

// SystemNVML returns an NVML whose Init always fails: this binary was built without the
// nvml tag (the default, which compiles no go-nvml and needs no C compiler) or without cgo.
// Build with `go build -tags nvml ./cmd/atoll` on GPU machines; sysfs and rdmamap discovery
// work either way.
func SystemNVML() NVML { return noNVML{} }

type noNVML struct{}

var _ NVML = noNVML{}

func (noNVML) Init() error {
	return fmt.Errorf("topology: %s: %w", noNVMLMessage, ErrNoNVML)
}
func (noNVML) Shutdown() error                { return nil }
func (noNVML) DriverVersion() (string, error) { return "", ErrNoNVML }
func (noNVML) DeviceCount() (int, error)      { return 0, ErrNoNVML }
func (noNVML) Device(int) (NVMLDevice, error) { return nil, ErrNoNVML }
