package authz

import (
	"fmt"
	"strings"
)

// Action is what a request or a link does, as the table names it.
type Action string

// The actions. Each is one row of the table (Table): the routes and links it covers are
// the row's Where.
const (
	ActRead           Action = "log.read"
	ActReadJob        Action = "log.read.job"
	ActReadControl    Action = "log.read.control"
	ActPropose        Action = "log.propose"
	ActMembers        Action = "members.change"
	ActCertSign       Action = "cert.sign"
	ActTokenMint      Action = "token.mint"
	ActTokenRevoke    Action = "token.revoke"
	ActTokenReview    Action = "token.review"
	ActMachineReport  Action = "machine.report"
	ActJobSubmit      Action = "job.submit"
	ActJobWrite       Action = "job.write"
	ActGangWrite      Action = "gang.write"
	ActWorkerReady    Action = "worker.ready"
	ActWorkerExited   Action = "worker.exited"
	ActCostReport     Action = "cost.report"
	ActProgress       Action = "progress.report"
	ActMachineDrain   Action = "machine.drain"
	ActPoolInterrupt  Action = "pool.interrupt"
	ActConfigWrite    Action = "config.write"
	ActDebug          Action = "debug.read"
	ActKVObjects      Action = "kv.objects"
	ActKVCheckpoints  Action = "kv.checkpoints"
	ActKVBinaries     Action = "kv.binaries"
	ActKVOwners       Action = "kv.owners"
	ActKVControl      Action = "kv.control"
	ActObjectPut      Action = "object.put"
	ActObjectRead     Action = "object.read"
	ActObjectHold     Action = "object.hold"
	ActObjectWrite    Action = "object.write"
	ActWorkerKill     Action = "worker.kill"
	ActLogsRead       Action = "logs.read"
	ActActorLink      Action = "actor.link"
	ActAgentStateRead Action = "agent.read"
	ActAuditReport    Action = "audit.report"
)

// Scope is how far a role may act on a target.
type Scope uint8

// The scopes.
const (
	// ScopeNone: never.
	ScopeNone Scope = iota
	// ScopeAny: on any target.
	ScopeAny
	// ScopeSelf: on itself only (Target.For is the principal).
	ScopeSelf
	// ScopeMachine: on its machine (Target.Machine, or the machine Target.For's gang
	// member is placed on); for a worker, the machine its own rank is placed on.
	ScopeMachine
	// ScopeJob: within its jobs (Target.Job): a worker's job; a driver's, and the jobs it
	// submitted.
	ScopeJob
	// ScopeNewJob: its jobs, or a job of a name not taken (it becomes the driver's); for a
	// driver that another principal submitted, also a stopped job of that principal.
	ScopeNewJob
	// ScopeOwnObjects: objects it owns (Target.Owner): a driver, those of its job; a
	// worker, its own (worker/<job>/<gang>/<rank>.g<n>) and its job's task results
	// (job/<job>).
	ScopeOwnObjects
	// ScopeReadObjects: objects of its job and shared ones (detached, an admin's).
	ScopeReadObjects
	// ScopeNewObjects: new objects (or copies) in its own name, as ScopeOwnObjects, or
	// detached ones (shared, and kept until freed).
	ScopeNewObjects
)

// String says what the scope allows, as the table shows it.
func (s Scope) String() string {
	switch s {
	case ScopeAny:
		return "any"
	case ScopeSelf:
		return "itself"
	case ScopeMachine:
		return "its machine"
	case ScopeJob:
		return "its jobs"
	case ScopeNewJob:
		return "its jobs, or a new one"
	case ScopeOwnObjects:
		return "its own objects"
	case ScopeReadObjects:
		return "its job's and shared objects"
	case ScopeNewObjects:
		return "its own or detached objects"
	}
	return "—"
}

// Rule is one row of the table: an action, where it happens, and each role's scope.
type Rule struct {
	Action Action
	// Where lists the routes and links the action covers.
	Where  string
	Scopes map[Role]Scope
}

func row(a Action, where string, admin, head, agent, driver, worker Scope) Rule {
	return Rule{Action: a, Where: where, Scopes: map[Role]Scope{RoleAdmin: admin, RoleHead: head, RoleAgent: agent, RoleDriver: driver, RoleWorker: worker}}
}

const (
	none = ScopeNone
	any_ = ScopeAny
)

// table is the table: every route of a head and of an agent, and every link, is one of
// these actions (the heads' and agents' tests check that each of their routes is).
var table = []Rule{
	row(ActRead, "head `GET /v1/status`, `/v1/cluster`, `/v1/scheduler`, `/v1/whoami`, `/v1/trust`; `GET /v1/get`, `/v1/range`, `/v1/list`, `/v1/watch` of `nodes/ placements/ objects/ binaries/ config/`", any_, any_, any_, any_, any_),
	row(ActReadJob, "head `GET /v1/get`, `/v1/range`, `/v1/list`, `/v1/watch` of a job's records (`jobs/<job>`, `gangs/<job>/`, `actors/<job>/`, `checkpoints/<job>/`, `services/<job>/`; a range over several jobs answers the caller's only)", any_, any_, any_, ScopeJob, ScopeJob),
	row(ActReadControl, "head `GET /v1/get`, `/v1/range`, `/v1/list`, `/v1/watch` of `events/ owners/ control/ auth/` (the event and audit log, owner records, the leader's term, cordons and costs, revocations)", any_, any_, any_, none, none),
	row(ActPropose, "head `POST /v1/propose` (raw log entries, any table)", any_, none, none, none, none),
	row(ActMembers, "head `POST /v1/members/add`, `/v1/members/remove` (Paxos membership)", any_, none, none, none, none),
	row(ActCertSign, "head `POST /v1/certs` (a certificate for the token's principal)", any_, none, ScopeSelf, ScopeSelf, ScopeSelf),
	row(ActTokenMint, "head `POST /v1/tokens` (a credential for a worker or a submitted driver placed on the machine)", any_, none, ScopeMachine, none, none),
	row(ActTokenRevoke, "head `POST /v1/tokens/revoke`", any_, none, none, none, none),
	row(ActTokenReview, "head `POST /v1/tokens/review` (who a bearer token names: an agent with a scoped credential checks its callers' tokens there)", any_, any_, any_, none, none),
	row(ActMachineReport, "head `POST /v1/machines/register`, `/v1/machines/load`", any_, none, ScopeMachine, none, none),
	row(ActJobSubmit, "head `POST /v1/jobs` (a submitted job is its submitter's)", any_, none, none, ScopeNewJob, none),
	row(ActJobWrite, "head `POST /v1/jobs/stop`", any_, none, none, ScopeJob, none),
	row(ActGangWrite, "head `POST /v1/gangs`, `/v1/gangs/stop`, `/v1/gangs/yield`, `/v1/gangs/world`, `/v1/gangs/checkpointed`, `/v1/services`, `/v1/services/stop` (a worker's: an actor's Context.Job spawns gangs, placed actors and tasks of its job)", any_, none, none, ScopeJob, ScopeJob),
	row(ActWorkerReady, "head `POST /v1/workers/ready`", any_, none, ScopeMachine, none, ScopeSelf),
	row(ActWorkerExited, "head `POST /v1/workers/exited`", any_, none, ScopeMachine, none, none),
	row(ActCostReport, "head `POST /v1/costs` (restart costs the scheduler learns, measured on a machine)", any_, none, none, none, ScopeMachine),
	row(ActProgress, "head `POST /v1/progress`, `/v1/services/load`", any_, none, none, ScopeJob, ScopeJob),
	row(ActAuditReport, "head `POST /v1/audit` (a refusal on an agent's API or transfer plane, for the event log)", any_, any_, any_, none, none),
	row(ActMachineDrain, "head `POST /v1/machines/drain`, `/v1/machines/undrain`", any_, none, none, none, none),
	row(ActPoolInterrupt, "head `POST /v1/pools/interrupt`", any_, none, none, none, none),
	row(ActConfigWrite, "head `PUT /v1/scheduler` (queues, priority classes, bounds)", any_, none, none, none, none),
	row(ActDebug, "head `GET /debug/pprof/`", any_, none, none, none, none),
	row(ActKVObjects, "head `POST /v1/txn` on `objects/` (the object directory)", any_, none, any_, ScopeOwnObjects, ScopeOwnObjects),
	row(ActKVCheckpoints, "head `POST /v1/txn` on `checkpoints/<job>/`", any_, none, none, ScopeJob, ScopeJob),
	row(ActKVBinaries, "head `POST /v1/txn` puts on `binaries/` (content-addressed; agents check the hash)", any_, none, none, any_, none),
	row(ActKVOwners, "head `POST /v1/txn` on `owners/` (a driver's record, naming its principal)", any_, none, none, ScopeSelf, none),
	row(ActKVControl, "head `POST /v1/txn` on every other table (`nodes/ jobs/ gangs/ placements/ actors/ events/ config/ control/ auth/ services/`)", any_, none, none, none, none),
	row(ActObjectPut, "agent `POST /v1/objects/put`, `create`, `seal`, `abort` (the new object's holder), `/v1/objects/replicate` (the new copy's holder)", any_, any_, any_, ScopeNewObjects, ScopeNewObjects),
	row(ActObjectRead, "agent `POST /v1/objects/map`, `verify`, `persist`, `export`, `replicate` (the object); transfer plane: opening an object to pull", any_, any_, any_, ScopeReadObjects, ScopeReadObjects),
	row(ActObjectHold, "agent `POST /v1/objects/map`, `unmap`, `release`, `/v1/leases/renew` (the holder of the references), `create` (the writing process's lease)", any_, any_, any_, ScopeOwnObjects, ScopeOwnObjects),
	row(ActObjectWrite, "agent `POST /v1/objects/free`, `drop`, `unexport` (the object)", any_, any_, any_, ScopeOwnObjects, ScopeOwnObjects),
	row(ActWorkerKill, "agent `POST /v1/workers/kill`", any_, any_, none, ScopeJob, none),
	row(ActLogsRead, "agent `GET /v1/logs` (a worker's or driver's output)", any_, any_, none, ScopeJob, none),
	row(ActAgentStateRead, "agent `GET /v1/workers`", any_, any_, any_, any_, any_),
	row(ActActorLink, "actor remote: a link into a process that hosts a job's actors (its certificate's job)", any_, any_, any_, ScopeJob, ScopeJob),
}

// Table returns the table, one rule per action.
func Table() []Rule { return append([]Rule(nil), table...) }

func ruleOf(a Action) (Rule, bool) {
	for _, r := range table {
		if r.Action == a {
			return r, true
		}
	}
	return Rule{}, false
}

// AdminOnly reports whether only admin may take the action: its successes are audited.
func AdminOnly(a Action) bool {
	r, ok := ruleOf(a)
	if !ok {
		return true
	}
	for _, role := range Roles() {
		if role != RoleAdmin && r.Scopes[role] != ScopeNone {
			return false
		}
	}
	return true
}

// Markdown renders the table for docs/hardening.md.
func Markdown() string {
	var b strings.Builder
	b.WriteString("| action | routes and links |")
	for _, r := range Roles() {
		fmt.Fprintf(&b, " %s |", r)
	}
	b.WriteString("\n| --- | --- |")
	for range Roles() {
		b.WriteString(" --- |")
	}
	b.WriteString("\n")
	for _, r := range table {
		fmt.Fprintf(&b, "| `%s` | %s |", r.Action, r.Where)
		for _, role := range Roles() {
			fmt.Fprintf(&b, " %s |", r.Scopes[role])
		}
		b.WriteString("\n")
	}
	return b.String()
}
