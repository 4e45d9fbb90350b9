package head

import (
	"fmt"

	"github.com/atoll-run/atoll/runtime/api"
)

// MinMemberCPUMilli is the CPU share every gang member counts at least (a tenth of a
// core): a member that asks for no resources is still a process, so a machine of 112 cores
// holds at most 1,120 of them.
const MinMemberCPUMilli = 100

// checkWorkerBounds refuses a gang that would take its job, or the cluster, past the
// operator's bounds on workers (SchedulerConfig.MaxJobWorkers, MaxClusterWorkers). Live
// gangs count their largest size; a gang spawned again under an ended one's name replaces
// it.
func (t *term) checkWorkerBounds(spec api.GangSpec) error {
	job, cluster := spec.Workers+t.workers.jobs[spec.Job], spec.Workers+t.workers.all
	if e := t.gangs[spec.Key()]; e != nil && e.rec.State.Live() {
		job -= e.rec.Spec.Workers
		cluster -= e.rec.Spec.Workers
	}
	if b := t.conf.JobWorkersBound(); job > b {
		return fmt.Errorf("%w: gang %s asks for %d workers: job %s would have %d, over the bound of %d workers per job (max_job_workers in the scheduler configuration)",
			api.ErrInvalid, spec.Key(), spec.Workers, spec.Job, job, b)
	}
	if b := t.conf.ClusterWorkersBound(); cluster > b {
		return fmt.Errorf("%w: gang %s asks for %d workers: the cluster would have %d, over the bound of %d workers in all (max_cluster_workers in the scheduler configuration)",
			api.ErrInvalid, spec.Key(), spec.Workers, cluster, b)
	}
	return nil
}

// workerCount is the workers of the live gangs, per job and in all, as checkWorkerBounds
// needs them. The ledger keeps it as its gangs change (putGang, dropGang, setRec): counting
// every gang at every admission was 38% of a leader's CPU while 10,000 actors were
// submitted to a cluster of 300 machines.
type workerCount struct {
	all  int
	jobs map[string]int
}

// add counts rec's workers (sign 1) or stops counting them (sign -1); only a live gang's
// count.
func (w *workerCount) add(rec api.Gang, sign int) {
	if !rec.State.Live() {
		return
	}
	if w.jobs == nil {
		w.jobs = map[string]int{}
	}
	n := sign * rec.Spec.Workers
	w.all += n
	if w.jobs[rec.Spec.Job] += n; w.jobs[rec.Spec.Job] == 0 {
		delete(w.jobs, rec.Spec.Job)
	}
}

// putGang sets the ledger's entry of key (replacing any).
func (l *ledger) putGang(key string, e *gangEntry) {
	l.dropGang(key)
	l.gangs[key] = e
	l.workers.add(e.rec, 1)
	l.endedGangs.count(e.rec, 1)
	if !e.rec.State.Live() {
		l.pushEnded(e.rec)
	}
}

// dropGang removes the ledger's entry of key.
func (l *ledger) dropGang(key string) {
	if old := l.gangs[key]; old != nil {
		l.workers.add(old.rec, -1)
		l.endedGangs.count(old.rec, -1)
		delete(l.gangs, key)
	}
}

// setRec replaces e's record (counted only while e is the ledger's entry of its gang).
func (l *ledger) setRec(e *gangEntry, rec api.Gang) {
	if l.gangs[rec.Spec.Key()] != e {
		e.rec = rec
		return
	}
	l.workers.add(e.rec, -1)
	l.endedGangs.count(e.rec, -1)
	ended := e.rec.State.Live() && !rec.State.Live()
	e.rec = rec
	l.workers.add(rec, 1)
	l.endedGangs.count(rec, 1)
	if ended {
		l.pushEnded(rec)
	}
}
