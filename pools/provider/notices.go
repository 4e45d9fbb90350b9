package provider

import (
	"fmt"
	"sync"
	"time"
)

// notices keeps injected interruption notices.
type notices struct {
	mu      sync.Mutex
	pending []Notice
	now     func() time.Time
}

func (n *notices) add(name string, after time.Duration, known bool) error {
	if !known {
		return fmt.Errorf("%w: no machine %q to interrupt", ErrInvalid, name)
	}
	if after < 0 {
		return fmt.Errorf("%w: interruption of %s %v in the past", ErrInvalid, name, after)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	now := time.Now
	if n.now != nil {
		now = n.now
	}
	n.pending = append(n.pending, Notice{Machine: name, Deadline: now().Add(after)})
	return nil
}

func (n *notices) take() []Notice {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := n.pending
	n.pending = nil
	return out
}
