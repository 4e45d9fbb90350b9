package topoview

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/atoll-run/atoll/topology"
)

func mustLoad(t *testing.T, spec string) *topology.Cluster {
	t.Helper()
	c, err := topology.Load(spec)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestSummarize: counts, islands and every algorithm's estimate are there, and the summary
// encodes (the CLI's JSON contract is tested in cmd/atoll).
func TestSummarize(t *testing.T) {
	for _, name := range append(topology.BuiltinNames(), "4xdgx-h100/2", "16xdgx-h100/8+8xdgx-h100") {
		t.Run(name, func(t *testing.T) {
			c := mustLoad(t, name)
			s := Summarize(c)
			if s.Machines != len(c.Machines) || s.GPUs != c.NumGPUs() || len(s.Islands) != len(c.Islands()) || len(s.AllReduce) == 0 {
				t.Fatalf("summary %+v", s)
			}
			types := 0
			for _, mt := range s.MachineTypes {
				types += mt.Count
			}
			if types != len(c.Machines) {
				t.Fatalf("machine types count %d machines, want %d", types, len(c.Machines))
			}
			algos := map[string]bool{}
			for _, e := range s.AllReduce {
				algos[e.Algo.String()] = true
				algos[e.Requested.String()] = true
				if !(e.BusBWGBps > 0) {
					t.Errorf("estimate %+v has no bus bandwidth", e)
				}
			}
			for _, a := range []string{"ring", "tree", "hierarchical", "best"} {
				if !algos[a] {
					t.Errorf("no %s estimate", a)
				}
			}
			if _, err := json.Marshal(s); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestWriteTextAndDOT(t *testing.T) {
	c := mustLoad(t, "a100-pcie-nvlink-pairs")
	var b bytes.Buffer
	if err := WriteText(&b, c, 0); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"4 NVLink island(s)", "4 of 2 GPU(s)", "island 3: GPUs 6-7", "NV12", "SYS", "nvlink", "cross-socket", "mlx5_0*", "AllReduce over machine"} {
		if !strings.Contains(out, want) {
			t.Errorf("text output lacks %q:\n%s", want, out)
		}
	}
	b.Reset()
	if err := WriteDOT(&b, mustLoad(t, "gb200-nvl72"), 0); err != nil {
		t.Fatal(err)
	}
	dot := b.String()
	if !strings.HasPrefix(dot, "graph ") || strings.Count(dot, "-- r0") != 72 || !strings.HasSuffix(dot, "}\n") {
		t.Errorf("dot output:\n%s", dot[:min(len(dot), 2000)])
	}
	if got := compactList([]string{"a", "a", "b"}); got != "2xa,b" {
		t.Errorf("compactList = %q", got)
	}
}

// FuzzRender: every cluster a spec builds renders in all three forms without panicking.
// Seeds run in every `go test`; `go test -run XXX -fuzz FuzzRender ./internal/topoview/`
// explores further.
func FuzzRender(f *testing.F) {
	for _, s := range []string{
		`{"machines":[{"type":"dgx-a100-mig"},{"type":"gb200-nvl72","count":3,"rackSize":2},{"type":"pcie-l40s-8","count":2}]}`,
		`{"gpus":[]}`,
		`{"nics":[{"name":"a","speedGbps":1}],"gpus":[{"model":"x","memoryMiB":1,"mig":{"enabled":true}}]}`,
		`{"nvlink":{"generation":3,"linkGBps":25,"fabric":"direct"},"gpus":[{"model":"a","memoryMiB":1,"nvlinks":[{"peer":1,"count":1}]},{"model":"a","memoryMiB":1,"nvlinks":[{"peer":0,"count":1}]}]}`,
	} {
		f.Add([]byte(s), 3)
	}
	f.Fuzz(func(t *testing.T, data []byte, limit int) {
		spec, err := topology.ParseSpec(data, "fuzz.json")
		if err != nil {
			return
		}
		n := 0
		for _, g := range spec.Machines {
			n += max(g.Count, 18)
		}
		if n > 200 {
			return
		}
		c, err := topology.Build(spec)
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		if err := WriteText(&b, c, limit); err != nil {
			t.Fatal(err)
		}
		if err := WriteDOT(&b, c, limit); err != nil {
			t.Fatal(err)
		}
		if _, err := json.Marshal(Summarize(c)); err != nil {
			t.Fatal(err)
		}
	})
}
