package head

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/store/meta"
)

// Services (api.Service): the leader scales each between its bounds from the load its
// replicas report (servicerule.go), commits each decision to the service's record before
// acting on it, and brings the replica gangs to the decision: it spawns replicas
// 0..Replicas-1 that are not live and stops the live ones above. A replica is a gang like
// any other: to be placed it may take GPUs from gangs of a lower priority through the
// scheduler's preemption (a shrink of an elastic gang, or a checkpoint and stop, chosen by
// the cost model, with notices); a stopped replica's GPUs go back to the scheduler, which
// grows the gangs it shrank. The first MinReplicas replicas are not preemptible.
//
// The record is the log's: a new leader reads the decisions and carries them on. The
// load reports are the leader's memory, as machines' loads are: a new leader holds each
// service where it is until its replicas report.

// serviceLoadStale is how old a replica's load report may be and still count.
const serviceLoadStale = 3 * time.Second

// A replica that a scale down retires is drained before it is stopped: callers stop
// choosing it as soon as they see the service's new record (sdk.CallService routes to
// replicas below Replicas), and the leader stops it once it reports no call in flight in a
// report made serviceDrainSettle after the decision (callers have seen the record by then),
// or once serviceDrain has passed, whatever it reports. A replica that does not report
// (never ready, or gone quiet for serviceLoadStale) is stopped at once. So a scale down no
// longer fails the calls in flight on the replicas it stops.
const (
	serviceDrain       = 30 * time.Second
	serviceDrainSettle = time.Second
)

// serviceBook is the leader's memory of the services: the replicas' load reports and the
// rule's low-load marks, by service key ("job/name"). Its lock is taken after the
// controller's, never before.
type serviceBook struct {
	// ops serialises the services' decisions and their carrying out (the sweep, a spawn,
	// a stop): taken before the controller's lock.
	ops   sync.Mutex
	mu    sync.Mutex
	loads map[string]map[int]serviceLoadEntry
	low   map[string]time.Time
	// settled are the stopped services (key -> UID) whose replicas this leader saw all
	// stopped: the sweep passes them by.
	settled map[string]string
}

type serviceLoadEntry struct {
	load api.ServiceLoad
	got  time.Time
}

// ReportServiceLoad keeps a replica's load report (on the leader).
func (c *Controller) ReportServiceLoad(l api.ServiceLoad) error {
	if err := l.Validate(); err != nil {
		return err
	}
	if _, err := c.lockTerm(); err != nil {
		return err
	}
	now := c.cfg.Clock()
	c.mu.Unlock()
	b := &c.svc
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.loads == nil {
		b.loads = map[string]map[int]serviceLoadEntry{}
	}
	key := l.Job + "/" + l.Service
	if b.loads[key] == nil {
		b.loads[key] = map[int]serviceLoadEntry{}
	}
	b.loads[key][l.Replica] = serviceLoadEntry{load: l, got: now}
	return nil
}

// serviceRecord reads a service's record from the log (ver 0: none).
func (c *Controller) serviceRecord(job, name string) (api.Service, int64, error) {
	kv, ok := c.sm.Get(api.ServiceKey(job, name))
	if !ok {
		return api.Service{}, 0, nil
	}
	var s api.Service
	if err := json.Unmarshal(kv.Value, &s); err != nil {
		return api.Service{}, kv.Version, fmt.Errorf("head: service %s/%s: %w", job, name, err)
	}
	return s, kv.Version, nil
}

// commitService commits a service's record over version ver, with an event.
func (c *Controller) commitService(ctx context.Context, s api.Service, ver int64, reason string) error {
	t, err := c.lockTerm()
	if err != nil {
		return err
	}
	key := api.ServiceKey(s.Spec.Job, s.Spec.Name)
	fn := commitFn{what: "service " + s.Spec.Job + "/" + s.Spec.Name, cmp: []meta.Compare{{Key: key, Version: ver}}, ops: []meta.Op{putJSON(key, s)},
		events: []api.Event{{Time: c.cfg.Clock(), Kind: api.EventServiceScaled, Job: s.Spec.Job, Gang: s.Spec.Name, Reason: reason}}}
	ch := c.enqueueLocked(t, []commitFn{fn})
	c.notifyLocked()
	c.mu.Unlock()
	return await(ctx, ch)
}

// SpawnService creates a service: its record with MinReplicas replicas, committed, then
// those replicas' gangs. A job that is not running is api.ErrNotFound; a live service of
// the name api.ErrExists; a bad spec, queue or priority class api.ErrInvalid.
func (c *Controller) SpawnService(ctx context.Context, spec api.ServiceSpec) (api.Service, error) {
	if err := spec.Normalize(); err != nil {
		return api.Service{}, err
	}
	t, err := c.lockTerm()
	if err != nil {
		return api.Service{}, err
	}
	job := t.jobs[spec.Job]
	running := job != nil && job.rec.State == api.JobRunning
	r0 := spec.Replica(0)
	_, perr := t.conf.Priority(r0)
	c.mu.Unlock()
	switch {
	case !running:
		return api.Service{}, fmt.Errorf("%w: job %q is not running", api.ErrNotFound, spec.Job)
	case perr != nil:
		return api.Service{}, fmt.Errorf("%w: service %q: %v", api.ErrInvalid, spec.Name, perr)
	}
	c.svc.ops.Lock()
	defer c.svc.ops.Unlock()
	old, ver, err := c.serviceRecord(spec.Job, spec.Name)
	if err != nil {
		return api.Service{}, err
	}
	if ver > 0 && old.State == api.ServiceRunning {
		return api.Service{}, fmt.Errorf("%w: service %s/%s is running", api.ErrExists, spec.Job, spec.Name)
	}
	now := c.cfg.Clock()
	s := api.Service{Spec: spec, UID: newUID(), State: api.ServiceRunning, Replicas: spec.MinReplicas, Created: now,
		Reason: fmt.Sprintf("started at its minimum of %d replicas", spec.MinReplicas)}
	if err := c.commitService(ctx, s, ver, s.Reason); err != nil {
		return api.Service{}, err
	}
	c.svc.mu.Lock()
	delete(c.svc.loads, spec.Job+"/"+spec.Name)
	delete(c.svc.low, spec.Job+"/"+spec.Name)
	c.svc.mu.Unlock()
	if err := c.reconcileService(ctx, s); err != nil {
		return s, err
	}
	return s, nil
}

// StopService stops a service: its record says stopped (committed first), then its
// replicas stop.
func (c *Controller) StopService(ctx context.Context, job, name string) error {
	if _, err := c.lockTerm(); err != nil {
		return err
	}
	c.mu.Unlock()
	c.svc.ops.Lock()
	defer c.svc.ops.Unlock()
	s, ver, err := c.serviceRecord(job, name)
	if err != nil {
		return err
	}
	if ver == 0 {
		return fmt.Errorf("%w: service %s/%s", api.ErrNotFound, job, name)
	}
	if s.State == api.ServiceRunning {
		s.State, s.Reason = api.ServiceStopped, "stopped by its driver"
		if err := c.commitService(ctx, s, ver, s.Reason); err != nil {
			return err
		}
	}
	return c.reconcileService(ctx, s)
}

// replicaView is what the leader knows of a service's replica gangs, by index.
type replicaView struct {
	state map[int]api.GangState
	ready map[int]bool
	gpus  int
}

// replicas reads the state of a service's replica gangs.
func (c *Controller) replicas(s api.Service) (replicaView, error) {
	t, err := c.lockTerm()
	if err != nil {
		return replicaView{}, err
	}
	defer c.mu.Unlock()
	return t.replicaViewLocked(s), nil
}

func (l *ledger) replicaViewLocked(s api.Service) replicaView {
	v := replicaView{state: map[int]api.GangState{}, ready: map[int]bool{}}
	for i := 0; i < s.Spec.MaxReplicas; i++ {
		e := l.gangs[s.Spec.Job+"/"+api.ReplicaName(s.Spec.Name, i)]
		if e == nil || e.rec.Spec.Service != s.Spec.Name {
			continue
		}
		v.state[i] = e.rec.State
		if e.rec.ReadyWorkers(func(m int) bool { _, ok := e.ready[m]; return ok }) > 0 {
			v.ready[i] = true
		}
		if e.rec.State.Live() && e.rec.Placement != nil {
			v.gpus += e.rec.HeldGPUs()
		}
	}
	return v
}

// reconcileService brings a service's replica gangs to its record: replicas below
// Replicas live (a stopped or never spawned one is spawned; a failed one stays failed),
// the others stopped. Every replica stops when the service is stopped.
func (c *Controller) reconcileService(ctx context.Context, s api.Service) error {
	v, err := c.replicas(s)
	if err != nil {
		return err
	}
	want := s.Replicas
	if s.State != api.ServiceRunning {
		want = 0
	}
	var errs []error
	for i := 0; i < s.Spec.MaxReplicas; i++ {
		st, ok := v.state[i]
		switch {
		case i < want && (!ok || st == api.GangStopped):
			if _, err := c.SpawnGang(ctx, s.Spec.Replica(i)); err != nil && !errors.Is(err, api.ErrExists) {
				errs = append(errs, fmt.Errorf("replica %d: %w", i, err))
			}
		case i >= want && ok && st.Live():
			if s.State == api.ServiceRunning && c.draining(s, i) {
				continue // its calls in flight first; a later sweep stops it
			}
			if err := c.StopGang(ctx, s.Spec.Job, api.ReplicaName(s.Spec.Name, i)); err != nil && !errors.Is(err, api.ErrNotFound) {
				errs = append(errs, fmt.Errorf("replica %d: %w", i, err))
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("head: service %s/%s: %w", s.Spec.Job, s.Spec.Name, err)
	}
	return nil
}

// draining reports whether replica i, which a scale down of the running service s
// retires, still has calls in flight to finish (see serviceDrain).
func (c *Controller) draining(s api.Service, i int) bool {
	now := c.cfg.Clock()
	if now.Sub(s.Scaled) >= serviceDrain {
		return false
	}
	c.svc.mu.Lock()
	e, ok := c.svc.loads[s.Spec.Job+"/"+s.Spec.Name][i]
	c.svc.mu.Unlock()
	if !ok || now.Sub(e.got) > serviceLoadStale {
		return false // not reporting: nothing to wait for
	}
	return e.load.InFlight > 0 || !e.got.After(s.Scaled.Add(serviceDrainSettle))
}

// serviceLoop sweeps the services every Poll while this head leads, until Stop.
func (c *Controller) serviceLoop() {
	tick := time.NewTicker(c.cfg.Poll)
	defer tick.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-tick.C:
		}
		if !c.Leading() {
			// What a leader heard is not a follower's: a later term starts afresh.
			c.svc.mu.Lock()
			c.svc.loads, c.svc.low, c.svc.settled = nil, nil, nil
			c.svc.mu.Unlock()
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		c.sweepServices(ctx)
		cancel()
	}
}

// sweepServices decides each service's replicas and carries the decisions out.
func (c *Controller) sweepServices(ctx context.Context) {
	c.svc.ops.Lock()
	defer c.svc.ops.Unlock()
	for _, kv := range c.sm.Range(api.TableServices) {
		var s api.Service
		if json.Unmarshal(kv.Value, &s) != nil {
			continue
		}
		if err := c.sweepService(ctx, s, kv.Version); err != nil && !errors.Is(err, api.ErrUnavailable) {
			c.log.Info("service sweep", zap.String("service", s.Spec.Job+"/"+s.Spec.Name), zap.Error(err))
		}
	}
}

func (c *Controller) sweepService(ctx context.Context, s api.Service, ver int64) error {
	key := s.Spec.Job + "/" + s.Spec.Name
	if s.State == api.ServiceRunning {
		t, err := c.lockTerm()
		if err != nil {
			return err
		}
		job := t.jobs[s.Spec.Job]
		v := t.replicaViewLocked(s)
		c.mu.Unlock()
		if job == nil || job.rec.State != api.JobRunning {
			s.State, s.Reason = api.ServiceStopped, "its job stopped"
			if err := c.commitService(ctx, s, ver, s.Reason); err != nil {
				return err
			}
			return c.reconcileService(ctx, s)
		}
		now := c.cfg.Clock()
		in := scaleInput{Spec: s.Spec, Replicas: s.Replicas, Scaled: s.Scaled}
		c.svc.mu.Lock()
		in.LowSince = c.svc.low[key]
		for i, e := range c.svc.loads[key] {
			if i >= s.Replicas || now.Sub(e.got) > serviceLoadStale || !v.state[i].Live() {
				continue
			}
			in.Reporting++
			in.InFlight += e.load.InFlight
			in.Latency = max(in.Latency, time.Duration(e.load.Latency))
		}
		c.svc.mu.Unlock()
		d := decideScale(in, now)
		c.svc.mu.Lock()
		if c.svc.low == nil {
			c.svc.low = map[string]time.Time{}
		}
		if d.LowSince.IsZero() {
			delete(c.svc.low, key)
		} else {
			c.svc.low[key] = d.LowSince
		}
		c.svc.mu.Unlock()
		if d.Replicas != s.Replicas {
			reason := fmt.Sprintf("%d -> %d replicas: %s", s.Replicas, d.Replicas, d.Reason)
			if d.Replicas > s.Replicas {
				s.ScaleUps++
			} else {
				s.ScaleDowns++
			}
			s.Replicas, s.Scaled, s.Reason = d.Replicas, now, reason
			if err := c.commitService(ctx, s, ver, reason); err != nil {
				return err
			}
			c.log.Info("service scaled", zap.String("service", key), zap.String("reason", reason))
		}
		return c.reconcileService(ctx, s)
	}
	c.svc.mu.Lock()
	settled := c.svc.settled[key] == s.UID
	c.svc.mu.Unlock()
	if settled {
		return nil
	}
	if err := c.reconcileService(ctx, s); err != nil {
		return err
	}
	c.svc.mu.Lock()
	if c.svc.settled == nil {
		c.svc.settled = map[string]string{}
	}
	c.svc.settled[key] = s.UID
	c.svc.mu.Unlock()
	return nil
}

// serviceStatusLocked is the services' lines of the cluster status (c.mu held).
func (c *Controller) serviceStatusLocked(t *term) []api.ServiceStatus {
	out := []api.ServiceStatus{}
	now := c.cfg.Clock()
	for _, kv := range c.sm.Range(api.TableServices) {
		var s api.Service
		if json.Unmarshal(kv.Value, &s) != nil || s.State != api.ServiceRunning {
			continue
		}
		v := t.replicaViewLocked(s)
		ss := api.ServiceStatus{Job: s.Spec.Job, Name: s.Spec.Name, State: s.State, MinReplicas: s.Spec.MinReplicas, MaxReplicas: s.Spec.MaxReplicas,
			Replicas: s.Replicas, Ready: len(v.ready), LatencySLOMS: float64(time.Duration(s.Spec.LatencySLO)) / 1e6, GPUs: v.gpus, ScaleUps: s.ScaleUps, ScaleDowns: s.ScaleDowns, Reason: s.Reason}
		c.svc.mu.Lock()
		var sum time.Duration
		n := 0
		for i, e := range c.svc.loads[s.Spec.Job+"/"+s.Spec.Name] {
			if i < s.Replicas && now.Sub(e.got) <= serviceLoadStale && v.state[i].Live() {
				ss.InFlight += e.load.InFlight
				if e.load.Latency > 0 {
					sum += time.Duration(e.load.Latency)
					n++
				}
			}
		}
		c.svc.mu.Unlock()
		if n > 0 {
			ss.LatencyMS = float64(sum/time.Duration(n)) / 1e6
		}
		out = append(out, ss)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Job != out[j].Job {
			return out[i].Job < out[j].Job
		}
		return out[i].Name < out[j].Name
	})
	return out
}
