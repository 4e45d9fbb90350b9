package sim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"
)

// Information settings of the dynamic mode: what every policy is told of how long jobs
// run (DynamicOptions.Info). The traces carry run times and nothing else, so the settings
// decide what the requests say:
//   - InfoBlind: nothing. Policies see job shape, arrival and queue history (attained
//     service, and the run times of jobs that have completed, which any scheduler sees).
//   - InfoEstimate: each job carries a user's time limit (Job.TimeLimit, modelled by
//     EstimateModel), an upper bound on its run time that is mostly far above it.
//   - InfoOracle: each job's true run time.
//
// Every policy gets the same: only "srtf", the oracle reference, is given true run times
// in every setting.
const (
	InfoBlind    = "blind"
	InfoEstimate = "estimate"
	InfoOracle   = "oracle"
)

// Infos lists the information settings.
var Infos = []string{InfoBlind, InfoEstimate, InfoOracle}

// EstimateModel generates the time limits users give their jobs, as studies of parallel
// and HPC workload logs describe user runtime estimates:
//   - they are modal: users pick round values from a short menu (Tsafrir, Etsion and
//     Feitelson, "Modeling User Runtime Estimates", JSSPP 2005: about 20 values cover
//     about 90% of the jobs), the site's maximum being the most popular single value;
//   - they overestimate, often by a large factor (Mu'alem and Feitelson, "Utilization,
//     Predictability, Workloads, and User Runtime Estimates in Scheduling the IBM SP2
//     with Backfilling", IEEE TPDS 2001): a job's guess is its run time times a factor
//     drawn log-uniformly in [1, MaxFactor], rounded up to the menu;
//   - a share of jobs reach their limit (in the logs they were killed at it). The trace's
//     run times are what the jobs ran, and every setting must replay the same work, so
//     those jobs are given their run time as their limit instead of being cut short.
//
// A job longer than the site maximum gets the smallest menu value (beyond the maximum,
// whole multiples of it) at or above its guess. The parameter values are this project's
// choice, not fitted: the traces record no estimates.
type EstimateModel struct {
	// Menu is the round values users choose from, ascending; its last is the site's
	// maximum.
	Menu []time.Duration
	// MaxShare is the share of jobs whose user asks the maximum whatever the job (when
	// the job fits in it).
	MaxShare float64
	// ExactShare is the share of jobs whose limit is their run time (they reach it).
	ExactShare float64
	// MaxFactor bounds the overestimate factor of the other jobs.
	MaxFactor float64
}

// DefaultEstimateModel returns the model docs/scheduler.md states: a menu of 15 min,
// 30 min, 1, 2, 4, 8, 12, 24 and 48 h, 3 days and 7 days (the maximum); 20% of jobs ask
// the maximum, 10% reach their limit, the rest overestimate by a factor log-uniform in
// [1, 10].
func DefaultEstimateModel() EstimateModel {
	h := time.Hour
	return EstimateModel{
		Menu:       []time.Duration{15 * time.Minute, 30 * time.Minute, h, 2 * h, 4 * h, 8 * h, 12 * h, 24 * h, 48 * h, 72 * h, 168 * h},
		MaxShare:   0.2,
		ExactShare: 0.1,
		MaxFactor:  10,
	}
}

// Validate checks the model.
func (m EstimateModel) Validate() error {
	switch {
	case len(m.Menu) == 0 || !slices.IsSorted(m.Menu) || m.Menu[0] <= 0:
		return fmt.Errorf("sim: estimate menu %v: want positive values, ascending: %w", m.Menu, ErrBadSpec)
	case !(m.MaxShare >= 0 && m.ExactShare >= 0 && m.MaxShare+m.ExactShare <= 1):
		return fmt.Errorf("sim: estimate shares max %v, exact %v: want non-negative, at most 1 together: %w", m.MaxShare, m.ExactShare, ErrBadSpec)
	case !(m.MaxFactor >= 1) || math.IsInf(m.MaxFactor, 0):
		return fmt.Errorf("sim: estimate factor %v: want a finite number >= 1: %w", m.MaxFactor, ErrBadSpec)
	}
	return nil
}

// roundUp returns the smallest menu value at or above d; beyond the maximum, the smallest
// whole multiple of it.
func (m EstimateModel) roundUp(d time.Duration) time.Duration {
	if i, _ := slices.BinarySearch(m.Menu, d); i < len(m.Menu) {
		return m.Menu[i]
	}
	top := m.Menu[len(m.Menu)-1]
	return time.Duration(math.Ceil(float64(d)/float64(top))) * top
}

// AssignTimeLimits gives every job a time limit at or above its run time, seeded (the
// same seed and jobs give the same limits).
func AssignTimeLimits(jobs []Job, m EstimateModel, seed uint64) error {
	if err := m.Validate(); err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(seed, 0x71e11))
	top := m.Menu[len(m.Menu)-1]
	for i := range jobs {
		d := jobs[i].Duration
		u, v := rng.Float64(), rng.Float64()
		switch {
		case u < m.ExactShare:
			jobs[i].TimeLimit = d.Round(time.Second)
			if jobs[i].TimeLimit < d {
				jobs[i].TimeLimit += time.Second
			}
		case u < m.ExactShare+m.MaxShare && d <= top:
			jobs[i].TimeLimit = top
		default:
			f := math.Exp(v * math.Log(m.MaxFactor))
			jobs[i].TimeLimit = m.roundUp(time.Duration(float64(d) * f))
		}
	}
	return nil
}
