package dashboard

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/atoll-run/atoll/internal/jsoncheck"
	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/topology"
)

func machines(t *testing.T, spec string) []api.Machine {
	t.Helper()
	tc, err := topology.Load(spec)
	if err != nil {
		t.Fatal(err)
	}
	var out []api.Machine
	for _, m := range tc.Machines {
		out = append(out, api.Machine{Name: m.Name, Rack: m.Rack, Spec: m.Spec, Simulated: true, Alive: true})
	}
	return out
}

func TestBuild(t *testing.T) {
	ms := machines(t, "2xdgx-h100")
	ms[1].Alive, ms[1].Reason = false, "no heartbeat"
	at := time.Unix(1000, 0)
	dp := api.Gang{Spec: api.GangSpec{Job: "j", Name: "dp", Workers: 2, Queue: "research"}, State: api.GangRunning, Generation: 1,
		Placement: &api.Placement{Members: []api.Member{{Machine: ms[0].Name, GPUs: []int{0, 1}}, {Machine: ms[0].Name, GPUs: []int{2, 3}}}}}
	share := api.Gang{Spec: api.GangSpec{Job: "j", Name: "share", Workers: 2}, State: api.GangStarting,
		Placement: &api.Placement{Members: []api.Member{{Machine: ms[0].Name, GPUs: []int{7}, Milli: 500}, {Machine: ms[0].Name, GPUs: []int{7}, Milli: 500}}}}
	wait := api.Gang{Spec: api.GangSpec{Job: "j", Name: "wait", Workers: 8, Queue: "research"}, State: api.GangPending, Reason: "old reason"}
	done := api.Gang{Spec: api.GangSpec{Job: "j", Name: "done", Workers: 1}, State: api.GangStopped,
		Placement: &api.Placement{Members: []api.Member{{Machine: ms[0].Name, GPUs: []int{6}}}}}
	st := Build(Inputs{Now: at, Machines: ms, Gangs: []api.Gang{wait, done, share, dp},
		Workers:     []api.Worker{{Job: "j", Gang: "dp", Rank: 0, Generation: 1}, {Job: "j", Gang: "dp", Rank: 1, Generation: 0}},
		Checkpoints: []api.Checkpoint{{Job: "j", Gang: "dp", Step: 10}, {Job: "j", Gang: "dp", Step: 30}},
		Loads:       map[string]api.LoadReport{ms[0].Name: {Load: api.Load{GPU: 0.5}, Store: &api.StoreUsage{HotBytes: 100, ColdBytes: 7}}},
		Reasons:     map[string]string{"j/wait": "8 GPUs of one island are not free"}, Leading: true})
	tt := st.Totals
	// The dead machine's 8 GPUs do not count; 4 (dp) + 1 (shared card) are allocated.
	if tt.GPUs != 8 || tt.Allocated != 5 || tt.Shared != 1 || tt.Free != 3 || tt.MachinesAlive != 1 || tt.Machines != 2 {
		t.Fatalf("totals %+v", tt)
	}
	if tt.Running != 1 || tt.Starting != 1 || tt.Pending != 1 || tt.Stopped != 1 || tt.StoreHot != 100 || tt.StoreCold != 7 || *tt.UtilReported != 0.5 {
		t.Fatalf("totals %+v", tt)
	}
	if tt.UtilMeasured != nil {
		t.Errorf("no machine measures its GPUs, yet the measured utilization is %v", *tt.UtilMeasured)
	}
	if len(st.Racks) != 1 || len(st.Racks[0].Machines) != 2 {
		t.Fatalf("racks %+v", st.Racks)
	}
	m0 := st.Racks[0].Machines[0]
	if len(m0.Islands) != 1 || len(m0.Islands[0].GPUs) != 8 || m0.Islands[0].ID < 0 || m0.Free != 3 {
		t.Fatalf("machine %s: islands %+v, free %d", m0.Name, m0.Islands, m0.Free)
	}
	card := m0.Islands[0].GPUs
	if len(card[0].Holders) != 1 || card[0].Holders[0].Gang != "j/dp" || len(card[7].Holders) != 2 || card[7].Holders[0].Milli != 500 || len(card[6].Holders) != 0 {
		t.Fatalf("cards: 0 %+v, 6 %+v, 7 %+v", card[0].Holders, card[6].Holders, card[7].Holders)
	}
	byKey := map[string]Gang{}
	for _, g := range st.Gangs {
		byKey[g.Key] = g
	}
	if g := byKey["j/dp"]; g.Ready != 1 || g.GPUs != 4 || g.Checkpoints != 2 || g.LastCheckpoint != 30 || g.Queue != "research" {
		t.Errorf("j/dp %+v: want 1 ready (rank 1 is of generation 0), 4 GPUs, 2 checkpoints up to step 30", g)
	}
	if g := byKey["j/wait"]; g.Reason != "8 GPUs of one island are not free" {
		t.Errorf("a pending gang shows the leader's newest reason, got %q", g.Reason)
	}
	if st.Gangs[0].State == api.GangPending || st.Gangs[len(st.Gangs)-1].Key != "j/done" {
		t.Errorf("gangs in order: %v", st.Gangs)
	}
	if len(st.Queues) != 2 || st.Queues[1].Name != "research" || st.Queues[1].Pending != 1 || st.Queues[1].Running != 1 || st.Queues[1].GPUs != 4 {
		t.Errorf("queues %+v", st.Queues)
	}
	s := SampleOf(st)
	if s.GPUs != 8 || s.Allocated != 5 || s.UtilAllocated != 5.0/8 || s.Running != 2 || s.Queues["research"] != 1 || s.T != at.UnixMilli() {
		t.Errorf("sample %+v", s)
	}
}

func TestSeriesAndProgress(t *testing.T) {
	s := NewSeries(3)
	for i := int64(1); i <= 5; i++ {
		s.Add(Sample{T: i})
	}
	if got := s.Since(0); len(got) != 3 || got[0].T != 3 || got[2].T != 5 {
		t.Fatalf("since 0: %+v", got)
	}
	if got := s.Since(4); len(got) != 1 || got[0].T != 5 {
		t.Fatalf("since 4: %+v", got)
	}
	p := NewProgressLog(2, 2)
	for i, g := range []string{"a", "a", "a", "b", "c"} {
		p.Add(api.Progress{Job: "j", Gang: g, Step: int64(i), Time: time.UnixMilli(int64(i + 1))})
	}
	if got := p.Of("j/a", 0); len(got) != 0 {
		t.Errorf("the least recent gang is forgotten past the bound of 2 gangs, yet j/a has %+v", got)
	}
	if l := p.Latest(); len(l) != 2 || l["j/c"].Step != 4 {
		t.Errorf("latest %+v", l)
	}
}

type fakeSource struct{ st State }

func (f fakeSource) State(context.Context) (State, error) { return f.st, nil }
func (f fakeSource) Series(int64) []Sample                { return []Sample{{T: 1}} }
func (f fakeSource) Progress(string, int64) []api.Progress {
	return nil
}
func (f fakeSource) Events(_ context.Context, job string, after int64, limit int) ([]api.Event, error) {
	return []api.Event{{Seq: after + 1, Job: job}}, nil
}

func TestHandlerNeedsTheToken(t *testing.T) {
	srv := httptest.NewServer(Handler(Config{Token: "dash-token", Source: fakeSource{st: State{Revision: 42}}}))
	defer srv.Close()
	get := func(path, token string) (int, string) {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, p := range []string{"/ui/api/state", "/ui/api/series", "/ui/api/events", "/ui/api/progress?gang=j/g"} {
		for _, tok := range []string{"", "wrong", "dash-token-and-more"} {
			if code, body := get(p, tok); code != http.StatusUnauthorized || strings.Contains(body, "42") {
				t.Errorf("%s with token %q: %d %s", p, tok, code, body)
			}
		}
		if code, body := get(p, "dash-token"); code != http.StatusOK {
			t.Errorf("%s with the token: %d %s", p, code, body)
		}
	}
	code, body := get("/ui/api/state", "dash-token")
	var st State
	if code != http.StatusOK || json.Unmarshal([]byte(body), &st) != nil || st.Revision != 42 {
		t.Fatalf("state: %d %s", code, body)
	}
	for _, bad := range []string{"/ui/api/events?after=-1", "/ui/api/events?job=../x", "/ui/api/progress?gang=nojob", "/ui/api/series?since=x"} {
		if code, body := get(bad, "dash-token"); code != http.StatusBadRequest {
			t.Errorf("%s: %d %s, want 400", bad, code, body)
		}
	}
	if code, body := get("/ui/", ""); code != http.StatusOK || !strings.Contains(body, "app.js") {
		t.Errorf("the page: %d", code)
	}
	if code, body := get("/ui/static/chart.min.js", ""); code != http.StatusOK || !strings.Contains(body, "Chart.js v3.9.1") {
		t.Errorf("the vendored Chart.js: %d (%d bytes)", code, len(body))
	}
	if code, _ := get("/ui/static/nosuch.js", ""); code != http.StatusNotFound {
		t.Errorf("a missing file: %d", code)
	}
}

// TestBuildFreshCluster: machines and no job. Every list of the state is [] (the page
// iterates them), the machines are drawn, and the configured queue is listed.
func TestBuildFreshCluster(t *testing.T) {
	noGPUs := api.Machine{Name: "cpu-0", Rack: 1, Alive: true} // a machine without a spec: no GPUs, no islands
	for name, in := range map[string]Inputs{
		"nothing":     {},
		"machines":    {Machines: machines(t, "2xdgx-h100"), Leading: true, Loads: map[string]api.LoadReport{}},
		"no GPUs":     {Machines: []api.Machine{noGPUs}},
		"on follower": {Machines: machines(t, "2xdgx-h100"), Jobs: []api.Job{{Name: "j"}}},
	} {
		st := Build(in)
		nulls, err := jsoncheck.Marshal(st)
		if err != nil {
			t.Fatal(err)
		}
		if len(nulls) > 0 {
			t.Errorf("%s: the state's JSON has null at %v", name, nulls)
		}
		if n := len(in.Machines); n > 0 {
			drawn := 0
			for _, r := range st.Racks {
				drawn += len(r.Machines)
			}
			if drawn != n {
				t.Errorf("%s: %d machines drawn of %d", name, drawn, n)
			}
		}
		if len(st.Queues) != 1 || st.Queues[0].Name != DefaultQueue || st.Queues[0].Weight != 1 {
			t.Errorf("%s: queues %+v, want the default configuration's one queue", name, st.Queues)
		}
	}
}

// TestBuildQueuesAsConfigured: the gangs' queues and priorities and the queues' lines are
// those of the operator's configuration, as `atoll status` shows them.
func TestBuildQueuesAsConfigured(t *testing.T) {
	ms := machines(t, "2xdgx-h100")
	conf := &api.SchedulerConfig{Queues: []api.QueueSpec{{Name: "research", Weight: 2}, {Name: "prod", Weight: 1, QuotaGPUs: 8}},
		DefaultQueue: "research", PriorityClasses: []api.PriorityClass{{Name: "low", Value: 1, Default: true}, {Name: "high", Value: 5}}}
	run := api.Gang{Spec: api.GangSpec{Job: "j", Name: "a", Workers: 1}, State: api.GangRunning,
		Placement: &api.Placement{Members: []api.Member{{Machine: ms[0].Name, GPUs: []int{0, 1}}}}}
	wait := api.Gang{Spec: api.GangSpec{Job: "j", Name: "b", Workers: 2, Queue: "prod", PriorityClass: "high"}, State: api.GangPending}
	st := Build(Inputs{Machines: ms, Gangs: []api.Gang{run, wait}, Scheduler: conf, Shares: map[string]float64{"research": 0.25}})
	byKey := map[string]Gang{}
	for _, g := range st.Gangs {
		byKey[g.Key] = g
	}
	if g := byKey["j/a"]; g.Queue != "research" || g.Priority != 1 || g.GPUs != 2 {
		t.Errorf("j/a names no queue nor class: %+v, want queue research (the default), priority 1 (class low), 2 GPUs", g)
	}
	if g := byKey["j/b"]; g.Queue != "prod" || g.Priority != 5 {
		t.Errorf("j/b: %+v, want queue prod, priority 5 (class high)", g)
	}
	if len(st.Queues) != 2 {
		t.Fatalf("queues %+v, want research and prod in the configuration's order", st.Queues)
	}
	r, p := st.Queues[0], st.Queues[1]
	if r.Name != "research" || r.Weight != 2 || r.Running != 1 || r.GPUs != 2 || r.Share == nil || *r.Share != 0.25 {
		t.Errorf("queue research %+v", r)
	}
	if p.Name != "prod" || p.QuotaGPUs != 8 || p.Pending != 1 || p.Priority != 5 || p.Share != nil {
		t.Errorf("queue prod %+v", p)
	}
	if conf.Queues[0].Name != "research" || len(conf.Queues) != 2 {
		t.Errorf("Build changed the caller's configuration: %+v", conf.Queues)
	}
	s := SampleOf(st)
	if len(s.Queues) != 2 || s.Queues["prod"] != 1 || s.Queues["research"] != 0 {
		t.Errorf("the sample's pending per queue: %v", s.Queues)
	}
}
