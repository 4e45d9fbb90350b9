package gang

// prioritySort is the default QueueSort: the priority class raised by aging first, then the
// dynamic priority α·(remaining/total) + β·(resource satisfaction) + γ·(queue sensitivity).
type prioritySort struct{}

func (prioritySort) Name() string { return PluginPriority }

func (prioritySort) Less(a, b *QueuedGang) bool {
	if a.Class != b.Class {
		return a.Class > b.Class
	}
	return a.Dynamic > b.Dynamic
}

// fifoSort orders by arrival only (the framework's tie-break).
type fifoSort struct{}

func (fifoSort) Name() string { return PluginFIFO }

func (fifoSort) Less(a, b *QueuedGang) bool { return false }

// lasSort is Tiresias' discretized two-dimensional least-attained-service order (Gu et al.,
// NSDI'19): gangs whose attained GPU-seconds are below LASThreshold go first; inside each
// of the two queues, arrival order. It needs no job-size knowledge.
type lasSort struct{ threshold float64 }

func (lasSort) Name() string { return PluginLAS }

func (l lasSort) Less(a, b *QueuedGang) bool {
	qa, qb := a.Attained >= l.threshold, b.Attained >= l.threshold
	return !qa && qb
}

// srtfSort is shortest-remaining-first by expected GPU-seconds left (from
// Request.Duration, else what runtimes.go predicts): the oracle order when durations are
// exact. Gangs with unknown durations go last.
type srtfSort struct{}

func (srtfSort) Name() string { return PluginSRTF }

func (srtfSort) Less(a, b *QueuedGang) bool {
	ra, rb := a.RemainingGPUSeconds, b.RemainingGPUSeconds
	switch {
	case ra == 0 && rb == 0:
		return false
	case ra == 0:
		return false
	case rb == 0:
		return true
	}
	return ra < rb
}

// urgencySort is Atoll's default QueueSort: priority class first (Config.AgingStep, when
// set, raises it), then the gang's expected remaining GPU-seconds — from its declared
// duration, else the run-time predictor or its time limit (runtimes.go), else the
// least-attained-service estimate max(attained, UnknownDuration × its GPUs) — divided by 1 + waited/RemainingAging (so that a long gang is not passed over
// forever within its class), smallest first; then the dynamic priority.
type urgencySort struct {
	unknown  float64 // seconds per GPU assumed for a gang of unknown duration
	aging    float64 // seconds of waiting that halve a gang's key; 0 = off
	weighted bool    // classes weigh the key instead of ordering strictly
	cw       func(int) float64
}

func (urgencySort) Name() string { return PluginUrgency }

func (u urgencySort) key(g *QueuedGang) float64 {
	r := g.RemainingGPUSeconds
	if r <= 0 {
		gpus := float64(g.Request.Min) * float64(g.Request.Member.TotalMilli()) / Milli
		r = max(g.Attained, u.unknown*gpus)
	}
	if u.aging > 0 {
		r /= 1 + g.Waited.Seconds()/u.aging
	}
	if u.weighted {
		r /= u.cw(g.Class)
	}
	return r
}

// keyedSort is a QueueSort that orders by a key of each gang (then by its own ties): the
// cycle computes the key once per gang (QueuedGang.sortKey) instead of at every comparison.
type keyedSort interface {
	key(g *QueuedGang) float64
}

// cachedKey is g's key, computed once per cycle where the cycle did.
func (u urgencySort) cachedKey(g *QueuedGang) float64 {
	if g.keyed {
		return g.sortKey
	}
	return u.key(g)
}

// lessEntries is Less on the cycle's heap entries, which hold the views' class, key
// and dynamic priority.
func (u *urgencySort) lessEntries(a, b *heapEntry) bool {
	if a.class != b.class && !u.weighted {
		return a.class > b.class
	}
	if a.key != b.key {
		return a.key < b.key
	}
	return a.dyn > b.dyn
}

func (u urgencySort) Less(a, b *QueuedGang) bool {
	if a.Class != b.Class && !u.weighted {
		return a.Class > b.Class
	}
	if ka, kb := u.cachedKey(a), u.cachedKey(b); ka != kb {
		return ka < kb
	}
	return a.Dynamic > b.Dynamic
}
