package poolsim

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/atoll-run/atoll/pools"
)

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-6*math.Max(1, math.Abs(b)) }

// TestBounds checks the bounds' definitions on a trace small enough to work out by hand.
func TestBounds(t *testing.T) {
	set, err := WithSpotDiscount(testSet(t, 4, 4, 0), 60)
	if err != nil {
		t.Fatal(err)
	}
	od := poolOf(t, set, pools.OnDemand).Spec.PricePerHour / 8
	spot := poolOf(t, set, pools.Spot).Spec.PricePerHour / 8
	jobs := []Job{
		{ID: "a", Submit: 0, Duration: 2 * time.Hour, GPUs: 1},
		{ID: "b", Submit: 0, Duration: time.Hour, GPUs: 8},
		{ID: "c", Submit: 3 * time.Hour, Duration: time.Hour, GPUs: 16},
	}
	b, err := boundsOf(jobs, set)
	if err != nil {
		t.Fatal(err)
	}
	// Work: 2 + 8 + 16 = 26 GPU-hours. Running on arrival: 9 cards for 1 h (2 machines),
	// 1 card for 1 h (1 machine), nothing for 1 h, 16 cards for 1 h (2 machines): 40 paid.
	if !near(b.onDemandWork, 26*od) || !near(b.oracle, 26*spot) {
		t.Errorf("on-demand work %.2f, oracle %.2f; want %.2f and %.2f", b.onDemandWork, b.oracle, 26*od, 26*spot)
	}
	if !near(b.goodputBound, 100*26.0/40) || !near(b.noDelay, 40*spot) {
		t.Errorf("goodput bound %.3f%%, no-delay oracle %.2f; want %.3f%% and %.2f", b.goodputBound, b.noDelay, 100*26.0/40, 40*spot)
	}
	if !near(b.discountPct, 60) {
		t.Errorf("discount %.3f%%, want 60", b.discountPct)
	}
	r := Result{Cost: 20 * od}
	b.fill(&r)
	if !near(r.MaxSavingPct, 60) || !near(r.SavingPct, 100*(1-20.0/26)) || !near(r.SavingOfMaxPct, 100*r.SavingPct/60) {
		t.Errorf("result %+v", r)
	}
}

func TestWithSpotDiscount(t *testing.T) {
	set := testSet(t, 4, 4, 0)
	odPrice := poolOf(t, set, pools.OnDemand).Spec.PricePerHour
	spotPrice := poolOf(t, set, pools.Spot).Spec.PricePerHour
	for _, pct := range []float64{0, 40, 90, 99.5} {
		s, err := WithSpotDiscount(set, pct)
		if err != nil {
			t.Fatalf("%v%%: %v", pct, err)
		}
		if got, want := poolOf(t, s, pools.Spot).Spec.PricePerHour, odPrice*(1-pct/100); !near(got, want) {
			t.Errorf("%v%%: spot %.4f USD/h, want %.4f", pct, got, want)
		}
		if !near(discountOf(s), pct) {
			t.Errorf("%v%%: reported discount %.4f", pct, discountOf(s))
		}
	}
	if poolOf(t, set, pools.Spot).Spec.PricePerHour != spotPrice {
		t.Error("the original set was changed")
	}
	for _, pct := range []float64{-1, 100, math.NaN()} {
		if _, err := WithSpotDiscount(set, pct); err == nil {
			t.Errorf("%v%% accepted", pct)
		}
	}
	if _, err := WithSpotDiscount(testSet(t, 4, 0, 0), 50); err == nil || !strings.Contains(err.Error(), "no on-demand pool") {
		t.Errorf("a spot pool without an on-demand counterpart: %v", err)
	}
}
