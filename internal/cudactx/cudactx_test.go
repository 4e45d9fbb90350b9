package cudactx

import (
	"errors"
	"testing"
)

// On a machine with a GPU and a -tags nvml build, Measure creates a real context; anywhere
// else it must say there is no driver, not pretend.
func TestMeasure(t *testing.T) {
	r, err := Measure()
	if errors.Is(err, ErrUnavailable) {
		t.Skipf("no CUDA driver here (%v): the measurement needs a GPU and -tags nvml", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if r.Create <= 0 || r.Device == "" {
		t.Fatalf("measurement %+v: want a positive creation time on a named device", r)
	}
	t.Logf("cuInit %v, cuCtxCreate %v, cuCtxDestroy %v on %s", r.Init, r.Create, r.Destroy, r.Device)
}
