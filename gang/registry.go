package gang

import (
	"fmt"
	"slices"
	"sort"
)

// PluginFactory builds a plugin for one scheduler. It is called once, from New, with the
// scheduler as handle; the plugin may keep the handle.
type PluginFactory func(h Handle) (Plugin, error)

// Registry maps plugin names to factories (kube-scheduler's runtime.Registry). It is a
// plain value: nothing registers itself globally.
type Registry map[string]PluginFactory

// Register adds a factory; a name already present is refused with ErrDuplicatePlugin.
func (r Registry) Register(name string, f PluginFactory) error {
	if name == "" || f == nil {
		return fmt.Errorf("gang: register plugin %q: empty name or nil factory: %w", name, ErrInvalidConfig)
	}
	if _, ok := r[name]; ok {
		return fmt.Errorf("gang: register plugin %q: %w", name, ErrDuplicatePlugin)
	}
	r[name] = f
	return nil
}

// Merge registers every factory of o; it refuses (and adds nothing) when a name is taken.
func (r Registry) Merge(o Registry) error {
	names := make([]string, 0, len(o))
	for name := range o {
		if _, ok := r[name]; ok {
			return fmt.Errorf("gang: merge plugin %q: %w", name, ErrDuplicatePlugin)
		}
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if err := r.Register(name, o[name]); err != nil {
			return err
		}
	}
	return nil
}

// Names of the in-tree plugins.
const (
	PluginUrgency        = "urgency"         // QueueSort: class, then expected remaining GPU-time
	PluginPriority       = "priority"        // QueueSort: aged class, then dynamic priority
	PluginFIFO           = "fifo"            // QueueSort: arrival order
	PluginLAS            = "las"             // QueueSort: Tiresias' two-queue least attained service
	PluginSRTF           = "srtf"            // QueueSort: shortest expected remaining GPU-time
	PluginQuota          = "quota"           // PreFilter: queue quota admission (Kueue-like)
	PluginTopologyWait   = "topology-wait"   // Permit: delay scheduling for a compact placement
	PluginPreemption     = "preemption"      // PostFilter: evict cheapest lower-priority gangs when it pays
	PluginLASPreemption  = "las-preemption"  // PostFilter: Tiresias' queue-order preemption
	PluginSRTFPreemption = "srtf-preemption" // PostFilter: shortest-remaining-first preemption
	PluginBackfill       = "backfill"        // Reserve: shadow-time reservation, backfill around it
	PluginTopology       = "topology"        // Score
	PluginFragmentation  = "fragmentation"   // Score
	PluginLoad           = "load"            // Score
	PluginBinpack        = "binpack"         // Score
	PluginSpread         = "spread"          // Score: members of StrategySpread gangs on distinct machines (soft)
	PluginStrictSpread   = "strict-spread"   // Filter: members of StrategyStrictSpread gangs on distinct machines
	PluginStrictPack     = "strict-pack"     // Filter: members of StrategyStrictPack gangs on one machine
	PluginMachines       = "machines"        // Filter: members of gangs pinned to machines (Request.Machines) on them alone
)

// InTreeRegistry returns a new registry holding the in-tree plugins.
func InTreeRegistry() Registry {
	return Registry{
		PluginPriority: func(Handle) (Plugin, error) { return prioritySort{}, nil },
		PluginFIFO:     func(Handle) (Plugin, error) { return fifoSort{}, nil },
		PluginLAS:      func(h Handle) (Plugin, error) { return lasSort{threshold: h.Config().LASThreshold}, nil },
		PluginSRTF:     func(Handle) (Plugin, error) { return srtfSort{}, nil },
		PluginUrgency: func(h Handle) (Plugin, error) {
			c := h.Config()
			return urgencySort{unknown: c.UnknownDuration.Seconds(), aging: c.RemainingAging.Seconds(), weighted: !c.StrictClasses, cw: c.classWeight}, nil
		},
		PluginQuota:        func(Handle) (Plugin, error) { return quotaPlugin{}, nil },
		PluginTopologyWait: func(Handle) (Plugin, error) { return &topologyWait{}, nil },
		PluginPreemption:   func(Handle) (Plugin, error) { return preemption{}, nil },
		PluginLASPreemption: func(h Handle) (Plugin, error) {
			return rankPreemption{name: PluginLASPreemption, after: lasAfter(h.Config().LASThreshold)}, nil
		},
		PluginSRTFPreemption: func(Handle) (Plugin, error) {
			return rankPreemption{name: PluginSRTFPreemption, after: srtfAfter}, nil
		},
		PluginBackfill:      func(Handle) (Plugin, error) { return backfill{}, nil },
		PluginTopology:      func(Handle) (Plugin, error) { return TopologyPlugin{}, nil },
		PluginFragmentation: func(Handle) (Plugin, error) { return FragmentationPlugin{}, nil },
		PluginLoad:          func(Handle) (Plugin, error) { return LoadPlugin{}, nil },
		PluginBinpack:       func(Handle) (Plugin, error) { return BinpackPlugin{}, nil },
		PluginSpread:        func(Handle) (Plugin, error) { return spreadScore{}, nil },
		PluginStrictSpread:  func(Handle) (Plugin, error) { return strictSpread{}, nil },
		PluginStrictPack:    func(Handle) (Plugin, error) { return strictPack{}, nil },
		PluginMachines:      func(Handle) (Plugin, error) { return pinned{}, nil },
	}
}

// ScoreWeight names a registered score plugin and its weight.
type ScoreWeight struct {
	Name   string
	Weight float64
}

// Plugins names the plugins run at each extension point. A nil list (or an empty
// QueueSort) keeps the default the feature switches of Config select: QueueSort "fifo"
// with StrictFIFO, else "urgency"; PreFilter "quota" with QuotaAdmission; Filter
// "strict-spread" and "strict-pack"; Permit "topology-wait" with TopologyAware and
// TopologyWait > 0; PostFilter "preemption" with Preemption; Reserve "backfill" with
// Backfill. A non-nil empty list turns a point off. Score lists registered score plugins
// added to the four weighted by Config.Weights; nil: "spread" with weight 10.
type Plugins struct {
	QueueSort  string
	PreFilter  []string
	Filter     []string
	Score      []ScoreWeight
	Permit     []string
	PostFilter []string
	Reserve    []string
}

// profile is the instantiated plugin set of a scheduler.
type profile struct {
	queueSort  QueueSortPlugin
	preFilter  []PreFilterPlugin
	filter     []FilterPlugin
	score      []weightedPlugin
	permit     []PermitPlugin
	postFilter []PostFilterPlugin
	reserve    []ReservePlugin
}

// resolved returns the plugin names of each point with the defaults filled in.
func (c Config) resolved() Plugins {
	p := c.Plugins
	if p.QueueSort == "" {
		p.QueueSort = PluginUrgency
		if c.StrictFIFO {
			p.QueueSort = PluginFIFO
		}
	}
	if p.Filter == nil {
		p.Filter = []string{PluginStrictSpread, PluginStrictPack, PluginMachines}
	}
	if p.Score == nil {
		p.Score = []ScoreWeight{{Name: PluginSpread, Weight: defaultSpreadWeight}}
	}
	if p.PreFilter == nil && c.QuotaAdmission {
		p.PreFilter = []string{PluginQuota}
	}
	if p.Permit == nil && c.TopologyAware && c.TopologyWait > 0 {
		p.Permit = []string{PluginTopologyWait}
	}
	if p.PostFilter == nil && c.Preemption {
		p.PostFilter = []string{PluginPreemption}
	}
	if p.Reserve == nil && c.Backfill {
		p.Reserve = []string{PluginBackfill}
	}
	return p
}

// buildProfile instantiates the configured plugins from the registry; a plugin named at
// several points is built once.
func buildProfile(cfg Config, reg Registry, h Handle) (*profile, error) {
	names := cfg.resolved()
	b := &builder{reg: reg, h: h, built: map[string]Plugin{}}
	pr := &profile{score: pluginsFor(cfg.Weights)}
	sorts, err := pluginsAt[QueueSortPlugin](b, "QueueSort", []string{names.QueueSort})
	if err != nil {
		return nil, err
	}
	pr.queueSort = sorts[0]
	if pr.preFilter, err = pluginsAt[PreFilterPlugin](b, "PreFilter", names.PreFilter); err != nil {
		return nil, err
	}
	if pr.filter, err = pluginsAt[FilterPlugin](b, "Filter", names.Filter); err != nil {
		return nil, err
	}
	if pr.permit, err = pluginsAt[PermitPlugin](b, "Permit", names.Permit); err != nil {
		return nil, err
	}
	if pr.postFilter, err = pluginsAt[PostFilterPlugin](b, "PostFilter", names.PostFilter); err != nil {
		return nil, err
	}
	if pr.reserve, err = pluginsAt[ReservePlugin](b, "Reserve", names.Reserve); err != nil {
		return nil, err
	}
	for _, sw := range names.Score {
		if slices.ContainsFunc(pr.score, func(w weightedPlugin) bool { return w.p.Name() == sw.Name }) {
			return nil, fmt.Errorf("gang: score plugin %q listed twice: %w", sw.Name, ErrInvalidConfig)
		}
		if sw.Weight < 0 {
			return nil, fmt.Errorf("gang: score plugin %q weight %v < 0: %w", sw.Name, sw.Weight, ErrInvalidConfig)
		}
		ps, err := pluginsAt[ScorePlugin](b, "Score", []string{sw.Name})
		if err != nil {
			return nil, err
		}
		if sw.Weight > 0 {
			pr.score = append(pr.score, weightedPlugin{ps[0], sw.Weight})
		}
	}
	return pr, nil
}

// has reports whether the Filter or Score plugins include the named one.
func (p *profile) has(name string) bool {
	for _, f := range p.filter {
		if f.Name() == name {
			return true
		}
	}
	for _, w := range p.score {
		if w.p.Name() == name {
			return true
		}
	}
	return false
}

type builder struct {
	reg   Registry
	h     Handle
	built map[string]Plugin
}

// pluginsAt builds the named plugins of one extension point and checks that each serves it.
func pluginsAt[T Plugin](b *builder, point string, names []string) ([]T, error) {
	var out []T
	for _, name := range names {
		p, ok := b.built[name]
		if !ok {
			f, found := b.reg[name]
			if !found {
				return nil, fmt.Errorf("gang: %s plugin %q: %w", point, name, ErrUnknownPlugin)
			}
			var err error
			if p, err = f(b.h); err != nil {
				return nil, fmt.Errorf("gang: build %s plugin %q: %w", point, name, err)
			}
			b.built[name] = p
		}
		x, ok := p.(T)
		if !ok {
			return nil, fmt.Errorf("gang: plugin %q is not a %s plugin: %w", name, point, ErrInvalidConfig)
		}
		out = append(out, x)
	}
	return out, nil
}
