package gang

import (
	"errors"
	"fmt"
	"math"
	"testing"
	"time"
)

// runGang submits, places and completes a one-GPU-member gang of n members that runs for d.
func runGang(t *testing.T, s *Scheduler, id string, n int, limit, d time.Duration, now time.Time) time.Time {
	t.Helper()
	if _, err := s.Submit(Request{ID: id, Min: n, Member: Member{GPUs: 1}, TimeLimit: limit}, now); err != nil {
		t.Fatal(err)
	}
	if dec := s.Cycle(now); len(dec.Placements) != 1 {
		t.Fatalf("%s not placed: %+v", id, dec.Waiting)
	}
	if err := s.Complete(id, now.Add(d)); err != nil {
		t.Fatal(err)
	}
	return now.Add(d)
}

// queued returns what the queue order sees of a pending gang: its expected GPU-seconds left.
func queuedLeft(t *testing.T, s *Scheduler, id string, now time.Time) float64 {
	t.Helper()
	g, ok := s.gangs[id]
	if !ok {
		t.Fatalf("no gang %s", id)
	}
	return s.queuedView(g, now).RemainingGPUSeconds
}

// TestRuntimePredictor: with no declared Duration, the expected run time left of a gang
// is learnt from the gangs of its kind that completed: the mean of (r − age) over the runs
// r longer than its age, per queue and GPUs, then per queue; capped by its time limit and
// learnt per limit; nothing is predicted before three runs of a kind say something. The
// learnt state carries over to another scheduler exactly, and gangs withdrawn with Finish
// teach nothing.
func TestRuntimePredictor(t *testing.T) {
	s, err := New(DefaultConfig(), testSnapshot(2, 8, 2))
	if err != nil {
		t.Fatal(err)
	}
	now := epoch
	if _, err := s.Submit(Request{ID: "early", Min: 2, Member: Member{GPUs: 1}}, now); err != nil {
		t.Fatal(err)
	}
	if l := queuedLeft(t, s, "early", now); l != 0 {
		t.Fatalf("nothing completed yet, predicted %v GPU-s left", l)
	}
	if err := s.Finish("early", now); err != nil {
		t.Fatal(err)
	}
	// Two-GPU gangs of 1 h, 2 h and 3 h complete, and one that Finish withdraws (it teaches
	// nothing): a gang of 2 GPUs expects (1+2+3)/3 = 2 h at age 0, 4 GPU-hours.
	for i, d := range []time.Duration{time.Hour, 2 * time.Hour, 3 * time.Hour} {
		now = runGang(t, s, fmt.Sprint("two", i), 2, 0, d, now)
	}
	if _, err := s.Submit(Request{ID: "withdrawn", Min: 2, Member: Member{GPUs: 1}}, now); err != nil {
		t.Fatal(err)
	}
	s.Cycle(now)
	if err := s.Finish("withdrawn", now.Add(100*time.Hour)); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"probe", "probe8"} {
		n := map[string]int{"probe": 2, "probe8": 8}[id]
		if _, err := s.Submit(Request{ID: id, Min: n, Member: Member{GPUs: 1}}, now); err != nil {
			t.Fatal(err)
		}
	}
	if l := queuedLeft(t, s, "probe", now); math.Abs(l-2*3600*2) > 1e-6 {
		t.Fatalf("probe expects %v GPU-s left, want %v", l, 2*3600*2)
	}
	// The 8-GPU probe has no run of its kind: the queue's runs (all 2-GPU) say 2 h, at 8 GPUs.
	if l := queuedLeft(t, s, "probe8", now); math.Abs(l-2*3600*8) > 1e-6 {
		t.Fatalf("probe8 expects %v GPU-s left, want %v (the queue's runs)", l, 2*3600*8)
	}
	// Running at age 30 min, a 2-GPU gang expects the mean of (1, 2, 3 h) − 30 min.
	s.Cycle(now)
	g := s.gangs["probe"]
	if g.status != stRunning {
		t.Fatal("probe not placed")
	}
	if left, ok := s.expectedLeft(g, now.Add(30*time.Minute)); !ok || left != 90*time.Minute {
		t.Fatalf("at 30 min the probe expects %v (%v), want 1h30m", left, ok)
	}
	// Past the shortest run, too few are longer (two), at its kind and at the queue's.
	if _, ok := s.expectedLeft(g, now.Add(90*time.Minute)); ok {
		t.Fatal("a prediction from fewer than three runs")
	}
	// Time limits: learnt per limit, capped by it.
	for i, d := range []time.Duration{10 * time.Minute, 20 * time.Minute, 30 * time.Minute} {
		now = runGang(t, s, fmt.Sprint("lim", i), 1, time.Hour, d, now.Add(time.Hour))
	}
	limited := map[string]Request{
		"limited":  {ID: "limited", Min: 1, Member: Member{GPUs: 1}, TimeLimit: time.Hour},
		"limited2": {ID: "limited2", Min: 1, Member: Member{GPUs: 1}, TimeLimit: 2 * time.Hour},
		"limited4": {ID: "limited4", Min: 4, Member: Member{GPUs: 1}, TimeLimit: 3 * time.Hour},
	}
	for _, id := range []string{"limited", "limited2", "limited4"} {
		if _, err := s.Submit(limited[id], now); err != nil {
			t.Fatal(err)
		}
	}
	for _, tt := range []struct {
		id   string
		want float64
		why  string
	}{
		{"limited", 1200, "the mean of its limit's runs"},
		// Shares of their limits the runs used: 1/6, 1/3, 1/2, mean 1/3.
		{"limited2", 2400, "a third of its 2 h limit (its GPUs' shares)"},
		{"limited4", 4 * 3600, "a third of its 3 h limit (the queue's shares), at 4 GPUs"},
	} {
		if l := queuedLeft(t, s, tt.id, now); math.Abs(l-tt.want) > 1e-6 {
			t.Fatalf("%s expects %v GPU-s, want %v: %s", tt.id, l, tt.want, tt.why)
		}
	}

	// The state carries over: a scheduler given it predicts the same.
	s2, err := New(DefaultConfig(), testSnapshot(2, 8, 2))
	if err != nil {
		t.Fatal(err)
	}
	s2.SetLearnedRuntimes(s.LearnedRuntimes())
	for _, id := range []string{"limited", "limited2", "limited4"} {
		if _, err := s2.Submit(limited[id], now); err != nil {
			t.Fatal(err)
		}
		if a, b := queuedLeft(t, s, id, now), queuedLeft(t, s2, id, now); a != b {
			t.Fatalf("%s: %v GPU-s left here, %v on the scheduler given the learnt state", id, a, b)
		}
	}
	if err := s.Complete("nosuch", now); !errors.Is(err, ErrUnknownGang) {
		t.Fatalf("Complete of an unknown gang: %v", err)
	}
}

// TestRuntimePredictorOff: without Config.Predict nothing is learnt, and a declared
// Duration always wins over the history.
func TestRuntimePredictorOff(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Predict.Enabled = false
	s, err := New(cfg, testSnapshot(1, 8, 1))
	if err != nil {
		t.Fatal(err)
	}
	now := epoch
	for i := range 3 {
		now = runGang(t, s, fmt.Sprint("g", i), 1, 0, time.Hour, now)
	}
	if r := s.LearnedRuntimes(); r.Updates != 0 || len(r.Kinds) != 0 {
		t.Fatalf("learnt %+v with the predictor off", r)
	}
	cfg.Predict = PredictConfig{Enabled: true, Window: 0}
	if err := cfg.Validate(); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("a window of 0 accepted: %v", err)
	}
	on, err := New(DefaultConfig(), testSnapshot(1, 8, 1))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		now = runGang(t, on, fmt.Sprint("g", i), 1, 0, time.Hour, now)
	}
	if _, err := on.Submit(Request{ID: "declared", Min: 1, Member: Member{GPUs: 1}, Duration: 10 * time.Minute}, now); err != nil {
		t.Fatal(err)
	}
	if l := queuedLeft(t, on, "declared", now); l != 600 {
		t.Fatalf("a declared 10 min gang expects %v GPU-s, want 600", l)
	}
	if _, err := on.Submit(Request{ID: "negative", Min: 1, Member: Member{GPUs: 1}, TimeLimit: -time.Second}, now); !errors.Is(err, ErrInvalidRequest) {
		t.Fatalf("a negative time limit: %v", err)
	}
}
