package dashboard

import (
	"sort"
	"strings"
	"time"

	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/topology"
)

// Inputs are what a head knows of the cluster: the log's tables (every head has them) and,
// on the leader, what only the leader hears (load reports, fresher pending reasons, the
// jobs' progress reports).
type Inputs struct {
	Now         time.Time
	Machines    []api.Machine
	Jobs        []api.Job
	Gangs       []api.Gang
	Workers     []api.Worker
	Checkpoints []api.Checkpoint
	// Leader-only; nil on a follower.
	Loads    map[string]api.LoadReport
	Reasons  map[string]string // gang key -> why it waits, as the last scheduling cycle said
	Progress map[string]api.Progress
	// Leader is the leader's replica id; ServedBy this head's; Leading whether this head
	// leads (its controller has loaded the log).
	Leader, ServedBy uint64
	Leading          bool
	Heads            []api.HeadInfo
	Revision         int64
}

// State is the dashboard's view of the cluster (GET /ui/api/state).
type State struct {
	Time     time.Time      `json:"time"`
	Leader   uint64         `json:"leader"`
	ServedBy uint64         `json:"served_by"`
	Leading  bool           `json:"leading"`
	Revision int64          `json:"revision"`
	Heads    []api.HeadInfo `json:"heads,omitempty"`
	Totals   Totals         `json:"totals"`
	Racks    []Rack         `json:"racks"`
	Gangs    []Gang         `json:"gangs"`
	Queues   []Queue        `json:"queues"`
	Jobs     []Job          `json:"jobs"`
}

// Totals are the cluster's counts. GPUs count alive machines only.
type Totals struct {
	Machines      int `json:"machines"`
	MachinesAlive int `json:"machines_alive"`
	GPUs          int `json:"gpus"`
	// Allocated counts cards held by a live gang (a whole card, a share or a MIG slice);
	// Shared those held by a share or a MIG slice.
	Allocated int `json:"allocated"`
	Shared    int `json:"shared"`
	Free      int `json:"free"`
	// Gangs by state.
	Pending    int `json:"pending"`
	Starting   int `json:"starting"`
	Running    int `json:"running"`
	Restarting int `json:"restarting"`
	Failed     int `json:"failed"`
	Stopped    int `json:"stopped"`
	// Measured GPU utilization (NVML) averaged over the machines that measure it, nil when
	// none does; Reported the agents' GPU figure averaged over all that report (on
	// simulated machines, the share of GPUs held by running workers).
	UtilMeasured *float64 `json:"util_measured,omitempty"`
	UtilReported *float64 `json:"util_reported,omitempty"`
	CPU          *float64 `json:"cpu,omitempty"`
	Mem          *float64 `json:"mem,omitempty"`
	// Object store and transfer plane, summed over the machines' last reports.
	StoreHot      int64 `json:"store_hot_bytes"`
	StoreCold     int64 `json:"store_cold_bytes"`
	StoreCapacity int64 `json:"store_capacity_bytes"`
	TransferBytes int64 `json:"transfer_bytes"`
}

// Rack is one rack's machines.
type Rack struct {
	Rack     int       `json:"rack"`
	Machines []Machine `json:"machines"`
}

// Machine is one machine with its GPUs grouped by NVLink island.
type Machine struct {
	Name      string          `json:"name"`
	Rack      int             `json:"rack"`
	Alive     bool            `json:"alive"`
	Reason    string          `json:"reason,omitempty"`
	Simulated bool            `json:"simulated"`
	Type      string          `json:"type,omitempty"`
	Model     string          `json:"model,omitempty"`
	GPUs      int             `json:"gpus"`
	Free      int             `json:"free"`
	Islands   []Island        `json:"islands"`
	Load      *api.Load       `json:"load,omitempty"`
	Store     *api.StoreUsage `json:"store,omitempty"`
	Agent     string          `json:"agent,omitempty"`
}

// Island is the GPUs of one machine in one NVLink island (ID is the cluster-wide island
// id; -1 when the topology could not be built).
type Island struct {
	ID   int   `json:"id"`
	GPUs []GPU `json:"gpus"`
}

// GPU is one card and who holds it.
type GPU struct {
	Index     int      `json:"index"`
	ID        int      `json:"id"`
	UUID      string   `json:"uuid,omitempty"`
	Model     string   `json:"model,omitempty"`
	MemoryMiB int64    `json:"memory_mib,omitempty"`
	MIG       []string `json:"mig,omitempty"` // MIG instances' profiles
	Holders   []Holder `json:"holders,omitempty"`
}

// Holder is a gang member on a card.
type Holder struct {
	Gang  string `json:"gang"` // job/gang
	Rank  int    `json:"rank"`
	Milli int    `json:"milli,omitempty"` // a share of the card (0: whole)
	MIG   string `json:"mig,omitempty"`   // a MIG profile
}

// Gang is a gang's line.
type Gang struct {
	Key        string         `json:"key"`
	Job        string         `json:"job"`
	Name       string         `json:"name"`
	State      api.GangState  `json:"state"`
	Reason     string         `json:"reason,omitempty"`
	Queue      string         `json:"queue"`
	Priority   int            `json:"priority,omitempty"`
	Workers    int            `json:"workers"`
	Ready      int            `json:"ready"`
	GPUs       int            `json:"gpus"` // cards held
	Generation int            `json:"generation"`
	Restarts   int            `json:"restarts"`
	Created    time.Time      `json:"created"`
	Updated    time.Time      `json:"updated"`
	RestartAt  time.Time      `json:"restart_at,omitzero"`
	Placement  *api.Placement `json:"placement,omitempty"`
	Resources  api.Resources  `json:"resources"`
	// Checkpoints committed (as the log keeps them) and the newest one's step.
	Checkpoints    int           `json:"checkpoints"`
	LastCheckpoint int64         `json:"last_checkpoint"`
	CheckpointAt   time.Time     `json:"checkpoint_at,omitzero"`
	Progress       *api.Progress `json:"progress,omitempty"`
}

// Queue is a queue's counts (a gang without a queue is in "default").
type Queue struct {
	Name     string `json:"name"`
	Pending  int    `json:"pending"`
	Running  int    `json:"running"` // starting, running or restarting
	GPUs     int    `json:"gpus"`    // cards its gangs hold
	Priority int    `json:"max_priority"`
}

// Job is a job's line.
type Job struct {
	Name      string       `json:"name"`
	State     api.JobState `json:"state"`
	Driver    string       `json:"driver,omitempty"`
	Submitted time.Time    `json:"submitted"`
	Gangs     int          `json:"gangs"`
}

// DefaultQueue names the queue of gangs that name none.
const DefaultQueue = "default"

// holds reports whether a gang in this state holds its placement's GPUs.
func holds(s api.GangState) bool {
	return s == api.GangStarting || s == api.GangRunning || s == api.GangRestarting
}

// Build computes the dashboard's state from a head's inputs. It is pure: the same inputs
// give the same state.
func Build(in Inputs) State {
	st := State{Time: in.Now, Leader: in.Leader, ServedBy: in.ServedBy, Leading: in.Leading, Revision: in.Revision, Heads: in.Heads}
	machines := append([]api.Machine(nil), in.Machines...)
	sort.Slice(machines, func(i, j int) bool {
		if machines[i].Rack != machines[j].Rack {
			return machines[i].Rack < machines[j].Rack
		}
		return machines[i].Name < machines[j].Name
	})
	// Islands: the topology of every machine with a spec, dead ones included (drawn grey).
	var tc *topology.Cluster
	var insts []topology.MachineInstance
	for _, m := range machines {
		if m.Spec != nil {
			insts = append(insts, topology.MachineInstance{Name: m.Name, Rack: m.Rack, Spec: m.Spec, Discovered: !m.Simulated})
		}
	}
	if len(insts) > 0 {
		tc, _ = topology.BuildMachines(insts, topology.NetworkSpec{}) // nil: GPUs are drawn without islands
	}
	byName := map[string]*topology.Machine{}
	if tc != nil {
		for _, m := range tc.Machines {
			byName[m.Name] = m
		}
	}
	// Who holds which card.
	type cardKey struct {
		machine string
		index   int
	}
	holders := map[cardKey][]Holder{}
	gangGPUs := map[string]int{}
	for _, g := range in.Gangs {
		if !holds(g.State) || g.Placement == nil {
			continue
		}
		key := g.Spec.Key()
		for rank, m := range g.Placement.Members {
			for _, idx := range m.GPUs {
				h := Holder{Gang: key, Rank: rank, MIG: m.MIG}
				if m.Milli > 0 && m.Milli < 1000 {
					h.Milli = m.Milli
				}
				holders[cardKey{m.Machine, idx}] = append(holders[cardKey{m.Machine, idx}], h)
				gangGPUs[key]++
			}
		}
	}
	var util, utilN, measured, measuredN, cpu, mem float64
	rackIdx := map[int]int{}
	for _, m := range machines {
		mv := Machine{Name: m.Name, Rack: m.Rack, Alive: m.Alive, Reason: m.Reason, Simulated: m.Simulated, GPUs: m.NumGPUs(), Agent: m.Agent.API}
		if m.Spec != nil {
			mv.Type = m.Spec.Name
			if len(m.Spec.GPUs) > 0 {
				mv.Model = m.Spec.GPUs[0].Model
			}
		}
		tm := byName[m.Name]
		islandPos := map[int]int{}
		for i := 0; i < mv.GPUs; i++ {
			gs := m.Spec.GPUs[i]
			gpu := GPU{Index: i, ID: -1, UUID: gs.UUID, Model: gs.Model, MemoryMiB: gs.MemoryMiB, Holders: holders[cardKey{m.Name, i}]}
			island := -1
			if tm != nil && i < len(tm.GPUs) {
				gpu.ID, gpu.UUID = tm.GPUs[i].ID, tm.GPUs[i].UUID
				island = tc.IslandOf(tm.GPUs[i].ID)
				for _, mi := range tm.GPUs[i].MIG {
					gpu.MIG = append(gpu.MIG, mi.Profile)
				}
			}
			pos, ok := islandPos[island]
			if !ok {
				pos = len(mv.Islands)
				islandPos[island] = pos
				mv.Islands = append(mv.Islands, Island{ID: island})
			}
			mv.Islands[pos].GPUs = append(mv.Islands[pos].GPUs, gpu)
			if m.Alive {
				st.Totals.GPUs++
				if len(gpu.Holders) > 0 {
					st.Totals.Allocated++
					if gpu.Holders[0].Milli > 0 || gpu.Holders[0].MIG != "" {
						st.Totals.Shared++
					}
				} else {
					mv.Free++
				}
			}
		}
		st.Totals.Machines++
		if m.Alive {
			st.Totals.MachinesAlive++
			if l, ok := in.Loads[m.Name]; ok {
				ld := l.Load
				mv.Load = &ld
				mv.Store = l.Store
				util += ld.GPU
				utilN++
				cpu += ld.CPU
				mem += ld.Mem
				if ld.GPUMeasured {
					measured += ld.GPU
					measuredN++
				}
				if s := l.Store; s != nil {
					st.Totals.StoreHot += s.HotBytes
					st.Totals.StoreCold += s.ColdBytes
					st.Totals.StoreCapacity += s.CapacityBytes
					st.Totals.TransferBytes += s.ServedBytes + s.PulledBytes
				}
			}
		}
		ri, ok := rackIdx[m.Rack]
		if !ok {
			ri = len(st.Racks)
			rackIdx[m.Rack] = ri
			st.Racks = append(st.Racks, Rack{Rack: m.Rack})
		}
		st.Racks[ri].Machines = append(st.Racks[ri].Machines, mv)
	}
	st.Totals.Free = st.Totals.GPUs - st.Totals.Allocated
	if utilN > 0 {
		st.Totals.UtilReported = ptr(util / utilN)
		st.Totals.CPU, st.Totals.Mem = ptr(cpu/utilN), ptr(mem/utilN)
	}
	if measuredN > 0 {
		st.Totals.UtilMeasured = ptr(measured / measuredN)
	}
	// Gangs, with their ready workers and checkpoints.
	ready := map[string]map[int]bool{}
	gen := map[string]int{}
	for _, g := range in.Gangs {
		gen[g.Spec.Key()] = g.Generation
	}
	for _, w := range in.Workers {
		key := w.Job + "/" + w.Gang
		if gw, ok := gen[key]; ok && gw == w.Generation {
			if ready[key] == nil {
				ready[key] = map[int]bool{}
			}
			ready[key][w.Rank] = true
		}
	}
	type ckpt struct {
		n    int
		last int64
		at   time.Time
	}
	ckpts := map[string]*ckpt{}
	for _, c := range in.Checkpoints {
		key := c.Job + "/" + c.Gang
		k := ckpts[key]
		if k == nil {
			k = &ckpt{last: -1}
			ckpts[key] = k
		}
		k.n++
		if c.Step > k.last {
			k.last, k.at = c.Step, c.Time
		}
	}
	queues := map[string]*Queue{}
	jobGangs := map[string]int{}
	for _, g := range in.Gangs {
		key := g.Spec.Key()
		q := g.Spec.Queue
		if q == "" {
			q = DefaultQueue
		}
		gv := Gang{Key: key, Job: g.Spec.Job, Name: g.Spec.Name, State: g.State, Reason: g.Reason, Queue: q, Priority: g.Spec.Priority,
			Workers: g.Spec.Workers, GPUs: gangGPUs[key], Generation: g.Generation, Restarts: g.Restarts, Created: g.Created,
			Updated: g.Updated, RestartAt: g.RestartAt, Placement: g.Placement, Resources: g.Spec.Resources, LastCheckpoint: -1}
		if holds(g.State) {
			gv.Ready = len(ready[key])
		}
		if g.State == api.GangPending {
			if r, ok := in.Reasons[key]; ok && r != "" {
				gv.Reason = r
			}
		}
		if c := ckpts[key]; c != nil {
			gv.Checkpoints, gv.LastCheckpoint, gv.CheckpointAt = c.n, c.last, c.at
		}
		if p, ok := in.Progress[key]; ok {
			gv.Progress = &p
		}
		st.Gangs = append(st.Gangs, gv)
		jobGangs[g.Spec.Job]++
		qq := queues[q]
		if qq == nil {
			qq = &Queue{Name: q}
			queues[q] = qq
		}
		qq.Priority = max(qq.Priority, g.Spec.Priority)
		switch g.State {
		case api.GangPending:
			st.Totals.Pending++
			qq.Pending++
		case api.GangStarting:
			st.Totals.Starting++
		case api.GangRunning:
			st.Totals.Running++
		case api.GangRestarting:
			st.Totals.Restarting++
		case api.GangFailed:
			st.Totals.Failed++
		case api.GangStopped:
			st.Totals.Stopped++
		}
		if holds(g.State) {
			qq.Running++
			qq.GPUs += gangGPUs[key]
		}
	}
	sort.Slice(st.Gangs, func(i, j int) bool { return lessGang(st.Gangs[i], st.Gangs[j]) })
	for _, q := range queues {
		st.Queues = append(st.Queues, *q)
	}
	sort.Slice(st.Queues, func(i, j int) bool { return st.Queues[i].Name < st.Queues[j].Name })
	for _, j := range in.Jobs {
		st.Jobs = append(st.Jobs, Job{Name: j.Name, State: j.State, Driver: j.Driver, Submitted: j.Submitted, Gangs: jobGangs[j.Name]})
	}
	sort.Slice(st.Jobs, func(i, j int) bool { return st.Jobs[i].Name < st.Jobs[j].Name })
	return st
}

// lessGang orders live gangs first (running before pending), then by key.
func lessGang(a, b Gang) bool {
	ra, rb := stateRank(a.State), stateRank(b.State)
	if ra != rb {
		return ra < rb
	}
	return strings.Compare(a.Key, b.Key) < 0
}

func stateRank(s api.GangState) int {
	switch s {
	case api.GangRunning, api.GangStarting, api.GangRestarting:
		return 0
	case api.GangPending:
		return 1
	}
	return 2
}

func ptr(v float64) *float64 { return &v }
