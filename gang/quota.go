package gang

import "time"

// quotaPlugin is the PreFilter of quota admission (Kueue-like): a gang is admitted only
// while its queue's use plus the gang's GPUs stays within the queue's quota.
type quotaPlugin struct{}

func (quotaPlugin) Name() string { return PluginQuota }

func (quotaPlugin) PreFilter(_ Handle, _ *CycleState, g *QueuedGang, _ time.Time) *Status {
	q := g.g.q
	if q.quota <= 0 {
		return nil
	}
	need := int64(g.Request.Min) * int64(g.Request.Member.TotalMilli())
	if q.usedMilli+need > int64(q.quota)*Milli {
		return NewStatus(Unschedulable, WaitQuota, "queue quota exhausted")
	}
	return nil
}
