package topology

import (
	"os"
	"testing"
)

// FuzzParseSpec: no input makes ParseSpec or Build panic. Seeds run in every `go test`;
// `go test -fuzz FuzzParseSpec ./topology/` explores further.
func FuzzParseSpec(f *testing.F) {
	if b, err := os.ReadFile("testdata/example-cluster.json"); err == nil {
		f.Add(b)
	}
	for _, s := range []string{
		`{"gpus":[]}`, `{"machines":[{"type":"dgx-h100","count":2}]}`, `[]`, `{`, `null`, `{"gpus":null}`,
		`{"machines":[{"type":"gb200-nvl72","count":3,"rackSize":2}]}`,
		`{"nvlink":{"generation":3,"linkGBps":25,"fabric":"direct"},"gpus":[{"model":"a","memoryMiB":1,"nvlinks":[{"peer":1,"count":1}]},{"model":"a","memoryMiB":1,"nvlinks":[{"peer":0,"count":1}]}]}`,
		`{"gpus":[{"model":"a","memoryMiB":81920,"mig":{"enabled":true,"instances":[{"profile":"7g.80gb"}]}}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		spec, err := ParseSpec(data, "fuzz.json")
		if err != nil {
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
			return
		}
		for i := 0; i < c.NumGPUs() && i < 16; i++ {
			_ = c.Link(0, i)
			_ = c.IslandOf(i)
		}
		_ = c.AllReduceTime([]int{0, c.NumGPUs() - 1}, 1<<20, Best)
		_ = c.Summary()
	})
}

func FuzzParseShorthand(f *testing.F) {
	for _, s := range []string{"dgx-h100", "64xdgx-h100/8", "a+b", "x/", "9999999999999999999xdgx-h100"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		_, _ = ParseShorthand(s)
	})
}
