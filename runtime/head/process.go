package head

import (
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/store/meta"
)

// Process gangs (api.ProcessSpec) have no driver to answer their notices: their members
// answer by how they exit. Each clean exit is recorded on the member's worker record
// (api.Worker.Exit, so a new leader reads it back); once every member of the gang's world
// has exited cleanly, the gang completes (every one exited with status 0), or is taken
// to have answered its notice: a stop queues it again (it resumes from its program's own
// checkpoint), its time limit stops it, a resize restarts it at its new size.

// stopOrResize reports whether a notice asks a gang to stop (preempt, drain, its time
// limit) or resize: a process gang's members answer it by yielding.
func stopOrResize(n *api.Notice) bool {
	return n != nil && (n.Kind == api.NoticePreempt || n.Kind == api.NoticeDrain || n.Kind == api.NoticeTimeLimit ||
		n.Kind == api.NoticeShrink || n.Kind == api.NoticeGrow)
}

// processExitLocked records a process gang member's clean exit (completed, or yielded
// after a notice) and decides for the gang once every member of its world has one.
func (c *Controller) processExitLocked(t *term, e *gangEntry, x api.WorkerExit, now time.Time) []commitFn {
	key := e.rec.Spec.Key()
	w, ok := e.ready[x.Rank]
	if !ok {
		w = api.Worker{Job: x.Job, Gang: x.Gang, Rank: x.Rank, Generation: x.Generation, GangUID: e.rec.UID, Machine: x.Machine, Started: now}
	}
	w.Exit = api.ExitCompleted
	if x.Yielded {
		w.Exit = api.ExitYielded
	}
	e.ready[x.Rank] = w
	ops := putJSON(api.TableWorkers+api.WorkerKey(x.Job, x.Gang, x.Rank), w)
	completed, yielded := 0, 0
	for _, i := range e.rec.Ranks() {
		switch e.ready[i].Exit {
		case api.ExitCompleted:
			completed++
		case api.ExitYielded:
			yielded++
		}
	}
	world := len(e.rec.Ranks())
	c.log.Info("process gang member exited", gangField(key), zap.Int("rank", x.Rank), zap.String("exit", w.Exit),
		zap.Int("completed", completed), zap.Int("yielded", yielded), zap.Int("world", world))
	if completed+yielded < world {
		return []commitFn{{what: fmt.Sprintf("exit of worker %s/%d", key, x.Rank), ops: []meta.Op{ops}}}
	}
	var work []commitFn
	n := e.rec.Notice
	switch {
	case completed == world || !stopOrResize(n):
		work = append(work, t.end(e, api.GangStopped, fmt.Sprintf("completed: its %d members exited with status 0", world), now))
	case n.Kind == api.NoticeTimeLimit: // its time is up: it stops, not queued again
		work = append(work, t.end(e, api.GangStopped, fmt.Sprintf("stopped at its time limit of %v: its members yielded",
			time.Duration(e.rec.Spec.TimeLimit)), now))
	case n.Kind == api.NoticeShrink || n.Kind == api.NoticeGrow:
		work = append(work, t.processResize(e, now))
	default:
		code := e.rec.Spec.Process.YieldExitCode
		work = append(work, t.evict(e, true, 0, fmt.Sprintf("its members yielded with exit code %d", code), now)...)
	}
	work[0].ops = append([]meta.Op{ops}, work[0].ops...)
	if e.rec.State == api.GangStopped { // completed, or stopped at its time limit
		work = append(work, t.jobEndsWith(e, now)...)
	}
	return append(work, c.cycleLocked(t, now)...)
}

// processResize restarts a process gang that took a shrink or a grow (every member
// yielded): its next generation runs at the new size, every member with the new world
// size and rank 0's new rendezvous address (torchrun's elastic restart). It is no failure:
// it does not count against MaxRestarts.
func (t *term) processResize(e *gangEntry, now time.Time) commitFn {
	key := e.rec.Spec.Key()
	n := e.rec.Notice
	rec := e.rec
	from := len(rec.Ranks())
	if n.Kind == api.NoticeShrink {
		t.dropMembers(&rec, n.Remove, now)
	}
	t.stopNoticeTimer(key)
	if tm := t.timers[key]; tm != nil {
		tm.Stop()
		delete(t.timers, key)
	}
	rec.Generation++
	rec.Resizes++
	rec.State, rec.World, rec.Notice, rec.RestartAt, rec.Updated = api.GangStarting, nil, nil, time.Time{}, now
	rec.Reason = fmt.Sprintf("resized %d -> %d members (%s): its members yielded and restart at the new size", from, len(rec.Active()), n.Kind)
	e.ready = map[int]api.Worker{}
	t.log.Info("process gang restarts at its new size", gangField(key), zap.Int("from", from), zap.Int("to", len(rec.Active())))
	return t.gangCommit(e, rec, "resize of "+key)
}
