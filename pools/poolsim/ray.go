package poolsim

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/atoll-run/atoll/pools"
)

// The Ray model: Ray's autoscaler v2 as its code and docs describe it (read at
// ray-project/ray, python/ray/autoscaler/v2: scheduler.py ResourceDemandScheduler,
// instance_manager/reconciler.py Reconciler._compute_to_launch, instance_manager/config.py;
// docs.ray.io "Configuring Autoscaling" and "Cluster YAML Configuration Options"). Written
// here from that reading; none of it is the pools core.
//
// Every job is a Ray Train run: a placement group of one bundle per member ({GPU: cards},
// strategy PACK, Ray Train's default), which Ray places when the bundles fit and the
// autoscaler sees as a gang resource request while pending. Every Interval:
//
//  1. Scheduling nodes are the running and launching instances (with their available GPUs)
//     and the QUEUED instances (full); node types are the pools, min/max workers the pools'
//     min/max.
//  2. Node types below min_workers get nodes to launch.
//  3. Gang requests (pending placement groups), largest first (more bundles), then in queue
//     order, are scheduled atomically: bundles first on existing nodes, the node with the
//     best utilization score first (Ray's _sched_best_node: the node that takes some of the
//     bundles with the highest score), then on new nodes of the types with room under
//     max_workers, chosen the same way; a node type's priority breaks score ties, and the
//     model gives spot types the higher priority (what a user who prefers spot sets). A
//     gang that does not fit whole leaves the plan unchanged.
//  4. Idle termination: a running node idle for more than IdleTimeout and not planned for
//     a pending request is terminated, down to its type's min_workers.
//  5. New nodes become QUEUED instances; per node type at most
//     max(1, ceil(UpscalingSpeed × the type's instances requested or allocated)) of them
//     are requested from the cloud in this reconcile, and at most MaxConcurrentLaunches
//     instances are requested and not yet allocated overall (a request is allocated by the
//     next reconcile: cloud run-instance calls return in seconds). QUEUED instances stay
//     until requested.
//
// Ray has no notion of spot interruption notices: a node taken back is a node lost, and
// Ray Train restarts the run from its last checkpoint. Ray does not drain or move work to
// free a partly used node. The model's score uses GPUs only (the simulation has no CPU or
// memory demand); Ray's score also weighs the other resources of a node.

// RayConfig configures the Ray model; DefaultRayConfig has Ray's defaults.
type RayConfig struct {
	// UpscalingSpeed: per reconcile and node type, at most
	// max(1, ceil(UpscalingSpeed × instances of the type requested or allocated)) queued
	// instances are requested. Ray's default is 1.0 (DEFAULT_UPSCALING_SPEED).
	UpscalingSpeed float64
	// MaxConcurrentLaunches caps instances requested and not yet allocated, over all types
	// (AUTOSCALER_MAX_CONCURRENT_LAUNCHES, 10).
	MaxConcurrentLaunches int
	// IdleTimeout: a node idle longer is terminated (the cluster launcher's
	// idle_timeout_minutes, 5).
	IdleTimeout time.Duration
	// Interval between reconciles (AUTOSCALER_UPDATE_INTERVAL_S, 5 s).
	Interval time.Duration
}

// DefaultRayConfig returns Ray's defaults.
func DefaultRayConfig() RayConfig {
	return RayConfig{UpscalingSpeed: 1, MaxConcurrentLaunches: 10, IdleTimeout: 5 * time.Minute, Interval: 5 * time.Second}
}

// Validate rejects values Ray would not run with.
func (c RayConfig) Validate() error {
	if !(c.UpscalingSpeed > 0) || math.IsInf(c.UpscalingSpeed, 0) || c.MaxConcurrentLaunches < 1 || c.IdleTimeout < 0 || c.Interval <= 0 {
		return fmt.Errorf("poolsim: ray config %+v: want upscaling speed > 0, at least 1 concurrent launch, idle timeout ≥ 0, interval > 0", c)
	}
	return nil
}

type rayScaler struct {
	cfg    RayConfig
	queued []int // QUEUED instances: pool index, oldest first
	// rounds records every reconcile that requested instances (for the bound's test).
	rounds []rayRound
}

// rayRound is one reconcile's requests: per pool, the instances requested and the
// instances requested or allocated before it; queued is what stayed queued after it.
type rayRound struct {
	at        time.Duration
	requested map[int]int
	allocated map[int]int
	queued    int
}

var _ scaler = (*rayScaler)(nil)

func (r *rayScaler) name() string            { return "ray" }
func (r *rayScaler) interval() time.Duration { return r.cfg.Interval }
func (r *rayScaler) start(*world) error      { return nil }

// wake: queued instances wait for the next reconcile; an idle node's timeout.
func (r *rayScaler) wake(w *world) (time.Duration, bool) {
	if len(r.queued) > 0 {
		return w.now + r.cfg.Interval, true
	}
	best, ok := time.Duration(0), false
	for _, mi := range w.alive() {
		m := w.machines[mi]
		if m.ready && len(m.hosts) == 0 && m.idleSince >= 0 {
			at := m.idleSince + r.cfg.IdleTimeout + time.Second // idle for more than the timeout
			if at > w.now && (!ok || at < best) {
				best, ok = at, true
			}
		}
	}
	return best, ok
}

// rnode is a scheduling node.
type rnode struct {
	pool   int
	total  int
	avail  int
	mi     int  // the world's machine; -1 for a queued or new instance
	launch bool // to launch (planned in this reconcile)
	sched  bool // a pending request is planned on it
}

// rscore is Ray's utilization score for a GPU-only node after scheduling (the total times
// the utilization cubed, as _compute_score weighs each resource), then the node type's
// priority.
type rscore struct {
	util float64
	prio int
}

func (x rscore) better(y rscore) bool {
	if x.util != y.util {
		return x.util > y.util
	}
	return x.prio > y.prio
}

func (r *rayScaler) prio(w *world, pool int) int {
	if w.set.Pools[pool].Spec.Capacity == pools.Spot {
		return 1
	}
	return 0
}

// bestNode is Ray's _sched_best_node: every node tries the requests in order (as many as
// fit); among those that took any, the best score wins (the first on ties). It returns the
// winner's index, the node after scheduling and the requests left.
func (r *rayScaler) bestNode(w *world, reqs []int, nodes []rnode) (int, rnode, []int) {
	bi := -1
	var bn rnode
	var bs rscore
	var brem []int
	for i, n := range nodes {
		c := n
		var rem []int
		for _, q := range reqs {
			if c.avail >= q {
				c.avail -= q
				c.sched = true
			} else {
				rem = append(rem, q)
			}
		}
		if len(rem) == len(reqs) {
			continue
		}
		u := float64(c.total-c.avail) / float64(c.total)
		sc := rscore{util: float64(c.total) * u * u * u, prio: r.prio(w, c.pool)}
		if bi < 0 || sc.better(bs) {
			bi, bn, bs, brem = i, c, sc, rem
		}
	}
	return bi, bn, brem
}

// trySchedule is Ray's _try_schedule for one gang: existing nodes first, then new nodes of
// the types with room. It returns the nodes (scheduled ones first, as Ray orders them) and
// the requests that did not fit.
func (r *rayScaler) trySchedule(w *world, nodes []rnode, reqs []int) ([]rnode, []int) {
	existing := slices.Clone(nodes)
	var target []rnode
	for len(reqs) > 0 && len(existing) > 0 {
		i, n, rem := r.bestNode(w, reqs, existing)
		if i < 0 {
			break
		}
		target = append(target, n)
		existing = slices.Delete(existing, i, i+1)
		reqs = rem
	}
	target = append(target, existing...)
	room := make([]int, len(w.set.Pools))
	for i := range w.set.Pools {
		room[i] = w.set.Pools[i].Spec.Max
	}
	for _, n := range nodes {
		room[n.pool]--
	}
	fresh := func(p int) rnode {
		g := w.set.Pools[p].Shape.GPUs
		return rnode{pool: p, total: g, avail: g, mi: -1, launch: true}
	}
	var tmpl []rnode
	for p := range w.set.Pools {
		if room[p] > 0 && w.set.Pools[p].Shape.GPUs > 0 {
			tmpl = append(tmpl, fresh(p))
		}
	}
	for len(reqs) > 0 && len(tmpl) > 0 {
		i, n, rem := r.bestNode(w, reqs, tmpl)
		if i < 0 {
			break
		}
		target = append(target, n)
		tmpl = slices.Delete(tmpl, i, i+1)
		reqs = rem
		if room[n.pool]--; room[n.pool] > 0 {
			tmpl = append(tmpl, fresh(n.pool))
		}
	}
	return target, reqs
}

// capacity is the GPUs the nodes have available plus those of the nodes the types could
// still add.
func (r *rayScaler) capacity(w *world, nodes []rnode) int {
	n := 0
	room := make([]int, len(w.set.Pools))
	for i := range w.set.Pools {
		room[i] = w.set.Pools[i].Spec.Max
	}
	for _, x := range nodes {
		n += x.avail
		room[x.pool]--
	}
	for i, k := range room {
		n += max(0, k) * w.set.Pools[i].Shape.GPUs
	}
	return n
}

func (r *rayScaler) reconcile(w *world) error {
	// 1. Scheduling nodes: instances with a machine, then the queued ones.
	var nodes []rnode
	count := make([]int, len(w.set.Pools))
	poolIdx := map[string]int{}
	for i := range w.set.Pools {
		poolIdx[w.set.Pools[i].Spec.Name] = i
	}
	for _, mi := range w.alive() {
		m := w.machines[mi]
		p := poolIdx[m.pool.Spec.Name]
		n := rnode{pool: p, total: m.pool.Shape.GPUs, avail: m.pool.Shape.GPUs, mi: mi}
		if m.ready {
			n.avail = m.free
		}
		nodes = append(nodes, n)
		count[p]++
	}
	for _, p := range r.queued {
		g := w.set.Pools[p].Shape.GPUs
		nodes = append(nodes, rnode{pool: p, total: g, avail: g, mi: -1})
		count[p]++
	}
	// 2. min_workers.
	for p := range w.set.Pools {
		for k := count[p]; k < w.set.Pools[p].Spec.Min; k++ {
			g := w.set.Pools[p].Shape.GPUs
			nodes = append(nodes, rnode{pool: p, total: g, avail: g, mi: -1, launch: true})
		}
	}
	// 3. Gang requests: more bundles first, then queue order.
	gangs := slices.Clone(w.pending)
	slices.SortStableFunc(gangs, func(a, b int) int { return cmp.Compare(w.jobs[b].members, w.jobs[a].members) })
	for _, ji := range gangs {
		j := w.jobs[ji]
		if j.members*j.per > r.capacity(w, nodes) {
			continue // cannot fit, whatever the packing: the scheduler would find no room
		}
		reqs := make([]int, j.members)
		for k := range reqs {
			reqs[k] = j.per
		}
		if next, rem := r.trySchedule(w, nodes, reqs); len(rem) == 0 {
			nodes = next
		}
	}
	// 4. Idle termination.
	alive := make([]int, len(w.set.Pools))
	for _, n := range nodes {
		if !n.launch {
			alive[n.pool]++
		}
	}
	for _, n := range nodes {
		if n.mi < 0 || n.sched {
			continue
		}
		m := w.machines[n.mi]
		if !m.ready || len(m.hosts) > 0 || m.idleSince < 0 || w.now-m.idleSince <= r.cfg.IdleTimeout {
			continue
		}
		if alive[n.pool] <= w.set.Pools[n.pool].Spec.Min {
			continue
		}
		alive[n.pool]--
		w.terminate(n.mi)
	}
	// 5. New nodes are queued; requested within the upscaling bound.
	for _, n := range nodes {
		if n.launch {
			r.queued = append(r.queued, n.pool)
		}
	}
	r.request(w)
	return nil
}

// request moves queued instances to requested (launched), within the upscaling bound:
// types in the order their first instance was queued, the oldest instances first.
func (r *rayScaler) request(w *world) {
	if len(r.queued) == 0 {
		return
	}
	allocated := map[int]int{}
	poolIdx := map[string]int{}
	for i := range w.set.Pools {
		poolIdx[w.set.Pools[i].Spec.Name] = i
	}
	for _, mi := range w.alive() {
		allocated[poolIdx[w.machines[mi].pool.Spec.Name]]++
	}
	var types []int
	for _, p := range r.queued {
		if !slices.Contains(types, p) {
			types = append(types, p)
		}
	}
	round := rayRound{at: w.now, requested: map[int]int{}, allocated: allocated}
	total := 0
	for _, p := range types {
		want := max(1, int(math.Ceil(r.cfg.UpscalingSpeed*float64(allocated[p]))))
		n := min(r.cfg.MaxConcurrentLaunches-total, want)
		for k := 0; k < len(r.queued) && n > 0; {
			if r.queued[k] != p {
				k++
				continue
			}
			w.launch(&w.set.Pools[p])
			r.queued = slices.Delete(r.queued, k, k+1)
			round.requested[p]++
			total++
			n--
		}
	}
	if total > 0 {
		round.queued = len(r.queued)
		r.rounds = append(r.rounds, round)
	}
}
