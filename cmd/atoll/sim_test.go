package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/atoll-run/atoll/gang"
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

// TestSimMixedAndTuneContract: `atoll sim --mode mixed --json` gives every policy with the
// issue's fields; `atoll tune` (a tiny budget) writes a weights file, reports the holdout
// comparison, and `atoll sim --weights` loads that file and changes the atoll policy's
// outcome where the weights differ.
func TestSimMixedAndTuneContract(t *testing.T) {
	dir := t.TempDir()
	jobs := filepath.Join(dir, "jobs.csv")
	trace := "job_id,submission_time,duration,num_gpu\n"
	for i := range 40 {
		trace += fmt.Sprintf("j%d,%d,%d,%d\n", i, i*120, 1800+(i%7)*600, []int{1, 2, 4, 8}[i%4])
	}
	if err := os.WriteFile(jobs, []byte(trace), 0o644); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join("..", "..", "testdata", "traces")
	inf := filepath.Join(root, "azure-llm-inference-2023", "AzureLLMInferenceTrace_code.csv")
	out, err := runCLI(t, "sim", "--mode", "mixed", "--jobs", jobs, "--inference", inf, "--cluster", "4xdgx-h100/8", "--inference-scale", "2",
		"--service-max-replicas", "2", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Results []map[string]any `json:"results"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if len(got.Results) != 3 {
		t.Fatalf("%d results, want static, volcano, atoll: %s", len(got.Results), out)
	}
	for i, r := range got.Results {
		if r["policy"] != []string{"static", "volcano", "atoll"}[i] {
			t.Errorf("result %d is %v", i, r["policy"])
		}
		for _, k := range []string{"inference_slo_attainment_pct", "utilisation_pct", "preemptions_by_cause", "ttft_p99_s", "requests"} {
			if _, ok := r[k]; !ok {
				t.Fatalf("result without %q: %v", k, r)
			}
		}
		jct, _ := r["training_jct_s"].(map[string]any)
		hq, _ := r["high_prio_queue_delay_s"].(map[string]any)
		if jct["mean"] == nil || jct["p99"] == nil || hq["mean"] == nil {
			t.Fatalf("%v: training_jct_s %v, high_prio_queue_delay_s %v lack mean/p99", r["policy"], jct, hq)
		}
		if a := r["inference_slo_attainment_pct"].(float64); !(a > 0 && a <= 100) || r["requests"].(float64) < 1000 {
			t.Errorf("%v: attainment %v%% of %v requests", r["policy"], a, r["requests"])
		}
		// The run's bound on a utilisation gain: what the static split leaves idle.
		if b, ok := r["utilisation_gain_bound_pts"].(float64); !ok || math.Abs(b-(100-got.Results[0]["utilisation_pct"].(float64))) > 0.011 {
			t.Errorf("%v: utilisation_gain_bound_pts %v, want 100 - the static split's utilisation %v", r["policy"], r["utilisation_gain_bound_pts"], got.Results[0]["utilisation_pct"])
		}
		if u := r["utilisation_pct"].(float64); u-got.Results[0]["utilisation_pct"].(float64) > r["utilisation_gain_bound_pts"].(float64)+0.011 {
			t.Errorf("%v: utilisation %v passes the static split's by more than the bound", r["policy"], u)
		}
	}
	if _, err := runCLI(t, "sim", "--mode", "mixed", "--jobs", jobs, "--cluster", "4xdgx-h100/8"); err == nil || !strings.Contains(err.Error(), "--inference") {
		t.Errorf("mixed without --inference: %v", err)
	}
	if _, err := runCLI(t, "sim", "--mode", "mixed", "--jobs", jobs, "--inference", inf, "--cluster", "4xdgx-h100/8", "--service-gpus-per-replica", "16"); err == nil || !strings.Contains(err.Error(), "holds a replica of 16 GPUs") {
		t.Errorf("replicas larger than a machine: %v", err)
	}

	itp := filepath.Join(root, "microsoft-itp-elasticflow")
	wfile := filepath.Join(dir, "w.json")
	out, err = runCLI(t, "tune", "--jobs", filepath.Join(itp, "cluster02.csv"), "--holdout", filepath.Join(itp, "cluster10.csv"), "--cluster", "4xdgx-h100/8",
		"--out", wfile, "--budget", "3", "--rungs", "2", "--max-jobs", "60", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var tr struct {
		Out    string `json:"out"`
		Result struct {
			Method  string `json:"method"`
			Holdout []struct {
				Trace     string  `json:"trace"`
				Objective float64 `json:"objective"`
			} `json:"holdout"`
			Evaluations int `json:"evaluations"`
		} `json:"result"`
	}
	if err := json.Unmarshal([]byte(out), &tr); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if tr.Out != wfile || tr.Result.Method != "successive-halving" || len(tr.Result.Holdout) != 1 || tr.Result.Holdout[0].Trace != "cluster10.csv" ||
		!(tr.Result.Holdout[0].Objective > 0) || tr.Result.Evaluations < 3+1 {
		t.Fatalf("tune result %+v (want 3 candidates then at least the hand-set ones again, the holdout cluster10.csv with an objective)", tr)
	}
	if _, err := gang.ReadWeightsFile(wfile); err != nil {
		t.Fatal(err)
	}
	// Without --holdout (the command line), the jobs after those tuned on.
	out, err = runCLI(t, "tune", "--jobs", filepath.Join(itp, "cluster02.csv"), "--cluster", "4xdgx-h100/8", "--out", wfile, "--budget", "2", "--rungs", "1", "--max-jobs", "40", "--json")
	if err != nil || !strings.Contains(out, `"trace":"cluster02.csv jobs 41-80"`) {
		t.Errorf("tune without --holdout: %v: %s", err, out)
	}
	if _, err := runCLI(t, "tune", "--jobs", jobs, "--holdout", jobs, "--cluster", "4xdgx-h100/8", "--out", wfile); err == nil || !strings.Contains(err.Error(), "not tuned on") {
		t.Errorf("holdout among the tuning traces: %v", err)
	}

	// --weights: a file with no class preference changes the atoll policy's outcome.
	flat := gang.WeightsOf(gang.DefaultConfig())
	flat.ClassWeight, flat.RemainingAgingHours = 1, 0
	if err := gang.WriteWeightsFile(wfile, gang.WeightsFile{Weights: flat}); err != nil {
		t.Fatal(err)
	}
	dyn := []string{"sim", "--mode", "dynamic", "--jobs", filepath.Join(itp, "cluster02.csv"), "--cluster", "4xdgx-h100/8", "--max-jobs", "200", "--policies", "atoll", "--json"}
	a, err := runCLI(t, dyn...)
	if err != nil {
		t.Fatal(err)
	}
	b, err := runCLI(t, append(dyn, "--weights", wfile)...)
	if err != nil {
		t.Fatal(err)
	}
	if a == b {
		t.Errorf("--weights with class weight 1 left the atoll replay unchanged")
	}
	if err := os.WriteFile(wfile, []byte(`{"weights":{"class_weight":0}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := runCLI(t, append(dyn, "--weights", wfile)...); err == nil || !strings.Contains(err.Error(), "--weights") || !strings.Contains(err.Error(), "class_weight") {
		t.Errorf("bad weights file: %v", err)
	}
	if _, err := headControllerConfig(time.Second, wfile); err == nil || !strings.Contains(err.Error(), "--scheduler-weights") {
		t.Errorf("head with a bad weights file: %v", err)
	}
	if err := gang.WriteWeightsFile(wfile, gang.WeightsFile{Weights: flat}); err != nil {
		t.Fatal(err)
	}
	c, err := headControllerConfig(time.Second, wfile)
	if err != nil || c.Scheduler.ClassWeight != 1 || c.Scheduler.RemainingAging != 0 || c.Scheduler.TopologyWait != 0 {
		t.Errorf("head scheduler config %+v, %v: want the file's class weight 1 and aging 0 on the head's defaults (no topology wait)", c.Scheduler, err)
	}
}
