package sdk

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"strings"

	"github.com/cespare/xxhash/v2"
	"go.uber.org/zap"

	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/runtime/objects"
	"github.com/atoll-run/atoll/store/object"
)

// Durability: a checkpoint's part or a detached object is persisted (fsync'd) by the store
// that took it while a second machine pulls a copy and persists it too (or the first
// machine writes one to the shared checkpoint directory it mounts); the put or the commit
// is acknowledged once both copies are on disk. The second copy is pulled from shared
// memory while the first is written: on machines with disks of their own it costs a send
// and a write that overlap the first write, not a send after a write.

// makeDurable persists the copy of id at loc (through own when it is that store, else
// through the agent or in-process store at loc) while replicateDurably makes the second
// copy; it returns the second copy's metadata. spread picks the second machine (-1: by
// the id).
func (c *conn) makeDurable(ctx context.Context, own objectHost, id object.ID, loc, holder string, spread int) (api.ObjectInfo, error) {
	var first, second api.ObjectInfo
	var ferr, serr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		first, ferr = c.persistAt(ctx, own, id, loc)
	}()
	if spread >= 0 {
		second, serr = c.replicateDurably(ctx, id, loc, holder, spread)
	} else {
		second, serr = c.replicateDurably(ctx, id, loc, holder)
	}
	<-done
	switch {
	case ferr != nil:
		return api.ObjectInfo{}, fmt.Errorf("%w: object %s: persisting the first copy: %w", ErrNotDurable, id.Short(), ferr)
	case serr != nil:
		return api.ObjectInfo{}, serr
	case first.Size != second.Size || first.Fingerprint != second.Fingerprint:
		return api.ObjectInfo{}, fmt.Errorf("%w: object %s: the copies differ: %d bytes/%x and %d/%x",
			ErrNotDurable, id.Short(), first.Size, first.Fingerprint, second.Size, second.Fingerprint)
	}
	return second, nil
}

// persistAt makes the copy of id in the store at loc durable.
func (c *conn) persistAt(ctx context.Context, own objectHost, id object.ID, loc string) (api.ObjectInfo, error) {
	if own != nil && own.location() == loc {
		return own.persist(ctx, id)
	}
	if l := c.local(loc); l != nil {
		return localStore{l: l}.persist(ctx, id)
	}
	u, err := c.agentURL(ctx, func(m api.Machine) bool { return m.Alive && m.Agent.Transfer == loc })
	if err != nil {
		return api.ObjectInfo{}, fmt.Errorf("the store at %s: %w", loc, err)
	}
	var in api.ObjectInfo
	if err := c.agentDo(ctx, u, "/v1/objects/persist", agentObjectRef{ID: id.String()}, &in); err != nil {
		return api.ObjectInfo{}, err
	}
	return in, nil
}

// replicateDurably makes a second durable copy of id: in the shared checkpoint directory
// when the machine whose store is at from mounts one, else on an alive machine other than
// that one, trying the candidates in turn (starting from one picked by spread, so that the
// parts of a checkpoint spread over the machines). It returns that copy's metadata. With
// neither a shared directory nor a second machine alive it fails with ErrNotDurable.
func (c *conn) replicateDurably(ctx context.Context, id object.ID, from, holder string, spread ...int) (api.ObjectInfo, error) {
	ms, err := c.machines(ctx)
	if err != nil {
		return api.ObjectInfo{}, err
	}
	var others []Machine
	writer := -1
	for _, m := range ms {
		if !m.Alive {
			continue
		}
		if m.Agent.Transfer == from {
			if m.Agent.CheckpointDir != "" && c.local(from) == nil {
				// The writer mounts the shared checkpoint directory: the copy there is
				// the second one.
				var in api.ObjectInfo
				err := c.agentDo(ctx, m.Agent.API, "/v1/objects/export", agentObjectRef{ID: id.String(), Holder: holder}, &in)
				if err != nil {
					return api.ObjectInfo{}, fmt.Errorf("%w: object %s: its copy in the shared checkpoint directory of %s: %w", ErrNotDurable, id.Short(), m.Name, err)
				}
				return in, nil
			}
			writer = len(others)
			continue
		}
		others = append(others, m)
	}
	if len(others) == 0 {
		return api.ObjectInfo{}, fmt.Errorf("%w: object %s: no second alive machine to keep a durable copy on", ErrNotDurable, id.Short())
	}
	start := max(writer, 0) // others[writer] is the alive machine after the writer's, in name order
	if len(spread) > 0 {
		start += spread[0]
	} else {
		start += int(crc32.ChecksumIEEE(id[:]) % uint32(len(others)))
	}
	var errs []error
	for i := range others {
		m := others[(start+i)%len(others)]
		in, err := c.replicateTo(ctx, m, id, holder)
		if err == nil {
			return in, nil
		}
		if errors.Is(err, object.ErrOwnerDied) || errors.Is(err, object.ErrLost) || ctx.Err() != nil {
			return api.ObjectInfo{}, err
		}
		errs = append(errs, fmt.Errorf("%s: %w", m.Name, err))
	}
	return api.ObjectInfo{}, fmt.Errorf("%w: object %s: no machine took a durable copy: %w", ErrNotDurable, id.Short(), errors.Join(errs...))
}

// replicateTo asks machine m's store for a durable copy of id, held by holder.
func (c *conn) replicateTo(ctx context.Context, m Machine, id object.ID, holder string) (api.ObjectInfo, error) {
	if l := c.local(m.Agent.Transfer); l != nil { // a machine of the embedded cluster
		meta, err := l.Replicate(ctx, id, holder, true)
		if err != nil {
			return api.ObjectInfo{}, err
		}
		return api.ObjectInfo{ID: id.String(), Holder: holder, Size: meta.Size, Fingerprint: meta.Fingerprint, Durable: true, Location: m.Agent.Transfer}, nil
	}
	var in api.ObjectInfo
	err := c.agentDo(ctx, m.Agent.API, "/v1/objects/replicate", agentObjectRef{ID: id.String(), Holder: holder, Durable: true}, &in)
	if in.Location == "" {
		in.Location = m.Agent.Transfer
	}
	return in, err
}

// liveStores is the transfer addresses of the alive machines' stores, and the locations
// of the shared checkpoint directories they mount.
func (c *conn) liveStores(ctx context.Context) (map[string]bool, error) {
	ms, err := c.machines(ctx)
	if err != nil {
		return nil, err
	}
	live := map[string]bool{}
	for _, m := range ms {
		if m.Alive {
			live[m.Agent.Transfer] = true
			if d := m.Agent.CheckpointDir; d != "" {
				live[objects.SharedLocation(d)] = true
			}
		}
	}
	return live, nil
}

// checkpointReadable says why a committed checkpoint cannot be read back now ("" when it
// can): a part whose record is gone or dead, or whose every copy is on a store that is not
// alive.
func (c *conn) checkpointReadable(ctx context.Context, cp api.Checkpoint, live map[string]bool) (string, error) {
	if len(cp.Objects) == 0 {
		return "it has no parts", nil
	}
	for r, id := range cp.Objects {
		var rec objects.Record
		found, err := c.client.Get(ctx, api.TableObjects+id, &rec)
		if err != nil {
			return "", err
		}
		switch {
		case !found:
			return fmt.Sprintf("rank %d's part %s has no record", r, shortID(id)), nil
		case rec.State != "":
			return fmt.Sprintf("rank %d's part %s is %s", r, shortID(id), rec.State), nil
		}
		ok := false
		for _, l := range rec.Locations {
			ok = ok || live[l]
		}
		if !ok {
			return fmt.Sprintf("rank %d's part %s has no copy on an alive machine (%s)", r, shortID(id), strings.Join(rec.Locations, ", ")), nil
		}
	}
	return "", nil
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// latestCheckpoint reads a gang's newest committed checkpoint whose every part can be read
// back now: a newer one that lost a part is passed over (and logged), never offered. It
// fails with ErrObjectLost when checkpoints were committed but none is readable (a gang
// must not start afresh silently), and reports false when there is none at all.
func (c *conn) latestCheckpoint(ctx context.Context, job, gang string) (api.Checkpoint, bool, error) {
	kvs, err := c.client.Meta().Range(ctx, api.TableCheckpoints+job+"/"+gang+"/")
	if err != nil || len(kvs) == 0 {
		return api.Checkpoint{}, false, err
	}
	live, err := c.liveStores(ctx)
	if err != nil {
		return api.Checkpoint{}, false, err
	}
	var why []string
	for i := len(kvs) - 1; i >= 0; i-- {
		var cp api.Checkpoint
		if err := json.Unmarshal(kvs[i].Value, &cp); err != nil {
			return api.Checkpoint{}, false, fmt.Errorf("sdk: checkpoint %s: %w", kvs[i].Key, err)
		}
		reason, err := c.checkpointReadable(ctx, cp, live)
		if err != nil {
			return api.Checkpoint{}, false, err
		}
		if reason == "" {
			return cp, true, nil
		}
		c.log.Warn("a checkpoint cannot be read back: passed over", zap.String("gang", job+"/"+gang), zap.Int64("step", cp.Step), zap.String("why", reason))
		why = append(why, fmt.Sprintf("step %d: %s", cp.Step, reason))
	}
	return api.Checkpoint{}, false, fmt.Errorf("%w: gang %s/%s: none of its %d committed checkpoints can be read back (%s)",
		ErrObjectLost, job, gang, len(kvs), strings.Join(why, "; "))
}

// checkPart checks a checkpoint part's bytes against the size and checksum its checkpoint
// recorded (when it recorded them).
func checkPart(cp api.Checkpoint, rank int, b []byte) error {
	if rank >= len(cp.Parts) {
		return nil
	}
	p := cp.Parts[rank]
	if int64(len(b)) != p.Size {
		return fmt.Errorf("%w: checkpoint at step %d, rank %d's part %s: %d bytes, the checkpoint recorded %d",
			ErrObjectLost, cp.Step, rank, shortID(p.ID), len(b), p.Size)
	}
	if got := xxhash.Sum64(b); got != p.Fingerprint {
		return fmt.Errorf("%w: checkpoint at step %d, rank %d's part %s: checksum %x, the checkpoint recorded %x",
			ErrObjectLost, cp.Step, rank, shortID(p.ID), got, p.Fingerprint)
	}
	return nil
}

// sharedFallback reads through a store that may not mount the shared checkpoint directory
// (a driver's): an object whose only copy left is in that directory is first staged into
// the store of an alive machine that mounts it (held by its durable owner, so it goes
// with the object's Free), and pulled from there.
type sharedFallback struct {
	objectHost
	c *conn
}

func (s sharedFallback) get(ctx context.Context, id object.ID) ([]byte, func(), error) {
	b, release, err := s.objectHost.get(ctx, id)
	if err == nil || errors.Is(err, object.ErrOwnerDied) || ctx.Err() != nil {
		return b, release, err
	}
	if serr := s.c.stageShared(ctx, id); serr != nil {
		return nil, nil, err
	}
	return s.objectHost.get(ctx, id)
}

// stageShared asks an alive machine that mounts the shared directory holding a copy of a
// durable object to read it into its store.
func (c *conn) stageShared(ctx context.Context, id object.ID) error {
	var rec objects.Record
	found, err := c.client.Get(ctx, api.TableObjects+id.String(), &rec)
	if err != nil || !found || rec.State != "" || !objects.DurableOwner(rec.Owner) {
		return fmt.Errorf("sdk: %s has no copy in a shared directory", id.Short())
	}
	ms, err := c.machines(ctx)
	if err != nil {
		return err
	}
	for _, loc := range rec.Locations {
		dir, ok := strings.CutPrefix(loc, objects.SharedPrefix)
		if !ok {
			continue
		}
		for _, m := range ms {
			if m.Alive && m.Agent.CheckpointDir == dir {
				if _, err := c.replicateTo(ctx, m, id, rec.Owner); err == nil {
					return nil
				}
			}
		}
	}
	return fmt.Errorf("sdk: no alive machine mounts a shared directory holding %s", id.Short())
}
