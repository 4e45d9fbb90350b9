// Package autoscale runs the pools autoscaler on the leader head: it reads the control
// plane's view (pending gangs, machines and what they host), asks the pure core
// (pools.Autoscaler) for one decision, and carries it out through the pools' providers:
// launches, cordons (drains), removals. It keeps each pool machine's state, its idle timer
// and the cost so far, and says in events why each machine was added or removed.
//
// What it keeps is the leader's: a new leader rebuilds the pool machines from its
// providers' List (the providers are the source of truth of what exists, as for the
// Kubernetes cluster-autoscaler) and starts the cost from zero.
package autoscale

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/atoll-run/atoll/pools"
	"github.com/atoll-run/atoll/pools/provider"
	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/runtime/head"
)

// Controller is what the runner needs of the control plane (*head.Controller).
type Controller interface {
	Leading() bool
	PoolView() (head.PoolView, error)
	Cordon(ctx context.Context, name string, on bool) error
	// Drain gives every gang on a machine a drain notice (checkpoint, stop, queue again
	// elsewhere) due by deadline, and cordons it.
	Drain(ctx context.Context, machine string, deadline time.Time, reason string) error
	// MachineDown declares a machine dead: the runner terminated it. Without it the
	// machine's record stays alive until the failure detector notices, and every process
	// that reaches the machine's agent meanwhile (to free an object it held, to read a
	// copy) fails on a refused connection.
	MachineDown(ctx context.Context, name, reason string) error
}

// Provider is what the runner needs of a pool's provider.
type Provider interface {
	Launch(ctx context.Context, req provider.LaunchRequest) error
	Terminate(ctx context.Context, name string) error
	List(ctx context.Context) ([]provider.Instance, error)
}

// Config configures a Runner.
type Config struct {
	// Pools is the validated pool file; Providers has one provider per pool name.
	Pools     *pools.Set
	Providers map[string]Provider
	// Autoscaler tunes the core. Default pools.DefaultConfig().
	Autoscaler pools.Config
	// Interval is the time between decisions. Default 1 s.
	Interval time.Duration
	// LaunchTimeout is how long a launched machine may take to register before it is
	// terminated (and, for spot, the pool marked unavailable). Default 5 min.
	LaunchTimeout time.Duration
	// SpotBackoff is how long a spot pool is considered unavailable after a failed launch
	// or an interruption. Default 5 min.
	SpotBackoff time.Duration
	// Predict turns demand prediction on (pre-warm for forecast arrivals).
	Predict bool
	// Replicate copies an object into the store of the machine whose agent API is given,
	// held for holder (the head's CallAgent to /v1/objects/replicate). A draining machine's
	// last copies are moved with it before the machine is removed; nil leaves them, and
	// such a machine waits.
	Replicate func(ctx context.Context, agentAPI, id, holder string) error
	// Clock is the time source. Default time.Now.
	Clock  func() time.Time
	Logger *zap.Logger
}

// Runner is the pools autoscaler's driver.
type Runner struct {
	cfg  Config
	core *pools.Autoscaler
	ctl  Controller
	log  *zap.Logger

	mu       sync.Mutex
	synced   bool
	machines map[string]*machine
	pools    map[string]*poolState
	events   []api.PoolEvent
	moving   map[string]bool // objects whose last copy is being copied off a draining machine
	seen     map[string]bool // pending gangs already given to the forecaster
	fc       pools.Forecaster
	seq      int
	lastTick time.Time
}

type machine struct {
	pool      string
	state     pools.MachineState
	since     time.Time
	idleSince time.Time
	notice    time.Time
	hosts     map[string]int
	copies    int
	// moveBlocked: its last copies found no machine to go to (reported once).
	moveBlocked bool
}

type poolState struct {
	pool      *pools.Pool
	spent     float64
	noSpotTil time.Time
}

// New returns a runner over a controller.
func New(cfg Config, ctl Controller) (*Runner, error) {
	if cfg.Pools == nil || len(cfg.Pools.Pools) == 0 {
		return nil, fmt.Errorf("%w: no pools", pools.ErrSpec)
	}
	for _, p := range cfg.Pools.Pools {
		if cfg.Providers[p.Spec.Name] == nil {
			return nil, fmt.Errorf("%w: pool %s has no provider", pools.ErrSpec, p.Spec.Name)
		}
	}
	if cfg.Autoscaler == (pools.Config{}) {
		cfg.Autoscaler = pools.DefaultConfig()
	}
	if cfg.Interval == 0 {
		cfg.Interval = time.Second
	}
	if cfg.LaunchTimeout == 0 {
		cfg.LaunchTimeout = 5 * time.Minute
	}
	if cfg.SpotBackoff == 0 {
		cfg.SpotBackoff = 5 * time.Minute
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	core, err := pools.New(cfg.Autoscaler)
	if err != nil {
		return nil, err
	}
	r := &Runner{cfg: cfg, core: core, ctl: ctl, log: cfg.Logger.Named("pools"), machines: map[string]*machine{}, pools: map[string]*poolState{}, seen: map[string]bool{},
		moving: map[string]bool{}}
	for i := range cfg.Pools.Pools {
		p := &cfg.Pools.Pools[i]
		r.pools[p.Spec.Name] = &poolState{pool: p}
	}
	return r, nil
}

// Run decides every Interval until ctx ends; it acts only while the controller leads.
func (r *Runner) Run(ctx context.Context) {
	t := time.NewTicker(r.cfg.Interval)
	defer t.Stop()
	for {
		if r.ctl.Leading() {
			if err := r.Step(ctx); err != nil && ctx.Err() == nil {
				r.log.Warn("autoscaler step", zap.Error(err))
			}
		} else {
			r.mu.Lock()
			r.synced = false
			r.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (r *Runner) event(e api.PoolEvent) {
	r.events = append(r.events, e)
	if len(r.events) > 200 {
		r.events = r.events[len(r.events)-200:]
	}
	r.log.Info("pools: "+e.Kind, zap.String("pool", e.Pool), zap.String("machine", e.Machine), zap.String("gang", e.Gang), zap.String("reason", e.Reason))
}

// sync rebuilds the pool machines from the providers (a new leader).
func (r *Runner) sync(ctx context.Context, now time.Time) error {
	for name, prov := range r.cfg.Providers {
		list, err := prov.List(ctx)
		if err != nil {
			return fmt.Errorf("pools: list pool %s: %w", name, err)
		}
		for _, in := range list {
			if in.Pool != name || !in.Running {
				continue
			}
			r.mu.Lock()
			if r.machines[in.Name] == nil {
				r.machines[in.Name] = &machine{pool: name, state: pools.Launching, since: now, hosts: map[string]int{}}
			}
			r.mu.Unlock()
		}
	}
	r.mu.Lock()
	r.synced = true
	r.mu.Unlock()
	return nil
}

// Interrupt injects a spot interruption notice for one of the pools' machines, due after
// the delay: a drill of the notice path (drain, just-in-time checkpoints, replacement).
// Only providers that can inject one (local, docker, sim) do; a cloud's notices come from
// the cloud.
func (r *Runner) Interrupt(name string, after time.Duration) error {
	if after < 0 || after > 24*time.Hour {
		return fmt.Errorf("%w: interruption of %s after %s: want 0..24h", api.ErrInvalid, name, after)
	}
	r.mu.Lock()
	m := r.machines[name]
	r.mu.Unlock()
	if m == nil {
		return fmt.Errorf("%w: no machine %q in the pools", api.ErrNotFound, name)
	}
	in, ok := r.cfg.Providers[m.pool].(provider.Interrupter)
	if !ok {
		return fmt.Errorf("%w: the provider of pool %s cannot inject interruptions", api.ErrInvalid, m.pool)
	}
	return in.Interrupt(name, after)
}

// Step makes one decision and carries it out.
func (r *Runner) Step(ctx context.Context) error {
	now := r.cfg.Clock()
	r.mu.Lock()
	synced := r.synced
	r.mu.Unlock()
	if !synced {
		if err := r.sync(ctx, now); err != nil {
			return err
		}
	}
	view, err := r.ctl.PoolView()
	if err != nil {
		return err
	}
	var notices []provider.Notice
	for _, prov := range r.cfg.Providers {
		if in, ok := prov.(provider.Interrupter); ok {
			notices = append(notices, in.Notices()...)
		}
	}
	r.mu.Lock()
	snap := r.observeLocked(view, notices, now)
	r.mu.Unlock()
	d, err := r.core.Decide(snap)
	if err != nil {
		return err
	}
	err = r.act(ctx, d, now)
	r.moveLastCopies(ctx, view, now)
	return err
}

// observeLocked updates the machines from the view and builds the core's snapshot.
func (r *Runner) observeLocked(v head.PoolView, notices []provider.Notice, now time.Time) *pools.Snapshot {
	byName := map[string]*head.PoolMachine{}
	for i := range v.Machines {
		byName[v.Machines[i].Name] = &v.Machines[i]
	}
	// Cost so far: every machine that exists costs its pool's price.
	if !r.lastTick.IsZero() && now.After(r.lastTick) {
		dt := now.Sub(r.lastTick).Hours()
		for _, m := range r.machines {
			r.pools[m.pool].spent += dt * r.pools[m.pool].pool.Spec.PricePerHour
		}
	}
	r.lastTick = now
	for _, n := range notices {
		if m := r.machines[n.Machine]; m != nil {
			m.notice = n.Deadline
			r.event(api.PoolEvent{Time: now, Kind: "notice", Pool: m.pool, Machine: n.Machine, Reason: "spot interruption notice, machine goes at " + n.Deadline.UTC().Format(time.RFC3339)})
			r.pools[m.pool].noSpotTil = now.Add(r.cfg.SpotBackoff)
		}
	}
	names := make([]string, 0, len(r.machines))
	for name := range r.machines {
		names = append(names, name)
	}
	sort.Strings(names)
	s := &pools.Snapshot{Now: now}
	for _, name := range names {
		m := r.machines[name]
		vm := byName[name]
		switch {
		case m.state == pools.Launching && vm != nil && vm.Alive:
			m.state, m.since, m.idleSince = pools.Ready, now, now
		case m.state != pools.Launching && (vm == nil || !vm.Alive):
			r.event(api.PoolEvent{Time: now, Kind: "lost", Pool: m.pool, Machine: name, Reason: "its agent is gone"})
			delete(r.machines, name)
			continue
		}
		if vm != nil {
			busy := len(vm.Gangs) > 0
			if busy {
				m.idleSince = time.Time{}
			} else if m.idleSince.IsZero() {
				m.idleSince = now
			}
			m.hosts, m.copies = vm.Gangs, vm.LastCopies
		}
		pm := pools.Machine{Name: name, Pool: m.pool, State: m.state, Since: m.since, IdleSince: m.idleSince, LastCopies: m.copies, Notice: m.notice}
		hosted := make([]string, 0, len(m.hosts))
		for g := range m.hosts {
			hosted = append(hosted, g)
		}
		sort.Strings(hosted)
		for _, g := range hosted {
			pm.Gangs = append(pm.Gangs, pools.Hosted{Gang: g, Members: m.hosts[g]})
		}
		s.Machines = append(s.Machines, pm)
	}
	for _, p := range r.cfg.Pools.Pools {
		ps := r.pools[p.Spec.Name]
		s.Pools = append(s.Pools, pools.PoolState{Pool: ps.pool, Spent: ps.spent, SpotUnavailable: now.Before(ps.noSpotTil)})
	}
	for _, g := range v.Pending {
		pg := gangOf(g)
		s.Pending = append(s.Pending, pg)
		if r.cfg.Predict && !r.seen[pg.ID+"@"+g.Created.String()] {
			r.seen[pg.ID+"@"+g.Created.String()] = true
			r.fc.Observe(pg, g.Created)
		}
	}
	for _, g := range v.Running {
		s.Running = append(s.Running, gangOf(g))
	}
	if r.cfg.Predict {
		var horizon time.Duration
		for _, p := range r.cfg.Pools.Pools {
			horizon = max(horizon, time.Duration(p.Spec.LaunchLatency))
		}
		s.Forecast = r.fc.Forecast(now, max(horizon, time.Minute))
	}
	return s
}

// gangOf is the core's view of a runtime gang. A gang that may be restarted (MaxRestarts
// above 0) and is not marked NotPreemptible tolerates interruption: a notice stops it with
// a just-in-time checkpoint and it resumes elsewhere.
func gangOf(g api.Gang) pools.Gang {
	r := g.Spec.Resources
	gpus := r.GPUs
	if r.MIG != "" || (r.GPUMilli > 0 && r.GPUMilli < 1000) {
		gpus = 1
	}
	return pools.Gang{ID: g.Spec.Key(), Size: g.Spec.Workers, Member: pools.Member{GPUs: gpus, CPUMilli: r.CPUMilli, MemMiB: r.MemMiB},
		SameIsland: g.Spec.SameIsland, Tolerant: g.Spec.MaxRestarts > 0 && !g.Spec.NotPreemptible, Priority: g.Spec.Priority, Arrived: g.Created}
}

// act carries a decision out: launches, drains (cordons), removals; preemptions are
// reported (the runtime's notice path is issue 11's).
func (r *Runner) act(ctx context.Context, d pools.Decision, now time.Time) error {
	var errs []error
	for _, l := range d.Launches {
		p, _ := r.cfg.Pools.ByName(l.Pool)
		r.mu.Lock()
		var names []string
		for i := 0; i < l.Count; i++ {
			r.seq++
			names = append(names, fmt.Sprintf("%s-%s-%d", l.Pool, strconv.FormatInt(now.UnixMilli()%1e8, 36), r.seq))
		}
		for _, n := range names {
			r.machines[n] = &machine{pool: l.Pool, state: pools.Launching, since: now, hosts: map[string]int{}}
			r.event(api.PoolEvent{Time: now, Kind: "launch", Pool: l.Pool, Machine: n, Gang: strings.Join(l.Gangs, ","), Reason: l.Reason})
		}
		r.mu.Unlock()
		err := r.cfg.Providers[l.Pool].Launch(ctx, provider.LaunchRequest{Pool: l.Pool, Names: names, Machine: p.Spec.Machine, Spot: l.Capacity == pools.Spot, Rack: l.Domain})
		if err != nil {
			r.mu.Lock()
			for _, n := range names {
				delete(r.machines, n)
			}
			r.event(api.PoolEvent{Time: now, Kind: "launch-failed", Pool: l.Pool, Reason: err.Error()})
			if errors.Is(err, provider.ErrNoCapacity) {
				r.pools[l.Pool].noSpotTil = now.Add(r.cfg.SpotBackoff)
			}
			r.mu.Unlock()
			errs = append(errs, err)
		}
	}
	for _, dr := range d.Drains {
		if err := r.ctl.Cordon(ctx, dr.Machine, true); err != nil {
			errs = append(errs, err)
			continue
		}
		r.mu.Lock()
		if m := r.machines[dr.Machine]; m != nil {
			m.state, m.since = pools.Draining, now
		}
		r.event(api.PoolEvent{Time: now, Kind: "drain", Pool: dr.Pool, Machine: dr.Machine, Reason: dr.Reason})
		r.mu.Unlock()
	}
	// A spot interruption's gangs get the notice every planned stop takes: a just-in-time
	// checkpoint, a stop, a requeue on other machines (one drain per machine).
	drained := map[string]bool{}
	for _, p := range d.Preemptions {
		if !drained[p.Machine] {
			drained[p.Machine] = true
			if err := r.ctl.Drain(ctx, p.Machine, p.Deadline, p.Reason); err != nil {
				errs = append(errs, err)
			}
		}
		r.mu.Lock()
		r.event(api.PoolEvent{Time: now, Kind: "preempt", Machine: p.Machine, Gang: p.Gang,
			Reason: p.Reason + " (notice given: checkpoint and stop by " + p.Deadline.UTC().Format(time.RFC3339) + ", then resume elsewhere)"})
		r.mu.Unlock()
	}
	for _, rm := range d.Removes {
		if err := r.cfg.Providers[rm.Pool].Terminate(ctx, rm.Machine); err != nil {
			errs = append(errs, err)
			continue
		}
		r.mu.Lock()
		delete(r.machines, rm.Machine)
		r.event(api.PoolEvent{Time: now, Kind: "remove", Pool: rm.Pool, Machine: rm.Machine, Reason: rm.Reason})
		r.mu.Unlock()
		_ = r.ctl.Cordon(ctx, rm.Machine, false)
		if err := r.ctl.MachineDown(ctx, rm.Machine, "removed by pool "+rm.Pool+": "+rm.Reason); err != nil {
			errs = append(errs, err)
		}
	}
	r.mu.Lock()
	for _, v := range d.Infeasible {
		r.event(api.PoolEvent{Time: now, Kind: "infeasible", Gang: v.Gang, Reason: v.Reason})
	}
	// A launch that never registered is given up.
	for name, m := range r.machines {
		if m.state == pools.Launching && now.Sub(m.since) > r.cfg.LaunchTimeout {
			delete(r.machines, name)
			r.event(api.PoolEvent{Time: now, Kind: "launch-failed", Pool: m.pool, Machine: name, Reason: fmt.Sprintf("did not register within %v", r.cfg.LaunchTimeout)})
			if r.pools[m.pool].pool.Spec.Capacity == pools.Spot {
				r.pools[m.pool].noSpotTil = now.Add(r.cfg.SpotBackoff)
			}
			go func(prov Provider, name string) { _ = prov.Terminate(context.Background(), name) }(r.cfg.Providers[m.pool], name)
		}
	}
	r.mu.Unlock()
	return errors.Join(errs...)
}

// Status is the pools' part of the cluster status.
func (r *Runner) Status() *api.PoolsStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.cfg.Clock()
	out := &api.PoolsStatus{Events: append([]api.PoolEvent(nil), r.events...)}
	for _, p := range r.cfg.Pools.Pools {
		ps := r.pools[p.Spec.Name]
		st := api.PoolStatus{Name: p.Spec.Name, Capacity: string(p.Spec.Capacity), Provider: p.Spec.Provider.Type, Min: p.Spec.Min, Max: p.Spec.Max,
			PricePerHour: p.Spec.PricePerHour, CostUSD: ps.spent, SpotUnavailable: now.Before(ps.noSpotTil)}
		for name, m := range r.machines {
			if m.pool != p.Spec.Name {
				continue
			}
			pm := api.PoolMachine{Name: name, State: m.state.String(), Since: m.since, Notice: m.notice, IdleTimeout: api.Duration(p.Spec.IdleTimeout)}
			if !m.idleSince.IsZero() && m.state == pools.Ready {
				pm.IdleFor = api.Duration(now.Sub(m.idleSince))
			}
			if m.state == pools.Launching {
				st.Launching++
			}
			st.Machines = append(st.Machines, pm)
		}
		sort.Slice(st.Machines, func(i, j int) bool { return st.Machines[i].Name < st.Machines[j].Name })
		out.Pools = append(out.Pools, st)
	}
	return out
}

// moveLastCopies copies the objects whose only copy is on a draining machine to another
// machine (alive, not cordoned), so that the machine can be removed without losing them.
// Each object is copied once at a time; the directory's new location takes it off the
// machine's count in the next view.
func (r *Runner) moveLastCopies(ctx context.Context, v head.PoolView, now time.Time) {
	if r.cfg.Replicate == nil {
		return
	}
	draining := map[string]*machine{}
	r.mu.Lock()
	for name, rm := range r.machines {
		if rm.state == pools.Draining {
			draining[name] = rm
		}
	}
	r.mu.Unlock()
	var targets []head.PoolMachine
	for _, m := range v.Machines {
		if m.Alive && !m.Cordoned && draining[m.Name] == nil && m.AgentAPI != "" {
			targets = append(targets, m)
		}
	}
	for _, m := range v.Machines {
		rm := draining[m.Name]
		if rm == nil || len(m.LastCopyObjects) == 0 {
			continue
		}
		if len(targets) == 0 {
			r.mu.Lock()
			if !rm.moveBlocked {
				rm.moveBlocked = true
				r.event(api.PoolEvent{Time: now, Kind: "move-failed", Machine: m.Name,
					Reason: fmt.Sprintf("%d last object copies wait: no other machine to copy them to", m.LastCopies)})
			}
			r.mu.Unlock()
			continue
		}
		for i, o := range m.LastCopyObjects {
			r.mu.Lock()
			busy := r.moving[o.ID]
			r.moving[o.ID] = true
			r.mu.Unlock()
			if busy {
				continue
			}
			to := targets[i%len(targets)]
			go func(from string, o head.ObjectCopy, to head.PoolMachine) {
				cctx, cancel := context.WithTimeout(ctx, 5*time.Minute) // ends with the runner
				defer cancel()
				err := r.cfg.Replicate(cctx, to.AgentAPI, o.ID, o.Owner)
				r.mu.Lock()
				defer r.mu.Unlock()
				delete(r.moving, o.ID)
				if err != nil {
					r.event(api.PoolEvent{Time: r.cfg.Clock(), Kind: "move-failed", Machine: from, Reason: fmt.Sprintf("object %s to %s: %v", o.ID, to.Name, err)})
					return
				}
				r.event(api.PoolEvent{Time: r.cfg.Clock(), Kind: "move", Machine: from, Reason: fmt.Sprintf("last copy of object %s copied to %s before the machine goes", o.ID, to.Name)})
			}(m.Name, o, to)
		}
	}
}
