package sim

import (
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/atoll-run/atoll/gang"
)

// tracesDir finds the traces: $ATOLL_TRACES when set, else the copies committed under
// <repo>/testdata/traces (walking up from the package directory to go.mod). A bare clone
// has them, so the trace-based tests never skip.
func tracesDir(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("ATOLL_TRACES"); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("ATOLL_TRACES=%s: %v", p, err)
		}
		return p
	}
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			p := filepath.Join(dir, "testdata", "traces")
			if _, err := os.Stat(p); err != nil {
				t.Fatalf("traces not found at %s (committed with the repository): %v", p, err)
			}
			return p
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("repository root not found")
		}
		dir = parent
	}
}

func writeFile(t *testing.T, name, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestCSVTolerance(t *testing.T) {
	// No final newline, CRLF, blank lines, empty gpu_spec, spaces.
	body := "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\r\n" +
		"p0,1000,2048,1,500,\r\n\r\n" +
		"p1, 2000 ,4096,2,1000,V100M16|V100M32\n" +
		"p2,500,100,0,0,nan"
	pods, err := LoadOpenbPods(writeFile(t, "pods.csv", body), false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(pods) != 3 {
		t.Fatalf("got %d pods, want 3", len(pods))
	}
	if pods[1].CPUMilli != 2000 || len(pods[1].Models) != 2 || pods[0].Models != nil || pods[2].Models != nil || pods[2].GPUMilli != 0 {
		t.Fatalf("parsed %+v", pods)
	}
	if pods[2].Line != 5 {
		t.Fatalf("line of p2 = %d, want 5", pods[2].Line)
	}
}

func TestBadRows(t *testing.T) {
	tests := []struct {
		name, body, want string
	}{
		{"field count", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1,2,1,500\np1,1,2\n", "pods.csv:3: 3 fields"},
		{"not a number", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,abc,2,1,500\n", `pods.csv:2: column cpu_milli value "abc"`},
		{"share of many cards", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1,2,2,500\n", "pods.csv:2: column gpu_milli"},
		{"negative", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1,-2,1,500\n", "negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := writeFile(t, "pods.csv", tt.body)
			_, err := LoadOpenbPods(p, false, nil)
			if !errors.Is(err, ErrBadRow) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err %v, want ErrBadRow containing %q", err, tt.want)
			}
			sk := &Skipper{}
			pods, err := LoadOpenbPods(p, true, sk)
			if err != nil || len(sk.Errors) != 1 {
				t.Fatalf("skip: pods %v err %v skipped %v", pods, err, sk.Errors)
			}
		})
	}
}

func TestJobFormats(t *testing.T) {
	itp := writeFile(t, "itp.csv", "job_id,submission_time,duration,num_gpu\na,10,100,1\nb,5,50,8")
	philly := writeFile(t, "philly.csv", "#job id,arrival time (sec),topology,shape,size,duration (sec)\n0,0.0,CLOS,1,1,3600.0\n1,2.5,CLOS,8+8,16,60.0\n")
	bad := writeFile(t, "bad.csv", "a,b,c\n1,2,3\n")
	jobs, f, err := LoadJobs(itp, false, nil)
	if err != nil || f != "itp" || len(jobs) != 2 || jobs[0].ID != "b" || jobs[0].GPUs != 8 {
		t.Fatalf("itp: %v %v %+v", f, err, jobs)
	}
	jobs, f, err = LoadJobs(philly, false, nil)
	if err != nil || f != "philly" || len(jobs) != 2 || jobs[1].GPUs != 16 || jobs[1].Submit != 2500*time.Millisecond {
		t.Fatalf("philly: %v %v %+v", f, err, jobs)
	}
	if _, _, err := LoadJobs(bad, false, nil); !errors.Is(err, ErrBadHeader) {
		t.Fatalf("bad header: %v", err)
	}
	zero := writeFile(t, "zero.csv", "job_id,submission_time,duration,num_gpu\na,10,100,0\n")
	if _, _, err := LoadJobs(zero, false, nil); !errors.Is(err, ErrBadRow) || !strings.Contains(err.Error(), "zero.csv:2") {
		t.Fatalf("zero gpus: %v", err)
	}
}

func TestPriorityAssignmentSeeded(t *testing.T) {
	mk := func() []Job { return make([]Job, 1000) }
	a, b := mk(), mk()
	AssignPriorities(a, 7)
	AssignPriorities(b, 7)
	counts := map[int]int{}
	for i := range a {
		if a[i].Priority != b[i].Priority {
			t.Fatal("same seed, different classes")
		}
		counts[a[i].Priority]++
	}
	if counts[PrioHigh] < 150 || counts[PrioHigh] > 250 || counts[PrioLow] < 250 || counts[PrioLow] > 350 {
		t.Fatalf("class shares off: %v", counts)
	}
}

func TestTypicalWorkload(t *testing.T) {
	pods := []Pod{{NumGPU: 1, GPUMilli: 500}, {NumGPU: 1, GPUMilli: 500}, {NumGPU: 1, GPUMilli: 500}, {NumGPU: 8, GPUMilli: 1000}}
	w := TypicalWorkload(pods, false)
	if len(w) != 2 || w[0].Freq != 0.75 {
		t.Fatalf("count-weighted %+v", w)
	}
	w = TypicalWorkload(pods, true)
	// GPU-weighted: 3 x 0.5 = 1.5 against 8.
	if len(w) != 2 || w[0].GPUs != 8 || w[0].Freq < 0.84 || w[0].Freq > 0.85 {
		t.Fatalf("gpu-weighted %+v", w)
	}
}

// TestFGDSmall runs the static protocol on a slice of the openb trace: every policy runs,
// the shares are sane, and Atoll leaves no more GPUs unallocated than Random.
func TestFGDSmall(t *testing.T) {
	dir := filepath.Join(tracesDir(t), "alibaba-openb-v2023")
	nodes, err := LoadOpenbNodes(filepath.Join(dir, "openb_node_list_gpu_node.csv"), false, nil)
	if err != nil {
		t.Fatal(err)
	}
	pods, err := LoadOpenbPods(filepath.Join(dir, "openb_pod_list_default.csv"), false, nil)
	if err != nil {
		t.Fatal(err)
	}
	nodes = nodes[:150]
	res, err := RunFGD(context.Background(), nodes, pods, FGDOptions{Loads: []float64{0.8, 1.0}, Seeds: 2})
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 2*len(FGDPolicies) {
		t.Fatalf("%d results", len(res))
	}
	un := map[string]float64{}
	for _, r := range res {
		if r.AllocPctMean <= 0 || r.AllocPctMean > 100 || r.UnallocPctMean != 100-r.AllocPctMean && r.UnallocPctMean-(100-r.AllocPctMean) > 0.011 {
			t.Fatalf("bad result %+v", r)
		}
		if r.Load == 1.0 {
			un[r.Policy] = r.UnallocPctMean
		}
	}
	if un["atoll"] > un["random"] {
		t.Fatalf("atoll %v unallocated, random %v", un["atoll"], un["random"])
	}
}

func TestDynamicSmall(t *testing.T) {
	dir := tracesDir(t)
	jobs, _, err := LoadJobs(filepath.Join(dir, "microsoft-itp-elasticflow", "cluster04.csv"), false, nil)
	if err != nil {
		t.Fatal(err)
	}
	snap, model, _, err := LoadCluster("16xdgx-h100/4", false, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := RunDynamic(context.Background(), jobs, snap, model, DynamicOptions{MaxJobs: 300, PrioritySeed: 1, Info: InfoOracle})
	if err != nil {
		t.Fatal(err)
	}
	by := map[string]DynamicResult{}
	for _, r := range res {
		by[r.Policy] = r
		if r.Jobs != 300 || r.UtilPct <= 0 || r.UtilPct > 100 || r.JCT.Mean <= 0 {
			t.Fatalf("bad result %+v", r)
		}
	}
	if len(by) != len(DynamicPolicies) {
		t.Fatalf("policies %v", by)
	}
	for _, p := range []string{"tiresias", "srtf", "atoll"} {
		r := by[p]
		if r.JCTByClass["high"].Mean <= 0 || r.GoodputPct <= 0 || r.GoodputPct > 100 || r.PreemptionsByCause == nil || r.WaitHoursByReason == nil {
			t.Fatalf("%s lacks the new fields: %+v", p, r)
		}
		n := 0
		for _, c := range r.PreemptionsByCause {
			n += c
		}
		if n != r.Preemptions+r.Shrinks || r.PreemptorsStarted > r.PreemptionRounds {
			t.Fatalf("%s: causes %v sum to %d, preemptions %d; started %d of %d rounds", p, r.PreemptionsByCause, n, r.Preemptions, r.PreemptorsStarted, r.PreemptionRounds)
		}
	}
	if a, v, k := by["atoll"].AllReduce.Mean, by["volcano"].AllReduce.Mean, by["kueue"].AllReduce.Mean; a > v || a >= k {
		t.Fatalf("atoll allreduce %v, volcano %v, kueue %v", a, v, k)
	}
	if a, f := by["atoll"].HighPrioQueueDelay.Mean, by["fifo"].HighPrioQueueDelay.Mean; a > f {
		t.Fatalf("atoll high-priority delay %v above fifo %v", a, f)
	}
}

func TestPhillyMachineList(t *testing.T) {
	p := writeFile(t, "machines.csv", "machineId, number of GPUs, single GPU mem\nm0,2, 12GB\nm1,8, 24GB\nm2,0, 24GB")
	snap, model, _, err := LoadCluster(p, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Nodes) != 2 || len(snap.Nodes[1].GPUs) != 8 || model == nil {
		t.Fatalf("snapshot %+v", snap.Nodes)
	}
}

func TestTopologyAdapter(t *testing.T) {
	snap, model, _, err := LoadCluster("4xdgx-h100/2", false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Nodes) != 4 || snap.Nodes[2].Rack != 1 || snap.Nodes[0].CPUMilli == 0 {
		t.Fatalf("nodes %+v", snap.Nodes[:2])
	}
	in := model.AllReduceTime([]gang.GPURef{{Node: 0, GPU: 0}, {Node: 0, GPU: 1}}, 1<<30)
	across := model.AllReduceTime([]gang.GPURef{{Node: 0, GPU: 0}, {Node: 2, GPU: 0}}, 1<<30)
	if in <= 0 || across <= in {
		t.Fatalf("NVLink %v, across racks %v", in, across)
	}
	if _, _, _, err := LoadCluster("12xno-such-machine/4", false, nil); err == nil {
		t.Fatal("unknown machine accepted")
	}
}

func TestBenchSmall(t *testing.T) {
	r, err := RunSchedBench(context.Background(), BenchOptions{Nodes: 200, Gangs: 200, ChurnCycles: 3, Seed: 1, BaselineGangs: 10})
	if err != nil {
		t.Fatal(err)
	}
	if r.GangsPlaced < 200 || r.MembersPerS <= 0 || r.CycleP99ms < r.CycleP50ms || r.BaselineMPS <= 0 {
		t.Fatalf("%+v", r)
	}
}

func TestAtollWorkloadScarcity(t *testing.T) {
	nodes := []gang.Node{{GPUs: make([]gang.GPU, 8)}, {GPUs: []gang.GPU{{Model: "T4"}, {Model: "T4"}}}}
	for i := range nodes[0].GPUs {
		nodes[0].GPUs[i].Model = "G2"
	}
	pods := []Pod{{NumGPU: 1, GPUMilli: 1000}, {NumGPU: 1, GPUMilli: 1000, Models: []string{"T4"}}}
	w := AtollWorkload(pods, nodes)
	// Same GPUs and count; the T4-only shape is 10/2 = 5 times as concentrated.
	if len(w) != 2 || len(w[1].Models) != 1 || w[1].Freq < 0.83 || w[1].Freq > 0.84 {
		t.Fatalf("%+v", w)
	}
}

func TestAtollFragOptions(t *testing.T) {
	pods := []Pod{
		{NumGPU: 1, GPUMilli: 1000, CPUMilli: 12000},
		{NumGPU: 1, GPUMilli: 500, CPUMilli: 6000},
		{CPUMilli: 64000}, // CPU-only pods do not set the ratio
	}
	tests := []struct {
		factor, want float64
	}{
		{0, DefaultCPUStrandFactor * 12},
		{0.5, 6},
		{-1, 0},
	}
	for _, tt := range tests {
		if got := AtollFragOptions(pods, tt.factor); got.CPUPerMilli != tt.want || !got.Memory {
			t.Fatalf("AtollFragOptions(factor %v) = %+v, want CPUPerMilli %v and Memory", tt.factor, got, tt.want)
		}
	}
	if got := AtollFragOptions(nil, 0); got.CPUPerMilli != 0 {
		t.Fatalf("no pods seen: CPUPerMilli %v, want 0", got.CPUPerMilli)
	}
}

func writeBytes(p string, b []byte) error { return os.WriteFile(p, b, 0o644) }

// TestElasticReplay: elastic jobs grow into free capacity and are shrunk, not evicted, for
// high-priority arrivals; every job completes and the work is conserved.
func TestElasticReplay(t *testing.T) {
	snap, model, _, err := LoadCluster("2xdgx-h100/2", false, nil)
	if err != nil {
		t.Fatal(err)
	}
	var jobs []Job
	for i := 0; i < 2; i++ {
		jobs = append(jobs, Job{ID: fmt.Sprint("el", i), Submit: time.Duration(i) * time.Minute, Duration: 10 * time.Hour, GPUs: 8, MinGPUs: 4, Priority: PrioLow})
	}
	for i := 0; i < 4; i++ {
		jobs = append(jobs, Job{ID: fmt.Sprint("hi", i), Submit: 2*time.Hour + time.Duration(i)*time.Hour, Duration: 30 * time.Minute, GPUs: 4, Priority: PrioHigh})
	}
	cfg, blind, err := PolicyConfig("atoll")
	if err != nil {
		t.Fatal(err)
	}
	res, err := runConfig(t.Context(), "atoll", InfoOracle, cfg, blind, jobs, snap, model)
	if err != nil {
		t.Fatal(err)
	}
	if res.Shrinks == 0 || res.Preemptions != 0 {
		t.Fatalf("shrinks %d, preemptions %d: want shrinks and no eviction", res.Shrinks, res.Preemptions)
	}
	if res.Grows == 0 {
		t.Fatalf("no grow back after the high-priority jobs left: %+v", res)
	}
	if res.GoodputPct < 99 || res.HighPrioQueueDelay.Mean > 120 {
		t.Fatalf("goodput %v%%, high-priority wait %v s", res.GoodputPct, res.HighPrioQueueDelay.Mean)
	}
}

func TestSaturateAndElasticShare(t *testing.T) {
	snap := gang.Snapshot{Nodes: []gang.Node{{Name: "n", GPUs: make([]gang.GPU, 8)}}}
	var jobs []Job
	for i := 0; i < 100; i++ {
		jobs = append(jobs, Job{Submit: time.Duration(i) * time.Hour, Duration: time.Hour, GPUs: 1 + i%4})
	}
	// Offered: 250 GPU-hours over 99 hours on 8 GPUs (792 GPU-hours): compress 2 × 792 / 250.
	k := Saturate(jobs, snap, 2)
	if math.Abs(k-2*792.0/250) > 1e-9 || jobs[99].Submit != time.Duration(float64(99*time.Hour)/k) || jobs[0].Submit != 0 {
		t.Fatalf("compression %v, last arrival %s", k, jobs[99].Submit)
	}
	if Saturate(jobs, snap, 0.01) != 1 {
		t.Fatal("a light load must not stretch arrivals")
	}
	a := append([]Job(nil), jobs...)
	b := append([]Job(nil), jobs...)
	MakeElastic(a, 0.5, 3)
	MakeElastic(b, 0.5, 3)
	n := 0
	for i := range a {
		if a[i].MinGPUs != b[i].MinGPUs {
			t.Fatal("same seed, different elastic jobs")
		}
		if a[i].MinGPUs > 0 {
			n++
			if a[i].GPUs < 2 || a[i].MinGPUs != (a[i].GPUs+1)/2 {
				t.Fatalf("job %+v", a[i])
			}
		}
	}
	if n < 20 || n > 55 {
		t.Fatalf("%d elastic jobs of 75 multi-GPU ones at share 0.5", n)
	}
}

// TestStrategyReplay: jobs with a placement strategy go through the core's cycle like any
// on four 8-GPU machines: strict spread puts every one-GPU member on its own machine (and
// rejects the 5-GPU job), strict pack all on one, spread takes every machine (the 5-GPU
// job doubling up on one).
func TestStrategyReplay(t *testing.T) {
	snap, model, _, err := LoadCluster("4xdgx-h100/4", false, nil)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		strategy     gang.Strategy
		machines     float64 // mean machines per multi-GPU placement
		rejectedWide bool    // the 5-GPU job is rejected
	}{
		{gang.StrategyStrictSpread, 4, true},
		{gang.StrategyStrictPack, 1, false},
		{gang.StrategySpread, 4, false},
	}
	for _, tt := range tests {
		t.Run(string(tt.strategy), func(t *testing.T) {
			var jobs []Job
			for i := range 12 {
				jobs = append(jobs, Job{ID: fmt.Sprint("j", i), Submit: time.Duration(i) * time.Minute, Duration: time.Hour, GPUs: 4, Priority: PrioNormal, Strategy: tt.strategy})
			}
			jobs = append(jobs, Job{ID: "wide", Submit: time.Hour, Duration: time.Hour, GPUs: 5, Priority: PrioNormal, Strategy: tt.strategy})
			cfg, blind, err := PolicyConfig("atoll")
			if err != nil {
				t.Fatal(err)
			}
			res, err := runConfig(t.Context(), "atoll", InfoOracle, cfg, blind, jobs, snap, model)
			if err != nil {
				t.Fatal(err)
			}
			wantRejected := 0
			if tt.rejectedWide {
				wantRejected = 1
			}
			if res.Rejected != wantRejected || res.Jobs != len(jobs) {
				t.Fatalf("rejected %d of %d jobs, want %d", res.Rejected, res.Jobs, wantRejected)
			}
			placements := 12 + 1 - wantRejected
			if res.MultiGPUPlacements < placements {
				t.Fatalf("%d multi-GPU placements, want at least %d", res.MultiGPUPlacements, placements)
			}
			if math.Abs(res.MeanMachines-tt.machines) > 1e-9 {
				t.Fatalf("mean machines per placement %v, want %v", res.MeanMachines, tt.machines)
			}
		})
	}
}

// TestCommittedTraces: the traces under testdata/traces are the upstream files, byte for
// byte (the Philly trace once gunzipped): their SHA-256 prefixes are those
// testdata/traces/README.md lists, and the loaders read every one of them.
func TestCommittedTraces(t *testing.T) {
	dir := tracesDir(t)
	want := map[string]string{
		"alibaba-openb-v2023/openb_node_list_gpu_node.csv":         "2beca64b4d3dfa34",
		"alibaba-openb-v2023/openb_pod_list_default.csv":           "1ee7ed79c27a3b08",
		"alibaba-openb-v2023/openb_pod_list_gpuspec33.csv":         "eca4f746db1e5b25",
		"alibaba-openb-v2023/openb_pod_list_multigpu50.csv":        "206f2f5959db30ec",
		"microsoft-itp-elasticflow/cluster02.csv":                  "7a5849e73aff9f9b",
		"microsoft-itp-elasticflow/cluster04.csv":                  "247850e4265f3574",
		"microsoft-itp-elasticflow/cluster10.csv":                  "139abea485b52090",
		"philly/philly_trace_rfold.csv.gz":                         "ccd6e87c569d6b5e",
		"philly/philly_cluster_machine_list.csv":                   "5a3f3ad190fcf75b",
		"azure-llm-inference-2023/AzureLLMInferenceTrace_code.csv": "54e9a6d2a4bd06ba",
	}
	for name, prefix := range want {
		f, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		var r io.Reader = f
		if strings.HasSuffix(name, ".gz") {
			z, err := gzip.NewReader(f)
			if err != nil {
				t.Fatal(err)
			}
			r = z
		}
		h := sha256.New()
		if _, err := io.Copy(h, r); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		f.Close()
		if got := hex.EncodeToString(h.Sum(nil))[:16]; got != prefix {
			t.Errorf("%s: SHA-256 %s…, want %s… (the upstream file)", name, got, prefix)
		}
	}
	jobs, format, err := LoadJobs(filepath.Join(dir, "philly", "philly_trace_rfold.csv.gz"), false, nil)
	if err != nil || format != "philly" || len(jobs) != 111549 {
		t.Fatalf("Philly trace: %d jobs, format %q, %v; want 111,549 philly jobs", len(jobs), format, err)
	}
	snap, _, _, err := LoadCluster(filepath.Join(dir, "philly", "philly_cluster_machine_list.csv"), false, nil)
	if err != nil || len(snap.Nodes) != 552 {
		t.Fatalf("Philly machine list: %d machines, %v; want 552", len(snap.Nodes), err)
	}
}

// TestClassOnly: --class-only replays the jobs of one class after the seeded assignment
// (the same jobs that class has in the full replay), and refuses an unknown class.
func TestClassOnly(t *testing.T) {
	snap := gang.Snapshot{Nodes: []gang.Node{{Name: "n", GPUs: make([]gang.GPU, 8)}}}
	var jobs []Job
	for i := range 200 {
		jobs = append(jobs, Job{ID: fmt.Sprint(i), Submit: time.Duration(i) * time.Minute, Duration: time.Hour, GPUs: 1})
	}
	all, _, err := prepareJobs(context.Background(), jobs, snap, nil, DynamicOptions{PrioritySeed: 1})
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, j := range all {
		if j.Priority == PrioHigh {
			want = append(want, j.ID)
		}
	}
	high, _, err := prepareJobs(context.Background(), jobs, snap, nil, DynamicOptions{PrioritySeed: 1, ClassOnly: "high"})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, j := range high {
		got = append(got, j.ID)
	}
	if len(want) == 0 || len(want) == len(jobs) || !slices.Equal(got, want) {
		t.Fatalf("class-only high kept %v; want the %d high-priority jobs of the full replay %v", got, len(want), want)
	}
	if err := (DynamicOptions{ClassOnly: "urgent"}).Validate(); err == nil || !strings.Contains(err.Error(), `class "urgent"`) {
		t.Fatalf("an unknown class: %v", err)
	}
}
