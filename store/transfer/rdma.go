package transfer

import "github.com/Mellanox/rdmamap"

// Backend names a transfer backend.
type Backend string

// Backends. Only TCP is built: the verbs (RDMA) backend would implement the same
// register-region / read-by-key shape with ibv_reg_mr and RDMA READ, but no
// machine this project runs on has an RDMA NIC to build and test it against.
const (
	BackendTCP   Backend = "tcp"
	BackendVerbs Backend = "verbs" // not built
)

// RDMADevice is an RDMA device found on this machine.
type RDMADevice struct {
	Name        string   `json:"name"`
	CharDevices []string `json:"char_devices,omitempty"`
	Ports       []string `json:"ports,omitempty"`
}

// RDMAReport says which RDMA devices this machine has (from sysfs, through
// Mellanox/rdmamap) and which backend the transfer plane uses.
type RDMAReport struct {
	Devices []RDMADevice `json:"devices"`
	Backend Backend      `json:"backend"`
	Note    string       `json:"note"`
}

// DetectRDMA lists RDMA devices. The backend is always TCP: the verbs backend is
// not built here.
func DetectRDMA() RDMAReport {
	r := RDMAReport{Devices: []RDMADevice{}, Backend: BackendTCP}
	for _, name := range rdmamap.GetRdmaDeviceList() {
		r.Devices = append(r.Devices, RDMADevice{Name: name, CharDevices: rdmamap.GetRdmaCharDevices(name), Ports: rdmamap.GetPorts(name)})
	}
	if len(r.Devices) == 0 {
		r.Note = "no RDMA devices; using the TCP backend"
	} else {
		r.Note = "RDMA devices present, but the verbs backend is not built; using the TCP backend"
	}
	return r
}
