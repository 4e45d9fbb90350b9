package head

import (
	"context"
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/atoll-run/atoll/gang"
	"github.com/atoll-run/atoll/gang/sim"
	"github.com/atoll-run/atoll/gang/topoadapt"
	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/store/paxos"
	"github.com/atoll-run/atoll/topology"
)

// TestHeadMatchesSimulator replays a small trace, the first 60 jobs of the ITP cluster02
// trace (committed under testdata/traces) with the simulator's seeded priority classes
// and time limits, in each information setting (they start the jobs in three different
// orders),
// through a live head (three replicas on a fake clock, two declared DGX H100 machines)
// and through the simulator (gang/sim) on the same machines and with the head's
// scheduler configuration: the core requests the head builds from the gang specs are the
// simulator's, and the gangs start in the same order, at the same times, on the same
// cards. The head is the driver's and the agents' view: a gang is spawned at its
// submission time and stopped by its driver when its run time has passed, and the
// run-time predictor learns from those ends in both. Preemption is kept out (the longest
// preemption guard, and a slice in which it holds every victim): a victim's stop is timed
// by its own program on a head, which this replay does not model.
func TestHeadMatchesSimulator(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three heads per information setting")
	}
	all, _, err := sim.LoadJobs(filepath.Join("..", "..", "testdata", "traces", "microsoft-itp-elasticflow", "cluster02.csv"), false, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, info := range []string{sim.InfoBlind, sim.InfoEstimate, sim.InfoOracle} {
		t.Run(info, func(t *testing.T) {
			jobs := slices.Clone(all[:60])
			sim.AssignPriorities(jobs, 1)
			if err := sim.AssignTimeLimits(jobs, sim.DefaultEstimateModel(), 1); err != nil {
				t.Fatal(err)
			}
			want, cfg := simStarts(t, jobs, info)
			got, gotCfg := headStarts(t, jobs, info)
			if !reflect.DeepEqual(cfg, gotCfg) {
				t.Fatalf("the head's core configuration differs from the one given to the simulator:\n%+v\n%+v", gotCfg, cfg)
			}
			if len(want) != len(jobs) {
				t.Fatalf("the simulator started %d of %d jobs", len(want), len(jobs))
			}
			if strings.Join(got, "\n") != strings.Join(want, "\n") {
				t.Fatalf("starts on the head:\n%s\n\nin the simulator:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
		})
	}
}

// parityConf is the operator's configuration of the replay: the simulator's three
// classes, its 30-second notice grace, and the longest preemption guard (a day: no gang
// of the slice is preempted; simStarts checks it).
func parityConf() api.SchedulerConfig {
	return api.SchedulerConfig{
		PriorityClasses: []api.PriorityClass{{Name: "low", Value: sim.PrioLow, Default: true}, {Name: "normal", Value: sim.PrioNormal}, {Name: "high", Value: sim.PrioHigh}},
		NoticeGrace:     api.Duration(30 * time.Second), MinRunBeforePreempt: api.Duration(24 * time.Hour),
	}
}

// parityMachines are the two declared machines, as the head builds its cluster of them.
func parityMachines(t *testing.T) (gang.Snapshot, gang.CollectiveModel) {
	t.Helper()
	var insts []topology.MachineInstance
	for _, n := range []string{"m0", "m1"} {
		insts = append(insts, topology.MachineInstance{Name: n, Spec: machine(t, n).Spec})
	}
	tc, err := topology.BuildMachines(insts, topology.NetworkSpec{})
	if err != nil {
		t.Fatal(err)
	}
	snap := topoadapt.Snapshot(tc)
	for i := range snap.Nodes {
		for g := range snap.Nodes[i].GPUs {
			snap.Nodes[i].GPUs[g].Model += api.SimulatedSuffix // as the head marks simulated cards
		}
	}
	return snap, topoadapt.NewModel(tc, topology.Best)
}

func startLine(at time.Duration, job int, where []string) string {
	return fmt.Sprintf("%8.0fs j%02d on %s", at.Seconds(), job, strings.Join(where, " "))
}

// simStarts replays the jobs in the simulator with the head's scheduler configuration.
func simStarts(t *testing.T, jobs []sim.Job, info string) ([]string, gang.Config) {
	c := &Controller{cfg: ControllerConfig{Scheduler: DefaultSchedulerConfig()}}
	conf := parityConf()
	if err := conf.Validate(); err != nil {
		t.Fatal(err)
	}
	cfg := c.schedulerConfig(conf)
	snap, model := parityMachines(t)
	res, starts, err := sim.ReplayConfig(t.Context(), cfg, gang.BlindBinpack, info, jobs, snap, model)
	if err != nil {
		t.Fatal(err)
	}
	if res.Preemptions+res.Shrinks+res.Grows > 0 {
		t.Fatalf("the simulator preempted (%d) or resized (%d, %d): this replay leaves them out", res.Preemptions, res.Shrinks, res.Grows)
	}
	var out []string
	for _, s := range starts {
		var where []string
		for _, m := range s.Members {
			where = append(where, fmt.Sprintf("%s%v", m.NodeName, m.GPUs))
		}
		out = append(out, startLine(s.At-jobs[0].Submit, s.Job, where))
	}
	sortWithinTimes(out)
	return out, cfg
}

// sortWithinTimes orders the starts of one time by job (one cycle's placements).
func sortWithinTimes(lines []string) {
	sort.SliceStable(lines, func(i, j int) bool {
		ti, tj := lines[i][:9], lines[j][:9]
		if ti != tj {
			return false
		}
		return lines[i] < lines[j]
	})
}

// paritySpec is the gang spec of a trace job: what the simulator's request says, in the
// API's terms.
func paritySpec(i int, j sim.Job, info string) api.GangSpec {
	req := sim.JobRequest(fmt.Sprintf("j%02d", i), j, info)
	return api.GangSpec{Job: "trace", Name: req.ID, Kind: "k", Workers: req.Min,
		Resources:     api.Resources{GPUs: req.Member.GPUs, CPUMilli: req.Member.CPUMilli, MemMiB: req.Member.MemMiB},
		PriorityClass: sim.ClassName(j.Priority), JustInTime: req.Checkpoint.JustInTime, CheckpointEvery: api.Duration(req.Checkpoint.Interval),
		CheckpointSave: api.Duration(req.Checkpoint.Save), CheckpointRestore: api.Duration(req.Checkpoint.Restore),
		Duration: api.Duration(req.Duration), TimeLimit: api.Duration(req.TimeLimit)}
}

// headStarts replays the jobs through three heads on a fake clock: each is spawned at its
// submission, stopped when its run time has passed since it was placed.
func headStarts(t *testing.T, jobs []sim.Job, info string) ([]string, gang.Config) {
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := &fakeClock{now: base}
	net := paxos.NewMemNetwork(1)
	var heads []*Head
	var urls []string
	dir := t.TempDir()
	for id := uint64(1); id <= 3; id++ {
		// No agent reports load here: machines must not be judged lost as the clock jumps.
		cc := ControllerConfig{Clock: clk.Now, HeartbeatTimeout: 100 * 365 * 24 * time.Hour}
		h, err := Start(Config{ID: id, Initial: []uint64{1, 2, 3}, Transport: net.Transport(id), DataDir: fmt.Sprintf("%s/h%d", dir, id),
			NoSync: true, Token: testToken, Logger: zaptest.NewLogger(t), Controller: cc})
		if err != nil {
			t.Fatal(err)
		}
		heads = append(heads, h)
		urls = append(urls, h.Address())
	}
	t.Cleanup(func() {
		for _, h := range heads {
			_ = h.Close()
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := api.NewClient(ctx, api.ClientConfig{Heads: urls, Token: string(testToken)})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"m0", "m1"} {
		if _, err := c.RegisterMachine(ctx, machine(t, n)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.SetSchedulerConfig(ctx, parityConf()); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SubmitJob(ctx, api.Job{Name: "trace"}); err != nil {
		t.Fatal(err)
	}
	ctl := leader(t, heads).Controller()
	ctl.mu.Lock()
	cfg := ctl.schedulerConfig(ctl.t.conf)
	// The same inputs: the core request the head builds from each spec is the simulator's.
	for i, j := range jobs {
		spec := paritySpec(i, j, info)
		if err := spec.Normalize(); err != nil {
			ctl.mu.Unlock()
			t.Fatal(err)
		}
		got, err := ctl.t.coreRequest(spec)
		want := sim.JobRequest(spec.Key(), j, info)
		want.Queue, want.Max = ctl.t.conf.DefaultQueue, want.Min
		want.Member.GPUMilli = gang.Milli // what the core makes of a whole card
		if err != nil || !reflect.DeepEqual(got, want) {
			ctl.mu.Unlock()
			t.Fatalf("job %d: the head's core request %+v (%v), the simulator's %+v", i, got, err, want)
		}
	}
	ctl.mu.Unlock()

	origin := jobs[0].Submit
	running := map[int]time.Duration{} // job → when it ends (from the trace's start)
	placed := map[string]bool{}
	var out []string
	next := 0
	for next < len(jobs) || len(running) > 0 {
		// The next event: the earliest end, else the next arrival (ends go first).
		at, end := time.Duration(-1), -1
		for k, e := range running {
			if at < 0 || e < at || e == at && k < end {
				at, end = e, k
			}
		}
		if next < len(jobs) && (at < 0 || jobs[next].Submit < at) {
			at, end = jobs[next].Submit, -1
		}
		n := 0
		for _, e := range running {
			if e == at {
				n++
			}
		}
		if next < len(jobs) && jobs[next].Submit == at {
			n++
		}
		if n > 1 {
			t.Fatalf("two events at %s: the head runs a cycle for each, the simulator one for both; pick a slice without", at-origin)
		}
		clk.mu.Lock()
		clk.now = base.Add(at - origin)
		clk.mu.Unlock()
		if end >= 0 {
			delete(running, end)
			if err := c.StopGang(ctx, "trace", fmt.Sprintf("j%02d", end)); err != nil {
				t.Fatal(err)
			}
		} else {
			if _, err := c.SpawnGang(ctx, paritySpec(next, jobs[next], info)); err != nil {
				t.Fatal(err)
			}
			next++
		}
		st, err := c.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, gs := range st.Gangs {
			if gs.Job != "trace" || placed[gs.Name] || gs.State != api.GangStarting {
				continue
			}
			g, _, err := c.Gang(ctx, gs.Job, gs.Name)
			if err != nil {
				t.Fatal(err)
			}
			var k int
			fmt.Sscanf(gs.Name, "j%d", &k)
			var where []string
			for _, m := range g.Placement.Members {
				where = append(where, fmt.Sprintf("%s%v", m.Machine, m.GPUs))
			}
			placed[gs.Name] = true
			running[k] = at + jobs[k].Duration
			out = append(out, startLine(at-origin, k, where))
		}
		ctl.mu.Lock()
		var armed time.Time
		lost := ctl.t == nil
		if !lost {
			armed = ctl.t.cycleAt
		}
		ctl.mu.Unlock() // before any Fatal: the cleanup's Close takes the lock
		if lost {
			t.Fatalf("at %s the head lost its term (a loaded machine?): the replay needs one leader throughout", at-origin)
		}
		if !armed.IsZero() {
			t.Fatalf("at %s the head armed a cycle for %s: this replay drives cycles by its events only", at-origin, armed.Sub(base))
		}
	}
	sortWithinTimes(out)
	return out, cfg
}
