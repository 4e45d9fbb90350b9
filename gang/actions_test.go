package gang

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestActionsValidate(t *testing.T) {
	tests := []struct {
		name    string
		actions []Action
		saying  string // "" = valid
	}{
		{"nil: the defaults", nil, ""},
		{"the defaults spelled out", DefaultActions(), ""},
		{"allocate alone", []Action{ActionAllocate}, ""},
		{"backfill before preempt", []Action{ActionEnqueue, ActionAllocate, ActionBackfill, ActionPreempt}, ""},
		{"reclaim apart from preempt", []Action{ActionAllocate, ActionPreempt, ActionBackfill, ActionReclaim}, ""},
		{"unknown action", []Action{ActionEnqueue, ActionAllocate, "shuffle"}, `unknown action "shuffle"`},
		{"misspelt action", []Action{"Allocate"}, `unknown action "Allocate"`},
		{"listed twice", []Action{ActionAllocate, ActionPreempt, ActionPreempt}, `action "preempt" listed twice`},
		{"no allocate", []Action{ActionEnqueue, ActionPreempt}, `lack "allocate"`},
		{"enqueue after allocate", []Action{ActionAllocate, ActionEnqueue}, `action "enqueue" after "allocate"`},
		{"backfill before allocate", []Action{ActionBackfill, ActionAllocate}, `action "backfill" before "allocate"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Actions = tt.actions
			err := cfg.Validate()
			if tt.saying == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tt.saying) {
				t.Fatalf("Validate: %v, want ErrInvalidConfig saying %q", err, tt.saying)
			}
			if _, err := New(cfg, testSnapshot(1, 8, 1)); !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("New accepted the actions: %v", err)
			}
		})
	}
}

// TestActionSteps: the actions compile into the cycle's steps; preempt and reclaim next to
// each other are one search over both kinds of victim.
func TestActionSteps(t *testing.T) {
	both := Victims{Priority: true, Reclaim: true}
	tests := []struct {
		name    string
		actions []Action
		want    []step
	}{
		{"defaults", nil, []step{{action: ActionEnqueue}, {action: ActionAllocate}, {action: ActionPreempt, may: both}, {action: ActionBackfill}}},
		{"reclaim then preempt", []Action{ActionAllocate, ActionReclaim, ActionPreempt}, []step{{action: ActionAllocate}, {action: ActionPreempt, may: both}}},
		{"preempt alone", []Action{ActionAllocate, ActionPreempt}, []step{{action: ActionAllocate}, {action: ActionPreempt, may: Victims{Priority: true}}}},
		{"apart", []Action{ActionAllocate, ActionPreempt, ActionBackfill, ActionReclaim}, []step{
			{action: ActionAllocate}, {action: ActionPreempt, may: Victims{Priority: true}}, {action: ActionBackfill}, {action: ActionPreempt, may: Victims{Reclaim: true}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := Config{Actions: tt.actions}
			if got := cfg.steps(); !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("steps %+v, want %+v", got, tt.want)
			}
		})
	}
}

// TestActionsRun: the cycle runs only the configured actions: a high-priority gang and an
// under-share queue's gang each blocked by one low-priority gang of an over-share queue
// preempt it with the defaults; without preempt only the reclaim happens, without
// either nothing; without enqueue the quota is not checked.
func TestActionsRun(t *testing.T) {
	tests := []struct {
		name    string
		actions []Action
		want    map[string]string // preemptor -> cause
	}{
		{"defaults", nil, map[string]string{"hi": "priority"}},
		{"reclaim only", []Action{ActionEnqueue, ActionAllocate, ActionReclaim, ActionBackfill}, map[string]string{"fair": "fair-share reclaim"}},
		{"preempt only", []Action{ActionEnqueue, ActionAllocate, ActionPreempt}, map[string]string{"hi": "priority"}},
		{"neither", []Action{ActionEnqueue, ActionAllocate, ActionBackfill}, map[string]string{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Backfill = false
			cfg.Queues = []QueueConfig{{Name: "a", Weight: 1}, {Name: "b", Weight: 1}}
			cfg.DefaultQueue = "a"
			cfg.Actions = tt.actions
			s, err := New(cfg, testSnapshot(2, 8, 2))
			if err != nil {
				t.Fatal(err)
			}
			now := epoch
			for i := range 2 { // queue a takes the whole cluster
				if _, err := s.Submit(Request{ID: fmt.Sprintf("low%d", i), Queue: "a", Min: 1, Member: Member{GPUs: 8}, Checkpoint: Checkpoint{JustInTime: true}}, now); err != nil {
					t.Fatal(err)
				}
			}
			if d := s.Cycle(now); len(d.Placements) != 2 {
				t.Fatalf("placed %+v", d.Placements)
			}
			now = now.Add(time.Hour)
			for _, r := range []Request{
				{ID: "hi", Queue: "a", Priority: 1, Min: 1, Member: Member{GPUs: 8}}, // same queue, higher priority
				// Under-share queue, same priority; another shape, or the cycle would pass it
				// over once hi's shape found no placement.
				{ID: "fair", Queue: "b", Min: 1, Member: Member{GPUs: 8, CPUMilli: 1000}},
			} {
				if _, err := s.Submit(r, now); err != nil {
					t.Fatal(err)
				}
			}
			got := map[string]string{}
			for i := 0; i < 10; i++ {
				d := s.Cycle(now)
				for _, p := range d.Preemptions {
					got[p.For] = p.Reason
				}
				if len(got) > 0 || d.NextCycle.IsZero() {
					break
				}
				now = d.NextCycle
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("preemptions for %v, want %v", got, tt.want)
			}
		})
	}
	// Without enqueue, PreFilter (the quota) does not run.
	for _, actions := range [][]Action{nil, {ActionAllocate}} {
		cfg := DefaultConfig()
		cfg.QuotaAdmission = true
		cfg.Queues = []QueueConfig{{Name: "default", Weight: 1, Quota: 1}}
		cfg.Actions = actions
		s, err := New(cfg, testSnapshot(1, 8, 1))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Submit(Request{ID: "big", Min: 1, Member: Member{GPUs: 4}}, epoch); err != nil {
			t.Fatal(err)
		}
		d := s.Cycle(epoch)
		if placed := len(d.Placements) == 1; placed != (actions != nil) {
			t.Fatalf("actions %v: placed %+v waiting %+v", actions, d.Placements, d.Waiting)
		}
	}
}
