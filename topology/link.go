package topology

import (
	"fmt"
	"time"
)

// Tier is the kind of path between two GPUs, from closest to farthest. The names follow
// `nvidia-smi topo -m` where they can (PIX, PHB/NODE, SYS).
type Tier int

// Tiers, closest first.
const (
	// TierUnknown is the zero value: an id out of range.
	TierUnknown Tier = iota
	// TierSelf is a GPU and itself.
	TierSelf
	// TierNVLink is a bundle of direct NVLinks (bridge or mesh).
	TierNVLink
	// TierNVSwitch is NVLink through NVSwitch chips, inside a machine or across a rack
	// fabric (GB200 NVL72).
	TierNVSwitch
	// TierPCIeSwitch is PCIe through one PCIe switch (nvidia-smi "PIX"/"PXB").
	TierPCIeSwitch
	// TierPCIeHostBridge is PCIe through the CPU's root complex on one NUMA node ("PHB"/"NODE").
	TierPCIeHostBridge
	// TierCrossSocket is PCIe across the CPU interconnect between sockets ("SYS").
	TierCrossSocket
	// TierNetLeaf is the network between machines under the same leaf (rack) switch.
	TierNetLeaf
	// TierNetSpine is the network between racks, through the spine.
	TierNetSpine
)

var tierNames = [...]string{"unknown", "self", "nvlink", "nvswitch", "pcie-switch", "pcie-host-bridge", "cross-socket", "net-leaf", "net-spine"}

// String returns the tier's name, e.g. "nvswitch".
func (t Tier) String() string {
	if t < 0 || int(t) >= len(tierNames) {
		return fmt.Sprintf("tier(%d)", int(t))
	}
	return tierNames[t]
}

// MarshalText writes the tier's name (so JSON shows "nvswitch", not 3).
func (t Tier) MarshalText() ([]byte, error) { return []byte(t.String()), nil }

// UnmarshalText reads a tier name.
func (t *Tier) UnmarshalText(b []byte) error {
	for i, n := range tierNames {
		if n == string(b) {
			*t = Tier(i)
			return nil
		}
	}
	return fmt.Errorf("topology: unknown tier %q", b)
}

// IsNVLink reports whether the tier is NVLink (direct or switched): the GPUs share an island.
func (t Tier) IsNVLink() bool { return t == TierNVLink || t == TierNVSwitch }

// LinkInfo describes the path between two GPUs.
type LinkInfo struct {
	// Tier is the kind of path.
	Tier Tier `json:"tier"`
	// GBps is the path's bandwidth in one direction, GB/s (10^9 bytes/s), before protocol
	// efficiency: the NVLink line rate, PCIe rate (reduced for host-bridge and cross-socket
	// paths), or NIC rate (divided by the oversubscription across the spine).
	GBps float64 `json:"gbps"`
	// Latency is the one-way latency of one step over the path, as NCCL sees it.
	Latency time.Duration `json:"latencyNs"`
	// Links is the number of NVLinks in the path, for NVLink tiers.
	Links int `json:"links,omitempty"`
	// CrossMachine says the GPUs are on different machines.
	CrossMachine bool `json:"crossMachine,omitempty"`
}

// ModelParams tunes the bandwidth model. DefaultModelParams gives values taken from
// published measurements (see the comments); Cluster.WithModel changes them.
type ModelParams struct {
	// NVLinkEfficiency is the fraction of the NVLink line rate NCCL's ring achieves. 0.82:
	// "450GB/s is the line rate. With the protocol overhead (~20%) NCCL can get an effective
	// NVLink bandwidth of 370GB/s" (S. Jeaugey, NVIDIA, github.com/NVIDIA/nccl-tests/issues/212).
	NVLinkEfficiency float64
	// NVLSEfficiency is the AllReduce algorithm bandwidth of NVLink SHARP (in-switch
	// reduction) as a fraction of the per-GPU line rate. 0.61: "On 8 GPUs, you should reach a
	// peak busBw of ~480GB/s (algbw ~275GB/s)" on H100, whose line rate is 450 GB/s (same source).
	NVLSEfficiency float64
	// PCIeEfficiency is the fraction of the PCIe rate achieved (TLP/DLLP overhead, ~0.8).
	PCIeEfficiency float64
	// NetEfficiency is the fraction of NIC line rate achieved by NCCL over RDMA (~0.9).
	NetEfficiency float64
	// HostBridgeFactor scales PCIe bandwidth for peer traffic through the root complex.
	HostBridgeFactor float64
	// CrossSocketFactor scales PCIe bandwidth for peer traffic across sockets (P2P over
	// UPI/xGMI is often disabled or slow, traffic bounces through host memory).
	CrossSocketFactor float64
	// NoNICGbps is the speed assumed for a machine without a declared NIC.
	NoNICGbps float64
	// RingBaseLatencyUs, TreeBaseLatencyUs and NVLSBaseLatencyUs are each algorithm's fixed
	// cost per AllReduce, microseconds. Ring 3.6 and tree 4.4 are NCCL's own tuning-model
	// base latencies for the LL protocol (NCCL src/include/tuning.h, baseLat); NVLS runs only
	// the Simple protocol, so it gets NCCL's Simple ring base, 8.4 (an assumption).
	RingBaseLatencyUs, TreeBaseLatencyUs, NVLSBaseLatencyUs float64
	// Per-step (per-hop) latencies, microseconds. NVLink 0.5 and network 2.7 follow NCCL's
	// hwLat for the LL protocol (0.47 NVLink, 2.7 network); the PCIe values sit between.
	NVLinkLatencyUs, NVSwitchLatencyUs, PCIeSwitchLatencyUs, HostBridgeLatencyUs, CrossSocketLatencyUs float64
	// LeafLatencyUs and SpineLatencyUs are used when the cluster's NetworkSpec leaves them 0.
	LeafLatencyUs, SpineLatencyUs float64
}

// DefaultModelParams returns the calibrated defaults.
func DefaultModelParams() ModelParams {
	return ModelParams{
		NVLinkEfficiency:     0.82,
		NVLSEfficiency:       0.61,
		PCIeEfficiency:       0.80,
		NetEfficiency:        0.90,
		HostBridgeFactor:     0.90,
		CrossSocketFactor:    0.50,
		NoNICGbps:            10,
		RingBaseLatencyUs:    3.6,
		TreeBaseLatencyUs:    4.4,
		NVLSBaseLatencyUs:    8.4,
		NVLinkLatencyUs:      0.5,
		NVSwitchLatencyUs:    0.5,
		PCIeSwitchLatencyUs:  1.0,
		HostBridgeLatencyUs:  1.2,
		CrossSocketLatencyUs: 1.5,
		LeafLatencyUs:        2.7,
		SpineLatencyUs:       3.5,
	}
}

// Validate rejects efficiencies outside (0,1] and negative latencies.
func (p ModelParams) Validate() error {
	type field struct {
		name string
		v    float64
	}
	for _, f := range []field{
		{"NVLinkEfficiency", p.NVLinkEfficiency}, {"NVLSEfficiency", p.NVLSEfficiency}, {"PCIeEfficiency", p.PCIeEfficiency},
		{"NetEfficiency", p.NetEfficiency}, {"HostBridgeFactor", p.HostBridgeFactor}, {"CrossSocketFactor", p.CrossSocketFactor},
	} {
		if !(f.v > 0 && f.v <= 1) {
			return fmt.Errorf("topology: model %s = %v, want 0 < x <= 1: %w", f.name, f.v, ErrInvalidSpec)
		}
	}
	for _, f := range []field{
		{"RingBaseLatencyUs", p.RingBaseLatencyUs}, {"TreeBaseLatencyUs", p.TreeBaseLatencyUs}, {"NVLSBaseLatencyUs", p.NVLSBaseLatencyUs},
		{"NVLinkLatencyUs", p.NVLinkLatencyUs}, {"NVSwitchLatencyUs", p.NVSwitchLatencyUs}, {"PCIeSwitchLatencyUs", p.PCIeSwitchLatencyUs},
		{"HostBridgeLatencyUs", p.HostBridgeLatencyUs}, {"CrossSocketLatencyUs", p.CrossSocketLatencyUs},
		{"LeafLatencyUs", p.LeafLatencyUs}, {"SpineLatencyUs", p.SpineLatencyUs},
	} {
		if !(f.v >= 0 && f.v <= maxLatencyUs) {
			return fmt.Errorf("topology: model %s = %v, want 0 <= x <= %v: %w", f.name, f.v, maxLatencyUs, ErrInvalidSpec)
		}
	}
	if !(p.NoNICGbps > 0 && p.NoNICGbps <= maxNICGbps) {
		return fmt.Errorf("topology: model NoNICGbps = %v, want 0 < x <= %d: %w", p.NoNICGbps, maxNICGbps, ErrInvalidSpec)
	}
	return nil
}

func us(v float64) time.Duration { return time.Duration(v * float64(time.Microsecond)) }

// efficiency is the achievable fraction of a tier's bandwidth.
func (p ModelParams) efficiency(t Tier) float64 {
	switch t {
	case TierNVLink, TierNVSwitch:
		return p.NVLinkEfficiency
	case TierPCIeSwitch, TierPCIeHostBridge, TierCrossSocket:
		return p.PCIeEfficiency
	case TierNetLeaf, TierNetSpine:
		return p.NetEfficiency
	}
	return 1
}

// Link returns the path between two GPUs given by global id. It is O(1): inside a machine it
// reads the machine type's precomputed table; across machines it derives the path from the
// rack layout and the GPUs' nearest NICs. Unknown ids give a zero LinkInfo (TierUnknown).
func (c *Cluster) Link(a, b int) LinkInfo {
	if a < 0 || b < 0 || a >= len(c.loc) || b >= len(c.loc) {
		return LinkInfo{}
	}
	if a == b {
		return LinkInfo{Tier: TierSelf}
	}
	// Only the compact per-GPU and per-machine arrays are read, so a call touches a few
	// cache lines whatever the cluster's size.
	la, lb := c.loc[a], c.loc[b]
	ma, mb := &c.mach[la.machine], &c.mach[lb.machine]
	p := &c.model
	if la.machine == lb.machine {
		l := ma.mt.local[int(la.index)*ma.mt.n+int(lb.index)]
		switch l.Tier {
		case TierNVLink:
			l.Latency = us(p.NVLinkLatencyUs)
		case TierNVSwitch:
			l.Latency = us(p.NVSwitchLatencyUs)
		case TierPCIeSwitch:
			l.Latency = us(p.PCIeSwitchLatencyUs)
		case TierPCIeHostBridge:
			l.GBps *= p.HostBridgeFactor
			l.Latency = us(p.HostBridgeLatencyUs)
		case TierCrossSocket:
			l.GBps *= p.CrossSocketFactor
			l.Latency = us(p.CrossSocketLatencyUs)
		}
		return l
	}
	if ma.rack == mb.rack && ma.rackDomain && ma.mt.rackPort[la.index] && mb.mt.rackPort[lb.index] {
		links := min(ma.mt.spec.GPUs[la.index].NVSwitchLinks, mb.mt.spec.GPUs[lb.index].NVSwitchLinks)
		bw := float64(links) * min(ma.mt.spec.NVLink.LinkGBps, mb.mt.spec.NVLink.LinkGBps)
		return LinkInfo{Tier: TierNVSwitch, GBps: bw, Latency: us(p.NVSwitchLatencyUs), Links: links, CrossMachine: true}
	}
	bw := min(c.nicGBpsOf(ma.mt, int(la.index)), c.nicGBpsOf(mb.mt, int(lb.index)))
	if ma.rack == mb.rack {
		return LinkInfo{Tier: TierNetLeaf, GBps: bw, Latency: us(c.Network.LeafLatencyUs), CrossMachine: true}
	}
	return LinkInfo{Tier: TierNetSpine, GBps: bw / c.Network.Oversubscription, Latency: us(c.Network.SpineLatencyUs), CrossMachine: true}
}

// nicGBpsOf is the bandwidth of a GPU's nearest NIC.
func (c *Cluster) nicGBpsOf(mt *machineType, local int) float64 {
	if k := mt.nic[local]; k >= 0 {
		return mt.nicGBps[k]
	}
	return c.model.NoNICGbps / 8
}
