// Package provider starts and stops the machines of autoscaling pools: agent processes on
// this machine (Local), agent containers through the Docker Engine API (Docker), and
// machines that exist only in a simulation (Sim). The Kubernetes provider, which pulls in
// client-go, lives in provider/kubernetes so that binaries without it stay small.
//
// Each satisfies the Provider interface its consumer (the head's pool runner) declares;
// they are written against it here so that every one is checked:
//
//	var _ Provider = (*Local)(nil)
//
// A provider is told the names of the machines to launch (the pool runner names them,
// so that a launch committed to the log before it is carried out can be retried without
// making a second machine), and each machine joins the cluster as an agent of that name.
package provider

import (
	"context"
	"errors"
	"time"
)

// Errors of the providers; check with errors.Is.
var (
	// ErrNoCapacity: the provider has no capacity of that kind now (a spot market without
	// machines, a Kubernetes cluster without room); the pool falls back elsewhere.
	ErrNoCapacity = errors.New("provider: no capacity available")
	// ErrInvalid: a launch the provider cannot make (a bad name, missing settings).
	ErrInvalid = errors.New("provider: invalid request")
	// ErrUnavailable: the provider's backend (Docker, the Kubernetes API) did not answer.
	ErrUnavailable = errors.New("provider: backend unavailable")
)

// Provider starts and stops a pool's machines. Methods may be called from several
// goroutines; each blocks until its backend answered or ctx ends.
type Provider interface {
	// Launch starts one machine per name; each joins the cluster as an agent of that name.
	// A name that already runs is not started twice.
	Launch(ctx context.Context, req LaunchRequest) error
	// Terminate stops a machine and frees what it held; a machine already gone is not an
	// error.
	Terminate(ctx context.Context, name string) error
	// List returns the machines the provider runs for this cluster.
	List(ctx context.Context) ([]Instance, error)
}

// LaunchRequest says what to launch.
type LaunchRequest struct {
	Pool string
	// Names of the machines, one per machine.
	Names []string
	// Machine is the machine type the agents declare (--machine): a built-in name or a spec
	// file path.
	Machine string
	// Spot asks for spot capacity.
	Spot bool
	// Rack is the rack (NVLink domain) the machines join.
	Rack int
}

// Instance is one machine as its provider sees it.
type Instance struct {
	Name    string    `json:"name"`
	Pool    string    `json:"pool"`
	Running bool      `json:"running"`
	Started time.Time `json:"started"`
	// Detail is provider-specific (a pid, a container or pod id).
	Detail string `json:"detail,omitempty"`
}

// Notice is a provider's warning that it takes a machine back at Deadline (a spot
// interruption).
type Notice struct {
	Machine  string
	Deadline time.Time
}

// Interrupter is the optional interface of providers whose machines can be taken back.
// Local and Docker have no real interruptions: Interrupt injects one (for drills and the
// autoscale demo), and the pool runner reads them with Notices. On a cloud, the same
// notices come from the instance metadata (AWS: GET /latest/meta-data/spot/instance-action
// returns the action and its time, 120 s ahead; GCP: the "preempted" metadata key, about
// 30 s ahead), read on the machine by the agent or by a node-termination handler, and fed
// to the head the same way.
type Interrupter interface {
	// Interrupt announces that the machine will be taken back after the delay.
	Interrupt(name string, after time.Duration) error
	// Notices returns the notices not yet returned.
	Notices() []Notice
}
