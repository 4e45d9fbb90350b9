package testtime

import (
	"testing"
	"time"
)

func TestMeasure(t *testing.T) {
	for _, tc := range []struct {
		env  string
		load float64
		want float64
	}{
		{"", 0, 1},
		{"", 0.7, 1},
		{"", 2.5, 2.5},
		{"", 6, MaxFactor},
		{"", 40, MaxFactor},
		{"3", 0, 3},
		{"3", 9, 3},   // the variable wins over the load
		{"20", 0, 20}, // and is not capped
		{"0.5", 4, 1}, // below 1: ignored
		{"fast", 4, 1},
	} {
		if got, why := measure(tc.env, tc.load); got != tc.want || why == "" {
			t.Errorf("measure(%q, %v) = %v (%q), want %v", tc.env, tc.load, got, why, tc.want)
		}
	}
}

func TestDeadlineKeepsGraceBeforeTheTestsDeadline(t *testing.T) {
	d := Deadline(t, 1000*time.Hour)
	end, ok := t.Deadline()
	if !ok {
		t.Skip("no test deadline (go test -timeout 0)")
	}
	if want := end.Add(-Grace); !d.Equal(want) {
		t.Fatalf("a wait longer than the test's time: deadline %v, want %v (the test's less Grace)", d, want)
	}
	f, _ := Factor()
	if left := time.Until(Deadline(t, time.Second)); left > Scale(time.Second) || left < Scale(time.Second)-time.Second {
		t.Fatalf("a one-second wait ends in %v (factor %v)", left, f)
	}
}
