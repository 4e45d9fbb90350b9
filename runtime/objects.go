package runtime

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/atoll-run/atoll/store/object"
	"github.com/atoll-run/atoll/store/transfer"
)

// ObjectID names an immutable object in the cluster (the hex form of an object.ID).
type ObjectID string

func parseObjectID(id ObjectID) (object.ID, error) {
	oid, err := object.ParseID(string(id))
	if err != nil {
		return object.ID{}, fmt.Errorf("%w: %q is not an object id: %v", ErrUnknownObject, id, err)
	}
	return oid, nil
}

// ObjectsConfig configures the machines' object stores and the transfer plane between them.
type ObjectsConfig struct {
	// Dir holds every machine's spill files (a subdirectory each). Default: a temporary
	// directory removed at Shutdown.
	Dir string
	// ShmDir is the shared-memory filesystem. Default /dev/shm.
	ShmDir string
	// CapacityPerMachine bounds each machine's hot tier. Default 256 MiB (the embedded
	// default runs every machine's store in one process).
	CapacityPerMachine int64
	// Token authenticates the transfer plane's peers. Default: 32 random bytes.
	Token []byte
	// Registerer receives the stores' and transfer plane's counters. Default: a private
	// registry (see Local.Metrics).
	Registerer prometheus.Registerer
}

// Agent is one machine's agent: its GPUs and its object store, served on the transfer plane.
type Agent struct {
	Machine Machine
	Node    *transfer.Node
}

// objects is the embedded cluster's object layer: one store per machine, one directory
// (written through the metadata log), and who holds which reference where.
type objects struct {
	dir     string
	ownDir  bool
	agents  []*Agent
	direct  *metaDirectory
	log     *zap.Logger
	mu      sync.Mutex
	holders map[object.ID][]hold
}

type hold struct {
	machine int
	holder  string
}

func startObjects(cfg ObjectsConfig, machines []Machine, meta MetaStore, log *zap.Logger) (*objects, error) {
	o := &objects{dir: cfg.Dir, direct: newMetaDirectory(meta), log: log, holders: map[object.ID][]hold{}}
	if o.dir == "" {
		d, err := os.MkdirTemp("", "atoll-objects-")
		if err != nil {
			return nil, fmt.Errorf("runtime: object spill directory: %w", err)
		}
		o.dir, o.ownDir = d, true
	}
	if cfg.CapacityPerMachine == 0 {
		cfg.CapacityPerMachine = 256 << 20
	}
	if cfg.CapacityPerMachine < 0 {
		return nil, fmt.Errorf("%w: object capacity per machine %d is negative", ErrInvalidRequest, cfg.CapacityPerMachine)
	}
	if len(cfg.Token) == 0 {
		cfg.Token = make([]byte, 32)
		_, _ = rand.Read(cfg.Token)
	}
	for _, m := range machines {
		nc := transfer.DefaultNodeConfig()
		nc.Name, nc.Dir, nc.Token, nc.Logger, nc.Registerer = m.Name, filepath.Join(o.dir, m.Name), cfg.Token, log.Named("objects").With(zap.String("machine", m.Name)), cfg.Registerer
		nc.Store.Capacity = cfg.CapacityPerMachine
		nc.Store.Directory = o.direct
		if cfg.ShmDir != "" {
			nc.Store.ShmDir = cfg.ShmDir
		}
		n, err := transfer.StartNode(nc)
		if err != nil {
			o.close(context.Background())
			return nil, fmt.Errorf("runtime: object store of %s: %w", m.Name, err)
		}
		o.agents = append(o.agents, &Agent{Machine: m, Node: n})
	}
	return o, nil
}

func (o *objects) close(ctx context.Context) error {
	var errs []error
	for _, a := range o.agents {
		errs = append(errs, a.Node.Shutdown(ctx))
	}
	if o.ownDir {
		errs = append(errs, os.RemoveAll(o.dir))
	}
	return errors.Join(errs...)
}

func (o *objects) agent(machine int) (*Agent, error) {
	if machine < 0 || machine >= len(o.agents) {
		return nil, fmt.Errorf("%w: machine %d of %d", ErrUnknownMachine, machine, len(o.agents))
	}
	return o.agents[machine], nil
}

func (o *objects) addHold(id object.ID, h hold) {
	o.mu.Lock()
	o.holders[id] = append(o.holders[id], h)
	o.mu.Unlock()
}

// put stores data on a machine; the store commits the object's metadata (through the
// directory) before put returns.
func (o *objects) put(ctx context.Context, machine int, owner string, data []byte) (object.ID, error) {
	a, err := o.agent(machine)
	if err != nil {
		return object.ID{}, err
	}
	id, err := a.Node.Store.Put(ctx, owner, data)
	if err != nil {
		return object.ID{}, fmt.Errorf("runtime: put object on %s: %w", a.Machine.Name, err)
	}
	o.addHold(id, hold{machine, owner})
	return id, nil
}

// get returns a view of an object on a machine, pulling it over the transfer plane from a
// machine that holds it when it is not local.
func (o *objects) get(ctx context.Context, machine int, id object.ID) (*object.View, error) {
	a, err := o.agent(machine)
	if err != nil {
		return nil, err
	}
	o.mu.Lock()
	_, live := o.holders[id]
	o.mu.Unlock()
	if !live { // freed (a transfer may still pin its bytes for a moment) or never put
		return nil, fmt.Errorf("%w: %s", ErrUnknownObject, id)
	}
	if v, err := a.Node.Store.Get(ctx, id); err == nil {
		return v, nil
	} else if !isNotFound(err) {
		return nil, err
	}
	holder := "agent/" + a.Machine.Name
	v, err := a.Node.Get(ctx, id, holder)
	if err != nil {
		if isNotFound(err) {
			return nil, fmt.Errorf("%w: %s: %v", ErrUnknownObject, id, err)
		}
		return nil, err
	}
	o.addHold(id, hold{machine, holder})
	return v, nil
}

// free drops every reference to the object on every machine; each store frees its copy
// once no view is held, and the directory forgets the object with its last copy.
func (o *objects) free(ctx context.Context, id object.ID) error {
	o.mu.Lock()
	hs, ok := o.holders[id]
	delete(o.holders, id)
	o.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: %s", ErrUnknownObject, id)
	}
	var errs []error
	for _, h := range hs {
		if err := o.agents[h.machine].Node.Store.Release(ctx, id, h.holder); err != nil && !isNotFound(err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
