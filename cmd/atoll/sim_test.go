package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSimFlagsValidated: out-of-bound numbers and stray arguments are refused with a
// message naming the flag and the bound. Each was accepted before (issue 14 #7).
func TestSimFlagsValidated(t *testing.T) {
	dir := t.TempDir()
	jobs := filepath.Join(dir, "jobs.csv")
	if err := os.WriteFile(jobs, []byte("job_id,submission_time,duration,num_gpu\na,0,60,1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	nodes := filepath.Join(dir, "nodes.csv")
	if err := os.WriteFile(nodes, []byte("sn,cpu_milli,memory_mib,gpu,model\nn0,1000,1000,1e12,G1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	pods := filepath.Join(dir, "pods.csv")
	if err := os.WriteFile(pods, []byte("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1,1,1,500\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	dyn := []string{"sim", "--mode", "dynamic", "--jobs", jobs, "--cluster", "1xdgx-h100/1"}
	fgd := []string{"sim", "--mode", "fgd", "--nodes", nodes, "--pods", pods, "--seeds", "1"}
	tests := []struct {
		name string
		args []string
		want []string
	}{
		{"extra argument", append(append([]string{}, dyn...), "extra"), []string{"unknown command \"extra\""}},
		{"unknown info", append(append([]string{}, dyn...), "--info", "psychic"), []string{`info "psychic"`, "want one of blind, estimate, oracle", "--info"}},
		{"negative max jobs", append(append([]string{}, dyn...), "--max-jobs", "-5"), []string{"max jobs -5 outside [0, 10000000]", "--max-jobs"}},
		{"negative window", append(append([]string{}, dyn...), "--window", "-1s"), []string{"window -1s is negative", "--window"}},
		{"elastic share 2", append(append([]string{}, dyn...), "--elastic-share", "2"), []string{"elastic share 2 outside [0, 1]"}},
		{"unknown strategy", append(append([]string{}, dyn...), "--strategy", "scatter", "--strategy-share", "1"), []string{`strategy "scatter"`, "--strategy"}},
		{"saturate NaN", append(append([]string{}, dyn...), "--saturate", "NaN"), []string{"saturate load NaN"}},
		{"load NaN", append(append([]string{}, fgd...), "--load", "NaN"), []string{`--load "NaN"`, "(0, 10]"}},
		{"load 1e7", append(append([]string{}, fgd...), "--load", "1e7"), []string{`--load "1e7"`, "(0, 10]"}},
		{"seeds 0", append(append([]string{}, fgd...), "--seeds", "0", "--load", "1"), []string{"seeds 0 outside [1, 1000]", "--seeds"}},
		{"node of 1e12 GPUs", append(append([]string{}, fgd...), "--load", "1"), []string{"nodes.csv:2", "column gpu", "outside [0, 64]"}},
		{"bench sched extra argument", []string{"bench", "sched", "extra"}, []string{"unknown command \"extra\""}},
		{"bench sched nodes -1", []string{"bench", "sched", "--nodes", "-1"}, []string{"bench nodes -1 outside [1, 100000]", "--nodes"}},
		{"bench sched gangs", []string{"bench", "sched", "--gangs", "2000000"}, []string{"bench gangs 2000000 outside [1, 1000000]"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := runCLI(t, tt.args...)
			if err == nil {
				t.Fatalf("%v accepted", tt.args)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

// TestSimPoolsContract: `atoll sim --mode pools --json` gives, per spot discount, every
// policy asked for with cost_vs_on_demand_pct, goodput_pct and a max_saving_pct that is the
// same for all policies of a discount and grows with the discount; bad discounts, storage
// bandwidths and seed counts are refused.
func TestSimPoolsContract(t *testing.T) {
	dir := t.TempDir()
	jobs := filepath.Join(dir, "jobs.csv")
	trace := "job_id,submission_time,duration,num_gpu\n"
	for i, g := range []int{1, 4, 8, 16, 2, 8} {
		trace += fmt.Sprintf("j%d,%d,%d,%d\n", i, i*600, 3600+i*900, g)
	}
	if err := os.WriteFile(jobs, []byte(trace), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := runCLI(t, "sim", "--mode", "pools", "--jobs", jobs, "--spot-discount", "40,90", "--policies", "ray,kueue,atoll", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Results []map[string]any `json:"results"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if len(got.Results) != 6 {
		t.Fatalf("%d results, want 3 policies × 2 discounts: %s", len(got.Results), out)
	}
	maxSaving := map[float64]float64{}
	for _, r := range got.Results {
		for _, k := range []string{"policy", "cost_vs_on_demand_pct", "goodput_pct", "max_saving_pct", "saving_pct", "spot_discount_pct", "oracle_cost_usd", "goodput_bound_pct"} {
			if _, ok := r[k]; !ok {
				t.Fatalf("result without %q: %v", k, r)
			}
		}
		d, m := r["spot_discount_pct"].(float64), r["max_saving_pct"].(float64)
		if prev, ok := maxSaving[d]; ok && prev != m {
			t.Errorf("discount %v: max_saving_pct %v and %v within one run", d, prev, m)
		}
		maxSaving[d] = m
		if r["saving_pct"].(float64) > m {
			t.Errorf("%v saves %v%%, more than the max %v%%", r["policy"], r["saving_pct"], m)
		}
	}
	if len(maxSaving) != 2 || math.Abs(maxSaving[40]-40) > 0.01 || math.Abs(maxSaving[90]-90) > 0.01 {
		t.Errorf("max savings %v: want 40 and 90 (every job may run on spot)", maxSaving)
	}
	for _, bad := range []struct {
		flags []string
		want  string
	}{
		{[]string{"--spot-discount", "100"}, "spot discount 100%"},
		{[]string{"--spot-discount", "forty"}, `--spot-discount "forty"`},
		{[]string{"--storage-gbps", "0"}, "--storage-gbps"},
		{[]string{"--seeds", "0"}, "--seeds 0"},
	} {
		_, err := runCLI(t, append([]string{"sim", "--mode", "pools", "--jobs", jobs, "--json"}, bad.flags...)...)
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%v: error %v, want it to say %q", bad.flags, err, bad.want)
		}
	}
}
