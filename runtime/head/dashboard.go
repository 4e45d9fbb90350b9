package head

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"

	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/runtime/dashboard"
	"github.com/atoll-run/atoll/runtime/member"
	"github.com/atoll-run/atoll/store/meta/metaserver"
	"github.com/atoll-run/atoll/store/paxos"
)

// Observation of a head: the dashboard (/ui/), Prometheus' /metrics, and the samples
// behind the dashboard's plots.
const (
	// SampleInterval is how often a head samples the cluster for the dashboard's plots.
	SampleInterval = time.Second
	// sampleBudget: a head builds a new state for its plots once the last one's cost is
	// at most 1/sampleBudget of the time since it was built.
	sampleBudget = 20
	// SeriesLength is how many samples a head keeps (an hour).
	SeriesLength = 3600
	// forwardedHeader marks a dashboard read a follower forwarded to the leader (never
	// forwarded again).
	forwardedHeader = "X-Atoll-Forwarded"
)

// observer serves a head's dashboard and metrics. Every head serves them: the dashboard's
// reads are answered by the leader (a follower forwards them, and answers from its own
// copy of the log when the leader cannot be reached); /metrics answers what this head
// knows (the log's tables, which every head has, and what only the leader hears while it
// leads).
type observer struct {
	h      *Head
	log    *zap.Logger
	reg    *prometheus.Registry
	series *dashboard.Series
	token  string // the dashboard's read-only token
	ui     http.Handler

	stop     chan struct{}
	stopOnce sync.Once
	trOnce   sync.Once
	tr       http.RoundTripper // to the leader (proxyTransport)
	done     chan struct{}

	// The decoded machines, gangs and workers of the last sample, reused while unchanged.
	machines decodeCache[api.Machine]
	gangs    decodeCache[api.Gang]
	workers  decodeCache[api.Worker]
}

func newObserver(h *Head, reg *prometheus.Registry) *observer {
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	o := &observer{h: h, log: h.log.Named("observe"), reg: reg, series: dashboard.NewSeries(SeriesLength),
		token: api.DashboardToken(h.cfg.Token), stop: make(chan struct{}), done: make(chan struct{})}
	o.ui = dashboard.Handler(dashboard.Config{Token: o.token, Source: o, Logger: h.log})
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reg.MustRegister(h.ctl.obs.collectors()...)
	reg.MustRegister(&clusterCollector{o: o})
	go o.sampleLoop()
	return o
}

func (o *observer) close() {
	o.stopOnce.Do(func() { close(o.stop) })
	<-o.done
}

// dashboardURL is the dashboard's address on this head, with its token.
func (o *observer) dashboardURL() string {
	return o.h.addr + "/ui/?token=" + o.token
}

// routes puts the dashboard and /metrics beside the API (which checks the cluster token).
func (o *observer) routes(apiH http.Handler) http.Handler {
	m := http.NewServeMux()
	m.Handle("/ui", o.ui)
	m.Handle("/ui/", o.ui)
	m.HandleFunc("/ui/api/", o.forward)
	prom := promhttp.HandlerFor(o.reg, promhttp.HandlerOpts{ErrorLog: zap.NewStdLog(o.log), Registry: o.reg})
	m.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		if !dashboard.Bearer(r, o.token, string(o.h.cfg.Token)) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="atoll"`)
			writeJSON(w, http.StatusUnauthorized, api.ErrorBody{Error: "unauthenticated: /metrics needs the dashboard token (or the cluster token) as a bearer token", Kind: "unauthenticated"})
			return
		}
		prom.ServeHTTP(w, r)
	})
	m.Handle("/", apiH)
	return m
}

// proxyTransport reaches the leader's API: with this head's certificate when the cluster
// runs mutual TLS.
func (o *observer) proxyTransport() http.RoundTripper {
	o.trOnce.Do(func() {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		if o.h.id != nil {
			tr.TLSClientConfig = o.h.id.Client()
		}
		o.tr = tr
	})
	return o.tr
}

// leaderURL is the leader's API URL when another head leads and its address is known.
func (o *observer) leaderURL() string {
	st := o.h.rep.Status()
	if st.Leader == 0 || st.Leader == o.h.cfg.ID || o.h.ctl.Leading() {
		return ""
	}
	for _, hi := range o.h.heads() {
		if hi.ID == st.Leader && hi.Address != "" {
			return hi.Address
		}
	}
	if o.h.gossip != nil { // the heads announce their API address in their gossip tags
		if tags, ok := o.h.gossip.Tags(member.RoleHead)[fmt.Sprintf("head-%d", st.Leader)]; ok {
			return tags["api"]
		}
	}
	return ""
}

// forward answers a dashboard read at the leader, or here when this head leads, the leader
// is unknown or does not answer (the page then says which head served it).
func (o *observer) forward(w http.ResponseWriter, r *http.Request) {
	target := ""
	if r.Header.Get(forwardedHeader) == "" && dashboard.Bearer(r, o.token) {
		target = o.leaderURL()
	}
	if target == "" {
		o.ui.ServeHTTP(w, r)
		return
	}
	u, err := url.Parse(target)
	if err != nil {
		o.ui.ServeHTTP(w, r)
		return
	}
	p := &httputil.ReverseProxy{
		Transport: o.proxyTransport(),
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(u)
			pr.Out.Header.Set(forwardedHeader, strconv.FormatUint(o.h.cfg.ID, 10))
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			o.log.Debug("the leader did not answer a dashboard read; answering from this head", zap.String("leader", target), zap.Error(err))
			o.ui.ServeHTTP(w, r)
		},
	}
	ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
	defer cancel()
	p.ServeHTTP(w, r.WithContext(ctx))
}

// State implements dashboard.Source: the log's tables as this head has applied them, and
// what only the leader hears when this head leads.
func (o *observer) State(context.Context) (dashboard.State, error) {
	return o.state(), nil
}

func (o *observer) state() dashboard.State {
	sm := o.h.sm
	rs := o.h.rep.Status()
	in := dashboard.Inputs{Now: time.Now(), Leader: rs.Leader, ServedBy: o.h.cfg.ID, Revision: sm.Revision()}
	o.machines.decode(sm, api.TableMachines, &in.Machines)
	decode(sm, api.TableJobs, &in.Jobs)
	o.gangs.decode(sm, api.TableGangs, &in.Gangs)
	o.workers.decode(sm, api.TableWorkers, &in.Workers)
	decode(sm, api.TableCheckpoints, &in.Checkpoints)
	decode(sm, api.TableServices, &in.Services)
	if kv, ok := sm.Get(api.SchedulerConfigKey); ok {
		var conf api.SchedulerConfig
		if json.Unmarshal(kv.Value, &conf) == nil {
			in.Scheduler = &conf
		}
	}
	if v, ok := o.h.ctl.leaderView(); ok {
		in.Leading, in.Loads, in.Reasons, in.Shares = true, v.loads, v.reasons, v.shares
		in.Progress = o.h.ctl.obs.progress.Latest()
	}
	in.Heads = o.heads(rs.Leader)
	return dashboard.Build(in)
}

// heads lists the group's heads (Head.groupHeads), marking the leader.
func (o *observer) heads(leader uint64) []api.HeadInfo {
	out := o.h.groupHeads()
	for i := range out {
		out[i].Leader = out[i].ID == leader
	}
	return out
}

// decode reads every record of a table, skipping those that do not decode (a record of a
// newer version: the dashboard shows what it can).
func decode[T any](sm *metaserver.StateMachine, table string, out *[]T) {
	for _, kv := range sm.Range(table) {
		var v T
		if json.Unmarshal(kv.Value, &v) == nil {
			*out = append(*out, v)
		}
	}
}

// decodeCache keeps a table's records as a sample decoded them, by key and modification
// revision: a record that did not change since the last sample is not decoded again (at
// 1,000 machines, decoding every machine's topology spec every second was a third of
// the leader's CPU).
type decodeCache[T any] struct {
	mu sync.Mutex
	m  map[string]cachedRecord[T]
}

type cachedRecord[T any] struct {
	rev int64
	v   T
	ok  bool // it decoded
}

// decode appends the table's records to out, in key order, as decode does.
func (c *decodeCache[T]) decode(sm *metaserver.StateMachine, table string, out *[]T) {
	c.mu.Lock()
	defer c.mu.Unlock()
	kvs := sm.Range(table)
	next := make(map[string]cachedRecord[T], len(kvs))
	for _, kv := range kvs {
		e, hit := c.m[kv.Key]
		if !hit || e.rev != kv.ModRevision {
			e = cachedRecord[T]{rev: kv.ModRevision}
			e.ok = json.Unmarshal(kv.Value, &e.v) == nil
		}
		next[kv.Key] = e
		if e.ok {
			*out = append(*out, e.v)
		}
	}
	c.m = next
}

// Series implements dashboard.Source.
func (o *observer) Series(since int64) []dashboard.Sample { return o.series.Since(since) }

// Progress implements dashboard.Source.
func (o *observer) Progress(gang string, since int64) []api.Progress {
	return o.h.ctl.obs.progress.Of(gang, since)
}

// Events implements dashboard.Source, from this head's copy of the event log.
func (o *observer) Events(_ context.Context, job string, after int64, limit int) ([]api.Event, error) {
	var out []api.Event
	for _, kv := range o.h.sm.Range(api.TableEvents) {
		seq, err := api.EventSeq(kv.Key)
		if err != nil || seq <= after {
			continue
		}
		var e api.Event
		if json.Unmarshal(kv.Value, &e) != nil || (job != "" && e.Job != job) {
			continue
		}
		out = append(out, e)
	}
	if limit > 0 && len(out) > limit {
		out = out[:limit] // oldest first: the reader asks again after the last
	}
	return out, nil
}

// histTotals reads a histogram's sum and count.
func histTotals(h prometheus.Histogram) (float64, uint64) {
	var m dto.Metric
	if err := h.Write(&m); err != nil || m.Histogram == nil {
		return 0, 0
	}
	return m.Histogram.GetSampleSum(), m.Histogram.GetSampleCount()
}

// sampleLoop samples the cluster every SampleInterval for the plots: the state's figures,
// and over the interval the mean scheduling cycle, gang wait and commit, and the transfer
// plane's throughput.
func (o *observer) sampleLoop() {
	defer close(o.done)
	t := time.NewTicker(SampleInterval)
	defer t.Stop()
	type totals struct {
		sum   float64
		count uint64
	}
	hists := []prometheus.Histogram{o.h.ctl.obs.cycle, o.h.ctl.obs.wait, o.h.ctl.obs.commit}
	prev := make([]totals, len(hists))
	var prevXfer int64
	var prevAt time.Time
	var prevLeading bool
	var prevState dashboard.State // the last state built, at log revision prevRev
	var prevRev int64
	var sampled bool
	var builtAt time.Time // when the last state was built, and what it took
	var buildTook time.Duration
	for {
		select {
		case <-o.stop:
			return
		case <-t.C:
		}
		// A follower's figures come from the log alone: while its revision stands still,
		// the last sample holds (decoding the tables every second was most of an idle
		// follower's work).
		// On a large cluster a state costs its tens of milliseconds: a new one is built
		// only once the last one's cost is a twentieth of the time since (the dashboard
		// takes at most 5% of a core; 14% of a leader's CPU while 10,000 gangs were
		// submitted to 300 machines), and the last one holds between them.
		var st dashboard.State
		rev := o.h.sm.Revision()
		if sampled && ((!o.h.ctl.Leading() && rev == prevRev) || time.Since(builtAt) < sampleBudget*buildTook) {
			st = prevState
			st.Time = time.Now()
		} else {
			builtAt = time.Now()
			st, prevRev, sampled = o.state(), rev, true
			buildTook = time.Since(builtAt)
			prevState = st
		}
		s := dashboard.SampleOf(st)
		means := make([]*float64, len(hists))
		for i, h := range hists {
			sum, n := histTotals(h)
			if n > prev[i].count {
				v := 1000 * (sum - prev[i].sum) / float64(n-prev[i].count)
				means[i] = &v
			}
			prev[i] = totals{sum, n}
		}
		s.CycleMs, s.WaitMs, s.CommitMs = means[0], means[1], means[2]
		if st.Leading && prevLeading && st.Totals.TransferBytes >= prevXfer {
			if dt := st.Time.Sub(prevAt).Seconds(); dt > 0 {
				v := float64(st.Totals.TransferBytes-prevXfer) / dt
				s.TransferBps = &v
			}
		}
		prevXfer, prevAt, prevLeading = st.Totals.TransferBytes, st.Time, st.Leading
		o.series.Add(s)
	}
}

// clusterCollector exports the cluster's state, as this head has it, at each scrape.
type clusterCollector struct{ o *observer }

var (
	descGPUsTotal     = prometheus.NewDesc("atoll_gpus_total", "GPUs of the alive machines.", nil, nil)
	descGPUsAllocated = prometheus.NewDesc("atoll_gpus_allocated", "GPUs of the alive machines held by a live gang (whole, shared or MIG).", nil, nil)
	descGPUsFree      = prometheus.NewDesc("atoll_gpus_free", "GPUs of the alive machines held by no gang.", nil, nil)
	descGPUsShared    = prometheus.NewDesc("atoll_gpus_shared", "GPUs held by a share or a MIG slice.", nil, nil)
	descMachineGPUs   = prometheus.NewDesc("atoll_machine_gpus", "GPUs by machine, rack, NVLink island, model and state (allocated, free, or dead with their machine).",
		[]string{"machine", "rack", "island", "model", "state"}, nil)
	descMachines    = prometheus.NewDesc("atoll_machines", "Machines by state (alive, dead).", []string{"state"}, nil)
	descGangsPend   = prometheus.NewDesc("atoll_gangs_pending", "Gangs waiting for capacity.", nil, nil)
	descGangsRun    = prometheus.NewDesc("atoll_gangs_running", "Gangs whose every worker is ready.", nil, nil)
	descGangs       = prometheus.NewDesc("atoll_gangs", "Gangs by state.", []string{"state"}, nil)
	descQueueGangs  = prometheus.NewDesc("atoll_queue_gangs", "Gangs by queue: pending, or holding GPUs (starting, running, restarting).", []string{"queue", "state"}, nil)
	descQueueGPUs   = prometheus.NewDesc("atoll_queue_gpus_allocated", "GPUs held by the gangs of a queue.", []string{"queue"}, nil)
	descGangGPUs    = prometheus.NewDesc("atoll_gang_gpus", "GPUs a live gang holds.", []string{"job", "gang", "queue"}, nil)
	descGangRestart = prometheus.NewDesc("atoll_gang_restarts", "Restarts of a live gang (its record's count).", []string{"job", "gang"}, nil)
	descGangStep    = prometheus.NewDesc("atoll_gang_progress_step", "The step a gang's job last reported (leader).", []string{"job", "gang"}, nil)
	descGangMetric  = prometheus.NewDesc("atoll_gang_progress", "A metric a gang's job last reported, such as its loss (leader).", []string{"job", "gang", "metric"}, nil)
	descGangCkpt    = prometheus.NewDesc("atoll_gang_checkpoint_step", "The step of a gang's newest checkpoint.", []string{"job", "gang"}, nil)
	descLoad        = prometheus.NewDesc("atoll_machine_load", "A machine's load as its agent reports it, in [0, 1] (leader).", []string{"machine", "resource"}, nil)
	descStore       = prometheus.NewDesc("atoll_object_store_bytes", "Object store bytes by machine and tier (shm: shared memory, spill: disk) (leader).", []string{"machine", "tier"}, nil)
	descStoreCap    = prometheus.NewDesc("atoll_object_store_capacity_bytes", "A machine's object store shared-memory capacity (leader).", []string{"machine"}, nil)
	descXfer        = prometheus.NewDesc("atoll_machine_transfer_bytes_total", "Bytes a machine's transfer plane served and pulled since its agent started (leader).", []string{"machine", "direction"}, nil)
	descLeader      = prometheus.NewDesc("atoll_head_leader", "1 on the head whose control plane leads, else 0.", nil, nil)
	descLeaderID    = prometheus.NewDesc("atoll_head_leader_id", "The Paxos leader's replica id as this head knows it (0: none).", nil, nil)
	descRevision    = prometheus.NewDesc("atoll_metadata_revision", "The metadata log's revision this head has applied.", nil, nil)
	descDiskFull    = prometheus.NewDesc("atoll_head_disk_full", "1 while this head cannot write its log for a full disk (it has stepped down, and rejoins by itself when space frees), else 0.", nil, nil)
)

// Describe implements prometheus.Collector.
func (c *clusterCollector) Describe(ch chan<- *prometheus.Desc) { prometheus.DescribeByCollect(c, ch) }

// Collect implements prometheus.Collector.
func (c *clusterCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.o.state()
	g := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	t := st.Totals
	g(descGPUsTotal, float64(t.GPUs))
	g(descGPUsAllocated, float64(t.Allocated))
	g(descGPUsFree, float64(t.Free))
	g(descGPUsShared, float64(t.Shared))
	alive, dead := 0, 0
	for _, r := range st.Racks {
		for _, m := range r.Machines {
			if m.Alive {
				alive++
			} else {
				dead++
			}
			for _, is := range m.Islands {
				counts := map[[2]string]int{}
				for _, gpu := range is.GPUs {
					state := "free"
					switch {
					case !m.Alive:
						state = "dead"
					case len(gpu.Holders) > 0:
						state = "allocated"
					}
					counts[[2]string{gpu.Model, state}]++
				}
				for k, n := range counts {
					g(descMachineGPUs, float64(n), m.Name, strconv.Itoa(m.Rack), strconv.Itoa(is.ID), k[0], k[1])
				}
			}
			if m.Load != nil {
				g(descLoad, m.Load.CPU, m.Name, "cpu")
				g(descLoad, m.Load.Mem, m.Name, "mem")
				g(descLoad, m.Load.Net, m.Name, "net")
				g(descLoad, m.Load.GPU, m.Name, "gpu")
			}
			if s := m.Store; s != nil {
				g(descStore, float64(s.HotBytes), m.Name, "shm")
				g(descStore, float64(s.ColdBytes), m.Name, "spill")
				g(descStoreCap, float64(s.CapacityBytes), m.Name)
				ch <- prometheus.MustNewConstMetric(descXfer, prometheus.CounterValue, float64(s.ServedBytes), m.Name, "served")
				ch <- prometheus.MustNewConstMetric(descXfer, prometheus.CounterValue, float64(s.PulledBytes), m.Name, "pulled")
			}
		}
	}
	g(descMachines, float64(alive), "alive")
	g(descMachines, float64(dead), "dead")
	g(descGangsPend, float64(t.Pending))
	g(descGangsRun, float64(t.Running))
	for _, s := range []struct {
		state api.GangState
		n     int
	}{{api.GangPending, t.Pending}, {api.GangStarting, t.Starting}, {api.GangRunning, t.Running}, {api.GangRestarting, t.Restarting},
		{api.GangFailed, t.Failed}, {api.GangStopped, t.Stopped}} {
		g(descGangs, float64(s.n), string(s.state))
	}
	queues := st.Queues
	if len(queues) == 0 { // always a series to plot; none of a queue the operator did not name
		queues = append(queues, dashboard.Queue{Name: dashboard.DefaultQueue})
	}
	for _, q := range queues {
		g(descQueueGangs, float64(q.Pending), q.Name, "pending")
		g(descQueueGangs, float64(q.Running), q.Name, "running")
		g(descQueueGPUs, float64(q.GPUs), q.Name)
	}
	for _, gg := range st.Gangs {
		if !gg.State.Live() {
			continue
		}
		g(descGangGPUs, float64(gg.GPUs), gg.Job, gg.Name, gg.Queue)
		g(descGangRestart, float64(gg.Restarts), gg.Job, gg.Name)
		if gg.LastCheckpoint >= 0 {
			g(descGangCkpt, float64(gg.LastCheckpoint), gg.Job, gg.Name)
		}
		if p := gg.Progress; p != nil {
			g(descGangStep, float64(p.Step), gg.Job, gg.Name)
			for k, v := range p.Metrics {
				g(descGangMetric, v, gg.Job, gg.Name, k)
			}
		}
	}
	leading := 0.0
	if st.Leading {
		leading = 1
	}
	g(descLeader, leading)
	g(descLeaderID, float64(st.Leader))
	g(descRevision, float64(st.Revision))
	full := 0.0
	if _, err := c.o.h.rep.Fault(); errors.Is(err, paxos.ErrDiskFull) {
		full = 1
	}
	g(descDiskFull, full)
}

// Registry is the head's Prometheus registry (served on /metrics).
func (h *Head) Registry() *prometheus.Registry { return h.obs.reg }

// DashboardURL is the dashboard's address on this head, with its login token.
func (h *Head) DashboardURL() string { return h.obs.dashboardURL() }
