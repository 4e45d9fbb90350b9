package gang

import (
	"time"
)

// TieredModel is the in-package CollectiveModel: a ring AllReduce whose speed is set by the
// slowest tier the ring crosses (NVLink island, PCIe inside a machine, rack leaf switch,
// spine). It stands in where no topology bandwidth model is wired (tests, the FGD mode).
type TieredModel struct {
	IslandGBps  float64       // per-GPU NVLink bandwidth inside an island
	MachineGBps float64       // between islands of one machine (PCIe / host)
	RackGBps    float64       // between machines under one leaf switch (per-GPU NIC share)
	SpineGBps   float64       // between racks (after oversubscription)
	HopLatency  time.Duration // per ring step
}

// DefaultTieredModel is a DGX H100-like fabric: NVLink 450 GB/s, PCIe 50 GB/s, 400 Gb/s
// NIC per GPU (50 GB/s) in a rack, 2:1 oversubscribed spine (25 GB/s).
func DefaultTieredModel() TieredModel {
	return TieredModel{IslandGBps: 450, MachineGBps: 50, RackGBps: 50, SpineGBps: 25, HopLatency: 5 * time.Microsecond}
}

// AllReduceTime implements CollectiveModel: 2(n-1)/n · bytes / bottleneck + 2(n-1) hops.
func (m TieredModel) AllReduceTime(gpus []GPURef, bytes int64) time.Duration {
	n := len(gpus)
	if n <= 1 || bytes <= 0 {
		return 0
	}
	bw := m.IslandGBps
	g0 := gpus[0]
	for _, g := range gpus[1:] {
		switch {
		case g.Rack != g0.Rack:
			bw = min(bw, m.SpineGBps)
		case g.Node != g0.Node:
			bw = min(bw, m.RackGBps)
		case g.Island != g0.Island:
			bw = min(bw, m.MachineGBps)
		}
	}
	if bw <= 0 {
		bw = 1
	}
	steps := 2 * float64(n-1)
	sec := steps / float64(n) * float64(bytes) / (bw * 1e9)
	return time.Duration(sec*float64(time.Second)) + time.Duration(steps)*m.HopLatency
}
