// Package topology models GPU machines and clusters: GPUs, MIG slices, NVLink and
// NVSwitch fabrics, PCIe switches, NUMA nodes, NICs, racks and leaf/spine networks. It
// discovers real machines (NVML, rdmamap, sysfs), reads declared specs for machines we do
// not have, computes NVLink islands from links (never declared), and models link bandwidth
// and AllReduce time with an alpha-beta model checked against published nccl-tests figures.
//
// Usage:
//
//	c, err := topology.Load("64xdgx-h100/8") // a built-in name, a shorthand or a JSON file
//	if err != nil { ... }
//	c.NumGPUs()                              // 512; GPUs have global ids 0..511 in machine order
//	c.Islands()                              // [[0..7] [8..15] ...]: one NVLink island per DGX
//	c.IslandOf(9)                            // 1
//	c.Link(0, 9)                             // {Tier: net-leaf, GBps: 50, ...}
//	c.AllReduceTime([]int{0, 1, 2, 3, 8, 9, 10, 11}, 1<<30, topology.Best)
//
// The built-in machine types are JSON spec files embedded from machines/, in the format
// users write. Every spec is validated before it is built: names that become file names
// (machine types and machines) are restricted to a portable character set, every number has
// a documented bound, and a cluster holds at most MaxGPUs GPUs; errors give file:line:col
// and the JSON path.
//
// A declared cluster is simulated: its GPUs have "GPU-sim-" UUIDs and Machine.Simulated is
// true. Discover reads the machine it runs on and never pretends a GPU exists. NVML is
// compiled in only with the nvml build tag (and cgo): `go build -tags nvml ./cmd/atoll` on GPU
// machines; other builds report that NVML is missing and still read sysfs.
//
// Clusters are immutable after Build and safe for concurrent use. Link and IslandOf are
// O(1): per-machine-type tables are precomputed once, and pairs across machines are derived
// from the rack layout, so there are no tables over all GPU pairs. Rendering a cluster as
// text, JSON or Graphviz is the CLI's business (internal/topoview).
package topology
