package head

import (
	"fmt"
	"time"

	"github.com/atoll-run/atoll/runtime/api"
)

// The services' scaling rule: a pure function of a service's spec, its decided replicas,
// the time of its last decision and the load its replicas reported (time is an input).
//
//   - Up: the replicas wanted are ceil(in flight / TargetInFlight), and one more than now
//     when a replica's mean latency passes the LatencySLO; the service grows to them (at
//     most MaxReplicas) when ScaleUpCooldown has passed since its last decision.
//   - Down: only when the load would fit in fewer replicas at half the target
//     (ceil(2 × in flight / TargetInFlight), at least MinReplicas) and the latency is at
//     most half the SLO, without a break for ScaleDownCooldown, and ScaleDownCooldown has
//     passed since the last decision.
//
// The factor two between the two thresholds is the hysteresis: after a scale down to
// ceil(2L/T) the up rule asks for ceil(L/T) ≤ ceil(2L/T) replicas, and after a scale up to
// ceil(L/T) the down rule asks for ceil(2L/T) ≥ ceil(L/T): a steady load never moves the
// service back the way it came. With no fresh report the rule holds (a new leader starts
// without loads, and decides once its replicas report).

// scaleInput is what the rule decides from.
type scaleInput struct {
	Spec     api.ServiceSpec
	Replicas int       // decided now
	Scaled   time.Time // the last decision (zero: none since the service was made)
	LowSince time.Time // since when the load has been low without a break (zero: it is not)
	// InFlight is the requests in flight the fresh reports add up to, Reporting how many
	// replicas sent one, Latency the highest mean latency among them.
	InFlight  int
	Reporting int
	Latency   time.Duration
}

// scaleDecision is the rule's answer: the replicas (equal to the input's when it holds),
// the low-load mark to keep, and why it moved.
type scaleDecision struct {
	Replicas int
	LowSince time.Time
	Reason   string
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// decideScale applies the rule at now.
func decideScale(in scaleInput, now time.Time) scaleDecision {
	s := in.Spec
	d := scaleDecision{Replicas: in.Replicas}
	if d.Replicas < s.MinReplicas || d.Replicas > s.MaxReplicas {
		d.Replicas = min(max(d.Replicas, s.MinReplicas), s.MaxReplicas)
		d.Reason = fmt.Sprintf("held to its bounds %d..%d", s.MinReplicas, s.MaxReplicas)
		return d
	}
	if in.Reporting == 0 {
		return d // nothing to decide from
	}
	target := max(1, s.TargetInFlight)
	slo := time.Duration(s.LatencySLO)
	want := ceilDiv(in.InFlight, target)
	overSLO := slo > 0 && in.Latency > slo
	if overSLO {
		want = max(want, in.Replicas+1)
	}
	if want > in.Replicas {
		if in.Replicas < s.MaxReplicas && (in.Scaled.IsZero() || now.Sub(in.Scaled) >= time.Duration(s.ScaleUpCooldown)) {
			d.Replicas = min(want, s.MaxReplicas)
			d.Reason = fmt.Sprintf("%d requests in flight (target %d per replica)", in.InFlight, target)
			if overSLO {
				d.Reason += fmt.Sprintf(", latency %v over its SLO %v", in.Latency.Round(time.Millisecond), slo)
			}
		}
		return d
	}
	low := max(s.MinReplicas, ceilDiv(2*in.InFlight, target))
	if low >= in.Replicas || (slo > 0 && in.Latency > slo/2) {
		return d // not low: the mark is dropped
	}
	d.LowSince = in.LowSince
	if d.LowSince.IsZero() {
		d.LowSince = now
	}
	down := time.Duration(s.ScaleDownCooldown)
	if now.Sub(d.LowSince) >= down && (in.Scaled.IsZero() || now.Sub(in.Scaled) >= down) {
		d.Replicas, d.LowSince = low, time.Time{}
		d.Reason = fmt.Sprintf("%d requests in flight for %v fit %d replicas at half the target %d", in.InFlight, down, low, target)
	}
	return d
}
