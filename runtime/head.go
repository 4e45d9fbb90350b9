package runtime

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"
)

// Head holds the cluster's state: which GPUs are free, which gang holds which, and the
// metadata log every decision is committed to before it is acted on.
type Head struct {
	cluster *Cluster
	placer  Placer
	meta    MetaStore
	log     *zap.Logger

	mu    sync.Mutex
	free  []bool
	gangs map[string]Placement
}

// NewHead makes a head over a validated cluster.
func NewHead(c *Cluster, p Placer, meta MetaStore, log *zap.Logger) (*Head, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	free := make([]bool, c.NumGPUs())
	for i := range free {
		free[i] = true
	}
	return &Head{cluster: c, placer: p, meta: meta, log: log.Named("head"), free: free, gangs: map[string]Placement{}}, nil
}

// Cluster is the head's cluster (read-only).
func (h *Head) Cluster() *Cluster { return h.cluster }

// Meta is the metadata store.
func (h *Head) Meta() MetaStore { return h.meta }

// FreeGPUs counts the GPUs not held by any gang.
func (h *Head) FreeGPUs() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, f := range h.free {
		if f {
			n++
		}
	}
	return n
}

func gangKey(job, gang string) string { return job + "/" + gang }

// gangRecord is a gang as the metadata log records it.
type gangRecord struct {
	Request GangRequest `json:"request"`
	State   string      `json:"state"`
}

// JobRecord is a job as the metadata log records it.
type JobRecord struct {
	Name      string    `json:"name"`
	Submitted time.Time `json:"submitted"`
	State     string    `json:"state"`
}

// CommitJob records a submitted job (state "running") or its end ("stopped").
func (h *Head) CommitJob(ctx context.Context, rec JobRecord) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if err := h.meta.Put(ctx, TableJobs, rec.Name, b); err != nil {
		return fmt.Errorf("runtime: commit job %s: %w", rec.Name, err)
	}
	return nil
}

// Admit places a gang all-or-nothing, commits the placement to the metadata log, and only
// then marks its GPUs taken. A request that can never fit fails with ErrNeverFits; one that
// does not fit now with ErrNoCapacity.
func (h *Head) Admit(ctx context.Context, req GangRequest) (Placement, error) {
	if err := req.Validate(h.cluster); err != nil {
		return Placement{}, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	key := gangKey(req.Job, req.Gang)
	if _, ok := h.gangs[key]; ok {
		return Placement{}, fmt.Errorf("%w: gang %s is already placed", ErrInvalidRequest, key)
	}
	p, err := h.placer.Place(req, h.cluster, h.free)
	if err != nil {
		return Placement{}, err
	}
	undo := func(err error) (Placement, error) {
		if r, ok := h.placer.(Releaser); ok {
			_ = r.Release(req.Job, req.Gang)
		}
		return Placement{}, err
	}
	if len(p.Members) != req.Members {
		return undo(fmt.Errorf("runtime: placer %s returned %d members for a gang of %d", p.Placer, len(p.Members), req.Members))
	}
	for _, g := range p.GPUs() {
		if g < 0 || g >= len(h.free) || !h.free[g] {
			return undo(fmt.Errorf("runtime: placer %s chose GPU %d, which is not free", p.Placer, g))
		}
	}
	rec, err := json.Marshal(p)
	if err != nil {
		return undo(err)
	}
	greq, _ := json.Marshal(gangRecord{Request: req, State: "placed"})
	if err := h.meta.Put(ctx, TableGangs, key, greq); err != nil {
		return undo(fmt.Errorf("runtime: commit gang %s: %w", key, err))
	}
	if err := h.meta.Put(ctx, TablePlacements, key, rec); err != nil {
		return undo(fmt.Errorf("runtime: commit placement of %s: %w", key, err))
	}
	for _, g := range p.GPUs() {
		h.free[g] = false
	}
	h.gangs[key] = p
	h.log.Info("gang placed", zap.String("gang", key), zap.Ints("islands", p.Islands), zap.Ints("machines", p.Machines))
	return p, nil
}

// Release frees a gang's GPUs.
func (h *Head) Release(ctx context.Context, job, gang string) error {
	key := gangKey(job, gang)
	h.mu.Lock()
	defer h.mu.Unlock()
	p, ok := h.gangs[key]
	if !ok {
		return fmt.Errorf("%w: gang %s is not placed", ErrInvalidRequest, key)
	}
	if err := h.meta.Delete(ctx, TablePlacements, key); err != nil {
		return fmt.Errorf("runtime: release %s: %w", key, err)
	}
	if err := h.meta.Delete(ctx, TableGangs, key); err != nil {
		return fmt.Errorf("runtime: release %s: %w", key, err)
	}
	if r, ok := h.placer.(Releaser); ok {
		if err := r.Release(job, gang); err != nil {
			h.log.Warn("placer release", zap.String("gang", key), zap.Error(err))
		}
	}
	for _, g := range p.GPUs() {
		h.free[g] = true
	}
	delete(h.gangs, key)
	return nil
}
