package topology

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func mustLoad(t testing.TB, s string) *Cluster {
	t.Helper()
	c, err := Load(s)
	if err != nil {
		t.Fatalf("Load(%q): %v", s, err)
	}
	return c
}

func seq(from, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = from + i
	}
	return out
}

func TestIslandsOfEveryBuiltin(t *testing.T) {
	singles := func(n int) [][]int {
		var out [][]int
		for i := 0; i < n; i++ {
			out = append(out, []int{i})
		}
		return out
	}
	tests := []struct {
		name     string
		machines int
		gpus     int
		islands  [][]int
	}{
		{"dgx-a100", 1, 8, [][]int{seq(0, 8)}},
		{"dgx-h100", 1, 8, [][]int{seq(0, 8)}},
		{"hgx-h200", 1, 8, [][]int{seq(0, 8)}},
		{"pcie-l40s-8", 1, 8, singles(8)},
		{"a100-pcie-nvlink-pairs", 1, 8, [][]int{{0, 1}, {2, 3}, {4, 5}, {6, 7}}},
		{"gb200-nvl72", 18, 72, [][]int{seq(0, 72)}},
		{"dgx-a100-mig", 1, 8, [][]int{{0}, {1}, {2}, {3}, {4}, {5}, {6, 7}}},
	}
	covered := map[string]bool{}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			covered[tt.name] = true
			c := mustLoad(t, tt.name)
			if len(c.Machines) != tt.machines || c.NumGPUs() != tt.gpus {
				t.Fatalf("got %d machines, %d GPUs; want %d, %d", len(c.Machines), c.NumGPUs(), tt.machines, tt.gpus)
			}
			if got := c.Islands(); !reflect.DeepEqual(got, tt.islands) {
				t.Fatalf("islands = %v, want %v", got, tt.islands)
			}
			for k, isl := range c.Islands() {
				for _, g := range isl {
					if c.IslandOf(g) != k {
						t.Fatalf("IslandOf(%d) = %d, want %d", g, c.IslandOf(g), k)
					}
				}
			}
		})
	}
	for _, n := range BuiltinNames() {
		if !covered[n] {
			t.Errorf("built-in %q has no island test", n)
		}
	}
	if !slices.IsSorted(BuiltinNames()) {
		t.Errorf("BuiltinNames not sorted: %v", BuiltinNames())
	}
}

func TestMultiMachineIslands(t *testing.T) {
	c := mustLoad(t, "4xdgx-h100/2")
	if got := len(c.Islands()); got != 4 {
		t.Fatalf("4 DGX H100 have %d islands, want 4 (NVSwitch stops at the machine)", got)
	}
	if len(c.Racks) != 2 || c.Machines[1].Rack != 0 || c.Machines[2].Rack != 1 {
		t.Fatalf("racks = %+v", c.Racks)
	}
	// Two NVL72 domains of 18 trays: two islands of 72.
	c = mustLoad(t, "36xgb200-nvl72")
	if len(c.Islands()) != 2 || len(c.Islands()[0]) != 72 || c.Islands()[1][0] != 72 {
		t.Fatalf("36 trays: islands %d, sizes %d", len(c.Islands()), len(c.Islands()[0]))
	}
	// Half-populated rack (racks of 9): 4 islands of 36.
	c = mustLoad(t, "36xgb200-nvl72/9")
	if len(c.Islands()) != 4 || len(c.Islands()[0]) != 36 {
		t.Fatalf("racks of 9: %d islands", len(c.Islands()))
	}
	// A rack larger than the NVLink domain is refused.
	if _, err := Load("36xgb200-nvl72/36"); !errors.Is(err, ErrInvalidSpec) {
		t.Fatalf("rack of 36 NVL72 trays: err = %v, want ErrInvalidSpec", err)
	}
}

func TestShorthand(t *testing.T) {
	tests := []struct {
		in       string
		machines int
		racks    int
		err      error
	}{
		{"dgx-h100", 1, 1, nil},
		{"4xdgx-h100", 4, 1, nil},
		{"64xdgx-h100/8", 64, 8, nil},
		{"64 x dgx-h100/8", 64, 8, nil},
		{"16xdgx-h100/8+8xpcie-l40s-8", 24, 3, nil},
		{"gb200-nvl72", 18, 1, nil},
		{"", 0, 0, ErrShorthand},
		{"0xdgx-h100", 0, 0, ErrShorthand},
		{"4xdgx-h100/0", 0, 0, ErrShorthand},
		{"4xdgx-h999", 0, 0, ErrUnknownMachine},
		{"4x/8", 0, 0, ErrShorthand},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			c, err := Load(tt.in)
			if tt.err != nil {
				if !errors.Is(err, tt.err) {
					t.Fatalf("err = %v, want %v", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(c.Machines) != tt.machines || len(c.Racks) != tt.racks {
				t.Fatalf("machines %d racks %d, want %d %d", len(c.Machines), len(c.Racks), tt.machines, tt.racks)
			}
		})
	}
}

func TestUnknownMachineListsNames(t *testing.T) {
	_, err := BuiltinMachine("dgx-z900")
	if !errors.Is(err, ErrUnknownMachine) {
		t.Fatalf("err = %v", err)
	}
	for _, n := range BuiltinNames() {
		if !strings.Contains(err.Error(), n) {
			t.Errorf("error %q does not list %q", err, n)
		}
	}
}

func writeSpec(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "spec.json")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestSpecFileErrors(t *testing.T) {
	tests := []struct {
		name string
		body string
		err  error
		want []string // substrings of the message
	}{
		{"malformed JSON", "{\n  \"gpus\": [\n    {\"model\": \"x\",, }\n  ]\n}", ErrSyntax, []string{"spec.json:3:19", "invalid character"}},
		{"wrong type", "{\n  \"gpus\": [{\"model\": \"x\", \"memoryMiB\": \"lots\"}]\n}", ErrSyntax, []string{"spec.json:2:", "gpus.memoryMiB", "int64"}},
		{"unknown field", "{\n \"gpus\": [],\n \"gpuz\": 3\n}", ErrSyntax, []string{"spec.json:3:", `unknown field "gpuz"`}},
		{"neither", `{"name": "x"}`, ErrSyntax, []string{"neither"}},
		{"empty", "  ", ErrSyntax, []string{"empty"}},
		{"link to missing GPU", `{"name":"m","nvlink":{"generation":3,"linkGBps":25,"fabric":"direct"},
			"gpus":[{"model":"A","memoryMiB":1000,"nvlinks":[{"peer":5,"count":4}]},{"model":"A","memoryMiB":1000}]}`,
			ErrInvalidSpec, []string{"gpus[0].nvlinks[0].peer", "GPU 5 does not exist", "2 GPUs"}},
		{"asymmetric links", `{"name":"m","nvlink":{"generation":3,"linkGBps":25,"fabric":"direct"},
			"gpus":[{"model":"A","memoryMiB":1000,"nvlinks":[{"peer":1,"count":4}]},
			        {"model":"A","memoryMiB":1000,"nvlinks":[{"peer":0,"count":2}]}]}`,
			ErrInvalidSpec, []string{"asymmetric link count", "GPU 0 lists 4 link(s) to GPU 1, but GPU 1 lists 2 back"}},
		{"one-sided link", `{"name":"m","nvlink":{"generation":3,"linkGBps":25,"fabric":"direct"},
			"gpus":[{"model":"A","memoryMiB":1000,"nvlinks":[{"peer":1,"count":4}]},{"model":"A","memoryMiB":1000}]}`,
			ErrInvalidSpec, []string{"GPU 1 lists 0 back"}},
		{"self link", `{"nvlink":{"generation":3,"linkGBps":25,"fabric":"direct"},"gpus":[{"model":"A","memoryMiB":1,"nvlinks":[{"peer":0,"count":1}]}]}`,
			ErrInvalidSpec, []string{"cannot link to itself"}},
		{"links without nvlink", `{"gpus":[{"model":"A","memoryMiB":1,"nvlinks":[{"peer":1,"count":1}]},{"model":"A","memoryMiB":1,"nvlinks":[{"peer":0,"count":1}]}]}`,
			ErrInvalidSpec, []string{"no nvlink section"}},
		{"bad fabric", `{"nvlink":{"generation":3,"linkGBps":25,"fabric":"mesh"},"gpus":[]}`, ErrInvalidSpec, []string{"nvlink.fabric", `"mesh"`}},
		{"unknown switch", `{"gpus":[{"model":"A","memoryMiB":1,"pcieSwitch":"sw9"}]}`, ErrInvalidSpec, []string{"gpus[0].pcieSwitch", "sw9"}},
		{"bad MIG", `{"gpus":[{"model":"A","memoryMiB":81920,"mig":{"enabled":true,"instances":[{"profile":"4g.40gb"},{"profile":"4g.40gb"}]}}]}`,
			ErrInvalidSpec, []string{"8 compute slices"}},
		{"MIG typo", `{"gpus":[{"model":"A","memoryMiB":81920,"mig":{"enabled":true,"instances":[{"profile":"1g10gb"}]}}]}`,
			ErrInvalidSpec, []string{"instances[0].profile"}},
		{"unknown machine type", `{"machines":[{"type":"dgx-h100"},{"type":"dgx-h999","count":2}]}`,
			ErrInvalidSpec, []string{"machines[1]", "dgx-h999", "unknown machine type", "dgx-a100"}},
		{"unknown machine type is ErrUnknownMachine too", `{"machines":[{"type":"dgx-h999"}]}`,
			ErrUnknownMachine, []string{"spec.json:1:14: machines[0]: machine type \"dgx-h999\": unknown machine type"}},
		{"type and inline", `{"machines":[{"type":"dgx-h100","machine":{"gpus":[]}}]}`, ErrInvalidSpec, []string{"machines[0]", "not both"}},
		{"bad index", `{"gpus":[{"model":"A","memoryMiB":1},{"index":7,"model":"A","memoryMiB":1}]}`, ErrInvalidSpec, []string{"gpus[1].index", "is 7"}},
		{"missing memory", `{"gpus":[{"model":"A"}]}`, ErrInvalidSpec, []string{"gpus[0].memoryMiB"}},
		{"machine type error path", `{"machineTypes":{"box":{"gpus":[{"model":""}]}},"machines":[{"type":"box"}]}`,
			ErrInvalidSpec, []string{"machineTypes.box.gpus[0].model"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := writeSpec(t, tt.body)
			_, err := ParseSpecFile(p)
			if err == nil {
				t.Fatal("no error")
			}
			if !errors.Is(err, tt.err) {
				t.Fatalf("err = %v, want %v", err, tt.err)
			}
			if !strings.Contains(err.Error(), p) && !strings.Contains(err.Error(), "spec.json") {
				t.Errorf("error %q does not name the file", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			// Load must report the same error for a file.
			if _, lerr := Load(p); !errors.Is(lerr, tt.err) {
				t.Errorf("Load err = %v", lerr)
			}
		})
	}
}

func TestSpecFileRoundTrip(t *testing.T) {
	p := writeSpec(t, `{
  "name": "lab",
  "machineTypes": {
    "box": {
      "nvlink": {"generation": 4, "linkGBps": 25, "fabric": "direct"},
      "numaNodes": [{"id": 0, "cpus": 32}],
      "pcieSwitches": [{"id": "s0", "numa": 0}],
      "nics": [{"name": "mlx5_0", "rdma": true, "speedGbps": 200, "numa": 0, "pcieSwitch": "s0"}],
      "gpus": [
        {"model": "H100 PCIe", "memoryMiB": 81559, "pcieSwitch": "s0", "nvlinks": [{"peer": 1, "count": 6}]},
        {"model": "H100 PCIe", "memoryMiB": 81559, "pcieSwitch": "s0", "nvlinks": [{"peer": 0, "count": 6}]},
        {"model": "H100 PCIe", "memoryMiB": 81559}
      ]
    }
  },
  "machines": [{"type": "box", "count": 3, "rackSize": 2}, {"type": "dgx-h100"}],
  "network": {"oversubscription": 2}
}`)
	c := mustLoad(t, p)
	if c.NumGPUs() != 17 || len(c.Machines) != 4 || len(c.Racks) != 3 {
		t.Fatalf("gpus %d machines %d racks %d", c.NumGPUs(), len(c.Machines), len(c.Racks))
	}
	if c.Machines[0].Type != "box" || c.Machines[3].Type != "dgx-h100" || !c.Machines[0].Simulated {
		t.Fatalf("machine 0 = %+v", c.Machines[0])
	}
	// box: {0,1} and {2}; three boxes then one DGX of 8.
	want := [][]int{{0, 1}, {2}, {3, 4}, {5}, {6, 7}, {8}, seq(9, 8)}
	if !reflect.DeepEqual(c.Islands(), want) {
		t.Fatalf("islands %v want %v", c.Islands(), want)
	}
	if g := c.GPU(2); g.NIC != "mlx5_0" || g.GPUDirect {
		t.Errorf("GPU 2 NIC %q direct %v: want mlx5_0 via the root complex", g.NIC, g.GPUDirect)
	}
	if g := c.GPU(0); g.NIC != "mlx5_0" || !g.GPUDirect || g.UUID != "GPU-sim-box-0-0" {
		t.Errorf("GPU 0 = %+v", g)
	}
	// Machines 0,1 share rack 0; machine 2 is rack 1: oversubscribed spine.
	leaf, spine := c.Link(0, 3), c.Link(0, 6)
	if leaf.Tier != TierNetLeaf || spine.Tier != TierNetSpine || spine.GBps != leaf.GBps/2 {
		t.Errorf("leaf %+v spine %+v", leaf, spine)
	}
}

func TestLinkTiers(t *testing.T) {
	tests := []struct {
		spec  string
		a, b  int
		tier  Tier
		gbps  float64
		cross bool
	}{
		{"dgx-h100", 0, 7, TierNVSwitch, 450, false},
		{"dgx-a100", 1, 2, TierNVSwitch, 300, false},
		{"a100-pcie-nvlink-pairs", 0, 1, TierNVLink, 300, false},
		{"a100-pcie-nvlink-pairs", 0, 2, TierPCIeHostBridge, 16 * 1.969 * 0.9, false},
		{"a100-pcie-nvlink-pairs", 1, 7, TierCrossSocket, 16 * 1.969 * 0.5, false},
		{"pcie-l40s-8", 2, 3, TierPCIeSwitch, 16 * 1.969, false},
		{"gb200-nvl72", 0, 71, TierNVSwitch, 900, true},
		{"gb200-nvl72", 5, 5, TierSelf, 0, false},
		{"2xdgx-h100", 0, 8, TierNetLeaf, 50, true},
		{"2xdgx-h100/1", 3, 12, TierNetSpine, 50, true},
		{"dgx-a100-mig", 0, 1, TierPCIeSwitch, 16 * 1.969, false},
		{"dgx-a100-mig", 6, 7, TierNVSwitch, 300, false},
		{"dgx-h100", 0, 99, TierUnknown, 0, false},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s/%d-%d", tt.spec, tt.a, tt.b), func(t *testing.T) {
			c := mustLoad(t, tt.spec)
			l := c.Link(tt.a, tt.b)
			if l.Tier != tt.tier || !approx(l.GBps, tt.gbps, 1e-9) || l.CrossMachine != tt.cross {
				t.Fatalf("Link = %+v, want tier %v %.3f GB/s cross %v", l, tt.tier, tt.gbps, tt.cross)
			}
			if r := c.Link(tt.b, tt.a); r != l {
				t.Fatalf("Link not symmetric: %+v vs %+v", l, r)
			}
		})
	}
}

func approx(a, b, rel float64) bool {
	if a == b {
		return true
	}
	d := a - b
	if d < 0 {
		d = -d
	}
	return d <= rel*max(abs(a), abs(b))
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

func TestMIGInstances(t *testing.T) {
	c := mustLoad(t, "dgx-a100-mig")
	g0, g4, g6 := c.GPU(0), c.GPU(4), c.GPU(6)
	if !g0.MIGEnabled || len(g0.MIG) != 7 || g0.MIG[0].Profile != "1g.10gb" || g0.MIG[0].ComputeSlices != 1 {
		t.Fatalf("GPU 0 MIG = %+v", g0.MIG)
	}
	if len(g4.MIG) != 3 || g4.MIG[0].ComputeSlices != 3 || g4.MIG[0].MemoryMiB != 38146 {
		t.Fatalf("GPU 4 MIG = %+v", g4.MIG)
	}
	if g6.MIGEnabled || len(g6.MIG) != 0 {
		t.Fatalf("GPU 6 should be whole: %+v", g6)
	}
	seen := map[string]bool{}
	for _, g := range c.GPUs() {
		for _, m := range g.MIG {
			if seen[m.UUID] || !strings.HasPrefix(m.UUID, "MIG-sim-") {
				t.Fatalf("MIG UUID %q duplicate or not marked simulated", m.UUID)
			}
			seen[m.UUID] = true
		}
	}
}

func TestBuildMachinesRackOrder(t *testing.T) {
	m, _ := BuiltinMachine("dgx-h100")
	_, err := BuildMachines([]MachineInstance{{Spec: m, Rack: 1}, {Spec: m, Rack: 0}}, NetworkSpec{})
	if !errors.Is(err, ErrInvalidSpec) {
		t.Fatalf("err = %v", err)
	}
	c, err := BuildMachines([]MachineInstance{{Name: "host-a", Spec: m, Discovered: true}}, NetworkSpec{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Machines[0].Simulated || c.Machines[0].Name != "host-a" || c.GPU(0).UUID != "" {
		t.Fatalf("discovered machine = %+v, uuid %q", c.Machines[0], c.GPU(0).UUID)
	}
}

func TestExampleClusterFile(t *testing.T) {
	c := mustLoad(t, "testdata/example-cluster.json")
	if c.NumGPUs() != 16*8+4*4 || len(c.Racks) != 3 {
		t.Fatalf("gpus %d racks %d", c.NumGPUs(), len(c.Racks))
	}
	// 16 DGX islands of 8; each h100-pcie-4 has pair {0,1}, GPU 2 alone (its peer 3 is in
	// MIG mode) and GPU 3 alone.
	if got := len(c.Islands()); got != 16+4*3 {
		t.Fatalf("islands = %d", got)
	}
	if c.Network.Oversubscription != 2 {
		t.Fatalf("network %+v", c.Network)
	}
}

func TestBuiltinSpecsRoundTripThroughJSON(t *testing.T) {
	// What an agent sends (a MachineSpec as JSON) must rebuild the same machine.
	for _, name := range BuiltinNames() {
		t.Run(name, func(t *testing.T) {
			m, err := BuiltinMachine(name)
			if err != nil {
				t.Fatal(err)
			}
			raw, err := json.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			spec, err := ParseSpec(raw, name+".json")
			if err != nil {
				t.Fatalf("%v\n%s", err, raw)
			}
			a, b := mustLoad(t, name), mustBuild(t, spec)
			if !reflect.DeepEqual(a.Islands(), b.Islands()) || a.NumGPUs() != b.NumGPUs() {
				t.Fatalf("islands %v vs %v", a.Islands(), b.Islands())
			}
			for i := 0; i < a.NumGPUs(); i++ {
				for j := 0; j < a.NumGPUs(); j += 5 {
					if a.Link(i, j) != b.Link(i, j) {
						t.Fatalf("Link(%d,%d) %+v vs %+v", i, j, a.Link(i, j), b.Link(i, j))
					}
				}
			}
		})
	}
}

func mustBuild(t *testing.T, s *ClusterSpec) *Cluster {
	t.Helper()
	c, err := Build(s)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestCheckGPUs(t *testing.T) {
	c := mustLoad(t, "dgx-h100")
	if err := c.CheckGPUs([]int{0, 7}); err != nil {
		t.Fatal(err)
	}
	for _, ids := range [][]int{{8}, {-1}, {1, 1}} {
		if err := c.CheckGPUs(ids); !errors.Is(err, ErrNoGPU) {
			t.Errorf("%v: err = %v", ids, err)
		}
	}
	if _, err := ParseSpec([]byte(`[1,2]`), "x.json"); !errors.Is(err, ErrSyntax) || !strings.Contains(err.Error(), "want a JSON object") {
		t.Errorf("array: %v", err)
	}
}

func TestIslandsOfAndDescribePlacement(t *testing.T) {
	c := mustLoad(t, "4xdgx-h100")
	gang := []int{9, 8, 0, 1, 2, 3, 99, 10, 11, 8}
	want := [][]int{{0, 1, 2, 3}, {8, 9, 10, 11}}
	if got := c.IslandsOf(gang); !reflect.DeepEqual(got, want) {
		t.Fatalf("IslandsOf = %v", got)
	}
	got := c.DescribePlacement([]int{0, 1, 2, 3, 8, 9, 10, 11})
	if got != "8 GPU(s) on 2 island(s): island 0 = dgx-h100-0 GPUs 0-3; island 1 = dgx-h100-1 GPUs 0-3" {
		t.Fatalf("DescribePlacement = %q", got)
	}
	g := mustLoad(t, "gb200-nvl72")
	if got := g.DescribePlacement([]int{2, 3, 4}); got != "3 GPU(s) on 1 island(s): island 0 = gb200-nvl72-0 GPUs 2-3, gb200-nvl72-1 GPUs 0" {
		t.Fatalf("DescribePlacement = %q", got)
	}
}

func TestBuildRefusesHugeClusters(t *testing.T) {
	if _, err := Load("1000000xdgx-h100"); !errors.Is(err, ErrInvalidSpec) || !strings.Contains(err.Error(), "more than") {
		t.Fatalf("err = %v", err)
	}
}

func TestFormatIDs(t *testing.T) {
	for _, tt := range []struct {
		ids  []int
		want string
	}{{nil, ""}, {[]int{3}, "3"}, {[]int{0, 1, 2, 5, 7, 8}, "0-2,5,7-8"}} {
		if got := FormatIDs(tt.ids); got != tt.want {
			t.Errorf("FormatIDs(%v) = %q, want %q", tt.ids, got, tt.want)
		}
	}
}
