package poolsim

import (
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/atoll-run/atoll/pools"
)

// The Kueue model: Kueue with the ProvisioningRequest admission check and the Kubernetes
// cluster-autoscaler (CA), as their docs describe them (read at kubernetes-sigs/kueue,
// site/content/en/docs: concepts/cluster_queue.md, concepts/admission_check/
// provisioning_request.md, tasks/manage/setup_wait_for_pods_ready.md; kubernetes/autoscaler,
// cluster-autoscaler/FAQ.md: "How does scale-down work?", "Supported ProvisioningClasses",
// the flag table; and CA's provreq ProvisioningRequestPodsInjector, which picks one request
// per loop). Written here from that reading; none of it is the pools core.
//
// One ClusterQueue holds every job. Its resource group lists one ResourceFlavor per pool,
// spot pools first (then on-demand, in the pool file's order); each flavor's nominal quota
// is its pool's max machines times their GPUs, and the flavor's node labels pin a
// workload's pods to that pool. Every ScanInterval:
//
//  1. Kueue (BestEffortFIFO, the default queueing strategy): pending workloads in queue
//     order reserve quota in the first flavor, in order, whose quota has room for all their
//     pods (a workload that does not fit does not block the next), and get a
//     ProvisioningRequest of class best-effort-atomic-scale-up.
//  2. CA picks one ProvisioningRequest per loop (the oldest not waiting out a retry): it
//     checks which pods fit on the flavor's existing nodes (ready ones with their free GPUs,
//     upcoming ones whole, less what other requests have booked), and scales the node group
//     up by the nodes the rest need (first fit), all or nothing. When it can (or needs no
//     node), the request is Provisioned: the capacity is booked for the workload for
//     BookingTime and Kueue admits it (its pods may now be scheduled, on its flavor's pool).
//     When the group's max is in the way, the request is retried after a backoff (RetryInitial
//     doubling to RetryMax).
//  3. CA scale-down, when the loop scaled nothing up: a ready node whose GPU utilization is
//     below GPUUtilizationThreshold and whose pods all fit on other nodes of their flavor
//     (simulated one pod at a time, best fit; nodes being removed take nothing) is unneeded;
//     unneeded for ScaleDownUnneededTime, it is removed: empty nodes at once (up to
//     MaxEmptyBulkDelete a loop), a node with pods drained first (MaxDrainParallelism at a
//     time): its pods are evicted with their termination grace (the job's checkpoint time plus
//     30 s, at most MaxGracefulTermination) and the node goes once they are gone. Nothing is
//     removed within ScaleDownDelayAfterAdd of the last scale-up. Unneeded times are tracked
//     meanwhile. A node group keeps its min.
//
// With NodeTerminationHandler (AWS's aws-node-termination-handler, the usual companion of
// spot node groups), a spot notice cordons and drains the node: its pods get SIGTERM and
// checkpoint within the notice, under the same checkpoint model as every policy.
//
// A workload whose run ends before it finishes (its node lost, drained or removed) is
// evicted and requeued at once: it gives its quota back and goes through admission and a
// new ProvisioningRequest again. This is favourable to Kueue: on its documented path the
// Job's replacement pod waits for capacity that no one scales up for (CA leaves pods that
// consume a ProvisioningRequest to it), until waitForPodsReady's recovery timeout (30 min
// by default) evicts the workload. Capacity booked for a workload that did not start within
// BookingTime is released and the workload is requeued the same way.

// KueueConfig configures the Kueue model; DefaultKueueConfig has the defaults of Kueue and
// CA.
type KueueConfig struct {
	// ScanInterval is CA's loop (--scan-interval, 10 s); Kueue's admission runs with it.
	ScanInterval time.Duration
	// ScaleDownUnneededTime: how long a node is unneeded before it is removed
	// (--scale-down-unneeded-time, 10 min).
	ScaleDownUnneededTime time.Duration
	// ScaleDownDelayAfterAdd: no removal this soon after a scale-up
	// (--scale-down-delay-after-add, 10 min).
	ScaleDownDelayAfterAdd time.Duration
	// GPUUtilizationThreshold: a GPU node below it is a scale-down candidate
	// (--scale-down-gpu-utilization-threshold, 0.5).
	GPUUtilizationThreshold float64
	// MaxEmptyBulkDelete: empty nodes removed per loop (--max-empty-bulk-delete, 10).
	MaxEmptyBulkDelete int
	// MaxDrainParallelism: nodes with pods drained at once (--max-drain-parallelism, 1).
	MaxDrainParallelism int
	// MaxGracefulTermination caps an evicted pod's grace (--max-graceful-termination-sec,
	// 10 min).
	MaxGracefulTermination time.Duration
	// BookingTime: how long a Provisioned request's capacity is kept for its pods (10 min).
	BookingTime time.Duration
	// RetryInitial and RetryMax: a request CA could not provision is retried after a delay
	// starting at RetryInitial and doubling up to RetryMax
	// (--provisioning-request-initial-backoff-time 1 min, --provisioning-request-max-backoff-time
	// 10 min).
	RetryInitial, RetryMax time.Duration
	// NodeTerminationHandler drains a spot node on its interruption notice.
	NodeTerminationHandler bool
}

// DefaultKueueConfig returns the defaults of Kueue and CA, with a node termination handler.
func DefaultKueueConfig() KueueConfig {
	return KueueConfig{ScanInterval: 10 * time.Second, ScaleDownUnneededTime: 10 * time.Minute, ScaleDownDelayAfterAdd: 10 * time.Minute,
		GPUUtilizationThreshold: 0.5, MaxEmptyBulkDelete: 10, MaxDrainParallelism: 1, MaxGracefulTermination: 10 * time.Minute,
		BookingTime: 10 * time.Minute, RetryInitial: time.Minute, RetryMax: 10 * time.Minute, NodeTerminationHandler: true}
}

// Validate rejects values CA or Kueue would not run with.
func (c KueueConfig) Validate() error {
	if c.ScanInterval <= 0 || c.ScaleDownUnneededTime < 0 || c.ScaleDownDelayAfterAdd < 0 || c.GPUUtilizationThreshold < 0 ||
		c.GPUUtilizationThreshold > 1 || c.MaxEmptyBulkDelete < 1 || c.MaxDrainParallelism < 1 || c.MaxGracefulTermination <= 0 ||
		c.BookingTime <= 0 || c.RetryInitial <= 0 || c.RetryMax < c.RetryInitial {
		return fmt.Errorf("poolsim: kueue config %+v: want positive intervals, a threshold in [0, 1], at least 1 removal a loop, retry max ≥ initial", c)
	}
	return nil
}

// podGraceExtra is what a job adds to its checkpoint time in its pods'
// terminationGracePeriodSeconds (Kubernetes' default grace).
const podGraceExtra = 30 * time.Second

type kueueScaler struct {
	cfg     KueueConfig
	flavors []int // pool indexes in the ClusterQueue's order
	quota   []int // GPUs per pool index
	used    []int
	poolIdx map[*pools.Pool]int
	wl      map[int]*kwl
	reqs    []*provReq // not yet provisioned, oldest first
	// unneeded: machine -> since; deleting: machine -> when CA began draining it.
	unneeded    map[int]time.Duration
	deleting    map[int]time.Duration
	lastScaleUp time.Duration
	// admitted counts every admission, provisioned those that needed no new node.
	admissions int
}

// kwl is a job's Workload.
type kwl struct {
	flavor      int // -1: no quota reserved
	admitted    bool
	booked      map[int]int // machine -> GPUs booked for its pods
	bookedUntil time.Duration
}

type provReq struct {
	ji      int
	created time.Duration
	retryAt time.Duration
	backoff time.Duration
}

var (
	_ scaler       = (*kueueScaler)(nil)
	_ admitter     = (*kueueScaler)(nil)
	_ stopWatcher  = (*kueueScaler)(nil)
	_ placeWatcher = (*kueueScaler)(nil)
	_ noticeTaker  = (*kueueScaler)(nil)
)

func newKueue(cfg KueueConfig, set *pools.Set) *kueueScaler {
	k := &kueueScaler{cfg: cfg, poolIdx: map[*pools.Pool]int{}, wl: map[int]*kwl{}, unneeded: map[int]time.Duration{},
		deleting: map[int]time.Duration{}, lastScaleUp: -cfg.ScaleDownDelayAfterAdd}
	k.quota = make([]int, len(set.Pools))
	k.used = make([]int, len(set.Pools))
	for i := range set.Pools {
		p := &set.Pools[i]
		k.poolIdx[p] = i
		k.quota[i] = p.Spec.Max * p.Shape.GPUs
		if p.Spec.Capacity == pools.Spot {
			k.flavors = append(k.flavors, i)
		}
	}
	for i := range set.Pools {
		if set.Pools[i].Spec.Capacity != pools.Spot {
			k.flavors = append(k.flavors, i)
		}
	}
	return k
}

func (k *kueueScaler) name() string            { return "kueue" }
func (k *kueueScaler) interval() time.Duration { return k.cfg.ScanInterval }
func (k *kueueScaler) start(*world) error      { return nil }

func (k *kueueScaler) admits(w *world, ji int) (bool, *pools.Pool) {
	wl := k.wl[ji]
	if wl == nil || !wl.admitted {
		return false, nil
	}
	return true, &w.set.Pools[wl.flavor]
}

func (k *kueueScaler) placed(w *world, ji int) {
	if wl := k.wl[ji]; wl != nil {
		wl.booked = nil
	}
}

// stopped gives the workload's quota back: finished, or evicted and requeued.
func (k *kueueScaler) stopped(w *world, ji int, done bool) {
	wl := k.wl[ji]
	if wl == nil {
		return
	}
	if wl.flavor >= 0 {
		j := w.jobs[ji]
		k.used[wl.flavor] -= j.members * j.per
	}
	if done {
		delete(k.wl, ji)
		return
	}
	*wl = kwl{flavor: -1}
}

// notice: the node termination handler cordons the node and drains it; the pods checkpoint
// within the notice.
func (k *kueueScaler) notice(w *world, mi int) {
	if !k.cfg.NodeTerminationHandler {
		return
	}
	m := w.machines[mi]
	w.drain(mi)
	for _, ji := range hostedJobs(m) {
		w.checkpointStop(ji, m.notice)
	}
}

func hostedJobs(m *simMachine) []int {
	out := make([]int, 0, len(m.hosts))
	for ji := range m.hosts {
		out = append(out, ji)
	}
	sort.Ints(out)
	return out
}

// wake: a request's retry, a booking's end, a drain's grace, an unneeded node's time, the end
// of the scale-down delay.
func (k *kueueScaler) wake(w *world) (time.Duration, bool) {
	best, ok := time.Duration(0), false
	consider := func(at time.Duration) {
		if at > w.now && (!ok || at < best) {
			best, ok = at, true
		}
	}
	for _, r := range k.reqs {
		consider(max(r.retryAt, w.now+k.cfg.ScanInterval))
	}
	for _, wl := range k.wl {
		if wl.booked != nil {
			consider(wl.bookedUntil)
		}
	}
	for _, since := range k.deleting {
		consider(since + k.cfg.MaxGracefulTermination)
	}
	for _, since := range k.unneeded {
		consider(since + k.cfg.ScaleDownUnneededTime)
		consider(k.lastScaleUp + k.cfg.ScaleDownDelayAfterAdd)
	}
	return best, ok
}

func (k *kueueScaler) reconcile(w *world) error {
	k.admit(w)
	scaled := k.provision(w)
	k.expireBookings(w)
	k.finishDeletions(w)
	k.scaleDown(w, scaled)
	return nil
}

// admit is Kueue's quota reservation, BestEffortFIFO: every pending workload without quota
// takes the first flavor with room for all its pods, and a ProvisioningRequest.
func (k *kueueScaler) admit(w *world) {
	for _, ji := range w.pending {
		wl := k.wl[ji]
		if wl == nil {
			wl = &kwl{flavor: -1}
			k.wl[ji] = wl
		}
		if wl.flavor >= 0 {
			continue
		}
		j := w.jobs[ji]
		need := j.members * j.per
		for _, f := range k.flavors {
			if j.per > w.set.Pools[f].Shape.GPUs || k.used[f]+need > k.quota[f] {
				continue
			}
			k.used[f] += need
			wl.flavor = f
			k.reqs = append(k.reqs, &provReq{ji: ji, created: w.now, retryAt: w.now, backoff: k.cfg.RetryInitial})
			break
		}
	}
}

// booked returns the GPUs booked on each machine for workloads other than skip.
func (k *kueueScaler) bookedOn(skip int) map[int]int {
	out := map[int]int{}
	for ji, wl := range k.wl {
		if ji == skip {
			continue
		}
		for mi, g := range wl.booked {
			out[mi] += g
		}
	}
	return out
}

// provision is CA's loop for one ProvisioningRequest (best-effort atomic scale-up). It
// reports whether it scaled up.
func (k *kueueScaler) provision(w *world) bool {
	ri := slices.IndexFunc(k.reqs, func(r *provReq) bool { return r.retryAt <= w.now })
	if ri < 0 {
		return false
	}
	r := k.reqs[ri]
	j := w.jobs[r.ji]
	wl := k.wl[r.ji]
	p := &w.set.Pools[wl.flavor]
	booked := k.bookedOn(r.ji)
	free := map[int]int{}
	var order []int
	count := 0
	for _, mi := range w.alive() {
		m := w.machines[mi]
		if m.pool != p {
			continue
		}
		count++
		if m.draining || m.notice > 0 {
			continue
		}
		f := p.Shape.GPUs
		if m.ready {
			f = m.free
		}
		free[mi] = f - booked[mi]
		order = append(order, mi)
	}
	plan := map[int]int{}
	left := j.members
	for ; left > 0; left-- {
		best := -1
		for _, mi := range order {
			if free[mi] >= j.per && (best < 0 || free[mi] < free[best]) {
				best = mi
			}
		}
		if best < 0 {
			break
		}
		free[best] -= j.per
		plan[best] += j.per
	}
	// The rest on new nodes, first fit.
	var fresh []int
	for ; left > 0; left-- {
		i := slices.IndexFunc(fresh, func(f int) bool { return f >= j.per })
		if i < 0 {
			fresh = append(fresh, p.Shape.GPUs)
			i = len(fresh) - 1
		}
		fresh[i] -= j.per
	}
	if len(fresh) > 0 && count+len(fresh) > p.Spec.Max {
		r.retryAt = w.now + r.backoff
		r.backoff = min(2*r.backoff, k.cfg.RetryMax)
		return false
	}
	for _, f := range fresh {
		plan[w.launch(p)] += p.Shape.GPUs - f
	}
	k.reqs = slices.Delete(k.reqs, ri, ri+1)
	wl.admitted, wl.booked, wl.bookedUntil = true, plan, w.now+k.cfg.BookingTime
	k.admissions++
	w.capVer++ // a placement gate opened
	if len(fresh) > 0 {
		k.lastScaleUp = w.now
		return true
	}
	return false
}

// expireBookings releases capacity booked for a workload that has not started within
// BookingTime; the workload is requeued.
func (k *kueueScaler) expireBookings(w *world) {
	for _, ji := range slices.Clone(w.pending) {
		wl := k.wl[ji]
		if wl == nil || !wl.admitted || wl.booked == nil || w.now < wl.bookedUntil {
			continue
		}
		j := w.jobs[ji]
		k.used[wl.flavor] -= j.members * j.per
		*wl = kwl{flavor: -1}
	}
}

// finishDeletions removes the nodes CA drains once their pods are gone (or their grace
// ran out).
func (k *kueueScaler) finishDeletions(w *world) {
	for _, mi := range sortedKeys(k.deleting) {
		m := w.machines[mi]
		if m.gone || len(m.hosts) == 0 || w.now-k.deleting[mi] >= k.cfg.MaxGracefulTermination {
			w.terminate(mi)
			delete(k.deleting, mi)
		}
	}
}

func sortedKeys(m map[int]time.Duration) []int {
	out := make([]int, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Ints(out)
	return out
}

// scaleDown is CA's scale-down: it tracks unneeded nodes, and removes those unneeded long
// enough unless the loop scaled up or the last scale-up is recent.
func (k *kueueScaler) scaleDown(w *world, scaledUp bool) {
	booked := k.bookedOn(-1)
	// Destinations' free GPUs for the pods of the nodes found unneeded.
	free := map[int]int{}
	removing := map[int]bool{}
	for mi := range k.deleting {
		removing[mi] = true
	}
	var nodes []int
	for _, mi := range w.alive() {
		m := w.machines[mi]
		if !m.ready || m.draining || m.notice > 0 {
			continue
		}
		nodes = append(nodes, mi)
		free[mi] = m.free - booked[mi]
	}
	seen := map[int]bool{}
	received := map[int]bool{} // nodes that take moved pods in this simulation stay
	for _, mi := range nodes {
		m := w.machines[mi]
		seen[mi] = true
		g := m.pool.Shape.GPUs
		if booked[mi] > 0 || received[mi] || float64(g-m.free)/float64(g) >= k.cfg.GPUUtilizationThreshold || !k.movable(w, mi, nodes, free, removing, received) {
			delete(k.unneeded, mi)
			continue
		}
		removing[mi] = true
		if _, ok := k.unneeded[mi]; !ok {
			k.unneeded[mi] = w.now
		}
	}
	for mi := range k.unneeded {
		if !seen[mi] {
			delete(k.unneeded, mi)
		}
	}
	if scaledUp || w.now-k.lastScaleUp < k.cfg.ScaleDownDelayAfterAdd {
		return
	}
	alive := map[*pools.Pool]int{}
	for _, mi := range w.alive() {
		alive[w.machines[mi].pool]++
	}
	empty := 0
	for _, mi := range sortedKeys(k.unneeded) {
		m := w.machines[mi]
		if w.now-k.unneeded[mi] < k.cfg.ScaleDownUnneededTime || alive[m.pool] <= m.pool.Spec.Min {
			continue
		}
		switch {
		case len(m.hosts) == 0 && empty < k.cfg.MaxEmptyBulkDelete:
			empty++
		case len(m.hosts) > 0 && len(k.deleting) < k.cfg.MaxDrainParallelism:
			k.deleting[mi] = w.now
			w.drain(mi)
			for _, ji := range hostedJobs(m) {
				grace := min(w.ckptTime(w.jobs[ji])+podGraceExtra, k.cfg.MaxGracefulTermination)
				w.checkpointStop(ji, w.now+grace)
			}
			delete(k.unneeded, mi)
			alive[m.pool]--
			continue
		default:
			continue
		}
		alive[m.pool]--
		delete(k.unneeded, mi)
		w.terminate(mi)
	}
}

// movable simulates moving the pods of node mi, one at a time (best fit), to other nodes of
// their flavor that are not being removed; on success it commits the moves into free and
// marks the nodes that receive pods.
func (k *kueueScaler) movable(w *world, mi int, nodes []int, free map[int]int, removing, received map[int]bool) bool {
	m := w.machines[mi]
	tmp := map[int]int{}
	freeOf := func(x int) int {
		if f, ok := tmp[x]; ok {
			return f
		}
		return free[x]
	}
	for _, ji := range hostedJobs(m) {
		j := w.jobs[ji]
		for n := 0; n < m.hosts[ji]; n++ {
			best := -1
			for _, x := range nodes {
				if x == mi || removing[x] || (j.pool != nil && w.machines[x].pool != j.pool) {
					continue
				}
				if f := freeOf(x); f >= j.per && (best < 0 || f < freeOf(best)) {
					best = x
				}
			}
			if best < 0 {
				return false
			}
			tmp[best] = freeOf(best) - j.per
		}
	}
	for x, f := range tmp {
		free[x] = f
		received[x] = true
	}
	return true
}
