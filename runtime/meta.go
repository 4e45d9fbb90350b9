package runtime

import (
	"context"
	"errors"
	"sort"
	"strings"
	"sync"

	"github.com/atoll-run/atoll/store/meta"
)

// Metadata tables the runtime writes: the metadata log's tables (a table is a key prefix).
const (
	TableMachines    = string(meta.TableNodes)
	TableJobs        = string(meta.TableJobs)
	TableGangs       = string(meta.TableGangs)
	TablePlacements  = string(meta.TablePlacements)
	TableObjects     = string(meta.TableObjects)
	TableCheckpoints = string(meta.TableCheckpoints)
)

// KV is one metadata entry.
type KV struct {
	Key   string
	Value []byte
}

// MetaStore is where the head commits what it decides before acting on it. Implementations
// must be safe for concurrent use and linearizable; a Put returns only once the write is
// durable by the implementation's standard (the Paxos log: committed on a majority). Values
// are owned by the caller after the call returns.
type MetaStore interface {
	Put(ctx context.Context, table, key string, value []byte) error
	Get(ctx context.Context, table, key string) (value []byte, ok bool, err error)
	Delete(ctx context.Context, table, key string) error
	// List returns the entries of table whose keys start with prefix, sorted by key.
	List(ctx context.Context, table, prefix string) ([]KV, error)
	// Update replaces a key's value with fn(old) atomically (fn may run more than once, and
	// must not keep old). fn returning a nil value deletes the key; ErrNoChange leaves it.
	Update(ctx context.Context, table, key string, fn func(old []byte, ok bool) ([]byte, error)) error
}

// ErrNoChange, returned by an Update function, leaves the key as it is.
var ErrNoChange = errors.New("runtime: no change")

// MemMeta is an in-memory MetaStore for tests and for a single-process head without
// durability.
type MemMeta struct {
	mu sync.RWMutex
	t  map[string]map[string][]byte
}

var _ MetaStore = (*MemMeta)(nil)

// NewMemMeta returns an empty in-memory MetaStore.
func NewMemMeta() *MemMeta { return &MemMeta{t: map[string]map[string][]byte{}} }

// Put implements MetaStore.
func (m *MemMeta) Put(ctx context.Context, table, key string, value []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.t[table] == nil {
		m.t[table] = map[string][]byte{}
	}
	m.t[table][key] = append([]byte(nil), value...)
	return nil
}

// Get implements MetaStore.
func (m *MemMeta) Get(ctx context.Context, table, key string) ([]byte, bool, error) {
	if err := ctx.Err(); err != nil {
		return nil, false, err
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	v, ok := m.t[table][key]
	return append([]byte(nil), v...), ok, nil
}

// Delete implements MetaStore.
func (m *MemMeta) Delete(ctx context.Context, table, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.t[table], key)
	return nil
}

// Update implements MetaStore.
func (m *MemMeta) Update(ctx context.Context, table, key string, fn func([]byte, bool) ([]byte, error)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	old, ok := m.t[table][key]
	v, err := fn(append([]byte(nil), old...), ok)
	switch {
	case errors.Is(err, ErrNoChange):
		return nil
	case err != nil:
		return err
	case v == nil:
		delete(m.t[table], key)
	default:
		if m.t[table] == nil {
			m.t[table] = map[string][]byte{}
		}
		m.t[table][key] = append([]byte(nil), v...)
	}
	return nil
}

// List implements MetaStore.
func (m *MemMeta) List(ctx context.Context, table, prefix string) ([]KV, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	var out []KV
	for k, v := range m.t[table] {
		if strings.HasPrefix(k, prefix) {
			out = append(out, KV{Key: k, Value: append([]byte(nil), v...)})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}
