//go:build !cgo

package topology

import "fmt"

// SystemNVML returns an NVML that always fails Init: this binary was built with
// CGO_ENABLED=0, and go-nvml needs cgo.
func SystemNVML() NVML { return noNVML{} }

type noNVML struct{}

var _ NVML = noNVML{}

func (noNVML) Init() error {
	return fmt.Errorf("topology: built without NVML (CGO_ENABLED=0): %w", ErrNoNVML)
}
func (noNVML) Shutdown() error                { return nil }
func (noNVML) DriverVersion() (string, error) { return "", ErrNoNVML }
func (noNVML) DeviceCount() (int, error)      { return 0, ErrNoNVML }
func (noNVML) Device(int) (NVMLDevice, error) { return nil, ErrNoNVML }
