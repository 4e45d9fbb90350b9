package metaserver

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"go.uber.org/zap"

	"github.com/atoll-run/atoll/internal/freeport"
	"github.com/atoll-run/atoll/store/meta"
	"github.com/atoll-run/atoll/store/paxos"
)

// ClusterConfig configures an in-process replica group (the embedded head's default).
type ClusterConfig struct {
	// Replicas is the group size (default 3).
	Replicas int
	// Dir holds one WAL directory per replica; empty means a new temporary directory
	// (removed by Close).
	Dir string
	// NoSync turns fsync off (tests only: an acknowledged write may then be lost on power cut).
	NoSync bool
	// TCP makes the replicas talk over loopback TCP with token authentication instead of
	// an in-memory network.
	TCP bool
	// Token is the cluster secret for TCP (default a fixed dev token).
	Token []byte
	// TLS, with TCP, makes the replica links mutual TLS (paxos.TCPConfig.TLS): one config
	// serves every replica, so its certificate must be valid for 127.0.0.1.
	TLS *tls.Config
	// TickInterval is the Paxos tick (default 10 ms); ElectionTimeout the leader's silence
	// after which a replica asks for an election (0: ten ticks, at least 500 ms: the
	// replicas' clocks follow the wall clock, and on a loaded machine a shorter timeout
	// passes whenever the leader misses the CPU for that long).
	TickInterval    time.Duration
	ElectionTimeout time.Duration
	// Logger (default zap.NewNop()).
	Logger *zap.Logger
}

// DefaultClusterConfig returns 3 in-memory-networked replicas with fsync'd WALs in a
// temporary directory.
func DefaultClusterConfig() ClusterConfig {
	return ClusterConfig{Replicas: 3, TickInterval: 10 * time.Millisecond, Token: []byte("atoll-dev-cluster-token"), Logger: zap.NewNop()}
}

// Validate checks the config.
func (c ClusterConfig) Validate() error {
	if c.Replicas < 1 || c.Replicas > 9 {
		return fmt.Errorf("meta: cluster of %d replicas: want 1..9", c.Replicas)
	}
	if c.TickInterval < paxos.MinTickInterval || c.TickInterval > paxos.MaxTickInterval {
		return fmt.Errorf("meta: cluster tick interval %v must be in [%v, %v]", c.TickInterval, paxos.MinTickInterval, paxos.MaxTickInterval)
	}
	if c.TLS != nil && !c.TCP {
		return fmt.Errorf("meta: cluster TLS needs TCP (the in-memory network has no links to encrypt)")
	}
	return nil
}

// Cluster is a running in-process replica group with its state machines.
type Cluster struct {
	cfg        ClusterConfig
	tempDir    bool
	IDs        []uint64
	Replicas   map[uint64]*paxos.Replica
	SMs        map[uint64]*StateMachine
	transports []paxos.Transport
}

// StartCluster starts the group. Close stops it.
func StartCluster(cfg ClusterConfig) (*Cluster, error) {
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := &Cluster{cfg: cfg, Replicas: map[uint64]*paxos.Replica{}, SMs: map[uint64]*StateMachine{}}
	if cfg.Dir == "" {
		d, err := os.MkdirTemp("", "atoll-meta-")
		if err != nil {
			return nil, fmt.Errorf("meta: temp dir: %w", err)
		}
		c.cfg.Dir, c.tempDir = d, true
	}
	for i := 1; i <= cfg.Replicas; i++ {
		c.IDs = append(c.IDs, uint64(i))
	}
	trs := map[uint64]paxos.Transport{}
	if cfg.TCP {
		addrs, err := freeport.Addrs("127.0.0.1", len(c.IDs))
		if err != nil {
			return nil, fmt.Errorf("meta: pick ports: %w", err)
		}
		peers := map[uint64]string{}
		for i, id := range c.IDs {
			peers[id] = addrs[i]
		}
		for _, id := range c.IDs {
			tr, err := paxos.NewTCPTransport(paxos.TCPConfig{ID: id, Listen: peers[id], Peers: peers, Token: cfg.Token, TLS: cfg.TLS, Logger: cfg.Logger})
			if err != nil {
				c.Close()
				return nil, err
			}
			trs[id] = tr
			c.transports = append(c.transports, tr)
		}
	} else {
		net := paxos.NewMemNetwork(1)
		for _, id := range c.IDs {
			trs[id] = net.Transport(id)
		}
	}
	for _, id := range c.IDs {
		w, err := paxos.OpenWAL(filepath.Join(c.cfg.Dir, fmt.Sprintf("replica-%d", id)), paxos.WALOptions{NoSync: cfg.NoSync, Logger: cfg.Logger})
		if err != nil {
			c.Close()
			return nil, err
		}
		rc := paxos.DefaultReplicaConfig(id, c.IDs)
		election := cfg.ElectionTimeout
		if election == 0 {
			election = max(10*cfg.TickInterval, 500*time.Millisecond)
		}
		if err := rc.SetTiming(cfg.TickInterval, election); err != nil {
			w.Close()
			c.Close()
			return nil, fmt.Errorf("meta: %w", err)
		}
		rc.Logger = cfg.Logger
		sm := NewStateMachine(0)
		r, err := paxos.StartReplica(rc, w, trs[id], sm)
		if err != nil {
			w.Close()
			c.Close()
			return nil, err
		}
		c.Replicas[id], c.SMs[id] = r, sm
	}
	return c, nil
}

// Dir returns the WAL root directory.
func (c *Cluster) Dir() string { return c.cfg.Dir }

// Conns returns a LocalConn per replica, for NewClient.
func (c *Cluster) Conns() map[uint64]meta.Conn {
	out := map[uint64]meta.Conn{}
	for id, r := range c.Replicas {
		out[id] = LocalConn{Replica: r, SM: c.SMs[id]}
	}
	return out
}

// Client returns a client of this cluster.
func (c *Cluster) Client(cfg meta.ClientConfig) (*meta.Client, error) {
	return meta.NewClient(cfg, c.Conns())
}

// WaitLeader waits until some replica leads and returns its id.
func (c *Cluster) WaitLeader(ctx context.Context) (uint64, error) {
	for {
		for id, r := range c.Replicas {
			if r.Status().Role == paxos.Leader {
				return id, nil
			}
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("meta: no leader: %w", ctx.Err())
		case <-time.After(c.cfg.TickInterval):
		}
	}
}

// Close stops every replica and transport, and removes the temporary directory.
func (c *Cluster) Close() error {
	var errs []error
	for _, r := range c.Replicas {
		errs = append(errs, r.Close())
	}
	for _, t := range c.transports {
		errs = append(errs, t.Close())
	}
	if c.tempDir {
		errs = append(errs, os.RemoveAll(c.cfg.Dir))
	}
	return errors.Join(errs...)
}
