package sdk

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/runtime/objects"
	"github.com/atoll-run/atoll/store/object"
)

// ActorSpec describes an actor the scheduler places on a machine of the cluster, with its
// resources: a gang of one worker, restarted on failure, found by its name.
type ActorSpec struct {
	// Name is unique among the job's gangs and actors (among detached actors, for a
	// detached one): 1-63 characters of [A-Za-z0-9._-] (54 for a detached actor).
	Name string
	// Kind is the registered actor kind; Args its constructor arguments, kept by the
	// runtime and given again on restart.
	Kind string
	Args any
	// Resources is what the actor holds while it lives (zero: CPU only, nothing reserved).
	Resources Resources
	// Machines, when set, pins the actor to one of these machines (by name), as
	// GangSpec.Machines does a gang.
	Machines []string
	// MaxRestarts bounds its restarts within a minute (as a gang's); a restarted actor
	// starts from its newest checkpoint when it is a Checkpointer.
	MaxRestarts int
	// Detached actors outlive the job (and the driver) that spawned them: they live in a
	// job of their own, until StopActor. Any driver finds them by Name with Lookup.
	Detached bool
}

// detachedJobPrefix names the job a detached actor lives in: "detached.<name>".
const detachedJobPrefix = "detached."

func isDetachedJob(job string) bool { return strings.HasPrefix(job, detachedJobPrefix) }

// SpawnActor places an actor on a machine of the cluster (with its resources), waits until
// it has started, and returns a handle on it: calls through the handle go to the actor's
// current incarnation, waiting while it restarts. The actor stops with its job, unless it
// is detached.
func (j *Job) SpawnActor(ctx context.Context, spec ActorSpec) (ActorRef, error) {
	if err := ctx.Err(); err != nil {
		return ActorRef{}, fmt.Errorf("sdk: spawn actor %q: %w", spec.Name, err)
	}
	c := j.c
	in := j
	if spec.Detached {
		if err := api.CheckName("detached actor", detachedJobPrefix+spec.Name); err != nil {
			return ActorRef{}, err
		}
		var parent api.Job
		found, err := c.client.Get(ctx, api.TableJobs+j.name, &parent)
		if err != nil {
			return ActorRef{}, err
		}
		if !found {
			return ActorRef{}, fmt.Errorf("%w: job %q", ErrNotFound, j.name)
		}
		host, _ := os.Hostname()
		rec := api.Job{Name: detachedJobPrefix + spec.Name, Driver: fmt.Sprintf("%s/%d (detached from %s)", host, os.Getpid(), j.name),
			Binary: parent.Binary, Args: parent.Args, Env: parent.Env, Dir: parent.Dir}
		if _, err := c.client.SubmitJob(ctx, rec); err != nil {
			if errors.Is(err, ErrExists) {
				return ActorRef{}, fmt.Errorf("sdk: detached actor %q: %w", spec.Name, err)
			}
			return ActorRef{}, err
		}
		in = &Job{c: c, name: rec.Name}
	}
	g, err := in.SpawnGang(ctx, GangSpec{Name: spec.Name, Kind: spec.Kind, Args: spec.Args, Workers: 1, Resources: spec.Resources,
		Machines: spec.Machines, MaxRestarts: spec.MaxRestarts})
	if err != nil {
		if spec.Detached {
			_ = c.client.StopJob(context.WithoutCancel(ctx), in.name)
		}
		return ActorRef{}, err
	}
	ref := ActorRef{job: in.name, gang: spec.Name, gen: follow, uid: g.uid(), g: g}
	if p := g.Placement(); len(p.Members) == 1 {
		ref.machine = p.Members[0].Machine
	}
	return ref, nil
}

// Lookup finds a placed actor by name: "job/name" for an actor of a job, the name alone
// for a detached actor, from any driver or actor of the cluster. It fails with ErrNotFound
// when there is none, with ErrStopped or ErrGangFailed when it has ended.
func Lookup(ctx context.Context, h Caller, name string) (ActorRef, error) {
	job, gang, ok := strings.Cut(name, "/")
	if !ok {
		job, gang = detachedJobPrefix+name, name
	}
	c := h.conn()
	var rec api.Gang
	found, err := c.client.Get(ctx, api.TableGangs+job+"/"+gang, &rec)
	if err != nil {
		return ActorRef{}, fmt.Errorf("sdk: lookup %q: %w", name, err)
	}
	switch {
	case !found:
		return ActorRef{}, fmt.Errorf("%w: no actor %q", ErrNotFound, name)
	case rec.Spec.Workers != 1:
		return ActorRef{}, fmt.Errorf("%w: %q is a gang of %d workers, not an actor (address its workers with Gang.Worker)", ErrInvalid, name, rec.Spec.Workers)
	case rec.State == api.GangFailed:
		return ActorRef{}, fmt.Errorf("%w: actor %q: %s", ErrGangFailed, name, rec.Reason)
	case !rec.State.Live():
		return ActorRef{}, fmt.Errorf("%w: actor %q: %s", ErrStopped, name, rec.Reason)
	}
	ref := ActorRef{job: job, gang: gang, gen: follow, uid: rec.UID}
	if rec.Placement != nil && len(rec.Placement.Members) == 1 {
		ref.machine = rec.Placement.Members[0].Machine
	}
	return ref, nil
}

// StopActor stops a placed actor (a detached one with its job) and frees its resources.
// A call made through its handles once StopActor has returned fails with ErrActorDead
// (with ErrStopped), unanswered; a handle in another process learns of the stop from the
// cluster's log, within moments.
func StopActor(ctx context.Context, h Caller, ref ActorRef) error {
	if ref.gen != follow {
		return fmt.Errorf("%w: %s is not a placed actor (stop a gang with Gang.Stop)", ErrInvalid, ref)
	}
	c := h.conn()
	err := c.client.StopGang(ctx, ref.job, ref.gang)
	if isDetachedJob(ref.job) {
		err = errors.Join(err, c.client.StopJob(ctx, ref.job))
	}
	c.mu.Lock()
	var mine []*Gang
	for g := range c.gangs {
		if g.key == ref.job+"/"+ref.gang {
			mine = append(mine, g)
		}
	}
	c.mu.Unlock()
	for _, g := range mine {
		if err == nil {
			g.stopped("stopped by StopActor") // calls from now on fail with ErrActorDead
		}
		g.stop()
	}
	return err
}

// detachedStore is where this process puts objects that belong to nobody: its machine's
// store, or, for a driver whose store goes with it, an alive machine's.
func (c *conn) detachedStore(ctx context.Context) (objectHost, error) {
	if !c.ownStore {
		return ownedStore{objectHost: c.objects, holder: detachedOwner}, nil
	}
	ms, err := c.machines(ctx)
	if err != nil {
		return nil, err
	}
	for _, m := range ms {
		if m.Alive {
			return ownedStore{objectHost: &agentStore{url: m.Agent.API, token: c.token, holder: detachedOwner, transfer: m.Agent.Transfer,
				hc: c.agents}, holder: detachedOwner}, nil
		}
	}
	return nil, fmt.Errorf("%w: no machine is alive to keep a detached object", ErrNoCapacity)
}

// endOwnedBy ends every object of an owner that ended (a stopped job's task results, a
// driver that disconnects): its record becomes an owner-died tombstone, so that a later
// Get fails with ErrOwnerDied, and every store that holds a copy lets it go.
func (c *conn) endOwnedBy(ctx context.Context, owner string) error {
	c.flushDirectories(ctx)
	l, err := c.client.List(ctx, api.TableObjects)
	if err != nil {
		return err
	}
	dir := objects.NewDirectory(c.client.Meta())
	now := time.Now()
	var errs []error
	for _, kv := range l.KVs {
		var rec objects.Record
		if json.Unmarshal(kv.Value, &rec) != nil || rec.Owner != owner || rec.State != "" {
			continue
		}
		id, err := object.ParseID(rec.ID)
		if err != nil {
			continue
		}
		fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		locs, err := dir.End(fctx, id, objects.StateOwnerDied, now)
		if err != nil {
			errs = append(errs, err)
		}
		for _, loc := range locs {
			if err := c.dropAt(fctx, c.objects, loc, id, object.ErrOwnerDied); err != nil && !errors.Is(err, ErrUnknownObject) {
				errs = append(errs, err)
			}
		}
		cancel()
	}
	return errors.Join(errs...)
}

// flushDirectories waits for the group commits of the stores in this process (the
// driver's own, the embedded machines'): the records of what was put before are in the
// log after it. A store of another process commits its own within moments; its late
// records of an ended owner are ended by the agents' reconciliation.
func (c *conn) flushDirectories(ctx context.Context) {
	c.mu.Lock()
	locals := make([]*objects.Local, 0, len(c.locals))
	for _, l := range c.locals {
		locals = append(locals, l)
	}
	c.mu.Unlock()
	for _, l := range locals {
		if d, ok := l.Node.Store.Directory().(*objects.Directory); ok {
			_ = d.Flush(ctx)
		}
	}
}

// registerOwner records this driver as a live owner of objects (owners/<owner>, with its
// store's address) and renews the record until the connection ends: reconciliation counts
// a driver whose record is gone or stale as ended, and its objects with it.
func (c *conn) registerOwner(ctx context.Context, store string) error {
	host, _ := os.Hostname()
	o := api.Owner{Name: c.owner, Store: store, Host: host, PID: os.Getpid(), Started: time.Now(), Principal: c.principal}
	put := func(ctx context.Context) error {
		o.Renewed = time.Now()
		b, _ := json.Marshal(o)
		_, err := c.client.Meta().Put(ctx, api.TableOwners+c.owner, b)
		return err
	}
	if err := put(ctx); err != nil {
		return fmt.Errorf("sdk: register this driver as an owner of objects: %w", err)
	}
	go func() {
		t := time.NewTicker(api.OwnerRenewEvery)
		defer t.Stop()
		for {
			select {
			case <-c.life.Done():
				return
			case <-t.C:
			}
			rctx, cancel := context.WithTimeout(c.life, api.OwnerRenewEvery)
			if err := put(rctx); err != nil && c.life.Err() == nil {
				c.log.Warn("renewing this driver's owner record", zap.Error(err))
			}
			cancel()
		}
	}()
	return nil
}

// endOwner ends what this driver owns (its objects are refused from now on) and removes
// its owner record: the driver disconnects.
func (c *conn) endOwner(ctx context.Context) error {
	err := c.endOwnedBy(ctx, c.owner)
	_, derr := c.client.Meta().Delete(ctx, api.TableOwners+c.owner)
	return errors.Join(err, derr)
}
