package api

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// DashboardToken derives the dashboard's read-only token from the cluster secret:
// HMAC-SHA256(secret, "atoll dashboard v1"), in hex. It opens the dashboard's read
// endpoints and /metrics, and nothing else: a URL that carries it (as `atoll status`
// prints) does not give away the secret, which stays the only key to the control API.
func DashboardToken(secret []byte) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("atoll dashboard v1"))
	return hex.EncodeToString(m.Sum(nil))
}

// EventKind names what an event records.
type EventKind string

// Event kinds. Gang kinds carry Job, Gang and Generation; machine kinds Machine.
const (
	EventJobSubmitted EventKind = "job_submitted"
	EventJobStopped   EventKind = "job_stopped"
	// EventGangPlaced: the scheduler placed a generation (Machines, Islands, Scores).
	EventGangPlaced EventKind = "gang_placed"
	// EventGangRefused: a gang did not fit now and was not accepted (Reason says why).
	EventGangRefused EventKind = "gang_refused"
	// EventGangWaiting: a gang waits for capacity (it lost its machine; Reason).
	EventGangWaiting EventKind = "gang_waiting"
	// EventGangQueued: a gang was admitted and waits in its queue (Reason: for what).
	EventGangQueued EventKind = "gang_queued"
	// EventGangNotice: a running gang was asked to stop, shrink or take a grow (Reason).
	EventGangNotice EventKind = "gang_notice"
	// EventGangPreempted: a gang stopped for another and queued again (Reason).
	EventGangPreempted EventKind = "gang_preempted"
	// EventGangResized: an elastic gang's program took a resize (Reason: from -> to).
	EventGangResized EventKind = "gang_resized"
	// EventServiceScaled: the leader changed a service's replicas (Gang: the service;
	// Reason: from -> to, and why), or started or stopped it.
	EventServiceScaled EventKind = "service_scaled"
	EventGangRunning   EventKind = "gang_running"
	// EventGangRestart: a worker failed; the gang restarts all-for-one after a backoff, or
	// at once on the same GPUs when its agent restarted.
	EventGangRestart EventKind = "gang_restart"
	EventGangFailed  EventKind = "gang_failed"
	EventGangStopped EventKind = "gang_stopped"
	// EventMachineUp: an agent registered (Reason says "restarted" when it had not been
	// declared dead); EventMachineDown: a machine was declared dead.
	EventMachineUp   EventKind = "machine_up"
	EventMachineDown EventKind = "machine_down"
	// EventMachineCordoned: a machine was cordoned or drained (Reason: by whom, why);
	// EventMachineUncordoned: its cordon was lifted.
	EventMachineCordoned   EventKind = "machine_cordoned"
	EventMachineUncordoned EventKind = "machine_uncordoned"
	// EventRefused: a request outside its caller's role was refused (403): By names the
	// principal, Action the table's action, Reason the route and what it would have
	// touched. EventAdminWrite: an action only admin may take was taken (By, Action;
	// Reason: what it wrote). EventCredentialRevoked: a credential was revoked (Reason:
	// its id and principal).
	EventRefused           EventKind = "refused"
	EventAdminWrite        EventKind = "admin_write"
	EventCredentialRevoked EventKind = "credential_revoked"
)

// Event is one entry of the control plane's event log (table events/): a decision of the
// leader, committed in the same transaction as the decision itself, so that every head
// (and a new leader) shows the same history. The table is bounded: the oldest entries are
// deleted as new ones are written.
type Event struct {
	Seq        int64     `json:"seq"`
	Time       time.Time `json:"time"`
	Kind       EventKind `json:"kind"`
	Job        string    `json:"job,omitempty"`
	Gang       string    `json:"gang,omitempty"`
	Generation int       `json:"generation,omitempty"`
	Machine    string    `json:"machine,omitempty"`
	// Reason says why (a worker's exit, a lost machine, the scheduler's reason to wait).
	Reason string `json:"reason,omitempty"`
	// Machines, Islands and Scores describe a placement.
	Machines []string           `json:"machines,omitempty"`
	Islands  int                `json:"islands,omitempty"`
	Scores   map[string]float64 `json:"scores,omitempty"`
	// By and Action name who did what, in an audit event (EventRefused, EventAdminWrite,
	// EventCredentialRevoked): a principal and an action of runtime/authz's table.
	By     string `json:"by,omitempty"`
	Action string `json:"action,omitempty"`
}

// EventKey is an event's key in its table (sorted by sequence number).
func EventKey(seq int64) string { return fmt.Sprintf("%020d", seq) }

// EventSeq parses the sequence number of an event key (with or without the table prefix).
func EventSeq(key string) (int64, error) {
	s := strings.TrimPrefix(key, TableEvents)
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%w: event key %q: want a positive sequence number", ErrInvalid, key)
	}
	return n, nil
}

// String is the event as one line of text (`atoll events`).
func (e Event) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s  %-14s", e.Time.Format("15:04:05.000"), e.Kind)
	switch {
	case e.Gang != "":
		fmt.Fprintf(&b, " %s/%s g%d", e.Job, e.Gang, e.Generation)
	case e.Job != "":
		fmt.Fprintf(&b, " %s", e.Job)
	case e.Machine != "":
		fmt.Fprintf(&b, " %s", e.Machine)
	}
	if e.By != "" {
		fmt.Fprintf(&b, " by %s", e.By)
	}
	if e.Action != "" {
		fmt.Fprintf(&b, " (%s)", e.Action)
	}
	if len(e.Machines) > 0 {
		fmt.Fprintf(&b, " on %s (%d island(s))", strings.Join(e.Machines, ","), e.Islands)
	}
	if e.Reason != "" {
		fmt.Fprintf(&b, ": %s", e.Reason)
	}
	return b.String()
}

// StoreUsage is a machine's object store and transfer plane use, in its load reports.
type StoreUsage struct {
	// HotBytes are in shared memory (of CapacityBytes); ColdBytes spilled to disk.
	HotBytes      int64 `json:"hot_bytes"`
	ColdBytes     int64 `json:"cold_bytes"`
	CapacityBytes int64 `json:"capacity_bytes"`
	Objects       int   `json:"objects"`
	// ServedBytes and PulledBytes count the transfer plane's bytes since the agent started.
	ServedBytes int64 `json:"served_bytes"`
	PulledBytes int64 `json:"pulled_bytes"`
}

// MaxProgressMetrics bounds the metrics of one progress report.
const MaxProgressMetrics = 16

// Progress is a job's report of a gang's training progress (its step and metrics such as
// "loss"): the dashboard shows the newest and plots them. Reports are kept by the leader
// in memory, not in the log (a new leader shows the reports it receives).
type Progress struct {
	Job     string             `json:"job"`
	Gang    string             `json:"gang"`
	Step    int64              `json:"step"`
	Metrics map[string]float64 `json:"metrics,omitempty"`
	Time    time.Time          `json:"time,omitempty"`
	// UID and Generation are the run of the gang the report is of, stamped by the leader
	// from the gang's record when the report arrives: a gang spawned again under the same
	// name is another run (another UID), a restart another generation of the same run.
	UID        string `json:"uid,omitempty"`
	Generation int    `json:"generation,omitempty"`
}

// Validate checks a progress report's names and bounds.
func (p *Progress) Validate() error {
	if err := CheckName("job", p.Job); err != nil {
		return err
	}
	if err := CheckName("gang", p.Gang); err != nil {
		return err
	}
	if p.Step < 0 {
		return fmt.Errorf("%w: progress of %s/%s: step %d is negative", ErrInvalid, p.Job, p.Gang, p.Step)
	}
	if len(p.Metrics) > MaxProgressMetrics {
		return fmt.Errorf("%w: progress of %s/%s has %d metrics, over the bound of %d", ErrInvalid, p.Job, p.Gang, len(p.Metrics), MaxProgressMetrics)
	}
	for k, v := range p.Metrics {
		if err := CheckName("metric", k); err != nil {
			return err
		}
		if v != v || v > 1e300 || v < -1e300 {
			return fmt.Errorf("%w: progress of %s/%s: metric %s is %v, want a finite number", ErrInvalid, p.Job, p.Gang, k, v)
		}
	}
	return nil
}
