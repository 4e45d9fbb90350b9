package head

import (
	"testing"
	"time"

	"github.com/atoll-run/atoll/runtime/api"
)

func ruleSpec() api.ServiceSpec {
	s := api.ServiceSpec{Job: "j", Name: "s", Kind: "k", MinReplicas: 2, MaxReplicas: 4, TargetInFlight: 4,
		LatencySLO: api.Duration(100 * time.Millisecond), Resources: api.Resources{GPUs: 1}}
	if err := s.Normalize(); err != nil {
		panic(err)
	}
	return s
}

// TestServiceScaleRule checks the scaling rule step by step: its bounds, its cooldowns,
// its low-load wait, the SLO's pull, and that it holds without reports.
func TestServiceScaleRule(t *testing.T) {
	t0 := time.Unix(1000, 0)
	s := ruleSpec() // 2..4, target 4, up cooldown 2 s, down cooldown 10 s
	for _, tc := range []struct {
		name string
		in   scaleInput
		at   time.Duration // after t0
		want int
		low  bool // a low-load mark is kept
	}{
		{"no reports: hold", scaleInput{Replicas: 2, InFlight: 100}, time.Minute, 2, false},
		{"burst: up to the load", scaleInput{Replicas: 2, InFlight: 13, Reporting: 2}, time.Minute, 4, false},
		{"burst past the max: held to it", scaleInput{Replicas: 2, InFlight: 400, Reporting: 2}, time.Minute, 4, false},
		{"up inside the cooldown: hold", scaleInput{Replicas: 2, InFlight: 13, Reporting: 2, Scaled: t0}, time.Second, 2, false},
		{"up after the cooldown", scaleInput{Replicas: 2, InFlight: 13, Reporting: 2, Scaled: t0}, 2 * time.Second, 4, false},
		{"latency over the SLO: one more", scaleInput{Replicas: 2, InFlight: 1, Reporting: 2, Latency: 150 * time.Millisecond}, time.Minute, 3, false},
		{"at the target: hold", scaleInput{Replicas: 3, InFlight: 12, Reporting: 3}, time.Minute, 3, false},
		{"below the target, above half: hold, not low", scaleInput{Replicas: 3, InFlight: 7, Reporting: 3}, time.Minute, 3, false},
		{"low, just now: mark, hold", scaleInput{Replicas: 4, InFlight: 0, Reporting: 4}, time.Minute, 4, true},
		{"low for less than the cooldown: hold", scaleInput{Replicas: 4, InFlight: 0, Reporting: 4, LowSince: t0.Add(55 * time.Second)}, time.Minute, 4, true},
		{"low for the cooldown: down to the min", scaleInput{Replicas: 4, InFlight: 0, Reporting: 4, LowSince: t0.Add(50 * time.Second)}, time.Minute, 2, false},
		{"low, but a decision inside the cooldown: hold", scaleInput{Replicas: 4, InFlight: 0, Reporting: 4, LowSince: t0, Scaled: t0.Add(55 * time.Second)}, time.Minute, 4, true},
		{"low, latency above half the SLO: not low", scaleInput{Replicas: 4, InFlight: 0, Reporting: 4, LowSince: t0, Latency: 60 * time.Millisecond}, time.Minute, 4, false},
		{"down to what half the target needs", scaleInput{Replicas: 4, InFlight: 5, Reporting: 4, LowSince: t0}, time.Minute, 3, false},
		{"below the min (a spec's old record): to the min", scaleInput{Replicas: 1}, time.Minute, 2, false},
		{"above the max: to the max", scaleInput{Replicas: 9, Reporting: 1}, time.Minute, 4, false},
	} {
		in := tc.in
		in.Spec = s
		d := decideScale(in, t0.Add(tc.at))
		if d.Replicas != tc.want || d.LowSince.IsZero() == tc.low {
			t.Errorf("%s: %d replicas (low since %v, %q), want %d (low mark %v)", tc.name, d.Replicas, d.LowSince, d.Reason, tc.want, tc.low)
		}
		if d.Replicas < s.MinReplicas || d.Replicas > s.MaxReplicas {
			t.Errorf("%s: %d replicas, outside %d..%d", tc.name, d.Replicas, s.MinReplicas, s.MaxReplicas)
		}
	}
}

// TestServiceScaleRuleDoesNotOscillate runs the rule over every steady load from 0 to 30
// requests in flight, from every starting size, for ten minutes of sweeps every 200 ms:
// the replicas move one way only (never up after a down nor down after an up), stay in
// their bounds, and end where the load puts them.
func TestServiceScaleRuleDoesNotOscillate(t *testing.T) {
	s := ruleSpec()
	t0 := time.Unix(1000, 0)
	for load := 0; load <= 30; load++ {
		for start := s.MinReplicas; start <= s.MaxReplicas; start++ {
			in := scaleInput{Spec: s, Replicas: start}
			dir := 0
			for now := t0; now.Before(t0.Add(10 * time.Minute)); now = now.Add(200 * time.Millisecond) {
				in.InFlight, in.Reporting = load, in.Replicas
				d := decideScale(in, now)
				if d.Replicas != in.Replicas {
					step := 1
					if d.Replicas < in.Replicas {
						step = -1
					}
					if dir != 0 && step != dir {
						t.Fatalf("load %d from %d: turned back to %d replicas at %v", load, start, d.Replicas, now.Sub(t0))
					}
					dir = step
					in.Replicas, in.Scaled = d.Replicas, now
				}
				in.LowSince = d.LowSince
				if in.Replicas < s.MinReplicas || in.Replicas > s.MaxReplicas {
					t.Fatalf("load %d from %d: %d replicas, outside the bounds", load, start, in.Replicas)
				}
			}
			up := min(s.MaxReplicas, max(s.MinReplicas, ceilDiv(load, 4)))
			down := min(s.MaxReplicas, max(s.MinReplicas, ceilDiv(2*load, 4)))
			if in.Replicas < up || in.Replicas > max(up, down) {
				t.Errorf("load %d from %d: ended at %d replicas, want %d..%d", load, start, in.Replicas, up, max(up, down))
			}
		}
	}
}
