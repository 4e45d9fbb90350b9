package api

import (
	"encoding/json"
	"fmt"
)

// Bounds of what a request may carry into the log. Every free-form field the head commits
// has a limit, so that no request makes a record the log cannot carry cheaply: a record of
// a megabyte slows every replica's write and fsync and every catch-up, enough to cost the
// leadership. A request over a limit is refused with ErrInvalid (400) naming the field and
// its limit; nothing is committed.
const (
	// MaxNameBytes bounds job, gang, machine and metric names (CheckName).
	MaxNameBytes = 63
	// MaxKindBytes bounds an actor kind (GangSpec.Kind) and a payload's type name.
	MaxKindBytes = 256
	// MaxArgsBytes bounds a gang's constructor arguments (GangSpec.Args.Data): larger inputs
	// belong in the object store, passed by reference.
	MaxArgsBytes = 64 << 10
	// MaxJobArgs and MaxJobEnv bound the entries of Job.Args and Job.Env; MaxJobArgsBytes
	// and MaxJobEnvBytes their bytes together.
	MaxJobArgs      = 1024
	MaxJobArgsBytes = 64 << 10
	MaxJobEnv       = 1024
	MaxJobEnvBytes  = 64 << 10
	// MaxPathBytes bounds a path (Job.Dir).
	MaxPathBytes = 4096
	// MaxTextBytes bounds short free text: who submitted a job, a drain's reason, host names,
	// addresses, actor ids, uids, GPU models.
	MaxTextBytes = 1024
	// MaxReasonBytes bounds a worker's exit reason (it becomes its gang's reason).
	MaxReasonBytes = 4096
	// MaxSpecBytes bounds a machine's topology spec, encoded.
	MaxSpecBytes = 256 << 10
	// MaxMembersList bounds a list of member indices (a world change).
	MaxMembersList = 100000
)

// OverLimit is the refusal of a field over its limit: it names both.
func OverLimit(field string, n, limit int) error {
	return fmt.Errorf("%w: %s is %d bytes, over its limit of %d bytes", ErrInvalid, field, n, limit)
}

// checkBytes refuses a field longer than limit bytes.
func checkBytes(field, s string, limit int) error {
	if len(s) > limit {
		return OverLimit(field, len(s), limit)
	}
	return nil
}

// checkList refuses a list of strings with more than n entries or more than limit bytes
// together.
func checkList(field string, l []string, n, limit int) error {
	if len(l) > n {
		return fmt.Errorf("%w: %s has %d entries, over its limit of %d", ErrInvalid, field, len(l), n)
	}
	total := 0
	for _, s := range l {
		total += len(s)
	}
	if total > limit {
		return OverLimit(field, total, limit)
	}
	return nil
}

// firstErr returns the first error of checks.
func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// CheckBounds refuses a gang spec whose free-form fields are over their limits (Normalize
// checks it too, with the rest).
func (s *GangSpec) CheckBounds() error {
	err := firstErr(
		CheckName("job", s.Job),
		CheckName("gang", s.Name),
		checkBytes("kind", s.Kind, MaxKindBytes),
		checkBytes("queue", s.Queue, 200),
		checkBytes("priority_class", s.PriorityClass, MaxNameBytes),
		checkBytes("strategy", string(s.Strategy), MaxNameBytes),
	)
	if err != nil || s.Args == nil {
		return err
	}
	return firstErr(checkBytes("args.type", s.Args.Type, MaxKindBytes), checkBytes("args.data", string(s.Args.Data), MaxArgsBytes))
}

// CheckBounds refuses a job whose fields are over their limits.
func (j *Job) CheckBounds() error {
	err := firstErr(
		CheckName("job", j.Name),
		checkBytes("driver", j.Driver, MaxTextBytes),
		checkList("args", j.Args, MaxJobArgs, MaxJobArgsBytes),
		checkList("env", j.Env, MaxJobEnv, MaxJobEnvBytes),
		checkBytes("dir", j.Dir, MaxPathBytes),
	)
	if err != nil || j.Binary == nil {
		return err
	}
	return firstErr(checkBytes("binary.sha256", j.Binary.SHA256, 64), checkBytes("binary.object", j.Binary.Object, MaxTextBytes))
}

// CheckBounds refuses a machine registration whose fields are over their limits.
func (m *Machine) CheckBounds() error {
	err := firstErr(
		CheckName("machine", m.Name),
		checkBytes("host", m.Host, MaxTextBytes),
		checkBytes("agent.api", m.Agent.API, MaxTextBytes),
		checkBytes("agent.transfer", m.Agent.Transfer, MaxTextBytes),
		checkBytes("agent.serf", m.Agent.Serf, MaxTextBytes),
		checkBytes("reason", m.Reason, MaxTextBytes),
	)
	if err != nil || m.Spec == nil {
		return err
	}
	n, err := encodedLen(m.Spec)
	if err != nil {
		return fmt.Errorf("%w: spec: %v", ErrInvalid, err)
	}
	if n > MaxSpecBytes {
		return OverLimit("spec", n, MaxSpecBytes)
	}
	return nil
}

// CheckBounds refuses a worker record whose fields are over their limits.
func (w *Worker) CheckBounds() error {
	return firstErr(
		CheckName("job", w.Job),
		CheckName("gang", w.Gang),
		checkBytes("gang_uid", w.GangUID, MaxTextBytes),
		checkBytes("machine", w.Machine, MaxTextBytes),
		checkBytes("address", w.Address, MaxTextBytes),
		checkBytes("actor_id", w.ActorID, MaxTextBytes),
		checkBytes("collective", w.Collective, MaxTextBytes),
		checkBytes("transfer", w.Transfer, MaxTextBytes),
	)
}

// CheckBounds refuses a worker exit whose fields are over their limits (an agent cuts its
// reasons to MaxReasonBytes: see TruncateReason).
func (x *WorkerExit) CheckBounds() error {
	return firstErr(
		CheckName("job", x.Job),
		CheckName("gang", x.Gang),
		checkBytes("machine", x.Machine, MaxTextBytes),
		checkBytes("reason", x.Reason, MaxReasonBytes),
	)
}

// TruncateReason cuts a reason to MaxReasonBytes (at a byte boundary, marked "...").
func TruncateReason(s string) string {
	if len(s) <= MaxReasonBytes {
		return s
	}
	return s[:MaxReasonBytes-3] + "..."
}

// CheckBounds refuses a yield whose fields are over their limits.
func (y *Yield) CheckBounds() error {
	return firstErr(CheckName("job", y.Job), CheckName("gang", y.Gang), checkBytes("uid", y.UID, MaxTextBytes))
}

// CheckBounds refuses a world change whose fields are over their limits.
func (w *WorldChange) CheckBounds() error {
	if len(w.Members) > MaxMembersList {
		return fmt.Errorf("%w: members has %d entries, over its limit of %d", ErrInvalid, len(w.Members), MaxMembersList)
	}
	return firstErr(CheckName("job", w.Job), CheckName("gang", w.Gang), checkBytes("uid", w.UID, MaxTextBytes))
}

// CheckBounds refuses a checkpoint report whose fields are over their limits.
func (r *CheckpointReport) CheckBounds() error {
	return firstErr(CheckName("job", r.Job), CheckName("gang", r.Gang), checkBytes("uid", r.UID, MaxTextBytes))
}

// CheckBounds refuses a cost report whose fields are over their limits.
func (r *CostReport) CheckBounds() error {
	return firstErr(
		checkBytes("kind", r.Kind, MaxNameBytes),
		checkBytes("gpu_model", r.GPUModel, MaxTextBytes),
		checkBytes("machine", r.Machine, MaxTextBytes),
	)
}

// CheckBounds refuses a drain request whose fields are over their limits.
func (d *DrainRequest) CheckBounds() error {
	return firstErr(checkBytes("machine", d.Machine, MaxTextBytes), checkBytes("reason", d.Reason, MaxTextBytes))
}

// CheckBounds refuses a load report whose fields are over their limits.
func (l *LoadReport) CheckBounds() error {
	return checkBytes("machine", l.Machine, MaxTextBytes)
}

// CheckBounds refuses an interruption request whose fields are over their limits.
func (r *InterruptRequest) CheckBounds() error {
	return checkBytes("machine", r.Machine, MaxTextBytes)
}

// encodedLen is the length of v's JSON encoding, as the log would hold it.
func encodedLen(v any) (int, error) {
	b, err := json.Marshal(v)
	return len(b), err
}
