package topology

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestSummaryJSON(t *testing.T) {
	for _, name := range append(BuiltinNames(), "4xdgx-h100/2") {
		t.Run(name, func(t *testing.T) {
			c := mustLoad(t, name)
			raw, err := json.Marshal(c.Summary())
			if err != nil {
				t.Fatal(err)
			}
			var got struct {
				Machines  int     `json:"machines"`
				GPUs      int     `json:"gpus"`
				Islands   [][]int `json:"islands"`
				AllReduce []struct {
					Algo      string  `json:"algo"`
					Requested string  `json:"requested"`
					Bytes     int64   `json:"bytes"`
					BusBWGBps float64 `json:"busbwGBps"`
				} `json:"allreduce"`
			}
			if err := json.Unmarshal(raw, &got); err != nil {
				t.Fatal(err)
			}
			if got.Machines != len(c.Machines) || got.GPUs != c.NumGPUs() || len(got.Islands) != len(c.Islands()) {
				t.Fatalf("summary %+v", got)
			}
			if len(got.AllReduce) == 0 {
				t.Fatal("no allreduce estimates")
			}
			algos := map[string]bool{}
			for _, e := range got.AllReduce {
				algos[e.Algo] = true
				algos[e.Requested] = true
				if e.BusBWGBps <= 0 {
					t.Errorf("estimate %+v has no bus bandwidth", e)
				}
			}
			for _, a := range []string{"ring", "tree", "hierarchical", "best"} {
				if !algos[a] {
					t.Errorf("no %s estimate", a)
				}
			}
		})
	}
}

func TestWriteTextAndDOT(t *testing.T) {
	c := mustLoad(t, "a100-pcie-nvlink-pairs")
	var b bytes.Buffer
	if err := c.WriteText(&b, 0); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"4 NVLink island(s)", "4 of 2 GPU(s)", "island 3: GPUs 6-7", "NV12", "SYS", "nvlink", "cross-socket", "mlx5_0*", "AllReduce over machine"} {
		if !strings.Contains(out, want) {
			t.Errorf("text output lacks %q:\n%s", want, out)
		}
	}
	b.Reset()
	if err := mustLoad(t, "gb200-nvl72").WriteDOT(&b, 0); err != nil {
		t.Fatal(err)
	}
	dot := b.String()
	if !strings.HasPrefix(dot, "graph ") || strings.Count(dot, "-- r0") != 72 || !strings.HasSuffix(dot, "}\n") {
		t.Errorf("dot output:\n%s", dot[:min(len(dot), 2000)])
	}
	if got := ranges([]int{0, 1, 2, 5, 7, 8}); got != "0-2,5,7-8" {
		t.Errorf("ranges = %q", got)
	}
	if got := compactList([]string{"a", "a", "b"}); got != "2xa,b" {
		t.Errorf("compactList = %q", got)
	}
}
