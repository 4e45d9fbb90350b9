// Reconciliation: the object records are checked against the cluster as it is now. A
// location whose store is gone (a dead machine, a previous incarnation of a restarted
// agent, a driver that went away) is dropped; an object whose owner ended is marked
// StateOwnerDied; one without a copy left is marked StateLost; dead records are collected
// once they have been dead for World.Keep. Plan is the pure core (one record, the world
// in, a decision out); Reconcile reads the table, plans and writes each decision under
// compare-and-swap, so that a store registering a copy meanwhile wins.

package objects

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/store/meta"
	"github.com/atoll-run/atoll/store/object"
)

// World is what reconciliation knows of the cluster now.
type World struct {
	// Live holds the transfer addresses of the stores that run now: the alive machines'
	// agents (their current incarnation) and the connected drivers.
	Live map[string]bool
	// OwnerEnded reports whether an owner is known to have ended (false for an owner alive
	// or unknown). Nil: no owner is known to have ended.
	OwnerEnded func(owner string) bool
	// Unreferenced reports whether a checkpoint's part (by its key) has been referenced by
	// no committed checkpoint for long enough to be an orphan (a checkpoint pruned while
	// the machine holding a copy was down, then restarted and re-adopted it; a commit that
	// never came). Nil: none is.
	Unreferenced func(key string) bool
	// Now is the time of this pass; Keep how long a dead record stays (a reader learns why
	// its object is gone) before it is collected.
	Now  time.Time
	Keep time.Duration
}

// Action is what reconciliation does to one record.
type Action struct {
	Key string
	// Record is the new record; nil deletes it.
	Record *Record
	// Drop lists the live locations whose copy should be let go: its owner ended (Free
	// false: later gets are refused as owner-died), or it is an orphan (Free).
	Drop []string
	Free bool
	// Dropped counts the dead locations removed; Why says what changed.
	Dropped int
	Why     string
}

// Durable owners: what they put is kept until it is freed, whoever put it.
const (
	// DetachedOwner owns detached objects (sdk.Detached).
	DetachedOwner = "detached"
	// CheckpointOwnerPrefix owns a gang's checkpoint parts: checkpoint/<job>/<gang>.
	CheckpointOwnerPrefix = "checkpoint/"
)

// DurableOwner reports whether objects of owner are of a durable level (detached, a
// checkpoint's parts): they are replicated durably before their put is acknowledged, and
// no process's end takes them.
func DurableOwner(owner string) bool {
	return owner == DetachedOwner || strings.HasPrefix(owner, CheckpointOwnerPrefix)
}

// Plan decides what to do with one record; ok is false when nothing changes.
func Plan(key string, rec Record, w World) (Action, bool) {
	a := Action{Key: key}
	if rec.State != "" {
		if w.Now.Sub(rec.Ended) >= w.Keep {
			a.Why = fmt.Sprintf("collected: %s since %s", rec.State, rec.Ended.Format(time.RFC3339))
			return a, true
		}
		return a, false
	}
	if strings.HasPrefix(rec.Owner, CheckpointOwnerPrefix) && w.Unreferenced != nil && w.Unreferenced(key) {
		a.Drop = slices.DeleteFunc(slices.Clone(rec.Locations), func(l string) bool { return !w.Live[l] })
		a.Free = true
		a.Why = "collected: a checkpoint part no committed checkpoint references"
		return a, true
	}
	out := rec
	out.Locations = slices.DeleteFunc(slices.Clone(rec.Locations), func(l string) bool { return !w.Live[l] })
	out.Durable = slices.DeleteFunc(slices.Clone(rec.Durable), func(l string) bool { return !w.Live[l] })
	a.Dropped = len(rec.Locations) - len(out.Locations)
	switch {
	case !DurableOwner(rec.Owner) && w.OwnerEnded != nil && w.OwnerEnded(rec.Owner):
		a.Drop = out.Locations
		out.State, out.Ended, out.Locations, out.Durable, out.Refs = StateOwnerDied, w.Now, nil, nil, 0
		a.Why = "its owner " + rec.Owner + " ended"
	case len(out.Locations) == 0:
		out.State, out.Ended, out.Refs = StateLost, w.Now, 0
		out.Durable = nil
		a.Why = fmt.Sprintf("lost: none of its %d locations is live", len(rec.Locations))
	case a.Dropped > 0 || len(out.Durable) != len(rec.Durable):
		a.Why = fmt.Sprintf("%d dead locations dropped", a.Dropped)
	default:
		return a, false
	}
	a.Record = &out
	return a, true
}

// Report sums up a reconciliation pass.
type Report struct {
	// Records counts the object records read (dead ones included); Lost and OwnerDied the
	// dead ones left after the pass.
	Records   int `json:"records"`
	Lost      int `json:"lost"`
	OwnerDied int `json:"owner_died"`
	// DroppedLocations, MarkedLost, MarkedOwnerDied and Collected count this pass's changes.
	DroppedLocations int `json:"dropped_locations"`
	MarkedLost       int `json:"marked_lost"`
	MarkedOwnerDied  int `json:"marked_owner_died"`
	Collected        int `json:"collected"`
}

// Table is what reconciliation needs of the metadata log. *meta.Client implements it.
type Table interface {
	Range(ctx context.Context, prefix string) ([]meta.KeyValue, error)
	RangePage(ctx context.Context, prefix, after string, limit int) (meta.Page, error)
	Txn(ctx context.Context, compares []meta.Compare, ops []meta.Op) (meta.Response, error)
}

// reconcilePage is how many records a pass reads at a time: a pass over 200,000 objects
// read them in one answer of 100 MB (the heads' JSON encoding of it was most of a
// benchmark's CPU), held whole by the reconciler while it worked.
var reconcilePage = 1000

var _ Table = (*meta.Client)(nil)

// Reconcile runs one pass over the objects table: every record is planned against w and
// its change written under compare-and-swap on the version read (a record changed
// meanwhile is left to the next pass). It returns the pass's report and the actions
// carried out (their Drop lists are the caller's to act on: it asks those stores to let
// their copies go).
func Reconcile(ctx context.Context, t Table, w World) (Report, []Action, error) {
	var rep Report
	var done []Action
	for after := ""; ; {
		page, err := t.RangePage(ctx, api.TableObjects, after, reconcilePage)
		if err != nil {
			return rep, done, fmt.Errorf("objects: reconcile: %w", err)
		}
		if done, err = reconcilePageOf(ctx, t, w, page.KVs, &rep, done); err != nil || page.Next == "" {
			return rep, done, err
		}
		after = page.Next
	}
}

// reconcilePageOf plans and writes the changes of one page of records, adding to rep and
// done.
func reconcilePageOf(ctx context.Context, t Table, w World, kvs []meta.KeyValue, rep *Report, done []Action) ([]Action, error) {
	for _, kv := range kvs {
		rep.Records++
		var rec Record
		if json.Unmarshal(kv.Value, &rec) != nil {
			continue
		}
		a, ok := Plan(kv.Key, rec, w)
		if !ok {
			countDead(rep, rec.State)
			continue
		}
		op := meta.Op{Type: meta.OpDelete, Key: kv.Key}
		if a.Record != nil {
			b, err := json.Marshal(a.Record)
			if err != nil {
				return done, err
			}
			op = meta.Op{Type: meta.OpPut, Key: kv.Key, Value: b}
		}
		r, err := t.Txn(ctx, []meta.Compare{{Key: kv.Key, Version: kv.Version}}, []meta.Op{op})
		if err != nil {
			return done, fmt.Errorf("objects: reconcile %s: %w", kv.Key, err)
		}
		if !r.Succeeded {
			countDead(rep, rec.State)
			continue // changed meanwhile: the next pass sees it
		}
		done = append(done, a)
		rep.DroppedLocations += a.Dropped
		switch {
		case a.Record == nil:
			rep.Collected++
		case a.Record.State == StateLost:
			rep.MarkedLost++
		case a.Record.State == StateOwnerDied:
			rep.MarkedOwnerDied++
		}
		if a.Record != nil {
			countDead(rep, a.Record.State)
		}
	}
	return done, nil
}

func countDead(rep *Report, s State) {
	switch s {
	case StateLost:
		rep.Lost++
	case StateOwnerDied:
		rep.OwnerDied++
	}
}

// IDOfKey is the object id of a key of the objects table.
func IDOfKey(key string) (object.ID, error) {
	return object.ParseID(strings.TrimPrefix(key, api.TableObjects))
}

// Count counts the records of the objects table.
func Count(kvs []meta.KeyValue) api.ObjectsStatus {
	var st api.ObjectsStatus
	for _, kv := range kvs {
		var rec Record
		if json.Unmarshal(kv.Value, &rec) != nil {
			continue
		}
		st.Records++
		switch rec.State {
		case StateLost:
			st.Lost++
		case StateOwnerDied:
			st.OwnerDied++
		default:
			st.Live++
			st.LiveBytes += rec.Size
			if len(rec.Durable) > 0 {
				st.Durable++
			}
		}
	}
	return st
}
