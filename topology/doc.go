// Package topology models GPU machines and clusters: GPUs, MIG slices, NVLink and
// NVSwitch fabrics, PCIe switches, NUMA nodes, NICs, racks and network tiers. It discovers
// real machines (NVML, rdmamap, sysfs), reads declared specs for machines we do not have,
// computes NVLink islands from links, and models link bandwidth and AllReduce time.
package topology
