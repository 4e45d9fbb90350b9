package metaserver

import (
	"context"
	"errors"

	"github.com/atoll-run/atoll/store/meta"
	"github.com/atoll-run/atoll/store/paxos"
)

// LocalConn is a Conn to an in-process replica.
type LocalConn struct {
	Replica *paxos.Replica
	SM      *StateMachine
}

var _ meta.Conn = LocalConn{}

// Propose implements Conn.
func (c LocalConn) Propose(ctx context.Context, req []byte) ([]byte, error) {
	out, err := c.Replica.Propose(ctx, req)
	return out, notLeader(err)
}

// Get implements Conn.
func (c LocalConn) Get(ctx context.Context, key string) (meta.KeyValue, bool, error) {
	if err := c.Replica.Read(ctx); err != nil {
		return meta.KeyValue{}, false, notLeader(err)
	}
	kv, ok := c.SM.Get(key)
	return kv, ok, nil
}

// Range implements Conn.
func (c LocalConn) Range(ctx context.Context, prefix string) ([]meta.KeyValue, error) {
	if err := c.Replica.Read(ctx); err != nil {
		return nil, notLeader(err)
	}
	return c.SM.Range(prefix), nil
}

// RangePage implements Conn.
func (c LocalConn) RangePage(ctx context.Context, prefix, after string, limit int) (meta.Page, error) {
	if err := c.Replica.Read(ctx); err != nil {
		return meta.Page{}, notLeader(err)
	}
	kvs, next := c.SM.RangePage(prefix, after, limit)
	return meta.Page{KVs: kvs, Next: next}, nil
}

// notLeader turns the replica's not-leader answer into the client's (meta.NotLeaderError),
// so that a meta.Client follows its hint.
func notLeader(err error) error {
	var nl *paxos.NotLeaderError
	if errors.As(err, &nl) {
		return &meta.NotLeaderError{Leader: nl.Leader}
	}
	return err
}
