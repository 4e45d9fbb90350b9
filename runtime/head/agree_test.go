package head

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/atoll-run/atoll/internal/jsoncheck"
	"github.com/atoll-run/atoll/internal/testtime"
	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/runtime/dashboard"
)

// readJSON GETs a head's path with a bearer token, checks that its answer holds no null
// (every list is [] when empty) and decodes it into out.
func readJSON(t *testing.T, h *Head, path, token string, out any) {
	t.Helper()
	code, b := get(t, h.Address()+path, token)
	if code != http.StatusOK {
		t.Fatalf("head %d %s: %d %s", h.ID(), path, code, b)
	}
	nulls, err := jsoncheck.Nulls(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(nulls) > 0 {
		t.Errorf("head %d %s: null at %v in %s", h.ID(), path, nulls, b)
	}
	if err := json.Unmarshal(b, out); err != nil {
		t.Fatalf("head %d %s: %v", h.ID(), path, err)
	}
}

// disagreements lists what the dashboard's state says of a gang or a queue that the
// cluster status does not (one source: the queue a gang without one is in, its priority,
// its ready workers, its GPUs; the configured queues and their counts).
func disagreements(st api.Status, ds dashboard.State) []string {
	var out []string
	byKey := map[string]dashboard.Gang{}
	for _, g := range ds.Gangs {
		byKey[g.Key] = g
	}
	if len(ds.Gangs) != len(st.Gangs) {
		out = append(out, fmt.Sprintf("the dashboard shows %d gangs, the status %d", len(ds.Gangs), len(st.Gangs)))
	}
	for _, g := range st.Gangs {
		d, ok := byKey[g.Job+"/"+g.Name]
		switch {
		case !ok:
			out = append(out, fmt.Sprintf("gang %s/%s is not on the dashboard", g.Job, g.Name))
		case d.Queue != g.Queue || d.Priority != g.Priority || d.Ready != g.Ready || d.Workers != g.Workers || d.GPUs != g.GPUs || d.State != g.State:
			out = append(out, fmt.Sprintf("gang %s/%s: the status says queue %s, priority %d, %d/%d ready, %d GPUs, %s; the dashboard queue %s, priority %d, %d/%d ready, %d GPUs, %s",
				g.Job, g.Name, g.Queue, g.Priority, g.Ready, g.Workers, g.GPUs, g.State, d.Queue, d.Priority, d.Ready, d.Workers, d.GPUs, d.State))
		}
	}
	if len(ds.Queues) != len(st.Queues) {
		return append(out, fmt.Sprintf("queues: the status %+v, the dashboard %+v", st.Queues, ds.Queues))
	}
	for i, q := range st.Queues {
		d := ds.Queues[i]
		if d.Name != q.Name || d.Weight != q.Weight || d.QuotaGPUs != q.QuotaGPUs || d.Pending != q.Pending || d.Running != q.Running || d.GPUs != q.GPUs ||
			(d.Share != nil && *d.Share != q.Share) {
			share := "none"
			if d.Share != nil {
				share = fmt.Sprint(*d.Share)
			}
			out = append(out, fmt.Sprintf("queue %d: the status %+v, the dashboard %+v (share %s)", i, q, d, share))
		}
	}
	return out
}

// agree waits until head h's dashboard says what the status says: a dashboard's state is
// sampled once a second (SampleInterval), so a head's may lag the log by a sample.
func agree(t *testing.T, when string, h *Head, st api.Status) dashboard.State {
	t.Helper()
	deadline := time.Now().Add(testtime.Scale(10 * time.Second))
	for {
		var ds dashboard.State
		readJSON(t, h, "/ui/api/state", api.DashboardToken(testToken), &ds)
		d := disagreements(st, ds)
		if len(d) == 0 {
			return ds
		}
		if time.Now().After(deadline) {
			for _, x := range d {
				t.Errorf("%s: %s (served by head %d at revision %d, leader %d)", when, x, ds.ServedBy, ds.Revision, ds.Leader)
			}
			return ds
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// keepAlive reports the machines' loads every 200 ms until the test ends, as their agents
// would (a machine without reports is declared dead after the heartbeat timeout: on a
// loaded machine, under the race detector, this test runs longer than that).
func keepAlive(t *testing.T, c *api.Client, machines ...api.Machine) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		for {
			for _, m := range machines {
				_, _ = c.ReportLoad(ctx, api.LoadReport{Machine: m.Name, Incarnation: m.Incarnation, At: time.Now()})
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
}

// TestStatusAndDashboardAgree: on a fresh cluster (machines, no job) every list of the
// status and of the dashboard's state is [], and the machines are drawn; with the
// operator's queues (default queue "research") the dashboard shows the gangs' queues and
// the configured queues as the status does; a stopped gang has no ready workers, also
// after a new leader loaded it from the log (it showed its workers' records as ready).
func TestStatusAndDashboardAgree(t *testing.T) {
	heads, c := groupKnowingHeads(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var ms []api.Machine
	for i := 0; i < 2; i++ {
		m, err := c.RegisterMachine(ctx, machine(t, fmt.Sprintf("m%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		ms = append(ms, m)
	}
	keepAlive(t, c, ms...)
	caughtUp(t, heads)
	lead := leader(t, heads)
	dash := api.DashboardToken(testToken)
	tok := string(testToken)

	// A fresh cluster: the status (the leader answers it), and the dashboard on every head.
	var fresh api.Status
	readJSON(t, lead, "/v1/cluster", tok, &fresh)
	for _, h := range heads {
		st := fresh
		ds := agree(t, fmt.Sprintf("head %d, fresh", h.ID()), h, st)
		if len(st.Machines) != 2 || len(ds.Racks) != 1 || len(ds.Racks[0].Machines) != 2 || ds.Totals.GPUs != 16 {
			t.Errorf("head %d, a fresh cluster: status machines %d, dashboard racks %+v", h.ID(), len(st.Machines), ds.Racks)
		}
	}
	var series []dashboard.Sample
	readJSON(t, lead, "/ui/api/series?since=0", dash, &series)
	var evs []api.Event
	readJSON(t, lead, "/ui/api/events?job=nosuch", dash, &evs)

	// The operator's queues; a gang that names none is in the default, research.
	conf := api.SchedulerConfig{Queues: []api.QueueSpec{{Name: "research", Weight: 2}, {Name: "prod", Weight: 1, QuotaGPUs: 8}},
		DefaultQueue: "research", PriorityClasses: []api.PriorityClass{{Name: "high", Value: 7}}}
	if _, err := c.SetSchedulerConfig(ctx, conf); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SubmitJob(ctx, api.Job{Name: "j", Driver: "test"}); err != nil {
		t.Fatal(err)
	}
	// dp may not be preempted: big (priority 7, 14 GPUs of 16) waits, and what the test
	// compares holds still.
	g, err := c.SpawnGang(ctx, api.GangSpec{Job: "j", Name: "dp", Kind: "k", Workers: 4, Resources: api.Resources{GPUs: 1}, SameIsland: true, NotPreemptible: true})
	if err != nil {
		t.Fatal(err)
	}
	for r := 0; r < 4; r++ {
		if err := c.WorkerReady(ctx, api.Worker{Job: "j", Gang: "dp", GangUID: g.UID, Rank: r, Generation: g.Generation,
			Machine: g.Placement.Members[r].Machine, Address: "a", ActorID: fmt.Sprint(r)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.SpawnGang(ctx, api.GangSpec{Job: "j", Name: "big", Kind: "k", Workers: 14, Resources: api.Resources{GPUs: 1}, Queue: "prod", PriorityClass: "high"}); err != nil {
		t.Fatal(err)
	}
	st, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	caughtUp(t, heads)
	for _, h := range heads {
		agree(t, fmt.Sprintf("head %d, running", h.ID()), h, st)
	}
	gs := map[string]api.GangStatus{}
	for _, g := range st.Gangs {
		gs[g.Name] = g
	}
	if dp := gs["dp"]; dp.Queue != "research" || dp.Ready != 4 || dp.Workers != 4 || dp.State != api.GangRunning {
		t.Errorf("gang dp: %+v, want running 4/4 in research (the default queue)", dp)
	}
	if big := gs["big"]; big.Queue != "prod" || big.Priority != 7 || big.State != api.GangPending {
		t.Errorf("gang big: %+v, want pending in prod at priority 7", big)
	}
	if len(st.Queues) != 2 || st.Queues[0].Name != "research" || st.Queues[0].Share <= 0 || st.Queues[0].Share > 10 || st.Queues[1].Name != "prod" {
		t.Errorf("queues %+v: want research (its share a ratio), then prod", st.Queues)
	}

	// A progress report carries its run: the gang's UID and generation, as the leader has
	// them (a gang spawned again under its name is another run on the plots).
	if err := c.ReportProgress(ctx, api.Progress{Job: "j", Gang: "dp", Step: 3, Metrics: map[string]float64{"loss": 1.5}}); err != nil {
		t.Fatal(err)
	}
	var prog []api.Progress
	readJSON(t, lead, "/ui/api/progress?gang=j/dp", dash, &prog)
	if len(prog) != 1 || prog[0].UID != g.UID || g.UID == "" || prog[0].Generation != g.Generation || prog[0].Time.IsZero() {
		t.Errorf("progress %+v: want one report of run %q generation %d, timed", prog, g.UID, g.Generation)
	}

	// The gang stops; then the leader goes, and the new one loads the gang from the log.
	if err := c.StopGang(ctx, "j", "dp"); err != nil {
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
	st, err = c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range st.Gangs {
		if g.Name == "dp" && (g.State != api.GangStopped || g.Ready != 0) {
			t.Errorf("after the failover (leader %d): gang dp %s with %d/%d ready, want stopped with none", nl.ID(), g.State, g.Ready, g.Workers)
		}
	}
	caughtUp(t, rest)
	agree(t, "after the failover", nl, st)
}
