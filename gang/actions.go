package gang

import (
	"fmt"
	"strings"
)

// Action is one step a pending gang goes through in a cycle (Volcano's actions). A cycle
// takes the pending gangs in QueueSort order and runs each through Config.Actions in
// order, until one settles it (placed, held, refused, or waiting for victims or a
// reservation):
//
//	enqueue   PreFilter: may the gang be tried at all (queue quota)? A refusal settles it.
//	allocate  Filter, Score, Permit: place it (settled), hold it for a compact placement
//	          (Permit's Wait), or record why it found no placement.
//	preempt   PostFilter, for a gang allocate found no placement, or only one its
//	          topology wait holds out for: stop or shrink gangs of lower priority to make
//	          room (compact room for the latter; at most MaxPreemptionSearches a cycle).
//	reclaim   PostFilter, likewise: take back what queues over their fair share borrowed,
//	          for a gang of a queue under its share (FairShareReclaim). Next to preempt,
//	          the two are one search that weighs both kinds of victim together.
//	backfill  Reserve: hold capacity for the first blocked gang of the cycle (its
//	          shadow time; others backfill around it) or for a gang Permit holds (compact
//	          reservations, at most MaxReservations).
//
// After the actions, running elastic gangs grow (Config.ElasticGrow).
type Action string

// The actions.
const (
	ActionEnqueue  Action = "enqueue"
	ActionAllocate Action = "allocate"
	ActionPreempt  Action = "preempt"
	ActionReclaim  Action = "reclaim"
	ActionBackfill Action = "backfill"
)

// DefaultActions returns the actions a nil Config.Actions runs: all of them, in the order
// above.
func DefaultActions() []Action {
	return []Action{ActionEnqueue, ActionAllocate, ActionPreempt, ActionReclaim, ActionBackfill}
}

// step is an action as the cycle runs it: preempt and reclaim next to each other are one
// PostFilter step.
type step struct {
	action Action
	may    Victims // for the PostFilter step
}

// validateActions checks an action list: known names, each at most once, allocate
// present, enqueue before it and the others after it (they act on what allocate found).
func validateActions(as []Action) error {
	if len(as) == 0 {
		return nil // the defaults
	}
	known := DefaultActions()
	names := make([]string, len(known))
	for i, a := range known {
		names[i] = string(a)
	}
	seen := map[Action]int{}
	for i, a := range as {
		isKnown := false
		for _, k := range known {
			isKnown = isKnown || a == k
		}
		if !isKnown {
			return fmt.Errorf("gang: unknown action %q in Actions %v (known: %s): %w", a, as, strings.Join(names, ", "), ErrInvalidConfig)
		}
		if _, dup := seen[a]; dup {
			return fmt.Errorf("gang: action %q listed twice in Actions %v: %w", a, as, ErrInvalidConfig)
		}
		seen[a] = i
	}
	at, ok := seen[ActionAllocate]
	if !ok {
		return fmt.Errorf("gang: Actions %v lack %q (nothing would be placed): %w", as, ActionAllocate, ErrInvalidConfig)
	}
	for i, a := range as {
		if a == ActionEnqueue && i > at {
			return fmt.Errorf("gang: action %q after %q in Actions %v: it decides whether a gang is tried: %w", a, ActionAllocate, as, ErrInvalidConfig)
		}
		if a != ActionEnqueue && a != ActionAllocate && i < at {
			return fmt.Errorf("gang: action %q before %q in Actions %v: it acts on gangs allocate found no placement for: %w", a, ActionAllocate, as, ErrInvalidConfig)
		}
	}
	return nil
}

// steps compiles the configured actions (nil: DefaultActions) into the cycle's steps.
func (c *Config) steps() []step {
	as := c.Actions
	if len(as) == 0 {
		as = DefaultActions()
	}
	var out []step
	for i := 0; i < len(as); i++ {
		st := step{action: as[i]}
		switch as[i] {
		case ActionPreempt, ActionReclaim:
			st.may = Victims{Priority: as[i] == ActionPreempt, Reclaim: as[i] == ActionReclaim}
			if i+1 < len(as) && (as[i+1] == ActionPreempt || as[i+1] == ActionReclaim) {
				st.may = Victims{Priority: true, Reclaim: true}
				i++
			}
			st.action = ActionPreempt
		}
		out = append(out, st)
	}
	return out
}
