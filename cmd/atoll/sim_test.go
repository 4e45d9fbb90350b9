package main

import (
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
