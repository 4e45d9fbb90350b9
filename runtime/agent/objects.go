package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/runtime/objects"
	"github.com/atoll-run/atoll/store/meta"
	"github.com/atoll-run/atoll/store/object"
)

// The agent's part in keeping the object directory true: what its store adopted at a
// restart is registered at its new address (and its previous address dropped), what an
// owner that ended put here is refused and its copies elsewhere let go, and one agent (the
// alive machine whose name sorts first) reconciles the whole objects table periodically.

// locationFile remembers the store's transfer address across restarts of the agent.
const locationFile = "store.location"

// readoptStore registers again, at the store's address, every object the store adopted
// when it opened (the registration at Open may have raced the previous incarnation's
// reconciliation), and drops the previous incarnation's address from their records.
func (a *Agent) readoptStore(ctx context.Context) {
	path := filepath.Join(a.cfg.Dir, locationFile)
	prev, _ := os.ReadFile(path)
	old := strings.TrimSpace(string(prev))
	adopted := a.node.Store.Adopted()
	for _, m := range adopted {
		if err := a.dir.Register(ctx, m); err != nil {
			a.log.Warn("registering an adopted object", zap.Stringer("id", m.ID), zap.Error(err))
			if errors.Is(err, object.ErrOwnerDied) {
				_ = a.local.Drop(ctx, m.ID, object.ErrOwnerDied)
			}
			continue
		}
		if old != "" && old != a.node.Addr {
			if err := a.dir.RemoveLocation(ctx, m.ID, old); err != nil && !errors.Is(err, object.ErrNotFound) {
				a.log.Debug("dropping the previous address of an adopted object", zap.Stringer("id", m.ID), zap.Error(err))
			}
		}
	}
	if lost := a.node.Store.Lost(); len(adopted) > 0 || len(lost) > 0 {
		a.log.Info("object store re-adopted", zap.Int("objects", len(adopted)), zap.Int("lost", len(lost)),
			zap.String("previous_address", old), zap.String("address", a.node.Addr))
	}
	if err := os.WriteFile(path, []byte(a.node.Addr+"\n"), 0o600); err != nil {
		a.log.Warn("remembering the store's address", zap.Error(err))
	}
}

// endOwner is what happens to the objects of an owner (a worker incarnation) that ended:
// their records become owner-died tombstones (a reader gets the owner-died error), this
// store's copies are dropped, and the other stores that hold a copy are asked to drop it.
// Copies this store pulled for the ended holder of someone else's objects are not the
// holder's to end: its references to them were released with it.
func (a *Agent) endOwner(ctx context.Context, owner string) {
	now := time.Now()
	remote := map[string][]object.ID{}
	n := 0
	for _, id := range a.node.Store.Owned(owner) {
		rec, ok, err := a.dir.Record(ctx, id)
		if err != nil {
			a.log.Warn("reading the record of an ended owner's object", zap.String("owner", owner), zap.Stringer("id", id), zap.Error(err))
			continue
		}
		if !ok || rec.Owner != owner || rec.State != "" {
			continue
		}
		locs, err := a.dir.End(ctx, id, objects.StateOwnerDied, now)
		if err != nil {
			a.log.Warn("marking an object of an ended owner", zap.String("owner", owner), zap.Stringer("id", id), zap.Error(err))
		}
		_ = a.local.Drop(ctx, id, object.ErrOwnerDied)
		n++
		for _, l := range locs {
			if l != a.node.Addr {
				remote[l] = append(remote[l], id)
			}
		}
	}
	a.dropElsewhere(ctx, remote, object.ErrOwnerDied)
	if n > 0 {
		a.log.Info("the objects of an ended owner are refused from now on", zap.String("owner", owner), zap.Int("objects", n))
	}
}

// dropElsewhere asks the stores at the given locations (alive machines' agents, or the
// shared checkpoint directory through an agent that mounts it) to let their copies of the
// ids go: refused from now on with cause (object.ErrOwnerDied), or freed (nil). A store
// that is no agent's (a driver's) or does not answer is left to reconciliation.
func (a *Agent) dropElsewhere(ctx context.Context, byLocation map[string][]object.ID, cause error) {
	if len(byLocation) == 0 {
		return
	}
	ms, err := a.machines(ctx)
	if err != nil {
		a.log.Warn("finding the stores that hold copies to drop", zap.Error(err))
		return
	}
	ref := func(id object.ID) api.ObjectRef {
		r := api.ObjectRef{ID: id.String()}
		if cause != nil {
			r.Cause = api.CauseOwnerDied
		}
		return r
	}
	for loc, ids := range byLocation {
		if loc == a.node.Addr {
			for _, id := range ids {
				_ = a.local.Drop(ctx, id, cause)
			}
			continue
		}
		dir, shared := strings.CutPrefix(loc, objects.SharedPrefix)
		for _, m := range ms {
			switch {
			case !m.Alive:
				continue
			case shared && m.Agent.CheckpointDir == dir:
				for _, id := range ids {
					if err := a.agentPost(ctx, m.Agent.API, "/v1/objects/unexport", ref(id)); err != nil {
						a.log.Debug("removing a copy from the shared checkpoint directory", zap.String("machine", m.Name), zap.Error(err))
					}
				}
				shared = false // once
			case !shared && m.Agent.Transfer == loc:
				for _, id := range ids {
					if err := a.agentPost(ctx, m.Agent.API, "/v1/objects/drop", ref(id)); err != nil {
						a.log.Debug("asking another store to drop a copy", zap.String("machine", m.Name), zap.Error(err))
					}
				}
			}
		}
	}
}

func (a *Agent) machines(ctx context.Context) ([]api.Machine, error) {
	l, err := a.client.List(ctx, api.TableMachines)
	if err != nil {
		return nil, err
	}
	out := make([]api.Machine, 0, len(l.KVs))
	for _, kv := range l.KVs {
		var m api.Machine
		if json.Unmarshal(kv.Value, &m) == nil {
			out = append(out, m)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// firstAliveProbe is how many machine records firstAlive reads.
const firstAliveProbe = 32

// firstAlive is the first alive machine in name order when it is among the machines
// table's first firstAliveProbe records ("" when none of those is alive).
func (a *Agent) firstAlive(ctx context.Context) (string, error) {
	l, err := a.client.ListFirst(ctx, api.TableMachines, firstAliveProbe)
	if err != nil {
		return "", err
	}
	for _, kv := range l.KVs {
		var m api.Machine
		if json.Unmarshal(kv.Value, &m) == nil && m.Alive {
			return m.Name, nil
		}
	}
	return "", nil
}

// agentPost posts a JSON body to another agent's API.
func (a *Agent) agentPost(ctx context.Context, base, path string, body any) error {
	b, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+path, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+string(a.cfg.Token))
	resp, err := a.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode/100 != 2 && resp.StatusCode != http.StatusNotFound {
		return fmt.Errorf("agent %s%s: %d: %s", base, path, resp.StatusCode, strings.TrimSpace(string(msg)))
	}
	return nil
}

// Pacing of reconciliation: a pass reads and decodes every object record (and the gangs
// and jobs tables), so its cost grows with the table; after a pass that took d the next
// waits reconcileDuty×d when that is longer than ReconcileInterval, up to
// maxReconcilePause. The reconciler then keeps to about 1/reconcileDuty of a core (and of
// the heads' time serving it) however many objects there are: on the embedded default
// with 230,000 objects put, passes every 10 s took a quarter of the machine's CPU.
const (
	reconcileDuty     = 20
	maxReconcilePause = 2 * time.Minute
)

// reconcilePause is the wait before the next pass after one that took took.
func reconcilePause(interval, took time.Duration) time.Duration {
	return max(interval, min(reconcileDuty*took, maxReconcilePause))
}

// reconcileLoop reconciles the objects table every ReconcileInterval (longer for a large
// table: see reconcilePause) while this machine is the alive machine whose name sorts
// first (one agent does it; if it dies, the next one takes over once the heads declare it
// dead).
func (a *Agent) reconcileLoop() {
	defer a.wg.Done()
	t := time.NewTimer(a.cfg.ReconcileInterval)
	defer t.Stop()
	owners := ownerTracker{seen: map[string]ownerSeen{}}
	for {
		select {
		case <-a.ctx.Done():
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(a.ctx, a.cfg.ReconcileInterval+30*time.Second)
		start := time.Now()
		rep, err := a.reconcileOnce(ctx, &owners)
		took := time.Since(start)
		cancel()
		t.Reset(reconcilePause(a.cfg.ReconcileInterval, took))
		switch {
		case err != nil:
			a.log.Warn("reconciling the object directory", zap.Error(err))
		case rep != nil && (rep.DroppedLocations+rep.MarkedLost+rep.MarkedOwnerDied+rep.Collected > 0):
			a.log.Info("object directory reconciled", zap.Int("records", rep.Records), zap.Int("dropped_locations", rep.DroppedLocations),
				zap.Int("marked_lost", rep.MarkedLost), zap.Int("marked_owner_died", rep.MarkedOwnerDied), zap.Int("collected", rep.Collected),
				zap.Int("lost", rep.Lost), zap.Int("owner_died", rep.OwnerDied))
		}
	}
}

// reconcileOnce runs one pass if this machine is the reconciler (nil report otherwise).
func (a *Agent) reconcileOnce(ctx context.Context, owners *ownerTracker) (*objects.Report, error) {
	if f := owners.first; f != "" && f != a.cfg.Name {
		// Another machine reconciled last time: while it is alive this one is not the
		// first alive machine, whatever joined since. One record read instead of the
		// whole machines table: every agent listing it every 10 s cost the heads O(N²)
		// (atoll bench scale).
		var m api.Machine
		found, err := a.client.Get(ctx, api.TableMachines+f, &m)
		if err != nil {
			return nil, err
		}
		if found && m.Alive {
			return nil, nil
		}
	}
	// The reconciler is the first alive machine in name order, nearly always among the
	// table's first few: a page of them tells a machine that is not the reconciler so
	// without every agent reading the whole table (O(N²) on the heads after a start, or
	// after the reconciler dies).
	if first, err := a.firstAlive(ctx); err != nil {
		return nil, err
	} else if first != "" && first != a.cfg.Name {
		owners.first = first
		owners.seen, owners.unref = map[string]ownerSeen{}, nil
		return nil, nil
	}
	ms, err := a.machines(ctx)
	if err != nil {
		return nil, err
	}
	live := map[string]bool{}
	first := ""
	for _, m := range ms {
		if m.Alive {
			live[m.Agent.Transfer] = true
			if d := m.Agent.CheckpointDir; d != "" {
				live[objects.SharedLocation(d)] = true // a machine that mounts it reads it
			}
			if first == "" {
				first = m.Name
			}
		}
	}
	owners.first = first
	if first != a.cfg.Name {
		owners.seen, owners.unref = map[string]ownerSeen{}, nil // another agent reconciles: start afresh if this one takes over
		return nil, nil
	}
	now := time.Now()
	ownerKVs, err := a.client.Meta().Range(ctx, api.TableOwners)
	if err != nil {
		return nil, err
	}
	liveOwners := owners.observe(ownerKVs, now)
	for _, o := range liveOwners {
		if o.Store != "" {
			live[o.Store] = true
		}
	}
	ended, err := a.ownerEnded(ctx, liveOwners)
	if err != nil {
		return nil, err
	}
	unref, err := owners.unreferenced(ctx, a.client.Meta(), now, a.cfg.DeadObjectKeep)
	if err != nil {
		return nil, err
	}
	rep, acts, err := objects.Reconcile(ctx, a.client.Meta(), objects.World{Live: live, OwnerEnded: ended, Unreferenced: unref,
		Now: now, Keep: a.cfg.DeadObjectKeep})
	if err != nil {
		return nil, err
	}
	drop, free := map[string][]object.ID{}, map[string][]object.ID{}
	for _, act := range acts {
		if len(act.Drop) == 0 {
			continue
		}
		id, err := objects.IDOfKey(act.Key)
		if err != nil {
			continue
		}
		for _, l := range act.Drop {
			if act.Free {
				free[l] = append(free[l], id)
			} else {
				drop[l] = append(drop[l], id)
			}
		}
	}
	a.dropElsewhere(ctx, drop, object.ErrOwnerDied)
	a.dropElsewhere(ctx, free, nil)
	a.mu.Lock()
	a.lastReconcile = &rep
	a.mu.Unlock()
	return &rep, nil
}

// unreferenced reads the committed checkpoints and returns which checkpoint parts are
// orphans: referenced by none of them since at least grace ago, by this reconciler's
// clock (a part is put before its checkpoint commits, so a young one is not).
func (t *ownerTracker) unreferenced(ctx context.Context, kv objects.Table, now time.Time, grace time.Duration) (func(string) bool, error) {
	kvs, err := kv.Range(ctx, api.TableCheckpoints)
	if err != nil {
		return nil, err
	}
	ref := map[string]bool{}
	for _, c := range kvs {
		var cp api.Checkpoint
		if json.Unmarshal(c.Value, &cp) == nil {
			for _, id := range cp.Objects {
				ref[api.TableObjects+id] = true
			}
		}
	}
	if t.unref == nil {
		t.unref = map[string]time.Time{}
	}
	seen := t.unref
	t.unref = map[string]time.Time{} // only what this pass asks about is kept
	return func(key string) bool {
		if ref[key] {
			return false
		}
		first, ok := seen[key]
		if !ok {
			first = now
		}
		t.unref[key] = first
		return now.Sub(first) >= grace
	}, nil
}

// ownerSeen is an owner record as the reconciler last saw it change, by its own clock.
type ownerSeen struct {
	rev  int64
	when time.Time
}

// ownerTracker tells the live driver owners: those whose record the reconciler saw change
// (renewed) within api.OwnerTTL, by its own clock, so that no two clocks are compared.
type ownerTracker struct {
	seen  map[string]ownerSeen
	unref map[string]time.Time // checkpoint parts referenced by no checkpoint, since
	// first is the first alive machine the last full listing found (the reconciler).
	first string
}

func (t *ownerTracker) observe(kvs []meta.KeyValue, now time.Time) map[string]api.Owner {
	live := map[string]api.Owner{}
	next := map[string]ownerSeen{}
	for _, kv := range kvs {
		var o api.Owner
		if json.Unmarshal(kv.Value, &o) != nil {
			continue
		}
		s, ok := t.seen[kv.Key]
		if !ok || s.rev != kv.ModRevision {
			s = ownerSeen{rev: kv.ModRevision, when: now}
		}
		next[kv.Key] = s
		if now.Sub(s.when) < api.OwnerTTL {
			live[o.Name] = o
		}
	}
	t.seen = next
	return live
}

// ownerEnded says which owners are known to have ended: a worker incarnation whose gang
// moved on (a later generation, or it ended), a job that stopped (its tasks' results, a
// submitted program), a driver whose owner record is gone or stale. Others are not known
// to have ended.
func (a *Agent) ownerEnded(ctx context.Context, liveOwners map[string]api.Owner) (func(string) bool, error) {
	gangs := map[string]api.Gang{}
	l, err := a.client.List(ctx, api.TableGangs)
	if err != nil {
		return nil, err
	}
	for _, kv := range l.KVs {
		var g api.Gang
		if json.Unmarshal(kv.Value, &g) == nil {
			gangs[g.Spec.Job+"/"+g.Spec.Name] = g
		}
	}
	jobs := map[string]api.Job{}
	if l, err = a.client.List(ctx, api.TableJobs); err != nil {
		return nil, err
	}
	for _, kv := range l.KVs {
		var j api.Job
		if json.Unmarshal(kv.Value, &j) == nil {
			jobs[j.Name] = j
		}
	}
	jobEnded := func(name string) bool {
		j, ok := jobs[name]
		return !ok || j.State == api.JobStopped
	}
	return func(owner string) bool {
		kind, rest, _ := strings.Cut(owner, "/")
		switch kind {
		case "worker": // worker/<job>/<gang>/<rank>.g<generation>
			i := strings.LastIndexByte(rest, '/')
			if i < 0 {
				return false
			}
			_, genText, ok := strings.Cut(rest[i+1:], ".g")
			gen, err := strconv.Atoi(genText)
			if !ok || err != nil {
				return false
			}
			g, found := gangs[rest[:i]]
			return !found || !g.State.Live() || g.Generation > gen
		case "job", "submit":
			return jobEnded(rest)
		case "driver": // driver/<host>/<pid> (its executable, driver/<host>/<pid>/binary, is shared by content)
			if strings.Count(rest, "/") != 1 {
				return false
			}
			_, alive := liveOwners[owner]
			return !alive
		}
		return false
	}, nil
}

// ObjectsReport is the last reconciliation pass this agent ran (nil if it ran none).
func (a *Agent) ObjectsReport() *objects.Report {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.lastReconcile
}
