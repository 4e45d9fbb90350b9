package runtime

import (
	"fmt"
	"sort"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/atoll-run/atoll/gang"
	"github.com/atoll-run/atoll/gang/sim"
	"github.com/atoll-run/atoll/topology"
)

// Releaser is implemented by placers that keep state about placed gangs; the head calls
// Release when a gang's GPUs are freed.
type Releaser interface {
	Release(job, gangName string) error
}

// GangPlacer places gangs with the gang scheduler core (package gang): each gang is
// submitted and a scheduling cycle runs at once, so the core's filters and score plugins
// (topology with the modeled AllReduce time, fragmentation, load, priority) decide where it
// goes. It is the embedded default's placer.
//
// The runtime binds gangs synchronously and does not yet stop running gangs for others, so
// it submits every gang as not preemptible; preemption is exercised by the simulator
// (gang/sim), which drives the same core.
type GangPlacer struct {
	mu    sync.Mutex
	s     *gang.Scheduler
	first []int // global id of each machine's GPU 0
	clock func() time.Time
}

var (
	_ Placer   = (*GangPlacer)(nil)
	_ Releaser = (*GangPlacer)(nil)
)

// NewGangPlacer builds the scheduler core over the cluster's machines and its topology's
// bandwidth model.
func NewGangPlacer(c *Cluster, cfg gang.Config, log *zap.Logger) (*GangPlacer, error) {
	if c.Topology == nil {
		return nil, fmt.Errorf("%w: the gang placer needs a cluster built from a topology", ErrInvalidRequest)
	}
	if log == nil {
		log = zap.NewNop()
	}
	s, err := gang.New(cfg, sim.SnapshotFromTopology(c.Topology),
		gang.WithCollectiveModel(sim.NewTopologyModel(c.Topology, topology.Best)), gang.WithLogger(log))
	if err != nil {
		return nil, fmt.Errorf("runtime: gang scheduler: %w", err)
	}
	p := &GangPlacer{s: s, clock: time.Now}
	for _, m := range c.Machines {
		first := 0
		if len(m.GPUs) > 0 {
			first = m.GPUs[0].Global
		}
		p.first = append(p.first, first)
	}
	return p, nil
}

func gangID(job, name string) string { return job + "/" + name }

// Place implements Placer: submit, run one cycle, and report this gang's placement with
// its scores. A gang the cycle does not place is withdrawn, with the scheduler's reason.
func (p *GangPlacer) Place(req GangRequest, c *Cluster, _ []bool) (Placement, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.clock()
	id := gangID(req.Job, req.Gang)
	st, err := p.s.Submit(gang.Request{
		ID: id, Priority: req.Priority, Min: req.Members,
		Member:     gang.Member{GPUs: req.GPUsPerMember, GPUMilli: gang.Milli},
		SameIsland: req.SameIsland, AllReduceBytes: req.AllReduceBytes, NotPreemptible: true,
	}, now)
	if err != nil {
		return Placement{}, fmt.Errorf("%w: %v", ErrNeverFits, err)
	}
	if st.State == gang.Rejected {
		return Placement{}, fmt.Errorf("%w: gang %q: %s", ErrNeverFits, req.Gang, st.Reason)
	}
	d := p.s.Cycle(now)
	for _, pl := range d.Placements {
		if pl.Gang == id {
			return p.convert(c, pl), nil
		}
	}
	reason := st.State.String()
	for _, w := range d.Waiting {
		if w.Gang == id {
			reason = w.Reason
		}
	}
	_ = p.s.Finish(id, now)
	return Placement{}, fmt.Errorf("%w: gang %q: %s", ErrNoCapacity, req.Gang, reason)
}

// Release implements Releaser.
func (p *GangPlacer) Release(job, gangName string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.s.Finish(gangID(job, gangName), p.clock())
}

func (p *GangPlacer) convert(c *Cluster, pl gang.Placement) Placement {
	members := make([]MemberPlacement, len(pl.Members))
	for i, m := range pl.Members {
		mp := MemberPlacement{Machine: m.Node, MachineName: m.NodeName}
		for _, g := range m.GPUs {
			mp.GPUs = append(mp.GPUs, p.first[m.Node]+g)
		}
		sort.Ints(mp.GPUs)
		members[i] = mp
	}
	out := finishPlacement(c, members, "gang")
	for _, s := range pl.Scores {
		out.Scores[s.Plugin] = s.Score
		out.Scores[s.Plugin+"_weight"] = s.Weight
	}
	out.Scores["total"] = pl.Total
	out.Scores["allreduce_us"] = float64(pl.AllReduce.Microseconds())
	out.Scores["machines_crossed"] = float64(pl.Machines)
	out.Scores["racks_crossed"] = float64(pl.Racks)
	return out
}
