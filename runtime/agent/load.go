package agent

import (
	"bufio"
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

func (s *loadSampler) sample() api.Load {
	var l api.Load
	now := time.Now()
	if busy, total, ok := readCPU(); ok {
		if s.lastTotal != 0 && total > s.lastTotal {
			l.CPU = float64(busy-s.lastBusy) / float64(total-s.lastTotal)
		}
		s.lastBusy, s.lastTotal = busy, total
	}
	if used, ok := readMem(); ok {
		l.Mem = used
	}
	if bytes, ok := readNet(); ok {
		if !s.lastAt.IsZero() && bytes >= s.lastNet {
			if dt := now.Sub(s.lastAt).Seconds(); dt > 0 {
				l.Net = min(1, float64(bytes-s.lastNet)/dt/netCapacity)
			}
		}
		s.lastNet = bytes
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

// readCPU reads the busy and total jiffies of all CPUs from /proc/stat.
func readCPU() (busy, total uint64, ok bool) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return 0, 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
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

// readMem reads the share of memory in use from /proc/meminfo.
func readMem() (float64, bool) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, false
	}
	defer f.Close()
	var total, avail float64
	sc := bufio.NewScanner(f)
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

// readNet sums the bytes received and sent by the machine's interfaces but loopback.
func readNet() (uint64, bool) {
	f, err := os.Open("/proc/net/dev")
	if err != nil {
		return 0, false
	}
	defer f.Close()
	var sum uint64
	sc := bufio.NewScanner(f)
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
