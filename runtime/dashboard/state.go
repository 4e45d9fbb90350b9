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
	// Services are the services' records (their replicas are among Gangs).
	Services []api.Service
	// Scheduler is the operator's scheduler configuration as the log has it (its queues,
	// default queue and priority classes; nil: the default configuration).
	Scheduler *api.SchedulerConfig
	// Leader-only; nil on a follower.
	Loads    map[string]api.LoadReport
	Reasons  map[string]string // gang key -> why it waits, as the last scheduling cycle said
	Progress map[string]api.Progress
	Shares   map[string]float64 // queue -> its use over its fair share, as the scheduler has it
	// Leader is the leader's replica id; ServedBy this head's; Leading whether this head
	// leads (its controller has loaded the log).
	Leader, ServedBy uint64
	Leading          bool
	Heads            []api.HeadInfo
	Revision         int64
}

// State is the dashboard's view of the cluster (GET /ui/api/state). Every list is present,
// [] when empty (never null), in the state and in each rack, machine and island.
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
	// Services are the running services: the leader's decision and what their replicas
	// hold.
	Services []Service `json:"services"`
}

// Service is a running service's line: its bounds, the replicas the leader decided, the
// cards its replica gangs hold, and its last decision.
type Service struct {
	Job         string `json:"job"`
	Name        string `json:"name"`
	MinReplicas int    `json:"min_replicas"`
	MaxReplicas int    `json:"max_replicas"`
	Replicas    int    `json:"replicas"`
	GPUs        int    `json:"gpus"`
	ScaleUps    int    `json:"scale_ups"`
	ScaleDowns  int    `json:"scale_downs"`
	Reason      string `json:"reason,omitempty"`
}

// buildServices lists the running services, by job and name.
func buildServices(svcs []api.Service, gpus map[string]int) []Service {
	out := []Service{}
	for _, s := range svcs {
		if s.State != api.ServiceRunning {
			continue
		}
		sv := Service{Job: s.Spec.Job, Name: s.Spec.Name, MinReplicas: s.Spec.MinReplicas, MaxReplicas: s.Spec.MaxReplicas,
			Replicas: s.Replicas, ScaleUps: s.ScaleUps, ScaleDowns: s.ScaleDowns, Reason: s.Reason}
		for i := 0; i < s.Spec.MaxReplicas; i++ {
			sv.GPUs += gpus[s.Spec.Job+"/"+api.ReplicaName(s.Spec.Name, i)]
		}
		out = append(out, sv)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Job != out[j].Job {
			return out[i].Job < out[j].Job
		}
		return out[i].Name < out[j].Name
	})
	return out
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

// Queue is a queue's line: the operator's configured queues, in the configuration's order
// (as `atoll status` and `atoll queues` list them), then any other queue a live gang names.
// A gang that names no queue is in the configuration's default queue.
type Queue struct {
	Name     string `json:"name"`
	Pending  int    `json:"pending"`
	Running  int    `json:"running"` // starting, running or restarting
	GPUs     int    `json:"gpus"`    // cards its gangs hold
	Priority int    `json:"max_priority"`
	// Weight and QuotaGPUs are its configuration (0 for a queue not configured).
	Weight    float64 `json:"weight"`
	QuotaGPUs int     `json:"quota_gpus,omitempty"`
	// Share is its use over its fair share, as the leader's scheduler has it (absent on a
	// follower).
	Share *float64 `json:"share,omitempty"`
}

// Job is a job's line.
type Job struct {
	Name      string       `json:"name"`
	State     api.JobState `json:"state"`
	Driver    string       `json:"driver,omitempty"`
	Submitted time.Time    `json:"submitted"`
	Gangs     int          `json:"gangs"`
}

// DefaultQueue names the queue of gangs that name none when the configuration names no
// other.
const DefaultQueue = "default"

// holds reports whether a gang in this state holds its placement's GPUs.
func holds(s api.GangState) bool {
	return s == api.GangStarting || s == api.GangRunning || s == api.GangRestarting
}

// Build computes the dashboard's state from a head's inputs. It is pure: the same inputs
// give the same state.
func Build(in Inputs) State {
	st := State{Time: in.Now, Leader: in.Leader, ServedBy: in.ServedBy, Leading: in.Leading, Revision: in.Revision, Heads: in.Heads}
	conf := schedulerConfig(in.Scheduler)
	machines := sortMachines(in.Machines)
	cards := holdingsOf(in.Gangs)
	st.Racks = buildRacks(machines, layoutOf(machines), cards.holders, in.Loads, &st.Totals)
	facts := gangFacts{gpus: cards.perGang, ready: readyRanks(in.Gangs, in.Workers), ckpts: checkpointsOf(in.Checkpoints),
		reasons: in.Reasons, progress: in.Progress, conf: conf}
	st.Gangs = buildGangs(in.Gangs, facts, &st.Totals)
	st.Queues = buildQueues(conf, in.Gangs, st.Gangs, in.Shares)
	st.Jobs = buildJobs(in.Jobs, st.Gangs)
	st.Services = buildServices(in.Services, cards.perGang)
	return st
}

// schedulerConfig is the configuration the gangs are counted under: the log's, or the
// default one (its default queue "default") when the log has none or it does not validate,
// as the leader's controller does.
func schedulerConfig(c *api.SchedulerConfig) *api.SchedulerConfig {
	if c != nil {
		conf := *c
		conf.Queues = append([]api.QueueSpec(nil), c.Queues...)
		if conf.Validate() == nil {
			return &conf
		}
	}
	conf := api.SchedulerConfig{}
	_ = conf.Validate()
	return &conf
}

// sortMachines returns a copy of the machines by rack, then name.
func sortMachines(ms []api.Machine) []api.Machine {
	machines := append([]api.Machine(nil), ms...)
	sort.Slice(machines, func(i, j int) bool {
		if machines[i].Rack != machines[j].Rack {
			return machines[i].Rack < machines[j].Rack
		}
		return machines[i].Name < machines[j].Name
	})
	return machines
}

// layout is the cluster's topology as far as the machines' specs give it: byName is empty
// when no machine has a spec or the topology could not be built (GPUs are then drawn
// without islands).
type layout struct {
	tc     *topology.Cluster
	byName map[string]*topology.Machine
}

// layoutOf builds the topology of every machine with a spec, dead ones included (drawn grey).
func layoutOf(machines []api.Machine) layout {
	var insts []topology.MachineInstance
	for _, m := range machines {
		if m.Spec != nil {
			insts = append(insts, topology.MachineInstance{Name: m.Name, Rack: m.Rack, Spec: m.Spec, Discovered: !m.Simulated})
		}
	}
	l := layout{byName: map[string]*topology.Machine{}}
	if len(insts) > 0 {
		l.tc, _ = topology.BuildMachines(insts, topology.NetworkSpec{})
	}
	if l.tc != nil {
		for _, m := range l.tc.Machines {
			l.byName[m.Name] = m
		}
	}
	return l
}

// gpu describes card i of m (which has a spec with more than i GPUs) and returns the
// cluster-wide island it is in, -1 when the topology does not know it.
func (l layout) gpu(m *api.Machine, i int) (GPU, int) {
	gs := m.Spec.GPUs[i]
	gpu := GPU{Index: i, ID: -1, UUID: gs.UUID, Model: gs.Model, MemoryMiB: gs.MemoryMiB}
	tm := l.byName[m.Name]
	if tm == nil || i >= len(tm.GPUs) {
		return gpu, -1
	}
	gpu.ID, gpu.UUID = tm.GPUs[i].ID, tm.GPUs[i].UUID
	for _, mi := range tm.GPUs[i].MIG {
		gpu.MIG = append(gpu.MIG, mi.Profile)
	}
	return gpu, l.tc.IslandOf(tm.GPUs[i].ID)
}

// cardKey names one card of one machine.
type cardKey struct {
	machine string
	index   int
}

// holdings is who holds which card.
type holdings struct {
	holders map[cardKey][]Holder
	perGang map[string]int // cards held, by gang key (a card counts once per member on it)
}

// holdingsOf collects the cards of the gangs that hold their placement.
func holdingsOf(gangs []api.Gang) holdings {
	h := holdings{holders: map[cardKey][]Holder{}, perGang: map[string]int{}}
	for _, g := range gangs {
		if !holds(g.State) || g.Placement == nil {
			continue
		}
		key := g.Spec.Key()
		for rank, m := range g.Placement.Members {
			if m.Removed { // a member an elastic gang shrank away holds nothing
				continue
			}
			for _, idx := range m.GPUs {
				hd := Holder{Gang: key, Rank: rank, MIG: m.MIG}
				if m.Milli > 0 && m.Milli < 1000 {
					hd.Milli = m.Milli
				}
				h.holders[cardKey{m.Machine, idx}] = append(h.holders[cardKey{m.Machine, idx}], hd)
				h.perGang[key]++
			}
		}
	}
	return h
}

// buildRacks draws the (sorted) machines rack by rack, adding their cards, loads and
// stores into t.
func buildRacks(machines []api.Machine, lay layout, holders map[cardKey][]Holder, loads map[string]api.LoadReport, t *Totals) []Rack {
	racks := []Rack{}
	rackIdx := map[int]int{}
	var sums loadSums
	for i := range machines {
		m := &machines[i]
		mv := machineView(m, lay, holders)
		t.Machines++
		if m.Alive {
			t.MachinesAlive++
			t.addCards(&mv)
			if l, ok := loads[m.Name]; ok {
				ld := l.Load
				mv.Load, mv.Store = &ld, l.Store
				sums.add(ld)
				t.addStore(l.Store)
			}
		}
		ri, ok := rackIdx[m.Rack]
		if !ok {
			ri = len(racks)
			rackIdx[m.Rack] = ri
			racks = append(racks, Rack{Rack: m.Rack, Machines: []Machine{}})
		}
		racks[ri].Machines = append(racks[ri].Machines, mv)
	}
	t.Free = t.GPUs - t.Allocated
	sums.averages(t)
	return racks
}

// machineView draws a machine with its cards grouped by island, in the order the islands
// first appear (Free is left to Totals.addCards: only alive machines have free cards).
func machineView(m *api.Machine, lay layout, holders map[cardKey][]Holder) Machine {
	mv := Machine{Name: m.Name, Rack: m.Rack, Alive: m.Alive, Reason: m.Reason, Simulated: m.Simulated, GPUs: m.NumGPUs(), Agent: m.Agent.API,
		Islands: []Island{}}
	if m.Spec != nil {
		mv.Type = m.Spec.Name
		if len(m.Spec.GPUs) > 0 {
			mv.Model = m.Spec.GPUs[0].Model
		}
	}
	islandPos := map[int]int{}
	for i := 0; i < mv.GPUs; i++ {
		gpu, island := lay.gpu(m, i)
		gpu.Holders = holders[cardKey{m.Name, i}]
		pos, ok := islandPos[island]
		if !ok {
			pos = len(mv.Islands)
			islandPos[island] = pos
			mv.Islands = append(mv.Islands, Island{ID: island, GPUs: []GPU{}})
		}
		mv.Islands[pos].GPUs = append(mv.Islands[pos].GPUs, gpu)
	}
	return mv
}

// addCards counts an alive machine's cards: held (and shared) ones into t, free ones into
// both t (through Free = GPUs - Allocated) and the machine.
func (t *Totals) addCards(mv *Machine) {
	for _, is := range mv.Islands {
		for _, gpu := range is.GPUs {
			t.GPUs++
			if len(gpu.Holders) == 0 {
				mv.Free++
				continue
			}
			t.Allocated++
			if gpu.Holders[0].Milli > 0 || gpu.Holders[0].MIG != "" {
				t.Shared++
			}
		}
	}
}

// addStore adds a machine's object store and transfer figures (nil: none reported).
func (t *Totals) addStore(s *api.StoreUsage) {
	if s == nil {
		return
	}
	t.StoreHot += s.HotBytes
	t.StoreCold += s.ColdBytes
	t.StoreCapacity += s.CapacityBytes
	t.TransferBytes += s.ServedBytes + s.PulledBytes
}

// loadSums sums the alive machines' load reports for the cluster's averages.
type loadSums struct {
	util, cpu, mem, n   float64
	measured, measuredN float64
}

func (s *loadSums) add(ld api.Load) {
	s.util += ld.GPU
	s.n++
	s.cpu += ld.CPU
	s.mem += ld.Mem
	if ld.GPUMeasured {
		s.measured += ld.GPU
		s.measuredN++
	}
}

// averages sets t's utilization, CPU and memory averages; each stays nil without reports.
func (s *loadSums) averages(t *Totals) {
	if s.n > 0 {
		t.UtilReported = ptr(s.util / s.n)
		t.CPU, t.Mem = ptr(s.cpu/s.n), ptr(s.mem/s.n)
	}
	if s.measuredN > 0 {
		t.UtilMeasured = ptr(s.measured / s.measuredN)
	}
}

// readyRanks returns, by gang key, the ranks whose worker is of the gang's generation.
func readyRanks(gangs []api.Gang, workers []api.Worker) map[string]map[int]bool {
	ready := map[string]map[int]bool{}
	gen := map[string]int{}
	for _, g := range gangs {
		gen[g.Spec.Key()] = g.Generation
	}
	for _, w := range workers {
		key := w.Job + "/" + w.Gang
		if gw, ok := gen[key]; ok && gw == w.Generation {
			if ready[key] == nil {
				ready[key] = map[int]bool{}
			}
			ready[key][w.Rank] = true
		}
	}
	return ready
}

// ckpt is what the dashboard shows of a gang's checkpoints.
type ckpt struct {
	n    int
	last int64 // the newest step, -1 for none
	at   time.Time
}

// checkpointsOf sums the checkpoints by gang key.
func checkpointsOf(cps []api.Checkpoint) map[string]*ckpt {
	ckpts := map[string]*ckpt{}
	for _, c := range cps {
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
	return ckpts
}

// gangFacts are what Build knows of the gangs beyond their records, by gang key.
type gangFacts struct {
	gpus     map[string]int
	ready    map[string]map[int]bool
	ckpts    map[string]*ckpt
	reasons  map[string]string // leader-only, nil on a follower
	progress map[string]api.Progress
	conf     *api.SchedulerConfig // resolves queues and priority classes
}

// view is a gang's line.
func (f gangFacts) view(g api.Gang) Gang {
	key := g.Spec.Key()
	conf := f.conf
	if conf == nil {
		conf = schedulerConfig(nil)
	}
	prio, err := conf.Priority(g.Spec)
	if err != nil { // a class the configuration lost: what the gang itself says
		prio = g.Spec.Priority
	}
	gv := Gang{Key: key, Job: g.Spec.Job, Name: g.Spec.Name, State: g.State, Reason: g.Reason, Queue: conf.QueueOf(g.Spec), Priority: prio,
		Workers: g.Size(), GPUs: f.gpus[key], Generation: g.Generation, Restarts: g.Restarts, Created: g.Created,
		Updated: g.Updated, RestartAt: g.RestartAt, Placement: g.Placement, Resources: g.Spec.Resources, LastCheckpoint: -1}
	gv.Ready = g.ReadyWorkers(func(m int) bool { return f.ready[key][m] })
	if g.State == api.GangPending {
		if r, ok := f.reasons[key]; ok && r != "" {
			gv.Reason = r
		}
	}
	if c := f.ckpts[key]; c != nil {
		gv.Checkpoints, gv.LastCheckpoint, gv.CheckpointAt = c.n, c.last, c.at
	}
	if p, ok := f.progress[key]; ok {
		gv.Progress = &p
	}
	return gv
}

// buildGangs returns the gangs' lines (live first), counting the gangs by state into t.
func buildGangs(gangs []api.Gang, f gangFacts, t *Totals) []Gang {
	out := make([]Gang, 0, len(gangs))
	for _, g := range gangs {
		out = append(out, f.view(g))
		t.countGang(g.State)
	}
	sort.Slice(out, func(i, j int) bool { return lessGang(out[i], out[j]) })
	return out
}

// buildQueues returns the queues' lines: those configured, counted as `atoll status`
// counts them (api.SchedulerConfig.QueueLines), then those that only a live gang names (a
// configuration the log has not validated), by name; with the highest priority of each
// queue's gangs and, on the leader, its share.
func buildQueues(conf *api.SchedulerConfig, recs []api.Gang, gangs []Gang, shares map[string]float64) []Queue {
	out := []Queue{}
	at := map[string]int{}
	for _, l := range conf.QueueLines(recs) {
		at[l.Name] = len(out)
		out = append(out, Queue{Name: l.Name, Pending: l.Pending, Running: l.Running, GPUs: l.GPUs, Weight: l.Weight, QuotaGPUs: l.QuotaGPUs})
	}
	var extra []Queue
	byExtra := map[string]int{}
	for _, g := range gangs {
		if i, ok := at[g.Queue]; ok {
			out[i].Priority = max(out[i].Priority, g.Priority)
			continue
		}
		if !g.State.Live() {
			continue
		}
		i, ok := byExtra[g.Queue]
		if !ok {
			i = len(extra)
			byExtra[g.Queue] = i
			extra = append(extra, Queue{Name: g.Queue})
		}
		extra[i].add(g)
	}
	sort.Slice(extra, func(i, j int) bool { return extra[i].Name < extra[j].Name })
	out = append(out, extra...)
	for i := range out {
		if v, ok := shares[out[i].Name]; ok {
			out[i].Share = &v
		}
	}
	return out
}

// countGang counts a gang in its state.
func (t *Totals) countGang(s api.GangState) {
	switch s {
	case api.GangPending:
		t.Pending++
	case api.GangStarting:
		t.Starting++
	case api.GangRunning:
		t.Running++
	case api.GangRestarting:
		t.Restarting++
	case api.GangFailed:
		t.Failed++
	case api.GangStopped:
		t.Stopped++
	}
}

// add counts a gang of the queue.
func (q *Queue) add(g Gang) {
	q.Priority = max(q.Priority, g.Priority)
	if g.State == api.GangPending {
		q.Pending++
	}
	if holds(g.State) {
		q.Running++
		q.GPUs += g.GPUs
	}
}

// buildJobs returns the jobs' lines by name, each with its number of gangs.
func buildJobs(jobs []api.Job, gangs []Gang) []Job {
	perJob := map[string]int{}
	for _, g := range gangs {
		perJob[g.Job]++
	}
	out := make([]Job, 0, len(jobs))
	for _, j := range jobs {
		out = append(out, Job{Name: j.Name, State: j.State, Driver: j.Driver, Submitted: j.Submitted, Gangs: perJob[j.Name]})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
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
