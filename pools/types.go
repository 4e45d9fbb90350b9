package pools

import "time"

// Member is what one member of a gang asks for: whole cards on one machine, CPU and memory.
// (GPU shares and MIG slices are served by machines already there; the autoscaler sizes
// whole-card demand, and treats a share or a slice as one card.)
type Member struct {
	GPUs     int      `json:"gpus"`
	CPUMilli int64    `json:"cpu_milli,omitempty"`
	MemMiB   int64    `json:"mem_mib,omitempty"`
	Models   []string `json:"models,omitempty"` // allowed GPU models; empty = any
}

// Gang is a gang the autoscaler sizes capacity for: pending (the scheduler could not place
// it), running (on a machine that got an interruption notice), or forecast.
type Gang struct {
	ID     string `json:"id"`
	Member Member `json:"member"`
	// Size is the number of members, all placed together.
	Size int `json:"size"`
	// SameIsland keeps every member in one NVLink island.
	SameIsland bool `json:"same_island,omitempty"`
	// Tolerant says the gang survives an interruption: it checkpoints and may be preempted.
	// Only tolerant gangs are given spot machines.
	Tolerant bool `json:"tolerant,omitempty"`
	// Priority orders pending gangs (larger first), then Arrived, then ID.
	Priority int       `json:"priority,omitempty"`
	Arrived  time.Time `json:"arrived"`
	// Pool pins the gang to one pool; empty lets the autoscaler choose.
	Pool string `json:"pool,omitempty"`
	// MoveCost is what moving the gang costs each of its cards, in time: its checkpoint
	// written, its restart and the checkpoint read back (measured, or declared). Zero when not
	// known: consolidation then weighs moves as free.
	MoveCost time.Duration `json:"move_cost,omitempty"`
}

// MachineState is where a pool's machine is in its life.
type MachineState int

// Machine states.
const (
	// Launching: asked of the provider, not registered yet.
	Launching MachineState = iota + 1
	// Ready: registered; takes gangs.
	Ready
	// Draining: takes no gangs; its last object copies move away and its gangs finish (or are
	// preempted through the notice path); then it is removed.
	Draining
)

// String returns the state's name.
func (s MachineState) String() string {
	switch s {
	case Launching:
		return "launching"
	case Ready:
		return "ready"
	case Draining:
		return "draining"
	}
	return "unknown"
}

// Hosted is a gang with members on a machine.
type Hosted struct {
	Gang    string `json:"gang"`
	Members int    `json:"members"`
	// Stopping says the gang was already asked to checkpoint and stop.
	Stopping bool `json:"stopping,omitempty"`
}

// Machine is one machine of a pool as the autoscaler sees it.
type Machine struct {
	Name  string       `json:"name"`
	Pool  string       `json:"pool"`
	State MachineState `json:"state"`
	// Domain is the machine's NVLink domain (rack) within its pool, for rack-fabric
	// machine types; 0 otherwise.
	Domain int `json:"domain,omitempty"`
	// Since is when the machine entered its state (launch asked, registered, drain began).
	Since time.Time `json:"since"`
	// Gangs are the gangs with members on it; IdleSince is when it last became free of
	// them (zero while it hosts any). A ready machine without gangs is idle; it is drained
	// for its pool's idle timeout only once IdleSince is set.
	Gangs     []Hosted  `json:"gangs,omitempty"`
	IdleSince time.Time `json:"idle_since"`
	// Changed is when a gang last came onto or left the machine; zero when the caller does
	// not track it, and then the machine is never consolidated (Config.Consolidate).
	Changed time.Time `json:"changed"`
	// LastCopies counts objects whose only copy lives on this machine.
	LastCopies int `json:"last_copies,omitempty"`
	// Notice, when set, is when the provider takes the machine back (a spot interruption).
	Notice time.Time `json:"notice"`
}

// PoolState is a pool in a snapshot: its config and what the caller tracks of it.
type PoolState struct {
	Pool *Pool
	// SpotUnavailable says the provider has no spot capacity now (a launch failed with
	// insufficient capacity, or it was interrupted recently); tolerant gangs fall back to
	// on-demand pools.
	SpotUnavailable bool
	// Spent is the pool's cost so far, in USD.
	Spent float64
}

// Snapshot is what one decision reads.
type Snapshot struct {
	Now      time.Time
	Pools    []PoolState
	Machines []Machine
	// Pending are the gangs the scheduler could not place on the machines there are.
	Pending []Gang
	// Running are the placed gangs: read to size the replacement of those on machines with a
	// notice, and for the cards, CPU and memory of those a consolidation would move.
	Running []Gang
	// Forecast are gangs expected to arrive within the launch latency (Forecaster); capacity
	// is pre-warmed for them when a pool has room. Empty when prediction is off.
	Forecast []Gang
}

// Launch asks a pool's provider for machines.
type Launch struct {
	Pool     string   `json:"pool"`
	Capacity Capacity `json:"capacity"`
	Count    int      `json:"count"`
	// Domain is the NVLink domain (rack) the machines join, for rack-fabric types.
	Domain int `json:"domain,omitempty"`
	// Gangs are the gangs the machines are for (whole gangs: every machine a gang needs is
	// in the same decision).
	Gangs []string `json:"gangs,omitempty"`
	// Prewarm marks capacity launched for forecast demand; Replaces the machine a
	// replacement is for.
	Prewarm  bool   `json:"prewarm,omitempty"`
	Replaces string `json:"replaces,omitempty"`
	Reason   string `json:"reason"`
}

// Drain stops a machine from taking gangs and moves its last object copies away.
type Drain struct {
	Machine string `json:"machine"`
	Pool    string `json:"pool"`
	// MoveObjects is the number of objects whose last copy must be copied elsewhere before
	// the machine goes.
	MoveObjects int    `json:"move_objects,omitempty"`
	Reason      string `json:"reason"`
}

// Preempt asks a gang to checkpoint and stop before Deadline (the notice path): it restarts
// from that checkpoint elsewhere.
type Preempt struct {
	Gang     string    `json:"gang"`
	Machine  string    `json:"machine"`
	Deadline time.Time `json:"deadline"`
	Reason   string    `json:"reason"`
}

// Remove terminates a drained machine.
type Remove struct {
	Machine string `json:"machine"`
	Pool    string `json:"pool"`
	Reason  string `json:"reason"`
}

// Verdict explains a gang the decision launched nothing for.
type Verdict struct {
	Gang   string `json:"gang"`
	Reason string `json:"reason"`
}

// Decision is what one decision asks the caller to do. Preemptions come before the
// removal of their machine: a machine is removed only in a later decision, once its
// gangs are gone and its last copies moved (or once its provider took it).
type Decision struct {
	Launches    []Launch  `json:"launches,omitempty"`
	Drains      []Drain   `json:"drains,omitempty"`
	Preemptions []Preempt `json:"preemptions,omitempty"`
	Removes     []Remove  `json:"removes,omitempty"`
	// Infeasible gangs can never be placed on any pool (they are reported, not retried);
	// Waiting gangs wait for capacity already launching, or for room in a pool (max, budget).
	Infeasible []Verdict `json:"infeasible,omitempty"`
	Waiting    []Verdict `json:"waiting,omitempty"`
}

// Machines returns the number of machines the decision launches.
func (d *Decision) Machines() int {
	n := 0
	for _, l := range d.Launches {
		n += l.Count
	}
	return n
}
