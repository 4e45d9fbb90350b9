package runtime

import (
	"fmt"
	"sort"
)

// GangRequest asks for the GPUs of a gang: Members workers of GPUsPerMember whole GPUs each,
// every member's GPUs on one machine.
type GangRequest struct {
	// Job and Gang name the gang.
	Job, Gang string
	// Members is the number of workers.
	Members int
	// GPUsPerMember is the number of whole GPUs each worker gets, on one machine.
	GPUsPerMember int
	// SameIsland requires every member inside one NVLink island (data-parallel training whose
	// AllReduce must stay on NVLink).
	SameIsland bool
	// Priority orders gangs (higher first) where a placer cares.
	Priority int
	// AllReduceBytes is the size of the gang's typical AllReduce (its gradients), for the
	// topology score's modeled AllReduce time. Zero: a default size.
	AllReduceBytes int64
}

// GPUs is the number of GPUs the whole gang needs.
func (r GangRequest) GPUs() int { return r.Members * r.GPUsPerMember }

// Validate rejects malformed requests and those that can never fit on c.
func (r GangRequest) Validate(c *Cluster) error {
	switch {
	case r.Job == "" || r.Gang == "":
		return fmt.Errorf("%w: gang request needs a job and a gang name (got %q, %q)", ErrInvalidRequest, r.Job, r.Gang)
	case r.Members <= 0:
		return fmt.Errorf("%w: gang %q asks for %d members, want at least 1", ErrInvalidRequest, r.Gang, r.Members)
	case r.GPUsPerMember <= 0:
		return fmt.Errorf("%w: gang %q asks for %d GPUs per member, want at least 1", ErrInvalidRequest, r.Gang, r.GPUsPerMember)
	}
	if total := c.NumGPUs(); r.GPUs() > total {
		return fmt.Errorf("%w: gang %q needs %d GPUs (%d x %d) but the whole cluster has %d", ErrNeverFits, r.Gang, r.GPUs(), r.Members, r.GPUsPerMember, total)
	}
	maxMachine := 0
	for _, m := range c.Machines {
		maxMachine = max(maxMachine, len(m.GPUs))
	}
	if r.GPUsPerMember > maxMachine {
		return fmt.Errorf("%w: gang %q asks for %d GPUs per member but the largest machine has %d", ErrNeverFits, r.Gang, r.GPUsPerMember, maxMachine)
	}
	if r.SameIsland {
		if li := c.LargestIsland(); r.GPUs() > li {
			return fmt.Errorf("%w: gang %q needs %d GPUs inside one NVLink island but the largest island has %d", ErrNeverFits, r.Gang, r.GPUs(), li)
		}
	}
	return nil
}

// MemberPlacement is where one member (rank) of a gang runs.
type MemberPlacement struct {
	// Machine is the machine's index in Cluster.Machines; MachineName its name.
	Machine     int
	MachineName string
	// GPUs are the global ids of the member's GPUs.
	GPUs []int
	// Islands are the islands those GPUs belong to.
	Islands []int
}

// Placement is a placer's decision for one gang.
type Placement struct {
	// Members, by rank.
	Members []MemberPlacement
	// Islands are the distinct islands the gang uses, sorted.
	Islands []int
	// Machines are the distinct machine indexes the gang uses, sorted.
	Machines []int
	// Scores are the placer's per-concern scores, for display (higher is better).
	Scores map[string]float64
	// Placer names the placer that decided.
	Placer string
}

// GPUs lists every global GPU id of the placement, by rank.
func (p Placement) GPUs() []int {
	var out []int
	for _, m := range p.Members {
		out = append(out, m.GPUs...)
	}
	return out
}

// Placer decides where a gang goes. It is pure: the cluster and which GPUs are free in,
// a placement (all members or none) out. It must not keep free; it may read it only during
// the call. It returns an error wrapping ErrNoCapacity when the gang does not fit now.
type Placer interface {
	Place(req GangRequest, c *Cluster, free []bool) (Placement, error)
}

// FirstFit is the walking skeleton's placer: the first island (or, without SameIsland, the
// first machines) with room for every member, members filled machine by machine. The gang
// scheduler (package gang) replaces it.
type FirstFit struct{}

var _ Placer = FirstFit{}

// Place implements Placer.
func (FirstFit) Place(req GangRequest, c *Cluster, free []bool) (Placement, error) {
	var groups [][]int
	if req.SameIsland {
		groups = c.Islands
	} else {
		all := make([]int, 0, len(free))
		for g := range free {
			all = append(all, g)
		}
		groups = [][]int{all}
	}
	for _, group := range groups {
		if members, ok := fillGroup(req, c, group, free); ok {
			return finishPlacement(c, members, "first-fit"), nil
		}
	}
	return Placement{}, fmt.Errorf("%w: gang %q needs %d x %d GPUs%s", ErrNoCapacity, req.Gang, req.Members, req.GPUsPerMember,
		map[bool]string{true: " inside one island", false: ""}[req.SameIsland])
}

// fillGroup assigns members to free GPUs of group, each member on one machine.
func fillGroup(req GangRequest, c *Cluster, group []int, free []bool) ([]MemberPlacement, bool) {
	byMachine := map[int][]int{}
	var order []int
	for _, g := range group {
		if !free[g] {
			continue
		}
		gpu, _ := c.GPU(g)
		if _, ok := byMachine[gpu.Machine]; !ok {
			order = append(order, gpu.Machine)
		}
		byMachine[gpu.Machine] = append(byMachine[gpu.Machine], g)
	}
	sort.Ints(order)
	members := make([]MemberPlacement, 0, req.Members)
	for _, m := range order {
		gpus := byMachine[m]
		for len(gpus) >= req.GPUsPerMember && len(members) < req.Members {
			members = append(members, MemberPlacement{Machine: m, MachineName: c.Machines[m].Name, GPUs: gpus[:req.GPUsPerMember:req.GPUsPerMember]})
			gpus = gpus[req.GPUsPerMember:]
		}
	}
	return members, len(members) == req.Members
}

func finishPlacement(c *Cluster, members []MemberPlacement, placer string) Placement {
	islands, machines := map[int]bool{}, map[int]bool{}
	for i := range members {
		seen := map[int]bool{}
		for _, g := range members[i].GPUs {
			gpu, _ := c.GPU(g)
			islands[gpu.Island], machines[gpu.Machine] = true, true
			if !seen[gpu.Island] {
				seen[gpu.Island] = true
				members[i].Islands = append(members[i].Islands, gpu.Island)
			}
		}
	}
	p := Placement{Members: members, Placer: placer, Scores: map[string]float64{}}
	for i := range islands {
		p.Islands = append(p.Islands, i)
	}
	for m := range machines {
		p.Machines = append(p.Machines, m)
	}
	sort.Ints(p.Islands)
	sort.Ints(p.Machines)
	p.Scores["islands_crossed"] = float64(len(p.Islands))
	return p
}
