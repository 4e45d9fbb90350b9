package authz

import (
	"fmt"
	"strconv"
	"strings"
)

// State is what some decisions read of the cluster's records. A head answers from its
// state machine, an agent through its client of the heads. Implementations must be safe
// for concurrent use.
type State interface {
	// MemberMachine is the machine that rank of the gang job/gang is placed on, in the
	// gang's current record.
	MemberMachine(job, gang string, rank int) (string, bool)
	// OwnerPrincipal is the principal of a driver process that owns objects
	// ("driver/<host>/<pid>"), as its owner record (owners/) names it.
	OwnerPrincipal(owner string) (Principal, bool)
	// JobPrincipal is the principal that submitted a job, as its record names it (ok
	// false: there is no such job).
	JobPrincipal(job string) (Principal, bool)
}

// Target is what an action acts on; the fields the action needs are set.
type Target struct {
	// Job, Gang: a job or a gang of it.
	Job, Gang string
	// Machine: a machine.
	Machine string
	// For: the principal the action is on behalf of (a worker's readiness, a certificate
	// or a token for it, an owner record naming it).
	For Principal
	// Owner: an object's owner, as the stores name it.
	Owner string
	// Stopped: the job (Job) exists and is stopped (a job submission).
	Stopped bool
	// What describes the target in a refusal ("put gangs/b/g"); default: from the fields.
	What string
}

func (t Target) String() string {
	switch {
	case t.What != "":
		return t.What
	case t.Owner != "":
		return "an object of " + t.Owner
	case !t.For.IsZero():
		return t.For.String()
	case t.Gang != "":
		return "gang " + t.Job + "/" + t.Gang
	case t.Job != "":
		return "job " + t.Job
	case t.Machine != "":
		return "machine " + t.Machine
	}
	return "the cluster"
}

// Denied is a refusal: who, what, on what, and why. It wraps ErrForbidden.
type Denied struct {
	Principal Principal
	Action    Action
	Target    Target
	// Scope is what the principal's role may do of the action.
	Scope Scope
}

func (d *Denied) Error() string {
	why := "only admin may"
	if d.Scope != ScopeNone {
		why = "a " + string(d.Principal.Role) + " acts on " + d.Scope.String() + " only"
	}
	return fmt.Sprintf("forbidden: %s (role %s) may not %s on %s: %s", d.Principal, d.Principal.Role, d.Action, d.Target, why)
}

func (d *Denied) Unwrap() error { return ErrForbidden }

// Decide decides whether p may take action a on t (s answers what the decision reads of
// the cluster; it may be nil when the action needs none). It returns nil or a *Denied.
func Decide(p Principal, a Action, t Target, s State) error {
	r, ok := ruleOf(a)
	scope := ScopeNone
	if ok {
		scope = r.Scopes[p.Role]
	}
	if allowed(p, scope, t, s) {
		return nil
	}
	return &Denied{Principal: p, Action: a, Target: t, Scope: scope}
}

func allowed(p Principal, scope Scope, t Target, s State) bool {
	switch scope {
	case ScopeAny:
		return true
	case ScopeSelf:
		// agent/* acts as one machine's agent, never as itself (no certificate for every machine).
		return !t.For.IsZero() && p.Covers(t.For) && !(t.For.Role == RoleAgent && t.For.Machine == AnyMachine)
	case ScopeJob:
		return inJob(p, t.Job, s)
	case ScopeNewJob:
		if inJob(p, t.Job, s) {
			return true
		}
		if s == nil || t.Job == "" || p.Job == "" {
			return false
		}
		owner, taken := s.JobPrincipal(t.Job)
		if !taken {
			return true
		}
		// A driver that another principal submitted (atoll submit) acts for it on the
		// names of its stopped jobs: a submitted program names its own job.
		submitter, ok := s.JobPrincipal(p.Job)
		return t.Stopped && ok && submitter != p && owner == submitter
	case ScopeMachine:
		return onMachine(p, t, s)
	case ScopeOwnObjects:
		return ownsObject(p, t.Owner, s)
	case ScopeReadObjects:
		return readsObject(p, t.Owner, s)
	case ScopeNewObjects:
		return t.Owner == "detached" || ownsObject(p, t.Owner, s)
	}
	return false
}

// onMachine: the target is on the principal's machine (an agent's; a worker's is the one
// its rank is placed on).
func onMachine(p Principal, t Target, s State) bool {
	if p.Role == RoleAgent && p.Machine == AnyMachine { // the agent of any one machine
		if t.Machine != "" {
			return checkScopeName(t.Machine) == nil // a machine's name, not a placeholder
		}
		if t.For.Role == RoleWorker && s != nil {
			_, ok := s.MemberMachine(t.For.Job, t.For.Gang, t.For.Rank)
			return ok
		}
		return false
	}
	mine := p.Machine
	if p.Role == RoleWorker {
		if s == nil {
			return false
		}
		m, ok := s.MemberMachine(p.Job, p.Gang, p.Rank)
		if !ok {
			return false
		}
		mine = m
	}
	if mine == "" {
		return false
	}
	if t.Machine != "" {
		return t.Machine == mine
	}
	if t.For.Role == RoleWorker && s != nil {
		m, ok := s.MemberMachine(t.For.Job, t.For.Gang, t.For.Rank)
		return ok && m == mine
	}
	return false
}

// owner is what an object's owner name says of its scope.
type owner struct {
	job    string    // the job whose it is ("" if none)
	worker Principal // the worker incarnation that owns it
	driver Principal // the driver process that owns it (its principal)
	shared bool      // readable by every job: detached, or an admin's
}

// ParseOwner reads an owner name: job/<job> and submit/<job> (a job's), checkpoint/<job>/<gang>,
// worker/<job>/<gang>/<rank>.g<n>, detached, and driver/<host>/<pid>[/binary] (the
// principal its owner record names, through s). ok is false for an owner of no known
// scope.
func parseOwner(name string, s State) (owner, bool) {
	kind, rest, _ := strings.Cut(name, "/")
	switch kind {
	case "detached":
		return owner{shared: true}, rest == ""
	case "job", "submit":
		return owner{job: rest}, rest != "" && !strings.Contains(rest, "/")
	case "checkpoint":
		job, _, ok := strings.Cut(rest, "/")
		return owner{job: job}, ok && job != ""
	case "worker":
		parts := strings.Split(rest, "/")
		if len(parts) != 3 {
			return owner{}, false
		}
		rank, _, _ := strings.Cut(parts[2], ".g")
		r, err := strconv.Atoi(rank)
		if err != nil || r < 0 {
			return owner{}, false
		}
		return owner{job: parts[0], worker: Worker(parts[0], parts[1], r)}, parts[0] != ""
	case "driver":
		if s == nil {
			return owner{}, false
		}
		proc := strings.TrimSuffix(name, "/binary")
		p, ok := s.OwnerPrincipal(proc)
		if !ok {
			return owner{}, false
		}
		switch p.Role {
		case RoleAdmin:
			return owner{shared: true}, true
		case RoleDriver:
			return owner{driver: p}, true
		}
	}
	return owner{}, false
}

// inJob: job is one of the principal's jobs: a worker's own; a driver's own, or one it
// submitted (its record names the driver's principal).
func inJob(p Principal, job string, s State) bool {
	switch {
	case job == "" || p.Job == "":
		return false
	case job == p.Job:
		return true
	case p.Role != RoleDriver || s == nil:
		return false
	}
	q, ok := s.JobPrincipal(job)
	return ok && q == p
}

func ownsObject(p Principal, name string, s State) bool {
	o, ok := parseOwner(name, s)
	if !ok || p.Job == "" {
		return false
	}
	switch p.Role {
	case RoleDriver:
		return o.driver == p || inJob(p, o.job, s)
	case RoleWorker: // its own, its job's task results, its gang's checkpoint parts
		return o.worker == p || name == "job/"+p.Job || name == "checkpoint/"+p.Job+"/"+p.Gang
	}
	return false
}

func readsObject(p Principal, name string, s State) bool {
	o, ok := parseOwner(name, s)
	if !ok {
		return false
	}
	switch {
	case o.shared, inJob(p, o.job, s), o.driver == p:
		return true
	case !o.driver.IsZero(): // a driver's: read by the workers of its jobs
		return inJob(o.driver, p.Job, s)
	}
	return false
}

// LinkAdmits decides an actor remote link into a process whose own principal is self:
// from any privileged principal (admin, a head, an agent), from a driver or a worker of
// self's job (a driver's job and the jobs it submitted are one), and from the driver that
// submitted a worker's job; a process of no job (an admin's driver) admits every
// principal of the cluster.
func LinkAdmits(self, peer Principal, s State) error {
	if self.Job == "" {
		return nil
	}
	err := Decide(peer, ActActorLink, Target{Job: self.Job}, s)
	if err == nil || peer.Role != RoleWorker || self.Role != RoleDriver {
		return err
	}
	if inJob(self, peer.Job, s) { // a worker of a job this driver submitted
		return nil
	}
	return err
}

// ReadOf is the action and the target of a log read of key, or of a range of keys under
// it (a prefix). A prefix that spans several jobs ("gangs/", "") has no job in its
// target: Decide refuses it for a driver or a worker, and a range over it is answered
// key by key (Readable).
func ReadOf(key string) (Action, Target) {
	table, rest, _ := strings.Cut(key, "/")
	job, _, _ := strings.Cut(rest, "/")
	switch table + "/" {
	case "jobs/", "gangs/", "actors/", "checkpoints/", "services/":
		return ActReadJob, Target{Job: job, What: "read " + key}
	case "events/", "owners/", "control/", "auth/":
		return ActReadControl, Target{What: "read " + key}
	case "nodes/", "placements/", "objects/", "binaries/", "config/":
		return ActRead, Target{What: "read " + key}
	}
	// A key of no table (or the empty prefix): only what may read every table.
	return ActReadControl, Target{What: "read " + key}
}

// Readable reports whether p may read key (a range's answer keeps the keys it may).
func Readable(p Principal, key string, s State) bool {
	a, t := ReadOf(key)
	return Decide(p, a, t, s) == nil
}

// ReadsAll reports whether p may read every key (its ranges need no filter).
func ReadsAll(p Principal) bool {
	r, _ := ruleOf(ActReadControl)
	j, _ := ruleOf(ActReadJob)
	return r.Scopes[p.Role] == ScopeAny && j.Scopes[p.Role] == ScopeAny
}
