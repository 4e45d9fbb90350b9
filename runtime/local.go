package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/atoll-run/atoll/actors"
	"github.com/atoll-run/atoll/gang"
	"github.com/atoll-run/atoll/store/meta"
)

// Config configures an embedded cluster. DefaultConfig gives the embedded default.
type Config struct {
	// Logger receives every component's logs. Default: no-op.
	Logger *zap.Logger
	// Cluster describes the machines. Default: DefaultCluster().
	Cluster *Cluster
	// Placer places gangs. Default: the gang scheduler core (GangPlacer with
	// gang.DefaultConfig()).
	Placer Placer
	// Meta is where the head commits its decisions. Default: the Paxos metadata log, with
	// MetaLog's replicas in this process.
	Meta MetaStore
	// MetaLog configures the default metadata log: replica count (3), WAL directory (a
	// temporary one, removed at Shutdown), fsync (on). Ignored when Meta is set.
	MetaLog meta.ClusterConfig
	// Objects configures every machine's object store and the transfer plane.
	Objects ObjectsConfig
	// CallTimeout bounds actor calls whose context has no deadline. Default 30 s.
	CallTimeout time.Duration
}

// DefaultConfig is the embedded default: four simulated 8-GPU machines, each one NVLink
// island of 8.
func DefaultConfig() Config { return Config{} }

// Local is a whole cluster in one process: a head, one agent per machine, and an actor
// system hosting the workers of every machine.
type Local struct {
	Actors *actors.System
	Head   *Head
	Agents []*Agent
	log    *zap.Logger
	meta   MetaStore
	obj    *objects
	ownLog *LogMeta // the metadata log this Local started, closed at Shutdown
}

// StartLocal starts an embedded cluster.
func StartLocal(ctx context.Context, cfg Config) (*Local, error) {
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.Cluster == nil {
		c, err := DefaultCluster()
		if err != nil {
			return nil, fmt.Errorf("runtime: the embedded default cluster %q: %w", DefaultClusterSpec, err)
		}
		cfg.Cluster = c
	}
	if cfg.Placer == nil && cfg.Cluster.Topology == nil {
		cfg.Placer = FirstFit{} // a cluster declared without a topology has no bandwidth model
	}
	if cfg.Placer == nil {
		gp, err := NewGangPlacer(cfg.Cluster, gang.DefaultConfig(), cfg.Logger)
		if err != nil {
			return nil, err
		}
		cfg.Placer = gp
	}
	var ownLog *LogMeta
	if cfg.Meta == nil {
		mc := meta.DefaultClusterConfig()
		set := cfg.MetaLog
		mc.Dir, mc.NoSync, mc.TCP, mc.Token, mc.Logger = set.Dir, set.NoSync, set.TCP, set.Token, set.Logger
		if set.Replicas != 0 {
			mc.Replicas = set.Replicas
		}
		if set.TickInterval != 0 {
			mc.TickInterval = set.TickInterval
		}
		if len(mc.Token) == 0 {
			mc.Token = meta.DefaultClusterConfig().Token
		}
		if mc.Logger == nil {
			mc.Logger = cfg.Logger.Named("metalog")
		}
		lm, err := StartLogMeta(ctx, mc)
		if err != nil {
			return nil, err
		}
		cfg.Meta, ownLog = lm, lm
	}
	l := &Local{log: cfg.Logger, meta: cfg.Meta, ownLog: ownLog}
	head, err := NewHead(cfg.Cluster, cfg.Placer, cfg.Meta, cfg.Logger)
	if err != nil {
		l.closeLog()
		return nil, err
	}
	l.Head = head
	for _, m := range cfg.Cluster.Machines {
		rec, _ := json.Marshal(m)
		if err := cfg.Meta.Put(ctx, TableMachines, m.Name, rec); err != nil {
			l.closeLog()
			return nil, fmt.Errorf("runtime: register machine %s: %w", m.Name, err)
		}
	}
	if l.obj, err = startObjects(cfg.Objects, cfg.Cluster.Machines, cfg.Meta, cfg.Logger); err != nil {
		l.closeLog()
		return nil, err
	}
	l.Agents = l.obj.agents
	l.Actors, err = actors.NewSystem(actors.Config{Logger: cfg.Logger, DefaultCallTimeout: cfg.CallTimeout})
	if err != nil {
		_ = l.obj.close(ctx)
		l.closeLog()
		return nil, err
	}
	return l, nil
}

func (l *Local) closeLog() error {
	if l.ownLog == nil {
		return nil
	}
	return l.ownLog.Close()
}

// Meta is the metadata store the head commits to.
func (l *Local) Meta() MetaStore { return l.meta }

// Shutdown stops every actor, then every machine's object store and transfer server.
func (l *Local) Shutdown(ctx context.Context) error {
	return errors.Join(l.Actors.Shutdown(ctx), l.obj.close(ctx), l.closeLog())
}

// Agent returns the agent of the machine with the given index.
func (l *Local) Agent(machine int) (*Agent, error) {
	if machine < 0 || machine >= len(l.Agents) {
		return nil, fmt.Errorf("%w: machine %d of %d", ErrUnknownMachine, machine, len(l.Agents))
	}
	return l.Agents[machine], nil
}

// PutObject stores data as a new immutable object, owned by owner, in the store of the
// given machine. Its metadata (size, fingerprint, owner, location) is committed through
// the metadata log before the id is returned, so no reader sees an object the cluster may
// forget.
func (l *Local) PutObject(ctx context.Context, machine int, owner string, data []byte) (ObjectID, error) {
	id, err := l.obj.put(ctx, machine, owner, data)
	if err != nil {
		return "", err
	}
	return ObjectID(id.String()), nil
}

// GetObject returns a read-only view of an object's bytes on the given machine: the store's
// shared memory itself when the object is there, else after a checksummed pull over the
// transfer plane from a machine that holds it. release must be called once.
func (l *Local) GetObject(ctx context.Context, machine int, id ObjectID) ([]byte, func(), error) {
	oid, err := parseObjectID(id)
	if err != nil {
		return nil, nil, err
	}
	v, err := l.obj.get(ctx, machine, oid)
	if err != nil {
		return nil, nil, err
	}
	return v.Bytes(), v.Release, nil
}

// FreeObject drops every reference to an object, on every machine; its bytes go once no
// view is held, and its metadata with its last copy.
func (l *Local) FreeObject(ctx context.Context, id ObjectID) error {
	oid, err := parseObjectID(id)
	if err != nil {
		return err
	}
	return l.obj.free(ctx, oid)
}

// Checkpoint is a complete checkpoint of a gang: one object per rank, committed as a whole.
type Checkpoint struct {
	Job     string     `json:"job"`
	Gang    string     `json:"gang"`
	Step    int64      `json:"step"`
	Objects []ObjectID `json:"objects"`
	Time    time.Time  `json:"time"`
}

func checkpointKey(job, gang string, step int64) string {
	return fmt.Sprintf("%s/%s/%020d", job, gang, step)
}

// CommitCheckpoint records a complete checkpoint; from then on restarts restore from it.
func (l *Local) CommitCheckpoint(ctx context.Context, cp Checkpoint) error {
	rec, err := json.Marshal(cp)
	if err != nil {
		return err
	}
	return l.meta.Put(ctx, TableCheckpoints, checkpointKey(cp.Job, cp.Gang, cp.Step), rec)
}

// LatestCheckpoint returns the newest complete checkpoint of a gang.
func (l *Local) LatestCheckpoint(ctx context.Context, job, gang string) (Checkpoint, bool, error) {
	kvs, err := l.meta.List(ctx, TableCheckpoints, job+"/"+gang+"/")
	if err != nil || len(kvs) == 0 {
		return Checkpoint{}, false, err
	}
	var cp Checkpoint
	if err := json.Unmarshal(kvs[len(kvs)-1].Value, &cp); err != nil {
		return Checkpoint{}, false, fmt.Errorf("runtime: checkpoint %s: %w", kvs[len(kvs)-1].Key, err)
	}
	return cp, true, nil
}

// PruneCheckpoints keeps the newest keep checkpoints of a gang and frees the others' objects.
func (l *Local) PruneCheckpoints(ctx context.Context, job, gang string, keep int) error {
	kvs, err := l.meta.List(ctx, TableCheckpoints, job+"/"+gang+"/")
	if err != nil {
		return err
	}
	for i := 0; i < len(kvs)-keep; i++ {
		var cp Checkpoint
		if err := json.Unmarshal(kvs[i].Value, &cp); err != nil {
			return err
		}
		if err := l.meta.Delete(ctx, TableCheckpoints, kvs[i].Key); err != nil {
			return err
		}
		for _, id := range cp.Objects {
			if err := l.FreeObject(ctx, id); err != nil && !errors.Is(err, ErrUnknownObject) {
				return err
			}
		}
	}
	return nil
}

// DefaultClusterSpec is the topology spec of the embedded default: four simulated DGX H100
// machines (8 GPUs joined by NVSwitch: one NVLink island of eight each) in one rack.
const DefaultClusterSpec = "4xdgx-h100"

// DefaultCluster is the embedded default, built from DefaultClusterSpec.
func DefaultCluster() (*Cluster, error) { return LoadCluster(DefaultClusterSpec) }

// SimulatedCluster declares n machines of gpus GPUs each, every machine one NVLink island.
func SimulatedCluster(n, gpus int, typ, model string) *Cluster {
	c := &Cluster{}
	global := 0
	for m := 0; m < n; m++ {
		mach := Machine{Name: fmt.Sprintf("node-%d", m), Type: typ, Simulated: true}
		var island []int
		for i := 0; i < gpus; i++ {
			mach.GPUs = append(mach.GPUs, GPU{Global: global, Machine: m, Index: i, Island: m, Model: model,
				MemoryMiB: 81920, UUID: fmt.Sprintf("GPU-sim-%d-%d", m, i)})
			island = append(island, global)
			global++
		}
		c.Machines = append(c.Machines, mach)
		c.Islands = append(c.Islands, island)
	}
	return c
}
