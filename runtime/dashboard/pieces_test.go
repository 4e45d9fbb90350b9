package dashboard

import (
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/atoll-run/atoll/runtime/api"
)

func TestHoldingsOf(t *testing.T) {
	place := func(ms ...api.Member) *api.Placement { return &api.Placement{Members: ms} }
	gang := func(name string, s api.GangState, p *api.Placement) api.Gang {
		return api.Gang{Spec: api.GangSpec{Job: "j", Name: name}, State: s, Placement: p}
	}
	cases := []struct {
		name    string
		gangs   []api.Gang
		holders map[cardKey][]Holder
		perGang map[string]int
	}{
		{name: "pending and stopped gangs hold nothing",
			gangs: []api.Gang{gang("p", api.GangPending, place(api.Member{Machine: "m", GPUs: []int{0}})),
				gang("s", api.GangStopped, place(api.Member{Machine: "m", GPUs: []int{1}})), gang("f", api.GangFailed, nil)},
			holders: map[cardKey][]Holder{}, perGang: map[string]int{}},
		{name: "a running gang without a placement holds nothing",
			gangs: []api.Gang{gang("r", api.GangRunning, nil)}, holders: map[cardKey][]Holder{}, perGang: map[string]int{}},
		{name: "members by rank, cards counted per member",
			gangs:   []api.Gang{gang("r", api.GangRestarting, place(api.Member{Machine: "a", GPUs: []int{0, 1}}, api.Member{Machine: "b", GPUs: []int{0}}))},
			holders: map[cardKey][]Holder{{"a", 0}: {{Gang: "j/r", Rank: 0}}, {"a", 1}: {{Gang: "j/r", Rank: 0}}, {"b", 0}: {{Gang: "j/r", Rank: 1}}},
			perGang: map[string]int{"j/r": 3}},
		{name: "a share keeps its milli, a whole card's 1000 is dropped, a MIG slice keeps its profile",
			gangs: []api.Gang{gang("s", api.GangStarting, place(api.Member{Machine: "a", GPUs: []int{0}, Milli: 500},
				api.Member{Machine: "a", GPUs: []int{1}, Milli: 1000}, api.Member{Machine: "a", GPUs: []int{2}, MIG: "1g.10gb"}))},
			holders: map[cardKey][]Holder{{"a", 0}: {{Gang: "j/s", Rank: 0, Milli: 500}}, {"a", 1}: {{Gang: "j/s", Rank: 1}},
				{"a", 2}: {{Gang: "j/s", Rank: 2, MIG: "1g.10gb"}}},
			perGang: map[string]int{"j/s": 3}},
		{name: "a member an elastic gang shrank away holds nothing",
			gangs:   []api.Gang{gang("e", api.GangRunning, place(api.Member{Machine: "a", GPUs: []int{0}}, api.Member{Machine: "a", GPUs: []int{1}, Removed: true}))},
			holders: map[cardKey][]Holder{{"a", 0}: {{Gang: "j/e"}}}, perGang: map[string]int{"j/e": 1}},
		{name: "two gangs share a card, in the gangs' order",
			gangs: []api.Gang{gang("x", api.GangRunning, place(api.Member{Machine: "a", GPUs: []int{0}, Milli: 300})),
				gang("y", api.GangRunning, place(api.Member{Machine: "a", GPUs: []int{0}, Milli: 700}))},
			holders: map[cardKey][]Holder{{"a", 0}: {{Gang: "j/x", Milli: 300}, {Gang: "j/y", Milli: 700}}},
			perGang: map[string]int{"j/x": 1, "j/y": 1}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := holdingsOf(c.gangs)
			if !reflect.DeepEqual(h.holders, c.holders) || !reflect.DeepEqual(h.perGang, c.perGang) {
				t.Errorf("holders %+v per gang %v; want %+v, %v", h.holders, h.perGang, c.holders, c.perGang)
			}
		})
	}
}

func TestReadyRanks(t *testing.T) {
	gangs := []api.Gang{{Spec: api.GangSpec{Job: "j", Name: "a"}, Generation: 2}, {Spec: api.GangSpec{Job: "j", Name: "b"}}}
	cases := []struct {
		name    string
		workers []api.Worker
		want    map[string]map[int]bool
	}{
		{name: "no workers", want: map[string]map[int]bool{}},
		{name: "only the current generation counts",
			workers: []api.Worker{{Job: "j", Gang: "a", Rank: 0, Generation: 2}, {Job: "j", Gang: "a", Rank: 1, Generation: 1}},
			want:    map[string]map[int]bool{"j/a": {0: true}}},
		{name: "a rank counts once", workers: []api.Worker{{Job: "j", Gang: "b", Rank: 3}, {Job: "j", Gang: "b", Rank: 3}},
			want: map[string]map[int]bool{"j/b": {3: true}}},
		{name: "workers of an unknown gang are ignored", workers: []api.Worker{{Job: "j", Gang: "gone", Rank: 0}},
			want: map[string]map[int]bool{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := readyRanks(gangs, c.workers); !reflect.DeepEqual(got, c.want) {
				t.Errorf("ready %v, want %v", got, c.want)
			}
		})
	}
}

func TestCheckpointsOf(t *testing.T) {
	at := func(s int64) time.Time { return time.Unix(s, 0) }
	cases := []struct {
		name string
		cps  []api.Checkpoint
		want map[string]ckpt
	}{
		{name: "none", want: map[string]ckpt{}},
		{name: "the newest step and its time, whatever the order",
			cps:  []api.Checkpoint{{Job: "j", Gang: "a", Step: 20, Time: at(2)}, {Job: "j", Gang: "a", Step: 30, Time: at(3)}, {Job: "j", Gang: "a", Step: 10, Time: at(9)}},
			want: map[string]ckpt{"j/a": {n: 3, last: 30, at: at(3)}}},
		{name: "per gang", cps: []api.Checkpoint{{Job: "j", Gang: "a", Step: 0, Time: at(1)}, {Job: "k", Gang: "a", Step: 5, Time: at(2)}},
			want: map[string]ckpt{"j/a": {n: 1, last: 0, at: at(1)}, "k/a": {n: 1, last: 5, at: at(2)}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := map[string]ckpt{}
			for k, v := range checkpointsOf(c.cps) {
				got[k] = *v
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("checkpoints %+v, want %+v", got, c.want)
			}
		})
	}
}

func TestMachineViewAndCards(t *testing.T) {
	ms := machines(t, "2xdgx-h100")
	hold := map[cardKey][]Holder{{ms[0].Name, 0}: {{Gang: "j/a"}}, {ms[0].Name, 1}: {{Gang: "j/b", Milli: 500}, {Gang: "j/c", Milli: 500}},
		{ms[0].Name, 2}: {{Gang: "j/d", MIG: "1g.10gb"}}}
	noSpec := api.Machine{Name: "bare", Alive: true}
	cases := []struct {
		name                          string
		m                             *api.Machine
		lay                           layout
		islands                       []int // island ids in order
		free, gpus, allocated, shared int
	}{
		{name: "topology known: one island of 8", m: &ms[0], lay: layoutOf(ms[:1]), islands: []int{0}, free: 5, gpus: 8, allocated: 3, shared: 2},
		{name: "no topology: one island -1", m: &ms[0], lay: layout{}, islands: []int{-1}, free: 5, gpus: 8, allocated: 3, shared: 2},
		{name: "no spec: no cards", m: &noSpec, lay: layout{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			mv := machineView(c.m, c.lay, hold)
			var ids []int
			n := 0
			for _, is := range mv.Islands {
				ids = append(ids, is.ID)
				for _, g := range is.GPUs {
					if g.Index != n {
						t.Errorf("card %d at position %d", g.Index, n)
					}
					n++
				}
			}
			if !reflect.DeepEqual(ids, c.islands) || n != mv.GPUs {
				t.Fatalf("islands %v with %d cards of %d, want %v", ids, n, mv.GPUs, c.islands)
			}
			var tt Totals
			tt.addCards(&mv)
			if mv.Free != c.free || tt.GPUs != c.gpus || tt.Allocated != c.allocated || tt.Shared != c.shared {
				t.Errorf("free %d, totals %+v; want free %d, %d GPUs, %d allocated, %d shared", mv.Free, tt, c.free, c.gpus, c.allocated, c.shared)
			}
		})
	}
}

func TestLoadSums(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	cases := []struct {
		name                    string
		loads                   []api.Load
		reported, measured, cpu *float64
	}{
		{name: "no reports: nil, not zero"},
		{name: "reported only", loads: []api.Load{{GPU: 0.2, CPU: 0.4}, {GPU: 0.6, CPU: 0.8}}, reported: f(0.4), cpu: f(0.6)},
		{name: "measured averages over the machines that measure", loads: []api.Load{{GPU: 0.2, GPUMeasured: true}, {GPU: 0.6}},
			reported: f(0.4), measured: f(0.2), cpu: f(0)},
	}
	eq := func(a, b *float64) bool {
		return a == nil && b == nil || a != nil && b != nil && math.Abs(*a-*b) < 1e-12
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var s loadSums
			for _, l := range c.loads {
				s.add(l)
			}
			var tt Totals
			s.averages(&tt)
			if !eq(tt.UtilReported, c.reported) || !eq(tt.UtilMeasured, c.measured) || !eq(tt.CPU, c.cpu) {
				t.Errorf("totals %+v", tt)
			}
		})
	}
}

func TestQueueAdd(t *testing.T) {
	cases := []struct {
		name  string
		gangs []Gang
		want  Queue
	}{
		{name: "pending counts, holds no GPUs", gangs: []Gang{{State: api.GangPending, Priority: 3, GPUs: 8}}, want: Queue{Pending: 1, Priority: 3}},
		{name: "starting, running and restarting run", gangs: []Gang{{State: api.GangStarting, GPUs: 1}, {State: api.GangRunning, GPUs: 2},
			{State: api.GangRestarting, GPUs: 4, Priority: 1}}, want: Queue{Running: 3, GPUs: 7, Priority: 1}},
		{name: "failed and stopped count only for priority", gangs: []Gang{{State: api.GangFailed, Priority: 9}, {State: api.GangStopped}},
			want: Queue{Priority: 9}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var q Queue
			var tt Totals
			for _, g := range c.gangs {
				q.add(g)
				tt.countGang(g.State)
			}
			if q != c.want {
				t.Errorf("queue %+v, want %+v", q, c.want)
			}
			if n := tt.Pending + tt.Starting + tt.Running + tt.Restarting + tt.Failed + tt.Stopped; n != len(c.gangs) {
				t.Errorf("totals count %d gangs of %d: %+v", n, len(c.gangs), tt)
			}
		})
	}
}

func TestGangView(t *testing.T) {
	three := &api.Placement{Members: []api.Member{{Machine: "m"}, {Machine: "m"}, {Machine: "m"}}}
	shrunk := &api.Placement{Members: []api.Member{{Machine: "m"}, {Machine: "m", Removed: true}, {Machine: "m"}}}
	f := gangFacts{gpus: map[string]int{"j/a": 4}, ready: map[string]map[int]bool{"j/a": {0: true, 1: true}, "j/s": {0: true, 1: true, 2: true, 5: true}},
		ckpts: map[string]*ckpt{"j/a": {n: 2, last: 7}}, reasons: map[string]string{"j/a": "newer", "j/b": ""},
		progress: map[string]api.Progress{"j/a": {Step: 3}}}
	cases := []struct {
		name     string
		g        api.Gang
		queue    string
		ready    int
		reason   string
		last     int64
		gpus     int
		progress bool
		checkpts int
	}{
		{name: "running: ready workers, checkpoints, progress; the leader's reason is only for pending gangs",
			g: api.Gang{Spec: api.GangSpec{Job: "j", Name: "a", Queue: "q"}, State: api.GangRunning, Reason: "log", Placement: three}, queue: "q", ready: 2, reason: "log",
			last: 7, gpus: 4, progress: true, checkpts: 2},
		{name: "stopped: its workers' records of its generation are not ready workers",
			g: api.Gang{Spec: api.GangSpec{Job: "j", Name: "a"}, State: api.GangStopped, Placement: three}, queue: DefaultQueue, ready: 0,
			last: 7, gpus: 4, progress: true, checkpts: 2},
		{name: "shrunk: only the program's members count, never more than its size",
			g: api.Gang{Spec: api.GangSpec{Job: "j", Name: "s"}, State: api.GangRunning, Placement: shrunk}, queue: DefaultQueue, ready: 2, last: -1},
		{name: "pending: the leader's newer reason, no ready count",
			g: api.Gang{Spec: api.GangSpec{Job: "j", Name: "a"}, State: api.GangPending, Reason: "log"}, queue: DefaultQueue, reason: "newer",
			last: 7, gpus: 4, progress: true, checkpts: 2},
		{name: "pending with an empty leader reason keeps the log's",
			g: api.Gang{Spec: api.GangSpec{Job: "j", Name: "b"}, State: api.GangPending, Reason: "log"}, queue: DefaultQueue, reason: "log", last: -1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			gv := f.view(c.g)
			if gv.Queue != c.queue || gv.Ready != c.ready || gv.Reason != c.reason || gv.LastCheckpoint != c.last || gv.GPUs != c.gpus ||
				(gv.Progress != nil) != c.progress || gv.Checkpoints != c.checkpts || gv.Ready > gv.Workers {
				t.Errorf("gang %+v", gv)
			}
		})
	}
}

func TestBuildJobs(t *testing.T) {
	got := buildJobs([]api.Job{{Name: "b"}, {Name: "a"}, {Name: "c"}}, []Gang{{Job: "a"}, {Job: "b"}, {Job: "a"}, {Job: "gone"}})
	want := []Job{{Name: "a", Gangs: 2}, {Name: "b", Gangs: 1}, {Name: "c"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("jobs %+v, want %+v", got, want)
	}
}
