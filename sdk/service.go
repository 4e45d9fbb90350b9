package sdk

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/store/meta"
)

// ServiceSpec describes a service: a long-running set of replicas of one actor kind that
// serve the program's own requests (CallService routes them), scaled by the cluster's
// leader between MinReplicas and MaxReplicas from the load the replicas report.
type ServiceSpec struct {
	// Name is unique within the job: 1-63 characters of [A-Za-z0-9._-]; replica i is the
	// one-worker gang "<Name>.r<i>" of the job.
	Name string
	// Kind is the registered actor kind of every replica; Args its constructor arguments.
	Kind string
	Args any
	// MinReplicas..MaxReplicas bound the replicas. The service starts at MinReplicas; its
	// first MinReplicas replicas are never preempted.
	MinReplicas, MaxReplicas int
	// GPUsPerReplica is how many whole GPUs each replica gets; Resources asks for more (a
	// share of a card, a MIG profile, CPU, memory) and wins when set.
	GPUsPerReplica int
	Resources      Resources
	// LatencySLO is the latency its requests should keep (0: none): a replica whose mean
	// latency passes it asks for a replica more; the service shrinks only while the
	// latency is at most half of it.
	LatencySLO time.Duration
	// TargetInFlight is the requests in flight per replica the leader scales toward
	// (default 4): it grows to ceil(in flight / target) replicas, and shrinks only when the
	// load would fit in fewer at half the target (the hysteresis that keeps it from
	// oscillating).
	TargetInFlight int
	// ScaleUpCooldown and ScaleDownCooldown are the least time between two decisions
	// upward and downward (defaults 2 s and 10 s); a scale down also needs the load low
	// for ScaleDownCooldown without a break.
	ScaleUpCooldown, ScaleDownCooldown time.Duration
	// Priority, PriorityClass and Queue are its replicas' (GangSpec): a replica above the
	// minimum takes its GPUs from gangs of a lower priority through the scheduler's
	// preemption (an elastic gang is shrunk, another checkpoints and stops, by notice), as
	// any gang of that priority would; when the load falls, the replicas above the
	// minimum stop and the scheduler gives their GPUs back (a shrunk gang grows again).
	Priority      int
	PriorityClass string
	Queue         string
	// MaxRestarts bounds each replica's restarts (GangSpec.MaxRestarts).
	MaxRestarts int
}

// Service is a running service: this process's view of its replicas, kept up to date,
// and the router of its calls (CallService).
type Service struct {
	c    *conn
	job  string
	name string
	stop context.CancelFunc
	done chan struct{}

	mu       sync.Mutex
	rec      api.Service
	replicas map[int]*Gang // by replica index: the newest gang of its name
	inflight map[int]int   // calls this process has in flight, by replica
	next     int           // round-robin start among equally loaded replicas
	changed  chan struct{}
}

// SpawnService creates the service and waits until MinReplicas replicas are ready. The
// leader then scales it from the load its replicas report: the calls CallService routes
// are counted by the replicas' workers, and a replica serving requests of its own reports
// them with Context.ReportLoad.
func (j *Job) SpawnService(ctx context.Context, spec ServiceSpec) (*Service, error) {
	c := j.c
	if _, ok := c.s.kinds[spec.Kind]; !ok {
		return nil, fmt.Errorf("sdk: service %q: %w: %q (give it with sdk.Kind to Start/Local/Connect)", spec.Name, ErrUnknownKind, spec.Kind)
	}
	args, err := encodePayload(c.s.codec, spec.Args)
	if err != nil {
		return nil, fmt.Errorf("sdk: service %q arguments: %w", spec.Name, err)
	}
	res := spec.Resources
	if res == (Resources{}) {
		res.GPUs = spec.GPUsPerReplica
	}
	as := api.ServiceSpec{Job: j.name, Name: spec.Name, Kind: spec.Kind, Args: args, MinReplicas: spec.MinReplicas, MaxReplicas: spec.MaxReplicas,
		Resources: api.Resources(res), LatencySLO: api.Duration(spec.LatencySLO), TargetInFlight: spec.TargetInFlight,
		ScaleUpCooldown: api.Duration(spec.ScaleUpCooldown), ScaleDownCooldown: api.Duration(spec.ScaleDownCooldown),
		Priority: spec.Priority, PriorityClass: spec.PriorityClass, Queue: spec.Queue, MaxRestarts: spec.MaxRestarts}
	if err := as.Normalize(); err != nil {
		return nil, err
	}
	rec, err := c.client.SpawnService(ctx, as)
	if err != nil {
		if ctx.Err() != nil {
			_ = c.client.StopService(context.WithoutCancel(ctx), j.name, spec.Name)
		}
		return nil, fmt.Errorf("sdk: spawn service %q: %w", spec.Name, err)
	}
	wctx, cancel := context.WithCancel(c.life)
	s := &Service{c: c, job: j.name, name: spec.Name, stop: cancel, done: make(chan struct{}), rec: rec,
		replicas: map[int]*Gang{}, inflight: map[int]int{}, changed: make(chan struct{})}
	go s.follow(wctx)
	if err := s.AwaitReady(ctx, spec.MinReplicas); err != nil {
		if ctx.Err() != nil {
			_ = c.client.StopService(context.WithoutCancel(ctx), j.name, spec.Name)
		}
		s.stop()
		return nil, fmt.Errorf("sdk: service %q did not start: %w", spec.Name, err)
	}
	return s, nil
}

// Name is the service's name.
func (s *Service) Name() string { return s.name }

// Replicas is the number of replicas the leader decided (some may still wait for GPUs).
func (s *Service) Replicas() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rec.Replicas
}

// Ready counts the replicas that take calls now.
func (s *Service) Ready() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.readyLocked())
}

// readyLocked lists the ready replicas (below the decided number) with their worker.
func (s *Service) readyLocked() map[int]ActorRef {
	out := map[int]ActorRef{}
	for i, g := range s.replicas {
		if i >= s.rec.Replicas || g.State() != GangRunning {
			continue
		}
		if ref := g.Worker(0); !ref.ref.IsZero() {
			out[i] = ref
		}
	}
	return out
}

// AwaitReady waits until at least n replicas take calls, or ctx ends.
func (s *Service) AwaitReady(ctx context.Context, n int) error {
	for {
		s.mu.Lock()
		ready, ch := len(s.readyLocked()), s.changed
		stopped := s.rec.State == api.ServiceStopped
		s.mu.Unlock()
		switch {
		case ready >= n:
			return nil
		case stopped:
			return fmt.Errorf("%w: service %s/%s", ErrStopped, s.job, s.name)
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("sdk: service %s/%s: %d of %d replicas ready: %w", s.job, s.name, ready, n, ctx.Err())
		}
	}
}

// follow keeps the service's record and its replicas' handles up to date.
func (s *Service) follow(ctx context.Context) {
	defer close(s.done)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		key := api.ServiceKey(s.job, s.name)
		for ctx.Err() == nil {
			_ = s.c.client.Watch(ctx, key, func(_ bool, l api.Listing, evs []meta.Event) error {
				for _, kv := range l.KVs {
					s.setRecord(kv.Key, kv.Value)
				}
				for _, ev := range evs {
					if ev.Type == meta.EventPut {
						s.setRecord(ev.KV.Key, ev.KV.Value)
					}
				}
				return nil
			})
		}
	}()
	go func() {
		defer wg.Done()
		prefix := api.TableGangs + s.job + "/" + s.name + ".r"
		for ctx.Err() == nil {
			_ = s.c.client.Watch(ctx, prefix, func(_ bool, l api.Listing, evs []meta.Event) error {
				for _, kv := range l.KVs {
					s.setReplica(ctx, kv.Value)
				}
				for _, ev := range evs {
					if ev.Type == meta.EventPut {
						s.setReplica(ctx, ev.KV.Value)
					}
				}
				return nil
			})
		}
	}()
	wg.Wait()
	s.mu.Lock()
	for _, g := range s.replicas {
		g.stop()
	}
	s.mu.Unlock()
}

func (s *Service) setRecord(key string, v []byte) {
	if key != api.ServiceKey(s.job, s.name) {
		return
	}
	var rec api.Service
	if json.Unmarshal(v, &rec) != nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if rec.UID != s.rec.UID {
		return // an earlier or later service of the name
	}
	s.rec = rec
	s.notifyLocked()
}

// setReplica follows a replica gang's record: a new gang of the replica's name (spawned
// again after a scale down) replaces the handle on the old one.
func (s *Service) setReplica(ctx context.Context, v []byte) {
	var rec api.Gang
	if json.Unmarshal(v, &rec) != nil || rec.Spec.Service != s.name {
		return
	}
	svc, i, ok := api.ReplicaOf(rec.Spec.Name)
	if !ok || svc != s.name {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if rec.Created.Before(s.rec.Created) {
		return // a replica of an earlier service of the name
	}
	old := s.replicas[i]
	if old != nil && old.uid() == rec.UID {
		return // its own handle follows it
	}
	if old != nil {
		old.stop()
	}
	g := s.c.newGang(s.job, rec.Spec.Name, 1, 0, rec)
	s.replicas[i] = g
	// The relay starts from the channel of the state the waiters are about to read: a
	// change the job's feed hands g before the relay's goroutine runs still wakes them.
	g.mu.Lock()
	ch := g.changed
	g.mu.Unlock()
	go s.relay(ctx, g, ch)
	s.notifyLocked()
}

// relay passes a replica's changes on to the service's waiters, from ch: g's channel
// when the waiters were last told.
func (s *Service) relay(ctx context.Context, g *Gang, ch chan struct{}) {
	for {
		select {
		case <-ch:
			g.mu.Lock()
			ch = g.changed
			g.mu.Unlock()
			s.mu.Lock()
			s.notifyLocked()
			s.mu.Unlock()
		case <-g.done:
			return
		case <-ctx.Done():
			return
		}
	}
}

func (s *Service) notifyLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// pick chooses the ready replica with the fewest of this process's calls in flight
// (round robin among equals) and counts the call; it waits while none is ready.
func (s *Service) pick(ctx context.Context) (int, ActorRef, error) {
	for {
		s.mu.Lock()
		ready, ch := s.readyLocked(), s.changed
		if s.rec.State == api.ServiceStopped {
			s.mu.Unlock()
			return 0, ActorRef{}, fmt.Errorf("%w: %w: service %s/%s", ErrStale, ErrStopped, s.job, s.name)
		}
		best, bestRef := -1, ActorRef{}
		n := s.rec.Replicas
		for k := 0; k < n; k++ {
			i := (s.next + k) % n
			ref, ok := ready[i]
			if ok && (best < 0 || s.inflight[i] < s.inflight[best]) {
				best, bestRef = i, ref
			}
		}
		if best >= 0 {
			s.inflight[best]++
			s.next = best + 1
			s.mu.Unlock()
			return best, bestRef, nil
		}
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return 0, ActorRef{}, fmt.Errorf("sdk: service %s/%s: no replica ready: %w", s.job, s.name, ctx.Err())
		}
	}
}

func (s *Service) done1(i int) {
	s.mu.Lock()
	s.inflight[i]--
	s.mu.Unlock()
}

// CallService sends req to one of the service's ready replicas, the one with the fewest of
// this process's calls in flight, and waits for its reply (as Call). It follows the
// service's scaling: a replica added is called once ready; a replica that a scale down
// retires is not called again once this process has seen the decision, and the leader
// lets it finish its calls in flight before it stops it (for up to 30 s; a call still in
// flight when it stops fails with ErrStale, which the caller may retry). It waits while
// no replica is ready.
func CallService[Resp any](ctx context.Context, s *Service, req any) (Resp, error) {
	var zero Resp
	i, ref, err := s.pick(ctx)
	if err != nil {
		return zero, err
	}
	defer s.done1(i)
	return Call[Resp](ctx, s.c, ref, req)
}

// Stop stops the service and its replicas.
func (s *Service) Stop(ctx context.Context) error {
	err := s.c.client.StopService(ctx, s.job, s.name)
	s.stop()
	<-s.done
	return err
}

// serviceLoad counts a replica worker's calls for its load reports: the calls in flight
// and the latency of those answered since the last report.
type serviceLoad struct {
	inflight atomic.Int64
	mu       sync.Mutex
	served   int
	total    time.Duration
	// manual: the program reports its own load (Context.ReportLoad); the counts stop.
	manual atomic.Bool
}

func (l *serviceLoad) begin() { l.inflight.Add(1) }

func (l *serviceLoad) end(d time.Duration) {
	l.inflight.Add(-1)
	l.mu.Lock()
	l.served++
	l.total += d
	l.mu.Unlock()
}

// take returns the report's numbers (the calls its handler runs: those waiting in the
// mailbox are the reporter's to add) and starts the next period.
func (l *serviceLoad) take() (inflight, served int, mean time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	served = l.served
	if served > 0 {
		mean = l.total / time.Duration(served)
	}
	l.served, l.total = 0, 0
	return int(l.inflight.Load()), served, mean
}

// serviceReportEvery is how often a replica reports its load while it changes, and
// serviceReportIdle while it does not (the leader counts a report for 3 s).
const (
	serviceReportEvery = 200 * time.Millisecond
	serviceReportIdle  = time.Second
)

// reportLoad sends the replica's load until the worker ends.
func (h *hosted) reportLoad() {
	_, replica, ok := api.ReplicaOf(h.spec.Gang)
	if !ok {
		return
	}
	tick := time.NewTicker(serviceReportEvery)
	defer tick.Stop()
	var last time.Time
	lastIn := -1
	for {
		select {
		case <-h.done:
			return
		case <-tick.C:
		}
		if h.svcLoad.manual.Load() {
			return
		}
		in, served, mean := h.svcLoad.take()
		if w := h.waiting.Load(); w != nil {
			in += (*w)() // the calls waiting in the mailbox are in flight too
		}
		now := time.Now()
		if in == lastIn && served == 0 && now.Sub(last) < serviceReportIdle {
			continue
		}
		l := api.ServiceLoad{Job: h.spec.Job, Service: h.spec.Service, Replica: replica, InFlight: in, Served: served, Latency: api.Duration(mean), At: now}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		if err := h.c.client.ReportServiceLoad(ctx, l); err == nil {
			last, lastIn = now, in
		}
		cancel()
	}
}

// ReportLoad reports the load of a service replica that serves requests of its own (not
// calls that CallService routes to it): the requests it holds now and the mean latency of
// those it answered since its last report. From the first call on, the replica's own
// counts of routed calls are no longer sent: the program's reports are its load. Call it
// every few hundred milliseconds; the leader counts a report for 3 seconds. It fails with
// ErrInvalid outside a service replica.
func (c *Context) ReportLoad(ctx context.Context, inFlight int, latency time.Duration) error {
	if c.w == nil || c.w.spec.Service == "" {
		return fmt.Errorf("%w: ReportLoad outside a service replica", ErrInvalid)
	}
	_, replica, ok := api.ReplicaOf(c.w.spec.Gang)
	if !ok {
		return fmt.Errorf("%w: gang %q is no service replica", ErrInvalid, c.w.spec.Gang)
	}
	c.w.svcLoad.manual.Store(true)
	l := api.ServiceLoad{Job: c.w.spec.Job, Service: c.w.spec.Service, Replica: replica, InFlight: inFlight, Latency: api.Duration(latency), At: time.Now()}
	if err := l.Validate(); err != nil {
		return err
	}
	return c.c.client.ReportServiceLoad(ctx, l)
}

// isServiceReplica says a gang name and service belong together (for the worker's counts).
func isServiceReplica(spec api.WorkerSpec) bool {
	svc, _, ok := api.ReplicaOf(spec.Gang)
	return ok && spec.Service != "" && svc == spec.Service && !strings.Contains(spec.Service, "/")
}
