package pools

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/atoll-run/atoll/internal/jsonpos"
	"github.com/atoll-run/atoll/topology"
)

// Capacity is how a pool's machines are bought.
type Capacity string

// Capacity types.
const (
	// OnDemand machines are kept until the pool removes them.
	OnDemand Capacity = "on-demand"
	// Spot machines are cheaper and can be taken back by the provider with a short notice
	// (AWS 120 s, GCP about 30 s); only gangs that tolerate interruption run on them.
	Spot Capacity = "spot"
)

// Duration is a time.Duration that reads and writes JSON as Go's duration text ("90s").
type Duration time.Duration

// MarshalText implements encoding.TextMarshaler.
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("duration %q: want Go duration text such as \"90s\" or \"5m\"", b)
	}
	*d = Duration(v)
	return nil
}

// ProviderSpec names a pool's provider and carries its settings, which the provider
// parses itself (strictly: an unknown setting is an error).
type ProviderSpec struct {
	// Type is "local", "docker", "kubernetes" or "sim".
	Type string `json:"type"`
	// Settings are the provider's own (see docs/pools.md); absent means its defaults.
	Settings json.RawMessage `json:"settings,omitempty"`
}

// Budget caps a pool's spending. Zero fields are no cap.
type Budget struct {
	// USDPerHour caps the hourly price of the pool's machines (running and launching): a
	// launch that would pass it is not made.
	USDPerHour float64 `json:"usd_per_hour,omitempty"`
	// USDTotal caps the pool's cost so far: once reached, the pool launches nothing more.
	USDTotal float64 `json:"usd_total,omitempty"`
}

// PoolSpec declares one pool of machines of one type.
type PoolSpec struct {
	// Name is the pool's name (1-63 characters of [A-Za-z0-9._-]); it prefixes its
	// machines' names.
	Name string `json:"name"`
	// Machine is the machine type: a built-in topology machine ("dgx-h100"), a shorthand, or
	// a topology spec file (relative to the pool file's directory). Agents of the pool
	// declare it (simulated GPUs) unless the provider's machines discover their own.
	Machine string `json:"machine"`
	// Min and Max bound the pool's machines (launching, running and draining alike).
	Min int `json:"min"`
	Max int `json:"max"`
	// Capacity is "on-demand" (default) or "spot".
	Capacity Capacity `json:"capacity,omitempty"`
	// PricePerHour is the price of one machine per hour, in USD.
	PricePerHour float64 `json:"price_per_hour"`
	// LaunchLatency is how long a launched machine takes to join (used by the simulation and
	// shown by status; the runtime measures the real one).
	LaunchLatency Duration `json:"launch_latency,omitempty"`
	// IdleTimeout is how long a machine may stay idle before it is drained and removed.
	// Default 10 minutes.
	IdleTimeout Duration `json:"idle_timeout,omitempty"`
	// InterruptionsPerHour is, for a spot pool, the declared rate at which the provider
	// takes one machine back (the simulation draws interruptions from it); cite its source
	// in Source.
	InterruptionsPerHour float64 `json:"interruptions_per_hour,omitempty"`
	// NoticeSeconds is the notice a spot interruption gives (AWS 120, GCP 30). Default 120.
	NoticeSeconds int `json:"notice_seconds,omitempty"`
	// Source says where the price and interruption figures come from (free text).
	Source string `json:"source,omitempty"`
	// Provider starts and stops the pool's machines.
	Provider ProviderSpec `json:"provider"`
	// Budget caps the pool's spending (optional).
	Budget Budget `json:"budget,omitempty"`
}

// File is a pool file: {"pools": [...]}.
type File struct {
	Pools []PoolSpec `json:"pools"`
}

// Set is a loaded, validated pool file: the specs with each pool's machine shape.
type Set struct {
	Pools []Pool
}

// Pool is a validated pool: its spec and the shape of its machine type.
type Pool struct {
	Spec  PoolSpec
	Shape Shape
	// MachineSpec is the machine type agents of this pool declare.
	MachineSpec *topology.MachineSpec
}

// ByName returns the pool of that name.
func (c *Set) ByName(name string) (*Pool, bool) {
	for i := range c.Pools {
		if c.Pools[i].Spec.Name == name {
			return &c.Pools[i], true
		}
	}
	return nil, false
}

var poolNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// Bounds of a pool file, so that a bad file is refused rather than obeyed.
const (
	MaxPools        = 64
	MaxPoolMachines = 100000
	maxPrice        = 1e6
)

// Providers known to the spec; the consumer supplies their implementations.
var providerTypes = []string{"local", "docker", "kubernetes", "sim"}

// LoadFile reads and validates a pool file.
func LoadFile(path string) (*Set, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("pools: %w", err)
	}
	return Parse(data, path, filepath.Dir(path))
}

// Parse reads and validates a pool file's bytes. name is used in errors; dir is where
// relative machine spec files are looked up. Every error names the file and line:col of
// the pool (or of the JSON problem), the pool's index and name, and the field.
func Parse(data []byte, name, dir string) (*Set, error) {
	var f File
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, jsonErr(name, data, dec, err)
	}
	if dec.More() {
		line, col := jsonpos.LineCol(data, dec.InputOffset())
		return nil, fmt.Errorf("%s:%d:%d: data after the top-level object: %w", name, line, col, ErrSpec)
	}
	at := poolOffsets(data)
	if len(f.Pools) == 0 {
		return nil, fmt.Errorf("%s: no pools (want {\"pools\": [{...}, ...]}): %w", name, ErrSpec)
	}
	if len(f.Pools) > MaxPools {
		return nil, fmt.Errorf("%s: %d pools, over the bound of %d: %w", name, len(f.Pools), MaxPools, ErrSpec)
	}
	cfg := &Set{}
	seen := map[string]int{}
	for i := range f.Pools {
		p := &f.Pools[i]
		where := fmt.Sprintf("%s: pools[%d]", name, i)
		if i < len(at) {
			line, col := jsonpos.LineCol(data, at[i])
			where = fmt.Sprintf("%s:%d:%d: pools[%d]", name, line, col, i)
		}
		if p.Name != "" {
			where += fmt.Sprintf(" (%q)", p.Name)
		}
		bad := func(field, format string, args ...any) error {
			return fmt.Errorf("%s.%s: %s: %w", where, field, fmt.Sprintf(format, args...), ErrSpec)
		}
		if !poolNameRE.MatchString(p.Name) {
			return nil, bad("name", "%q: want 1-63 characters of [A-Za-z0-9._-] starting with a letter or digit", p.Name)
		}
		if j, dup := seen[p.Name]; dup {
			return nil, bad("name", "%q is also the name of pools[%d]", p.Name, j)
		}
		seen[p.Name] = i
		if p.Capacity == "" {
			p.Capacity = OnDemand
		}
		if p.IdleTimeout == 0 {
			p.IdleTimeout = Duration(10 * time.Minute)
		}
		if p.NoticeSeconds == 0 {
			p.NoticeSeconds = 120
		}
		switch {
		case p.Min < 0:
			return nil, bad("min", "%d is negative", p.Min)
		case p.Max < 1 || p.Max > MaxPoolMachines:
			return nil, bad("max", "%d: want 1..%d", p.Max, MaxPoolMachines)
		case p.Min > p.Max:
			return nil, bad("min", "%d is above max %d", p.Min, p.Max)
		case p.Capacity != OnDemand && p.Capacity != Spot:
			return nil, bad("capacity", "%q: want %q or %q", p.Capacity, OnDemand, Spot)
		case !finite(p.PricePerHour) || p.PricePerHour < 0 || p.PricePerHour > maxPrice:
			return nil, bad("price_per_hour", "%v: want 0..%v USD", p.PricePerHour, maxPrice)
		case p.LaunchLatency < 0 || time.Duration(p.LaunchLatency) > 24*time.Hour:
			return nil, bad("launch_latency", "%v: want 0..24h", time.Duration(p.LaunchLatency))
		case p.IdleTimeout < 0 || time.Duration(p.IdleTimeout) > 7*24*time.Hour:
			return nil, bad("idle_timeout", "%v: want 0..168h", time.Duration(p.IdleTimeout))
		case !finite(p.InterruptionsPerHour) || p.InterruptionsPerHour < 0 || p.InterruptionsPerHour > 60:
			return nil, bad("interruptions_per_hour", "%v: want 0..60", p.InterruptionsPerHour)
		case p.InterruptionsPerHour > 0 && p.Capacity != Spot:
			return nil, bad("interruptions_per_hour", "%v on an %s pool: only spot machines are interrupted", p.InterruptionsPerHour, p.Capacity)
		case p.NoticeSeconds < 0 || p.NoticeSeconds > 3600:
			return nil, bad("notice_seconds", "%d: want 0..3600", p.NoticeSeconds)
		case !finite(p.Budget.USDPerHour) || p.Budget.USDPerHour < 0:
			return nil, bad("budget.usd_per_hour", "%v is negative", p.Budget.USDPerHour)
		case !finite(p.Budget.USDTotal) || p.Budget.USDTotal < 0:
			return nil, bad("budget.usd_total", "%v is negative", p.Budget.USDTotal)
		case p.Budget.USDPerHour > 0 && float64(p.Min)*p.PricePerHour > p.Budget.USDPerHour:
			return nil, bad("budget.usd_per_hour", "%v cannot pay for the pool's min %d machines at %v an hour", p.Budget.USDPerHour, p.Min, p.PricePerHour)
		case len(p.Source) > 1024:
			return nil, bad("source", "%d bytes, over 1024", len(p.Source))
		}
		if !contains(providerTypes, p.Provider.Type) {
			return nil, bad("provider.type", "%q: want one of %s", p.Provider.Type, strings.Join(providerTypes, ", "))
		}
		if strings.TrimSpace(p.Machine) == "" {
			return nil, bad("machine", "empty: want a built-in machine type (%s) or a topology spec file", strings.Join(topology.BuiltinNames(), ", "))
		}
		ms, shape, err := LoadShape(p.Machine, dir)
		if err != nil {
			return nil, bad("machine", "%v", err)
		}
		cfg.Pools = append(cfg.Pools, Pool{Spec: *p, Shape: shape, MachineSpec: ms})
	}
	return cfg, nil
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// jsonErr turns a decoding error into one naming the file and line:col.
func jsonErr(name string, data []byte, dec *json.Decoder, err error) error {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	at := dec.InputOffset()
	msg := strings.TrimPrefix(err.Error(), "json: ")
	switch {
	case errors.As(err, &syn):
		at = syn.Offset - 1
	case errors.As(err, &typ):
		at = typ.Offset
		msg = fmt.Sprintf("field %s: expected %s, found JSON %s", typ.Field, typ.Type, typ.Value)
	default:
		if f, ok := strings.CutPrefix(msg, "unknown field "); ok {
			if k := bytes.LastIndex(data[:min(at, int64(len(data)))], []byte(f)); k >= 0 {
				at = int64(k)
			}
		}
	}
	line, col := jsonpos.LineCol(data, at)
	return fmt.Errorf("%s:%d:%d: %s: %w", name, line, col, msg, ErrSpec)
}

// poolOffsets returns the byte offset of each element of the top-level "pools" array, or
// nil when the file does not have that shape.
func poolOffsets(data []byte) []int64 {
	dec := json.NewDecoder(bytes.NewReader(data))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil
	}
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			return nil
		}
		if k != "pools" {
			var skip json.RawMessage
			if dec.Decode(&skip) != nil {
				return nil
			}
			continue
		}
		if t, err := dec.Token(); err != nil || t != json.Delim('[') {
			return nil
		}
		var out []int64
		for dec.More() {
			// InputOffset is the end of the last token; the element starts at the next '{'.
			off := dec.InputOffset()
			for off < int64(len(data)) && (data[off] == ' ' || data[off] == '\n' || data[off] == '\r' || data[off] == '\t' || data[off] == ',') {
				off++
			}
			out = append(out, off)
			var skip json.RawMessage
			if dec.Decode(&skip) != nil {
				return out
			}
		}
		return out
	}
	return nil
}
