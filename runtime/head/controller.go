// Package head is the head process's control plane: on the replica that leads the Paxos
// metadata log it runs the gang scheduler core, the jobs' and gangs' state machines, gang
// restarts and the machines' membership, and it serves the cluster's HTTP API (on every
// replica; followers redirect control requests to the leader).
//
// The controller's state is a cache of the log. When its replica becomes leader it reads
// the log's tables (machines, jobs, gangs, workers) and rebuilds the scheduler from them, as
// kube-scheduler rebuilds its cache from informers: the scheduler core is the single source
// of truth for GPU occupancy. Every decision is committed to the log before it takes
// effect: agents start and stop worker processes only from what the log says, and drivers
// are answered only after the commit. No lock is held across a consensus round: a decision
// is made under the controller's lock, applied to the cache (so that concurrent decisions
// see the capacity it took), and committed after the lock is released, guarded by the
// versions it read; if a commit fails the cache is dropped and rebuilt from the log.
package head

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/atoll-run/atoll/gang"
	"github.com/atoll-run/atoll/gang/topoadapt"
	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/runtime/events"
	"github.com/atoll-run/atoll/store/meta"
	"github.com/atoll-run/atoll/store/meta/metaserver"
	"github.com/atoll-run/atoll/store/paxos"
	"github.com/atoll-run/atoll/topology"
)

// ControllerConfig configures a Controller.
type ControllerConfig struct {
	// Scheduler configures the gang scheduler core. Default gang.DefaultConfig().
	Scheduler gang.Config
	// Poll is how often the leader sweeps for dead machines (and so notices its own
	// pauses). Default 200 ms. Changes of leadership are watched, not polled.
	Poll time.Duration
	// Clock is the time source (with a monotonic reading). Default time.Now.
	Clock func() time.Time
	// HeartbeatTimeout declares dead a machine whose agent sent no load report for this long
	// (the only rule without gossip). Default 10 s. Failure detection: detect.go.
	HeartbeatTimeout time.Duration
	// GossipConfirm declares dead a machine that gossip has failed (or left) and whose agent
	// sent no load report for this long: gossip alone never does. Default 3 s.
	GossipConfirm time.Duration
	// PauseThreshold: a gap between two sweeps longer than this means the leader itself
	// was paused or starved; every machine then gets a fresh grace period. Default 1 s.
	PauseThreshold time.Duration
	// FlapMemory is how long a machine that gossip had down and that came back keeps its
	// longer GossipConfirm (doubled per comeback). Default 1 min.
	FlapMemory time.Duration
	// Logger (default no-op).
	Logger *zap.Logger
}

// DefaultSchedulerConfig is the scheduler core's configuration on a head: the core's
// defaults, without the delay scheduling that lets a gang wait for a more compact
// placement (a gang that can be placed now is placed now). The operator's
// api.SchedulerConfig adds the queues, the notice grace and the preemption guard.
func DefaultSchedulerConfig() gang.Config {
	c := gang.DefaultConfig()
	c.TopologyWait = 0
	c.TopologyWaitUnforeseen = 0
	c.MinRunBeforePreempt = 0
	// A preemption that pays for itself within milliseconds is carried out then, not at
	// the next whole second.
	c.Preempt.RetryResolution = 10 * time.Millisecond
	return c
}

// defaultSchedulerConfig is the operator's configuration until one is set: one queue
// "default", no priority classes, a notice grace of 30 s.
func defaultSchedulerConfig() api.SchedulerConfig {
	c := api.SchedulerConfig{}
	_ = c.Validate()
	return c
}

// schedulerConfig is the core's configuration with the operator's queues and guards.
func (c *Controller) schedulerConfig(conf api.SchedulerConfig) gang.Config {
	g := c.cfg.Scheduler
	g.Queues = nil
	for _, q := range conf.Queues {
		g.Queues = append(g.Queues, gang.QueueConfig{Name: q.Name, Weight: q.Weight, Quota: q.QuotaGPUs, Sensitivity: q.Sensitivity})
	}
	g.DefaultQueue = conf.DefaultQueue
	g.CheckpointGrace = time.Duration(conf.NoticeGrace)
	g.MinRunBeforePreempt = time.Duration(conf.MinRunBeforePreempt)
	if conf.MaxPending > 0 {
		g.MaxPending = conf.MaxPending
	}
	g.Growable = c.poolStatus != nil
	return g
}

// Controller runs the control plane on the leader. Its methods answer
// *paxos.NotLeaderError when this replica does not lead (the API turns that into a 421 with
// the leader's id) and api.ErrUnavailable while it is loading the log after an election.
type Controller struct {
	cfg ControllerConfig
	rep *paxos.Replica
	sm  *metaserver.StateMachine
	log *zap.Logger

	mu       sync.Mutex
	t        *term
	terms    int
	watchers []chan struct{} // told on every change (tests, status)

	membership    func() map[string]bool  // machines gossip knows dead; nil without membership
	cordoned      map[string]bool         // machines that take no new gangs (pools draining them)
	poolStatus    func() *api.PoolsStatus // the pools runner's status; nil without pools
	poolInterrupt func(machine string, after time.Duration) error

	obs *ctlObs // metrics, the event log's sequence, jobs' progress reports (observe.go)

	poke chan struct{} // asks Run for a sweep now (gossip news)
	stop chan struct{}
	done chan struct{}
}

// term is the controller's state while its replica leads.
type term struct {
	id       int
	machines map[string]*machineEntry
	jobs     map[string]*jobEntry
	gangs    map[string]*gangEntry
	sched    *gang.Scheduler
	topo     *topology.Cluster
	order    []string       // scheduler node index -> machine name
	index    map[string]int // machine name -> scheduler node index
	timers   map[string]*time.Timer
	loads    map[string]api.LoadReport
	detect   *failureDetector // the machines' liveness evidence (detect.go)
	// conf is the operator's scheduler configuration (queues, priority classes), from the
	// log (confVer its version, 0 when none was ever set).
	conf    api.SchedulerConfig
	confVer int64
	// ckpt is what the gangs reported of their checkpoints, by gang key.
	ckpt map[string]ckptInfo
	// cycleAt is when a cycle is armed (cycleTimer), for the scheduler's NextCycle.
	cycleAt    time.Time
	cycleTimer *time.Timer
}

// ckptInfo is a gang's newest reported checkpoint.
type ckptInfo struct {
	at    time.Time
	step  int64
	bytes int64
	save  time.Duration
}

type machineEntry struct {
	rec api.Machine
	ver int64
}

type jobEntry struct {
	rec api.Job
	ver int64
}

type gangEntry struct {
	rec   api.Gang
	ver   int64
	ready map[int]api.Worker // workers of rec.Generation that said they are ready
}

// NewController returns a controller over a replica and its state machine; Run starts it.
func NewController(cfg ControllerConfig, rep *paxos.Replica, sm *metaserver.StateMachine) *Controller {
	if cfg.Scheduler.MaxCandidates == 0 {
		cfg.Scheduler = DefaultSchedulerConfig()
	}
	if cfg.Poll == 0 {
		cfg.Poll = 200 * time.Millisecond
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.HeartbeatTimeout == 0 {
		cfg.HeartbeatTimeout = 10 * time.Second
	}
	if cfg.GossipConfirm == 0 {
		cfg.GossipConfirm = min(3*time.Second, cfg.HeartbeatTimeout)
	}
	if cfg.PauseThreshold == 0 {
		cfg.PauseThreshold = max(time.Second, 5*cfg.Poll)
	}
	if cfg.FlapMemory == 0 {
		cfg.FlapMemory = time.Minute
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	return &Controller{cfg: cfg, rep: rep, sm: sm, log: cfg.Logger.Named("controller"), stop: make(chan struct{}), done: make(chan struct{}),
		poke: make(chan struct{}, 1), obs: newCtlObs()}
}

// SetMembership gives the controller gossip's view of which machines failed or left; it is
// consulted when a term starts (machines that died during an election are found then).
func (c *Controller) SetMembership(dead func() map[string]bool) {
	c.mu.Lock()
	c.membership = dead
	c.mu.Unlock()
}

// Run follows the replica's leadership until Stop: it builds a term when the replica
// becomes leader and drops it when it stops leading; while it leads, it sweeps for dead
// machines every Poll.
func (c *Controller) Run() {
	defer close(c.done)
	var sweep *time.Ticker
	defer func() {
		if sweep != nil {
			sweep.Stop()
		}
	}()
	for {
		changed := c.rep.Changed()
		st := c.rep.Status()
		c.obs.sawLeader(st.Leader)
		c.mu.Lock()
		have := c.t != nil
		c.mu.Unlock()
		switch {
		case st.Role == paxos.Leader && !have:
			if err := c.buildTerm(); err != nil {
				c.log.Warn("could not load the log as the new leader; retrying", zap.Error(err))
			}
			have = true // retried at the next sweep if it failed
		case st.Role != paxos.Leader && have:
			c.dropTerm("lost the leadership")
			have = false
		}
		var sweepC <-chan time.Time
		switch {
		case have && sweep == nil:
			sweep = time.NewTicker(c.cfg.Poll)
			sweepC = sweep.C
		case have:
			sweepC = sweep.C
		case sweep != nil: // a follower does not sweep: nothing wakes it but the replica
			sweep.Stop()
			sweep = nil
		}
		select {
		case <-c.stop:
			c.dropTerm("stopping")
			return
		case <-changed:
		case <-sweepC:
			c.sweep()
		case <-c.poke:
			c.sweep()
		}
	}
}

// Stop stops Run and waits for it.
func (c *Controller) Stop() {
	select {
	case <-c.stop:
	default:
		close(c.stop)
	}
	<-c.done
}

// Leading reports whether the controller has a term (this replica leads and its state is
// loaded).
func (c *Controller) Leading() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t != nil
}

// Changed returns a channel closed at the next change of the controller's state.
func (c *Controller) Changed() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan struct{})
	c.watchers = append(c.watchers, ch)
	return ch
}

func (c *Controller) notifyLocked() {
	for _, ch := range c.watchers {
		close(ch)
	}
	c.watchers = nil
}

func (c *Controller) dropTerm(why string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dropTermLocked(why)
}

func (c *Controller) dropTermLocked(why string) {
	if c.t == nil {
		return
	}
	for _, tm := range c.t.timers {
		tm.Stop()
	}
	if c.t.cycleTimer != nil {
		c.t.cycleTimer.Stop()
	}
	c.log.Info("control plane term ends", zap.Int("term", c.t.id), zap.String("why", why))
	c.t = nil
	c.notifyLocked()
}

// notLeader is the error of a call to a replica that does not lead.
func (c *Controller) notLeader() error {
	st := c.rep.Status()
	if st.Role == paxos.Leader {
		return fmt.Errorf("%w: the new leader is loading the cluster's state", api.ErrUnavailable)
	}
	if st.Leader == 0 {
		return fmt.Errorf("%w: no leader elected yet", api.ErrUnavailable)
	}
	return &paxos.NotLeaderError{Leader: st.Leader}
}

// lockTerm locks the controller and returns its term, or the error to answer. A leader
// whose lease has run out (it was paused, or cannot reach a majority) answers and decides
// nothing until its replica confirms the leadership again: its view may be stale.
func (c *Controller) lockTerm() (*term, error) {
	c.mu.Lock()
	if c.t == nil {
		c.mu.Unlock()
		return nil, c.notLeader()
	}
	if !c.rep.Leading() {
		c.mu.Unlock()
		return nil, fmt.Errorf("%w: the leader cannot confirm its leadership (its lease ran out)", api.ErrUnavailable)
	}
	return c.t, nil
}

// buildTerm loads the log's tables and rebuilds the scheduler from them.
func (c *Controller) buildTerm() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.rep.Read(ctx); err != nil { // the state machine has applied every chosen entry
		return err
	}
	now := c.cfg.Clock()
	c.mu.Lock()
	c.terms++
	t := &term{id: c.terms, machines: map[string]*machineEntry{}, jobs: map[string]*jobEntry{}, gangs: map[string]*gangEntry{},
		index: map[string]int{}, timers: map[string]*time.Timer{}, loads: map[string]api.LoadReport{}, ckpt: map[string]ckptInfo{}}
	c.mu.Unlock()
	t.conf = defaultSchedulerConfig()
	if kv, ok := c.sm.Get(api.SchedulerConfigKey); ok {
		var conf api.SchedulerConfig
		if err := json.Unmarshal(kv.Value, &conf); err != nil {
			return fmt.Errorf("head: %s: %w", api.SchedulerConfigKey, err)
		}
		if err := conf.Validate(); err != nil {
			c.log.Error("the scheduler configuration in the log is not valid; using the default", zap.Error(err))
		} else {
			t.conf = conf
		}
		t.confVer = kv.Version
	}
	for _, kv := range c.sm.Range(api.TableMachines) {
		var m api.Machine
		if err := json.Unmarshal(kv.Value, &m); err != nil {
			return fmt.Errorf("head: machine %s: %w", kv.Key, err)
		}
		t.machines[m.Name] = &machineEntry{rec: m, ver: kv.Version}
	}
	for _, kv := range c.sm.Range(api.TableJobs) {
		var j api.Job
		if err := json.Unmarshal(kv.Value, &j); err != nil {
			return fmt.Errorf("head: job %s: %w", kv.Key, err)
		}
		t.jobs[j.Name] = &jobEntry{rec: j, ver: kv.Version}
	}
	for _, kv := range c.sm.Range(api.TableGangs) {
		var g api.Gang
		if err := json.Unmarshal(kv.Value, &g); err != nil {
			return fmt.Errorf("head: gang %s: %w", kv.Key, err)
		}
		t.gangs[g.Spec.Key()] = &gangEntry{rec: g, ver: kv.Version, ready: map[int]api.Worker{}}
	}
	for _, kv := range c.sm.Range(api.TableWorkers) {
		var w api.Worker
		if err := json.Unmarshal(kv.Value, &w); err != nil {
			return fmt.Errorf("head: worker %s: %w", kv.Key, err)
		}
		if e := t.gangs[w.Job+"/"+w.Gang]; e != nil && e.rec.Generation == w.Generation && w.GangUID == e.rec.UID {
			e.ready[w.Rank] = w
		}
	}
	prune := c.obs.events.Resume(c.sm.Range(api.TableEvents)) // continue the event log's sequence
	c.mu.Lock()
	if c.t != nil || c.rep.Status().Role != paxos.Leader {
		c.mu.Unlock()
		return nil
	}
	c.t = t
	var dead map[string]bool
	if c.membership != nil {
		dead = c.membership()
	}
	var work []commitFn
	if len(prune) > 0 {
		work = append(work, commitFn{what: "the event log's bound", ops: prune})
	}
	// A new leader has heard no machine yet: each gets a grace period from now. Machines
	// that gossip had failed when this head became leader are dead once their silence
	// confirms it (detect.go).
	t.detect = c.newDetector(now)
	for name, m := range t.machines {
		if m.rec.Alive && dead[name] {
			t.detect.gossip(name, "failed", now)
		}
	}
	work = append(work, c.rebuildLocked(t, now)...)
	// Restarts that were waiting for their backoff when the last leader went away, and
	// notices that were running.
	for key, e := range t.gangs {
		if e.rec.State == api.GangRestarting {
			c.armRestartLocked(t, key, e.rec.Generation, e.rec.RestartAt)
		}
		if e.rec.Notice != nil && e.rec.State.Live() {
			c.armNoticeLocked(t, e)
		}
	}
	c.log.Info("control plane term starts", zap.Int("term", t.id), zap.Int("machines", len(t.machines)),
		zap.Int("jobs", len(t.jobs)), zap.Int("gangs", len(t.gangs)))
	c.notifyLocked()
	c.mu.Unlock()
	return c.runCommits(ctx, t, work)
}

// commitFn is a decision to commit: its compares and ops, and what to do once it is
// committed (under the controller's lock).
type commitFn struct {
	what string
	cmp  []meta.Compare
	ops  []meta.Op
	// events record the decision in the event log, in the same transaction.
	events []api.Event
}

// runCommits commits decisions in order; a failure drops the term (the cache may be wrong).
func (c *Controller) runCommits(ctx context.Context, t *term, work []commitFn) error {
	for _, w := range work {
		ops := w.ops
		if len(w.events) > 0 {
			ops = append(ops[:len(ops):len(ops)], c.obs.events.Ops(w.events)...)
		}
		if err := c.commit(ctx, w.cmp, ops); err != nil {
			c.mu.Lock()
			if c.t == t {
				c.dropTermLocked(fmt.Sprintf("commit of %s failed: %v", w.what, err))
			}
			c.mu.Unlock()
			return fmt.Errorf("head: commit %s: %w", w.what, err)
		}
		c.obs.committed(w.events)
	}
	return nil
}

var errConflict = errors.New("head: a record changed under the decision")

// commit proposes one transaction through the log and waits until it is chosen.
func (c *Controller) commit(ctx context.Context, cmp []meta.Compare, ops []meta.Op) error {
	if len(ops) == 0 {
		return nil
	}
	data, err := json.Marshal(meta.Request{Compares: cmp, Ops: ops})
	if err != nil {
		return err
	}
	start := time.Now()
	out, err := c.rep.Propose(ctx, data)
	c.obs.commitTook(time.Since(start), err)
	if err != nil {
		var nl *paxos.NotLeaderError
		if errors.As(err, &nl) {
			return err
		}
		return fmt.Errorf("%w: %v", api.ErrUnavailable, err)
	}
	var resp meta.Response
	if err := json.Unmarshal(out, &resp); err != nil {
		return fmt.Errorf("head: decode commit answer: %w", err)
	}
	if resp.Error != "" {
		return fmt.Errorf("head: commit refused: %s", resp.Error)
	}
	if !resp.Succeeded {
		return fmt.Errorf("%w: %w", api.ErrUnavailable, errConflict)
	}
	return nil
}

func putJSON(key string, v any) meta.Op {
	b, _ := json.Marshal(v)
	return meta.Op{Type: meta.OpPut, Key: key, Value: b}
}

// gangCommitLocked records a new state of a gang in the cache and returns its commit,
// guarded by the version the decision read.
func gangCommitLocked(e *gangEntry, rec api.Gang, what string, extra ...meta.Op) commitFn {
	key := api.TableGangs + rec.Spec.Key()
	cmp := []meta.Compare{{Key: key, Version: e.ver}}
	evs := events.FromGang(&e.rec, rec)
	e.rec = rec
	e.ver++
	return commitFn{what: what, cmp: cmp, ops: append([]meta.Op{putJSON(key, rec)}, extra...), events: evs}
}

// rebuildLocked builds a scheduler over the alive machines, adopts every placed gang, and
// queues every gang that waits; gangs that cannot be adopted (a machine of theirs is gone)
// restart elsewhere. It returns the commits of what changed, including the cycle's
// placements.
func (c *Controller) rebuildLocked(t *term, now time.Time) []commitFn {
	var work []commitFn
	var alive []*machineEntry
	for _, m := range t.machines {
		if m.rec.Alive && m.rec.Spec != nil {
			alive = append(alive, m)
		}
	}
	sort.Slice(alive, func(i, j int) bool {
		if alive[i].rec.Rack != alive[j].rec.Rack {
			return alive[i].rec.Rack < alive[j].rec.Rack
		}
		return alive[i].rec.Name < alive[j].rec.Name
	})
	t.sched, t.topo, t.order, t.index = nil, nil, nil, map[string]int{}
	if len(alive) > 0 {
		insts := make([]topology.MachineInstance, len(alive))
		for i, m := range alive {
			insts[i] = topology.MachineInstance{Name: m.rec.Name, Rack: m.rec.Rack, Spec: m.rec.Spec, Discovered: !m.rec.Simulated}
		}
		tc, err := topology.BuildMachines(insts, topology.NetworkSpec{})
		if err != nil {
			c.log.Error("the registered machines do not form a cluster", zap.Error(err))
		} else {
			snap := topoadapt.Snapshot(tc)
			for i, m := range alive {
				snap.Nodes[i].Unschedulable = c.cordoned[m.rec.Name]
				if m.rec.Simulated { // their restart costs are learnt apart from real cards'
					for g := range snap.Nodes[i].GPUs {
						snap.Nodes[i].GPUs[g].Model += api.SimulatedSuffix
					}
				}
			}
			s, err := gang.New(c.schedulerConfig(t.conf), snap,
				gang.WithCollectiveModel(topoadapt.NewModel(tc, topology.Best)), gang.WithLogger(c.log))
			if err != nil {
				c.log.Error("scheduler core", zap.Error(err))
			} else {
				t.sched, t.topo = s, tc
				for i, m := range alive {
					t.order = append(t.order, m.rec.Name)
					t.index[m.rec.Name] = i
				}
				for name, l := range t.loads {
					if i, ok := t.index[name]; ok {
						_ = s.UpdateLoad(i, gang.Load{CPU: l.Load.CPU, GPU: l.Load.GPU, Mem: l.Load.Mem, Net: l.Load.Net})
					}
				}
			}
		}
	}
	keys := make([]string, 0, len(t.gangs))
	for k := range t.gangs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, key := range keys {
		e := t.gangs[key]
		switch e.rec.State {
		case api.GangStarting, api.GangRunning, api.GangRestarting:
			if err := c.adoptLocked(t, e, now); err != nil {
				work = append(work, c.lostLocked(t, e, err.Error(), now)...)
			}
		case api.GangPending:
			if t.sched != nil {
				req, err := c.coreRequestLocked(t, e.rec.Spec)
				if err == nil {
					_, err = t.sched.Submit(req, now)
				}
				if err != nil && !errors.Is(err, gang.ErrSaturated) {
					work = append(work, c.failLocked(t, e, "can never be placed: "+err.Error(), now))
				}
			}
		}
	}
	return append(work, c.cycleLocked(t, now)...)
}

// adoptLocked tells the scheduler that a placed gang holds its cards (its active members).
func (c *Controller) adoptLocked(t *term, e *gangEntry, now time.Time) error {
	if t.sched == nil || e.rec.Placement == nil {
		return fmt.Errorf("no machine of its placement is alive")
	}
	var members []gang.MemberPlacement
	for _, i := range e.rec.Active() {
		m := e.rec.Placement.Members[i]
		node, ok := t.index[m.Machine]
		if !ok {
			return fmt.Errorf("machine %s of member %d is gone", m.Machine, i)
		}
		members = append(members, gang.MemberPlacement{Node: node, NodeName: m.Machine, GPUs: m.GPUs, Milli: m.Milli, MIG: m.MIG, CPUMilli: m.CPUMilli, MemMiB: m.MemMiB})
	}
	req, err := c.coreRequestLocked(t, e.rec.Spec)
	if err != nil {
		return err
	}
	started := e.rec.Created
	if e.rec.State == api.GangRunning || e.rec.State == api.GangStarting {
		started = e.rec.Updated
	}
	if err := t.sched.Adopt(req, members, started); err != nil {
		return err
	}
	if ck, ok := t.ckpt[e.rec.Spec.Key()]; ok {
		_ = t.sched.Checkpointed(e.rec.Spec.Key(), ck.at)
		_ = t.sched.CheckpointMeasured(e.rec.Spec.Key(), ck.save, ck.bytes)
	}
	return nil
}

// coreMember is the core's view of one member of a gang.
func coreMember(s api.GangSpec) gang.Member {
	milli := s.Resources.GPUMilli
	if s.Resources.GPUs > 0 && milli == 0 {
		milli = gang.Milli
	}
	return gang.Member{GPUs: s.Resources.GPUs, GPUMilli: milli, MIG: s.Resources.MIG, CPUMilli: s.Resources.CPUMilli, MemMiB: s.Resources.MemMiB}
}

// coreRequestLocked is the scheduler core's view of a gang: its priority (from its class),
// queue, size (Min..Max for an elastic gang), preemptibility and what its checkpoints cost.
func (c *Controller) coreRequestLocked(t *term, s api.GangSpec) (gang.Request, error) {
	prio, err := t.conf.Priority(s)
	if err != nil {
		return gang.Request{}, err
	}
	min := s.Workers
	if s.Elastic() {
		min = s.MinWorkers
	}
	queue := s.Queue
	if queue == "" {
		queue = t.conf.DefaultQueue
	}
	req := gang.Request{
		ID: s.Key(), Queue: queue, Priority: prio, Min: min, Max: s.Workers,
		Member:     coreMember(s),
		SameIsland: s.SameIsland, Strategy: gang.Strategy(s.Strategy), AllReduceBytes: s.AllReduceBytes, Duration: time.Duration(s.Duration),
		// Drivers are not preempted: a driver holds no GPUs of a gang's kind.
		NotPreemptible: s.NotPreemptible || s.Driver,
		Checkpoint:     gang.Checkpoint{Interval: time.Duration(s.CheckpointEvery), JustInTime: s.JustInTime},
	}
	if ck, ok := t.ckpt[s.Key()]; ok {
		req.Checkpoint.SizeBytes, req.Checkpoint.Save = ck.bytes, ck.save
		req.Checkpoint.Restore = ck.save // reading back is about as long as writing
	}
	return req, nil
}

// cycleLocked runs a scheduling cycle and turns its decisions into commits: placements,
// stop notices to preemption victims, grows and shrink notices of elastic gangs, and the
// waiting gangs' reasons. It arms a cycle at the scheduler's NextCycle.
func (c *Controller) cycleLocked(t *term, now time.Time) []commitFn {
	if t.sched == nil {
		return nil
	}
	var work []commitFn
	c.resubmitLocked(t, now)
	start := time.Now()
	d := t.sched.Cycle(now)
	c.obs.cycleTook(time.Since(start))
	for _, p := range d.Placements {
		e := t.gangs[p.Gang]
		if e == nil {
			c.log.Error("the scheduler placed a gang the controller does not know", gangField(p.Gang))
			_ = t.sched.Finish(p.Gang, now)
			continue
		}
		rec := e.rec
		c.obs.gangWaited(now.Sub(rec.Updated))
		rec.Placement = c.placementLocked(t, p)
		rec.State, rec.Reason, rec.Updated, rec.World, rec.Notice = api.GangStarting, "", now, nil, nil
		e.ready = map[int]api.Worker{}
		work = append(work, gangCommitLocked(e, rec, "placement of "+p.Gang))
		c.log.Info("gang placed", gangField(p.Gang), zap.Int("generation", rec.Generation), zap.Int("members", len(p.Members)),
			zap.Strings("machines", rec.Placement.Machines), zap.Int("islands", rec.Placement.Islands), zap.Bool("preemptor", p.Preemptor))
	}
	for _, p := range d.Preemptions {
		work = append(work, c.preemptLocked(t, p, now)...)
	}
	for _, r := range d.Resizes {
		work = append(work, c.resizeLocked(t, r, now)...)
	}
	for _, w := range d.Waiting {
		if e := t.gangs[w.Gang]; e != nil && e.rec.State == api.GangPending && e.rec.Reason != w.Reason {
			e.rec.Reason = w.Reason // shown by status; not worth a commit of its own
		}
	}
	c.armCycleLocked(t, d.NextCycle)
	return work
}

// resubmitLocked gives the scheduler the pending gangs of the log it does not hold (one
// refused for saturation when it lost its machine is retried until there is room).
func (c *Controller) resubmitLocked(t *term, now time.Time) {
	for key, e := range t.gangs {
		if e.rec.State != api.GangPending {
			continue
		}
		if _, err := t.sched.GangStatus(key); err == nil {
			continue
		}
		req, err := c.coreRequestLocked(t, e.rec.Spec)
		if err == nil {
			_, err = t.sched.Submit(req, now)
		}
		if err != nil {
			e.rec.Reason = "waiting to be queued: " + err.Error()
		}
	}
}

// armCycleLocked arms a cycle at the scheduler's NextCycle (the earliest one asked for).
func (c *Controller) armCycleLocked(t *term, at time.Time) {
	if at.IsZero() || (!t.cycleAt.IsZero() && !at.Before(t.cycleAt)) {
		return
	}
	if t.cycleTimer != nil {
		t.cycleTimer.Stop()
	}
	t.cycleAt = at
	t.cycleTimer = time.AfterFunc(max(0, at.Sub(c.cfg.Clock())), func() { c.timedCycle(t) })
}

// timedCycle runs the cycle the scheduler asked for.
func (c *Controller) timedCycle(t *term) {
	c.mu.Lock()
	if c.t != t {
		c.mu.Unlock()
		return
	}
	t.cycleAt, t.cycleTimer = time.Time{}, nil
	work := c.cycleLocked(t, c.cfg.Clock())
	if len(work) > 0 {
		c.notifyLocked()
	}
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.runCommits(ctx, t, work); err != nil {
		c.log.Warn("the commits of a timed cycle failed", zap.Error(err))
	}
}

func (c *Controller) placementLocked(t *term, p gang.Placement) *api.Placement {
	out := &api.Placement{Islands: p.Islands, Scores: map[string]float64{}}
	seen := map[string]bool{}
	for _, m := range p.Members {
		name := t.order[m.Node]
		mm := api.Member{Machine: name, GPUs: append([]int(nil), m.GPUs...), Milli: m.Milli, MIG: m.MIG, CPUMilli: m.CPUMilli, MemMiB: m.MemMiB}
		if t.topo != nil {
			tm := t.topo.Machines[m.Node]
			for _, g := range m.GPUs {
				if g >= 0 && g < len(tm.GPUs) {
					mm.UUIDs = append(mm.UUIDs, tm.GPUs[g].UUID)
					mm.Islands = append(mm.Islands, t.topo.IslandOf(tm.GPUs[g].ID))
					mm.GPUModel = tm.GPUs[g].Model
				}
			}
			if me := t.machines[name]; me != nil && me.rec.Simulated && mm.GPUModel != "" {
				mm.GPUModel += api.SimulatedSuffix
			}
		}
		out.Members = append(out.Members, mm)
		if !seen[name] {
			seen[name] = true
			out.Machines = append(out.Machines, name)
		}
	}
	for _, s := range p.Scores {
		out.Scores[s.Plugin] = s.Score
	}
	out.Scores["total"] = p.Total
	out.Scores["allreduce_us"] = float64(p.AllReduce.Microseconds())
	out.Scores["machines_crossed"] = float64(p.Machines)
	out.Scores["racks_crossed"] = float64(p.Racks)
	return out
}
