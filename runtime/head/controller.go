// Package head is the head process's control plane: on the replica that leads the Paxos
// metadata log it runs the gang scheduler core, the jobs' and gangs' state machines, gang
// restarts and the machines' membership, and it serves the cluster's HTTP API (on every
// replica; followers redirect control requests to the leader).
//
// The controller's state is a cache of the log, and everything a decision depends on is
// in the log: each gang's submission sequence, aging inputs and the rest of its scheduling
// record (api.Gang.Sched), the machines' cordons and drains (api.Cordon), the restart
// costs learned per GPU model (api.LearnedCosts, committed in batches), the workload
// learned from submissions, the operator's queues, the leader term. Only load reports and
// heartbeats stay in the leader's memory. When its replica becomes leader the controller
// commits the next term, reads the log's tables and builds the scheduler core from them
// (gang.Restore with each gang's record, the cost model, the learned workload), so that it
// decides exactly as the old leader would have; from then on every change reaches the core
// as a delta (machines joining and leaving: Reshape; cordons: SetUnschedulable; queues:
// Reconfigure; a commit refused: the records it touched are read back and those gangs
// restored), never as a rebuild.
//
// Every decision is committed to the log before it takes effect: agents start and stop
// worker processes only from what the log says, and drivers are answered only after the
// commit. No lock is held across a consensus round: a decision is made under the
// controller's lock and applied to the cache (so that later decisions see the capacity it
// took); its commit is queued in decision order, and one committer per term proposes the
// queue in batches (one transaction for the decisions queued meanwhile), guarded by the
// versions they read.
package head

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
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
	// StartupGrace is the silence allowed a machine whose agent has not reported to this
	// leader at all yet (after a failover, while the agents find it). Default twice
	// HeartbeatTimeout; never under it.
	StartupGrace time.Duration
	// GossipConfirm declares dead a machine that gossip has failed (or left) and whose agent
	// sent no load report for this long: gossip alone never does. Default 3 s; never
	// under one and a half of the report period the leader asks (ReportRate).
	GossipConfirm time.Duration
	// ReportRate is how many load reports a second the leader takes from all machines
	// together: it asks each agent for a report every machines/ReportRate seconds when
	// that is longer than the agent's own period, up to a third of HeartbeatTimeout
	// (Kubernetes' kubelets renew their leases every 10 s at any size; here a small
	// cluster keeps its agents' 1 s and a large one is paced). Default 500; negative:
	// never ask.
	ReportRate float64
	// PauseThreshold: a gap between two sweeps longer than this means the leader itself
	// was paused or starved; every machine then gets a fresh grace period. Default 1 s.
	PauseThreshold time.Duration
	// FlapMemory is how long a machine that gossip had down and that came back keeps its
	// longer GossipConfirm (doubled per comeback). Default 1 min.
	FlapMemory time.Duration
	// KeepEndedGangs is how many ended (stopped or failed) gangs' records the leader
	// keeps; it deletes the oldest beyond them (retention.go). Default
	// DefaultKeepEndedGangs; negative: keep every one.
	KeepEndedGangs int
	// CostFlush bounds how long a learned restart cost waits before it is committed: the
	// measurements of that time go in one commit. Default 1 s.
	CostFlush time.Duration
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
	cfg  ControllerConfig
	rep  *paxos.Replica
	sm   *metaserver.StateMachine
	log  *zap.Logger
	logw logWriter   // writes to the log
	warm *warmTables // the tables a term decodes, kept decoded while this head follows (warm.go)

	mu sync.Mutex
	t  *term
	// inTerm is whether t is set, for Run's loop, which must not wait for mu: a sweep
	// delayed by the controller's lock (registrations by the thousand) read as the
	// leader's own pause, and every machine got a fresh grace period, again and again.
	inTerm atomic.Bool
	// schedLat is the Go scheduler's run waits since the last sweep (schedlat.go).
	schedLat schedLatency
	// liveMu guards live, the machines' load reports and liveness evidence (live.go); taken
	// after mu, never before it.
	liveMu   sync.Mutex
	live     *liveView
	watchers []chan struct{} // told on every change (tests, status)

	membership    func() map[string]bool  // machines gossip knows dead; nil without membership
	poolStatus    func() *api.PoolsStatus // the pools runner's status; nil without pools
	poolInterrupt func(machine string, after time.Duration) error

	obs *ctlObs     // metrics, the event log's sequence, jobs' progress reports (observe.go)
	svc serviceBook // the services' load reports (services.go)

	poke    chan struct{} // asks Run for a sweep now (gossip news)
	declare chan struct{} // asks declareLoop to act on the sweep's verdicts (live.go)
	stop    chan struct{}
	done    chan struct{}
}

// term is the controller's state while its replica leads, by concern: the machines
// (fleet), the jobs and gangs (ledger), the scheduler core and what feeds it (core), the
// learned restart costs waiting for their commit (costs) and the commit queue (commits,
// commit.go). The Controller's methods decide under its lock and orchestrate; each
// concern's own bookkeeping is a method of its type.
type term struct {
	id      int64 // the leader term it committed (api.ControlTerm)
	termVer int64 // the version of the term record it read
	log     *zap.Logger
	obs     *ctlObs
	fleet
	ledger
	core
	costs
	commits
}

// fleet is what the leader knows of the machines: their records, cordons, load reports and
// liveness evidence, and the scheduler's view of them (its node order and topology).
type fleet struct {
	machines map[string]*machineEntry
	cordons  map[string]*api.Cordon
	topo     *topology.Cluster
	order    []string       // scheduler node index -> machine name
	index    map[string]int // machine name -> scheduler node index
	specs    []string       // scheduler node index -> the machine spec it was built from (JSON)
	// membersDirty: machines registered since the scheduler last took them (membershipSoonLocked);
	// membersTimer takes them if no cycle comes first.
	membersDirty bool
	membersTimer *time.Timer
}

// ledger is the jobs and gangs of the log, their newest checkpoints, the submission
// sequence and the gangs' timers (restarts, notice deadlines).
type ledger struct {
	jobs  map[string]*jobEntry
	gangs map[string]*gangEntry
	// ckpt is the gangs' newest checkpoints, by gang key (from their manifests in the log).
	ckpt map[string]ckptInfo
	// seq is the highest gang submission sequence given out.
	seq    int64
	timers map[string]*time.Timer
	// workers counts the live gangs' workers (bounds.go).
	workers workerCount
	// endedGangs is the ended gangs, oldest first, for their retention (retention.go).
	endedGangs endedGangs
}

// core is the scheduler core, the operator's configuration it runs under and its next
// timed cycle.
type core struct {
	sched *gang.Scheduler
	// conf is the operator's scheduler configuration (queues, priority classes), from the
	// log (confVer its version, 0 when none was ever set).
	conf    api.SchedulerConfig
	confVer int64
	// cycleAt is when a cycle is armed (cycleTimer), for the scheduler's NextCycle.
	cycleAt    time.Time
	cycleTimer *time.Timer
}

// costs are the GPU models whose learned costs changed since they were last committed;
// costsTimer commits them.
type costs struct {
	costsDirty map[string]bool
	costsTimer *time.Timer
}

// commits is the commit queue (commit.go): decisions in the order they were made, and the
// committer's wake-up and end.
type commits struct {
	queue []*queuedWork
	kick  chan struct{}
	ended chan struct{}
}

// ckptInfo is a gang's newest checkpoint.
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
	if cfg.KeepEndedGangs == 0 {
		cfg.KeepEndedGangs = DefaultKeepEndedGangs
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.HeartbeatTimeout == 0 {
		cfg.HeartbeatTimeout = 10 * time.Second
	}
	if cfg.StartupGrace == 0 {
		cfg.StartupGrace = 2 * cfg.HeartbeatTimeout
	}
	if cfg.GossipConfirm == 0 {
		cfg.GossipConfirm = min(3*time.Second, cfg.HeartbeatTimeout)
	}
	if cfg.PauseThreshold == 0 {
		cfg.PauseThreshold = max(time.Second, 5*cfg.Poll)
	}
	if cfg.ReportRate == 0 {
		cfg.ReportRate = DefaultReportRate
	}
	if cfg.FlapMemory == 0 {
		cfg.FlapMemory = time.Minute
	}
	if cfg.CostFlush == 0 {
		cfg.CostFlush = time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	obs := newCtlObs()
	return &Controller{cfg: cfg, rep: rep, sm: sm, log: cfg.Logger.Named("controller"), logw: logWriter{rep: rep, obs: obs}, warm: newWarmTables(sm),
		stop: make(chan struct{}), done: make(chan struct{}), poke: make(chan struct{}, 1), declare: make(chan struct{}, 1), obs: obs}
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
	declared := make(chan struct{})
	go func() { defer close(declared); c.declareLoop() }()
	defer func() { <-declared }()
	svcDone := make(chan struct{})
	go func() { defer close(svcDone); c.serviceLoop() }()
	defer func() { <-svcDone }()
	warmDone := make(chan struct{})
	go func() { defer close(warmDone); c.warmLoop() }()
	defer func() { <-warmDone }()
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
		have := c.inTerm.Load()
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

// Term returns the leader term of the controller's term, or 0 when it does not lead.
func (c *Controller) Term() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.t == nil {
		return 0
	}
	return c.t.id
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
	t := c.t
	if t == nil {
		return
	}
	for _, tm := range t.timers {
		tm.Stop()
	}
	if t.cycleTimer != nil {
		t.cycleTimer.Stop()
	}
	if t.costsTimer != nil {
		t.costsTimer.Stop()
	}
	if t.membersTimer != nil {
		t.membersTimer.Stop()
	}
	close(t.ended)
	c.setLive(nil)
	c.log.Info("control plane term ends", zap.Int64("term", t.id), zap.String("why", why))
	c.t = nil
	c.inTerm.Store(false)
	c.notifyLocked()
}

// notLeader is the error of a call to a replica that does not lead.
func (c *Controller) notLeader() error {
	if err := c.rep.Err(); err != nil {
		return fmt.Errorf("%w: this head cannot write its log, it takes no part until it can (%v)", api.ErrUnavailable, err)
	}
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

// buildTerm takes office: it reads the log's tables, commits the next leader term, and
// builds the scheduler core from the records (the one full build of a term).
func (c *Controller) buildTerm() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	began := time.Now()
	now := c.cfg.Clock()
	t := &term{
		log: c.log, obs: c.obs,
		fleet:   fleet{machines: map[string]*machineEntry{}, cordons: map[string]*api.Cordon{}, index: map[string]int{}},
		ledger:  ledger{jobs: map[string]*jobEntry{}, gangs: map[string]*gangEntry{}, timers: map[string]*time.Timer{}, ckpt: map[string]ckptInfo{}},
		costs:   costs{costsDirty: map[string]bool{}},
		commits: commits{kick: make(chan struct{}, 1), ended: make(chan struct{})},
	}
	// The term first: a head takes office by committing the next leader term, before it
	// reads the tables it decides from (a head that believed it led and decided meanwhile
	// had its decisions ordered before it, or refused). Its commit is also the read
	// barrier: the state machine applies entries in order, so once the term's entry is
	// applied every entry chosen before it is too. The term record is read from this
	// replica's state machine, which may not have applied the previous leader's last
	// entries yet; the commit's version guard then refuses it, and the head reads the log
	// (a read-index round) and tries once more. A read before every commit costs a round
	// between the replicas on a quiet log; after a leader's death the term's commit waits
	// instead for the predecessor's last slots to be recovered, as the read did (at 1,000
	// machines `commit_term` then took about what `read` and `commit_term` took together).
	var readAt time.Time
	for attempt := 0; ; attempt++ {
		var prev api.ControlTerm
		var termVer int64
		if kv, ok := c.sm.Get(api.TermKey); ok {
			if err := json.Unmarshal(kv.Value, &prev); err != nil {
				return fmt.Errorf("head: %s: %w", api.TermKey, err)
			}
			termVer = kv.Version
		}
		t.id = prev.Term + 1
		if hook := termCommitHook.Load(); hook != nil && attempt == 0 {
			(*hook)(c)
		}
		err := c.logw.commit(ctx, []meta.Compare{{Key: api.TermKey, Version: termVer}},
			[]meta.Op{putJSON(api.TermKey, api.ControlTerm{Term: t.id, Leader: c.rep.Status().ID, Since: now})})
		if err == nil {
			t.termVer = termVer + 1
			break
		}
		if attempt > 0 || !errors.Is(err, errConflict) {
			return fmt.Errorf("head: commit leader term %d: %w", t.id, err)
		}
		c.log.Info("the leader term record changed under this head's view: reading the log before taking office", zap.Int64("term", t.id))
		if err := c.rep.Read(ctx); err != nil { // the state machine has applied every chosen entry
			return fmt.Errorf("head: read the log as the new leader: %w", err)
		}
		readAt = time.Now()
	}
	termAt := time.Now()
	if readAt.IsZero() {
		readAt = began
	}
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
	// The tables, from what this head decoded while it followed where a record has not
	// changed since (warm.go), decoded now where it has.
	tabs, err := c.warm.take()
	if err != nil {
		return err
	}
	c.obs.termRecords.WithLabelValues("warm").Add(float64(tabs.warm))
	c.obs.termRecords.WithLabelValues("decoded").Add(float64(tabs.decoded))
	for i, m := range tabs.machines {
		t.machines[m.Name] = &machineEntry{rec: m, ver: tabs.mkvs[i].Version}
	}
	for _, kv := range c.sm.Range(api.CordonsPrefix) {
		var cd api.Cordon
		if err := json.Unmarshal(kv.Value, &cd); err != nil {
			return fmt.Errorf("head: cordon %s: %w", kv.Key, err)
		}
		t.cordons[strings.TrimPrefix(kv.Key, api.CordonsPrefix)] = &cd
	}
	for _, kv := range c.sm.Range(api.TableJobs) {
		var j api.Job
		if err := json.Unmarshal(kv.Value, &j); err != nil {
			return fmt.Errorf("head: job %s: %w", kv.Key, err)
		}
		t.jobs[j.Name] = &jobEntry{rec: j, ver: kv.Version}
	}
	for i, g := range tabs.gangs {
		t.putGang(g.Spec.Key(), &gangEntry{rec: g, ver: tabs.gkvs[i].Version, ready: map[int]api.Worker{}})
	}
	t.endedGangs.sortByEnd()
	for _, w := range tabs.workers {
		if e := t.gangs[w.Job+"/"+w.Gang]; e != nil && e.rec.Generation == w.Generation && w.GangUID == e.rec.UID {
			e.ready[w.Rank] = w
		}
	}
	for _, kv := range c.sm.Range(api.TableCheckpoints) {
		var cp api.Checkpoint
		if json.Unmarshal(kv.Value, &cp) != nil {
			continue
		}
		key := cp.Job + "/" + cp.Gang
		if old, ok := t.ckpt[key]; !ok || cp.Step >= old.step {
			t.ckpt[key] = ckptInfo{at: cp.Time, step: cp.Step, bytes: cp.Bytes, save: time.Duration(cp.Save)}
		}
	}
	t.assignSeqs()
	prune := c.obs.events.Resume(c.sm.Range(api.TableEvents)) // continue the event log's sequence
	loadAt := time.Now()
	c.mu.Lock()
	if c.t != nil || c.rep.Status().Role != paxos.Leader {
		c.mu.Unlock()
		return nil
	}
	c.t = t
	c.inTerm.Store(true)
	go c.commitLoop(t)
	var dead map[string]bool
	if c.membership != nil {
		dead = c.membership()
	}
	var work []commitFn
	if len(prune) > 0 {
		work = append(work, commitFn{what: "the event log's bound", ops: prune})
	}
	work = append(work, c.buildCoreLocked(t, now)...)
	// A new leader has heard no machine yet: each gets a grace period from now. Machines
	// that gossip had failed when this head became leader are dead once their silence
	// confirms it (detect.go).
	live := newLiveView(c.newDetector(now))
	for name, m := range t.machines {
		if m.rec.Alive {
			live.inc[name] = m.rec.Incarnation
			if dead[name] {
				live.detect.gossip(name, "failed", now)
			}
		}
	}
	c.setLive(live)
	work = append(work, c.cycleLocked(t, now)...)
	// Where a takeover's time goes, phase by phase: the read barrier, the term's commit,
	// decoding the tables, building the core and the first cycle.
	c.log.Info("control plane term starts", zap.Int64("term", t.id), zap.Int("machines", len(t.machines)),
		zap.Int("jobs", len(t.jobs)), zap.Int("gangs", len(t.gangs)), zap.Int("cordons", len(t.cordons)),
		zap.Duration("read", readAt.Sub(began)), zap.Duration("commit_term", termAt.Sub(readAt)),
		zap.Duration("load", loadAt.Sub(termAt)), zap.Duration("build", time.Since(loadAt)),
		zap.Int("decoded", tabs.decoded), zap.Int("warm", tabs.warm))
	ch := c.enqueueLocked(t, work)
	c.notifyLocked()
	c.mu.Unlock()
	if err := await(ctx, ch); err != nil {
		return fmt.Errorf("head: commit the new term's first decisions (%d): %w", len(work), err)
	}
	return nil
}

// termCommitHook, when set (by tests), runs as a new leader is about to commit its term,
// on its first attempt.
var termCommitHook atomic.Pointer[func(*Controller)]

// decodeAll decodes the JSON records of a table (what names one record, in errors) on
// several goroutines. A new leader decodes every record at once while every agent
// reconnects to it: at 1,000 machines its `load` step (13,701 gangs and 10,000 workers
// read and decoded) took 1.6 s on one goroutine among hundreds of runnable ones; on a head
// with cores of its own the decoding divides by them.
func decodeAll[T any](kvs []meta.KeyValue, what string) ([]T, error) {
	out := make([]T, len(kvs))
	const per = 512 // records per goroutine at least
	n := min(runtime.GOMAXPROCS(0)*4, (len(kvs)+per-1)/per)
	errs := make([]error, max(n, 1))
	decode := func(part, lo, hi int) {
		for i := lo; i < hi; i++ {
			if err := json.Unmarshal(kvs[i].Value, &out[i]); err != nil {
				errs[part] = fmt.Errorf("head: %s %s: %w", what, kvs[i].Key, err)
				return
			}
		}
	}
	if n <= 1 {
		decode(0, 0, len(kvs))
	} else {
		var wg sync.WaitGroup
		size := (len(kvs) + n - 1) / n
		for part := range n {
			lo, hi := part*size, min((part+1)*size, len(kvs))
			wg.Go(func() { decode(part, lo, hi) })
		}
		wg.Wait()
	}
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// assignSeqs gives the gangs of a log written before submission sequences existed one,
// in the order they were admitted (then by key), after every sequence already given: the
// same on every leader that reads the same log.
func (l *ledger) assignSeqs() {
	var legacy []*gangEntry
	for _, e := range l.gangs {
		if e.rec.Sched != nil && e.rec.Sched.Seq > 0 {
			l.seq = max(l.seq, e.rec.Sched.Seq)
		} else {
			legacy = append(legacy, e)
		}
	}
	sort.Slice(legacy, func(i, j int) bool {
		a, b := legacy[i].rec, legacy[j].rec
		if !a.Created.Equal(b.Created) {
			return a.Created.Before(b.Created)
		}
		return a.Spec.Key() < b.Spec.Key()
	})
	for _, e := range legacy {
		l.seq++
		s := api.GangSched{Seq: l.seq, Queued: e.rec.Updated}
		if e.rec.Sched != nil {
			s = *e.rec.Sched
			s.Seq = l.seq
		}
		e.rec.Sched = &s
	}
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

var errConflict = errors.New("head: a record changed under the decision")

func putJSON(key string, v any) meta.Op {
	b, _ := json.Marshal(v)
	return meta.Op{Type: meta.OpPut, Key: key, Value: b}
}

// gangCommit records a new state of a gang in the cache and returns its commit,
// guarded by the version the decision read. The record carries the scheduler's record of
// the gang as it stands now (its sequence, aging inputs, attained service...).
func (t *term) gangCommit(e *gangEntry, rec api.Gang, what string, extra ...meta.Op) commitFn {
	key := api.TableGangs + rec.Spec.Key()
	cmp := []meta.Compare{{Key: key, Version: e.ver}}
	rec.Sched = t.schedRecord(rec.Spec.Key(), rec.Sched)
	evs := events.FromGang(&e.rec, rec)
	t.setRec(e, rec)
	e.ver++
	return commitFn{what: what, cmp: cmp, ops: append([]meta.Op{putJSON(key, rec)}, extra...), events: evs}
}

// schedRecord is the core's record of a gang in the log's terms, or old when the
// core does not hold the gang (it ended, or no machine is there yet).
func (t *term) schedRecord(key string, old *api.GangSched) *api.GangSched {
	if t.sched == nil {
		return old
	}
	r, err := t.sched.Record(key)
	if err != nil {
		return old
	}
	s := &api.GangSched{Seq: int64(r.Seq), Queued: r.Queued, Started: r.Started, Attained: r.Attained, AttainedAt: r.AttainedAt,
		Progress: api.Duration(r.Progress), Evictions: r.Evictions, LastEvicted: r.LastEvicted, Resizes: r.Resizes, LastResized: r.LastResized,
		Stopping: r.Stopping, KeptUntil: r.KeptUntil, ShrinkTo: r.ShrinkTo, ShrinkIndex: r.ShrinkIndex, FitSince: r.FitSince}
	if r.Hold != nil {
		s.Hold = &api.GangHold{Start: r.Hold.Start, SkipPermit: r.Hold.SkipPermit, Machines: []string{}}
		for _, n := range r.Hold.Nodes {
			if n >= 0 && n < len(t.order) {
				s.Hold.Machines = append(s.Hold.Machines, t.order[n])
			}
		}
	}
	return s
}

// coreRecord is the core's record of a gang from its log record.
func (t *term) coreRecord(rec api.Gang) gang.Record {
	r := gang.Record{Submitted: rec.Created, Queued: rec.Updated}
	s := rec.Sched
	if s == nil {
		return r
	}
	r.Seq = int(s.Seq)
	if !s.Queued.IsZero() {
		r.Queued = s.Queued
	}
	r.Started, r.Attained, r.AttainedAt, r.Progress = s.Started, s.Attained, s.AttainedAt, time.Duration(s.Progress)
	r.Evictions, r.LastEvicted, r.Resizes, r.LastResized = s.Evictions, s.LastEvicted, s.Resizes, s.LastResized
	r.Stopping, r.KeptUntil, r.ShrinkTo, r.ShrinkIndex, r.FitSince = s.Stopping, s.KeptUntil, s.ShrinkTo, s.ShrinkIndex, s.FitSince
	if h := s.Hold; h != nil {
		r.Hold = &gang.Hold{Start: h.Start, SkipPermit: h.SkipPermit}
		for _, m := range h.Machines {
			if i, ok := t.index[m]; ok {
				r.Hold.Nodes = append(r.Hold.Nodes, i)
			}
		}
	}
	return r
}

// desired lists the machines the scheduler schedules on: the alive ones with a
// topology, by rack then name.
func (f *fleet) desired() []*machineEntry {
	var alive []*machineEntry
	for _, m := range f.machines {
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
	return alive
}

// snapshot builds the topology of machines and the scheduler's snapshot of it
// (cordons applied, simulated cards apart), with each machine's spec as built.
func (f *fleet) snapshot(ms []*machineEntry) (*topology.Cluster, gang.Snapshot, []string, error) {
	if len(ms) == 0 {
		return nil, gang.Snapshot{}, nil, nil
	}
	insts := make([]topology.MachineInstance, len(ms))
	specs := make([]string, len(ms))
	for i, m := range ms {
		insts[i] = topology.MachineInstance{Name: m.rec.Name, Rack: m.rec.Rack, Spec: m.rec.Spec, Discovered: !m.rec.Simulated}
		b, _ := json.Marshal(struct {
			Spec      *topology.MachineSpec
			Rack      int
			Simulated bool
		}{m.rec.Spec, m.rec.Rack, m.rec.Simulated})
		specs[i] = string(b)
	}
	tc, err := topology.BuildMachines(insts, topology.NetworkSpec{})
	if err != nil {
		return nil, gang.Snapshot{}, nil, err
	}
	snap := topoadapt.Snapshot(tc)
	for i, m := range ms {
		snap.Nodes[i].Unschedulable = f.cordons[m.rec.Name] != nil
		if m.rec.Simulated { // their restart costs are learnt apart from real cards'
			for g := range snap.Nodes[i].GPUs {
				snap.Nodes[i].GPUs[g].Model += api.SimulatedSuffix
			}
		}
	}
	return tc, snap, specs, nil
}

// buildCoreLocked builds the scheduler core from the records: over the alive machines,
// with the learned costs and workload, every gang restored with its record (placed gangs
// on their cards, the others in their queues). It runs when a term starts, and when the
// first machine of a term registers; afterwards the core only takes deltas. Gangs that
// cannot be restored on their machines wait to be placed elsewhere.
func (c *Controller) buildCoreLocked(t *term, now time.Time) []commitFn {
	t.sched, t.topo, t.order, t.index, t.specs = nil, nil, nil, map[string]int{}, nil
	ms := t.desired()
	if len(ms) == 0 {
		return nil
	}
	tc, snap, specs, err := t.snapshot(ms)
	if err != nil {
		c.log.Error("the registered machines do not form a cluster", zap.Error(err))
		return nil
	}
	costs := gang.DefaultCostModel()
	for _, kv := range c.sm.Range(api.CostsPrefix) {
		var lc api.LearnedCosts
		if json.Unmarshal(kv.Value, &lc) != nil {
			continue
		}
		for kind, l := range lc.Kinds {
			k, err := costKind(kind)
			if err == nil {
				err = costs.SetLearned(gang.LearnedCost{Model: lc.GPUModel, Kind: k, Factor: l.Factor, Count: l.Count})
			}
			if err != nil {
				c.log.Warn("a learned cost in the log is not valid; its default stands", zap.String("key", kv.Key), zap.Error(err))
			}
		}
	}
	s, err := gang.New(c.schedulerConfig(t.conf), snap, gang.WithCostModel(costs),
		gang.WithCollectiveModel(topoadapt.NewModel(tc, topology.Best)), gang.WithLogger(c.log))
	if err != nil {
		c.log.Error("scheduler core", zap.Error(err))
		return nil
	}
	if kv, ok := c.sm.Get(api.WorkloadKey); ok {
		var w gang.LearnedWorkload
		if err := json.Unmarshal(kv.Value, &w); err == nil {
			s.SetLearnedWorkload(w)
		}
	}
	if kv, ok := c.sm.Get(api.RuntimesKey); ok {
		var r gang.LearnedRuntimes
		if err := json.Unmarshal(kv.Value, &r); err == nil {
			s.SetLearnedRuntimes(r)
		}
	}
	s.AfterSeq(int(t.seq))
	t.sched, t.topo, t.specs = s, tc, specs
	for i, m := range ms {
		t.order = append(t.order, m.rec.Name)
		t.index[m.rec.Name] = i
	}
	for name, l := range c.liveLoads() {
		if i, ok := t.index[name]; ok {
			_ = s.UpdateLoad(i, gang.Load{CPU: l.Load.CPU, GPU: l.Load.GPU, Mem: l.Load.Mem, Net: l.Load.Net})
		}
	}
	keys := make([]string, 0, len(t.gangs))
	for k := range t.gangs {
		keys = append(keys, k)
	}
	sort.Strings(keys) // any order: the records say the queue order
	var work []commitFn
	for _, key := range keys {
		work = append(work, c.loadGangLocked(t, t.gangs[key], now)...)
	}
	return work
}

// loadGangLocked gives the core a gang of the log, with its record: a placed gang on its
// cards (one that lost them waits to be placed elsewhere), a waiting one in its queue; it
// arms its restart and notice timers.
func (c *Controller) loadGangLocked(t *term, e *gangEntry, now time.Time) []commitFn {
	var work []commitFn
	switch e.rec.State {
	case api.GangStarting, api.GangRunning, api.GangRestarting:
		if t.sched != nil { // without machines it is adopted, or moved, when they register
			if err := t.adopt(e); err != nil {
				return append(work, t.lost(e, err.Error(), now)...)
			}
		}
		// Restarts that were waiting for their backoff, notices that were running.
		if e.rec.State == api.GangRestarting {
			c.armRestartLocked(t, e.rec.Spec.Key(), e.rec.Generation, e.rec.RestartAt)
		}
		if e.rec.Notice != nil {
			c.armNoticeLocked(t, e)
		}
	case api.GangPending:
		if t.sched == nil {
			break
		}
		if err := t.restorePending(e); err != nil {
			work = append(work, t.fail(e, "can never be placed: "+err.Error(), now))
		}
	}
	return work
}

// restorePending queues a waiting gang of the log in the core, with its record.
func (t *term) restorePending(e *gangEntry) error {
	req, err := t.coreRequest(e.rec.Spec)
	if err != nil {
		return err
	}
	if err := t.sched.Restore(req, t.coreRecord(e.rec), nil); err != nil {
		return err
	}
	t.checkpointToCore(e.rec.Spec.Key())
	return nil
}

// adopt tells the scheduler that a placed gang holds its cards (its active members).
func (t *term) adopt(e *gangEntry) error {
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
	req, err := t.coreRequest(e.rec.Spec)
	if err != nil {
		return err
	}
	rec := t.coreRecord(e.rec)
	if rec.Started.IsZero() { // a record of an older log
		rec.Started = e.rec.Created
		if e.rec.State == api.GangRunning || e.rec.State == api.GangStarting {
			rec.Started = e.rec.Updated
		}
	}
	if err := t.sched.Restore(req, rec, members); err != nil {
		return err
	}
	t.checkpointToCore(e.rec.Spec.Key())
	return nil
}

// checkpointToCore tells the core of a gang's newest checkpoint.
func (t *term) checkpointToCore(key string) {
	if ck, ok := t.ckpt[key]; ok && t.sched != nil {
		_ = t.sched.Checkpointed(key, ck.at)
		_ = t.sched.CheckpointMeasured(key, ck.save, ck.bytes)
	}
}

// coreMember is the core's view of one member of a gang.
func coreMember(s api.GangSpec) gang.Member {
	milli := s.Resources.GPUMilli
	if s.Resources.GPUs > 0 && milli == 0 {
		milli = gang.Milli
	}
	// Every member is a process: it counts at least a minimal CPU share, so that members
	// asking for nothing are still bounded by the machines' cores.
	cpu := max(s.Resources.CPUMilli, MinMemberCPUMilli)
	return gang.Member{GPUs: s.Resources.GPUs, GPUMilli: milli, MIG: s.Resources.MIG, CPUMilli: cpu, MemMiB: s.Resources.MemMiB}
}

// coreRequest is the scheduler core's view of a gang: its priority (from its class),
// queue, size (Min..Max for an elastic gang), preemptibility and what its checkpoints cost.
func (t *term) coreRequest(s api.GangSpec) (gang.Request, error) {
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
		SameIsland: s.SameIsland, Strategy: gang.Strategy(s.Strategy), Machines: s.Machines, AllReduceBytes: s.AllReduceBytes,
		Duration: time.Duration(s.Duration), TimeLimit: time.Duration(s.TimeLimit),
		// Drivers are not preempted: a driver holds no GPUs of a gang's kind.
		NotPreemptible: s.NotPreemptible || s.Driver,
		Checkpoint: gang.Checkpoint{Interval: time.Duration(s.CheckpointEvery), JustInTime: s.JustInTime,
			Save: time.Duration(s.CheckpointSave), Restore: time.Duration(s.CheckpointRestore)},
	}
	if ck, ok := t.ckpt[s.Key()]; ok {
		req.Checkpoint.SizeBytes = ck.bytes
		if ck.save > 0 || s.CheckpointSave <= 0 {
			req.Checkpoint.Save = ck.save // measured beats declared
		}
		if s.CheckpointRestore <= 0 {
			req.Checkpoint.Restore = req.Checkpoint.Save // reading back is about as long as writing
		}
	}
	return req, nil
}

// cycleLocked runs a scheduling cycle and turns its decisions into commits: placements,
// stop notices to preemption victims (and the holds of the gangs they make room for),
// grows and shrink notices of elastic gangs, and the waiting gangs' reasons. It arms a
// cycle at the scheduler's NextCycle.
func (c *Controller) cycleLocked(t *term, now time.Time) []commitFn {
	var work []commitFn
	if t.membersDirty {
		work = c.membershipLocked(t, now) // machines registered since the last cycle
	}
	if t.sched == nil {
		return work
	}
	c.takeLoadsLocked(t)
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
		rec.Placement = t.placement(p)
		rec.State, rec.Reason, rec.Updated, rec.World, rec.Notice = api.GangStarting, "", now, nil, nil
		e.ready = map[int]api.Worker{}
		work = append(work, t.gangCommit(e, rec, "placement of "+p.Gang))
		c.log.Info("gang placed", gangField(p.Gang), zap.Int("generation", rec.Generation), zap.Int("members", len(p.Members)),
			zap.Strings("machines", rec.Placement.Machines), zap.Int("islands", rec.Placement.Islands), zap.Bool("preemptor", p.Preemptor))
	}
	held := map[string]bool{}
	for _, p := range d.Preemptions {
		work = append(work, c.preemptLocked(t, p, now)...)
		held[p.For] = true
	}
	for _, r := range d.Resizes {
		work = append(work, c.resizeLocked(t, r, now)...)
		if r.For != "" {
			held[r.For] = true
		}
	}
	for _, w := range d.Waiting {
		if e := t.gangs[w.Gang]; e != nil && e.rec.State == api.GangPending && e.rec.Reason != w.Reason {
			e.rec.Reason = w.Reason // shown by status; not worth a commit of its own
		}
	}
	// A gang that victims make room for holds the machines they free: part of the log,
	// so that a new leader does not choose other victims for it.
	keys := make([]string, 0, len(held))
	for k := range held {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if e := t.gangs[k]; e != nil && e.rec.State == api.GangPending {
			work = append(work, t.gangCommit(e, e.rec, "hold of "+k))
		}
	}
	c.armCycleLocked(t, d.NextCycle)
	return work
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
	ch := c.enqueueLocked(t, work)
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := await(ctx, ch); err != nil {
		c.log.Warn("the commits of a timed cycle failed", zap.Error(err))
	}
}

func (f *fleet) placement(p gang.Placement) *api.Placement {
	out := &api.Placement{Islands: p.Islands, Scores: map[string]float64{}}
	seen := map[string]bool{}
	for _, m := range p.Members {
		name := f.order[m.Node]
		mm := api.Member{Machine: name, GPUs: append([]int(nil), m.GPUs...), Milli: m.Milli, MIG: m.MIG, CPUMilli: m.CPUMilli, MemMiB: m.MemMiB}
		if f.topo != nil {
			tm := f.topo.Machines[m.Node]
			for _, g := range m.GPUs {
				if g >= 0 && g < len(tm.GPUs) {
					mm.UUIDs = append(mm.UUIDs, tm.GPUs[g].UUID)
					mm.Islands = append(mm.Islands, f.topo.IslandOf(tm.GPUs[g].ID))
					mm.GPUModel = tm.GPUs[g].Model
				}
			}
			if me := f.machines[name]; me != nil && me.rec.Simulated && mm.GPUModel != "" {
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

// costKind is the core's kind of a cost report's.
func costKind(kind string) (gang.CostKind, error) {
	switch kind {
	case "cuda_context":
		return gang.CostCUDAContext, nil
	case "communicator":
		return gang.CostCommunicator, nil
	}
	return 0, fmt.Errorf("%w: cost kind %q: want cuda_context or communicator", api.ErrInvalid, kind)
}

// costsKeyOf is the key of a GPU model's learned costs.
func costsKeyOf(model string) string { return api.CostsPrefix + api.CostsKey(model) }

// modelOfCostsKey is the GPU model of a learned costs key.
func modelOfCostsKey(key string) string {
	m, err := url.PathUnescape(strings.TrimPrefix(key, api.CostsPrefix))
	if err != nil {
		return ""
	}
	return m
}
