package sdk

import (
	"encoding/json"
	"time"

	"github.com/atoll-run/atoll/topology"
)

// The cluster as the SDK reports it (Cluster.Status, Cluster.Machines). These types are
// the SDK's own: they carry the same fields, with the same JSON, as the records of the
// cluster's API (`atoll status --json` prints a Status), so a program can name every part
// of what it is handed.

// Status is the cluster as its leader head sees it: heads, machines, gangs.
type Status struct {
	// Leader is the id of the leader head; Revision the metadata log's revision.
	Leader uint64 `json:"leader"`
	// Term is the leader term: it increases at every change of leader.
	Term     int64           `json:"term"`
	Heads    []HeadStatus    `json:"heads"`
	Machines []MachineStatus `json:"machines"`
	Gangs    []GangStatus    `json:"gangs"`
	Revision int64           `json:"revision"`
	// Dashboard is the web dashboard's URL with its read-only login token, on the head
	// that answered.
	Dashboard string `json:"dashboard,omitempty"`
	// Pools is the autoscaler's view, when the leader runs one (head --pools).
	Pools *PoolsStatus `json:"pools,omitempty"`
	// Queues are the operator's queues with what they hold and wait for.
	Queues []QueueStatus `json:"queues"`
	// Objects counts the object directory's records (filled by `atoll status`, which reads
	// them; nil from Cluster.Status).
	Objects *ObjectsStatus `json:"objects,omitempty"`
	// Services are the live services (Job.SpawnService) with their replicas and load.
	Services []ServiceStatus `json:"services"`
}

// ServiceStatus is a service's line in the cluster status.
type ServiceStatus struct {
	Job   string `json:"job"`
	Name  string `json:"name"`
	State string `json:"state"`
	// MinReplicas..MaxReplicas are its bounds, Replicas the leader's decision, Ready the
	// replicas whose worker is up.
	MinReplicas int `json:"min_replicas"`
	MaxReplicas int `json:"max_replicas"`
	Replicas    int `json:"replicas"`
	Ready       int `json:"ready"`
	// InFlight is the requests in flight its replicas reported, LatencyMS their mean
	// latency (milliseconds), LatencySLOMS its SLO (0: none).
	InFlight     int     `json:"in_flight"`
	LatencyMS    float64 `json:"latency_ms"`
	LatencySLOMS float64 `json:"latency_slo_ms,omitempty"`
	// GPUs are the cards its replicas hold; ScaleUps and ScaleDowns count the leader's
	// decisions, Reason says the last one.
	GPUs       int    `json:"gpus"`
	ScaleUps   int    `json:"scale_ups"`
	ScaleDowns int    `json:"scale_downs"`
	Reason     string `json:"reason,omitempty"`
}

// MarshalJSON writes the status with every list present: an empty list is [], never
// null (`atoll status --json` of a fresh cluster says "gangs": []).
func (s Status) MarshalJSON() ([]byte, error) {
	type plain Status
	p := plain(s)
	p.Heads, p.Machines, p.Gangs, p.Queues = orEmpty(p.Heads), orEmpty(p.Machines), orEmpty(p.Gangs), orEmpty(p.Queues)
	p.Services = orEmpty(p.Services)
	return json.Marshal(p)
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

// HeadStatus is one head as the cluster sees it.
type HeadStatus struct {
	ID uint64 `json:"id"`
	// Address is the head's API URL; Serf its gossip address, if it has one.
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
	Name     string `json:"name"`
	GPUs     int    `json:"gpus"`
	FreeGPUs int    `json:"free_gpus"`
	Alive    bool   `json:"alive"`
	// PID is its agent's process id.
	PID int `json:"pid,omitempty"`
	// Simulated says the GPUs are declared, not real hardware.
	Simulated bool `json:"simulated"`
	Rack      int  `json:"rack"`
	// Load is the machine's newest measured use, if its agent reported one.
	Load *MachineLoad `json:"load,omitempty"`
	// Agent is the agent's API address (host:port).
	Agent string `json:"agent,omitempty"`
	// Cordoned: nothing new is placed on it (atoll drain, or the pools removing it), for
	// CordonReason, since CordonedAt, by CordonedBy; Drained: its gangs were also given
	// drain notices. atoll undrain lifts it.
	Cordoned     bool      `json:"cordoned"`
	CordonReason string    `json:"cordon_reason"`
	CordonedBy   string    `json:"cordoned_by,omitempty"`
	CordonedAt   time.Time `json:"cordoned_at,omitzero"`
	Drained      bool      `json:"drained,omitempty"`
}

// MachineLoad is a machine's measured use, each in [0, 1].
type MachineLoad struct {
	CPU float64 `json:"cpu"`
	GPU float64 `json:"gpu"`
	Mem float64 `json:"mem"`
	Net float64 `json:"net"`
	// GPUMeasured is false when GPU is derived from allocations (simulated GPUs).
	GPUMeasured bool `json:"gpu_measured"`
}

// GangStatus is a gang's line in the cluster status.
type GangStatus struct {
	Job   string    `json:"job"`
	Name  string    `json:"name"`
	State GangState `json:"state"`
	// Workers is the gang's size; Ready how many of its workers are up.
	Workers    int      `json:"workers"`
	Ready      int      `json:"ready"`
	Generation int      `json:"generation"`
	Restarts   int      `json:"restarts"`
	Machines   []string `json:"machines,omitempty"`
	// Reason says why the gang waits, restarted, failed or stopped.
	Reason string `json:"reason,omitempty"`
	// Queue is the gang's queue; GPUs the cards its placement holds.
	Queue string `json:"queue,omitempty"`
	GPUs  int    `json:"gpus,omitempty"`
	// Priority is its resolved priority; MinWorkers..MaxWorkers its range when elastic.
	Priority   int `json:"priority,omitempty"`
	MinWorkers int `json:"min_workers,omitempty"`
	MaxWorkers int `json:"max_workers,omitempty"`
	// Preemptions and Resizes count what it went through; Notice is the one it is given.
	Preemptions int           `json:"preemptions,omitempty"`
	Resizes     int           `json:"resizes,omitempty"`
	Notice      *NoticeStatus `json:"notice,omitempty"`
}

// NoticeStatus is a notice as the cluster status shows it (a driver is handed its gang's
// notices as Notice, on Gang.Notices).
type NoticeStatus struct {
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
	// Costs are the scheduler's estimate of what the eviction costs.
	Costs *EvictionCosts `json:"costs,omitempty"`
}

// PoolsStatus is the autoscaler's part of the status.
type PoolsStatus struct {
	Pools  []PoolStatus `json:"pools"`
	Events []PoolEvent  `json:"events,omitempty"`
}

// MarshalJSON writes the pools as a list, [] when there are none (never null).
func (s PoolsStatus) MarshalJSON() ([]byte, error) {
	type plain PoolsStatus
	p := plain(s)
	p.Pools = orEmpty(p.Pools)
	return json.Marshal(p)
}

// PoolStatus is an autoscaling pool's line in the cluster status.
type PoolStatus struct {
	Name string `json:"name"`
	// Capacity is the pool's capacity type (on-demand or spot); Provider what launches
	// its machines.
	Capacity string `json:"capacity"`
	Provider string `json:"provider"`
	// Min and Max bound its machines.
	Min          int           `json:"min"`
	Max          int           `json:"max"`
	PricePerHour float64       `json:"price_per_hour"`
	Machines     []PoolMachine `json:"machines,omitempty"`
	// Launching counts the machines being launched; CostUSD is what the pool has cost.
	Launching int     `json:"launching"`
	CostUSD   float64 `json:"cost_usd"`
	// SpotUnavailable says the provider lately had no spot capacity (the pool backs off).
	SpotUnavailable bool `json:"spot_unavailable,omitempty"`
}

// PoolMachine is one machine of a pool. Its JSON writes the durations as Go's duration
// text ("1m30s").
type PoolMachine struct {
	Name  string    `json:"name"`
	State string    `json:"state"`
	Since time.Time `json:"since"`
	// IdleFor is how long it has been idle (0 while it hosts gangs); IdleTimeout its pool's.
	IdleFor     time.Duration `json:"idle_for,omitempty"`
	IdleTimeout time.Duration `json:"idle_timeout,omitempty"`
	// Notice is when a spot interruption notice for it arrived, if one did.
	Notice time.Time `json:"notice,omitempty"`
}

// MarshalJSON writes the machine as the cluster's API does (durations as text).
func (m PoolMachine) MarshalJSON() ([]byte, error) { return json.Marshal(toAPIPoolMachine(m)) }

// UnmarshalJSON reads what MarshalJSON writes.
func (m *PoolMachine) UnmarshalJSON(b []byte) error { return unmarshalPoolMachine(b, m) }

// PoolEvent says why a machine was added or removed, or why a gang gets no machines.
type PoolEvent struct {
	Time time.Time `json:"time"`
	// Kind is launch, drain, remove, preempt, infeasible or launch-failed.
	Kind    string `json:"kind"`
	Pool    string `json:"pool,omitempty"`
	Machine string `json:"machine,omitempty"`
	Gang    string `json:"gang,omitempty"`
	Reason  string `json:"reason"`
}

// QueueStatus is a queue's line in the cluster status.
type QueueStatus struct {
	Name   string  `json:"name"`
	Weight float64 `json:"weight"`
	// QuotaGPUs caps, in whole GPUs, what the queue holds while others wait (0: none).
	QuotaGPUs int `json:"quota_gpus,omitempty"`
	// Pending and Running count its gangs; GPUs the cards they hold.
	Pending int `json:"pending"`
	Running int `json:"running"`
	GPUs    int `json:"gpus"`
	// Share is the queue's use over its fair share (the scheduler's DRF ratio).
	Share float64 `json:"share"`
}

// orEmpty returns s, or an empty slice for a nil one (which JSON writes as null).
func orEmpty[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// Machine is a machine of the cluster as its agent registered it.
type Machine struct {
	Name string `json:"name"`
	// Rack is the machine's rack number (machines of a rack are placed together).
	Rack int `json:"rack"`
	// Spec is the machine's topology: declared (simulated) or discovered.
	Spec *topology.MachineSpec `json:"spec"`
	// Simulated says the GPUs are declared, not real hardware.
	Simulated bool `json:"simulated"`
	// Agent is where the machine's agent serves.
	Agent AgentAddrs `json:"agent"`
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

// AgentAddrs are where a machine's agent serves.
type AgentAddrs struct {
	// API is the agent's HTTP API (logs, objects, kills), host:port.
	API string `json:"api"`
	// Transfer is the object store's transfer server, host:port.
	Transfer string `json:"transfer"`
	// Serf is the agent's gossip address, host:port ("" without membership).
	Serf string `json:"serf,omitempty"`
	// CheckpointDir is the shared checkpoint directory the agent mounts ("" without one).
	CheckpointDir string `json:"checkpoint_dir,omitempty"`
}
