package provider

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"
)

// Sim is a provider whose machines exist only in memory: the pool simulation and tests
// use it. Launches fail with ErrNoCapacity while SetSpotAvailable(false) holds for spot
// requests.
type Sim struct {
	notices
	mu     sync.Mutex
	now    func() time.Time
	inst   map[string]Instance
	noSpot bool
}

var _ Provider = (*Sim)(nil)
var _ Interrupter = (*Sim)(nil)

// NewSim returns a simulated provider reading the given clock.
func NewSim(now func() time.Time) *Sim {
	return &Sim{notices: notices{now: now}, now: now, inst: map[string]Instance{}}
}

// SetSpotAvailable says whether spot launches succeed.
func (s *Sim) SetSpotAvailable(ok bool) {
	s.mu.Lock()
	s.noSpot = !ok
	s.mu.Unlock()
}

// Launch records the machines as running.
func (s *Sim) Launch(ctx context.Context, req LaunchRequest) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if req.Spot && s.noSpot {
		return fmt.Errorf("%w: no spot machines for pool %s", ErrNoCapacity, req.Pool)
	}
	for _, n := range req.Names {
		if !nameRE.MatchString(n) {
			return fmt.Errorf("%w: machine name %q", ErrInvalid, n)
		}
	}
	for _, n := range req.Names {
		if _, ok := s.inst[n]; !ok {
			s.inst[n] = Instance{Name: n, Pool: req.Pool, Running: true, Started: s.now()}
		}
	}
	return nil
}

// Terminate forgets a machine.
func (s *Sim) Terminate(ctx context.Context, name string) error {
	s.mu.Lock()
	delete(s.inst, name)
	s.mu.Unlock()
	return nil
}

// List returns the machines, by name.
func (s *Sim) List(ctx context.Context) ([]Instance, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Instance, 0, len(s.inst))
	for _, i := range s.inst {
		out = append(out, i)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Interrupt injects a notice.
func (s *Sim) Interrupt(name string, after time.Duration) error {
	s.mu.Lock()
	_, ok := s.inst[name]
	s.mu.Unlock()
	return s.add(name, after, ok)
}

// Notices returns the notices not yet returned.
func (s *Sim) Notices() []Notice { return s.take() }
