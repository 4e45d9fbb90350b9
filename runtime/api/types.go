// Package api holds what Atoll's processes say to each other through the heads: the records
// the metadata log keeps for machines, jobs, gangs and workers, the head's HTTP API, and
// the client every other process (agents, workers, drivers, the CLI) uses to reach it.
//
// Every record lives under one metadata table (a key prefix of store/meta):
//
//	nodes/<machine>                 Machine     written by the leader when an agent registers
//	jobs/<job>                      Job         written by the leader on submission and stop
//	gangs/<job>/<gang>              Gang        the gang's spec, state, generation and placement,
//	                                            one record, so a gang and its placement commit
//	                                            atomically
//	actors/<job>/<gang>/<rank>      Worker      where a gang member runs (its actor system's
//	                                            address), written when the worker is ready
//	checkpoints/<job>/<gang>/<step> Checkpoint  a complete checkpoint's manifest
//	objects/<id>                    (object)    the object directory (store/object)
//	binaries/<sha256>               Binary      a job's executable, stored by content hash
//	events/<seq>                    Event       the control plane's decisions, bounded (the
//	                                            leader commits each with its decision)
//	owners/<owner>                  Owner       a driver process that owns objects, renewed
//	                                            while it runs
//
// Agents and drivers watch these tables (GET /v1/watch); only the leader head writes the
// first four, so its decisions are committed before anyone acts on them.
package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/atoll-run/atoll/runtime/authz"
	"github.com/atoll-run/atoll/store/meta"
	"github.com/atoll-run/atoll/topology"
)

// Tables, as store/meta names them.
const (
	TableMachines    = string(meta.TableNodes)
	TableJobs        = string(meta.TableJobs)
	TableGangs       = string(meta.TableGangs)
	TableWorkers     = string(meta.TableActors)
	TableCheckpoints = string(meta.TableCheckpoints)
	TableObjects     = string(meta.TableObjects)
	TableBinaries    = string(meta.TableBinaries)
	TableEvents      = string(meta.TableEvents)
	TableConfig      = string(meta.TableConfig)
	TableOwners      = string(meta.TableOwners)
	TableControl     = string(meta.TableControl)
	TableAuth        = string(meta.TableAuth)
	// SchedulerConfigKey is the key of the SchedulerConfig record.
	SchedulerConfigKey = TableConfig + "scheduler"
	// TermKey is the key of the ControlTerm record: the leader term, counted in the log.
	TermKey = TableControl + "term"
	// CordonsPrefix prefixes the machines' Cordon records (CordonsPrefix + machine name).
	CordonsPrefix = TableControl + "cordons/"
	// CostsPrefix prefixes the LearnedCosts records (CostsPrefix + CostsKey(GPU model)).
	CostsPrefix = TableControl + "costs/"
	// WorkloadKey is the key of the workload the scheduler learned from submissions.
	WorkloadKey = TableControl + "workload"
	// RuntimesKey is the key of the run times the scheduler learned from gangs that ended
	// (gang.LearnedRuntimes), committed with each end that taught it something.
	RuntimesKey = TableControl + "runtimes"
)

// Errors of the API. They cross HTTP as status codes and error kinds, so errors.Is works
// on the client's side.
var (
	// ErrInvalid: a malformed request (bad name, negative size...).
	ErrInvalid = errors.New("api: invalid request")
	// ErrNeverFits: a gang that no state of the cluster could ever place.
	ErrNeverFits = errors.New("api: gang can never fit on this cluster")
	// ErrNoCapacity: a gang that does not fit now.
	ErrNoCapacity = errors.New("api: not enough free capacity now")
	// ErrTooLarge: a request body over the limit of the process that reads it (HTTP 413,
	// the limit named in the message); nothing past the limit was read.
	ErrTooLarge = errors.New("api: request body too large")
	// ErrSaturated: the cluster's queue is full (past its bound of pending gangs); the
	// submission may be retried later (RetryAfter). Nothing queued was dropped.
	ErrSaturated = errors.New("api: cluster saturated")
	// ErrNotFound: no such job, gang, machine or worker.
	ErrNotFound = errors.New("api: not found")
	// ErrExists: a job or gang of that name already exists.
	ErrExists = errors.New("api: already exists")
	// ErrStale: a worker of a generation that has ended.
	ErrStale = errors.New("api: stale generation")
	// ErrUnavailable: no head answered as leader in time (retryable).
	ErrUnavailable = errors.New("api: no leader head available")
	// ErrUnauthenticated: the cluster refused our credentials.
	ErrUnauthenticated = errors.New("api: not authenticated")
	// ErrForbidden: our credentials do not allow this (HTTP 403): the answer names the
	// role and the action (runtime/authz's table).
	ErrForbidden = authz.ErrForbidden
)

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// CheckName validates a job, gang or machine name: 1 to 63 characters of [A-Za-z0-9._-],
// starting with a letter or digit. Names become metadata keys, actor ids and file names.
func CheckName(what, name string) error {
	if len(name) > MaxNameBytes {
		return fmt.Errorf("%w: %s name is %d bytes, over its limit of %d (want 1-63 characters of [A-Za-z0-9._-] starting with a letter or digit)",
			ErrInvalid, what, len(name), MaxNameBytes)
	}
	if !nameRE.MatchString(name) {
		return fmt.Errorf("%w: %s name %q: want 1-63 characters of [A-Za-z0-9._-] starting with a letter or digit", ErrInvalid, what, name)
	}
	return nil
}

// Duration is a time.Duration that reads and writes JSON as Go's duration text ("1.5s").
type Duration time.Duration

// MarshalText implements encoding.TextMarshaler.
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("%w: duration %q: %v", ErrInvalid, b, err)
	}
	*d = Duration(v)
	return nil
}

// AgentAddrs are where a machine's agent serves.
type AgentAddrs struct {
	// API is the agent's HTTP API (logs, object store for local workers, kills), host:port.
	API string `json:"api"`
	// Transfer is the object store's transfer server, host:port.
	Transfer string `json:"transfer"`
	// Serf is the agent's gossip address, host:port ("" without membership).
	Serf string `json:"serf,omitempty"`
	// CheckpointDir is the shared checkpoint directory the agent mounts ("" without one):
	// a durable copy there is named by the location "shared:<dir>".
	CheckpointDir string `json:"checkpoint_dir,omitempty"`
}

// Machine is one machine as its agent registered it.
type Machine struct {
	Name string `json:"name"`
	// Rack is the machine's rack number (machines of a rack are placed together).
	Rack int `json:"rack"`
	// Spec is the machine's topology: declared (simulated) or discovered.
	Spec *topology.MachineSpec `json:"spec"`
	// Simulated says the GPUs are declared, not real hardware.
	Simulated bool       `json:"simulated"`
	Agent     AgentAddrs `json:"agent"`
	// PID is the agent's process id, Host its host name.
	PID  int    `json:"pid"`
	Host string `json:"host"`
	// Alive is false once the machine was declared dead (its agent failed or left).
	Alive bool `json:"alive"`
	// Incarnation counts registrations: an agent that restarts registers again, and
	// whatever ran under its previous incarnation is gone.
	Incarnation uint64    `json:"incarnation"`
	Registered  time.Time `json:"registered"`
	// Reason says why the machine is not alive.
	Reason string `json:"reason,omitempty"`
}

// NumGPUs counts the machine's GPUs.
func (m *Machine) NumGPUs() int {
	if m.Spec == nil {
		return 0
	}
	return len(m.Spec.GPUs)
}

// Resources is what one member of a gang (or one actor or task) asks for. The zero value
// asks for nothing (a CPU-only member).
type Resources struct {
	// GPUs is the number of whole cards on one machine; with GPUMilli in 1..999, 1 card's
	// share; with MIG, one MIG slice group of that profile.
	GPUs     int    `json:"gpus,omitempty"`
	GPUMilli int    `json:"gpu_milli,omitempty"`
	MIG      string `json:"mig,omitempty"`
	CPUMilli int64  `json:"cpu_milli,omitempty"`
	MemMiB   int64  `json:"mem_mib,omitempty"`
}

// Payload is an encoded value (see internal/codec): constructor arguments travel this way.
type Payload struct {
	Type  string `json:"type"`
	Codec int32  `json:"codec"`
	Data  []byte `json:"data,omitempty"`
}

// GangSpec is what a driver asks for: Workers members of one actor kind, placed
// all-or-nothing.
type GangSpec struct {
	Job  string `json:"job"`
	Name string `json:"name"`
	// Kind is the registered actor kind of every member; Args its constructor arguments.
	Kind string   `json:"kind"`
	Args *Payload `json:"args,omitempty"`
	// Workers is the gang's size: its largest, for an elastic gang (MinWorkers > 0).
	Workers int `json:"workers"`
	// MinWorkers, when set (1..Workers), makes the gang elastic: it starts at MinWorkers when
	// only that fits, grows toward Workers when capacity frees, and shrinks toward
	// MinWorkers under pressure before anyone evicts it whole. Its program takes the
	// changes at step boundaries (the SDK's Gang.Notices and Gang.Yield).
	MinWorkers int       `json:"min_workers,omitempty"`
	Resources  Resources `json:"resources"`
	// SameIsland keeps every member inside one NVLink island.
	SameIsland bool `json:"same_island,omitempty"`
	// Strategy spreads or packs the members across machines (Ray's placement group
	// strategies); empty: the scheduler's topology-aware placement.
	Strategy Strategy `json:"strategy,omitempty"`
	// Machines, when set, pins the members to these machines (by name): the scheduler
	// core's "machines" Filter refuses every other, so the gang is placed (by its Strategy)
	// on them alone and waits while they are full; it queues, preempts and is preempted like
	// every gang. A pin to no machine of the cluster can never fit.
	Machines []string `json:"machines,omitempty"`
	Priority int      `json:"priority,omitempty"`
	// PriorityClass names one of the operator's priority classes (SchedulerConfig); its
	// value is the gang's priority. Empty: Priority as given, or the default class's.
	PriorityClass string `json:"priority_class,omitempty"`
	Queue         string `json:"queue,omitempty"`
	// NotPreemptible keeps the gang from being evicted or shrunk for another.
	NotPreemptible bool `json:"not_preemptible,omitempty"`
	// JustInTime says its program checkpoints when given a notice (the SDK sets it for a
	// kind that implements Checkpointer): a preemption then loses no work.
	JustInTime bool `json:"just_in_time,omitempty"`
	// CheckpointEvery is the program's periodic checkpoint interval (0: none declared),
	// for the cost of evicting it without a notice.
	CheckpointEvery Duration `json:"checkpoint_every,omitempty"`
	// CheckpointSave and CheckpointRestore declare how long the program takes to write a
	// checkpoint and to read it back (0: unknown until one is measured), for the cost of
	// stopping it. A measured save replaces the declared one; a restore not declared is
	// taken to be as long as the save.
	CheckpointSave    Duration `json:"checkpoint_save,omitempty"`
	CheckpointRestore Duration `json:"checkpoint_restore,omitempty"`
	// Duration is the expected run time (0: unknown), for the queue order and backfill.
	Duration Duration `json:"duration,omitempty"`
	// TimeLimit is an upper bound on the run time its user declares (Slurm's --time; 0:
	// none): the scheduler's run-time predictor caps its guesses by it and learns per
	// limit, and backfill relies on it. The leader holds the gang to it: its run time
	// (kept progress plus the current run) reaching the limit fails it ("time limit
	// reached", as Slurm's TIMEOUT), after a NoticeTimeLimit one notice grace before for
	// a gang with JustInTime, which may checkpoint and yield to stop there instead.
	TimeLimit Duration `json:"time_limit,omitempty"`
	// AllReduceBytes is the size of the gang's typical AllReduce (its gradients).
	AllReduceBytes int64 `json:"allreduce_bytes,omitempty"`
	// Driver marks the gang of a submitted driver (`atoll submit`): its one member runs the
	// job's executable as a driver (with the cluster's address, not as a worker), and its
	// exiting with status 0 completes the gang.
	Driver bool `json:"driver,omitempty"`
	// Service names the service the gang is a replica of (ServiceSpec.Replica): its worker
	// reports its load for the leader's scaling.
	Service string `json:"service,omitempty"`
	// Process, when set, makes a process gang: its members run this command instead of
	// the job's program as SDK workers (Kind is then ProcessKind; see ProcessSpec).
	Process *ProcessSpec `json:"process,omitempty"`
	// MaxRestarts bounds restarts within RestartWindow; past it the gang fails and frees its
	// GPUs. Backoff is the delay before the first restart, doubling up to MaxBackoff.
	MaxRestarts   int      `json:"max_restarts"`
	RestartWindow Duration `json:"restart_window,omitempty"`
	Backoff       Duration `json:"backoff,omitempty"`
	MaxBackoff    Duration `json:"max_backoff,omitempty"`
}

// Normalize fills defaults and validates the spec.
func (s *GangSpec) Normalize() error {
	if err := CheckName("job", s.Job); err != nil {
		return err
	}
	if err := CheckName("gang", s.Name); err != nil {
		return err
	}
	if s.Process != nil {
		switch {
		case s.Kind == "":
			s.Kind = ProcessKind
		case s.Kind != ProcessKind:
			return fmt.Errorf("%w: process gang %q has actor kind %q: a process gang runs its command, not a kind", ErrInvalid, s.Name, s.Kind)
		}
		if s.Driver {
			return fmt.Errorf("%w: gang %q is both a process gang and a driver", ErrInvalid, s.Name)
		}
		if err := s.Process.normalize(s.Name); err != nil {
			return err
		}
	} else if s.Kind == ProcessKind {
		return fmt.Errorf("%w: gang %q has kind %q but no process to run", ErrInvalid, s.Name, ProcessKind)
	}
	if s.Kind == "" {
		return fmt.Errorf("%w: gang %q has no actor kind", ErrInvalid, s.Name)
	}
	if err := s.CheckBounds(); err != nil {
		return fmt.Errorf("gang %q: %w", s.Name, err)
	}
	r := s.Resources
	switch {
	case s.Workers <= 0:
		return fmt.Errorf("%w: gang %q asks for %d workers, want at least 1", ErrInvalid, s.Name, s.Workers)
	case s.Workers > 100000:
		return fmt.Errorf("%w: gang %q asks for %d workers, over the bound of 100000", ErrInvalid, s.Name, s.Workers)
	case s.MinWorkers < 0 || s.MinWorkers > s.Workers:
		return fmt.Errorf("%w: gang %q min workers %d: want 1..%d (its workers), or 0 for a gang of fixed size", ErrInvalid, s.Name, s.MinWorkers, s.Workers)
	case s.MinWorkers > 0 && (s.Strategy != "" || s.Driver):
		return fmt.Errorf("%w: gang %q: an elastic gang (min workers %d) takes no strategy and is no driver", ErrInvalid, s.Name, s.MinWorkers)
	case s.CheckpointEvery < 0 || s.CheckpointSave < 0 || s.CheckpointRestore < 0 || s.Duration < 0 || s.TimeLimit < 0:
		return fmt.Errorf("%w: gang %q checkpoint interval, save and restore, duration and time limit must not be negative", ErrInvalid, s.Name)
	case r.GPUs < 0 || r.GPUMilli < 0 || r.GPUMilli > 1000 || r.CPUMilli < 0 || r.MemMiB < 0:
		return fmt.Errorf("%w: gang %q resources %+v: negative or out of range", ErrInvalid, s.Name, r)
	case r.GPUMilli > 0 && r.GPUMilli < 1000 && r.GPUs != 1:
		return fmt.Errorf("%w: gang %q asks a %d-milli share of %d cards (a share is of one card)", ErrInvalid, s.Name, r.GPUMilli, r.GPUs)
	case s.MaxRestarts < 0:
		return fmt.Errorf("%w: gang %q max restarts %d is negative", ErrInvalid, s.Name, s.MaxRestarts)
	case !s.Strategy.valid():
		return fmt.Errorf("%w: gang %q strategy %q: want one of %q, %q, %q, %q or none", ErrInvalid, s.Name, s.Strategy,
			StrategyPack, StrategySpread, StrategyStrictPack, StrategyStrictSpread)
	case s.SameIsland && s.Strategy != "" && s.Strategy != StrategyPack:
		return fmt.Errorf("%w: gang %q: SameIsland goes with no strategy or %q, not %q", ErrInvalid, s.Name, StrategyPack, s.Strategy)
	case s.RestartWindow < 0 || s.Backoff < 0 || s.MaxBackoff < 0:
		return fmt.Errorf("%w: gang %q restart window and backoffs must not be negative", ErrInvalid, s.Name)
	}
	seen := make(map[string]bool, len(s.Machines))
	for _, m := range s.Machines {
		if m == "" || seen[m] {
			return fmt.Errorf("%w: gang %q machines %q: want distinct, non-empty machine names", ErrInvalid, s.Name, s.Machines)
		}
		seen[m] = true
	}
	if s.RestartWindow == 0 {
		s.RestartWindow = Duration(time.Minute)
	}
	if s.Backoff == 0 {
		s.Backoff = Duration(50 * time.Millisecond)
	}
	if s.MaxBackoff == 0 {
		s.MaxBackoff = Duration(5 * time.Second)
	}
	if s.MaxBackoff < s.Backoff {
		return fmt.Errorf("%w: gang %q max backoff %v below backoff %v", ErrInvalid, s.Name, time.Duration(s.MaxBackoff), time.Duration(s.Backoff))
	}
	return nil
}

// Strategy is how a gang's members are spread over machines, as Ray's placement groups
// say it.
type Strategy string

// Placement strategies.
const (
	// StrategyPack puts the members on as few machines (and NVLink islands) as possible: the
	// scheduler's topology-aware placement, which is also what no strategy gets.
	StrategyPack Strategy = "pack"
	// StrategySpread puts the members on as many machines as possible, more than one per
	// machine only when the machines run out.
	StrategySpread Strategy = "spread"
	// StrategyStrictPack puts every member on one machine, or waits.
	StrategyStrictPack Strategy = "strict-pack"
	// StrategyStrictSpread puts every member on a different machine, or waits.
	StrategyStrictSpread Strategy = "strict-spread"
)

func (s Strategy) valid() bool {
	switch s {
	case "", StrategyPack, StrategySpread, StrategyStrictPack, StrategyStrictSpread:
		return true
	}
	return false
}

// Key is the gang's key in its table: "job/gang".
func (s *GangSpec) Key() string { return s.Job + "/" + s.Name }

// Elastic reports whether the gang resizes (MinWorkers set below Workers).
func (s *GangSpec) Elastic() bool { return s.MinWorkers > 0 && s.MinWorkers < s.Workers }

// GangState is where a gang is in its life.
type GangState string

// Gang states.
const (
	// GangPending: accepted, waiting for capacity (Reason says for what).
	GangPending GangState = "pending"
	// GangStarting: placed; its workers of Generation are starting.
	GangStarting GangState = "starting"
	// GangRunning: every worker of Generation is ready.
	GangRunning GangState = "running"
	// GangRestarting: a worker failed; the gang restarts as Generation at RestartAt.
	GangRestarting GangState = "restarting"
	// GangFailed: out of restarts (or a permanent error); its GPUs are free.
	GangFailed GangState = "failed"
	// GangStopped: stopped by its driver; its GPUs are free.
	GangStopped GangState = "stopped"
)

// Live reports whether the gang holds (or waits for) capacity.
func (s GangState) Live() bool {
	return s == GangPending || s == GangStarting || s == GangRunning || s == GangRestarting
}

// Member is where one member (rank) of a gang runs.
type Member struct {
	Machine string `json:"machine"`
	// GPUs are the member's card indices on its machine; UUIDs their UUIDs (NVML's, or
	// "GPU-sim-..." on simulated machines).
	GPUs  []int    `json:"gpus"`
	UUIDs []string `json:"uuids,omitempty"`
	// Islands are the global NVLink island ids of those cards (for display).
	Islands  []int  `json:"islands,omitempty"`
	Milli    int    `json:"milli,omitempty"`
	MIG      string `json:"mig,omitempty"`
	CPUMilli int64  `json:"cpu_milli,omitempty"`
	MemMiB   int64  `json:"mem_mib,omitempty"`
	// Removed marks a member an elastic gang shrank away: its slot stays (members keep
	// their index for life) but nothing runs there.
	Removed bool `json:"removed,omitempty"`
	// GPUModel is the model of its cards (with SimulatedSuffix on a declared machine): the
	// key of the scheduler's restart costs, which its worker measures and reports.
	GPUModel string `json:"gpu_model,omitempty"`
}

// SimulatedSuffix marks the GPU model of a declared machine's simulated cards: their
// restart costs (no CUDA context; the collective over loopback) are learnt apart from real
// cards of the same model.
const SimulatedSuffix = " (simulated)"

// Placement is the scheduler's decision for one gang generation.
type Placement struct {
	// Members, by index (a worker's Rank in the records): for a gang of fixed size its
	// rank; an elastic gang's grows are appended and its shrinks marked Removed, and a
	// program's rank is the member's position in the gang's World.
	Members []Member `json:"members"`
	// Islands counts the distinct NVLink islands used; Machines lists the machines.
	Islands  int      `json:"islands"`
	Machines []string `json:"machines"`
	// Scores are the placement's per-plugin scores and modeled AllReduce time.
	Scores map[string]float64 `json:"scores,omitempty"`
}

// Gang is a gang's record.
type Gang struct {
	Spec GangSpec `json:"spec"`
	// UID tells this gang from an earlier one of the same job and gang names (a job name is
	// reused by a later submission).
	UID   string    `json:"uid"`
	State GangState `json:"state"`
	// Generation counts incarnations: 0 at first start, +1 per restart.
	Generation int `json:"generation"`
	Restarts   int `json:"restarts"`
	// Failures are the times of failures within the restart window.
	Failures  []time.Time `json:"failures,omitempty"`
	RestartAt time.Time   `json:"restart_at,omitempty"`
	Placement *Placement  `json:"placement,omitempty"`
	// World is the members the program works with now (an elastic gang's, as its driver
	// last took a resize); empty means every member not Removed.
	World *World `json:"world,omitempty"`
	// Notice, when set, asks the gang to stop, shrink or take a grow (see Notice).
	Notice *Notice `json:"notice,omitempty"`
	// Preemptions counts the times the gang was preempted (stopped for another and queued
	// again); Resizes the grows and shrinks it took.
	Preemptions int `json:"preemptions,omitempty"`
	Resizes     int `json:"resizes,omitempty"`
	// Reason says why the gang waits, restarted, failed or stopped.
	Reason string `json:"reason,omitempty"`
	// Created is when it was admitted (its submission time: priority aging counts from
	// here).
	Created time.Time `json:"created"`
	Updated time.Time `json:"updated"`
	// Sched is what the scheduler's decisions about the gang depend on beyond its spec,
	// committed with each change of the gang, so that a new leader decides as the old one
	// would have.
	Sched *GangSched `json:"sched,omitempty"`
}

// GangSched is a gang's scheduling record (the scheduler core's gang.Record, with machine
// names for node indexes): its place in arrival order, its aging inputs, the service it
// attained and the work it kept, a stop or shrink under way, a preemptor's hold.
type GangSched struct {
	// Seq is the gang's submission sequence, increasing across the cluster: the queue
	// order among gangs that are otherwise equal.
	Seq int64 `json:"seq"`
	// Queued is when it last entered its queue (admitted, stopped, or its machine lost).
	Queued time.Time `json:"queued,omitempty"`
	// Started is when its current placement was made.
	Started time.Time `json:"started,omitempty"`
	// Attained is the GPU-seconds of service it received up to AttainedAt.
	Attained   float64   `json:"attained_gpu_s,omitempty"`
	AttainedAt time.Time `json:"attained_at,omitempty"`
	// Progress is the work kept across stops.
	Progress Duration `json:"progress,omitempty"`
	// Evictions counts its preemptions (LastEvicted the latest); Resizes its grows and
	// shrinks (LastResized the latest decided).
	Evictions   int       `json:"evictions,omitempty"`
	LastEvicted time.Time `json:"last_evicted,omitempty"`
	Resizes     int       `json:"resizes,omitempty"`
	LastResized time.Time `json:"last_resized,omitempty"`
	// Stopping: a preemption victim whose checkpoint will hold the run up to KeptUntil.
	Stopping  bool      `json:"stopping,omitempty"`
	KeptUntil time.Time `json:"kept_until,omitempty"`
	// ShrinkTo and ShrinkIndex: a shrink under way, to ShrinkTo members, dropping these
	// positions of its active members.
	ShrinkTo    int   `json:"shrink_to,omitempty"`
	ShrinkIndex []int `json:"shrink_index,omitempty"`
	// Hold is a waiting preemptor's hold on the machines freed for it.
	Hold *GangHold `json:"hold,omitempty"`
	// FitSince is when a waiting gang was first found room since it queued.
	FitSince time.Time `json:"fit_since,omitempty"`
}

// GangHold is a preemptor's hold on machines, from Start until it is placed.
type GangHold struct {
	Machines   []string  `json:"machines"`
	Start      time.Time `json:"start"`
	SkipPermit bool      `json:"skip_permit,omitempty"`
}

// ControlTerm is the leader term: every head that takes the leadership commits the next
// one before it decides anything (the TermKey record).
type ControlTerm struct {
	Term   int64     `json:"term"`
	Leader uint64    `json:"leader"`
	Since  time.Time `json:"since"`
}

// Cordon keeps new gangs off a machine (a CordonsPrefix record): an operator's drain
// (atoll drain, lifted by atoll undrain) or the pools draining a machine before removing
// it. It outlives leader changes and the machine's own restarts.
type Cordon struct {
	Machine string `json:"machine"`
	// By is who cordoned it ("pools", or the operator's identity); Reason why.
	By     string    `json:"by"`
	Reason string    `json:"reason,omitempty"`
	At     time.Time `json:"at"`
	// Drain: its gangs were also given drain notices (checkpoint, stop, queue again).
	Drain bool `json:"drain,omitempty"`
}

// LearnedCosts is what the leader learned of one GPU model's restart costs from
// measurements (a CostsPrefix record): the correction factor of the default curve for
// each kind ("cuda_context", "communicator") and the measurements it rests on. It is
// committed in batches (a few a second at most), not once per measurement.
type LearnedCosts struct {
	GPUModel string                 `json:"gpu_model"`
	Kinds    map[string]LearnedCost `json:"kinds"`
}

// LearnedCost is one kind's learned correction factor.
type LearnedCost struct {
	Factor float64 `json:"factor"`
	Count  int     `json:"count"`
}

// CostsKey is the key, under CostsPrefix, of a GPU model's LearnedCosts.
func CostsKey(model string) string { return url.PathEscape(model) }

// Active lists the members that are not Removed, by index (all of them when the gang has
// no placement yet: none).
func (g *Gang) Active() []int {
	if g.Placement == nil {
		return nil
	}
	var out []int
	for i, m := range g.Placement.Members {
		if !m.Removed {
			out = append(out, i)
		}
	}
	return out
}

// Ranks is the program's view of the members: the World's members when one was taken,
// else every active member; a program's rank is a member's position in it.
func (g *Gang) Ranks() []int {
	if g.World != nil && len(g.World.Members) > 0 {
		return append([]int(nil), g.World.Members...)
	}
	return g.Active()
}

// Size is the gang's size as the status shows it: its program's members once placed,
// else the workers it asks for.
func (g *Gang) Size() int {
	if g.State == GangPending || g.Placement == nil {
		return g.Spec.Workers
	}
	return len(g.Ranks())
}

// ReadyWorkers counts the members of the gang's program whose worker of this generation
// is up (ready reports a member index): 0 unless the gang is starting or running, since an
// ended or restarting gang's workers are gone even when their records stay in the log.
func (g *Gang) ReadyWorkers(ready func(member int) bool) int {
	if g.State != GangStarting && g.State != GangRunning {
		return 0
	}
	n := 0
	for _, m := range g.Ranks() {
		if ready(m) {
			n++
		}
	}
	return n
}

// HeldGPUs counts the cards a placed gang's active members hold (a share or a MIG slice
// counts as one card).
func (g *Gang) HeldGPUs() int {
	n := 0
	for _, i := range g.Active() {
		n += len(g.Placement.Members[i].GPUs)
	}
	return n
}

// World is the members an elastic gang's program works with (member indices, in rank
// order) at Epoch, which counts the resizes its driver took in this generation.
type World struct {
	Epoch   int   `json:"epoch"`
	Members []int `json:"members"`
}

// NoticeKind says what a notice asks.
type NoticeKind string

// Notice kinds.
const (
	// NoticePreempt: checkpoint and stop by the deadline; the gang queues again and
	// resumes from its newest checkpoint when placed.
	NoticePreempt NoticeKind = "preempt"
	// NoticeDrain: the same, because its machine is drained (an operator, a spot
	// interruption, a scale-down).
	NoticeDrain NoticeKind = "drain"
	// NoticeShrink: drop the members in Remove by the deadline; the others keep running.
	NoticeShrink NoticeKind = "shrink"
	// NoticeGrow: the members in Add are placed and starting; take them at the next step.
	NoticeGrow NoticeKind = "grow"
	// NoticeTimeLimit: the gang's TimeLimit ends at the deadline (Slurm's --time, with its
	// --signal warning): checkpoint and yield to stop there; past it the gang fails.
	NoticeTimeLimit NoticeKind = "time_limit"
)

// Notice asks a running gang to change: its driver takes it at a step boundary (a
// just-in-time checkpoint first, for a stop) and answers (POST /v1/gangs/yield or
// /v1/gangs/world); past Deadline the head acts alone: a stop loses the work since the
// newest checkpoint, a shrink restarts the gang at its new size from it.
type Notice struct {
	Kind     NoticeKind `json:"kind"`
	Issued   time.Time  `json:"issued"`
	Deadline time.Time  `json:"deadline,omitempty"`
	// For is the gang it makes room for ("job/gang"), Reason why.
	For    string `json:"for,omitempty"`
	Reason string `json:"reason,omitempty"`
	// From and To are the sizes of a resize; Remove the members a shrink drops, Add those
	// a grow adds (member indices).
	From   int   `json:"from,omitempty"`
	To     int   `json:"to,omitempty"`
	Remove []int `json:"remove,omitempty"`
	Add    []int `json:"add,omitempty"`
	// Costs are the scheduler's estimate of what the eviction costs, in seconds.
	Costs *EvictionCosts `json:"costs,omitempty"`
}

// EvictionCosts is the scheduler's estimate of what stopping a gang costs, in seconds (of
// the whole gang: multiply by its GPUs for GPU-seconds).
type EvictionCosts struct {
	WorkLost    float64 `json:"work_lost"`
	Checkpoint  float64 `json:"checkpoint"`
	Restore     float64 `json:"restore"`
	CUDAContext float64 `json:"cuda_context"`
	// Communicator is the collective's set-up at the gang's size.
	Communicator float64 `json:"communicator"`
	GPUSeconds   float64 `json:"gpu_seconds"`
}

// Yield is a driver's answer to a stop notice (POST /v1/gangs/yield): its gang may stop
// now. Checkpointed says a checkpoint was committed since the notice.
type Yield struct {
	Job          string `json:"job"`
	Gang         string `json:"gang"`
	UID          string `json:"uid"`
	Generation   int    `json:"generation"`
	Checkpointed bool   `json:"checkpointed"`
	Step         int64  `json:"step,omitempty"`
}

// WorldChange is a driver taking a resize (POST /v1/gangs/world): the gang's program works
// with Members from Epoch on (after a shrink, without the removed ones; after a grow, with
// the new ones, ready).
type WorldChange struct {
	Job        string `json:"job"`
	Gang       string `json:"gang"`
	UID        string `json:"uid"`
	Generation int    `json:"generation"`
	Epoch      int    `json:"epoch"`
	Members    []int  `json:"members"`
}

// CheckpointReport tells the head a gang committed a checkpoint (POST /v1/gangs/checkpointed):
// the scheduler's cost of evicting it counts from there, and learns its size and save time.
type CheckpointReport struct {
	Job   string    `json:"job"`
	Gang  string    `json:"gang"`
	UID   string    `json:"uid"`
	Step  int64     `json:"step"`
	Bytes int64     `json:"bytes"`
	Save  Duration  `json:"save"`
	At    time.Time `json:"at"`
}

// CostReport is a measurement a worker made of what a restart costs on its GPU (POST
// /v1/costs): the scheduler's cost model learns from it.
type CostReport struct {
	// Kind is "cuda_context" (creating a CUDA context on the worker's GPUs) or
	// "communicator" (setting up the gang's collective).
	Kind     string   `json:"kind"`
	GPUModel string   `json:"gpu_model"`
	Ranks    int      `json:"ranks"`
	Measured Duration `json:"measured"`
	Machine  string   `json:"machine,omitempty"`
}

// Worker is a gang member that is up: its actor is started (and restored) and takes calls.
type Worker struct {
	Job        string `json:"job"`
	Gang       string `json:"gang"`
	Rank       int    `json:"rank"`
	Generation int    `json:"generation"`
	// GangUID is the gang's (Gang.UID): records of an earlier gang of the same names are not
	// this one's.
	GangUID string `json:"gang_uid"`
	Machine string `json:"machine"`
	// Address is the worker's actor system (protoactor remote host:port, or "nonhost" for
	// a worker inside the driver's process); ActorID its actor's id there.
	Address string `json:"address"`
	ActorID string `json:"actor_id"`
	// Collective is the id of the worker's collective endpoint actor, on the same system.
	Collective string `json:"collective,omitempty"`
	// Transfer is where the worker serves its collective chunks (host:port), if it does.
	Transfer string    `json:"transfer,omitempty"`
	PID      int       `json:"pid"`
	Started  time.Time `json:"started"`
	// Exit, for a process gang's member that ended without failing, says how
	// (ExitCompleted, ExitYielded): the gang completes or yields once every member of its
	// world has, and a new leader reads it back from here.
	Exit string `json:"exit,omitempty"`
}

// WorkerExit reports a worker that stopped without being asked to.
type WorkerExit struct {
	Job        string `json:"job"`
	Gang       string `json:"gang"`
	Rank       int    `json:"rank"`
	Generation int    `json:"generation"`
	Machine    string `json:"machine"`
	Reason     string `json:"reason"`
	// Permanent says a restart cannot help (an unknown kind, undecodable arguments): the
	// gang fails at once.
	Permanent bool `json:"permanent,omitempty"`
	// Completed says a submitted driver finished (exit status 0): its gang is done.
	Completed bool `json:"completed,omitempty"`
	// Yielded says a process gang's member exited with its yield code (ProcessSpec): after
	// a notice, the member yielded; without one, it failed.
	Yielded bool `json:"yielded,omitempty"`
}

// JobState is where a job is.
type JobState string

// Job states.
const (
	JobRunning JobState = "running"
	JobStopped JobState = "stopped"
)

// Binary is a job's executable, stored once in the object store by content hash.
type Binary struct {
	// SHA256 is the hex content hash; Object the object's id (the same bytes).
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
	Object string `json:"object"`
}

// Job is a job's record.
type Job struct {
	Name  string   `json:"name"`
	State JobState `json:"state"`
	// Driver names who submitted it (host and pid); Principal is the principal that
	// submitted it (runtime/authz; the head sets it): a driver of one job acts on the jobs
	// it submitted too. Empty in a record written before principals, read as admin.
	Driver    string    `json:"driver,omitempty"`
	Principal string    `json:"principal,omitempty"`
	Submitted time.Time `json:"submitted"`
	Stopped   time.Time `json:"stopped,omitempty"`
	// Binary, Args and Env say how agents start the job's workers: the driver's own
	// executable, with the driver's arguments and the environment variables it chose to pass
	// (never secrets). A job without a Binary runs its workers inside the driver's process.
	Binary *Binary  `json:"binary,omitempty"`
	Args   []string `json:"args,omitempty"`
	Env    []string `json:"env,omitempty"`
	// Dir is the driver's working directory, where workers start.
	Dir string `json:"dir,omitempty"`
	// EndsWithGangs says no driver runs to stop the job (atoll submit --workers): the
	// leader stops it once its last live gang has ended.
	EndsWithGangs bool `json:"ends_with_gangs,omitempty"`
}

// Checkpoint is a complete checkpoint of a gang: one object per rank, committed as a whole.
type Checkpoint struct {
	Job     string    `json:"job"`
	Gang    string    `json:"gang"`
	Step    int64     `json:"step"`
	Objects []string  `json:"objects"`
	Time    time.Time `json:"time"`
	// Parts are Objects with their sizes and checksums (absent in checkpoints committed
	// before they were recorded).
	Parts []CheckpointPart `json:"parts,omitempty"`
	// Copies is how many durable copies of every part existed when it was committed: 2, on
	// two machines, or on one and in SharedDir.
	Copies int `json:"copies,omitempty"`
	// SharedDir is the shared checkpoint directory holding the second copy of every part,
	// if any.
	SharedDir string `json:"shared_dir,omitempty"`
	// Save is how long writing it took, Bytes its size (0: not measured): the leader
	// prices a stop of the gang from them, from the log.
	Save  Duration `json:"save,omitempty"`
	Bytes int64    `json:"bytes,omitempty"`
}

// CheckpointPart is one rank's part of a checkpoint: its object, size and checksum
// (xxhash64), which a resumed gang checks what it reads against.
type CheckpointPart struct {
	ID          string `json:"id"`
	Size        int64  `json:"size"`
	Fingerprint uint64 `json:"fingerprint"`
}

// Owner is a driver process that owns objects (owners/<name>): it renews the record while
// it runs and deletes it when it disconnects. Reconciliation counts an owner as ended, and
// its objects with it, once its record is gone or has not been renewed for OwnerTTL.
type Owner struct {
	Name string `json:"name"`
	// Store is the transfer address of the driver's own object store ("" when it has none).
	Store   string    `json:"store,omitempty"`
	Host    string    `json:"host,omitempty"`
	PID     int       `json:"pid,omitempty"`
	Started time.Time `json:"started"`
	Renewed time.Time `json:"renewed"`
	// Principal is the driver's principal (runtime/authz): a driver of one job owns that
	// job's objects only; empty in a record written before principals, read as admin.
	Principal string `json:"principal,omitempty"`
}

// How often a driver renews its Owner record, and how long an unrenewed one is trusted.
const (
	OwnerRenewEvery = 5 * time.Second
	OwnerTTL        = 30 * time.Second
)

// CheckpointKey is a checkpoint's key in its table (sorted by step).
func CheckpointKey(job, gang string, step int64) string {
	return fmt.Sprintf("%s/%s/%020d", job, gang, step)
}

// WorkerKey is a worker's key in its table.
func WorkerKey(job, gang string, rank int) string {
	return fmt.Sprintf("%s/%s/%d", job, gang, rank)
}

// Load is a machine's measured use, each in [0, 1].
type Load struct {
	CPU float64 `json:"cpu"`
	GPU float64 `json:"gpu"`
	Mem float64 `json:"mem"`
	Net float64 `json:"net"`
	// GPUMeasured is false when GPU is derived from allocations (simulated GPUs).
	GPUMeasured bool `json:"gpu_measured"`
}

// LoadReport is an agent's periodic sample.
type LoadReport struct {
	Machine     string    `json:"machine"`
	Incarnation uint64    `json:"incarnation"`
	Load        Load      `json:"load"`
	At          time.Time `json:"at"`
	// Store is the machine's object store and transfer plane use (nil from older agents).
	Store *StoreUsage `json:"store,omitempty"`
}

// LoadAnswer is the leader's answer to a load report.
type LoadAnswer struct {
	// Interval is the period the leader asks of this machine's reports: the machines
	// over the leader's report rate, up to a third of its heartbeat timeout (0 from
	// older heads). An agent reports at this period or its own, the longer.
	Interval Duration `json:"interval"`
	// Trust is the answering head's trust tag (TrustTag; "" without TLS, and from older
	// heads): the agent asks for the cluster's CAs when it differs from the one it
	// followed, instead of every TrustPoll (FollowIdentity).
	Trust string `json:"trust,omitempty"`
}

// HeadInfo is one head as the cluster sees it.
type HeadInfo struct {
	ID      uint64 `json:"id"`
	Address string `json:"address"`
	Serf    string `json:"serf,omitempty"`
	PID     int    `json:"pid,omitempty"`
	Leader  bool   `json:"leader"`
	// DiskFull says the head cannot write its log (its disk is full): it has stepped down
	// and rejoins by itself when space frees. Error is its storage failure.
	DiskFull bool   `json:"disk_full,omitempty"`
	Error    string `json:"error,omitempty"`
}

// MachineStatus is a machine's line in the cluster status.
type MachineStatus struct {
	Name      string `json:"name"`
	GPUs      int    `json:"gpus"`
	FreeGPUs  int    `json:"free_gpus"`
	Alive     bool   `json:"alive"`
	PID       int    `json:"pid,omitempty"`
	Simulated bool   `json:"simulated"`
	Rack      int    `json:"rack"`
	Load      *Load  `json:"load,omitempty"`
	Agent     string `json:"agent,omitempty"`
	// Cordoned: nothing new is placed on it (a drain, or the pools removing it), for
	// CordonReason, since CordonedAt, by CordonedBy.
	Cordoned     bool      `json:"cordoned"`
	CordonReason string    `json:"cordon_reason"`
	CordonedBy   string    `json:"cordoned_by,omitempty"`
	CordonedAt   time.Time `json:"cordoned_at,omitzero"`
	Drained      bool      `json:"drained,omitempty"`
}

// GangStatus is a gang's line in the cluster status.
type GangStatus struct {
	Job        string    `json:"job"`
	Name       string    `json:"name"`
	State      GangState `json:"state"`
	Workers    int       `json:"workers"`
	Ready      int       `json:"ready"`
	Generation int       `json:"generation"`
	Restarts   int       `json:"restarts"`
	Machines   []string  `json:"machines,omitempty"`
	Reason     string    `json:"reason,omitempty"`
	// Queue is the gang's queue; GPUs the cards its placement holds.
	Queue string `json:"queue,omitempty"`
	GPUs  int    `json:"gpus,omitempty"`
	// Priority is its resolved priority; MinWorkers..MaxWorkers its range when elastic.
	Priority   int `json:"priority,omitempty"`
	MinWorkers int `json:"min_workers,omitempty"`
	MaxWorkers int `json:"max_workers,omitempty"`
	// Preemptions and Resizes count what it went through; Notice is the one it is given.
	Preemptions int     `json:"preemptions,omitempty"`
	Resizes     int     `json:"resizes,omitempty"`
	Notice      *Notice `json:"notice,omitempty"`
}

// Status is the cluster as the leader sees it (`atoll status --json`).
type Status struct {
	Leader uint64 `json:"leader"`
	// Term is the leader term: it increases at every change of leader (the ControlTerm
	// the answering leader committed when it took office).
	Term     int64           `json:"term"`
	Heads    []HeadInfo      `json:"heads"`
	Machines []MachineStatus `json:"machines"`
	Gangs    []GangStatus    `json:"gangs"`
	Revision int64           `json:"revision"`
	// Dashboard is the web dashboard's URL with its read-only login token (see
	// DashboardToken), on the head that answered.
	Dashboard string `json:"dashboard,omitempty"`
	// Pools is the autoscaler's view, when the leader runs one (head --pools).
	Pools *PoolsStatus `json:"pools,omitempty"`
	// Queues are the operator's queues with what they hold and wait for.
	Queues []QueueStatus `json:"queues"`
	// Objects counts the object directory's records (`atoll status` reads them).
	Objects *ObjectsStatus `json:"objects,omitempty"`
	// Services are the live services with their replicas and reported load.
	Services []ServiceStatus `json:"services"`
}

// MarshalJSON writes the status with every list present: an empty list is [], never
// null (a reader iterates the lists of a fresh cluster without checking for null).
func (s Status) MarshalJSON() ([]byte, error) {
	type plain Status
	p := plain(s)
	p.Heads, p.Machines, p.Gangs, p.Queues = orEmpty(p.Heads), orEmpty(p.Machines), orEmpty(p.Gangs), orEmpty(p.Queues)
	p.Services = orEmpty(p.Services)
	return json.Marshal(p)
}

// orEmpty returns s, or an empty slice for a nil one (which JSON writes as null).
func orEmpty[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// ObjectsStatus counts the object directory's records: the live objects (those with a
// durable copy among them), and the dead ones kept for a while so their readers learn why
// they are gone: lost (no copy left anywhere) or owner-died (their owner ended).
type ObjectsStatus struct {
	Records   int   `json:"records"`
	Live      int   `json:"live"`
	Durable   int   `json:"durable"`
	Lost      int   `json:"lost"`
	OwnerDied int   `json:"owner_died"`
	LiveBytes int64 `json:"live_bytes"`
}

// SchedulerConfig is the operator's configuration of the scheduler (GET and PUT
// /v1/scheduler, `atoll queues`), kept in the log.
type SchedulerConfig struct {
	// Queues share the cluster: each gang names one (GangSpec.Queue; DefaultQueue when it
	// names none). A queue's path is slash-separated ("research/vision" is a child of
	// "research"); parents not listed weigh 1.
	Queues       []QueueSpec `json:"queues"`
	DefaultQueue string      `json:"default_queue,omitempty"`
	// PriorityClasses name priorities (as Kubernetes' PriorityClass): a gang names one
	// (GangSpec.PriorityClass), the Default one applies to a gang that names none.
	PriorityClasses []PriorityClass `json:"priority_classes,omitempty"`
	// NoticeGrace is how long a gang given a stop or shrink notice has to checkpoint and
	// answer before the head acts alone (default 30 s).
	NoticeGrace Duration `json:"notice_grace,omitempty"`
	// MinRunBeforePreempt protects a gang that started less than this long ago from being
	// preempted (against thrashing; default 0: a higher class runs at once, as in
	// Kubernetes and Volcano).
	MinRunBeforePreempt Duration `json:"min_run_before_preempt,omitempty"`
	// MaxPending is the backpressure bound: past this many gangs waiting, a submission is
	// refused as saturated with a retry hint (0: the default, 2,000).
	MaxPending int `json:"max_pending,omitempty"`
	// MaxJobWorkers bounds the workers of one job's live gangs together (an elastic gang
	// counts its largest size); MaxClusterWorkers those of every live gang. A gang past
	// either is refused, naming the bound (0: the defaults, DefaultMaxJobWorkers and
	// DefaultMaxClusterWorkers). Every worker is a process, a record and a watch event.
	MaxJobWorkers     int `json:"max_job_workers,omitempty"`
	MaxClusterWorkers int `json:"max_cluster_workers,omitempty"`
}

// QueueSpec is one queue: Weight is its share of its parent's capacity among the active
// siblings (dominant resource fairness); QuotaGPUs caps, in whole GPUs, what it holds while
// other queues wait (0: its fair share only, borrowing idle capacity above it, which
// under-share queues reclaim by preemption); Sensitivity in [0, 1] raises its gangs'
// priority for latency.
type QueueSpec struct {
	Name        string  `json:"name"`
	Weight      float64 `json:"weight"`
	QuotaGPUs   int     `json:"quota_gpus,omitempty"`
	Sensitivity float64 `json:"sensitivity,omitempty"`
}

// PriorityClass names a priority value; Default applies it to gangs that name no class.
type PriorityClass struct {
	Name    string `json:"name"`
	Value   int    `json:"value"`
	Default bool   `json:"default,omitempty"`
}

// Bounds of a SchedulerConfig.
const (
	MaxQueues          = 1000
	MaxPriorityClasses = 100
	MaxPriorityValue   = 1_000_000
	// DefaultMaxJobWorkers and DefaultMaxClusterWorkers are the worker bounds of a
	// configuration that sets none; MaxWorkersBound the largest either may be set to.
	DefaultMaxJobWorkers     = 10_000
	DefaultMaxClusterWorkers = 100_000
	MaxWorkersBound          = 10_000_000
)

// JobWorkersBound is the configured bound of one job's workers (the default when unset).
func (c *SchedulerConfig) JobWorkersBound() int {
	if c.MaxJobWorkers > 0 {
		return c.MaxJobWorkers
	}
	return DefaultMaxJobWorkers
}

// ClusterWorkersBound is the configured bound of the cluster's workers (the default when
// unset).
func (c *SchedulerConfig) ClusterWorkersBound() int {
	if c.MaxClusterWorkers > 0 {
		return c.MaxClusterWorkers
	}
	return DefaultMaxClusterWorkers
}

// Validate checks a configuration and fills its defaults (the default queue "default",
// created when not listed; a notice grace of 30 s). Errors name the entry and field.
func (c *SchedulerConfig) Validate() error {
	if len(c.Queues) > MaxQueues {
		return fmt.Errorf("%w: %d queues, over the bound of %d", ErrInvalid, len(c.Queues), MaxQueues)
	}
	if c.MaxPending < 0 || c.MaxPending > 1_000_000 {
		return fmt.Errorf("%w: max_pending %d, want 0 (the default, 2000) to 1000000", ErrInvalid, c.MaxPending)
	}
	if c.MaxJobWorkers < 0 || c.MaxJobWorkers > MaxWorkersBound {
		return fmt.Errorf("%w: max_job_workers %d, want 0 (the default, %d) to %d", ErrInvalid, c.MaxJobWorkers, DefaultMaxJobWorkers, MaxWorkersBound)
	}
	if c.MaxClusterWorkers < 0 || c.MaxClusterWorkers > MaxWorkersBound {
		return fmt.Errorf("%w: max_cluster_workers %d, want 0 (the default, %d) to %d", ErrInvalid, c.MaxClusterWorkers, DefaultMaxClusterWorkers, MaxWorkersBound)
	}
	if len(c.PriorityClasses) > MaxPriorityClasses {
		return fmt.Errorf("%w: %d priority classes, over the bound of %d", ErrInvalid, len(c.PriorityClasses), MaxPriorityClasses)
	}
	if c.DefaultQueue == "" {
		c.DefaultQueue = "default"
	}
	seen := map[string]bool{}
	for i, q := range c.Queues {
		where := fmt.Sprintf("queues[%d] %q", i, q.Name)
		if err := checkQueueName(q.Name); err != nil {
			return fmt.Errorf("%w: %s: %v", ErrInvalid, where, err)
		}
		switch {
		case seen[q.Name]:
			return fmt.Errorf("%w: %s is listed twice", ErrInvalid, where)
		case !(q.Weight > 0 && q.Weight <= 1e6):
			return fmt.Errorf("%w: %s: weight %v, want (0, 1e6]", ErrInvalid, where, q.Weight)
		case q.QuotaGPUs < 0 || q.QuotaGPUs > 10_000_000:
			return fmt.Errorf("%w: %s: quota_gpus %d, want 0..10000000", ErrInvalid, where, q.QuotaGPUs)
		case !(q.Sensitivity >= 0 && q.Sensitivity <= 1):
			return fmt.Errorf("%w: %s: sensitivity %v, want [0, 1]", ErrInvalid, where, q.Sensitivity)
		}
		seen[q.Name] = true
	}
	if !seen[c.DefaultQueue] {
		if err := checkQueueName(c.DefaultQueue); err != nil {
			return fmt.Errorf("%w: default_queue: %v", ErrInvalid, err)
		}
		c.Queues = append(c.Queues, QueueSpec{Name: c.DefaultQueue, Weight: 1})
	}
	classes, defaults := map[string]bool{}, 0
	for i, p := range c.PriorityClasses {
		where := fmt.Sprintf("priority_classes[%d] %q", i, p.Name)
		if err := CheckName("priority class", p.Name); err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
		switch {
		case classes[p.Name]:
			return fmt.Errorf("%w: %s is listed twice", ErrInvalid, where)
		case p.Value < -MaxPriorityValue || p.Value > MaxPriorityValue:
			return fmt.Errorf("%w: %s: value %d, want within ±%d", ErrInvalid, where, p.Value, MaxPriorityValue)
		}
		classes[p.Name] = true
		if p.Default {
			defaults++
		}
	}
	if defaults > 1 {
		return fmt.Errorf("%w: %d priority classes are marked default, want at most one", ErrInvalid, defaults)
	}
	switch {
	case c.NoticeGrace == 0:
		c.NoticeGrace = Duration(30 * time.Second)
	case c.NoticeGrace < Duration(100*time.Millisecond) || c.NoticeGrace > Duration(time.Hour):
		return fmt.Errorf("%w: notice_grace %v, want 100ms..1h", ErrInvalid, time.Duration(c.NoticeGrace))
	}
	if c.MinRunBeforePreempt < 0 || c.MinRunBeforePreempt > Duration(24*time.Hour) {
		return fmt.Errorf("%w: min_run_before_preempt %v, want 0..24h", ErrInvalid, time.Duration(c.MinRunBeforePreempt))
	}
	return nil
}

// checkQueueName checks a queue path: slash-separated names.
func checkQueueName(name string) error {
	if name == "" || len(name) > 200 {
		return fmt.Errorf("queue name %q: want 1 to 200 characters", name)
	}
	for _, part := range strings.Split(name, "/") {
		if err := CheckName("queue", part); err != nil {
			return err
		}
	}
	return nil
}

// Priority resolves a gang's priority: its class's value when it names one, else its own
// Priority, else the default class's value. It fails on an unknown class.
func (c *SchedulerConfig) Priority(s GangSpec) (int, error) {
	if s.PriorityClass != "" {
		for _, p := range c.PriorityClasses {
			if p.Name == s.PriorityClass {
				return p.Value, nil
			}
		}
		names := make([]string, 0, len(c.PriorityClasses))
		for _, p := range c.PriorityClasses {
			names = append(names, p.Name)
		}
		return 0, fmt.Errorf("%w: gang %q: priority class %q is not one of %v", ErrInvalid, s.Name, s.PriorityClass, names)
	}
	if s.Priority != 0 {
		return s.Priority, nil
	}
	for _, p := range c.PriorityClasses {
		if p.Default {
			return p.Value, nil
		}
	}
	return 0, nil
}

// QueueOf is the queue of a gang of spec s: the one it names, else the default queue.
func (c *SchedulerConfig) QueueOf(s GangSpec) string {
	if s.Queue != "" {
		return s.Queue
	}
	if c.DefaultQueue == "" {
		return "default" // a configuration not validated
	}
	return c.DefaultQueue
}

// QueueLines is every configured queue's line, in the configuration's order: its pending
// gangs, its starting, running and restarting ones and the cards they hold. The share is
// the scheduler's to fill. A gang of a queue the configuration lacks is not counted.
func (c *SchedulerConfig) QueueLines(gangs []Gang) []QueueStatus {
	out := make([]QueueStatus, 0, len(c.Queues))
	idx := map[string]int{}
	for _, q := range c.Queues {
		idx[q.Name] = len(out)
		out = append(out, QueueStatus{Name: q.Name, Weight: q.Weight, QuotaGPUs: q.QuotaGPUs})
	}
	for i := range gangs {
		g := &gangs[i]
		at, ok := idx[c.QueueOf(g.Spec)]
		if !ok {
			continue
		}
		switch g.State {
		case GangPending:
			out[at].Pending++
		case GangStarting, GangRunning, GangRestarting:
			out[at].Running++
			out[at].GPUs += g.HeldGPUs()
		}
	}
	return out
}

// QueueStatus is a queue's line in the cluster status.
type QueueStatus struct {
	Name      string  `json:"name"`
	Weight    float64 `json:"weight"`
	QuotaGPUs int     `json:"quota_gpus,omitempty"`
	Pending   int     `json:"pending"`
	Running   int     `json:"running"`
	GPUs      int     `json:"gpus"`
	// Share is the queue's use over its fair share (the scheduler's DRF ratio).
	Share float64 `json:"share"`
}

// SaturatedError is a refusal for saturation, with the scheduler's hint of when to retry.
type SaturatedError struct {
	Msg        string
	RetryAfter time.Duration
}

func (e *SaturatedError) Error() string { return e.Msg }

// Is makes errors.Is(err, ErrSaturated) true.
func (e *SaturatedError) Is(target error) bool { return target == ErrSaturated }

// RetryAfter returns the retry hint of a saturation refusal.
func RetryAfter(err error) (time.Duration, bool) {
	var se *SaturatedError
	if errors.As(err, &se) {
		return se.RetryAfter, true
	}
	return 0, false
}

// DrainRequest asks the leader to drain a machine (POST /v1/machines/drain): it takes no new
// gangs, and every gang on it is asked to checkpoint and stop by Deadline (default: the
// notice grace from now), then queues again elsewhere.
type DrainRequest struct {
	Machine  string    `json:"machine"`
	Deadline time.Time `json:"deadline,omitempty"`
	Reason   string    `json:"reason,omitempty"`
	// By says who drains it (an operator's name; the head prefixes the name of the
	// caller's certificate when it has one).
	By string `json:"by,omitempty"`
}

// UndrainRequest lifts a machine's drain or cordon (POST /v1/machines/undrain): new gangs
// may be placed on it again. Gangs already stopped by the drain stay where they went.
type UndrainRequest struct {
	Machine string `json:"machine"`
	By      string `json:"by,omitempty"`
}
