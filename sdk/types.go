package sdk

import (
	"encoding/json"
	"maps"
	"slices"
	"time"

	"github.com/atoll-run/atoll/runtime/api"
)

// The SDK's types are converted from the cluster API's records here, at the boundary:
// field for field, slices and maps copied, so that a value handed to a program shares
// nothing with the SDK's own state.

func fromAPIMember(m api.Member) Member {
	return Member{Machine: m.Machine, GPUs: slices.Clone(m.GPUs), UUIDs: slices.Clone(m.UUIDs), Islands: slices.Clone(m.Islands),
		Milli: m.Milli, MIG: m.MIG, CPUMilli: m.CPUMilli, MemMiB: m.MemMiB, Removed: m.Removed, GPUModel: m.GPUModel}
}

func fromAPIPlacement(p api.Placement) Placement {
	return Placement{Members: convert(p.Members, fromAPIMember), Islands: p.Islands, Machines: slices.Clone(p.Machines),
		Scores: maps.Clone(p.Scores)}
}

func fromAPIWorker(w api.Worker) WorkerInfo {
	return WorkerInfo{Job: w.Job, Gang: w.Gang, Rank: w.Rank, Generation: w.Generation, GangUID: w.GangUID, Machine: w.Machine,
		Address: w.Address, ActorID: w.ActorID, Collective: w.Collective, Transfer: w.Transfer, PID: w.PID, Started: w.Started, Exit: w.Exit}
}

func fromAPIEvictionCosts(c *api.EvictionCosts) *EvictionCosts {
	if c == nil {
		return nil
	}
	return &EvictionCosts{WorkLost: c.WorkLost, Checkpoint: c.Checkpoint, Restore: c.Restore, CUDAContext: c.CUDAContext,
		Communicator: c.Communicator, GPUSeconds: c.GPUSeconds}
}

func fromAPIMachine(m api.Machine) Machine {
	return Machine{Name: m.Name, Rack: m.Rack, Spec: m.Spec, Simulated: m.Simulated,
		Agent: AgentAddrs{API: m.Agent.API, Transfer: m.Agent.Transfer, Serf: m.Agent.Serf, CheckpointDir: m.Agent.CheckpointDir},
		PID:   m.PID, Host: m.Host, Alive: m.Alive, Incarnation: m.Incarnation, Registered: m.Registered, Reason: m.Reason}
}

func fromAPIStatus(s api.Status) Status {
	return Status{Leader: s.Leader, Term: s.Term, Heads: convert(s.Heads, fromAPIHead), Machines: convert(s.Machines, fromAPIMachineStatus),
		Gangs: convert(s.Gangs, fromAPIGangStatus), Revision: s.Revision, Dashboard: s.Dashboard, Pools: fromAPIPools(s.Pools),
		Queues: convert(s.Queues, fromAPIQueue), Objects: fromAPIObjects(s.Objects), Services: convert(s.Services, fromAPIServiceStatus)}
}

func fromAPIServiceStatus(s api.ServiceStatus) ServiceStatus {
	return ServiceStatus{Job: s.Job, Name: s.Name, State: string(s.State), MinReplicas: s.MinReplicas, MaxReplicas: s.MaxReplicas, Replicas: s.Replicas,
		Ready: s.Ready, InFlight: s.InFlight, LatencyMS: s.LatencyMS, LatencySLOMS: s.LatencySLOMS, GPUs: s.GPUs, ScaleUps: s.ScaleUps,
		ScaleDowns: s.ScaleDowns, Reason: s.Reason}
}

func fromAPIObjects(o *api.ObjectsStatus) *ObjectsStatus {
	if o == nil {
		return nil
	}
	return &ObjectsStatus{Records: o.Records, Live: o.Live, Durable: o.Durable, Lost: o.Lost, OwnerDied: o.OwnerDied, LiveBytes: o.LiveBytes}
}

func fromAPIHead(h api.HeadInfo) HeadStatus {
	return HeadStatus{ID: h.ID, Address: h.Address, Serf: h.Serf, PID: h.PID, Leader: h.Leader, DiskFull: h.DiskFull, Error: h.Error}
}

func fromAPIMachineStatus(m api.MachineStatus) MachineStatus {
	out := MachineStatus{Name: m.Name, GPUs: m.GPUs, FreeGPUs: m.FreeGPUs, Alive: m.Alive, PID: m.PID, Simulated: m.Simulated,
		Rack: m.Rack, Agent: m.Agent, Cordoned: m.Cordoned, CordonReason: m.CordonReason, CordonedBy: m.CordonedBy,
		CordonedAt: m.CordonedAt, Drained: m.Drained}
	if m.Load != nil {
		out.Load = &MachineLoad{CPU: m.Load.CPU, GPU: m.Load.GPU, Mem: m.Load.Mem, Net: m.Load.Net, GPUMeasured: m.Load.GPUMeasured}
	}
	return out
}

func fromAPIGangStatus(g api.GangStatus) GangStatus {
	return GangStatus{Job: g.Job, Name: g.Name, State: GangState(g.State), Workers: g.Workers, Ready: g.Ready, Generation: g.Generation,
		Restarts: g.Restarts, Machines: slices.Clone(g.Machines), Reason: g.Reason, Queue: g.Queue, GPUs: g.GPUs, Priority: g.Priority,
		MinWorkers: g.MinWorkers, MaxWorkers: g.MaxWorkers, Preemptions: g.Preemptions, Resizes: g.Resizes, Notice: fromAPINotice(g.Notice)}
}

func fromAPINotice(n *api.Notice) *NoticeStatus {
	if n == nil {
		return nil
	}
	return &NoticeStatus{Kind: NoticeKind(n.Kind), Issued: n.Issued, Deadline: n.Deadline, For: n.For, Reason: n.Reason, From: n.From,
		To: n.To, Remove: slices.Clone(n.Remove), Add: slices.Clone(n.Add), Costs: fromAPIEvictionCosts(n.Costs)}
}

func fromAPIPools(p *api.PoolsStatus) *PoolsStatus {
	if p == nil {
		return nil
	}
	return &PoolsStatus{Pools: convert(p.Pools, fromAPIPool), Events: convert(p.Events, fromAPIPoolEvent)}
}

func fromAPIPool(p api.PoolStatus) PoolStatus {
	return PoolStatus{Name: p.Name, Capacity: p.Capacity, Provider: p.Provider, Min: p.Min, Max: p.Max, PricePerHour: p.PricePerHour,
		Machines: convert(p.Machines, fromAPIPoolMachine), Launching: p.Launching, CostUSD: p.CostUSD, SpotUnavailable: p.SpotUnavailable}
}

func fromAPIPoolMachine(m api.PoolMachine) PoolMachine {
	return PoolMachine{Name: m.Name, State: m.State, Since: m.Since, IdleFor: time.Duration(m.IdleFor),
		IdleTimeout: time.Duration(m.IdleTimeout), Notice: m.Notice}
}

// toAPIPoolMachine is PoolMachine's JSON form.
func toAPIPoolMachine(m PoolMachine) api.PoolMachine {
	return api.PoolMachine{Name: m.Name, State: m.State, Since: m.Since, IdleFor: api.Duration(m.IdleFor),
		IdleTimeout: api.Duration(m.IdleTimeout), Notice: m.Notice}
}

func unmarshalPoolMachine(b []byte, m *PoolMachine) error {
	var w api.PoolMachine
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*m = fromAPIPoolMachine(w)
	return nil
}

func fromAPIPoolEvent(e api.PoolEvent) PoolEvent {
	return PoolEvent{Time: e.Time, Kind: e.Kind, Pool: e.Pool, Machine: e.Machine, Gang: e.Gang, Reason: e.Reason}
}

func fromAPIQueue(q api.QueueStatus) QueueStatus {
	return QueueStatus{Name: q.Name, Weight: q.Weight, QuotaGPUs: q.QuotaGPUs, Pending: q.Pending, Running: q.Running, GPUs: q.GPUs,
		Share: q.Share}
}

// convert maps a slice, keeping nil nil (an empty list and a missing one marshal apart).
func convert[A, B any](in []A, f func(A) B) []B {
	if in == nil {
		return nil
	}
	out := make([]B, len(in))
	for i, v := range in {
		out[i] = f(v)
	}
	return out
}
