package sim

import (
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestTimeLimits: every limit is at or above its job's run time; the same seed gives the
// same limits; limits are modal (besides the exact ones, all are menu values or whole
// multiples of the maximum), the maximum is the most popular value, and about the
// model's shares ask the maximum and reach their limit.
func TestTimeLimits(t *testing.T) {
	jobs, _, err := LoadJobs(filepath.Join(tracesDir(t), "microsoft-itp-elasticflow", "cluster02.csv"), false, nil)
	if err != nil {
		t.Fatal(err)
	}
	m := DefaultEstimateModel()
	a, b := slices.Clone(jobs), slices.Clone(jobs)
	if err := AssignTimeLimits(a, m, 7); err != nil {
		t.Fatal(err)
	}
	if err := AssignTimeLimits(b, m, 7); err != nil {
		t.Fatal(err)
	}
	top := m.Menu[len(m.Menu)-1]
	count := map[time.Duration]int{}
	exact, offMenu := 0, 0
	for i, j := range a {
		if j.TimeLimit != b[i].TimeLimit {
			t.Fatalf("job %d: limits %s and %s from the same seed", i, j.TimeLimit, b[i].TimeLimit)
		}
		if j.TimeLimit < j.Duration {
			t.Fatalf("job %d: limit %s below its run time %s", i, j.TimeLimit, j.Duration)
		}
		count[j.TimeLimit]++
		switch {
		case j.TimeLimit-j.Duration < time.Second:
			exact++
		case !slices.Contains(m.Menu, j.TimeLimit) && j.TimeLimit%top != 0:
			offMenu++
		}
	}
	if offMenu > 0 {
		t.Fatalf("%d limits neither exact nor round values", offMenu)
	}
	for d, n := range count {
		if n > count[top] {
			t.Fatalf("limit %s (%d jobs) more popular than the maximum %s (%d)", d, n, top, count[top])
		}
	}
	n := float64(len(a))
	if share := float64(exact) / n; share < 0.08 || share > 0.13 {
		t.Fatalf("%.3f of the jobs reach their limit, want about %v", share, m.ExactShare)
	}
	if share := float64(count[top]) / n; share < m.MaxShare {
		t.Fatalf("%.3f of the jobs ask the maximum, want at least %v", share, m.MaxShare)
	}
	bad := m
	bad.MaxFactor = 0.5
	if err := AssignTimeLimits(a, bad, 1); !errors.Is(err, ErrBadSpec) {
		t.Fatalf("an overestimate factor below 1: %v", err)
	}
}

// TestBlindGivesNoDuration: in the blind setting no request carries a run time or a limit
// (estimate: the limit only; oracle: the run time only), and the replay's decisions
// before the first completion do not depend on the jobs' run times: two traces that
// differ only in them start the same jobs at the same times on the same cards until a job
// ends (with run times given, the oracle setting does not).
func TestBlindGivesNoDuration(t *testing.T) {
	j := Job{Duration: time.Hour, TimeLimit: 4 * time.Hour, GPUs: 2}
	for _, tt := range []struct {
		info            string
		duration, limit time.Duration
	}{{InfoBlind, 0, 0}, {InfoEstimate, 0, 4 * time.Hour}, {InfoOracle, time.Hour, 0}} {
		r := JobRequest("j", j, tt.info)
		if r.Duration != tt.duration || r.TimeLimit != tt.limit {
			t.Fatalf("%s: request says duration %s, limit %s; want %s, %s", tt.info, r.Duration, r.TimeLimit, tt.duration, tt.limit)
		}
	}

	snap, model, _, err := LoadCluster("2xdgx-h100/2", false, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Twenty jobs (50 GPUs) arrive together on 16 GPUs; every one runs at least 10 h, in one
	// trace the shorter ones first, in the other the longer.
	var short, long []Job
	for i := range 20 {
		base := Job{ID: fmt.Sprint(i), GPUs: 1 + i%4, Priority: i % 3}
		a, b := base, base
		a.Duration = 10*time.Hour + time.Duration(i)*time.Hour
		b.Duration = 10*time.Hour + time.Duration(20-i)*time.Hour
		short, long = append(short, a), append(long, b)
	}
	starts := func(info string, jobs []Job) []string {
		cfg, blind, err := PolicyConfig("atoll")
		if err != nil {
			t.Fatal(err)
		}
		r, err := replayJobs(t.Context(), "atoll", info, cfg, blind, jobs, snap, model)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, s := range r.starts {
			if s.At >= 10*time.Hour {
				break
			}
			out = append(out, fmt.Sprintf("%s j%d %v", s.At, s.Job, s.Members))
		}
		return out
	}
	if a, b := starts(InfoBlind, short), starts(InfoBlind, long); !reflect.DeepEqual(a, b) {
		t.Fatalf("blind: the starts before any job ended depend on the run times:\n%s\n---\n%s", strings.Join(a, "\n"), strings.Join(b, "\n"))
	}
	if a, b := starts(InfoOracle, short), starts(InfoOracle, long); reflect.DeepEqual(a, b) {
		t.Fatal("oracle: the starts do not depend on the run times (the check would not see a leak)")
	}
}

// TestInfoSettings: the information setting changes what atoll does and nothing of the
// baselines (none of them uses run times; srtf, the oracle reference, is given true run
// times in every setting); every result says its setting; an unknown setting is refused
// with the allowed ones named.
func TestInfoSettings(t *testing.T) {
	jobs, _, err := LoadJobs(filepath.Join(tracesDir(t), "microsoft-itp-elasticflow", "cluster04.csv"), false, nil)
	if err != nil {
		t.Fatal(err)
	}
	snap, model, _, err := LoadCluster("16xdgx-h100/4", false, nil)
	if err != nil {
		t.Fatal(err)
	}
	by := map[string]map[string]DynamicResult{}
	for _, info := range Infos {
		res, err := RunDynamic(t.Context(), jobs, snap, model, DynamicOptions{MaxJobs: 300, PrioritySeed: 1, Info: info})
		if err != nil {
			t.Fatal(err)
		}
		by[info] = map[string]DynamicResult{}
		for _, r := range res {
			want := info
			if r.Policy == "srtf" {
				want = InfoOracle
			}
			if r.Info != want {
				t.Fatalf("%s in the %s setting says info %q, want %q", r.Policy, info, r.Info, want)
			}
			r.Info = ""
			by[info][r.Policy] = r
		}
	}
	for _, p := range DynamicPolicies {
		same := reflect.DeepEqual(by[InfoBlind][p], by[InfoEstimate][p]) && reflect.DeepEqual(by[InfoBlind][p], by[InfoOracle][p])
		if p != "atoll" && !same {
			t.Errorf("%s differs between settings: %+v / %+v / %+v", p, by[InfoBlind][p].JCT, by[InfoEstimate][p].JCT, by[InfoOracle][p].JCT)
		}
		if p == "atoll" && same {
			t.Error("atoll does the same whatever it is told")
		}
	}
	_, err = RunDynamic(t.Context(), jobs, snap, model, DynamicOptions{MaxJobs: 10, Info: "psychic"})
	if !errors.Is(err, ErrBadSpec) || !strings.Contains(err.Error(), "want one of blind, estimate, oracle") {
		t.Fatalf("an unknown setting: %v", err)
	}
}
