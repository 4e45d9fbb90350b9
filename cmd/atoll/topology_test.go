package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func runTopology(t *testing.T, args ...string) (string, error) {
	t.Helper()
	return runCLI(t, append([]string{"topology"}, args...)...)
}

// TestSpecNamesCannotReachTheFileSystem: a cluster spec whose machine type climbs out of a
// directory is refused by every command that reads specs, with file:line:col and the field,
// before anything is created. Before the fix, the demo put the machine's object store at
// <dir>/victim-0 and its recovery deleted keep.txt there (issue 14 #1).
func TestSpecNamesCannotReachTheFileSystem(t *testing.T) {
	dir := t.TempDir()
	victim := filepath.Join(dir, "victim-0", "spill") // machine 0 of type .../victim
	if err := os.MkdirAll(victim, 0o755); err != nil {
		t.Fatal(err)
	}
	keep := filepath.Join(victim, "keep.txt")
	if err := os.WriteFile(keep, []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	climb := strings.Repeat("../", 12) + strings.TrimPrefix(filepath.Join(dir, "victim"), "/")
	gpu := `{"model": "A", "memoryMiB": 81920, "nvswitchLinks": 18}`
	spec := filepath.Join(dir, "spec.json")
	body := `{
  "machineTypes": {"` + climb + `": {"nvlink": {"generation": 4, "linkGBps": 25, "fabric": "nvswitch"},
    "gpus": [` + strings.Repeat(gpu+", ", 7) + gpu + `]}},
  "machines": [{"type": "` + climb + `"}]
}`
	if err := os.WriteFile(spec, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"topology", "--spec", spec},
		{"demo", "--cluster", spec, "--steps", "1", "--kill-at", "-1"},
	} {
		_, err := runCLI(t, args...)
		if err == nil {
			t.Errorf("%v: accepted a machine type that climbs out of its directory", args)
			continue
		}
		for _, want := range []string{spec + ":2:", spec + ":4:", "machines[0].type", "starts with '.'"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%v: error %q does not contain %q", args, err, want)
			}
		}
	}
	if b, err := os.ReadFile(keep); err != nil || string(b) != "mine" {
		t.Fatalf("a file outside the object store: %q, %v", b, err)
	}
}

// TestDefaultBuildLinksNoNVML: go-nvml's cgo preamble makes the C compiler print ~30
// deprecation warnings on a cold build, so the default build leaves it out and GPU machines
// build with -tags nvml (issue 9).
func TestDefaultBuildLinksNoNVML(t *testing.T) {
	const nvml = "github.com/NVIDIA/go-nvml/pkg/nvml"
	deps := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("go", append([]string{"list", "-deps"}, append(args, ".")...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("go list %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	if strings.Contains(deps(), nvml) {
		t.Fatalf("the default build of cmd/atoll compiles %s", nvml)
	}
	if cgo, err := exec.Command("go", "env", "CGO_ENABLED").Output(); err == nil && strings.TrimSpace(string(cgo)) == "1" {
		if !strings.Contains(deps("-tags", "nvml"), nvml) {
			t.Fatalf("the -tags nvml build does not compile %s", nvml)
		}
	}
}

func TestTopologyJSONContract(t *testing.T) {
	tests := []struct {
		spec     string
		machines int
		gpus     int
		islands  int
	}{
		{"dgx-h100", 1, 8, 1},
		{"pcie-l40s-8", 1, 8, 8},
		{"gb200-nvl72", 18, 72, 1},
		{"a100-pcie-nvlink-pairs", 1, 8, 4},
		{"4xdgx-h100/2", 4, 32, 4},
	}
	for _, tt := range tests {
		t.Run(tt.spec, func(t *testing.T) {
			out, err := runTopology(t, "--spec", tt.spec, "--format", "json")
			if err != nil {
				t.Fatal(err)
			}
			var got struct {
				Machines  int     `json:"machines"`
				GPUs      int     `json:"gpus"`
				Islands   [][]int `json:"islands"`
				AllReduce []struct {
					Algo      string  `json:"algo"`
					BusBWGBps float64 `json:"busbwGBps"`
				} `json:"allreduce"`
			}
			dec := json.NewDecoder(strings.NewReader(out))
			if err := dec.Decode(&got); err != nil {
				t.Fatalf("not JSON: %v\n%s", err, out)
			}
			if dec.More() {
				t.Fatal("more than one JSON object on stdout")
			}
			if got.Machines != tt.machines || got.GPUs != tt.gpus || len(got.Islands) != tt.islands || len(got.AllReduce) == 0 {
				t.Fatalf("got machines %d gpus %d islands %d allreduce %d", got.Machines, got.GPUs, len(got.Islands), len(got.AllReduce))
			}
		})
	}
}

func TestTopologyFormatsAndErrors(t *testing.T) {
	out, err := runTopology(t, "--spec", "dgx-a100-mig")
	if err != nil || !strings.Contains(out, "7x1g.10gb") || !strings.Contains(out, "islands:") {
		t.Fatalf("text: %v\n%s", err, out)
	}
	out, err = runTopology(t, "--spec", "dgx-h100", "--format", "dot")
	if err != nil || !strings.HasPrefix(out, "graph ") {
		t.Fatalf("dot: %v\n%s", err, out)
	}
	out, err = runTopology(t, "--list")
	if err != nil || !strings.Contains(out, "gb200-nvl72") {
		t.Fatalf("list: %v\n%s", err, out)
	}
	for _, args := range [][]string{
		{},
		{"--spec", "dgx-h100", "--discover"},
		{"--spec", "dgx-h100", "--format", "yaml"},
		{"--spec", "nope-9000"},
		{"--spec", "/no/such/file.json"},
	} {
		if _, err := runTopology(t, args...); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}

func TestTopologyDiscoverFixture(t *testing.T) {
	out, err := runTopology(t, "--discover", "--sys-root", "../../topology/testdata/sys-2socket", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Machines  int `json:"machines"`
		GPUs      int `json:"gpus"`
		Discovery struct {
			NVML      string `json:"nvml"`
			GPUsOnPCI int    `json:"gpusOnPci"`
			CPUs      int    `json:"cpus"`
		} `json:"discovery"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	// This machine has no NVIDIA driver: no GPUs, but the CPU part of the fixture.
	if got.Machines != 1 || got.Discovery.CPUs != 16 || got.Discovery.GPUsOnPCI != 3 || got.Discovery.NVML == "" {
		t.Fatalf("got %+v", got)
	}
}

func TestTopologyAllReduceFlag(t *testing.T) {
	out, err := runTopology(t, "--spec", "4xdgx-h100", "--allreduce", "0-3,8-11", "--bytes", "64MiB")
	if err != nil || !strings.Contains(out, "8 GPU(s) on 2 island(s)") || !strings.Contains(out, "best=") {
		t.Fatalf("%v\n%s", err, out)
	}
	out, err = runTopology(t, "--spec", "dgx-a100", "--allreduce", "0-7", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		GPUs      []int `json:"gpus"`
		AllReduce []struct {
			Requested string `json:"requested"`
		} `json:"allreduce"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil || len(got.GPUs) != 8 || len(got.AllReduce) != 5 {
		t.Fatalf("%v %+v", err, got)
	}
	for _, args := range [][]string{
		{"--spec", "dgx-h100", "--allreduce", "0-8"},
		{"--spec", "dgx-h100", "--allreduce", "a"},
		{"--spec", "dgx-h100", "--allreduce", "3-1"},
		{"--spec", "dgx-h100", "--allreduce", "0-1", "--bytes", "lots"},
	} {
		if _, err := runTopology(t, args...); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}

// TestTopologyNumbersWithinBounds: every number the command reads is checked against its
// bound, and the message says which flag and what bound (issue 14 #7).
func TestTopologyNumbersWithinBounds(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--spec", "dgx-h100", "--allreduce", "0-1", "--bytes", "9223372036854775807GiB"}, "--bytes \"9223372036854775807GiB\": want a positive size up to 1PiB"},
		{[]string{"--spec", "dgx-h100", "--allreduce", "0-1", "--bytes", "-1MiB"}, "--bytes \"-1MiB\""},
		{[]string{"--spec", "dgx-h100", "--allreduce", strings.Repeat("0-1000000,", 40) + "0"}, "more than 1048576 GPU ids (at \"0-1000000\")"},
		{[]string{"--spec", "dgx-h100", "--allreduce", "0-99999999999"}, "more than 1048576 GPU ids"},
		{[]string{"--spec", "dgx-h100", "--limit", "-1"}, "--limit -1"},
		{[]string{"--discover", "--sys-root", "../../topology/testdata/sys-2socket", "--timeout", "-1s"}, "--timeout -1s"},
		{[]string{"--spec", "1e12xdgx-h100"}, "count \"1e12\" at byte 0 must be a whole number in 1..1048576"},
		{[]string{"--spec", "4xdgx-h100/0"}, "rack size \"0\" at byte 11"},
		{[]string{"--spec", "131073xdgx-h100"}, "more than 1048576 GPUs"},
		{[]string{"--spec", "dgx-h100", "extra"}, "unknown command \"extra\""},
	} {
		_, err := runTopology(t, tt.args...)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v: err = %v, want %q", tt.args, err, tt.want)
		}
	}
}

// TestBenchTopologyJSONContract: `atoll bench topology --json` prints one object with the
// figures BENCHMARKS.md quotes, on a cluster small enough for a unit test; bad sizes are
// refused with the bound.
func TestBenchTopologyJSONContract(t *testing.T) {
	out, err := runCLI(t, "bench", "topology", "--spec", "64xdgx-h100/8", "--gang", "64", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var got benchTopologyResult
	dec := json.NewDecoder(strings.NewReader(out))
	if err := dec.Decode(&got); err != nil || dec.More() {
		t.Fatalf("not one JSON object: %v\n%s", err, out)
	}
	if got.GPUs != 512 || got.IslandsComputed != 64 || got.BaselineGPUs != 8 || got.AllReduceGang != 64 ||
		!(got.LinkNs > 0 && got.LinkNsBaseline > 0 && got.LinkRatio > 0 && got.AllReducePerSec > 0) {
		t.Fatalf("result %+v", got)
	}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--spec", "dgx-h100", "--gang", "9"}, "--gang 9: want 2..8"},
		{[]string{"--spec", "dgx-h100", "--gang", "-1"}, "--gang -1: want 2..8"},
		{[]string{"--spec", "1e12xdgx-h100"}, "count \"1e12\""},
	} {
		if _, err := runCLI(t, append([]string{"bench", "topology"}, tt.args...)...); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v: err = %v, want %q", tt.args, err, tt.want)
		}
	}
}
