package agent

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/atoll-run/atoll/runtime/api"
)

func TestParseCPU(t *testing.T) {
	cases := []struct {
		name        string
		in          string
		busy, total uint64
		ok          bool
	}{
		{name: "idle and iowait are not busy", in: "cpu  10 1 5 80 4 0 0 0 0 0\ncpu0 1 1 1 1 1\n", busy: 16, total: 100, ok: true},
		{name: "no iowait column: idle alone", in: "cpu 10 0 10 80\n", busy: 20, total: 100, ok: true},
		{name: "fewer than four counters", in: "cpu 1 2 3\n"},
		{name: "not the cpu line first", in: "cpu0 1 2 3 4 5\n"},
		{name: "a counter that is not a number", in: "cpu 1 2 x 4 5\n"},
		{name: "empty", in: ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			busy, total, ok := parseCPU(strings.NewReader(c.in))
			if busy != c.busy || total != c.total || ok != c.ok {
				t.Errorf("got %d %d %v, want %d %d %v", busy, total, ok, c.busy, c.total, c.ok)
			}
		})
	}
}

func TestParseMem(t *testing.T) {
	cases := []struct {
		name string
		in   string
		want float64
		ok   bool
	}{
		{name: "total less available", in: "MemTotal:       1000 kB\nMemFree:         100 kB\nMemAvailable:    250 kB\n", want: 0.75, ok: true},
		{name: "no available line: all in use", in: "MemTotal: 1000 kB\n", want: 1, ok: true},
		{name: "no total", in: "MemAvailable: 10 kB\n"},
		{name: "garbage lines are skipped", in: "junk\nMemTotal: x kB\nMemTotal: 200 kB\nMemAvailable: 100 kB\n", want: 0.5, ok: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, ok := parseMem(strings.NewReader(c.in))
			if got != c.want || ok != c.ok {
				t.Errorf("got %v %v, want %v %v", got, ok, c.want, c.ok)
			}
		})
	}
}

func TestParseNet(t *testing.T) {
	const head = "Inter-|   Receive                                                |  Transmit\n" +
		" face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n"
	cases := []struct {
		name string
		in   string
		want uint64
	}{
		{name: "loopback aside, received plus sent", in: head +
			"    lo: 5000 10 0 0 0 0 0 0 5000 10 0 0 0 0 0 0\n" +
			"  eth0: 100 1 0 0 0 0 0 0 20 1 0 0 0 0 0 0\n" +
			"  eth1: 1 1 0 0 0 0 0 0 2 1 0 0 0 0 0 0\n", want: 123},
		{name: "short and unreadable lines are skipped", in: head + "  eth0: 1 2 3\n  eth1: x 1 0 0 0 0 0 0 2 1 0 0 0 0 0 0\n  eth2: 7 0 0 0 0 0 0 0 3\n", want: 10},
		{name: "no interfaces", in: head},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got, ok := parseNet(strings.NewReader(c.in)); got != c.want || !ok {
				t.Errorf("got %d %v, want %d", got, ok, c.want)
			}
		})
	}
}

// TestLoadSamplerNext feeds the sampler a sequence of readings, one second apart.
func TestLoadSamplerNext(t *testing.T) {
	at := time.Unix(100, 0)
	cpu := func(busy, total uint64) procReading { return procReading{busy: busy, total: total, cpuOK: true} }
	steps := []struct {
		name string
		r    procReading
		dt   time.Duration
		want api.Load
	}{
		{name: "first reading: no deltas yet", r: procReading{busy: 50, total: 100, cpuOK: true, mem: 0.4, memOK: true, net: 1000, netOK: true},
			want: api.Load{Mem: 0.4}},
		{name: "a quarter of the new jiffies busy; net over one second", r: procReading{busy: 75, total: 200, cpuOK: true, net: 1000 + netCapacity/2, netOK: true},
			dt: time.Second, want: api.Load{CPU: 0.25, Net: 0.5}},
		{name: "net past its capacity is full use", r: procReading{net: 1000 + netCapacity/2 + 4*netCapacity, netOK: true},
			dt: 2 * time.Second, want: api.Load{Net: 1}},
		{name: "a counter that went back gives no delta", r: procReading{busy: 10, total: 150, cpuOK: true, net: 10, netOK: true},
			dt: time.Second, want: api.Load{}},
		{name: "after which deltas resume", r: cpu(160, 350), dt: time.Second, want: api.Load{CPU: 0.75}},
		{name: "a reading at the same instant has no net rate", r: procReading{net: 10 + netCapacity, netOK: true}, want: api.Load{}},
		{name: "memory out of range is clamped", r: procReading{mem: 1.5, memOK: true}, dt: time.Second, want: api.Load{Mem: 1}},
		{name: "NaN memory is 0", r: procReading{mem: math.NaN(), memOK: true}, dt: time.Second, want: api.Load{}},
	}
	s := newLoadSampler()
	for _, st := range steps {
		at = at.Add(st.dt)
		if got := s.next(st.r, at); got != st.want {
			t.Fatalf("%s: load %+v, want %+v", st.name, got, st.want)
		}
	}
}

func TestHeldShare(t *testing.T) {
	cases := []struct {
		held, n int
		want    float64
	}{{0, 8, 0}, {2, 8, 0.25}, {8, 8, 1}, {10, 8, 1}, {3, 0, 0}}
	for _, c := range cases {
		if got := heldShare(c.held, c.n); got != c.want {
			t.Errorf("heldShare(%d, %d) = %v, want %v", c.held, c.n, got, c.want)
		}
	}
	a := &Agent{workers: map[string]*worker{
		"j/a/0": {spec: api.WorkerSpec{Member: api.Member{GPUs: []int{0, 1}}}},
		"j/a/1": {spec: api.WorkerSpec{Member: api.Member{GPUs: []int{2}}}},
		"j/b/0": {spec: api.WorkerSpec{}},
	}}
	if got := a.heldGPUsLocked(); got != 3 {
		t.Errorf("held %d cards, want 3", got)
	}
}

// TestReportFailuresLogged: the first of a run of failed load reports is logged as a
// warning, the others are not, and the first report that arrives after them says how many
// failed and for how long.
func TestReportFailuresLogged(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	log := zap.New(core)
	var f reportFailures
	t0 := time.Now()
	f.note(log, t0, nil)
	for i := range 3 {
		f.note(log, t0.Add(time.Duration(i)*time.Second), errors.New("api: unavailable"))
	}
	f.note(log, t0.Add(3*time.Second), nil)
	f.note(log, t0.Add(4*time.Second), nil)
	var got []string
	for _, e := range logs.All() {
		got = append(got, e.Message)
	}
	if len(got) != 2 || !strings.HasPrefix(got[0], "a load report failed") || got[1] != "load reports reach the leader again" {
		t.Fatalf("logged %q, want one warning for the run of failures and one line when reports arrive again", got)
	}
	if n := logs.All()[1].ContextMap()["failed"]; n != int64(3) {
		t.Fatalf("failed = %v, want 3", n)
	}
}
