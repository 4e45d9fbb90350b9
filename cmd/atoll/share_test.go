package main

import (
	"math"
	"testing"
)

func TestShareText(t *testing.T) {
	for _, c := range []struct {
		v    float64
		want string
	}{{0, "0.00"}, {0.5, "0.50"}, {2.25, "2.25"}, {1e9, "-"}, {math.NaN(), "-"}, {math.Inf(1), "-"}, {-1, "-"}} {
		if got := shareText(c.v); got != c.want {
			t.Errorf("shareText(%v) = %q, want %q", c.v, got, c.want)
		}
	}
}
