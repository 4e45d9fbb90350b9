package agent

import (
	"bufio"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/atoll-run/atoll/runtime/api"
)

// loadSampler measures the machine's CPU, memory and network use from /proc, as deltas
// between samples. Machines of the embedded default share one host, so they all report
// the host's load.
type loadSampler struct {
	lastBusy, lastTotal uint64
	lastNet             uint64
	lastAt              time.Time
}

func newLoadSampler() *loadSampler { return &loadSampler{} }

// netCapacity is the bytes/s taken as full use of the network when the NIC's speed is not
// known (10 Gb/s).
const netCapacity = 10e9 / 8

// procReading is one reading of the machine's counters; each ok says its file was read.
type procReading struct {
	busy, total uint64 // CPU jiffies, all CPUs
	cpuOK       bool
	mem         float64 // share of memory in use
	memOK       bool
	net         uint64 // bytes received and sent, loopback aside
	netOK       bool
}

// readProc reads /proc/stat, /proc/meminfo and /proc/net/dev.
func readProc() procReading {
	var r procReading
	withFile("/proc/stat", func(f io.Reader) { r.busy, r.total, r.cpuOK = parseCPU(f) })
	withFile("/proc/meminfo", func(f io.Reader) { r.mem, r.memOK = parseMem(f) })
	withFile("/proc/net/dev", func(f io.Reader) { r.net, r.netOK = parseNet(f) })
	return r
}

// withFile calls read with the file at path, when it opens.
func withFile(path string, read func(io.Reader)) {
	f, err := os.Open(path)
	if err != nil {
		return
	}
	defer f.Close()
	read(f)
}

func (s *loadSampler) sample() api.Load {
	now := time.Now()
	return s.next(readProc(), now)
}

// next turns a reading taken at now into a load, against the previous reading: CPU and
// network use are deltas (zero on the first reading, or when a counter went back), memory
// the reading's share.
func (s *loadSampler) next(r procReading, now time.Time) api.Load {
	var l api.Load
	if r.cpuOK {
		if s.lastTotal != 0 && r.total > s.lastTotal {
			l.CPU = float64(r.busy-s.lastBusy) / float64(r.total-s.lastTotal)
		}
		s.lastBusy, s.lastTotal = r.busy, r.total
	}
	if r.memOK {
		l.Mem = r.mem
	}
	if r.netOK {
		if !s.lastAt.IsZero() && r.net >= s.lastNet {
			if dt := now.Sub(s.lastAt).Seconds(); dt > 0 {
				l.Net = min(1, float64(r.net-s.lastNet)/dt/netCapacity)
			}
		}
		s.lastNet = r.net
	}
	s.lastAt = now
	l.CPU = clamp01(l.CPU)
	l.Mem = clamp01(l.Mem)
	return l
}

func clamp01(v float64) float64 {
	if !(v >= 0) {
		return 0
	}
	return min(v, 1)
}

// parseCPU reads the busy and total jiffies of all CPUs from /proc/stat's first line
// (idle and iowait are not busy).
func parseCPU(r io.Reader) (busy, total uint64, ok bool) {
	sc := bufio.NewScanner(r)
	if !sc.Scan() {
		return 0, 0, false
	}
	fields := strings.Fields(sc.Text())
	if len(fields) < 5 || fields[0] != "cpu" {
		return 0, 0, false
	}
	var v []uint64
	for _, x := range fields[1:] {
		n, err := strconv.ParseUint(x, 10, 64)
		if err != nil {
			return 0, 0, false
		}
		v = append(v, n)
		total += n
	}
	idle := v[3]
	if len(v) > 4 {
		idle += v[4] // iowait
	}
	return total - idle, total, true
}

// parseMem reads the share of memory in use from /proc/meminfo (false without MemTotal).
func parseMem(r io.Reader) (float64, bool) {
	var total, avail float64
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		n, err := strconv.ParseFloat(fields[1], 64)
		if err != nil {
			continue
		}
		switch fields[0] {
		case "MemTotal:":
			total = n
		case "MemAvailable:":
			avail = n
		}
	}
	if total == 0 {
		return 0, false
	}
	return (total - avail) / total, true
}

// parseNet sums the bytes received and sent by the interfaces of /proc/net/dev but
// loopback; lines it cannot read are skipped.
func parseNet(r io.Reader) (uint64, bool) {
	var sum uint64
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || strings.TrimSpace(name) == "lo" {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) < 9 {
			continue
		}
		rx, err1 := strconv.ParseUint(fields[0], 10, 64)
		tx, err2 := strconv.ParseUint(fields[8], 10, 64)
		if err1 == nil && err2 == nil {
			sum += rx + tx
		}
	}
	return sum, true
}
