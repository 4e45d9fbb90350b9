package topology

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Fuzzing. The seeds run in every `go test`; explore further with, for example,
//
//	go test -run XXX -fuzz FuzzParseSpec -fuzztime 60s ./topology/
//	go test -run XXX -fuzz FuzzParseShorthand -fuzztime 60s ./topology/

// specSeeds are JSON specs that reach every part of the parser and validator: each
// built-in file, the example cluster, and small bad ones (names that climb out of a
// directory, numbers out of range, NaN-like literals, types of the wrong kind).
func specSeeds(f *testing.F) {
	f.Helper()
	for _, n := range BuiltinNames() {
		b, err := machineFiles.ReadFile("machines/" + n + ".json")
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	if b, err := os.ReadFile(filepath.Join("testdata", "example-cluster.json")); err == nil {
		f.Add(b)
	}
	for _, s := range []string{
		`{"gpus":[]}`, `{"machines":[{"type":"dgx-h100","count":2}]}`, `[]`, `{`, `null`, `{"gpus":null}`,
		`{"machines":[{"type":"gb200-nvl72","count":3,"rackSize":2}]}`,
		`{"nvlink":{"generation":3,"linkGBps":25,"fabric":"direct"},"gpus":[{"model":"a","memoryMiB":1,"nvlinks":[{"peer":1,"count":1}]},{"model":"a","memoryMiB":1,"nvlinks":[{"peer":0,"count":1}]}]}`,
		`{"gpus":[{"model":"a","memoryMiB":81920,"mig":{"enabled":true,"instances":[{"profile":"7g.80gb"}]}}]}`,
		`{"machineTypes":{"../../../tmp/x/victim":{"gpus":[{"model":"a","memoryMiB":1}]}},"machines":[{"type":"../../../tmp/x/victim"}]}`,
		`{"machineTypes":{"a":{"name":"../b","gpus":[{"model":"a","memoryMiB":1}]}},"machines":[{"type":"a"}]}`,
		`{"machines":[{"type":"dgx-h100","count":2305843009213693952}]}`,
		`{"machines":[{"type":"dgx-h100","count":131073}]}`,
		`{"machines":[{"type":"dgx-h100","count":1e12}]}`,
		`{"machines":[{"type":"dgx-h100","count":-1,"rackSize":-1}]}`,
		`{"machines":[{"type":"dgx-h100"}],"network":{"oversubscription":1e400,"leafLatencyUs":-1}}`,
		`{"gpus":[{"model":"a","memoryMiB":1e15,"numa":-1,"nvswitchLinks":99}]}`,
		`{"nics":[{"name":"n","speedGbps":0}],"gpus":[{"model":"a","memoryMiB":1}]}`,
		`{"machines":[{"machine":{"nvlink":{"generation":5,"linkGBps":50,"fabric":"rack"},"nvlinkDomainSize":2,"gpus":[{"model":"a","memoryMiB":1,"nvswitchLinks":1}]},"count":5}]}`,
	} {
		f.Add([]byte(s))
	}
}

// FuzzParseSpec: no input makes ParseSpec or Build panic, run out of memory or accept
// something that breaks the documented bounds; what it accepts builds, every name stays in
// its directory, and the model answers with finite, non-negative times.
func FuzzParseSpec(f *testing.F) {
	specSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		spec, err := ParseSpec(data, "fuzz.json")
		if err != nil {
			if !errors.Is(err, ErrSyntax) && !errors.Is(err, ErrInvalidSpec) {
				t.Fatalf("error wraps no sentinel: %v", err)
			}
			if !strings.Contains(err.Error(), "fuzz.json") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		n := 0
		for _, g := range spec.Machines {
			n += max(g.Count, 18)
		}
		if n > 2000 {
			return // valid but large: building it only costs time
		}
		c, err := Build(spec)
		if err != nil {
			t.Fatalf("ParseSpec accepted a spec that Build refuses: %v", err)
		}
		checkCluster(t, c)
	})
}

// FuzzParseShorthand: no shorthand panics or exhausts memory; what parses builds within
// the bounds.
func FuzzParseShorthand(f *testing.F) {
	for _, s := range []string{
		"dgx-h100", "64xdgx-h100/8", "16xdgx-h100/8+8xpcie-l40s-8", "36xgb200-nvl72/9", "a+b", "x/", "+", "4x..",
		"9999999999999999999xdgx-h100", "2305843009213693952xdgx-h100", "1e12xdgx-h100", "4xdgx-h100/0",
		"131073xdgx-h100", "-4xdgx-h100", "4 x dgx-h100 / 8", "4x../../x",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		spec, err := ParseShorthand(s)
		if err != nil {
			if !errors.Is(err, ErrShorthand) && !errors.Is(err, ErrUnknownMachine) && !errors.Is(err, ErrInvalidSpec) {
				t.Fatalf("error wraps no sentinel: %v", err)
			}
			return
		}
		total := 0
		for _, g := range spec.Machines {
			if g.Count < 0 || g.Count > MaxGPUs || g.RackSize < 0 || g.RackSize > MaxGPUs {
				t.Fatalf("%q: group %+v out of bounds", s, g)
			}
			total += max(g.Count, 18)
		}
		if total > 2000 {
			return
		}
		c, err := Build(spec)
		if err != nil {
			t.Fatalf("%q: ParseShorthand accepted what Build refuses: %v", s, err)
		}
		checkCluster(t, c)
	})
}

// checkCluster checks what holds for every built cluster.
func checkCluster(t *testing.T, c *Cluster) {
	t.Helper()
	if c.NumGPUs() > MaxGPUs {
		t.Fatalf("%d GPUs", c.NumGPUs())
	}
	for _, m := range c.Machines {
		if !filepath.IsLocal(m.Name) || filepath.Base(m.Name) != m.Name {
			t.Fatalf("machine name %q leaves its directory", m.Name)
		}
	}
	for i := 0; i < c.NumGPUs() && i < 16; i++ {
		l := c.Link(0, i)
		if math.IsNaN(l.GBps) || math.IsInf(l.GBps, 0) || l.GBps < 0 || l.Latency < 0 {
			t.Fatalf("Link(0, %d) = %+v", i, l)
		}
		_ = c.IslandOf(i)
	}
	if c.NumGPUs() >= 2 {
		ids := []int{0, c.NumGPUs() - 1}
		for _, a := range append(Algos(), Best) {
			e := c.AllReduce(ids, 1<<20, a)
			if e.Time < 0 || math.IsNaN(e.BusBWGBps) || math.IsInf(e.BusBWGBps, 0) {
				t.Fatalf("AllReduce %v = %+v", a, e)
			}
		}
		_ = c.DescribePlacement(ids)
	}
}
