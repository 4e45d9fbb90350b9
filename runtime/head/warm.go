package head

import (
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/store/meta"
	"github.com/atoll-run/atoll/store/meta/metaserver"
	"github.com/atoll-run/atoll/store/paxos"
)

// A head that does not lead keeps the tables a new term decodes (machines, gangs,
// workers) decoded as its replica applies them, so that when it becomes leader its term
// starts from them instead of decoding every record: at 2,000 machines, with 31,000 gangs
// and 22,000 workers, that decoding was 0.95 s of a 3.03 s failover (BENCHMARKS.md, "Scale
// envelope"), as Kubernetes' standby schedulers keep their informers' caches.
//
// Correctness does not rest on the cache being current: a new term reads every record
// from the state machine as before and takes a decoded record only when its ModRevision
// (unique in the log: a key deleted and put again has a new one) is the one the record was
// decoded at; any other record is decoded then. The cache is handed over whole to the term
// (its records become the ledger's, never shared) and is built again once the head
// follows.

// warmEvery is how often a following head decodes what its replica applied.
const warmEvery = time.Second

type warmRec[T any] struct {
	mod int64
	rec T
}

// warmTable is one table's decoded records by key.
type warmTable[T any] struct {
	prefix, what string
	byKey        map[string]warmRec[T]
}

func newWarmTable[T any](prefix, what string) *warmTable[T] {
	return &warmTable[T]{prefix: prefix, what: what, byKey: map[string]warmRec[T]{}}
}

// load decodes kvs (the whole table) into the cache.
func (w *warmTable[T]) load(kvs []meta.KeyValue) {
	clear(w.byKey)
	recs, err := decodeAll[T](kvs, w.what)
	if err != nil { // one bad record: decode one by one, keeping the others
		for _, kv := range kvs {
			w.apply(meta.Event{Type: meta.EventPut, KV: kv})
		}
		return
	}
	for i, kv := range kvs {
		w.byKey[kv.Key] = warmRec[T]{mod: kv.ModRevision, rec: recs[i]}
	}
}

// apply takes one applied change. A record that does not decode is left out: the term
// decodes it again and reports its error.
func (w *warmTable[T]) apply(ev meta.Event) {
	if !strings.HasPrefix(ev.KV.Key, w.prefix) {
		return
	}
	if ev.Type == meta.EventDelete {
		delete(w.byKey, ev.KV.Key)
		return
	}
	var rec T
	if err := json.Unmarshal(ev.KV.Value, &rec); err != nil {
		delete(w.byKey, ev.KV.Key)
		return
	}
	w.byKey[ev.KV.Key] = warmRec[T]{mod: ev.KV.ModRevision, rec: rec}
}

// take returns the records of kvs decoded, from the cache where a record's ModRevision
// is the cached one, and how many came from it; the cache is emptied.
func (w *warmTable[T]) take(kvs []meta.KeyValue) ([]T, int, error) {
	out := make([]T, len(kvs))
	var miss []meta.KeyValue
	var at []int
	for i, kv := range kvs {
		if r, ok := w.byKey[kv.Key]; ok && r.mod == kv.ModRevision {
			out[i] = r.rec
			continue
		}
		miss, at = append(miss, kv), append(at, i)
	}
	w.byKey = map[string]warmRec[T]{}
	recs, err := decodeAll[T](miss, w.what)
	if err != nil {
		return nil, 0, err
	}
	for j, i := range at {
		out[i] = recs[j]
	}
	return out, len(kvs) - len(miss), nil
}

// warmTables are the tables a term decodes, kept decoded while the head follows.
type warmTables struct {
	sm *metaserver.StateMachine

	mu       sync.Mutex
	next     int64 // the revision the tables cover; 0: not loaded
	machines *warmTable[api.Machine]
	gangs    *warmTable[api.Gang]
	workers  *warmTable[api.Worker]
}

func newWarmTables(sm *metaserver.StateMachine) *warmTables {
	return &warmTables{sm: sm,
		machines: newWarmTable[api.Machine](api.TableMachines, "machine"),
		gangs:    newWarmTable[api.Gang](api.TableGangs, "gang"),
		workers:  newWarmTable[api.Worker](api.TableWorkers, "worker")}
}

// refresh decodes what the replica applied since the last refresh: the whole tables the
// first time, or when the state machine's history no longer holds the revisions since.
func (w *warmTables) refresh() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.next > 0 {
		evs, covered, err := w.sm.EventsView(w.next)
		if err == nil {
			for _, ev := range evs {
				w.machines.apply(ev)
				w.gangs.apply(ev)
				w.workers.apply(ev)
			}
			w.next = covered
			return
		}
		if !errors.Is(err, meta.ErrCompacted) {
			return
		}
	}
	// The revision first, then the tables: a change between the two is read twice, never
	// missed (applying a change again decodes the same record).
	rev := w.sm.Revision()
	w.machines.load(w.sm.Range(api.TableMachines))
	w.gangs.load(w.sm.Range(api.TableGangs))
	w.workers.load(w.sm.Range(api.TableWorkers))
	w.next = max(rev, 1)
}

// termTables are the tables a new term reads, decoded.
type termTables struct {
	mkvs, gkvs    []meta.KeyValue
	machines      []api.Machine
	gangs         []api.Gang
	workers       []api.Worker
	warm, decoded int // records taken from the cache, and decoded now
}

// take reads the tables from the state machine and returns them decoded, from the cache
// where a record has not changed since it was decoded; the cache is emptied.
func (w *warmTables) take() (termTables, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.next = 0
	var t termTables
	var err error
	var hits [3]int
	t.mkvs = w.sm.Range(api.TableMachines)
	if t.machines, hits[0], err = w.machines.take(t.mkvs); err != nil {
		return t, err
	}
	t.gkvs = w.sm.Range(api.TableGangs)
	if t.gangs, hits[1], err = w.gangs.take(t.gkvs); err != nil {
		return t, err
	}
	wkvs := w.sm.Range(api.TableWorkers)
	if t.workers, hits[2], err = w.workers.take(wkvs); err != nil {
		return t, err
	}
	t.warm = hits[0] + hits[1] + hits[2]
	t.decoded = len(t.mkvs) + len(t.gkvs) + len(wkvs) - t.warm
	return t, nil
}

// drop empties the cache (a leading head keeps none). The maps are replaced, not
// cleared: a cleared map keeps its buckets, and a leader would hold them for its term.
func (w *warmTables) drop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.next = 0
	w.machines.byKey = map[string]warmRec[api.Machine]{}
	w.gangs.byKey = map[string]warmRec[api.Gang]{}
	w.workers.byKey = map[string]warmRec[api.Worker]{}
}

// warmLoop refreshes the cache every warmEvery while the head's replica follows, and keeps
// none while it leads, until stop.
func (c *Controller) warmLoop() {
	tk := time.NewTicker(warmEvery)
	defer tk.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-tk.C:
		}
		if c.inTerm.Load() || c.rep.Status().Role == paxos.Leader { // leading, or taking office
			c.warm.drop()
			continue
		}
		c.warm.refresh()
	}
}
