package pools

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Config tunes the autoscaler. DefaultConfig works as it is.
type Config struct {
	// NoticeMargin is how long before an interruption's deadline a gang's checkpoint must be
	// done: the preemption's deadline is the notice's minus this margin (never before now).
	// Default 10 s, which leaves a 120 s AWS notice 110 s to checkpoint.
	NoticeMargin time.Duration
	// DrainGrace is how long a draining machine's gangs may keep running to finish on their
	// own before they are preempted through the notice path. Default 30 min.
	DrainGrace time.Duration
	// PreemptDeadline is how long a gang preempted off a draining machine (not an
	// interrupted one) has to checkpoint and stop. Default 2 min.
	PreemptDeadline time.Duration
	// MoveDeadline is how long a gang moved by consolidation has to checkpoint and stop. A
	// move has no outside deadline, and a gang stopped before its checkpoint is written loses
	// its work, so it is generous. Default 10 min (what Kubernetes' cluster-autoscaler gives
	// a pod it evicts, --max-graceful-termination-sec).
	MoveDeadline time.Duration
	// Consolidate moves gangs between ready machines (consolidate.go): a pending gang of one
	// member gets room on a ready machine by moving some of its gangs onto the free cards of
	// others, rather than a launch; and, while nothing is pending, a partly used machine whose
	// gangs have not changed for its pool's idle timeout (Machine.Changed) and all fit on
	// other machines' free cards is emptied and drained: the idle timeout's counterpart for
	// machines that are only partly idle; an on-demand machine whose gangs fit nowhere gets a
	// spot machine for them when spot has room. A move costs the gang a checkpoint and a
	// restore. Default off.
	Consolidate bool
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{NoticeMargin: 10 * time.Second, DrainGrace: 30 * time.Minute, PreemptDeadline: 2 * time.Minute, MoveDeadline: 10 * time.Minute}
}

// Validate rejects bad values.
func (c Config) Validate() error {
	if c.NoticeMargin < 0 || c.DrainGrace < 0 || c.PreemptDeadline <= 0 || c.Consolidate && c.MoveDeadline <= 0 {
		return fmt.Errorf("%w: config %+v: margins and graces must not be negative, the preemption (and, consolidating, move) deadlines positive", ErrSpec, c)
	}
	return nil
}

// Autoscaler decides, from a snapshot of pools, machines and pending gangs, what to
// launch, drain, preempt and remove. It is a pure core: no I/O, no clock (the snapshot
// carries now), no state between decisions; the same snapshot gives the same decision.
type Autoscaler struct {
	cfg Config
}

// New returns an autoscaler.
func New(cfg Config) (*Autoscaler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Autoscaler{cfg: cfg}, nil
}

// vm is one machine's capacity during a decision: a launching machine, one the decision
// plans to launch, or an idle ready one (poolRun.idle).
type vm struct {
	free   []int // free cards per island
	total  int   // sum of free
	cpu    int64
	mem    int64
	domain int
}

// poolRun is a pool's working state during one decision.
type poolRun struct {
	st       *PoolState
	p        *Pool
	count    int // machines that exist or are launching (draining ones included)
	draining int // of count
	planned  int // launched by this decision
	flight   []*vm
	byFree   [][]int       // vm indexes by total free cards
	pos      []int         // vm index -> position in its bucket
	domains  map[int]int   // machines per NVLink domain (rack-fabric pools)
	domVMs   map[int][]int // in-flight vm indexes per domain
	domFree  map[int]int   // in-flight free cards per domain
	domOrder []int         // domains in the order first seen
	launches map[launchKey]*Launch
	order    []launchKey
	// idle are the pool's ready machines without gangs or a notice, by name. A gang too
	// large for them alone may combine them with machines launching (topUp); one whose
	// cards a gang is counted on is not drained for idleness in the same decision.
	idle     []*vm
	idleName map[string]*vm
}

type launchKey struct {
	domain   int
	prewarm  bool
	replaces string
}

func (r *poolRun) addVM(v *vm) {
	i := len(r.flight)
	r.flight = append(r.flight, v)
	r.pos = append(r.pos, len(r.byFree[v.total]))
	r.byFree[v.total] = append(r.byFree[v.total], i)
	if _, ok := r.domVMs[v.domain]; !ok {
		r.domOrder = append(r.domOrder, v.domain)
	}
	r.domVMs[v.domain] = append(r.domVMs[v.domain], i)
	r.domFree[v.domain] += v.total
}

// take subtracts a member placement from vm i and moves it to its new bucket.
func (r *poolRun) take(i int, cards []int, cpu, mem int64) {
	v := r.flight[i]
	old := v.total
	for k, c := range cards {
		v.free[k] -= c
		v.total -= c
	}
	v.cpu -= cpu
	v.mem -= mem
	r.domFree[v.domain] -= old - v.total
	if v.total == old {
		return
	}
	b := r.byFree[old]
	p := r.pos[i]
	last := b[len(b)-1]
	b[p] = last
	r.pos[last] = p
	r.byFree[old] = b[:len(b)-1]
	r.pos[i] = len(r.byFree[v.total])
	r.byFree[v.total] = append(r.byFree[v.total], i)
}

// fits returns how many members of m fit on v, up to want, and adds the cards each island
// gives into cards (when not nil; its length is len(v.free)).
func fits(v *vm, m Member, want int, cards []int) int {
	n := want
	if m.CPUMilli > 0 {
		n = min(n, int(v.cpu/m.CPUMilli))
	}
	if m.MemMiB > 0 {
		n = min(n, int(v.mem/m.MemMiB))
	}
	if m.GPUs == 0 || n <= 0 {
		return max(n, 0)
	}
	var buf [16]int
	used := buf[:0]
	if len(v.free) > len(buf) {
		used = make([]int, len(v.free))
	} else {
		used = buf[:len(v.free)]
	}
	got, sum := 0, 0
	for k, f := range v.free {
		c := min(f/m.GPUs, n-got)
		used[k] = c * m.GPUs
		sum += used[k]
		got += c
	}
	if got < n && m.GPUs > 1 {
		// A member larger than what is left of any island crosses islands inside the machine.
		for rest := v.total - sum; rest >= m.GPUs && got < n; rest -= m.GPUs {
			need := m.GPUs
			for k := range v.free {
				t := min(v.free[k]-used[k], need)
				used[k] += t
				need -= t
			}
			got++
		}
	}
	if cards != nil {
		for k := range used {
			cards[k] += used[k]
		}
	}
	return got
}

// islandFits returns the members of m one island of v can hold.
func islandFits(v *vm, m Member) int {
	best := 0
	for _, f := range v.free {
		if m.GPUs > 0 {
			best = max(best, f/m.GPUs)
		}
	}
	if m.GPUs == 0 {
		best = 1 << 30
	}
	if m.CPUMilli > 0 {
		best = min(best, int(v.cpu/m.CPUMilli))
	}
	if m.MemMiB > 0 {
		best = min(best, int(v.mem/m.MemMiB))
	}
	return best
}

func (r *poolRun) fresh() *vm {
	sh := r.p.Shape
	free := slices.Clone(sh.Islands)
	return &vm{free: free, total: sh.GPUs, cpu: sh.CPUMilli, mem: sh.MemMiB}
}

// Decide makes one decision. It returns ErrSnapshot for a snapshot that contradicts itself.
func (a *Autoscaler) Decide(s *Snapshot) (Decision, error) {
	var d Decision
	runs, order, err := newRuns(s)
	if err != nil {
		return d, err
	}
	// Interruption notices and draining machines.
	rep, drainingNow := a.drainStep(&d, s, runs)
	// Scale up: replacements first, then pending gangs in priority order.
	for i := range rep {
		a.scaleFor(&d, runs, order, &rep[i].gang, rep[i].machine, false, nil)
	}
	pending := byPriority(s.Pending)
	var room func(*Gang) bool
	if a.cfg.Consolidate && len(pending) > 0 {
		rooms, _ := roomsOf(&d, s, runs, drainingNow)
		room = func(g *Gang) bool { return a.makeRoom(&d, s, rooms, g) }
	}
	for i := range pending {
		a.scaleFor(&d, runs, order, &pending[i], "", false, room)
	}
	for _, r := range order {
		r.launchMinimum()
	}
	// Forecast demand: pre-warm where a pool has room; no verdicts.
	for i := range s.Forecast {
		a.scaleFor(nil, runs, order, &s.Forecast[i], "", true, nil)
	}
	// Scale down: idle machines past their pool's timeout, pools above max.
	for _, r := range order {
		r.scaleDown(&d, s, drainingNow)
	}
	if a.cfg.Consolidate && len(s.Pending) == 0 && len(rep) == 0 {
		rooms, _ := roomsOf(&d, s, runs, drainingNow)
		a.consolidate(&d, s, runs, rooms)
	}
	for _, r := range order {
		d.Launches = r.appendLaunches(d.Launches)
	}
	return d, nil
}

// newRuns sets up each pool's working state, in the snapshot's order, and counts the
// pools' machines into it. It returns ErrSnapshot for a pool without config, a pool or a
// machine named twice, a machine of an unknown pool or in an unknown state.
func newRuns(s *Snapshot) (map[string]*poolRun, []*poolRun, error) {
	runs := make(map[string]*poolRun, len(s.Pools))
	order := make([]*poolRun, 0, len(s.Pools))
	for i := range s.Pools {
		ps := &s.Pools[i]
		if ps.Pool == nil {
			return nil, nil, fmt.Errorf("%w: pools[%d] has no config", ErrSnapshot, i)
		}
		name := ps.Pool.Spec.Name
		if runs[name] != nil {
			return nil, nil, fmt.Errorf("%w: pool %q twice", ErrSnapshot, name)
		}
		r := &poolRun{st: ps, p: ps.Pool, byFree: make([][]int, ps.Pool.Shape.GPUs+1), domains: map[int]int{}, domVMs: map[int][]int{}, domFree: map[int]int{}, launches: map[launchKey]*Launch{}, idleName: map[string]*vm{}}
		runs[name] = r
		order = append(order, r)
	}
	seen := make(map[string]bool, len(s.Machines))
	for i := range s.Machines {
		m := &s.Machines[i]
		r := runs[m.Pool]
		if r == nil {
			return nil, nil, fmt.Errorf("%w: machine %q of pool %q: %w", ErrSnapshot, m.Name, m.Pool, ErrUnknownPool)
		}
		if seen[m.Name] {
			return nil, nil, fmt.Errorf("%w: machine %q twice", ErrSnapshot, m.Name)
		}
		seen[m.Name] = true
		if err := r.addMachine(m); err != nil {
			return nil, nil, err
		}
	}
	return runs, order, nil
}

// addMachine counts one of the pool's machines; a launching one is capacity in flight.
func (r *poolRun) addMachine(m *Machine) error {
	r.count++
	r.domains[m.Domain]++
	switch m.State {
	case Launching:
		v := r.fresh()
		v.domain = m.Domain
		r.addVM(v)
	case Draining:
		r.draining++
	case Ready:
		if len(m.Gangs) == 0 && m.Notice.IsZero() {
			v := r.fresh()
			v.domain = m.Domain
			r.idle = append(r.idle, v)
			r.idleName[m.Name] = v
		}
	default:
		return fmt.Errorf("%w: machine %q in state %d", ErrSnapshot, m.Name, m.State)
	}
	return nil
}

// replacement is a gang's members on a machine that just got an interruption notice: the
// gang sized to its members there, and the machine they leave. A gang on several such
// machines has one replacement for each.
type replacement struct {
	gang    Gang
	machine string
}

// drainStep goes through the machines in the snapshot's order: it drains those that just
// got an interruption notice, and removes or preempts the gangs of those draining. It
// returns the replacements (one per gang and noticed machine) and the machines it drains.
func (a *Autoscaler) drainStep(d *Decision, s *Snapshot, runs map[string]*poolRun) ([]replacement, map[string]bool) {
	running := make(map[string]*Gang, len(s.Running))
	for i := range s.Running {
		running[s.Running[i].ID] = &s.Running[i]
	}
	var rep []replacement
	drainingNow := map[string]bool{}
	for i := range s.Machines {
		m := &s.Machines[i]
		switch {
		case !m.Notice.IsZero() && m.State != Draining:
			drainingNow[m.Name] = true
			runs[m.Pool].draining++
			for _, g := range a.noticed(d, m, s.Now, running) {
				rep = append(rep, replacement{gang: g, machine: m.Name})
			}
		case m.State == Draining:
			a.drained(d, m, s.Now)
		}
	}
	return rep, drainingNow
}

// noticed drains a machine that got an interruption notice and asks its gangs (those not
// already stopping) to checkpoint before the notice's deadline less the margin (never
// before now). It returns the running gangs to replace, each sized to its members there
// and free to go to any pool.
func (a *Autoscaler) noticed(d *Decision, m *Machine, now time.Time, running map[string]*Gang) []Gang {
	d.Drains = append(d.Drains, Drain{Machine: m.Name, Pool: m.Pool, MoveObjects: m.LastCopies,
		Reason: fmt.Sprintf("spot interruption notice: the provider takes it at %s", m.Notice.UTC().Format(time.RFC3339))})
	deadline := m.Notice.Add(-a.cfg.NoticeMargin)
	if deadline.Before(now) {
		deadline = now
	}
	var out []Gang
	for _, h := range m.Gangs {
		if h.Stopping {
			continue
		}
		d.Preemptions = append(d.Preemptions, Preempt{Gang: h.Gang, Machine: m.Name, Deadline: deadline,
			Reason: "checkpoint before the spot interruption of " + m.Name})
		g := running[h.Gang]
		if g == nil {
			continue
		}
		rg := *g
		rg.Size = h.Members
		rg.SameIsland = g.SameIsland && h.Members == g.Size
		rg.Pool = ""
		out = append(out, rg)
	}
	return out
}

// drained decides for a draining machine: removed once its provider took it, or once it
// has no gangs and no last object copies; past the drain grace (without a notice), its
// gangs not already stopping are preempted.
func (a *Autoscaler) drained(d *Decision, m *Machine, now time.Time) {
	switch {
	case !m.Notice.IsZero() && !now.Before(m.Notice):
		d.Removes = append(d.Removes, Remove{Machine: m.Name, Pool: m.Pool, Reason: "taken back by its provider (spot interruption)"})
	case len(m.Gangs) == 0 && m.LastCopies == 0:
		reason := "drained: no gangs, no last object copies"
		if !m.Notice.IsZero() {
			reason = "drained before its spot interruption"
		}
		d.Removes = append(d.Removes, Remove{Machine: m.Name, Pool: m.Pool, Reason: reason})
	case m.Notice.IsZero() && now.Sub(m.Since) >= a.cfg.DrainGrace:
		for _, h := range m.Gangs {
			if !h.Stopping {
				d.Preemptions = append(d.Preemptions, Preempt{Gang: h.Gang, Machine: m.Name, Deadline: now.Add(a.cfg.PreemptDeadline),
					Reason: fmt.Sprintf("%s has drained for %v without its gangs finishing", m.Name, a.cfg.DrainGrace)})
			}
		}
	}
}

// byPriority returns a copy of the gangs, larger priority first, then earlier arrival,
// then by ID.
func byPriority(gangs []Gang) []Gang {
	out := slices.Clone(gangs)
	slices.SortFunc(out, func(x, y Gang) int {
		if c := cmp.Compare(y.Priority, x.Priority); c != 0 {
			return c
		}
		if c := x.Arrived.Compare(y.Arrived); c != 0 {
			return c
		}
		return strings.Compare(x.ID, y.ID)
	})
	return out
}

// launchMinimum plans the machines the pool lacks to reach its minimum (draining ones do
// not count), as far as its max allows.
func (r *poolRun) launchMinimum() {
	short := r.p.Spec.Min - (r.count - r.draining)
	if n := min(short, r.p.Spec.Max-r.count); n > 0 {
		r.launch(n, launchKey{domain: r.nextDomain(n)}, "", fmt.Sprintf("pool minimum %d machines", r.p.Spec.Min))
	}
}

// scaleDown drains the pool's ready machines (in the snapshot's order, those drainStep
// drains aside): while the pool is above its max, idle ones, and busy ones as far as the
// idle ones left cannot make up the excess; else idle ones past the pool's idle timeout
// (those with an IdleSince), down to its min. A pool that launches in this decision drains
// nothing: capacity is short there, and an idle machine will take the gangs the launches
// are for.
func (r *poolRun) scaleDown(d *Decision, s *Snapshot, drainingNow map[string]bool) {
	if len(r.launches) > 0 {
		return
	}
	sp := &r.p.Spec
	keep := r.count - r.draining
	over := keep - sp.Max
	idleNow := r.idleReady(s, drainingNow)
	for i := range s.Machines {
		m := &s.Machines[i]
		if m.Pool != sp.Name || m.State != Ready || drainingNow[m.Name] {
			continue
		}
		idle := isIdle(m, drainingNow)
		v := r.idleName[m.Name]
		counted := v != nil && v.total < r.p.Shape.GPUs // a pending gang is counted on its cards (topUp)
		switch {
		case over > 0 && (idle || over > idleNow):
			reason := fmt.Sprintf("pool has %d machines, above its max %d", keep, sp.Max)
			d.Drains = append(d.Drains, Drain{Machine: m.Name, Pool: m.Pool, MoveObjects: m.LastCopies, Reason: reason})
			over--
			keep--
			if idle {
				idleNow--
			}
		case idle && !counted && !m.IdleSince.IsZero() && keep > sp.Min && s.Now.Sub(m.IdleSince) >= time.Duration(sp.IdleTimeout):
			d.Drains = append(d.Drains, idleDrain(m, s.Now, time.Duration(sp.IdleTimeout)))
			keep--
		}
	}
}

// idleDrain drains a machine idle past its pool's timeout.
func idleDrain(m *Machine, now time.Time, timeout time.Duration) Drain {
	reason := fmt.Sprintf("idle for %v, past the pool's idle timeout %v", now.Sub(m.IdleSince).Round(time.Second), timeout)
	if m.LastCopies > 0 {
		reason += fmt.Sprintf("; %d last object copies move first", m.LastCopies)
	}
	return Drain{Machine: m.Name, Pool: m.Pool, MoveObjects: m.LastCopies, Reason: reason}
}

// appendLaunches appends the launches the decision planned in the pool, in the order
// they were first planned.
func (r *poolRun) appendLaunches(ls []Launch) []Launch {
	for _, k := range r.order {
		ls = append(ls, *r.launches[k])
	}
	return ls
}

// isIdle is what scale-down counts as an idle machine: ready, not drained by this decision
// (drainingNow), without gangs, whether or not its IdleSince is set.
func isIdle(m *Machine, drainingNow map[string]bool) bool {
	return m.State == Ready && !drainingNow[m.Name] && len(m.Gangs) == 0
}

// idleReady counts the pool's idle machines (isIdle).
func (r *poolRun) idleReady(s *Snapshot, drainingNow map[string]bool) int {
	n := 0
	for i := range s.Machines {
		m := &s.Machines[i]
		if m.Pool == r.p.Spec.Name && isIdle(m, drainingNow) {
			n++
		}
	}
	return n
}

// nextDomain picks the NVLink domain for n new machines of a rack-fabric pool: the fullest
// domain with room for all n (the lowest numbered of those equally full, so that the choice
// does not hang on map order), else a new one. 0 for other pools.
func (r *poolRun) nextDomain(n int) int {
	dm := r.p.Shape.DomainMachines
	if dm <= 1 {
		return 0
	}
	best, bestUsed, next := -1, -1, 0
	for dom, used := range r.domains {
		next = max(next, dom+1)
		if used+n <= dm && (used > bestUsed || used == bestUsed && dom < best) {
			best, bestUsed = dom, used
		}
	}
	if best >= 0 {
		return best
	}
	return next
}

// launch plans n fresh machines in the pool and returns their vm indexes.
func (r *poolRun) launch(n int, key launchKey, gang, reason string) []int {
	var out []int
	for i := 0; i < n; i++ {
		v := r.fresh()
		v.domain = key.domain
		out = append(out, len(r.flight))
		r.addVM(v)
	}
	r.count += n
	r.planned += n
	r.domains[key.domain] += n
	l := r.launches[key]
	if l == nil {
		l = &Launch{Pool: r.p.Spec.Name, Capacity: r.p.Spec.Capacity, Domain: key.domain, Prewarm: key.prewarm, Replaces: key.replaces, Reason: reason}
		r.launches[key] = l
		r.order = append(r.order, key)
	} else if !strings.Contains(l.Reason, reason) && len(l.Reason) < 512 {
		l.Reason += "; " + reason
	}
	l.Count += n
	if gang != "" {
		l.Gangs = append(l.Gangs, gang)
	}
	return out
}

// perMachine is how many members of g one fresh machine of the pool holds.
func (r *poolRun) perMachine(g *Gang) int {
	v := r.fresh()
	return fits(v, g.Member, g.Size, nil)
}

// need returns the fresh machines the pool needs for the whole gang, or a reason it never can.
func (r *poolRun) need(g *Gang) (int, string) {
	sh := r.p.Shape
	m := g.Member
	switch {
	case !sh.hasModel(m.Models):
		return 0, fmt.Sprintf("pool %s has %v cards, the gang allows %v", r.p.Spec.Name, sh.Models, m.Models)
	case m.GPUs > sh.GPUs:
		return 0, fmt.Sprintf("pool %s machines have %d cards, a member asks %d", r.p.Spec.Name, sh.GPUs, m.GPUs)
	case m.CPUMilli > sh.CPUMilli || m.MemMiB > sh.MemMiB:
		return 0, fmt.Sprintf("pool %s machines have %d mCPU and %d MiB, a member asks %d and %d", r.p.Spec.Name, sh.CPUMilli, sh.MemMiB, m.CPUMilli, m.MemMiB)
	}
	per := r.perMachine(g)
	if per <= 0 {
		return 0, fmt.Sprintf("pool %s machines hold no member of the gang", r.p.Spec.Name)
	}
	k := (g.Size + per - 1) / per
	if g.SameIsland {
		if sh.DomainMachines <= 1 {
			if islandFits(r.fresh(), m) < g.Size {
				return 0, fmt.Sprintf("pool %s islands hold %d cards, the gang needs %d in one island", r.p.Spec.Name, sh.largestIsland(), g.Size*m.GPUs)
			}
			k = 1
		} else if k > sh.DomainMachines {
			return 0, fmt.Sprintf("pool %s NVLink domains hold %d machines, the gang needs %d in one", r.p.Spec.Name, sh.DomainMachines, k)
		}
	}
	if k > r.p.Spec.Max {
		return 0, fmt.Sprintf("pool %s would need %d machines, its max is %d", r.p.Spec.Name, k, r.p.Spec.Max)
	}
	return k, ""
}

// islands is how many NVLink islands the gang crosses on fresh machines of the pool.
func (r *poolRun) islands(g *Gang, k int) int {
	sh := r.p.Shape
	if sh.DomainMachines > 1 {
		return (k + sh.DomainMachines - 1) / sh.DomainMachines
	}
	if g.SameIsland {
		return 1
	}
	per := islandFits(r.fresh(), g.Member)
	if per <= 0 { // members cross islands inside machines
		return g.Size * ((g.Member.GPUs + sh.largestIsland() - 1) / max(1, sh.largestIsland()))
	}
	return (g.Size + per - 1) / per
}

// inFlight places the gang on capacity already launching (or planned by this decision) in
// the pool, and reports whether it fit.
func (r *poolRun) inFlight(g *Gang) bool {
	m := g.Member
	n := g.Size
	if len(r.flight) == 0 {
		return false
	}
	if g.SameIsland {
		if r.p.Shape.DomainMachines > 1 {
			return r.inFlightDomain(g)
		}
		for b := min(n*m.GPUs, len(r.byFree)-1); b < len(r.byFree); b++ {
			for _, i := range r.byFree[b] {
				v := r.flight[i]
				if islandFits(v, m) >= n {
					cards := make([]int, len(v.free))
					for k, f := range v.free {
						if m.GPUs > 0 && f/m.GPUs >= n {
							cards[k] = n * m.GPUs
							break
						}
					}
					r.take(i, cards, int64(n)*m.CPUMilli, int64(n)*m.MemMiB)
					return true
				}
			}
		}
		return false
	}
	// One machine, best fit, when the whole gang fits on one.
	if n*m.GPUs <= r.p.Shape.GPUs {
		lo := n * m.GPUs
		for b := lo; b < len(r.byFree); b++ {
			for _, i := range r.byFree[b] {
				v := r.flight[i]
				cards := make([]int, len(v.free))
				if fits(v, m, n, cards) >= n {
					r.take(i, cards, int64(n)*m.CPUMilli, int64(n)*m.MemMiB)
					return true
				}
			}
		}
	}
	// Several machines, fullest first (fewest machines crossed); all or nothing.
	type pick struct {
		i     int
		cards []int
		n     int
	}
	var picks []pick
	got := 0
	for b := len(r.byFree) - 1; b >= max(m.GPUs, 0) && got < n; b-- {
		for _, i := range r.byFree[b] {
			v := r.flight[i]
			cards := make([]int, len(v.free))
			k := fits(v, m, n-got, cards)
			if k > 0 {
				picks = append(picks, pick{i, cards, k})
				got += k
				if got >= n {
					break
				}
			}
		}
		if m.GPUs == 0 {
			break
		}
	}
	if got < n {
		return false
	}
	for _, p := range picks {
		r.take(p.i, p.cards, int64(p.n)*m.CPUMilli, int64(p.n)*m.MemMiB)
	}
	return true
}

// inFlightDomain places a same-island gang on the in-flight machines of one NVLink domain.
func (r *poolRun) inFlightDomain(g *Gang) bool {
	type pick struct {
		i     int
		cards []int
		n     int
	}
	for _, dom := range r.domOrder {
		if r.domFree[dom] < g.Size*g.Member.GPUs {
			continue
		}
		got := 0
		var picks []pick
		for _, i := range r.domVMs[dom] {
			v := r.flight[i]
			if v.total < g.Member.GPUs {
				continue
			}
			cards := make([]int, len(v.free))
			if k := fits(v, g.Member, g.Size-got, cards); k > 0 {
				picks = append(picks, pick{i, cards, k})
				got += k
			}
			if got >= g.Size {
				for _, p := range picks {
					r.take(p.i, p.cards, int64(p.n)*g.Member.CPUMilli, int64(p.n)*g.Member.MemMiB)
				}
				return true
			}
		}
	}
	return false
}

// blocked says why the pool cannot launch k machines now ("" when it can).
func (r *poolRun) blocked(k int) string {
	sp := &r.p.Spec
	switch {
	case sp.Capacity == Spot && r.st.SpotUnavailable:
		return fmt.Sprintf("pool %s: spot capacity unavailable", sp.Name)
	case r.count+k > sp.Max:
		return fmt.Sprintf("pool %s: %d machines + %d would pass its max %d", sp.Name, r.count, k, sp.Max)
	case sp.Budget.USDTotal > 0 && r.st.Spent >= sp.Budget.USDTotal:
		return fmt.Sprintf("pool %s: spent %.2f USD of its %.2f budget", sp.Name, r.st.Spent, sp.Budget.USDTotal)
	case sp.Budget.USDPerHour > 0 && float64(r.count+k)*sp.PricePerHour > sp.Budget.USDPerHour+1e-9:
		return fmt.Sprintf("pool %s: %d machines at %.2f USD/h would pass its budget of %.2f USD/h", sp.Name, r.count+k, sp.PricePerHour, sp.Budget.USDPerHour)
	}
	return ""
}

// scaleFor sizes capacity for one gang: on capacity in flight, else (room, when not nil,
// finds it on ready machines by moving gangs) on fresh machines of the best pool. d is nil
// for forecast gangs (no verdicts).
func (a *Autoscaler) scaleFor(d *Decision, runs map[string]*poolRun, order []*poolRun, g *Gang, replaces string, prewarm bool, room func(*Gang) bool) {
	infeasible := func(reason string) {
		if d != nil {
			d.Infeasible = append(d.Infeasible, Verdict{Gang: g.ID, Reason: reason})
		}
	}
	waiting := func(reason string) {
		if d != nil {
			d.Waiting = append(d.Waiting, Verdict{Gang: g.ID, Reason: reason})
		}
	}
	cands, why := candidates(runs, order, g)
	if why != "" {
		infeasible(why)
		return
	}
	sv := surveyPools(cands, g)
	switch {
	case sv.inFlight != nil:
		if !prewarm {
			waiting(fmt.Sprintf("waits for machines launching in pool %s", sv.inFlight.p.Spec.Name))
		}
		return
	case room != nil && room(g):
		return
	case len(sv.ok) == 0 && prewarm:
		return
	case len(sv.ok) == 0 && len(sv.notNow) == 0:
		infeasible("no pool can ever hold it: " + strings.Join(sv.never, "; "))
		return
	case len(sv.ok) == 0:
		waiting("no pool has room: " + strings.Join(sv.notNow, "; "))
		return
	}
	best := slices.MinFunc(sv.ok, compareCands)
	reason := launchReason(g, best, replaces, prewarm) + spotNote(runs, order, g, best, prewarm, sv.notNow)
	if best.topUp {
		best.r.launch(best.k, launchKey{prewarm: prewarm, replaces: replaces}, g.ID, reason)
		best.r.topUp(g)
		return
	}
	best.r.launchFor(g, best.k, launchKey{prewarm: prewarm, replaces: replaces}, reason)
}

// topUpNeed says whether the gang, too large for the pool's idle ready machines alone, can
// combine them with machines launching, and how many fresh machines that needs beyond those
// in flight. Idle machines alone are the scheduler's to fill, so a gang they hold, or one
// they hold no member of, does not combine; nor do same-island gangs or rack-fabric pools,
// whose machines must share an island or domain.
func (r *poolRun) topUpNeed(g *Gang) (int, bool) {
	if len(r.idle) == 0 || g.SameIsland || r.p.Shape.DomainMachines > 1 || g.Member.GPUs <= 0 {
		return 0, false
	}
	got := 0
	for _, v := range r.idle {
		got += fits(v, g.Member, g.Size-got, nil)
	}
	if got == 0 || got >= g.Size {
		return 0, false
	}
	// Fullest machines first, as topUp takes them, until the gang is whole.
	for b := len(r.byFree) - 1; b >= g.Member.GPUs && got < g.Size; b-- {
		for _, i := range r.byFree[b] {
			if got += fits(r.flight[i], g.Member, g.Size-got, nil); got >= g.Size {
				return 0, true
			}
		}
	}
	per := r.perMachine(g)
	return (g.Size - got + per - 1) / per, true
}

// topUp places the gang on the pool's idle ready machines and then on machines in flight
// (fullest first), once topUpNeed said they hold it.
func (r *poolRun) topUp(g *Gang) {
	m := g.Member
	left := g.Size
	for _, v := range r.idle {
		cards := make([]int, len(v.free))
		k := fits(v, m, left, cards)
		for i, c := range cards {
			v.free[i] -= c
			v.total -= c
		}
		v.cpu -= int64(k) * m.CPUMilli
		v.mem -= int64(k) * m.MemMiB
		left -= k
	}
	for b := len(r.byFree) - 1; b >= m.GPUs && left > 0; b-- {
		for _, i := range slices.Clone(r.byFree[b]) {
			cards := make([]int, len(r.flight[i].free))
			k := fits(r.flight[i], m, left, cards)
			if k > 0 {
				r.take(i, cards, int64(k)*m.CPUMilli, int64(k)*m.MemMiB)
				left -= k
			}
			if left == 0 {
				break
			}
		}
	}
}

// candidates returns the pools that may hold the gang (its pinned pool, else all), or why
// the gang itself can never be placed.
func candidates(runs map[string]*poolRun, order []*poolRun, g *Gang) ([]*poolRun, string) {
	if g.Size <= 0 || g.Member.GPUs < 0 || g.Member.CPUMilli < 0 || g.Member.MemMiB < 0 {
		return nil, fmt.Sprintf("gang of %d members asking %+v", g.Size, g.Member)
	}
	if g.Pool == "" {
		return order, ""
	}
	r := runs[g.Pool]
	if r == nil {
		return nil, fmt.Sprintf("pinned to pool %q, which is not configured", g.Pool)
	}
	return []*poolRun{r}, ""
}

// cand is a pool that can launch the k machines a gang needs now, over islands NVLink
// islands.
type cand struct {
	r       *poolRun
	k       int
	islands int
	spot    bool
	// topUp: the k machines complete the pool's idle ready machines and those in flight.
	topUp bool
}

// survey is what the candidate pools say of a gang.
type survey struct {
	ok     []cand
	never  []string // why pools can never hold it
	notNow []string // why pools that could hold it cannot launch now
	// inFlight is the pool whose capacity in flight took the gang; the survey stops there.
	inFlight *poolRun
}

// surveyPools asks each candidate pool, in order, whether it can hold the gang; the first
// with room for it on capacity in flight takes it.
func surveyPools(cands []*poolRun, g *Gang) survey {
	var sv survey
	for _, r := range cands {
		if r.p.Spec.Capacity == Spot && !g.Tolerant {
			sv.never = append(sv.never, fmt.Sprintf("pool %s is spot and the gang is not preemptible with checkpoints", r.p.Spec.Name))
			continue
		}
		k, why := r.need(g)
		if why != "" {
			sv.never = append(sv.never, why)
			continue
		}
		if r.inFlight(g) {
			sv.inFlight = r
			return sv
		}
		if more, ok := r.topUpNeed(g); ok && more == 0 {
			r.topUp(g)
			sv.inFlight = r
			return sv
		} else if ok && more < k && r.blocked(more) == "" {
			sv.ok = append(sv.ok, cand{r: r, k: more, islands: r.islands(g, k), spot: r.p.Spec.Capacity == Spot, topUp: true})
			continue
		}
		if why := r.blocked(k); why != "" {
			sv.notNow = append(sv.notNow, why)
			continue
		}
		sv.ok = append(sv.ok, cand{r: r, k: k, islands: r.islands(g, k), spot: r.p.Spec.Capacity == Spot})
	}
	return sv
}

// compareCands orders candidates best first: spot (for gangs that tolerate it; others see
// no spot pool), then fewest islands, lowest price for the machines, shortest launch
// latency, and pool name.
func compareCands(x, y cand) int {
	if x.spot != y.spot {
		if x.spot {
			return -1
		}
		return 1
	}
	if c := cmp.Compare(x.islands, y.islands); c != 0 {
		return c
	}
	if c := cmp.Compare(float64(x.k)*x.r.p.Spec.PricePerHour, float64(y.k)*y.r.p.Spec.PricePerHour); c != 0 {
		return c
	}
	if c := cmp.Compare(x.r.p.Spec.LaunchLatency, y.r.p.Spec.LaunchLatency); c != 0 {
		return c
	}
	return strings.Compare(x.r.p.Spec.Name, y.r.p.Spec.Name)
}

// launchReason says what a launch is for.
func launchReason(g *Gang, best cand, replaces string, prewarm bool) string {
	switch {
	case prewarm:
		return "pre-warm for forecast arrivals"
	case replaces != "":
		return fmt.Sprintf("replacement for %s (spot interruption)", replaces)
	}
	if best.topUp {
		return fmt.Sprintf("gang %s: %d members of %d cards need %d machines beside the pool's idle ones", g.ID, g.Size, g.Member.GPUs, best.k)
	}
	return fmt.Sprintf("gang %s: %d members of %d cards need %d machines, %d island(s)", g.ID, g.Size, g.Member.GPUs, best.k, best.islands)
}

// spotNote says, when the gang goes on-demand, why: the spot pools that could not launch
// now (notNow are the reasons of the pools blocked), or the gang not tolerating spot.
func spotNote(runs map[string]*poolRun, order []*poolRun, g *Gang, best cand, prewarm bool, notNow []string) string {
	var note string
	if !best.spot && g.Tolerant {
		var spotWhy []string
		for _, w := range notNow {
			if strings.Contains(w, "spot") || isSpotPool(runs, w) {
				spotWhy = append(spotWhy, w)
			}
		}
		if len(spotWhy) > 0 {
			note += "; on-demand fallback: " + strings.Join(spotWhy, "; ")
		}
	}
	if !g.Tolerant && !prewarm && hasSpot(order) {
		note += "; on-demand: the gang is not preemptible with checkpoints"
	}
	return note
}

// launchFor plans k fresh machines for the gang (key gives the launch's prewarm and
// replaces; the NVLink domain is chosen here) and places the gang on them. A gang larger
// than a domain fills whole new domains.
func (r *poolRun) launchFor(g *Gang, k int, key launchKey, reason string) {
	dm := r.p.Shape.DomainMachines
	if dm <= 1 || k <= dm {
		key.domain = r.nextDomain(min(k, max(1, dm)))
		r.fill(g, r.launch(k, key, g.ID, reason))
		return
	}
	var idx []int
	for left := k; left > 0; {
		n := min(left, dm)
		key.domain = r.nextDomain(dm)
		idx = append(idx, r.launch(n, key, g.ID, reason)...)
		left -= n
	}
	r.fill(g, idx)
}

// fill places the gang's members on the machines just planned for it.
func (r *poolRun) fill(g *Gang, idx []int) {
	left := g.Size
	for _, i := range idx {
		if left == 0 {
			break
		}
		v := r.flight[i]
		cards := make([]int, len(v.free))
		k := fits(v, g.Member, left, cards)
		if g.SameIsland && r.p.Shape.DomainMachines <= 1 {
			cards = make([]int, len(v.free))
			for j, f := range v.free {
				if g.Member.GPUs > 0 && f/g.Member.GPUs >= left {
					cards[j] = left * g.Member.GPUs
					break
				}
			}
			k = left
		}
		r.take(i, cards, int64(k)*g.Member.CPUMilli, int64(k)*g.Member.MemMiB)
		left -= k
	}
}

func hasSpot(order []*poolRun) bool {
	for _, r := range order {
		if r.p.Spec.Capacity == Spot {
			return true
		}
	}
	return false
}

// isSpotPool reports whether a blocked-reason names a spot pool.
func isSpotPool(runs map[string]*poolRun, why string) bool {
	name, _, _ := strings.Cut(strings.TrimPrefix(why, "pool "), ":")
	r := runs[name]
	return r != nil && r.p.Spec.Capacity == Spot
}
