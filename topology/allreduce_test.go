package topology

import (
	"testing"
	"time"
)

const gib = int64(1) << 30

// TestAllReduceAgainstPublishedNCCLTests checks the model's bus bandwidth for an 8-GPU
// AllReduce inside one machine, at a large message (NCCL's peak region), against published
// nccl-tests all_reduce_perf figures, within 25%.
//
// Sources:
//   - DGX A100 (8x A100-SXM4-80GB, NVSwitch, NVLink 3 at 300 GB/s per GPU per direction):
//     ~230 GB/s busbw at large messages is the figure commonly quoted as NVIDIA's for DGX A100
//     (we could not find the primary page in our reference search, so it is checked together
//     with a measured one); users measure ~200 GB/s on 8x A100 NVSwitch systems
//     (github.com/NVIDIA/nccl-tests/issues/149, HPE Apollo 6500 8x A100 80GB, NCCL 2.18:
//     "the nccl tests show a busbw of ~200 GB/s").
//   - DGX H100 (8x H100 SXM5, NVLink 4 at 450 GB/s): "450GB/s is the line rate. With the
//     protocol overhead (~20%) NCCL can get an effective NVLink bandwidth of 370GB/s [...]
//     when running with NCCL_ALGO=RING. [...] allreduce uses NVLink SHARP by default [...] On 8
//     GPUs, you should reach a peak busBw of ~480GB/s (algbw ~275GB/s)" (Sylvain Jeaugey,
//     NVIDIA, github.com/NVIDIA/nccl-tests/issues/212).
//   - HGX H200 (8x H200, same NVLink 4 fabric): all_reduce_perf peak busbw 475 GB/s measured
//     with NCCL 2.20.3 (github.com/NVIDIA/nccl-tests/issues/272). This one is not used to
//     set any constant, so it is an independent check of the NVLS efficiency.
//
// The ring efficiency (0.82) comes from the H100 statement alone; the A100 check is
// therefore an independent test of it on another NVLink generation.
func TestAllReduceAgainstPublishedNCCLTests(t *testing.T) {
	tests := []struct {
		spec      string
		algo      Algo
		published float64 // busbw GB/s
		source    string
	}{
		{"dgx-a100", Best, 230, "NVIDIA DGX A100 all_reduce busbw ~230 GB/s"},
		{"dgx-a100", Ring, 200, "nccl-tests#149: ~200 GB/s on 8x A100 80GB NVSwitch"},
		{"dgx-h100", Ring, 370, "nccl-tests#212: NCCL_ALGO=RING ~370 GB/s"},
		{"dgx-h100", Best, 480, "nccl-tests#212: NVLS peak busbw ~480 GB/s"},
		{"hgx-h200", Best, 475, "nccl-tests#272: H200 peak busbw 475 GB/s"},
	}
	for _, tt := range tests {
		t.Run(tt.spec+"/"+tt.algo.String(), func(t *testing.T) {
			c := mustLoad(t, tt.spec)
			est := c.AllReduce(seq(0, 8), 8*gib, tt.algo)
			dev := (est.BusBWGBps - tt.published) / tt.published
			t.Logf("%s %s: model busbw %.1f GB/s (algo %s), published %.0f (%s): %+.1f%%",
				tt.spec, tt.algo, est.BusBWGBps, est.Algo, tt.published, tt.source, 100*dev)
			if dev < -0.25 || dev > 0.25 {
				t.Fatalf("model %.1f GB/s is %+.1f%% off the published %.0f GB/s (%s)", est.BusBWGBps, 100*dev, tt.published, tt.source)
			}
		})
	}
}

func TestAllReduceShapes(t *testing.T) {
	h := mustLoad(t, "dgx-h100")
	// Best is never slower than any algorithm.
	for _, size := range []int64{1 << 10, 1 << 20, 64 << 20, gib} {
		best := h.AllReduce(seq(0, 8), size, Best)
		for _, a := range Algos() {
			if e := h.AllReduce(seq(0, 8), size, a); e.Time < best.Time {
				t.Errorf("size %d: %s (%v) beats Best (%v)", size, a, e.Time, best.Time)
			}
		}
	}
	// Small messages are latency-bound: tree beats ring on many GPUs.
	big := mustLoad(t, "16xdgx-h100/4")
	all := seq(0, big.NumGPUs())
	if tr, rg := big.AllReduceTime(all, 1024, Tree), big.AllReduceTime(all, 1024, Ring); tr >= rg {
		t.Errorf("1 KiB on 128 GPUs: tree %v should beat ring %v", tr, rg)
	}
	// Large messages: ring beats tree.
	if tr, rg := h.AllReduceTime(seq(0, 8), gib, Tree), h.AllReduceTime(seq(0, 8), gib, Ring); rg >= tr {
		t.Errorf("1 GiB on 8 GPUs: ring %v should beat tree %v", rg, tr)
	}
	// Time grows with size; degenerate cases.
	if a, b := h.AllReduceTime(seq(0, 8), 1<<20, Ring), h.AllReduceTime(seq(0, 8), 1<<30, Ring); a >= b {
		t.Errorf("1 MiB %v not faster than 1 GiB %v", a, b)
	}
	if d := h.AllReduceTime([]int{3}, gib, Best); d != 0 {
		t.Errorf("one GPU: %v", d)
	}
	if d := h.AllReduceTime([]int{3, 3}, gib, Best); d != 0 {
		t.Errorf("duplicates: %v", d)
	}
	if d := h.AllReduceTime([]int{0, 42}, gib, Ring); d != Unreachable {
		t.Errorf("unknown id: %v", d)
	}
	// NVLS needs a SHARP fabric.
	if d := mustLoad(t, "dgx-a100").AllReduceTime(seq(0, 8), gib, NVLS); d != Unreachable {
		t.Errorf("NVLS on A100: %v", d)
	}
}

func TestAllReducePlacementOrdering(t *testing.T) {
	// The scheduler relies on these orderings: one island beats two machines, NVLink pairs
	// beat PCIe, a rack beats crossing an oversubscribed spine.
	c := mustLoad(t, "4xdgx-h100/2")
	c2, err := Build(&ClusterSpec{Machines: []MachineGroup{{Type: "dgx-h100", Count: 4, RackSize: 2}}, Network: NetworkSpec{Oversubscription: 4}})
	if err != nil {
		t.Fatal(err)
	}
	oneMachine := c.AllReduceTime(seq(0, 8), gib, Best)
	twoMachines := c.AllReduceTime(append(seq(0, 4), seq(8, 4)...), gib, Best)
	twoRacks := c2.AllReduceTime(append(seq(0, 4), seq(16, 4)...), gib, Best)
	sameRack := c2.AllReduceTime(append(seq(0, 4), seq(8, 4)...), gib, Best)
	if !(oneMachine < twoMachines && sameRack < twoRacks) {
		t.Errorf("one machine %v, two machines %v, same rack %v, two racks %v", oneMachine, twoMachines, sameRack, twoRacks)
	}
	p := mustLoad(t, "a100-pcie-nvlink-pairs")
	if pair, cross := p.AllReduceTime([]int{0, 1}, gib, Best), p.AllReduceTime([]int{0, 2}, gib, Best); pair >= cross {
		t.Errorf("NVLink pair %v should beat PCIe pair %v", pair, cross)
	}
	// Hierarchical wins across machines for big messages on 32 GPUs.
	all := seq(0, 32)
	e := c.AllReduce(all, gib, Best)
	if e.Islands != 4 {
		t.Errorf("islands = %d", e.Islands)
	}
	if h := c.AllReduceTime(all, gib, Hierarchical); h > c.AllReduceTime(all, gib, Tree) {
		t.Errorf("hierarchical %v slower than tree", h)
	}
	// NVL72: 72 GPUs in one island, NVLS applies.
	g := mustLoad(t, "gb200-nvl72")
	if e := g.AllReduce(seq(0, 72), gib, Best); e.Algo != NVLS || e.Islands != 1 {
		t.Errorf("NVL72 best = %+v", e)
	}
}

func TestWithModel(t *testing.T) {
	c := mustLoad(t, "dgx-h100")
	p := c.Model()
	p.NVLinkEfficiency = 0.41
	c2, err := c.WithModel(p)
	if err != nil {
		t.Fatal(err)
	}
	a, b := c.AllReduceTime(seq(0, 8), gib, Ring), c2.AllReduceTime(seq(0, 8), gib, Ring)
	if r := float64(b) / float64(a); r < 1.9 || r > 2.1 {
		t.Errorf("halving efficiency changed time by %.2fx", r)
	}
	p.NVLinkEfficiency = 1.5
	if _, err := c.WithModel(p); err == nil {
		t.Error("efficiency 1.5 accepted")
	}
	_ = time.Second
}

// BenchmarkLinkLargeCluster: Link on a 10,000-machine (80,000-GPU) cluster; no pairwise
// tables exist, so this is the cost a scheduler pays per pair.
func BenchmarkLinkLargeCluster(b *testing.B) {
	c := mustLoad(b, "10000xdgx-h100/32")
	n := c.NumGPUs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		_ = c.Link((i*7919)%n, (i*104729+13)%n)
	}
}

// BenchmarkAllReduce64 estimates a 64-GPU gang's AllReduce on the same cluster.
func BenchmarkAllReduce64(b *testing.B) {
	c := mustLoad(b, "10000xdgx-h100/32")
	gang := seq(8000, 64)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		_ = c.AllReduceTime(gang, gib, Best)
	}
}
