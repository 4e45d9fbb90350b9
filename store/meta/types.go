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
	// ErrUnauthenticated means a head refused the client's token (HTTP 401): the client's
	// token is wrong, not the head. It is not retried.
	ErrUnauthenticated = errors.New("meta: token refused")
	// ErrForbidden means a head refused the request for the client's role (HTTP 403): the
	// client may not read or write those keys. It is not retried.
	ErrForbidden = errors.New("forbidden")
)

// Table is a key prefix for one kind of record. Every key written through the client API
// belongs to a table (Request.Validate).
type Table string

// The metadata tables, named for the code that uses them. The list of tables is
// AllTables: a constant alone does not make a table.
const (
	TableNodes       Table = "nodes/"
	TableJobs        Table = "jobs/"
	TableGangs       Table = "gangs/"
	TablePlacements  Table = "placements/"
	TableActors      Table = "actors/"
	TableObjects     Table = "objects/"
	TableCheckpoints Table = "checkpoints/"
	// TableBinaries holds jobs' executables by content hash (the runtime's api.Binary).
	TableBinaries Table = "binaries/"
	// TableEvents holds the control plane's bounded event log (the runtime's api.Event).
	TableEvents Table = "events/"
	// TableConfig holds the cluster's configuration records (the runtime's
	// api.SchedulerConfig: queues and priority classes).
	TableConfig Table = "config/"
	// TableOwners holds the live owners of objects that are neither machines nor gangs
	// (the runtime's api.Owner: a driver process, renewed while it runs).
	TableOwners Table = "owners/"
	// TableControl holds the control plane's decision inputs that are no other table's
	// records: the leader term, machines' cordons and drains, the restart costs and the
	// workload the scheduler learned (the runtime's api.ControlTerm, api.Cordon,
	// api.LearnedCosts).
	TableControl Table = "control/"
	// TableAuth holds what the heads decide authorization with: the revoked credentials
	// (auth/revoked/<id>, the runtime's api.Revocation).
	TableAuth Table = "auth/"
	// TableServices holds the services' records (the runtime's api.Service: spec and the
	// leader's scaling decisions).
	TableServices Table = "services/"
)

// AllTables lists every table: the one place that says which key prefixes exist. Adding a
// table is adding one line here (a table name ends with "/" and is not a prefix of
// another: TestTables checks both, and that every Table constant is listed).
func AllTables() []Table {
	return []Table{
		TableNodes,
		TableJobs,
		TableGangs,
		TablePlacements,
		TableActors,
		TableObjects,
		TableCheckpoints,
		TableBinaries,
		TableEvents,
		TableConfig,
		TableOwners,
		TableControl,
		TableAuth,
		TableServices,
	}
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

// checkKey refuses a key outside every table, or one that is only a table's prefix.
func checkKey(what string, i int, key string) error {
	t, ok := OfKey(key)
	if !ok {
		return fmt.Errorf("%w: %s %d: key %q is in no table (tables: %v)", ErrBadRequest, what, i, key, AllTables())
	}
	if key == string(t) {
		return fmt.Errorf("%w: %s %d: key %q has no id after its table", ErrBadRequest, what, i, key)
	}
	return nil
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

// Validate checks a request before it is proposed: its shape, and that every key is in a
// table (AllTables). The state machine checks the shape only (ValidateShape), so that a
// log written before a key rule existed replays to the same state.
func (r *Request) Validate() error {
	if err := r.ValidateShape(); err != nil {
		return err
	}
	for i, op := range r.Ops {
		if err := checkKey("op", i, op.Key); err != nil {
			return err
		}
	}
	for i, c := range r.Compares {
		if err := checkKey("compare", i, c.Key); err != nil {
			return err
		}
	}
	return nil
}

// ValidateShape checks what the state machine checks when it applies a request: ops with
// keys and known types, compares with keys, a sequence number with a client id.
func (r *Request) ValidateShape() error {
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

// ErrNotLeader means the replica asked does not lead (or no leader is known yet): try
// another. A *NotLeaderError says which replica leads, when the replica knows.
var ErrNotLeader = errors.New("meta: not the leader")

// NotLeaderError is a follower's answer: Leader is the replica it believes leads (0:
// unknown). It matches ErrNotLeader with errors.Is.
type NotLeaderError struct {
	Leader uint64
}

func (e *NotLeaderError) Error() string {
	if e.Leader == 0 {
		return "meta: not the leader (leader unknown)"
	}
	return fmt.Sprintf("meta: not the leader (replica %d leads)", e.Leader)
}

// Is makes a NotLeaderError match ErrNotLeader.
func (e *NotLeaderError) Is(target error) bool { return target == ErrNotLeader }
