// Package events is the control plane's event log: the pure rules that turn a gang's change
// of record into events, and the bounded table (events/ in the metadata log) they are
// committed to, in the same transaction as the decision they record.
//
// Why the log and not a head's memory: every head applies the same log, so every head
// shows the same history, a new leader shows what the old one decided, and a head that
// restarts finds the history again in its snapshot. The table is bounded (Log.Keep): each
// new event deletes the one Keep places before it, in the same transaction.
//
//	l := events.NewLog(events.DefaultKeep)
//	prune := l.Resume(sm.Range(api.TableEvents)) // a new leader continues the sequence
//	ops = append(ops, l.Ops(events.FromGang(&old, new))...)
package events

import (
	"encoding/json"
	"math"
	"sync"

	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/store/meta"
)

// DefaultKeep is how many events the table keeps.
const DefaultKeep = 2000

// FromGang returns the events of a gang's change of record from old (nil for a gang just
// accepted) to new: a placement, the gang running, a restart, a wait for capacity, its
// end. A change that only records what an earlier event said (the next generation
// starting after its backoff, a reason refreshed) makes none. Times are new.Updated.
func FromGang(old *api.Gang, new api.Gang) []api.Event {
	ev := api.Event{Time: new.Updated, Job: new.Spec.Job, Gang: new.Spec.Name, Generation: new.Generation, Reason: new.Reason}
	was := api.GangState("")
	oldGen := -1
	if old != nil {
		was, oldGen = old.State, old.Generation
	}
	switch new.State {
	case api.GangStarting:
		switch {
		case was == api.GangPending || was == "":
			ev.Kind = api.EventGangPlaced
			ev.Reason = ""
			if p := new.Placement; p != nil {
				ev.Machines, ev.Islands, ev.Scores = append([]string(nil), p.Machines...), p.Islands, copyScores(p.Scores)
			}
		case new.Generation != oldGen && was != api.GangRestarting:
			ev.Kind = api.EventGangRestart // its agent restarted: the same GPUs, at once
		default:
			return nil
		}
	case api.GangRunning:
		if was == api.GangRunning && new.Generation == oldGen {
			return changes(old, new, ev)
		}
		ev.Kind, ev.Reason = api.EventGangRunning, ""
	case api.GangRestarting:
		if was == api.GangRestarting && new.Generation == oldGen {
			return nil
		}
		ev.Kind = api.EventGangRestart
	case api.GangPending:
		switch {
		case was == "":
			ev.Kind = api.EventGangQueued
		case was == api.GangPending:
			return nil
		case old != nil && new.Preemptions > old.Preemptions:
			ev.Kind = api.EventGangPreempted
		default:
			ev.Kind = api.EventGangWaiting
		}
	case api.GangFailed:
		if was == api.GangFailed {
			return nil
		}
		ev.Kind = api.EventGangFailed
	case api.GangStopped:
		if was == api.GangStopped {
			return nil
		}
		ev.Kind = api.EventGangStopped
	default:
		return nil
	}
	return []api.Event{ev}
}

// changes are the events of a running gang's record that keeps its state: a notice given,
// a resize taken.
func changes(old *api.Gang, new api.Gang, ev api.Event) []api.Event {
	var out []api.Event
	if n := new.Notice; n != nil && (old.Notice == nil || !old.Notice.Issued.Equal(n.Issued)) {
		e := ev
		e.Kind, e.Reason = api.EventGangNotice, string(n.Kind)+": "+n.Reason
		if !n.Deadline.IsZero() {
			e.Reason += " (by " + n.Deadline.UTC().Format("15:04:05.000") + ")"
		}
		out = append(out, e)
	}
	if new.Resizes > old.Resizes {
		e := ev
		e.Kind = api.EventGangResized
		out = append(out, e)
	}
	return out
}

func copyScores(s map[string]float64) map[string]float64 {
	if len(s) == 0 {
		return nil
	}
	out := make(map[string]float64, len(s))
	for k, v := range s {
		if !math.IsNaN(v) && !math.IsInf(v, 0) { // JSON has no NaN
			out[k] = v
		}
	}
	return out
}

// Log numbers events and writes them to the bounded table. It is safe for concurrent use.
type Log struct {
	keep int64

	mu   sync.Mutex
	next int64 // the next sequence number (from 1)
}

// NewLog returns a log keeping keep events (DefaultKeep when keep <= 0).
func NewLog(keep int) *Log {
	if keep <= 0 {
		keep = DefaultKeep
	}
	return &Log{keep: int64(keep), next: 1}
}

// Resume continues the sequence after the newest event of the table (as listed by a new
// leader), and returns the deletes that bring the table back within its bound (events
// left over when a commit that would have deleted them failed).
func (l *Log) Resume(kvs []meta.KeyValue) []meta.Op {
	var seqs []int64
	var top int64
	for _, kv := range kvs {
		s, err := api.EventSeq(kv.Key)
		if err != nil {
			continue
		}
		seqs = append(seqs, s)
		top = max(top, s)
	}
	l.mu.Lock()
	l.next = max(l.next, top+1)
	floor := l.next - l.keep
	l.mu.Unlock()
	var ops []meta.Op
	for _, s := range seqs {
		if s < floor {
			ops = append(ops, meta.Op{Type: meta.OpDelete, Key: api.TableEvents + api.EventKey(s)})
		}
	}
	return ops
}

// Ops numbers the events and returns their puts, each with the delete of the event Keep
// places before it.
func (l *Log) Ops(evs []api.Event) []meta.Op {
	if len(evs) == 0 {
		return nil
	}
	l.mu.Lock()
	first := l.next
	l.next += int64(len(evs))
	l.mu.Unlock()
	ops := make([]meta.Op, 0, 2*len(evs))
	for i, e := range evs {
		e.Seq = first + int64(i)
		b, err := json.Marshal(e)
		if err != nil {
			continue // an Event always encodes (copyScores drops what JSON cannot hold)
		}
		ops = append(ops, meta.Op{Type: meta.OpPut, Key: api.TableEvents + api.EventKey(e.Seq), Value: b})
		if old := e.Seq - l.keep; old > 0 {
			ops = append(ops, meta.Op{Type: meta.OpDelete, Key: api.TableEvents + api.EventKey(old)})
		}
	}
	return ops
}

// Filter keeps the events of a job ("" keeps all).
func Filter(evs []api.Event, job string) []api.Event {
	if job == "" {
		return evs
	}
	var out []api.Event
	for _, e := range evs {
		if e.Job == job {
			out = append(out, e)
		}
	}
	return out
}
