// Package embed is the seam between the SDK and an embedded cluster (package sdk/local):
// the SDK gives a Config, the embedded cluster starts heads and agents in this process and
// hosts their workers through Config.Host. It lives under sdk/internal so that only the SDK
// and sdk/local use it: a program that links only sdk links no head, Paxos or agent.
package embed

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/runtime/objects"
	"github.com/atoll-run/atoll/topology"
)

// Config is what the SDK asks of an embedded cluster.
type Config struct {
	// Topology is the machines to simulate (declared, never claimed as hardware).
	Topology *topology.Cluster
	// Dir holds the heads' write-ahead logs and the agents' files.
	Dir string
	// Token is the cluster secret the SDK made.
	Token string
	// ObjectCapacity sizes each machine's object store.
	ObjectCapacity int64
	Logger         *zap.Logger
	// Host starts a worker in this process on its machine's store. The agents call it
	// when the scheduler places a worker there; it may block until the SDK is ready.
	Host func(ctx context.Context, spec api.WorkerSpec, store *objects.Local) (Handle, error)
}

// Handle is a worker hosted in this process (the methods an agent needs of a started
// worker).
type Handle interface {
	PID() int
	Done() <-chan struct{}
	Err() error
	Stop(ctx context.Context, grace time.Duration) error
	Kill() error
}

// Store is one machine's object store.
type Store struct {
	Machine string
	Local   *objects.Local
}

// Cluster is a running embedded cluster.
type Cluster interface {
	// Heads are the heads' API URLs.
	Heads() []string
	// Stores are the machines' object stores, in the topology's order.
	Stores() []Store
	// Shutdown stops the agents (and their workers) and the heads.
	Shutdown(ctx context.Context) error
}

// Starter starts an embedded cluster.
type Starter func(ctx context.Context, cfg Config) (Cluster, error)
