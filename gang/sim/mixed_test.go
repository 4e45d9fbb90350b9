package sim

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/atoll-run/atoll/gang"
)

// TestServiceSLOAccounting: a one-slot replica serves three requests; the second waits
// for the first's batch slot and misses the 0.8 s SLO, the others are within it.
func TestServiceSLOAccounting(t *testing.T) {
	reqs := []InferenceRequest{
		{At: 0, Context: 500, Generated: 5},                      // prefill 0.5 s, decode 0.5 s: slot busy until 1 s
		{At: 100 * time.Millisecond, Context: 100, Generated: 1}, // waits 0.9 s + 0.1 s prefill: TTFT 1 s
		{At: 5 * time.Second, Context: 100, Generated: 1},        // TTFT 0.1 s
	}
	opt := DefaultMixedOptions()
	opt.Service = ServiceSpec{MinReplicas: 1, MaxReplicas: 1, GPUsPerReplica: 1, LatencySLO: 800 * time.Millisecond}
	opt.Model = ReplicaModel{PrefillTokensPerGPUSecond: 1000, DecodeTBT: 100 * time.Millisecond, Batch: 1}
	opt.Load = InferenceLoad{Scale: 1}
	svc := fixedService(reqs, opt, 0, 6*time.Second, 1)
	if svc.served != 3 || svc.within != 2 {
		t.Fatalf("served %d, within the SLO %d; want 3 and 2", svc.served, svc.within)
	}
	if p99 := svc.ttftP99(); p99 != 1.001 {
		t.Errorf("TTFT p99 %v s, want 1.001 (the 1 s bucket's upper edge)", p99)
	}
	res := mixedResult(DynamicResult{}, svc, 1, 0, 6*time.Second, 0)
	if res.InferenceSLOAttainmentPct != 66.66 {
		t.Errorf("attainment %v%%, want 66.66 (2 of 3, rounded down)", res.InferenceSLOAttainmentPct)
	}
}

// TestMixedAtollTakesGPUsBackAndReturnsThem: two elastic training gangs fill two of three
// machines beside a one-replica service; an hour-long burst of requests makes the
// autoscaler ask for two more replicas, which the atoll policy gets by shrinking or
// preempting training; after the burst the replicas drain and the training gangs get their
// GPUs back (a restart or a grow). The service is sized so the burst fits.
func TestMixedAtollTakesGPUsBackAndReturnsThem(t *testing.T) {
	snap, model, _, err := LoadCluster("3xdgx-h100/8", false, nil)
	if err != nil {
		t.Fatal(err)
	}
	jobs := []Job{
		{ID: "a", Submit: 0, Duration: 10 * time.Hour, GPUs: 8, MinGPUs: 4, Priority: PrioLow},
		{ID: "b", Submit: 0, Duration: 10 * time.Hour, GPUs: 8, MinGPUs: 4, Priority: PrioLow},
		{ID: "c", Submit: 4 * time.Hour, Duration: time.Minute, GPUs: 1, Priority: PrioLow},
	}
	// One request a second, each holding its slot 1 s; ten a second from 1 h to 2 h.
	var reqs []InferenceRequest
	for s := 0; s < 4*3600; s++ {
		n := 1
		if s >= 3600 && s < 7200 {
			n = 10
		}
		for k := range n {
			reqs = append(reqs, InferenceRequest{At: time.Duration(s)*time.Second + time.Duration(k)*time.Second/time.Duration(n), Context: 100, Generated: 100})
		}
	}
	opt := DefaultMixedOptions()
	opt.Service = ServiceSpec{MinReplicas: 1, MaxReplicas: 3, GPUsPerReplica: 8, LatencySLO: time.Second}
	opt.Model = ReplicaModel{PrefillTokensPerGPUSecond: 1e6, DecodeTBT: 10 * time.Millisecond, Batch: 4, Startup: time.Minute}
	opt.Load = InferenceLoad{Scale: 1}
	cfg, blind, err := PolicyConfig("atoll")
	if err != nil {
		t.Fatal(err)
	}
	cfg.MinRunBeforePreempt = 0
	svc := newServiceSide(opt.Service, opt.Model, opt.Autoscale, newArrivals(reqs, opt.Load, 0, jobs[2].Submit), jobs[2].Submit)
	r, err := replayJobsSvc(context.Background(), "atoll", InfoBlind, cfg, blind, jobs, snap, model, svc)
	if err != nil {
		t.Fatal(err)
	}
	if svc.peakReplicas < 2 || svc.scaleUps < 1 {
		t.Fatalf("peak %d replicas, %d scale-ups: the burst did not scale the service up", svc.peakReplicas, svc.scaleUps)
	}
	if r.res.Preemptions+r.res.Shrinks == 0 {
		t.Fatalf("no preemption or shrink: the replicas did not take GPUs from training (%+v)", r.res.PreemptionsByCause)
	}
	if svc.scaleDowns < 1 || svc.active() != 1 {
		t.Fatalf("%d scale-downs, %d replicas at the end: the service did not give the GPUs back", svc.scaleDowns, svc.active())
	}
	returned := r.res.Grows > 0
	for _, s := range r.starts {
		if s.Job < 2 && s.At > 2*time.Hour {
			returned = true
		}
	}
	if !returned {
		t.Errorf("no training gang restarted or grew after the burst: starts %v, grows %d", r.starts, r.res.Grows)
	}
	if svc.served != len(reqs) || svc.unserved != 0 {
		t.Errorf("served %d of %d requests, %d without a replica", svc.served, len(reqs), svc.unserved)
	}
}

// TestWeightsChangeTheAtollPolicy: the same contended slice under the hand-set weights
// and under weights with no class preference gives a different high-priority queueing;
// the other policies are untouched by the weights.
func TestWeightsChangeTheAtollPolicy(t *testing.T) {
	jobs, _, err := LoadJobs(filepath.Join(tracesDir(t), "microsoft-itp-elasticflow", "cluster02.csv"), false, nil)
	if err != nil {
		t.Fatal(err)
	}
	snap, model, _, err := LoadCluster("4xdgx-h100/8", false, nil)
	if err != nil {
		t.Fatal(err)
	}
	w := gang.WeightsOf(gang.DefaultConfig())
	w.ClassWeight, w.RemainingAgingHours = 1, 0
	run := func(w *gang.SchedulerWeights) []DynamicResult {
		res, err := RunDynamic(context.Background(), jobs, snap, model, DynamicOptions{MaxJobs: 200, PrioritySeed: 1, Policies: []string{"atoll", "volcano"}, Weights: w})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	hand, flat := run(nil), run(&w)
	if hand[0].HighPrioQueueDelay == flat[0].HighPrioQueueDelay && hand[0].JCT == flat[0].JCT {
		t.Errorf("atoll: the same high-priority queueing %v and JCT %v with class weight 1 as with 8", hand[0].HighPrioQueueDelay, hand[0].JCT)
	}
	if hand[1].JCT != flat[1].JCT {
		t.Errorf("volcano changed with the atoll weights: JCT %v, %v", hand[1].JCT, flat[1].JCT)
	}
}

// TestWeightsFileRoundTrip: a written file reads back; unknown fields and out-of-range
// weights are refused with the field named.
func TestWeightsFileRoundTrip(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "w.json")
	w := gang.WeightsOf(gang.DefaultConfig())
	w.ClassWeight = 3
	if err := gang.WriteWeightsFile(p, gang.WeightsFile{Weights: w}); err != nil {
		t.Fatal(err)
	}
	got, err := gang.ReadWeightsFile(p)
	if err != nil || got != w {
		t.Fatalf("read back %+v, %v; want %+v", got, err, w)
	}
	for _, bad := range []struct{ body, want string }{
		{`{"weights":{"alpha":1,"class_weight":2,"gama":1}}`, `unknown field "gama"`},
		{`{"weights":{"class_weight":0.5}}`, "class_weight 0.5 must be >= 1"},
		{`{"weights":{"class_weight":2,"binpack":-1}}`, "binpack -1 outside"},
	} {
		if err := os.WriteFile(p, []byte(bad.body), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := gang.ReadWeightsFile(p); err == nil || !contains(err.Error(), bad.want) {
			t.Errorf("%s: error %v, want it to say %q", bad.body, err, bad.want)
		}
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

// TestLoadInferenceBadRows: a bad timestamp or token count is refused with the file, line
// and column; with skipping, the good rows load, sorted, timed from the first.
func TestLoadInferenceBadRows(t *testing.T) {
	p := filepath.Join(t.TempDir(), "inf.csv")
	body := "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:05.5,10,2\nyesterday,1,1\n2023-11-16 18:17:03.9799600,-4,1\n2023-11-16 18:17:04,7,3\n"
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadInference(p, false, nil); err == nil || !strings.Contains(err.Error(), "inf.csv:3") || !strings.Contains(err.Error(), "TIMESTAMP") {
		t.Errorf("bad timestamp: %v", err)
	}
	sk := &Skipper{}
	rs, err := LoadInference(p, true, sk)
	if err != nil || len(sk.Errors) != 2 || len(rs) != 2 || rs[0].Context != 7 || rs[1].At != 1500*time.Millisecond {
		t.Fatalf("skipping: %+v, %v, skipped %v", rs, err, sk.Errors)
	}
	if !strings.Contains(sk.Errors[1].Error(), "inf.csv:4") || !strings.Contains(sk.Errors[1].Error(), "contexttokens") {
		t.Errorf("negative tokens: %v", sk.Errors[1])
	}
}
