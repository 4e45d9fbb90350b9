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
	job, cluster := spec.Workers, spec.Workers
	for key, e := range t.gangs {
		if !e.rec.State.Live() || key == spec.Key() {
			continue
		}
		cluster += e.rec.Spec.Workers
		if e.rec.Spec.Job == spec.Job {
			job += e.rec.Spec.Workers
		}
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
