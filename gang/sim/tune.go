package sim

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"

	"github.com/atoll-run/atoll/gang"
)

// TuneMethod names the search `atoll tune` runs.
const TuneMethod = "successive-halving"

// TuneOptions configure Tune: successive halving (Jamieson and Talwalkar, AISTATS 2016;
// the inner loop of Hyperband, Li et al., JMLR 2018) over the atoll policy's weights, with
// the number of jobs replayed as the resource: Budget candidates (the hand-set weights and
// Budget−1 seeded draws) are replayed on the first MaxJobs/Eta^(Rungs−1) jobs of every
// tuning trace, the best 1/Eta go on to Eta times as many jobs, and so on up to MaxJobs.
type TuneOptions struct {
	// Training is the replay setting (information, saturation, elastic share); its
	// MaxJobs, Policies and Weights are set by Tune.
	Training DynamicOptions
	Budget   int // candidates at the first rung, the hand-set weights among them
	Rungs    int
	Eta      int
	MaxJobs  int // jobs per trace at the last rung
	Seed     uint64
}

// DefaultTuneOptions: 27 candidates, 3 rungs (27 on 1/9 of the jobs, 9 on 1/3, 3 on all),
// 900 jobs per trace at the last rung, the estimate setting, arrivals saturated to 0.9.
func DefaultTuneOptions() TuneOptions {
	return TuneOptions{Training: DynamicOptions{Info: InfoEstimate, SaturateLoad: 0.9, PrioritySeed: 1}, Budget: 27, Rungs: 3, Eta: 3, MaxJobs: 900, Seed: 1}
}

// Validate checks the options.
func (o TuneOptions) Validate() error {
	if o.Budget < 1 || o.Budget > 10_000 || o.Rungs < 1 || o.Rungs > 8 || o.Eta < 2 || o.Eta > 16 || o.MaxJobs < 1 || o.MaxJobs > MaxTraceJobs {
		return fmt.Errorf("sim: tune budget %d, rungs %d, eta %d, max jobs %d: want budget in [1, 10000], rungs in [1, 8], eta in [2, 16], max jobs >= 1: %w",
			o.Budget, o.Rungs, o.Eta, o.MaxJobs, ErrBadSpec)
	}
	t := o.Training
	t.Policies, t.Weights = nil, nil
	return t.Validate()
}

// TuneTrace is a trace to tune on or evaluate on.
type TuneTrace struct {
	Name string
	Jobs []Job
}

// TuneScore is how one set of weights does on one trace.
type TuneScore struct {
	Trace    string  `json:"trace"`
	JCTMean  float64 `json:"training_jct_mean_s"`
	HighPrio float64 `json:"high_prio_queue_delay_mean_s"`
	UtilPct  float64 `json:"util_pct"`
}

// TuneComparison sets the tuned weights against the hand-set ones on one trace.
type TuneComparison struct {
	Trace string    `json:"trace"`
	Hand  TuneScore `json:"hand"`
	Tuned TuneScore `json:"tuned"`
	// Objective is the tuned weights' objective relative to the hand-set ones (1 = as
	// good; below 1 is better): the mean of mean JCT and high-priority queueing, each
	// over the hand-set weights' value.
	Objective float64 `json:"objective"`
	Better    bool    `json:"better"`
}

// TuneResult is what Tune found.
type TuneResult struct {
	Method      string                `json:"method"`
	Evaluations int                   `json:"evaluations"`
	Hand        gang.SchedulerWeights `json:"hand"`
	Tuned       gang.SchedulerWeights `json:"tuned"`
	TunedOn     []TuneComparison      `json:"tuned_on"`
	Holdout     []TuneComparison      `json:"holdout"`
}

// Tune searches the atoll policy's weights on the tuning traces and compares the best
// against the hand-set ones (gang.DefaultConfig) on the tuning and the holdout traces, all
// replayed on the same cluster. The same options give the same result.
func Tune(ctx context.Context, tuneOn, holdout []TuneTrace, snap gang.Snapshot, model gang.CollectiveModel, opt TuneOptions) (TuneResult, error) {
	if err := opt.Validate(); err != nil {
		return TuneResult{}, err
	}
	if len(tuneOn) == 0 || len(holdout) == 0 {
		return TuneResult{}, fmt.Errorf("sim: tune needs a trace to tune on and one to hold out: %w", ErrBadSpec)
	}
	hand := gang.WeightsOf(gang.DefaultConfig())
	cands := []gang.SchedulerWeights{hand}
	rng := rand.New(rand.NewPCG(opt.Seed, 0x7e11e))
	for len(cands) < opt.Budget {
		cands = append(cands, drawWeights(hand, rng))
	}
	res := TuneResult{Method: TuneMethod, Hand: hand}
	prepared := map[[2]int][]Job{}
	prep := func(t, n int) ([]Job, error) {
		if j, ok := prepared[[2]int{t, n}]; ok {
			return j, nil
		}
		o := opt.Training
		o.MaxJobs, o.Policies, o.Weights = n, nil, nil
		j, _, err := prepareJobs(ctx, tuneOn[t].Jobs, snap, model, o)
		prepared[[2]int{t, n}] = j
		return j, err
	}
	var best gang.SchedulerWeights
	for rung := 0; rung < opt.Rungs; rung++ {
		n := max(1, opt.MaxJobs/int(math.Pow(float64(opt.Eta), float64(opt.Rungs-1-rung))))
		type scored struct {
			w   gang.SchedulerWeights
			obj float64
			i   int
		}
		var sc []scored
		var base []TuneScore
		for i, w := range cands {
			obj := 0.0
			for t := range tuneOn {
				jobs, err := prep(t, n)
				if err != nil {
					return TuneResult{}, err
				}
				s, err := scoreWeights(ctx, tuneOn[t].Name, w, jobs, snap, model, opt.Training.info())
				if err != nil {
					return TuneResult{}, err
				}
				res.Evaluations++
				if i == 0 {
					base = append(base, s)
				}
				obj += objective(s, base[t]) / float64(len(tuneOn))
			}
			sc = append(sc, scored{w, obj, i})
		}
		sort.SliceStable(sc, func(a, b int) bool { return sc[a].obj < sc[b].obj })
		keep := max(1, int(math.Ceil(float64(len(sc))/float64(opt.Eta))))
		if rung == opt.Rungs-1 {
			keep = 1
		}
		next := []gang.SchedulerWeights{hand} // the hand-set weights stay in every rung: the reference
		for _, s := range sc[:keep] {
			if s.i != 0 {
				next = append(next, s.w)
			}
		}
		best = sc[0].w
		cands = next
	}
	res.Tuned = best
	compare := func(traces []TuneTrace) ([]TuneComparison, error) {
		var out []TuneComparison
		for _, tr := range traces {
			o := opt.Training
			o.MaxJobs, o.Policies, o.Weights = opt.MaxJobs, nil, nil
			jobs, _, err := prepareJobs(ctx, tr.Jobs, snap, model, o)
			if err != nil {
				return nil, err
			}
			h, err := scoreWeights(ctx, tr.Name, hand, jobs, snap, model, o.info())
			if err != nil {
				return nil, err
			}
			t, err := scoreWeights(ctx, tr.Name, best, jobs, snap, model, o.info())
			if err != nil {
				return nil, err
			}
			obj := round4(objective(t, h))
			out = append(out, TuneComparison{Trace: tr.Name, Hand: h, Tuned: t, Objective: obj, Better: obj < 1})
		}
		return out, nil
	}
	var err error
	if res.TunedOn, err = compare(tuneOn); err != nil {
		return TuneResult{}, err
	}
	if res.Holdout, err = compare(holdout); err != nil {
		return TuneResult{}, err
	}
	return res, nil
}

func round4(x float64) float64 { return math.Round(x*1e4) / 1e4 }

// objective is s's mean JCT and high-priority queueing, each relative to base's, averaged
// (queueing below a second counts as a second: a ratio of two near-zero waits means
// nothing).
func objective(s, base TuneScore) float64 {
	return (s.JCTMean/max(base.JCTMean, 1) + max(s.HighPrio, 1)/max(base.HighPrio, 1)) / 2
}

// scoreWeights replays jobs under the atoll policy with weights w.
func scoreWeights(ctx context.Context, name string, w gang.SchedulerWeights, jobs []Job, snap gang.Snapshot, model gang.CollectiveModel, info string) (TuneScore, error) {
	cfg, blind, err := PolicyConfig("atoll")
	if err != nil {
		return TuneScore{}, err
	}
	w.Apply(&cfg)
	r, err := runConfig(ctx, "atoll", info, cfg, blind, jobs, snap, model)
	if err != nil {
		return TuneScore{}, err
	}
	return TuneScore{Trace: name, JCTMean: r.JCT.Mean, HighPrio: r.HighPrioQueueDelay.Mean, UtilPct: r.UtilPct}, nil
}

// drawWeights draws a candidate: each weight the hand-set one times a factor log-uniform
// in [1/4, 4] (a zero weight is drawn in [0, 1]); ClassWeight in [2, 32], RemainingAging
// in [3, 96] hours, the gain ratio in [0.25, 4].
func drawWeights(h gang.SchedulerWeights, rng *rand.Rand) gang.SchedulerWeights {
	f := func(v float64) float64 {
		if v == 0 {
			return math.Round(rng.Float64()*1000) / 1000
		}
		return math.Round(v*math.Exp((rng.Float64()*2-1)*math.Log(4))*1000) / 1000
	}
	lu := func(lo, hi float64) float64 {
		return math.Round(math.Exp(math.Log(lo)+rng.Float64()*(math.Log(hi)-math.Log(lo)))*1000) / 1000
	}
	w := gang.SchedulerWeights{Alpha: f(h.Alpha), Beta: f(h.Beta), Gamma: f(h.Gamma), Topology: f(h.Topology), Fragmentation: f(h.Fragmentation),
		Load: f(h.Load), Binpack: f(h.Binpack), ClassWeight: lu(2, 32), RemainingAgingHours: lu(3, 96), PreemptGainRatio: lu(0.25, 4)}
	return w
}
