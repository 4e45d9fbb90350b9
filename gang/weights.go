package gang

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"time"
)

// SchedulerWeights are the tunable weights of the core: the dynamic priority's α, β, γ, the
// placement score weights, what one priority class is worth (ClassWeight), how fast
// waiting discounts a gang's remaining work in the "urgency" order (RemainingAging) and the
// preemption's gain ratio. `atoll tune` writes them to a file (WeightsFile); `atoll sim
// --weights` and `atoll head --scheduler-weights` load it.
type SchedulerWeights struct {
	Alpha float64 `json:"alpha"`
	Beta  float64 `json:"beta"`
	Gamma float64 `json:"gamma"`
	// Score weights (Config.Weights).
	Topology      float64 `json:"topology"`
	Fragmentation float64 `json:"fragmentation"`
	Load          float64 `json:"load"`
	Binpack       float64 `json:"binpack"`
	// ClassWeight is Config.ClassWeight (>= 1).
	ClassWeight float64 `json:"class_weight"`
	// RemainingAgingHours is Config.RemainingAging in hours (0 turns it off).
	RemainingAgingHours float64 `json:"remaining_aging_h"`
	// PreemptGainRatio is Config.Preempt.GainRatio.
	PreemptGainRatio float64 `json:"preempt_gain_ratio"`
}

// WeightsOf returns the weights of cfg.
func WeightsOf(cfg Config) SchedulerWeights {
	return SchedulerWeights{
		Alpha: cfg.Priority.Alpha, Beta: cfg.Priority.Beta, Gamma: cfg.Priority.Gamma,
		Topology: cfg.Weights.Topology, Fragmentation: cfg.Weights.Fragmentation, Load: cfg.Weights.Load, Binpack: cfg.Weights.Binpack,
		ClassWeight: cfg.ClassWeight, RemainingAgingHours: cfg.RemainingAging.Hours(), PreemptGainRatio: cfg.Preempt.GainRatio,
	}
}

// Apply sets the weights in cfg.
func (w SchedulerWeights) Apply(cfg *Config) {
	cfg.Priority = PriorityWeights{Alpha: w.Alpha, Beta: w.Beta, Gamma: w.Gamma}
	cfg.Weights = Weights{Topology: w.Topology, Fragmentation: w.Fragmentation, Load: w.Load, Binpack: w.Binpack}
	cfg.ClassWeight = w.ClassWeight
	cfg.RemainingAging = time.Duration(w.RemainingAgingHours * float64(time.Hour))
	cfg.Preempt.GainRatio = w.PreemptGainRatio
}

// MaxWeight bounds every weight (a weight file is operator input).
const MaxWeight = 1e6

// Validate checks every weight is finite, non-negative and at most MaxWeight, and that
// ClassWeight is at least 1.
func (w SchedulerWeights) Validate() error {
	for _, f := range []struct {
		name string
		v    float64
	}{
		{"alpha", w.Alpha}, {"beta", w.Beta}, {"gamma", w.Gamma}, {"topology", w.Topology}, {"fragmentation", w.Fragmentation},
		{"load", w.Load}, {"binpack", w.Binpack}, {"class_weight", w.ClassWeight}, {"remaining_aging_h", w.RemainingAgingHours},
		{"preempt_gain_ratio", w.PreemptGainRatio},
	} {
		if !(f.v >= 0 && f.v <= MaxWeight) || math.IsNaN(f.v) {
			return fmt.Errorf("gang: weight %s %v outside [0, %g]: %w", f.name, f.v, float64(MaxWeight), ErrInvalidConfig)
		}
	}
	if w.ClassWeight < 1 {
		return fmt.Errorf("gang: weight class_weight %v must be >= 1: %w", w.ClassWeight, ErrInvalidConfig)
	}
	return nil
}

// WeightsFile is the file `atoll tune` writes: the weights, and what they were tuned on.
type WeightsFile struct {
	Weights SchedulerWeights `json:"weights"`
	// TunedOn and Method say where the weights come from (free text; not read back).
	TunedOn []string `json:"tuned_on,omitempty"`
	Method  string   `json:"method,omitempty"`
}

// ReadWeightsFile reads and validates a weights file; unknown fields are refused, so that
// a misspelt weight is not silently left at zero.
func ReadWeightsFile(path string) (SchedulerWeights, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return SchedulerWeights{}, fmt.Errorf("gang: weights file: %w", err)
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	var f WeightsFile
	if err := d.Decode(&f); err != nil {
		return SchedulerWeights{}, fmt.Errorf("gang: weights file %s: %w", path, err)
	}
	if err := f.Weights.Validate(); err != nil {
		return SchedulerWeights{}, fmt.Errorf("gang: weights file %s: %w", path, err)
	}
	return f.Weights, nil
}

// WriteWeightsFile writes f to path as indented JSON.
func WriteWeightsFile(path string, f WeightsFile) error {
	if err := f.Weights.Validate(); err != nil {
		return err
	}
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
