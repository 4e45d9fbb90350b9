package topology

import "time"

// HostLinks are the costs of a collective between processes on the host CPUs (the
// fallback when a gang's collectives do not run on its GPUs): the alpha-beta model of the
// same algorithms, with a machine's shared memory and its network link as the tiers.
type HostLinks struct {
	// SharedMemGBps is the bandwidth of one process's copy or sum through its machine's
	// shared memory (a memory-bound loop on one core).
	SharedMemGBps float64
	// LoopbackGBps is the bandwidth of a connection between two processes of one machine
	// (a socket: the kernel copies twice).
	LoopbackGBps float64
	// LinkGBps is the bandwidth of a connection that leaves a machine, after its
	// encryption (mutual TLS on links between machines).
	LinkGBps float64
	// StepLatency is the latency of one message between processes (a ring's step);
	// BarrierLatency that of a shared-memory barrier of a machine's processes.
	StepLatency, BarrierLatency time.Duration
}

// DefaultHostLinks are costs measured on the development machines (2026-12-02: an x86
// core copies about 5 GB/s, AES-GCM runs at about 2 GB/s a core, a loopback socket moves
// about 2 GB/s, an actor message between processes takes about 200 µs).
func DefaultHostLinks() HostLinks {
	return HostLinks{SharedMemGBps: 5, LoopbackGBps: 2, LinkGBps: 1.25,
		StepLatency: 200 * time.Microsecond, BarrierLatency: 20 * time.Microsecond}
}

// HostAllReduceTime estimates an AllReduce of bytes between processes placed
// perMachine[g] to machine g, one process each member:
//
//   - Ring: every member in one ring (rank order); 2(n-1) steps of bytes/n, each at the
//     slowest hop's bandwidth (the link when the ring leaves a machine, else loopback).
//   - Hierarchical: a machine's members copy in, sum 1/L each and copy out through
//     shared memory (four barriers), and the machines' leaders run the ring between
//     machines: 2(M-1) steps of bytes/M over the link.
//
// Other algorithms are Unreachable; Best is the faster of the two. Members alone on
// their machine make the hierarchy a ring with extra copies: the model says so.
func HostAllReduceTime(perMachine []int, bytes int64, algo Algo, l HostLinks) time.Duration {
	n, most := 0, 0
	for _, k := range perMachine {
		n += k
		most = max(most, k)
	}
	m := len(perMachine)
	if n <= 1 {
		return 0
	}
	b := float64(bytes)
	ringOf := func(k int, gbps float64) time.Duration {
		if k <= 1 {
			return 0
		}
		steps := float64(2 * (k - 1))
		return time.Duration(steps*float64(l.StepLatency)) + secs(steps*b/float64(k)/(gbps*1e9))
	}
	switch algo {
	case Ring:
		bw := l.LoopbackGBps
		if m > 1 {
			bw = min(bw, l.LinkGBps)
		}
		return ringOf(n, bw)
	case Hierarchical:
		local := 4*l.BarrierLatency + secs((2*b+b*float64(most-1)/float64(most))/(l.SharedMemGBps*1e9))
		return local + ringOf(m, l.LinkGBps)
	case Best:
		return min(HostAllReduceTime(perMachine, bytes, Ring, l), HostAllReduceTime(perMachine, bytes, Hierarchical, l))
	}
	return Unreachable
}
