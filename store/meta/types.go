package meta

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors of the meta package.
var (
	// ErrCompacted is returned by Watch when the requested revision is older than the
	// retained history.
	ErrCompacted = errors.New("meta: revision compacted")
	// ErrBadRequest means a request was malformed (empty key, unknown op); it is not retried.
	ErrBadRequest = errors.New("meta: bad request")
	// ErrStaleRequest means a retried request's answer was already acknowledged and
	// forgotten: the client must not reuse a request id below its acknowledgement mark.
	ErrStaleRequest = errors.New("meta: stale request id")
	// ErrNotFound is returned by typed getters for a missing key.
	ErrNotFound = errors.New("meta: not found")
	// ErrNoReplica is returned by a Client with no reachable replica before its deadline.
	ErrNoReplica = errors.New("meta: no replica answered")
)

// Table is a key prefix for one kind of record.
type Table string

// The metadata tables.
const (
	TableNodes       Table = "nodes/"
	TableJobs        Table = "jobs/"
	TableGangs       Table = "gangs/"
	TablePlacements  Table = "placements/"
	TableActors      Table = "actors/"
	TableObjects     Table = "objects/"
	TableCheckpoints Table = "checkpoints/"
)

// AllTables lists every table.
func AllTables() []Table {
	return []Table{TableNodes, TableJobs, TableGangs, TablePlacements, TableActors, TableObjects, TableCheckpoints}
}

// Key returns the key of id in the table.
func (t Table) Key(id string) string { return string(t) + id }

// OfKey returns the table a key belongs to and whether it is a known table.
func OfKey(key string) (Table, bool) {
	for _, t := range AllTables() {
		if strings.HasPrefix(key, string(t)) {
			return t, true
		}
	}
	return "", false
}

// KeyValue is a stored key with its versions.
type KeyValue struct {
	Key   string `json:"k"`
	Value []byte `json:"v,omitempty"`
	// CreateRevision is the store revision that created the key.
	CreateRevision int64 `json:"cr"`
	// ModRevision is the store revision of the last change.
	ModRevision int64 `json:"mr"`
	// Version counts changes since creation (1 after the first put); 0 means absent.
	Version int64 `json:"ver"`
}

// OpType is a write operation's kind.
type OpType string

// Operation kinds.
const (
	OpPut    OpType = "put"
	OpDelete OpType = "del"
)

// Op is one write inside a transaction.
type Op struct {
	Type  OpType `json:"t"`
	Key   string `json:"k"`
	Value []byte `json:"v,omitempty"`
}

// Compare is a transaction guard: the key's Version must equal Version (0 = absent).
type Compare struct {
	Key     string `json:"k"`
	Version int64  `json:"ver"`
}

// Request is one replicated command: if every Compare holds, all Ops apply atomically
// at one new revision. ClientID and Seq identify it for deduplication: a retried request
// with the same (ClientID, Seq) is applied at most once and answered with the first answer.
type Request struct {
	ClientID string    `json:"c,omitempty"`
	Seq      uint64    `json:"s,omitempty"`
	AckBelow uint64    `json:"a,omitempty"` // the client has its answers for every Seq < AckBelow
	Compares []Compare `json:"if,omitempty"`
	Ops      []Op      `json:"ops"`
}

// Validate checks a request's shape.
func (r *Request) Validate() error {
	if len(r.Ops) == 0 {
		return fmt.Errorf("%w: no ops", ErrBadRequest)
	}
	for i, op := range r.Ops {
		if op.Key == "" {
			return fmt.Errorf("%w: op %d has an empty key", ErrBadRequest, i)
		}
		if op.Type != OpPut && op.Type != OpDelete {
			return fmt.Errorf("%w: op %d on %q has unknown type %q", ErrBadRequest, i, op.Key, op.Type)
		}
	}
	for i, c := range r.Compares {
		if c.Key == "" {
			return fmt.Errorf("%w: compare %d has an empty key", ErrBadRequest, i)
		}
	}
	if r.ClientID != "" && r.Seq == 0 {
		return fmt.Errorf("%w: client %q request without a sequence number", ErrBadRequest, r.ClientID)
	}
	return nil
}

// Response answers a Request.
type Response struct {
	// Succeeded is false when a Compare failed (nothing was written).
	Succeeded bool `json:"ok"`
	// Revision is the store revision after the request.
	Revision int64 `json:"rev"`
	// Error is set when the request was refused (bad or stale); nothing was written.
	Error string `json:"err,omitempty"`
}

// EventType is a watch event's kind.
type EventType string

// Event kinds.
const (
	EventPut    EventType = "put"
	EventDelete EventType = "del"
)

// Event is one change seen by a watcher, at Revision (several events may share one
// revision when a transaction wrote several keys).
type Event struct {
	Type     EventType `json:"t"`
	Revision int64     `json:"rev"`
	KV       KeyValue  `json:"kv"`
}

// Object is the metadata of an object in the object store.
type Object struct {
	ID          string   `json:"id"`
	Size        int64    `json:"size"`
	Fingerprint string   `json:"fp"`
	Locations   []string `json:"locs"`
	Owner       string   `json:"owner"`
	Refcount    int64    `json:"refs"`
}
