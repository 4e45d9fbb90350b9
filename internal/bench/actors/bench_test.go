package actors

import (
	"context"
	"testing"
)

// TestRunMeasuresOneCallAtLeast: a run whose deadline has passed before its pairs start
// (a loaded machine, a short --duration) still times one call of each pair, so its rate is
// a measurement, not 0.
func TestRunMeasuresOneCallAtLeast(t *testing.T) {
	c, err := run(context.Background(), "x", 3, 0, func(int, int) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	if c.TotalCalls < 3 || c.CallsPerS <= 0 {
		t.Fatalf("a run past its deadline: %d calls, %v calls/s; want one call of each of 3 pairs at least", c.TotalCalls, c.CallsPerS)
	}
}
