package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func runTopology(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := newRootCmd()
	var out, errb bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errb)
	root.SetArgs(append([]string{"topology"}, args...))
	err := root.Execute()
	return out.String(), err
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
