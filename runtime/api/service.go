package api

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/atoll-run/atoll/store/meta"
)

// Services: long-running gangs of replicas that serve the program's own requests, scaled
// by the leader between their bounds from the load their replicas report. A service's
// record (TableServices) holds its spec and the number of replicas the leader decided;
// each replica is a one-member gang of the service's job named ReplicaName(service, i),
// placed, preempted and restarted like any gang. Requests never pass through the heads:
// the SDK routes them to the replicas, and the leader sees only the reported load.

// TableServices holds the services' records (services/<job>/<name>).
const TableServices = string(meta.TableServices)

// ServiceKey is a service's key in its table.
func ServiceKey(job, name string) string { return TableServices + job + "/" + name }

// ReplicaName is the name of a service's replica gang i: "<service>.r<i>".
func ReplicaName(service string, i int) string { return fmt.Sprintf("%s.r%d", service, i) }

// ReplicaOf parses a replica gang's name: its service and index (ok false for a name that
// is no replica's).
func ReplicaOf(gang string) (service string, i int, ok bool) {
	k := strings.LastIndex(gang, ".r")
	if k <= 0 {
		return "", 0, false
	}
	n, err := strconv.Atoi(gang[k+2:])
	if err != nil || n < 0 || strconv.Itoa(n) != gang[k+2:] {
		return "", 0, false
	}
	return gang[:k], n, true
}

// MaxServiceReplicas bounds a service's MaxReplicas.
const MaxServiceReplicas = 1000

// Defaults of a service's scaling (ServiceSpec).
const (
	DefaultTargetInFlight    = 4
	DefaultScaleUpCooldown   = 2 * time.Second
	DefaultScaleDownCooldown = 10 * time.Second
)

// ServiceSpec is what a driver asks for: between MinReplicas and MaxReplicas replicas of
// one actor kind, each a one-member gang with Resources.
type ServiceSpec struct {
	Job  string `json:"job"`
	Name string `json:"name"`
	// Kind is the registered actor kind of every replica; Args its constructor arguments.
	Kind string   `json:"kind"`
	Args *Payload `json:"args,omitempty"`
	// MinReplicas..MaxReplicas bound the replicas; the service starts at MinReplicas, and
	// its first MinReplicas replicas are never preempted.
	MinReplicas int `json:"min_replicas"`
	MaxReplicas int `json:"max_replicas"`
	// Resources is each replica's (GPUsPerReplica whole cards, in the SDK).
	Resources Resources `json:"resources"`
	// LatencySLO is the latency its requests should keep (0: none): a replica reporting a
	// mean latency above it asks for one replica more.
	LatencySLO Duration `json:"latency_slo,omitempty"`
	// TargetInFlight is the requests in flight per replica the leader scales toward
	// (default DefaultTargetInFlight).
	TargetInFlight int `json:"target_in_flight,omitempty"`
	// ScaleUpCooldown and ScaleDownCooldown are the least time between two scaling
	// decisions upward and downward; a scale down also needs the load low for
	// ScaleDownCooldown without a break (defaults DefaultScaleUpCooldown,
	// DefaultScaleDownCooldown).
	ScaleUpCooldown   Duration `json:"scale_up_cooldown,omitempty"`
	ScaleDownCooldown Duration `json:"scale_down_cooldown,omitempty"`
	// Priority, PriorityClass and Queue are its replicas' (GangSpec): a replica above the
	// minimum takes GPUs from gangs of a lower priority through the scheduler's preemption
	// (shrink, checkpoint and stop), as any gang does.
	Priority      int    `json:"priority,omitempty"`
	PriorityClass string `json:"priority_class,omitempty"`
	Queue         string `json:"queue,omitempty"`
	// MaxRestarts bounds each replica's restarts (GangSpec.MaxRestarts).
	MaxRestarts int `json:"max_restarts,omitempty"`
}

// Normalize fills defaults and validates the spec (errors wrap ErrInvalid and name the
// field).
func (s *ServiceSpec) Normalize() error {
	if err := CheckName("job", s.Job); err != nil {
		return err
	}
	if err := CheckName("service", s.Name); err != nil {
		return err
	}
	if len(ReplicaName(s.Name, max(0, s.MaxReplicas-1))) > MaxNameBytes {
		return fmt.Errorf("%w: service %q: its replicas' names (%s) pass %d characters", ErrInvalid, s.Name, ReplicaName(s.Name, max(0, s.MaxReplicas-1)), MaxNameBytes)
	}
	switch {
	case s.Kind == "" || s.Kind == ProcessKind:
		return fmt.Errorf("%w: service %q: kind %q: want a registered actor kind", ErrInvalid, s.Name, s.Kind)
	case s.MinReplicas < 1:
		return fmt.Errorf("%w: service %q: min replicas %d: want at least 1", ErrInvalid, s.Name, s.MinReplicas)
	case s.MaxReplicas < s.MinReplicas || s.MaxReplicas > MaxServiceReplicas:
		return fmt.Errorf("%w: service %q: max replicas %d: want %d..%d (min replicas to the bound)", ErrInvalid, s.Name, s.MaxReplicas, s.MinReplicas, MaxServiceReplicas)
	case s.TargetInFlight < 0:
		return fmt.Errorf("%w: service %q: target in flight %d is negative", ErrInvalid, s.Name, s.TargetInFlight)
	case s.LatencySLO < 0 || s.ScaleUpCooldown < 0 || s.ScaleDownCooldown < 0:
		return fmt.Errorf("%w: service %q: latency SLO and cooldowns must not be negative", ErrInvalid, s.Name)
	}
	if s.TargetInFlight == 0 {
		s.TargetInFlight = DefaultTargetInFlight
	}
	if s.ScaleUpCooldown == 0 {
		s.ScaleUpCooldown = Duration(DefaultScaleUpCooldown)
	}
	if s.ScaleDownCooldown == 0 {
		s.ScaleDownCooldown = Duration(DefaultScaleDownCooldown)
	}
	g := s.Replica(0)
	if err := g.Normalize(); err != nil {
		return fmt.Errorf("service %q: %w", s.Name, err)
	}
	return nil
}

// Replica is the gang spec of replica i: one member of the service's kind; the first
// MinReplicas are not preemptible.
func (s *ServiceSpec) Replica(i int) GangSpec {
	return GangSpec{Job: s.Job, Name: ReplicaName(s.Name, i), Kind: s.Kind, Args: s.Args, Workers: 1, Resources: s.Resources,
		Priority: s.Priority, PriorityClass: s.PriorityClass, Queue: s.Queue, NotPreemptible: i < s.MinReplicas,
		MaxRestarts: s.MaxRestarts, Service: s.Name}
}

// ServiceState is where a service is in its life.
type ServiceState string

// Service states.
const (
	ServiceRunning ServiceState = "running"
	ServiceStopped ServiceState = "stopped"
)

// Service is a service's record: its spec and the leader's scaling decisions.
type Service struct {
	Spec  ServiceSpec  `json:"spec"`
	UID   string       `json:"uid"`
	State ServiceState `json:"state"`
	// Replicas is the number of replicas the leader decided (MinReplicas..MaxReplicas):
	// replicas 0..Replicas-1 run (or wait for room), the others are stopped.
	Replicas int `json:"replicas"`
	// Scaled is when Replicas last changed, Reason why; ScaleUps and ScaleDowns count the
	// decisions.
	Scaled     time.Time `json:"scaled,omitzero"`
	Reason     string    `json:"reason,omitempty"`
	ScaleUps   int       `json:"scale_ups,omitempty"`
	ScaleDowns int       `json:"scale_downs,omitempty"`
	Created    time.Time `json:"created"`
}

// ServiceLoad is a replica's report of its load (POST /v1/services/load): the SDK's worker
// sends one for the calls it serves, a program serving its own requests through
// Context.ReportLoad. Reports stay in the leader's memory, as machines' loads do.
type ServiceLoad struct {
	Job     string `json:"job"`
	Service string `json:"service"`
	Replica int    `json:"replica"`
	// InFlight is the requests the replica holds now; Latency the mean latency of those it
	// answered since its last report (0: none answered), Served how many.
	InFlight int       `json:"in_flight"`
	Latency  Duration  `json:"latency,omitempty"`
	Served   int       `json:"served,omitempty"`
	At       time.Time `json:"at,omitzero"`
}

// Validate checks a load report's names and bounds.
func (l *ServiceLoad) Validate() error {
	if err := CheckName("job", l.Job); err != nil {
		return err
	}
	if err := CheckName("service", l.Service); err != nil {
		return err
	}
	if l.Replica < 0 || l.Replica >= MaxServiceReplicas || l.InFlight < 0 || l.Latency < 0 || l.Served < 0 {
		return fmt.Errorf("%w: load of service %s/%s replica %d: replica, in flight, latency and served must not be negative (replica below %d)",
			ErrInvalid, l.Job, l.Service, l.Replica, MaxServiceReplicas)
	}
	return nil
}

// ServiceStatus is a service's line in the cluster status (`atoll status --json`: services).
type ServiceStatus struct {
	Job   string       `json:"job"`
	Name  string       `json:"name"`
	State ServiceState `json:"state"`
	// MinReplicas..MaxReplicas are its bounds, Replicas the leader's decision, Ready the
	// replicas whose worker is up.
	MinReplicas int `json:"min_replicas"`
	MaxReplicas int `json:"max_replicas"`
	Replicas    int `json:"replicas"`
	Ready       int `json:"ready"`
	// InFlight is the requests in flight its replicas reported, LatencyMS their mean
	// latency (milliseconds), LatencySLOMS its SLO (0: none).
	InFlight     int     `json:"in_flight"`
	LatencyMS    float64 `json:"latency_ms"`
	LatencySLOMS float64 `json:"latency_slo_ms,omitempty"`
	// GPUs are the cards its replicas hold; ScaleUps and ScaleDowns count the leader's
	// decisions, Reason says the last one.
	GPUs       int    `json:"gpus"`
	ScaleUps   int    `json:"scale_ups"`
	ScaleDowns int    `json:"scale_downs"`
	Reason     string `json:"reason,omitempty"`
}

// SpawnService creates a service (POST /v1/services): its record, then its minimum of
// replicas.
func (c *Client) SpawnService(ctx context.Context, s ServiceSpec) (Service, error) {
	var out Service
	err := c.Do(ctx, http.MethodPost, "/v1/services", s, &out)
	return out, err
}

// StopService stops a service and its replicas (POST /v1/services/stop).
func (c *Client) StopService(ctx context.Context, job, name string) error {
	return c.Do(ctx, http.MethodPost, "/v1/services/stop?job="+url.QueryEscape(job)+"&service="+url.QueryEscape(name), nil, nil)
}

// ReportServiceLoad sends a replica's load (POST /v1/services/load).
func (c *Client) ReportServiceLoad(ctx context.Context, l ServiceLoad) error {
	return c.Do(ctx, http.MethodPost, "/v1/services/load", l, nil)
}
