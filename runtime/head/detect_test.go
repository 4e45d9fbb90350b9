package head

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/atoll-run/atoll/runtime/api"
)

// detectStep is one input to a failure detector at a time (seconds from the term's start):
// a heartbeat of machine m ("hb"), gossip about it ("failed", "left", "join"), or a sweep
// whose verdicts must be exactly want (machine names, "" for none) and whose pause report
// must be paused.
type detectStep struct {
	at     float64
	op, m  string
	want   string
	paused bool
}

// sweeps are sweeps every 200 ms from one time to another (both included), expecting no
// verdict.
func sweeps(from, to float64) []detectStep {
	var out []detectStep
	for at := from; at <= to+1e-9; at += 0.2 {
		out = append(out, detectStep{at: at, op: "sweep"})
	}
	return out
}

// heartbeats are sweeps every 200 ms with a heartbeat of m before each.
func heartbeats(m string, from, to float64) []detectStep {
	var out []detectStep
	for _, s := range sweeps(from, to) {
		out = append(out, detectStep{at: s.at, op: "hb", m: m}, s)
	}
	return out
}

func steps(parts ...any) []detectStep {
	var out []detectStep
	for _, p := range parts {
		switch v := p.(type) {
		case detectStep:
			out = append(out, v)
		case []detectStep:
			out = append(out, v...)
		}
	}
	return out
}

func TestFailureDetector(t *testing.T) {
	cfg := detectorConfig{silence: 10 * time.Second, confirm: 3 * time.Second, pause: time.Second, flapMemory: time.Minute}
	noPause := cfg
	noPause.pause = time.Hour
	startup := cfg
	startup.startup = 20 * time.Second
	cases := []struct {
		name  string
		cfg   detectorConfig
		steps []detectStep
	}{
		{"a paused leader gives a fresh grace period", cfg, steps(
			heartbeats("m0", 0, 1),
			detectStep{at: 13, op: "sweep", paused: true}, // 12 s of SIGSTOP
			sweeps(13.2, 22.8),                            // 10 s of silence counted from the pause's end
			detectStep{at: 23.2, op: "sweep", want: "m0"},
		)},
		{"without pause detection the same pause kills (the bug)", noPause, steps(
			heartbeats("m0", 0, 1),
			detectStep{at: 13, op: "sweep", want: "m0"},
		)},
		{"a new leader counts silence from its term's start", cfg, steps(
			sweeps(0, 10),
			detectStep{at: 10.2, op: "sweep", want: "m0"},
		)},
		{"a machine not heard yet this term gets the startup grace", startup, steps(
			sweeps(0, 20),
			detectStep{at: 20.2, op: "sweep", want: "m0"},
		)},
		{"a machine heard this term does not", startup, steps(
			heartbeats("m0", 0, 1),
			sweeps(1.2, 10.8),
			detectStep{at: 11.2, op: "sweep", want: "m0"},
		)},
		{"gossip finds a machine that died with the old leader within its confirmation", startup, steps(
			detectStep{at: 0, op: "failed", m: "m0"},
			sweeps(0, 2.8),
			detectStep{at: 3.0, op: "sweep", want: "m0"},
		)},
		{"gossip alone never kills a machine whose heartbeats arrive", cfg, steps(
			detectStep{at: 0.1, op: "failed", m: "m0"},
			heartbeats("m0", 0.2, 20),
			sweeps(20.2, 22.8), // then its heartbeats stop: gossip and silence agree after 3 s
			detectStep{at: 23.2, op: "sweep", want: "m0"},
		)},
		{"gossip and silence agree", cfg, steps(
			heartbeats("m0", 0, 1),
			sweeps(1.2, 2.8),
			detectStep{at: 3, op: "failed", m: "m0"},
			sweeps(3, 3.8),
			detectStep{at: 4.2, op: "sweep", want: "m0"}, // silent since 1 s
		)},
		{"gossip had it failed when the term began", cfg, steps(
			detectStep{at: 0, op: "failed", m: "m0"},
			sweeps(0, 2.8),
			detectStep{at: 3.0, op: "sweep", want: "m0"},
		)},
		{"a pause right after a gossip failure is not held against the machine", cfg, steps(
			heartbeats("m0", 0, 1),
			detectStep{at: 1.1, op: "failed", m: "m0"}, // gossip's own view was stale too
			detectStep{at: 13, op: "sweep", paused: true},
			heartbeats("m0", 13.2, 30),
		)},
		{"flapping backs off", cfg, steps(
			heartbeats("m0", 0, 1),
			detectStep{at: 1.1, op: "failed", m: "m0"},
			sweeps(1.2, 3.8),
			detectStep{at: 3.9, op: "join", m: "m0"}, // back within the grace: not lost
			heartbeats("m0", 4, 5),
			detectStep{at: 5.1, op: "failed", m: "m0"},
			sweeps(5.2, 10.8), // one flap: 6 s to confirm
			detectStep{at: 11.0, op: "sweep", want: "m0"},
		)},
		{"repeated flaps are capped at the heartbeat timeout, then forgotten", cfg, steps(
			detectStep{at: 0.1, op: "failed", m: "m0"}, detectStep{at: 0.2, op: "join", m: "m0"},
			detectStep{at: 0.3, op: "failed", m: "m0"}, detectStep{at: 0.4, op: "join", m: "m0"},
			detectStep{at: 0.5, op: "failed", m: "m0"}, detectStep{at: 0.6, op: "join", m: "m0"},
			heartbeats("m0", 0.8, 2),
			detectStep{at: 2.1, op: "failed", m: "m0"},
			sweeps(2.2, 11.8), // three flaps: 24 s, capped at 10 s
			detectStep{at: 12.2, op: "sweep", want: "m0"},
		)},
		{"flaps are forgotten after the flap memory", cfg, steps(
			detectStep{at: 0.1, op: "failed", m: "m0"}, detectStep{at: 0.2, op: "join", m: "m0"},
			heartbeats("m0", 0.4, 61),
			detectStep{at: 61.1, op: "failed", m: "m0"},
			sweeps(61.2, 63.8),
			detectStep{at: 64.2, op: "sweep", want: "m0"}, // 3 s again
		)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t0 := time.Unix(1000, 0)
			at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
			d := newFailureDetector(tc.cfg, t0)
			alive := map[string]bool{"m0": true}
			for _, s := range tc.steps {
				switch s.op {
				case "hb":
					d.heard(s.m, at(s.at))
				case "failed", "left", "join":
					d.gossip(s.m, s.op, at(s.at))
				case "sweep":
					var names []string
					for n := range alive {
						names = append(names, n)
					}
					paused, dead := d.sweep(at(s.at), names)
					var got []string
					for _, v := range dead {
						got = append(got, v.machine)
						delete(alive, v.machine)
						d.declared(v.machine)
					}
					if strings.Join(got, ",") != s.want {
						t.Fatalf("sweep at %.1fs: dead %v (%v), want %q", s.at, got, dead, s.want)
					}
					if (paused > 0) != s.paused {
						t.Fatalf("sweep at %.1fs: paused %v, want %v", s.at, paused, s.paused)
					}
				default:
					panic(fmt.Sprint("unknown step ", s.op))
				}
			}
		})
	}
}

// A load report and the failure detector's sweep never wait for the controller's lock:
// while something holds it (a long scheduling cycle, a burst of admissions), the machines'
// heartbeats are still taken and the sweep still runs (live.go).
func TestLivenessOffTheControllerLock(t *testing.T) {
	heads, c := group(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m, err := c.RegisterMachine(ctx, machine(t, "m0"))
	if err != nil {
		t.Fatal(err)
	}
	ctl := leader(t, heads).Controller()
	ctl.mu.Lock() // a cycle that does not end
	locked := true
	defer func() {
		if locked {
			ctl.mu.Unlock()
		}
	}()
	rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
	defer rcancel()
	if _, err := c.ReportLoad(rctx, api.LoadReport{Machine: "m0", Incarnation: m.Incarnation, Load: api.Load{CPU: 0.5}}); err != nil {
		t.Fatalf("a load report while the controller's lock is held: %v", err)
	}
	if _, err := c.ReportLoad(rctx, api.LoadReport{Machine: "m0", Incarnation: m.Incarnation + 1}); !errors.Is(err, api.ErrStale) {
		t.Fatalf("a report of another incarnation: %v, want stale", err)
	}
	if l, ok := ctl.liveLoad("m0"); !ok || l.Load.CPU != 0.5 {
		t.Fatalf("the leader's load of m0 is %+v (%v)", l, ok)
	}
	swept := make(chan struct{})
	go func() { ctl.sweep(); close(swept) }()
	select {
	case <-swept:
	case <-rctx.Done():
		t.Fatal("the sweep waited for the controller's lock")
	}
	ctl.mu.Unlock()
	locked = false
	// The scheduler takes the report at its next cycle (which also gives it m0).
	ctl.mu.Lock()
	_ = ctl.enqueueLocked(ctl.t, ctl.cycleLocked(ctl.t, time.Now()))
	fresh := len(ctl.live.fresh)
	ctl.mu.Unlock()
	if fresh != 0 {
		t.Fatalf("%d reports not taken by the scheduler", fresh)
	}
}

// A sweep's verdict on a machine that reported while the verdict waited for the
// controller's lock is dropped: the machine is not declared dead.
func TestVerdictDroppedWhenTheMachineReported(t *testing.T) {
	heads, c := group(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m, err := c.RegisterMachine(ctx, machine(t, "m0"))
	if err != nil {
		t.Fatal(err)
	}
	ctl := leader(t, heads).Controller()
	ctl.liveMu.Lock()
	v := liveVerdict{verdict: verdict{machine: "m0", reason: "no heartbeat (test)"}, inc: m.Incarnation, heard: ctl.live.detect.watch("m0").heard}
	ctl.liveMu.Unlock()
	if _, err := c.ReportLoad(ctx, api.LoadReport{Machine: "m0", Incarnation: m.Incarnation}); err != nil {
		t.Fatal(err)
	}
	if err := ctl.declareDead(ctx, []liveVerdict{v}); err != nil {
		t.Fatal(err)
	}
	if got, err := ctl.Machine("m0"); err != nil || !got.Alive {
		t.Fatalf("m0 after a stale verdict: %+v, %v", got, err)
	}
	v.heard = time.Now().Add(time.Hour) // no report after this one: the verdict stands
	if err := ctl.declareDead(ctx, []liveVerdict{v}); err != nil {
		t.Fatal(err)
	}
	if got, err := ctl.Machine("m0"); err != nil || got.Alive {
		t.Fatalf("m0 after a standing verdict: %+v, %v", got, err)
	}
}

func TestReportInterval(t *testing.T) {
	for _, tc := range []struct {
		machines int
		rate     float64
		timeout  time.Duration
		want     time.Duration
	}{
		{100, 500, 10 * time.Second, 0}, // a small cluster: the agents' own period
		{500, 500, 10 * time.Second, 0},
		{501, 500, 10 * time.Second, 2 * time.Second},
		{1100, 500, 10 * time.Second, 3 * time.Second},
		{2000, 500, 10 * time.Second, 3333 * time.Millisecond}, // a third of the timeout
		{2000, -1, 10 * time.Second, 0},                        // never asked
	} {
		if got := reportInterval(tc.machines, tc.rate, tc.timeout); got != tc.want {
			t.Errorf("reportInterval(%d, %v, %v) = %v, want %v", tc.machines, tc.rate, tc.timeout, got, tc.want)
		}
	}
}

// A machine whose reports the leader paces gets one and a half of their period to report
// after gossip has it failed, where the default confirmation is 3 s.
func TestPacedMachineGetsItsPeriodToConfirm(t *testing.T) {
	cfg := detectorConfig{silence: 10 * time.Second, confirm: 3 * time.Second, pause: time.Second, flapMemory: time.Minute}
	t0 := time.Unix(1000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	d := newFailureDetector(cfg, t0)
	d.interval = 3333 * time.Millisecond
	d.heard("m0", at(1))
	d.gossip("m0", "failed", at(1.1))
	for s := 0.2; s < 5.9; s += 0.2 { // from the term's start: no pause
		if _, dead := d.sweep(at(s), []string{"m0"}); len(dead) > 0 {
			t.Fatalf("sweep at %.1fs, %.1fs after its last report: %v (its period is 3.3 s)", s, s-1, dead)
		}
	}
	if _, dead := d.sweep(at(6.1), []string{"m0"}); len(dead) != 1 {
		t.Fatalf("5.1 s after its last report, with gossip agreeing: %v, want it dead", dead)
	}
}

// TestDisruptionHoldsVerdictsOfSilence: a leader of a large cluster that hears from less
// than half of it (a new leader the agents have not reached yet) declares none of them
// dead for their silence, still declares a machine gossip confirms failed, and declares
// the silent ones once most machines are heard again; a small cluster is judged machine
// by machine.
func TestDisruptionHoldsVerdictsOfSilence(t *testing.T) {
	cfg := detectorConfig{silence: 10 * time.Second, confirm: 3 * time.Second, pause: time.Second, flapMemory: time.Minute}
	t0 := time.Unix(1000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	names := func(n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = fmt.Sprintf("m%03d", i)
		}
		return out
	}
	sweepTo := func(d *failureDetector, until float64, alive []string) []string { // the machines found dead, once each
		seen := map[string]bool{}
		var dead []string
		for s := 0.2; s <= until+1e-9; s += 0.2 {
			_, vs := d.sweep(at(s), alive)
			for _, v := range vs {
				if !seen[v.machine] {
					seen[v.machine] = true
					dead = append(dead, v.machine)
				}
			}
		}
		return dead
	}
	alive := names(100)
	d := newFailureDetector(cfg, t0)
	for _, m := range alive[:40] { // 40 of 100 heard: 60 silent
		d.heard(m, at(5))
	}
	d.gossip("m099", "failed", at(5))
	dead := sweepTo(d, 10.4, alive)
	if len(dead) != 1 || dead[0] != "m099" || d.held != 59 {
		t.Fatalf("60 of 100 silent past the timeout: declared %v, held %d; want m099 (gossip) only, 59 held", dead, d.held)
	}
	for _, m := range alive[:60] { // most are heard again: the 39 still silent are declared
		d.heard(m, at(10.5))
	}
	_, found := d.sweep(at(10.6), alive[:99])
	if len(found) != 10 || d.held != 0 || d.deferred != 29 {
		t.Fatalf("60 of 99 heard: declared %d, held %d, deferred %d; want 10 of the 39 silent (the pace's burst), none held, 29 deferred", len(found), d.held, d.deferred)
	}
	small := names(4)
	d = newFailureDetector(cfg, t0)
	d.heard(small[0], at(5))
	if dead := sweepTo(d, 10.4, small); len(dead) != 3 {
		t.Fatalf("3 of 4 silent in a small cluster: declared %v, want the 3", dead)
	}
}

// TestVerdictsOfSilencePaced: verdicts of silence alone come at the pace of silenceBudget
// (a burst, then a rate), the longest silent first; a verdict given is given again at
// every sweep without taking more of the pace; a machine heard before its turn is saved;
// gossip's confirmed failures are not paced.
func TestVerdictsOfSilencePaced(t *testing.T) {
	cfg := detectorConfig{silence: 10 * time.Second, confirm: 3 * time.Second, pause: time.Second, flapMemory: time.Minute}
	t0 := time.Unix(1000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	alive := make([]string, 200)
	for i := range alive {
		alive[i] = fmt.Sprintf("m%03d", i)
	}
	burst, rate := silenceBudget(len(alive))
	if burst != 10 || rate != 0.5 {
		t.Fatalf("pace at 200 machines: %v at once, %v a second; want 10 and 0.5", burst, rate)
	}
	d := newFailureDetector(cfg, t0)
	silent := alive[:30] // m000 has been silent longest, m029 the least
	for i, m := range silent {
		d.heard(m, at(0.5+float64(i)*0.001))
	}
	d.gossip("m199", "failed", at(9))
	declared := map[string]float64{}
	saved := "m011" // its turn would come at about 14.6 s
	for s := 0.2; s <= 30+1e-9; s += 0.2 {
		for _, m := range alive[30:199] {
			d.heard(m, at(s))
		}
		if s > 14 && s < 14.3 {
			d.heard(saved, at(s)) // heard before its turn
		}
		_, all := d.sweep(at(s), alive)
		var vs []verdict // the verdicts of silence alone
		for _, v := range all {
			if _, ok := declared[v.machine]; !ok {
				declared[v.machine] = s
			}
			if v.machine != "m199" {
				vs = append(vs, v)
			}
		}
		if s > 10.55 && s < 10.65 {
			if len(vs) != 10 || d.deferred != 20 {
				t.Fatalf("at %.1f s: %d verdicts, %d deferred; want the burst of 10 and 20 deferred", s, len(vs), d.deferred)
			}
			for i, v := range vs {
				if v.machine != silent[i] {
					t.Fatalf("at %.1f s: verdict %d is %s, want %s (the longest silent first)", s, i, v.machine, silent[i])
				}
			}
		}
		if s > 10.75 && s < 10.85 && len(vs) != 10 {
			t.Fatalf("at %.1f s: %d verdicts; want the 10 given again, none more (the pace is spent)", s, len(vs))
		}
	}
	if at, ok := declared["m199"]; !ok || at > 9.3 {
		t.Fatalf("gossip's confirmed failure: declared at %v (%v); want it by 9.2 s, unpaced", at, ok)
	}
	if _, ok := declared[saved]; ok {
		t.Fatalf("%s was heard before its turn and was still found dead", saved)
	}
	// 10 at once at 10.6 s, then one every 2 s: 19.4 s of pace after it gives 9 more.
	if n := len(declared) - 1; n != 19 {
		t.Fatalf("%d machines found dead by 30 s for silence; want 10 + 9 at 0.5 a second", n)
	}
}
