package runtime

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/atoll-run/atoll/store/meta"
)

// LogMeta is the MetaStore on the Paxos metadata log (package store/meta): every write is
// a proposal chosen by a majority of the replicas, each persisting it to its write-ahead log
// (fsync'd by default) before answering, and every read is linearizable. Keys are the table
// prefix followed by the key.
type LogMeta struct {
	cluster *meta.Cluster
	client  *meta.Client
}

var _ MetaStore = (*LogMeta)(nil)

// StartLogMeta starts an in-process replica group (cfg.Replicas, default 3, with their WALs
// under cfg.Dir, default a temporary directory) and waits for its first leader.
func StartLogMeta(ctx context.Context, cfg meta.ClusterConfig) (*LogMeta, error) {
	c, err := meta.StartCluster(cfg)
	if err != nil {
		return nil, fmt.Errorf("runtime: start the metadata log: %w", err)
	}
	if _, err := c.WaitLeader(ctx); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("runtime: the metadata log elected no leader: %w", err)
	}
	cl, err := c.Client(meta.DefaultClientConfig())
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	return &LogMeta{cluster: c, client: cl}, nil
}

// Cluster is the replica group.
func (m *LogMeta) Cluster() *meta.Cluster { return m.cluster }

// Close stops the replicas (and removes a temporary WAL directory).
func (m *LogMeta) Close() error { return m.cluster.Close() }

// Put implements MetaStore.
func (m *LogMeta) Put(ctx context.Context, table, key string, value []byte) error {
	_, err := m.client.Put(ctx, table+key, value)
	return err
}

// Get implements MetaStore.
func (m *LogMeta) Get(ctx context.Context, table, key string) ([]byte, bool, error) {
	kv, ok, err := m.client.Get(ctx, table+key)
	return kv.Value, ok, err
}

// Delete implements MetaStore.
func (m *LogMeta) Delete(ctx context.Context, table, key string) error {
	_, err := m.client.Delete(ctx, table+key)
	return err
}

// List implements MetaStore.
func (m *LogMeta) List(ctx context.Context, table, prefix string) ([]KV, error) {
	kvs, err := m.client.Range(ctx, table+prefix)
	if err != nil {
		return nil, err
	}
	out := make([]KV, 0, len(kvs))
	for _, kv := range kvs {
		out = append(out, KV{Key: strings.TrimPrefix(kv.Key, table), Value: kv.Value})
	}
	return out, nil
}

// Update implements MetaStore with compare-and-swap on the key's version, retried while
// other writers win the race.
func (m *LogMeta) Update(ctx context.Context, table, key string, fn func([]byte, bool) ([]byte, error)) error {
	k := table + key
	for attempt := 0; ; attempt++ {
		kv, ok, err := m.client.Get(ctx, k)
		if err != nil {
			return err
		}
		v, err := fn(kv.Value, ok)
		switch {
		case errors.Is(err, ErrNoChange):
			return nil
		case err != nil:
			return err
		}
		op := meta.Op{Type: meta.OpPut, Key: k, Value: v}
		if v == nil {
			if !ok {
				return nil
			}
			op = meta.Op{Type: meta.OpDelete, Key: k}
		}
		r, err := m.client.Txn(ctx, []meta.Compare{{Key: k, Version: kv.Version}}, []meta.Op{op})
		if err != nil {
			return err
		}
		if r.Succeeded {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("runtime: update %s: %w", k, err)
		}
	}
}
