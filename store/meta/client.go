package meta

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"
)

// Conn is the client's view of one replica. Implementations: metaserver.LocalConn (in process) and
// HTTPConn (the head's client API). Errors wrapping ErrNotLeader (ideally a
// *NotLeaderError with a hint) make the Client try another replica.
type Conn interface {
	// Propose replicates an encoded Request and returns the encoded Response.
	Propose(ctx context.Context, req []byte) ([]byte, error)
	// Get reads key linearizably at this replica (which must lead).
	Get(ctx context.Context, key string) (KeyValue, bool, error)
	// Range reads every key with the prefix linearizably at this replica.
	Range(ctx context.Context, prefix string) ([]KeyValue, error)
	// RangePage reads up to limit keys with the prefix after after, linearizably at this
	// replica (Page.Next: where the next page starts, "" at the end).
	RangePage(ctx context.Context, prefix, after string, limit int) (Page, error)
}

// Page is one page of a range read: its keys, and the key the next page starts after (""
// when the prefix has no more). Pages are read at different revisions: a key written
// between two pages is seen or not, as in any sequence of reads.
type Page struct {
	KVs  []KeyValue `json:"kvs"`
	Next string     `json:"next,omitempty"`
}

// ClientConfig configures a Client.
type ClientConfig struct {
	// ID names the client for request deduplication; random when empty. Two live clients
	// must never share an ID.
	ID string
	// AttemptTimeout bounds one attempt at one replica (default 2 s).
	AttemptTimeout time.Duration
	// MinBackoff and MaxBackoff bound the wait between retries (default 2 ms, 100 ms).
	MinBackoff, MaxBackoff time.Duration
	// Logger (default zap.NewNop()).
	Logger *zap.Logger
	// Resolve, when set, finds the conn of a replica the client was not given, when a
	// replica's redirect names it (a client built while a head did not answer knows only
	// the others, and two followers would otherwise send it back and forth between them).
	Resolve func(ctx context.Context, id uint64) (Conn, bool)
}

// DefaultClientConfig returns a config with a random client id.
func DefaultClientConfig() ClientConfig {
	return ClientConfig{AttemptTimeout: 2 * time.Second, MinBackoff: 2 * time.Millisecond, MaxBackoff: 100 * time.Millisecond, Logger: zap.NewNop()}
}

// Validate checks the config.
func (c ClientConfig) Validate() error {
	if c.AttemptTimeout <= 0 || c.MinBackoff <= 0 || c.MaxBackoff < c.MinBackoff {
		return fmt.Errorf("meta: client config: AttemptTimeout %v, backoff [%v, %v] must be positive and ordered", c.AttemptTimeout, c.MinBackoff, c.MaxBackoff)
	}
	return nil
}

// Client talks to a replica group: it finds the leader (following redirects), retries
// transient failures until the ctx deadline, and tags every write with (ID, Seq) so a
// retried write takes effect at most once. Safe for concurrent use.
type Client struct {
	cfg ClientConfig
	log *zap.Logger

	mu       sync.Mutex
	conns    map[uint64]Conn // grown by cfg.Resolve
	ids      []uint64        // conns' keys, sorted
	leader   uint64
	seq      uint64
	inflight map[uint64]bool
}

// NewClient returns a client over the replicas' conns (keyed by replica id).
func NewClient(cfg ClientConfig, conns map[uint64]Conn) (*Client, error) {
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if len(conns) == 0 {
		return nil, fmt.Errorf("meta: client without replicas: %w", ErrNoReplica)
	}
	if cfg.ID == "" {
		b := make([]byte, 12)
		rand.Read(b)
		cfg.ID = hex.EncodeToString(b)
	}
	c := &Client{cfg: cfg, log: cfg.Logger.Named("meta-client"), conns: map[uint64]Conn{}, inflight: map[uint64]bool{}}
	for id, conn := range conns {
		c.conns[id] = conn
		c.ids = append(c.ids, id)
	}
	slices.Sort(c.ids)
	c.leader = c.ids[0]
	return c, nil
}

// do runs fn against the believed leader, following hints and retrying retryable
// failures with backoff until ctx ends.
func (c *Client) do(ctx context.Context, fn func(ctx context.Context, conn Conn) error) error {
	backoff := c.cfg.MinBackoff
	var last error
	for attempt := 0; ; attempt++ {
		c.mu.Lock()
		target := c.leader
		conn := c.conns[target]
		c.mu.Unlock()
		actx, cancel := context.WithTimeout(ctx, c.cfg.AttemptTimeout)
		err := fn(actx, conn)
		cancel()
		if err == nil {
			return nil
		}
		if errors.Is(err, ErrBadRequest) || errors.Is(err, ErrStaleRequest) || errors.Is(err, ErrUnauthenticated) || errors.Is(err, ErrForbidden) {
			return err
		}
		last = err
		var nl *NotLeaderError
		hinted := false
		if errors.As(err, &nl) && nl.Leader != 0 && nl.Leader != target && c.known(ctx, nl.Leader) {
			c.setLeader(target, nl.Leader)
			hinted = true
		}
		if !hinted {
			c.setLeader(target, c.next(target))
		}
		if ctx.Err() != nil {
			return fmt.Errorf("meta: gave up after %d attempts: %w (last: %v)", attempt+1, ErrNoReplica, last)
		}
		if hinted {
			continue
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("meta: gave up after %d attempts: %w (last: %v)", attempt+1, ErrNoReplica, last)
		case <-t.C:
		}
		backoff = min(2*backoff, c.cfg.MaxBackoff)
	}
}

// known reports whether the client has a conn to replica id, resolving it when it has
// not and can.
func (c *Client) known(ctx context.Context, id uint64) bool {
	c.mu.Lock()
	_, ok := c.conns[id]
	c.mu.Unlock()
	if ok || c.cfg.Resolve == nil {
		return ok
	}
	conn, ok := c.cfg.Resolve(ctx, id)
	if !ok {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, had := c.conns[id]; !had {
		c.conns[id] = conn
		c.ids = append(c.ids, id)
		slices.Sort(c.ids)
		c.log.Info("replica resolved", zap.Uint64("replica", id))
	}
	return true
}

// next is the replica after id in the client's order.
func (c *Client) next(id uint64) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ids[(slices.Index(c.ids, id)+1)%len(c.ids)]
}

func (c *Client) setLeader(from, to uint64) {
	c.mu.Lock()
	if c.leader == from {
		c.leader = to
	}
	c.mu.Unlock()
}

// Txn applies ops atomically if every compare holds. Response.Succeeded reports the guard.
func (c *Client) Txn(ctx context.Context, compares []Compare, ops []Op) (Response, error) {
	req := Request{ClientID: c.cfg.ID, Compares: compares, Ops: ops}
	if err := (&Request{Ops: ops, Compares: compares}).Validate(); err != nil {
		return Response{}, err
	}
	c.mu.Lock()
	c.seq++
	req.Seq = c.seq
	c.inflight[req.Seq] = true
	req.AckBelow = req.Seq
	for s := range c.inflight {
		req.AckBelow = min(req.AckBelow, s)
	}
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.inflight, req.Seq)
		c.mu.Unlock()
	}()
	data, err := json.Marshal(&req)
	if err != nil {
		return Response{}, fmt.Errorf("meta: encode request: %w", err)
	}
	var resp Response
	err = c.do(ctx, func(ctx context.Context, conn Conn) error {
		out, err := conn.Propose(ctx, data)
		if err != nil {
			return err
		}
		if err := json.Unmarshal(out, &resp); err != nil {
			return fmt.Errorf("meta: decode response %q: %w", out, err)
		}
		if resp.Error != "" {
			return fmt.Errorf("meta: request refused: %s: %w", resp.Error, ErrBadRequest)
		}
		return nil
	})
	return resp, err
}

// Put writes key and returns the new revision.
func (c *Client) Put(ctx context.Context, key string, value []byte) (int64, error) {
	r, err := c.Txn(ctx, nil, []Op{{Type: OpPut, Key: key, Value: value}})
	return r.Revision, err
}

// Delete removes key and returns the new revision.
func (c *Client) Delete(ctx context.Context, key string) (int64, error) {
	r, err := c.Txn(ctx, nil, []Op{{Type: OpDelete, Key: key}})
	return r.Revision, err
}

// CAS writes key only if its version is version (0: only if absent). It reports whether
// the write happened.
func (c *Client) CAS(ctx context.Context, key string, version int64, value []byte) (bool, error) {
	r, err := c.Txn(ctx, []Compare{{Key: key, Version: version}}, []Op{{Type: OpPut, Key: key, Value: value}})
	return r.Succeeded, err
}

// Get reads key linearizably (at the leader).
func (c *Client) Get(ctx context.Context, key string) (KeyValue, bool, error) {
	var kv KeyValue
	var ok bool
	err := c.do(ctx, func(ctx context.Context, conn Conn) error {
		var err error
		kv, ok, err = conn.Get(ctx, key)
		return err
	})
	return kv, ok, err
}

// Range reads every key with the prefix linearizably.
func (c *Client) Range(ctx context.Context, prefix string) ([]KeyValue, error) {
	var out []KeyValue
	err := c.do(ctx, func(ctx context.Context, conn Conn) error {
		var err error
		out, err = conn.Range(ctx, prefix)
		return err
	})
	return out, err
}

// RangePage reads one page of the keys with the prefix (up to limit, after after),
// linearizably.
func (c *Client) RangePage(ctx context.Context, prefix, after string, limit int) (Page, error) {
	var out Page
	err := c.do(ctx, func(ctx context.Context, conn Conn) error {
		var err error
		out, err = conn.RangePage(ctx, prefix, after, limit)
		return err
	})
	return out, err
}

// PutObject records an object's metadata in the objects table.
func (c *Client) PutObject(ctx context.Context, o Object) error {
	if o.ID == "" {
		return fmt.Errorf("%w: object without id", ErrBadRequest)
	}
	b, err := json.Marshal(o)
	if err != nil {
		return fmt.Errorf("meta: encode object %q: %w", o.ID, err)
	}
	_, err = c.Put(ctx, TableObjects.Key(o.ID), b)
	return err
}

// GetObject reads an object's metadata (ErrNotFound when absent).
func (c *Client) GetObject(ctx context.Context, id string) (Object, error) {
	kv, ok, err := c.Get(ctx, TableObjects.Key(id))
	if err != nil {
		return Object{}, err
	}
	if !ok {
		return Object{}, fmt.Errorf("meta: object %q: %w", id, ErrNotFound)
	}
	var o Object
	if err := json.Unmarshal(kv.Value, &o); err != nil {
		return Object{}, fmt.Errorf("meta: decode object %q: %w", id, err)
	}
	return o, nil
}
