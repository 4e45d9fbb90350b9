package agent

import (
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/runtime/authz"
	"github.com/atoll-run/atoll/runtime/dashboard"
)

// agentObs is the agent's Prometheus metrics: its registry (the object store's and the
// transfer plane's counters are registered on it too, labelled node=<machine>), its
// counters and a collector of its state at each scrape.
type agentObs struct {
	reg    *prometheus.Registry
	starts prometheus.Counter
	exits  *prometheus.CounterVec
	last   api.Load // the last load sample (under Agent.mu)
}

func newAgentObs(reg *prometheus.Registry) *agentObs {
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	o := &agentObs{reg: reg,
		starts: prometheus.NewCounter(prometheus.CounterOpts{Name: "atoll_agent_worker_starts_total", Help: "Worker processes this agent started."}),
		exits: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "atoll_agent_worker_exits_total",
			Help: "Workers that exited without being asked to (a crash, a kill, an error), by whether a restart can help."}, []string{"permanent"}),
	}
	o.exits.WithLabelValues("false")
	o.exits.WithLabelValues("true")
	return o
}

// register registers the agent's collectors (once its store runs).
func (a *Agent) registerMetrics() {
	a.obs.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		a.obs.starts, a.obs.exits, &agentCollector{a: a})
}

var (
	descWorkers   = prometheus.NewDesc("atoll_agent_workers", "Workers this agent runs (started or starting).", nil, nil)
	descGPUs      = prometheus.NewDesc("atoll_agent_gpus", "This machine's GPUs by state (held by a worker, free).", []string{"state"}, nil)
	descLoad      = prometheus.NewDesc("atoll_agent_load", "This machine's last load sample in [0, 1] (gpu: measured by NVML, or the share held by workers on simulated GPUs).", []string{"resource"}, nil)
	descStore     = prometheus.NewDesc("atoll_agent_object_store_bytes", "This machine's object store bytes by tier (shm: shared memory, recycled memory included; recycled: the freed part of it kept for reuse; spill: only on disk; durable: with a durable copy on disk).", []string{"tier"}, nil)
	descStoreCap  = prometheus.NewDesc("atoll_agent_object_store_capacity_bytes", "This machine's object store shared-memory capacity.", nil, nil)
	descStoreObjs = prometheus.NewDesc("atoll_agent_object_store_objects", "Objects in this machine's store by tier.", []string{"tier"}, nil)
	descIncarn    = prometheus.NewDesc("atoll_agent_incarnation", "This agent's registration count with the heads.", nil, nil)
)

type agentCollector struct{ a *Agent }

func (c *agentCollector) Describe(ch chan<- *prometheus.Desc) { prometheus.DescribeByCollect(c, ch) }

func (c *agentCollector) Collect(ch chan<- prometheus.Metric) {
	a := c.a
	g := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	a.mu.Lock()
	workers, held := len(a.workers), a.heldGPUsLocked()
	l, inc := a.obs.last, a.incarnation
	a.mu.Unlock()
	g(descWorkers, float64(workers))
	g(descGPUs, float64(held), "held")
	g(descGPUs, float64(max(0, len(a.cfg.Spec.GPUs)-held)), "free")
	g(descLoad, l.CPU, "cpu")
	g(descLoad, l.Mem, "mem")
	g(descLoad, l.Net, "net")
	g(descLoad, l.GPU, "gpu")
	st := a.node.Store.Stats()
	g(descStore, float64(st.HotBytes), "shm")
	g(descStore, float64(st.ColdBytes), "spill")
	g(descStore, float64(st.Recycled), "recycled")
	g(descStore, float64(st.DurableBytes), "durable")
	g(descStoreCap, float64(st.Capacity))
	g(descStoreObjs, float64(st.HotObjects), "shm")
	g(descStoreObjs, float64(st.ColdObjects), "spill")
	g(descIncarn, float64(inc))
}

// storeUsage is the store and transfer plane use for the load report.
func (a *Agent) storeUsage() *api.StoreUsage {
	st := a.node.Store.Stats()
	u := &api.StoreUsage{HotBytes: st.HotBytes, ColdBytes: st.ColdBytes, CapacityBytes: st.Capacity, Objects: st.Objects}
	if m := a.node.Metrics; m != nil {
		u.ServedBytes, u.PulledBytes = counterValue(m.BytesServed), counterValue(m.BytesPulled)
	}
	return u
}

func counterValue(c prometheus.Counter) int64 {
	var m dto.Metric
	if c == nil || c.Write(&m) != nil || m.Counter == nil {
		return 0
	}
	return int64(m.Counter.GetValue())
}

// serveMetrics answers GET /metrics to the bearers of the dashboard token (read-only) or
// of the cluster token (an agent with a scoped credential has the heads review it).
func (a *Agent) serveMetrics(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet || !dashboard.Bearer(r, a.keys.dashboard, a.keys.admin) && !a.adminBearer(r) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="atoll"`)
		writeJSON(w, http.StatusUnauthorized, api.ErrorBody{Error: "unauthenticated: /metrics needs the dashboard token (or the cluster token) as a bearer token", Kind: "unauthenticated"})
		return
	}
	promhttp.HandlerFor(a.obs.reg, promhttp.HandlerOpts{ErrorLog: zap.NewStdLog(a.log.Named("metrics")), Registry: a.obs.reg}).ServeHTTP(w, r)
}

// Registry is the agent's Prometheus registry (served on /metrics).
func (a *Agent) Registry() *prometheus.Registry { return a.obs.reg }

// workerField logs a worker as the structured fields job, gang, rank and generation.
func workerField(s api.WorkerSpec) zap.Field { return zap.Inline(workerRef{s}) }

type workerRef struct{ s api.WorkerSpec }

func (w workerRef) MarshalLogObject(e zapcore.ObjectEncoder) error {
	e.AddString("job", w.s.Job)
	e.AddString("gang", w.s.Gang)
	e.AddInt("rank", w.s.Rank)
	e.AddInt("generation", w.s.Generation)
	return nil
}

// adminBearer reports whether a request without the cluster secret at hand carries the
// cluster token: an agent on a scoped credential asks the heads (its authenticator).
func (a *Agent) adminBearer(r *http.Request) bool {
	bearer, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || a.keys.admin != "" || a.authn == nil {
		return false
	}
	id, err := a.authn.Authenticate(bearer, nil) // the principal the token names, not a certificate's
	return err == nil && id.Principal.Role == authz.RoleAdmin
}
