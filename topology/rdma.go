package topology

import "github.com/Mellanox/rdmamap"

// SystemRDMA returns the RDMA lister for the live machine, through
// github.com/Mellanox/rdmamap (which reads /sys/class/infiniband and /sys/bus/pci).
func SystemRDMA() RDMA { return rdmaMap{} }

type rdmaMap struct{}

// Devices implements RDMA.
func (rdmaMap) Devices() []string { return rdmamap.GetRdmaDeviceList() }

// DevicesForPCI implements RDMA.
func (rdmaMap) DevicesForPCI(bdf string) []string { return rdmamap.GetRdmaDevicesForPcidev(bdf) }
