package head

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/runtime/dashboard"
)

// get sends a GET with a bearer token (none when token is "") and returns the status and
// body.
func get(t *testing.T, url, token string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

// scrape reads a head's /metrics.
func scrape(t *testing.T, h *Head, token string) map[string]*dto.MetricFamily {
	t.Helper()
	code, b := get(t, h.Address()+"/metrics", token)
	if code != http.StatusOK {
		t.Fatalf("/metrics of head %d: %d %s", h.ID(), code, b)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(string(b)))
	if err != nil {
		t.Fatalf("/metrics of head %d does not parse: %v", h.ID(), err)
	}
	return fams
}

// gauge is the value of an unlabelled gauge.
func gauge(t *testing.T, fams map[string]*dto.MetricFamily, name string) float64 {
	t.Helper()
	f := fams[name]
	if f == nil || len(f.Metric) != 1 || f.Metric[0].Gauge == nil {
		t.Fatalf("metric %s: want one unlabelled gauge, have %v", name, f)
	}
	return f.Metric[0].Gauge.GetValue()
}

// histCount is the number of observations of an unlabelled histogram.
func histCount(t *testing.T, fams map[string]*dto.MetricFamily, name string) uint64 {
	t.Helper()
	f := fams[name]
	if f == nil || len(f.Metric) != 1 || f.Metric[0].Histogram == nil {
		t.Fatalf("metric %s: want one histogram, have %v", name, f)
	}
	return f.Metric[0].Histogram.GetSampleCount()
}

// labelled sums the gauges of a family whose labels include want.
func labelled(fams map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	var sum float64
	for _, m := range fams[name].GetMetric() {
		ok := true
		for k, v := range want {
			found := false
			for _, l := range m.Label {
				if l.GetName() == k && l.GetValue() == v {
					found = true
				}
			}
			ok = ok && found
		}
		if ok {
			sum += m.GetGauge().GetValue()
		}
	}
	return sum
}

// caughtUp waits until every head has applied the leader's revision (each head's figures
// come from its own copy of the log).
func caughtUp(t *testing.T, heads []*Head) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var top int64
	for _, h := range heads {
		top = max(top, h.StateMachine().Revision())
	}
	for _, h := range heads {
		if _, _, err := h.StateMachine().EventsSince(ctx, "", top-1, 1); err != nil && h.StateMachine().Revision() < top {
			t.Fatalf("head %d did not apply revision %d: %v", h.ID(), top, err)
		}
	}
}

func kinds(evs []api.Event) []string {
	var out []string
	for _, e := range evs {
		out = append(out, string(e.Kind))
	}
	return out
}

// TestMetricsEventsAndDashboard drives a cluster of three heads to a known state (four
// machines of 8 GPUs, an 8-worker gang running) and checks /metrics, the event log and the
// dashboard's reads against it, on the leader and on a follower, and after a failover.
func TestMetricsEventsAndDashboard(t *testing.T) {
	heads, c := groupKnowingHeads(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := 0; i < 4; i++ {
		if _, err := c.RegisterMachine(ctx, machine(t, fmt.Sprintf("m%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.SubmitJob(ctx, api.Job{Name: "j", Driver: "test"}); err != nil {
		t.Fatal(err)
	}
	g, err := c.SpawnGang(ctx, api.GangSpec{Job: "j", Name: "dp", Kind: "k", Workers: 8, Resources: api.Resources{GPUs: 1}, SameIsland: true, MaxRestarts: 3})
	if err != nil {
		t.Fatal(err)
	}
	on := g.Placement.Members[0].Machine
	for r := 0; r < 8; r++ {
		if err := c.WorkerReady(ctx, api.Worker{Job: "j", Gang: "dp", Rank: r, Machine: on, Address: "a", ActorID: fmt.Sprint(r)}); err != nil {
			t.Fatal(err)
		}
	}
	if g, err := c.SpawnGang(ctx, api.GangSpec{Job: "j", Name: "big", Kind: "k", Workers: 25, Resources: api.Resources{GPUs: 1}}); err != nil || g.State != api.GangPending {
		t.Fatalf("a gang over the free GPUs: %+v, %v; want it queued", g, err)
	}
	// The same gang again is refused and makes no second event.
	if _, err := c.SpawnGang(ctx, api.GangSpec{Job: "j", Name: "big", Kind: "k", Workers: 25, Resources: api.Resources{GPUs: 1}}); !errors.Is(err, api.ErrExists) {
		t.Fatalf("the queued gang again: %v", err)
	}
	if err := c.ReportProgress(ctx, api.Progress{Job: "j", Gang: "dp", Step: 40, Metrics: map[string]float64{"loss": 0.5}}); err != nil {
		t.Fatal(err)
	}
	if err := c.ReportProgress(ctx, api.Progress{Job: "j", Gang: "nosuch", Step: 1}); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("progress of an unknown gang: %v", err)
	}
	caughtUp(t, heads)
	lead := leader(t, heads)
	dash := api.DashboardToken(testToken)

	// /metrics: the dashboard's token or the cluster's; nothing without.
	for _, tok := range []string{"", "wrong-token-0123456789", api.DashboardToken([]byte("another cluster's secret"))} {
		if code, _ := get(t, lead.Address()+"/metrics", tok); code != http.StatusUnauthorized {
			t.Errorf("/metrics with token %q: %d, want 401", tok, code)
		}
	}
	scrape(t, lead, string(testToken))
	for _, h := range heads {
		m := scrape(t, h, dash)
		for name, want := range map[string]float64{"atoll_gpus_total": 32, "atoll_gpus_allocated": 8, "atoll_gpus_free": 24,
			"atoll_gangs_running": 1, "atoll_gangs_pending": 1} {
			if got := gauge(t, m, name); got != want {
				t.Errorf("head %d: %s = %v, want %v", h.ID(), name, got, want)
			}
		}
		if got := labelled(m, "atoll_machine_gpus", map[string]string{"machine": on, "state": "allocated"}); got != 8 {
			t.Errorf("head %d: GPUs allocated on %s = %v, want 8", h.ID(), on, got)
		}
		if got := labelled(m, "atoll_machine_gpus", map[string]string{"state": "free"}); got != 24 {
			t.Errorf("head %d: free GPUs by machine sum to %v, want 24", h.ID(), got)
		}
		if got := labelled(m, "atoll_queue_gangs", map[string]string{"queue": "default", "state": "running"}); got != 1 {
			t.Errorf("head %d: running gangs of the default queue = %v, want 1", h.ID(), got)
		}
		leading := 0.0
		if h == lead {
			leading = 1
		}
		if got := gauge(t, m, "atoll_head_leader"); got != leading {
			t.Errorf("head %d: atoll_head_leader = %v, want %v", h.ID(), got, leading)
		}
	}
	lm := scrape(t, lead, dash)
	if n := histCount(t, lm, "atoll_schedule_cycle_seconds"); n < 1 {
		t.Errorf("the leader ran %d scheduling cycles, want at least one (the gang's placement)", n)
	}
	if n := histCount(t, lm, "atoll_paxos_commit_seconds"); n < 10 {
		t.Errorf("the leader timed %d commits, want at least the machines, job, gang and workers (10)", n)
	}
	if got := labelled(lm, "atoll_gang_progress", map[string]string{"job": "j", "gang": "dp", "metric": "loss"}); got != 0.5 {
		t.Errorf("the gang's reported loss = %v, want 0.5", got)
	}

	// The event log: every decision, in order, the same on every head.
	evs, _, err := c.Events(ctx, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	want := "machine_up machine_up machine_up machine_up job_submitted gang_placed gang_running gang_queued"
	if got := strings.Join(kinds(evs), " "); got != want {
		t.Fatalf("events %q, want %q", got, want)
	}
	placed := evs[5]
	if placed.Job != "j" || placed.Gang != "dp" || len(placed.Machines) != 1 || placed.Machines[0] != on || placed.Islands != 1 || placed.Scores["total"] == 0 {
		t.Errorf("placement event %+v", placed)
	}
	if evs[7].Reason == "" || evs[7].Gang != "big" {
		t.Errorf("queued event %+v", evs[7])
	}
	for i, e := range evs {
		if e.Seq != int64(i+1) {
			t.Errorf("event %d has seq %d", i, e.Seq)
		}
	}

	// The dashboard: pages to anyone, data only with its token; a follower forwards to the
	// leader.
	var follower *Head
	for _, h := range heads {
		if h != lead {
			follower = h
		}
	}
	code, page := get(t, follower.Address()+"/ui/", "")
	if code != http.StatusOK || !strings.Contains(string(page), "<title>Atoll dashboard</title>") || strings.Contains(string(page), on) {
		t.Errorf("the page without a token: %d, %d bytes", code, len(page))
	}
	for _, p := range []string{"/ui/api/state", "/ui/api/series", "/ui/api/events"} {
		if code, b := get(t, follower.Address()+p, ""); code != http.StatusUnauthorized || strings.Contains(string(b), on) {
			t.Errorf("%s without a token: %d %s", p, code, b)
		}
		if code, _ := get(t, follower.Address()+p, string(testToken)); code != http.StatusUnauthorized {
			t.Errorf("%s with the cluster secret instead of the dashboard token: %d, want 401", p, code)
		}
	}
	if code, _ := get(t, follower.Address()+"/v1/cluster", dash); code != http.StatusUnauthorized {
		t.Errorf("the control API with the dashboard token: %d, want 401 (the token is read-only)", code)
	}
	code, b := get(t, follower.Address()+"/ui/api/state", dash)
	var st dashboard.State
	if code != http.StatusOK || json.Unmarshal(b, &st) != nil {
		t.Fatalf("state: %d %s", code, b)
	}
	if !st.Leading || st.ServedBy != lead.ID() || st.Totals.GPUs != 32 || st.Totals.Allocated != 8 || len(st.Gangs) != 2 {
		t.Fatalf("state through a follower: leading %v served by %d, totals %+v, %d gangs", st.Leading, st.ServedBy, st.Totals, len(st.Gangs))
	}
	gs := st.Gangs[0]
	if gs.State != api.GangRunning || gs.Ready != 8 || gs.GPUs != 8 || gs.Progress == nil || gs.Progress.Step != 40 {
		t.Errorf("gang in the dashboard %+v", gs)
	}
	held := 0
	for _, r := range st.Racks {
		for _, m := range r.Machines {
			for _, is := range m.Islands {
				for _, gpu := range is.GPUs {
					if len(gpu.Holders) == 1 && gpu.Holders[0].Gang == "j/dp" {
						held++
						if m.Name != on {
							t.Errorf("GPU %d of %s drawn as held by j/dp, placed on %s", gpu.Index, m.Name, on)
						}
					}
				}
			}
		}
	}
	if held != 8 {
		t.Errorf("the map shows %d GPUs of j/dp, want 8", held)
	}
	code, b = get(t, follower.Address()+"/ui/api/events?job=j&after=5", dash)
	var dev []api.Event
	if code != http.StatusOK || json.Unmarshal(b, &dev) != nil || strings.Join(kinds(dev), " ") != "gang_placed gang_running gang_queued" {
		t.Errorf("events of job j after 5: %d %s", code, b)
	}
	code, b = get(t, lead.Address()+"/ui/api/progress?gang=j/dp", dash)
	var prog []api.Progress
	if code != http.StatusOK || json.Unmarshal(b, &prog) != nil || len(prog) != 1 || prog[0].Metrics["loss"] != 0.5 {
		t.Errorf("progress: %d %s", code, b)
	}
	cst, err := c.Status(ctx)
	if err != nil || !strings.Contains(cst.Dashboard, "/ui/?token="+dash) {
		t.Errorf("status dashboard %q (%v): want the URL with the dashboard token", cst.Dashboard, err)
	}

	// A worker fails: the restart is an event. Then the leader goes: the new leader shows
	// the same history and continues its sequence.
	if err := c.WorkerExited(ctx, api.WorkerExit{Job: "j", Gang: "dp", Rank: 3, Machine: on, Reason: "killed by the test"}); err != nil {
		t.Fatal(err)
	}
	_ = lead.Close()
	var rest []*Head
	for _, h := range heads {
		if h != lead {
			rest = append(rest, h)
		}
	}
	nl := leader(t, rest)
	if err := c.StopJob(ctx, "j"); err != nil {
		t.Fatal(err)
	}
	evs, _, err = c.Events(ctx, 8, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(kinds(evs), " ")
	if !strings.HasPrefix(got, "gang_restart ") || !strings.HasSuffix(got, "gang_stopped job_stopped") || evs[0].Seq != 9 || !strings.Contains(evs[0].Reason, "killed by the test") {
		t.Fatalf("events after the failover (leader %d): %q, first %+v", nl.ID(), got, evs[0])
	}
	for i := 1; i < len(evs); i++ {
		if evs[i].Seq <= evs[i-1].Seq {
			t.Errorf("event sequence goes back after the failover: %d then %d", evs[i-1].Seq, evs[i].Seq)
		}
	}
	// Counters are per head: the new leader counts what it committed.
	for _, m := range scrape(t, nl, dash)["atoll_events_total"].GetMetric() {
		if m.GetLabel()[0].GetValue() == "job_stopped" && m.GetCounter().GetValue() != 1 {
			t.Errorf("the new leader counted %v job_stopped events, want 1", m.GetCounter().GetValue())
		}
	}
}
