package head

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"time"

	"go.uber.org/zap"

	"github.com/atoll-run/atoll/runtime/api"
)

// PoolView is what the pools autoscaler (runtime/autoscale) reads of the control
// plane: the narrow hook of issue 12. It is taken under the controller's lock, after the
// scheduling cycles that ran so far: the pending gangs are those the scheduler could not
// place on the machines there are.
type PoolView struct {
	Now      time.Time
	Machines []PoolMachine
	// Pending are the gangs waiting for capacity; Running the placed, live ones.
	Pending []api.Gang
	Running []api.Gang
}

// PoolMachine is a registered machine as the autoscaler sees it.
type PoolMachine struct {
	Name  string
	Alive bool
	// Gangs maps the live gangs with members on it ("job/gang") to their member counts.
	Gangs map[string]int
	// LastCopies counts objects whose only copy is in this machine's store; LastCopyObjects
	// names up to MaxLastCopyObjects of them, to be copied elsewhere before it goes.
	LastCopies      int
	LastCopyObjects []ObjectCopy
	Cordoned        bool
	// AgentAPI is its agent's API URL.
	AgentAPI string
}

// ObjectCopy is an object (its id) and the holder its copies are held for (its owner).
type ObjectCopy struct {
	ID, Owner string
}

// MaxLastCopyObjects bounds the last copies a PoolView names per machine.
const MaxLastCopyObjects = 64

// PoolView returns the view, or the error of a replica that does not lead.
func (c *Controller) PoolView() (PoolView, error) {
	t, err := c.lockTerm()
	if err != nil {
		return PoolView{}, err
	}
	defer c.mu.Unlock()
	v := PoolView{Now: c.cfg.Clock()}
	byTransfer := map[string]string{}
	idx := map[string]int{}
	for name, m := range t.machines {
		idx[name] = len(v.Machines)
		v.Machines = append(v.Machines, PoolMachine{Name: name, Alive: m.rec.Alive, Gangs: map[string]int{}, Cordoned: t.cordons[name] != nil, AgentAPI: m.rec.Agent.API})
		if m.rec.Agent.Transfer != "" {
			byTransfer[m.rec.Agent.Transfer] = name
		}
	}
	for _, g := range t.gangs {
		switch {
		case g.rec.State == api.GangPending:
			v.Pending = append(v.Pending, g.rec)
		case g.rec.State.Live() && g.rec.Placement != nil:
			v.Running = append(v.Running, g.rec)
			for _, m := range g.rec.Placement.Members {
				if i, ok := idx[m.Machine]; ok {
					v.Machines[i].Gangs[g.rec.Spec.Key()]++
				}
			}
		}
	}
	for _, kv := range c.sm.Range(api.TableObjects) {
		var rec struct {
			ID        string   `json:"id"`
			Owner     string   `json:"owner"`
			Locations []string `json:"locations"`
		}
		if json.Unmarshal(kv.Value, &rec) != nil || len(rec.Locations) == 0 {
			continue
		}
		// Its last copy is on a machine when that machine is the only alive one that holds
		// a copy, or when every alive machine that holds one is cordoned (draining: they
		// would go together, and the object with them); then it is counted on the first of
		// them, whose removal waits until it is copied elsewhere. A copy off the machines
		// (the shared checkpoint directory, a driver's store) leaves it uncounted.
		var holders []string
		elsewhere, cordoned := false, true
		for _, l := range rec.Locations {
			name, ok := byTransfer[l]
			switch {
			case !ok:
				elsewhere = true
			case t.machines[name].rec.Alive:
				holders = append(holders, name)
				cordoned = cordoned && t.cordons[name] != nil
			}
		}
		if elsewhere || len(holders) == 0 || len(holders) > 1 && !cordoned {
			continue
		}
		pm := &v.Machines[idx[slices.Min(holders)]]
		pm.LastCopies++
		if len(pm.LastCopyObjects) < MaxLastCopyObjects && rec.ID != "" {
			pm.LastCopyObjects = append(pm.LastCopyObjects, ObjectCopy{ID: rec.ID, Owner: rec.Owner})
		}
	}
	sort.Slice(v.Machines, func(i, j int) bool { return v.Machines[i].Name < v.Machines[j].Name })
	sort.Slice(v.Pending, func(i, j int) bool { return v.Pending[i].Spec.Key() < v.Pending[j].Spec.Key() })
	sort.Slice(v.Running, func(i, j int) bool { return v.Running[i].Spec.Key() < v.Running[j].Spec.Key() })
	return v, nil
}

// SetPoolInterrupt gives the controller the pools runner's injection of interruption
// notices (InjectInterruption).
func (c *Controller) SetPoolInterrupt(f func(machine string, after time.Duration) error) {
	c.mu.Lock()
	c.poolInterrupt = f
	c.mu.Unlock()
}

// InjectInterruption injects a spot interruption notice for a pool machine (a drill of
// the notice path). Only the leader's pools runner acts.
func (c *Controller) InjectInterruption(r api.InterruptRequest) error {
	if _, err := c.lockTerm(); err != nil {
		return err
	}
	f := c.poolInterrupt
	c.mu.Unlock()
	if f == nil {
		return fmt.Errorf("%w: this cluster runs no pools (atoll up --pools FILE)", api.ErrInvalid)
	}
	return f(r.Machine, time.Duration(r.After))
}

// SetPoolStatus gives the controller the pools runner's status, shown by Status.
// With pools the cluster can grow: gangs larger than it is now queue instead of being
// refused, and they queue even before any machine has registered.
func (c *Controller) SetPoolStatus(f func() *api.PoolsStatus) {
	c.mu.Lock()
	c.poolStatus = f
	t := c.t
	if t == nil {
		c.mu.Unlock()
		return
	}
	now := c.cfg.Clock()
	work := c.reconfigureLocked(t, now)
	work = append(work, c.cycleLocked(t, now)...)
	ch := c.enqueueLocked(t, work)
	c.notifyLocked()
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := await(ctx, ch); err != nil {
		c.log.Warn("giving the scheduler the pools", zap.Error(err))
	}
}
