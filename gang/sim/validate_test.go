package sim

import (
	"bytes"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/atoll-run/atoll/gang"
)

// TestBadNumbers: every number a trace or machine list gives is checked against its bound,
// and the error names the file and line, the column and the bound. Each case used to be
// accepted: rounded, turned into garbage, or (gpu=1e12) allocated until memory ran out.
func TestBadNumbers(t *testing.T) {
	const (
		nodesHdr = "sn,cpu_milli,memory_mib,gpu,model\n"
		podsHdr  = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
		itpHdr   = "job_id,submission_time,duration,num_gpu\n"
		machHdr  = "machineId,number of GPUs\n"
	)
	nodes := func(p string) error { _, err := LoadOpenbNodes(p, false, nil); return err }
	pods := func(p string) error { _, err := LoadOpenbPods(p, false, nil); return err }
	jobs := func(p string) error { _, _, err := LoadJobs(p, false, nil); return err }
	machines := func(p string) error { _, _, _, err := LoadCluster(p, false, nil); return err }
	tests := []struct {
		name, file, body string
		load             func(string) error
		want             []string
	}{
		{"node with 1e12 GPUs", "n.csv", nodesHdr + "n0,1000,1000,1e12,G1\n", nodes, []string{"n.csv:2", "column gpu", "outside [0, 64]"}},
		{"node with 8.5 GPUs", "n.csv", nodesHdr + "n0,1000,1000,8.5,G1\n", nodes, []string{"n.csv:2", "column gpu", "whole number"}},
		{"node with infinite CPU", "n.csv", nodesHdr + "n0,Inf,1000,8,G1\n", nodes, []string{"n.csv:2", "column cpu_milli", "not a finite number"}},
		{"node with 1e400 memory", "n.csv", nodesHdr + "n0,1000,1e400,8,G1\n", nodes, []string{"n.csv:2", "column memory_mib", "not a finite number"}},
		{"node with too much memory", "n.csv", nodesHdr + "n0,1000,1e15,8,G1\n", nodes, []string{"column memory_mib", "outside"}},
		{"pod with 1.5 GPUs", "p.csv", podsHdr + "p0,1000,1000,1.5,1000\n", pods, []string{"p.csv:2", "column num_gpu", "whole number"}},
		{"pod with infinite CPU", "p.csv", podsHdr + "p0,inf,1000,1,1000\n", pods, []string{"column cpu_milli", "not a finite number"}},
		{"pod with 1000.5 milli", "p.csv", podsHdr + "p0,1000,1000,1,1000.5\n", pods, []string{"column gpu_milli", "whole number"}},
		{"job of 1e300 seconds", "j.csv", itpHdr + "a,0,1e300,1\n", jobs, []string{"j.csv:2", "column duration", "outside [0, 3.1536e+08]"}},
		{"job submitted at 1e300", "j.csv", itpHdr + "a,1e300,10,1\n", jobs, []string{"column submission_time", "outside"}},
		{"job of 2.5 GPUs", "j.csv", itpHdr + "a,0,10,2.5\n", jobs, []string{"column num_gpu", "whole number"}},
		{"job of 1e9 GPUs", "j.csv", itpHdr + "a,0,10,1e9\n", jobs, []string{"column num_gpu", "outside [1, 100000]"}},
		{"job of infinite duration", "j.csv", itpHdr + "a,0,+Inf,1\n", jobs, []string{"column duration", "not a finite number"}},
		{"machine with 1e12 GPUs", "m.csv", machHdr + "m0,1e12\n", machines, []string{"m.csv:2", "number of gpus", "outside [0, 64]"}},
		{"machine with 4.5 GPUs", "m.csv", machHdr + "m0,4.5\n", machines, []string{"m.csv:2", "whole number"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.load(writeFile(t, tt.file, tt.body))
			if !errors.Is(err, ErrBadRow) {
				t.Fatalf("err %v, want ErrBadRow", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

// TestBadOptions: options out of their documented bounds are refused before any work
// (a negative job count, a negative window, a load of 1e7 that would sample 1e7 times the
// cluster, NaN).
func TestBadOptions(t *testing.T) {
	ok := DynamicOptions{PrioritySeed: 1}
	dyn := []struct {
		name string
		o    DynamicOptions
		want string
	}{
		{"negative max jobs", DynamicOptions{MaxJobs: -5}, "max jobs -5 outside [0, 10000000]"},
		{"negative window", DynamicOptions{Window: -time.Second}, "window -1s is negative"},
		{"elastic share 2", DynamicOptions{ElasticShare: 2}, "elastic share 2 outside [0, 1]"},
		{"elastic share NaN", DynamicOptions{ElasticShare: math.NaN()}, "elastic share NaN"},
		{"strategy share 2", DynamicOptions{Strategy: "spread", StrategyShare: 2}, "strategy share 2 outside [0, 1]"},
		{"strategy share NaN", DynamicOptions{Strategy: "spread", StrategyShare: math.NaN()}, "strategy share NaN"},
		{"unknown strategy", DynamicOptions{Strategy: "scatter", StrategyShare: 0.5}, `strategy "scatter"`},
		{"share without a strategy", DynamicOptions{StrategyShare: 0.5}, `strategy ""`},
		{"saturate NaN", DynamicOptions{SaturateLoad: math.NaN()}, "saturate load NaN"},
		{"saturate 1e7", DynamicOptions{SaturateLoad: 1e7}, "outside [0, 100]"},
		{"unknown policy", DynamicOptions{Policies: []string{"nosuch"}}, `unknown dynamic policy "nosuch"`},
	}
	if err := ok.Validate(); err != nil {
		t.Fatalf("defaults refused: %v", err)
	}
	for _, tt := range dyn {
		if err := tt.o.Validate(); !errors.Is(err, ErrBadSpec) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: err %v, want ErrBadSpec saying %q", tt.name, err, tt.want)
		}
	}
	fgd := []struct {
		name string
		o    FGDOptions
		want string
	}{
		{"load NaN", FGDOptions{Loads: []float64{math.NaN()}, Seeds: 1}, "fgd load NaN outside (0, 10]"},
		{"load 1e7", FGDOptions{Loads: []float64{1e7}, Seeds: 1}, "fgd load 1e+07 outside (0, 10]"},
		{"no seeds", FGDOptions{Loads: []float64{1}}, "seeds 0 outside [1, 1000]"},
		{"strand Inf", FGDOptions{Loads: []float64{1}, Seeds: 1, CPUStrandFactor: math.Inf(1)}, "cpu strand factor +Inf"},
		{"unknown policy", FGDOptions{Loads: []float64{1}, Seeds: 1, Policies: []string{"x"}}, `unknown fgd policy "x"`},
	}
	for _, tt := range fgd {
		if err := tt.o.Validate(); !errors.Is(err, ErrBadSpec) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: err %v, want ErrBadSpec saying %q", tt.name, err, tt.want)
		}
	}
	bench := []struct {
		o    BenchOptions
		want string
	}{
		{BenchOptions{Nodes: 0, Gangs: 1}, "nodes 0 outside"},
		{BenchOptions{Nodes: 1, Gangs: 1 << 30}, "gangs 1073741824 outside"},
		{BenchOptions{Nodes: 1, Gangs: 1, ChurnCycles: -1}, "churn cycles -1 outside"},
		{BenchOptions{Nodes: 1, Gangs: 1, BaselineGangs: -1}, "baseline gangs -1 outside"},
	}
	for _, tt := range bench {
		if err := tt.o.Validate(); !errors.Is(err, ErrBadSpec) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%+v: err %v, want ErrBadSpec saying %q", tt.o, err, tt.want)
		}
	}
}

// TestFGDNoGPUPods: a pod list asking no GPU used to make the sampler loop forever (the
// requested GPUs never reach the load); it is refused.
func TestFGDNoGPUPods(t *testing.T) {
	nodes := []gang.Node{{Name: "n", CPUMilli: 1000, MemMiB: 1000, FreeCPU: 1000, FreeMem: 1000, GPUs: []gang.GPU{{Model: "G", FreeMilli: gang.Milli}}}}
	pods := []Pod{{Name: "cpu", CPUMilli: 100, MemMiB: 100}}
	_, err := RunFGD(t.Context(), nodes, pods, FGDOptions{Loads: []float64{1}, Seeds: 1})
	if !errors.Is(err, ErrBadSpec) || !strings.Contains(err.Error(), "asks no GPU") {
		t.Fatalf("err %v, want ErrBadSpec about a pod list with no GPU", err)
	}
}

// fuzzTable parses data as a table and returns it, or nil on a parse error.
func fuzzTable(data []byte) *table {
	t, err := parseTable("fuzz.csv", bytes.NewReader(data), true, nil)
	if err != nil {
		return nil
	}
	return t
}

// FuzzTraceParsers feeds arbitrary files to every trace and machine-list parser: none may
// panic, and whatever they accept must lie within the documented bounds.
func FuzzTraceParsers(f *testing.F) {
	f.Add([]byte("job_id,submission_time,duration,num_gpu\na,10,100,1\nb,5,1e300,8\n"))
	f.Add([]byte("#job id,arrival time (sec),topology,shape,size,duration (sec)\n0,0.0,CLOS,1,1,3600.0\n"))
	f.Add([]byte("sn,cpu_milli,memory_mib,gpu,model\nn0,1000,1000,8,G1\nn1,Inf,1,1e12,G2\n"))
	f.Add([]byte("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\np0,1000,2048,1,500,\np1,1,1,1.5,nan,A|B\n"))
	f.Add([]byte("machineId,number of GPUs\nm0,8\nm1,NaN\nm2,-1\n"))
	f.Add([]byte("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,4808,10\n2023-11-16 18:17:02,-1,1e9\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if fuzzTable(data) == nil {
			return
		}
		dir := t.TempDir()
		for _, name := range []string{"t.csv"} {
			p := dir + "/" + name
			if err := writeBytes(p, data); err != nil {
				t.Skip(err)
			}
			if js, _, err := LoadJobs(p, true, &Skipper{}); err == nil {
				for _, j := range js {
					if j.GPUs < 1 || j.GPUs > MaxJobGPUs || j.Duration < 0 || j.Submit < 0 || j.Duration.Seconds() > MaxTraceSeconds+1 {
						t.Fatalf("job out of bounds accepted: %+v", j)
					}
				}
			}
			if rs, err := LoadInference(p, true, &Skipper{}); err == nil {
				for i, r := range rs {
					if r.At < 0 || r.Context < 0 || r.Context > MaxRequestTokens || r.Generated < 0 || r.Generated > MaxRequestTokens || (i > 0 && r.At < rs[i-1].At) {
						t.Fatalf("request out of bounds or order accepted: %+v", r)
					}
				}
			}
			if ns, err := LoadOpenbNodes(p, true, &Skipper{}); err == nil {
				for _, n := range ns {
					if len(n.GPUs) > MaxMachineGPUs || n.CPUMilli < 0 || n.CPUMilli > MaxMachineCPU || n.MemMiB < 0 || n.MemMiB > MaxMachineMemMiB {
						t.Fatalf("node out of bounds accepted: %+v", n)
					}
				}
			}
			if ps, err := LoadOpenbPods(p, true, &Skipper{}); err == nil {
				for _, q := range ps {
					if q.NumGPU < 0 || q.NumGPU > MaxMachineGPUs || q.GPUMilli < 0 || q.GPUMilli > gang.Milli || q.CPUMilli < 0 || q.MemMiB < 0 {
						t.Fatalf("pod out of bounds accepted: %+v", q)
					}
				}
			}
			if snap, _, _, err := loadPhillyMachines(p, true, &Skipper{}); err == nil {
				for _, n := range snap.Nodes {
					if len(n.GPUs) > MaxMachineGPUs {
						t.Fatalf("machine out of bounds accepted: %d GPUs", len(n.GPUs))
					}
				}
			}
		}
	})
}
