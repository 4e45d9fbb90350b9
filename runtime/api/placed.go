package api

import (
	"encoding/json"
	"sync"

	"github.com/atoll-run/atoll/store/meta"
)

// The gangs table as one machine's agent needs it. An agent runs the members its machine's
// gangs place on it, so it watches the gangs table filtered for its machine
// (Client.WatchPlaced: GET /v1/list and /v1/watch with machine=NAME): at thousands of
// machines, every agent following every gang's every change was the heads' largest cost
// and each agent's (atoll bench scale), as Kubernetes' kubelets watch only the pods bound
// to their node.

// GangConcerns reports whether a gangs-table record (its JSON value) concerns the agent of
// machine: its placement names the machine (a member, removed or not), or it is neither a
// gang placed elsewhere (starting, running or restarting) nor one never placed yet (pending
// in generation 0). So the agent sees every record of a gang it runs or ran: placed here,
// then requeued (pending in a later generation, with no placement), stopped, failed, or
// placed here again. A gang that moves from this machine to another in one record (a lost
// machine's gangs) is not seen: the agent of a machine declared lost registers again and
// lists again (its listing no longer has the gang). A record that does not decode concerns
// every machine.
func GangConcerns(value []byte, machine string) bool {
	var g gangPlacement
	if json.Unmarshal(value, &g) != nil {
		return true
	}
	return g.concerns(machine)
}

// gangPlacement is what GangConcerns reads of a gang record.
type gangPlacement struct {
	State      GangState `json:"state"`
	Generation int       `json:"generation"`
	Placement  *struct {
		Members []struct {
			Machine string `json:"machine"`
		} `json:"members"`
	} `json:"placement"`
}

func (g gangPlacement) concerns(machine string) bool {
	if g.Placement != nil {
		for _, m := range g.Placement.Members {
			if m.Machine == machine {
				return true
			}
		}
	}
	switch g.State {
	case GangStarting, GangRunning, GangRestarting:
		return false // placed on other machines
	case GangPending:
		return g.Generation > 0 // requeued: it may have run here
	}
	return true
}

// GangConcernedMachines is GangConcerns turned around: the machines a record of the gangs
// table places a member on, and whether it concerns every machine as well (a gang ended
// or requeued, which may have run anywhere; a record that does not decode). A head that
// wakes each agent's watch only for the records that concern it reads it once per record.
// ended says the record is of an ended gang (stopped or failed).
func GangConcernedMachines(value []byte) (machines []string, every, ended bool) {
	var g gangPlacement
	if json.Unmarshal(value, &g) != nil {
		return nil, true, false
	}
	if g.Placement != nil {
		for _, m := range g.Placement.Members {
			machines = append(machines, m.Machine)
		}
	}
	return machines, g.concerns(""), g.State != "" && !g.State.Live()
}

// GangFilter is GangConcerns with the records' summaries kept by key and version, for a
// head that filters the same events for thousands of agents: each record is decoded once.
// It is safe for concurrent use.
type GangFilter struct {
	mu   sync.Mutex
	seen map[gangFilterKey]gangPlacement
}

// gangFilterKey names one value of one key: a transaction may write a key twice at one
// revision (a gang admitted and placed in one batch), so the revision alone does not; the
// key's version (its count of changes) and creation revision do, without hashing it.
type gangFilterKey struct {
	key                  string
	mod, create, version int64
}

// gangFilterKept bounds the summaries kept (the oldest revisions are not told apart: the
// whole cache is dropped when full).
const gangFilterKept = 1 << 17

// NewGangFilter returns an empty filter.
func NewGangFilter() *GangFilter {
	return &GangFilter{seen: map[gangFilterKey]gangPlacement{}}
}

// Concerns is GangConcerns of a record of the gangs table (a listing's, or a watch
// event's).
func (f *GangFilter) Concerns(kv meta.KeyValue, machine string) bool {
	k := gangFilterKey{kv.Key, kv.ModRevision, kv.CreateRevision, kv.Version}
	value := kv.Value
	f.mu.Lock()
	g, ok := f.seen[k]
	f.mu.Unlock()
	if !ok {
		if json.Unmarshal(value, &g) != nil {
			return true
		}
		f.mu.Lock()
		if len(f.seen) >= gangFilterKept {
			f.seen = map[gangFilterKey]gangPlacement{}
		}
		f.seen[k] = g
		f.mu.Unlock()
	}
	return g.concerns(machine)
}
