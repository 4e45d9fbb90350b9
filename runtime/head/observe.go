package head

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/runtime/dashboard"
	"github.com/atoll-run/atoll/runtime/events"
)

// ctlObs is what the controller records for operators: its Prometheus collectors (not
// registered here: the head registers them on its registry), the event log's sequence and
// the jobs' progress reports.
type ctlObs struct {
	events   *events.Log
	progress *dashboard.ProgressLog

	cycle         prometheus.Histogram
	wait          prometheus.Histogram
	commit        prometheus.Histogram
	txOps         prometheus.Histogram
	commitErrors  prometheus.Counter
	leaderChanges prometheus.Counter
	termRecords   *prometheus.CounterVec // records a new term read, by source (warm.go)
	pauses        prometheus.Counter
	preemptions   prometheus.Counter
	preemptCost   prometheus.Counter
	resizes       *prometheus.CounterVec
	saturations   prometheus.Counter
	busyRefusals  prometheus.Counter
	eventsTotal   *prometheus.CounterVec
	restarts      *prometheus.CounterVec
	endedDeleted  prometheus.Counter
	lastLeader    atomic.Uint64

	mu      sync.Mutex
	refused map[string]refusal // the last refusal event of each gang
}

// refusal is a gang's last refusal event.
type refusal struct {
	reason string
	at     time.Time
}

// RefusalQuiet is how long a gang's refusal for the same reason makes no new event (a
// driver that retries its spawn would otherwise fill the event log).
const RefusalQuiet = 30 * time.Second

// newRefusal reports whether a refusal is worth an event: the gang's first, one for another
// reason, or one after RefusalQuiet.
func (o *ctlObs) newRefusal(key, reason string, now time.Time) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if last, ok := o.refused[key]; ok && last.reason == reason && now.Sub(last.at) < RefusalQuiet {
		return false
	}
	if len(o.refused) >= 4096 {
		clear(o.refused)
	}
	o.refused[key] = refusal{reason, now}
	return true
}

func newCtlObs() *ctlObs {
	lat := prometheus.ExponentialBuckets(50e-6, 2, 18) // 50 µs .. 6.5 s
	o := &ctlObs{
		events:   events.NewLog(events.DefaultKeep),
		refused:  map[string]refusal{},
		progress: dashboard.NewProgressLog(2000, 256),
		cycle: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "atoll_schedule_cycle_seconds", Buckets: lat,
			Help: "Duration of the gang scheduler's cycles on the leader (placing the pending gangs)."}),
		wait: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "atoll_gang_wait_seconds", Buckets: prometheus.ExponentialBuckets(1e-3, 4, 12),
			Help: "Time a gang waited from submission (or from losing its machine) until the scheduler placed it."}),
		commit: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "atoll_paxos_commit_seconds", Buckets: lat,
			Help: "Duration of proposals through this head's Paxos replica until chosen and applied (the control plane's decisions and the clients' writes)."}),
		txOps: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "atoll_decision_transaction_ops", Buckets: prometheus.ExponentialBuckets(1, 4, 9),
			Help: "Operations of each transaction the leader's committer proposed (its decisions, grouped; at most 1,024 but for one decision larger alone)."}),
		commitErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "atoll_paxos_commit_errors_total",
			Help: "Proposals through this head that failed (not leader, timeout)."}),
		leaderChanges: prometheus.NewCounter(prometheus.CounterOpts{Name: "atoll_paxos_leader_changes_total",
			Help: "Changes of the Paxos leader this head has seen."}),
		termRecords: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "atoll_term_start_records_total",
			Help: "Machine, gang and worker records this head's new terms read: taken from the tables it kept decoded while it followed (source=warm), or decoded as it took office (source=decoded)."}, []string{"source"}),
		pauses: prometheus.NewCounter(prometheus.CounterOpts{Name: "atoll_head_pauses_total",
			Help: "Pauses of this head noticed while it led (a gap between two failure-detection sweeps over the pause threshold): after each, every machine got a fresh grace period."}),
		preemptions: prometheus.NewCounter(prometheus.CounterOpts{Name: "atoll_preemptions_total",
			Help: "Gangs preempted (stopped for another and queued again) by this head while it led."}),
		resizes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "atoll_gang_resizes_total",
			Help: "Elastic gangs' resizes taken, by direction."}, []string{"direction"}),
		saturations: prometheus.NewCounter(prometheus.CounterOpts{Name: "atoll_submissions_saturated_total",
			Help: "Gang submissions refused because the queue was at its bound (backpressure)."}),
		busyRefusals: prometheus.NewCounter(prometheus.CounterOpts{Name: "atoll_api_busy_refusals_total",
			Help: "Requests this head answered 503 because it served its bound of requests at once (max_inflight) for a second."}),
		preemptCost: prometheus.NewCounter(prometheus.CounterOpts{Name: "atoll_preemption_cost_gpu_seconds_total",
			Help: "GPU-seconds of work lost to preemptions (since the preempted gangs' last checkpoints)."}),
		eventsTotal: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "atoll_events_total",
			Help: "Events committed to the event log by this head while it led, by kind."}, []string{"kind"}),
		restarts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "atoll_gang_restarts_total",
			Help: "Gang restarts decided by this head while it led: after a worker failed, or elsewhere after a machine was lost."}, []string{"cause"}),
		endedDeleted: prometheus.NewCounter(prometheus.CounterOpts{Name: "atoll_ended_gangs_deleted_total",
			Help: "Ended gangs' records this head deleted while it led, past the newest --keep-ended-gangs."}),
	}
	for _, k := range []api.EventKind{api.EventGangPlaced, api.EventGangRunning, api.EventGangRestart, api.EventGangWaiting, api.EventGangFailed,
		api.EventGangStopped, api.EventGangRefused, api.EventMachineUp, api.EventMachineDown, api.EventMachineCordoned, api.EventMachineUncordoned, api.EventJobSubmitted, api.EventJobStopped} {
		o.eventsTotal.WithLabelValues(string(k))
	}
	o.restarts.WithLabelValues("worker_failed")
	o.restarts.WithLabelValues("machine_lost")
	return o
}

func (o *ctlObs) collectors() []prometheus.Collector {
	return []prometheus.Collector{o.cycle, o.wait, o.commit, o.txOps, o.commitErrors, o.leaderChanges, o.termRecords, o.pauses, o.preemptions, o.preemptCost, o.eventsTotal, o.restarts, o.resizes, o.saturations, o.busyRefusals, o.endedDeleted}
}

func (o *ctlObs) sawLeader(id uint64) {
	if id == 0 {
		return
	}
	if prev := o.lastLeader.Swap(id); prev != 0 && prev != id {
		o.leaderChanges.Inc()
	}
}

func (o *ctlObs) cycleTook(d time.Duration) { o.cycle.Observe(d.Seconds()) }
func (o *ctlObs) saturated()                { o.saturations.Inc() }
func (o *ctlObs) busy()                     { o.busyRefusals.Inc() }
func (o *ctlObs) gangWaited(d time.Duration) {
	if d >= 0 {
		o.wait.Observe(d.Seconds())
	}
}

func (o *ctlObs) commitTook(d time.Duration, err error) {
	if err != nil {
		o.commitErrors.Inc()
		return
	}
	o.commit.Observe(d.Seconds())
}

// committed counts the events of a committed decision.
func (o *ctlObs) committed(evs []api.Event) {
	for _, e := range evs {
		o.eventsTotal.WithLabelValues(string(e.Kind)).Inc()
		switch e.Kind {
		case api.EventGangRestart:
			o.restarts.WithLabelValues("worker_failed").Inc()
		case api.EventGangWaiting:
			o.restarts.WithLabelValues("machine_lost").Inc()
		}
	}
}

// ReportProgress records a job's report of a gang's progress (for the dashboard). Only
// the leader keeps them: a follower answers *paxos.NotLeaderError.
func (c *Controller) ReportProgress(p api.Progress) error {
	if err := p.Validate(); err != nil {
		return err
	}
	t, err := c.lockTerm()
	if err != nil {
		return err
	}
	e := t.gangs[p.Job+"/"+p.Gang]
	now := c.cfg.Clock()
	var uid string
	var gen int
	if e != nil {
		uid, gen = e.rec.UID, e.rec.Generation
	}
	c.mu.Unlock()
	if e == nil {
		return fmt.Errorf("%w: progress of gang %s/%s: no such gang", api.ErrNotFound, p.Job, p.Gang)
	}
	p.Time, p.UID, p.Generation = now, uid, gen
	c.obs.progress.Add(p)
	return nil
}

// leaderView is what only the leader knows: the machines' load reports and the pending
// gangs' reasons as the last scheduling cycle gave them. ok is false on a follower.
type leaderView struct {
	loads   map[string]api.LoadReport
	reasons map[string]string
	shares  map[string]float64 // queue -> use over fair share
}

func (c *Controller) leaderView() (leaderView, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := c.t
	if t == nil {
		return leaderView{}, false
	}
	v := leaderView{loads: c.liveLoads(), reasons: map[string]string{}, shares: map[string]float64{}}
	if t.sched != nil {
		for _, q := range t.conf.Queues {
			v.shares[q.Name] = t.sched.QueueShare(q.Name)
		}
	}
	for k, g := range t.gangs {
		if g.rec.State == api.GangPending && g.rec.Reason != "" {
			v.reasons[k] = g.rec.Reason
		}
	}
	return v, true
}

// timedProposals times the clients' proposals (POST /v1/propose) that this head's replica
// accepts (2xx) into atoll_paxos_commit_seconds.
func timedProposals(o *ctlObs, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w, code: http.StatusOK}
		next.ServeHTTP(sw, r)
		if sw.code/100 == 2 {
			o.commit.Observe(time.Since(start).Seconds())
		} else if sw.code != http.StatusMisdirectedRequest {
			o.commitErrors.Inc()
		}
	})
}

type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	w.code = code
	w.ResponseWriter.WriteHeader(code)
}

// gangField logs a gang ("job/gang") as the structured fields job and gang.
func gangField(key string) zap.Field {
	job, name, _ := strings.Cut(key, "/")
	return zap.Inline(gangRef{job, name})
}

type gangRef struct{ job, gang string }

func (g gangRef) MarshalLogObject(e zapcore.ObjectEncoder) error {
	e.AddString("job", g.job)
	e.AddString("gang", g.gang)
	return nil
}
