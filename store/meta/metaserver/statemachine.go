package metaserver

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/google/btree"

	"github.com/atoll-run/atoll/store/meta"
	"github.com/atoll-run/atoll/store/paxos"
)

// DefaultHistoryLimit is how many watch events a StateMachine keeps by default.
const DefaultHistoryLimit = 100000

type clientState struct {
	AckBelow uint64                   `json:"ack"`
	Answers  map[uint64]meta.Response `json:"answers"`
}

// StateMachine is the metadata state machine (a paxos.StateMachine): versioned keys,
// transactions with compare guards, per-client request deduplication, ordered watch
// history and whole-state snapshots. Apply is called by the paxos replica; the read
// methods are safe for concurrent use (linearizable after paxos.Replica.Read returns).
type StateMachine struct {
	mu   sync.Mutex
	cond *sync.Cond
	kv   map[string]*meta.KeyValue
	// keys orders kv's keys, so that a Range visits its prefix's keys only, already
	// sorted (a table of 10,000 gangs listed by every agent after a failover scanned
	// and sorted the whole store each time, under mu).
	keys     *btree.BTreeG[string]
	revision int64
	applied  uint64
	clients  map[string]*clientState
	history  []meta.Event // events with Revision > compacted, in order
	compact  int64        // revisions <= compact are no longer in history
	limit    int
	// sleepers are the EventsSince callers waiting for an event, by the prefix they
	// watch: a commit wakes those whose prefix one of its keys has, not every watcher
	// (woken counts the wakeups, for tests).
	sleepers map[string]map[chan struct{}]struct{}
	woken    int64
}

var _ paxos.StateMachine = (*StateMachine)(nil)

// NewStateMachine returns an empty state machine keeping historyLimit watch events
// (DefaultHistoryLimit when <= 0).
func NewStateMachine(historyLimit int) *StateMachine {
	if historyLimit <= 0 {
		historyLimit = DefaultHistoryLimit
	}
	s := &StateMachine{kv: map[string]*meta.KeyValue{}, keys: newKeyIndex(), clients: map[string]*clientState{}, limit: historyLimit,
		sleepers: map[string]map[chan struct{}]struct{}{}}
	s.cond = sync.NewCond(&s.mu)
	return s
}

// Apply implements paxos.StateMachine: it decodes a Request, applies it and returns the
// JSON Response.
func (s *StateMachine) Apply(slot uint64, data []byte) []byte {
	var req meta.Request
	var resp meta.Response
	if err := json.Unmarshal(data, &req); err != nil {
		resp = meta.Response{Error: fmt.Sprintf("%v: slot %d: %v", meta.ErrBadRequest, slot, err)}
	} else {
		resp = s.ApplyRequest(&req)
	}
	s.mu.Lock()
	s.applied = slot
	s.mu.Unlock()
	out, _ := json.Marshal(resp)
	return out
}

// ApplyRequest applies one request (exported for tests and tools that drive the state
// machine without a log).
func (s *StateMachine) ApplyRequest(req *meta.Request) meta.Response {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := req.ValidateShape(); err != nil {
		return meta.Response{Revision: s.revision, Error: err.Error()}
	}
	var cs *clientState
	if req.ClientID != "" {
		cs = s.clients[req.ClientID]
		if cs == nil {
			cs = &clientState{Answers: map[uint64]meta.Response{}}
			s.clients[req.ClientID] = cs
		}
		if prev, ok := cs.Answers[req.Seq]; ok {
			return prev
		}
		if req.Seq < cs.AckBelow {
			return meta.Response{Revision: s.revision, Error: fmt.Sprintf("%v: client %q seq %d < %d", meta.ErrStaleRequest, req.ClientID, req.Seq, cs.AckBelow)}
		}
	}
	resp := s.applyTxn(req)
	if cs != nil {
		cs.Answers[req.Seq] = resp
		if req.AckBelow > cs.AckBelow {
			cs.AckBelow = req.AckBelow
			for q := range cs.Answers {
				if q < cs.AckBelow {
					delete(cs.Answers, q)
				}
			}
		}
	}
	return resp
}

func (s *StateMachine) applyTxn(req *meta.Request) meta.Response {
	for _, c := range req.Compares {
		var ver int64
		if kv := s.kv[c.Key]; kv != nil {
			ver = kv.Version
		}
		if ver != c.Version {
			return meta.Response{Succeeded: false, Revision: s.revision}
		}
	}
	s.revision++
	rev := s.revision
	first := len(s.history)
	for _, op := range req.Ops {
		switch op.Type {
		case meta.OpPut:
			kv := s.kv[op.Key]
			if kv == nil {
				kv = &meta.KeyValue{Key: op.Key, CreateRevision: rev}
				s.kv[op.Key] = kv
				s.keys.ReplaceOrInsert(op.Key)
			}
			kv.Value = append([]byte(nil), op.Value...)
			kv.ModRevision = rev
			kv.Version++
			s.history = append(s.history, meta.Event{Type: meta.EventPut, Revision: rev, KV: *kv})
		case meta.OpDelete:
			kv := s.kv[op.Key]
			if kv == nil {
				continue
			}
			delete(s.kv, op.Key)
			s.keys.Delete(op.Key)
			s.history = append(s.history, meta.Event{Type: meta.EventDelete, Revision: rev, KV: meta.KeyValue{Key: op.Key, ModRevision: rev}})
		}
	}
	s.wakeLocked(first)
	// The history runs up to an eighth over its limit before it is cut back to it: cut at
	// every transaction, each would copy the whole history (100,000 events) under the
	// lock that the replica's apply and every reader wait for.
	if over := len(s.history) - s.limit; over > 0 && over > s.limit/8 {
		// Drop whole revisions only, so a watcher never sees half a transaction.
		cut := s.history[over-1].Revision
		i := over
		for i < len(s.history) && s.history[i].Revision == cut {
			i++
		}
		s.compact = cut
		s.history = append([]meta.Event(nil), s.history[i:]...)
	}
	s.cond.Broadcast()
	return meta.Response{Succeeded: true, Revision: rev}
}

// Get returns the key's current value and whether it exists.
func (s *StateMachine) Get(key string) (meta.KeyValue, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	kv := s.kv[key]
	if kv == nil {
		return meta.KeyValue{}, false
	}
	out := *kv
	out.Value = append([]byte(nil), kv.Value...)
	return out, true
}

// Range returns every key with the prefix, sorted by key. The values are shared with the
// state machine, as a watch's events are: a put replaces a key's value, never changes it,
// and callers must not change them either.
func (s *StateMachine) Range(prefix string) []meta.KeyValue {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []meta.KeyValue
	s.keys.AscendGreaterOrEqual(prefix, func(k string) bool {
		if !strings.HasPrefix(k, prefix) {
			return false
		}
		out = append(out, *s.kv[k])
		return true
	})
	return out
}

// RangePage returns up to limit keys with the prefix that sort after after ("" from the
// first), in key order, and the last key it visited when keys remain past the page (""
// when the prefix is done): the next page starts after it.
func (s *StateMachine) RangePage(prefix, after string, limit int) (kvs []meta.KeyValue, next string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	start := max(prefix, after)
	s.keys.AscendGreaterOrEqual(start, func(k string) bool {
		if !strings.HasPrefix(k, prefix) {
			return false
		}
		if k == after {
			return true
		}
		if len(kvs) == limit {
			next = kvs[len(kvs)-1].Key
			return false
		}
		kvs = append(kvs, *s.kv[k])
		return true
	})
	return kvs, next
}

// newKeyIndex returns an empty ordered index of keys.
func newKeyIndex() *btree.BTreeG[string] {
	return btree.NewOrderedG[string](32)
}

// Revision returns the current store revision.
func (s *StateMachine) Revision() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.revision
}

// Watch streams, in order, every event with Revision > fromRev whose key has the prefix,
// until ctx ends (the channel is then closed). It fails with ErrCompacted when events
// after fromRev are no longer retained. A slow reader only delays itself; if it falls so
// far behind that its next events were dropped from the bounded history, the channel is
// closed early, and a new Watch from the last revision seen reports ErrCompacted.
func (s *StateMachine) Watch(ctx context.Context, prefix string, fromRev int64) (<-chan meta.Event, error) {
	s.mu.Lock()
	if fromRev < s.compact {
		s.mu.Unlock()
		return nil, fmt.Errorf("meta: watch from revision %d (history starts after %d): %w", fromRev, s.compact, meta.ErrCompacted)
	}
	s.mu.Unlock()
	ch := make(chan meta.Event, 256)
	stop := context.AfterFunc(ctx, func() {
		s.mu.Lock()
		s.cond.Broadcast()
		s.mu.Unlock()
	})
	go func() {
		defer close(ch)
		defer stop()
		next := fromRev
		for {
			s.mu.Lock()
			for ctx.Err() == nil && s.revision <= next {
				s.cond.Wait()
			}
			if ctx.Err() != nil {
				s.mu.Unlock()
				return
			}
			if next < s.compact {
				s.mu.Unlock()
				return // fell behind the retained history: the channel closes
			}
			i := sort.Search(len(s.history), func(i int) bool { return s.history[i].Revision > next })
			batch := append([]meta.Event(nil), s.history[i:]...)
			next = s.revision
			s.mu.Unlock()
			for _, ev := range batch {
				if !strings.HasPrefix(ev.KV.Key, prefix) {
					continue
				}
				select {
				case ch <- ev:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return ch, nil
}

type snapshot struct {
	Revision int64                   `json:"rev"`
	Applied  uint64                  `json:"applied"`
	KV       []meta.KeyValue         `json:"kv"`
	Clients  map[string]*clientState `json:"clients"`
}

// Snapshot returns the whole state (keys, revision, dedup table) as bytes, and the last
// applied log slot it covers.
func (s *StateMachine) Snapshot() ([]byte, uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	snap := snapshot{Revision: s.revision, Applied: s.applied, Clients: s.clients, KV: make([]meta.KeyValue, 0, len(s.kv))}
	s.keys.Ascend(func(k string) bool {
		snap.KV = append(snap.KV, *s.kv[k])
		return true
	})
	b, err := json.Marshal(snap)
	if err != nil {
		return nil, 0, fmt.Errorf("meta: snapshot encode: %w", err)
	}
	return b, s.applied, nil
}

// Restore replaces the state with a snapshot taken by Snapshot. The watch history
// restarts at the snapshot's revision.
func (s *StateMachine) Restore(b []byte) error {
	var snap snapshot
	if err := json.Unmarshal(b, &snap); err != nil {
		return fmt.Errorf("meta: restore snapshot of %d bytes: %w", len(b), err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.kv = map[string]*meta.KeyValue{}
	s.keys = newKeyIndex()
	for i := range snap.KV {
		kv := snap.KV[i]
		s.kv[kv.Key] = &kv
		s.keys.ReplaceOrInsert(kv.Key)
	}
	s.revision, s.applied, s.compact = snap.Revision, snap.Applied, snap.Revision
	s.clients = map[string]*clientState{}
	for id, cs := range snap.Clients {
		if cs == nil {
			continue // no answer kept: nothing to deduplicate
		}
		if cs.Answers == nil {
			cs.Answers = map[uint64]meta.Response{}
		}
		s.clients[id] = cs
	}
	s.history = nil
	for prefix, set := range s.sleepers { // their history is gone: each reads again
		for ch := range set {
			close(ch)
		}
		delete(s.sleepers, prefix)
	}
	s.cond.Broadcast()
	return nil
}
