package head

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/pprof"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/atoll-run/atoll/internal/pki"
	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/runtime/authz"
	"github.com/atoll-run/atoll/store/meta"
	"github.com/atoll-run/atoll/store/meta/metaserver"
	"github.com/atoll-run/atoll/store/paxos"
)

// Request bounds of the API.
const (
	// DefaultRequestTimeout bounds a request that names no timeout of its own.
	DefaultRequestTimeout = 10 * time.Second
	// MaxWatchWait bounds how long a watch waits for its first event.
	MaxWatchWait = 30 * time.Second
	// MaxBodyBytes bounds a request body.
	MaxBodyBytes = 4 << 20
	// maxWatchEvents bounds the events of one watch answer.
	maxWatchEvents = 4096
)

// API is the head's HTTP API: the metadata log's client API (store/meta's Handler) plus the
// control plane's. Every request needs a token (the cluster token, or a scoped one) as a
// bearer token, and is decided by its caller's role (authz.go). Control
// requests reach the controller only on the leader; followers answer 421 with the leader's
// id, which api.Client follows.
type API struct {
	ctl   *Controller
	rep   *paxos.Replica
	sm    *metaserver.StateMachine
	meta  *metaserver.Handler
	token string
	log   *zap.Logger
	heads func() []api.HeadInfo
	mux   *http.ServeMux
	// ca, when set, signs processes' certificates (POST /v1/certs), and every other
	// request must come with a client certificate of the cluster CA (mutual TLS).
	au *authority
	// dashboard is the dashboard's URL with its token, for the cluster status (nil: none).
	dashboard func() string
	// authn authenticates requests, state answers what decisions read, limit bounds the
	// audit events (authz.go).
	authn *authz.Authenticator
	state stateView
	limit auditLimiter
	// placed filters the gangs table for one machine's agent (machine=NAME on /v1/list and
	// /v1/watch of gangs/: api.GangConcerns).
	placed *api.GangFilter
	// inflight bounds the requests served at once (nil: no bound); one over it waits up
	// to inflightWait for a slot, then is answered 503 (ServeHTTP, admit).
	inflight     chan struct{}
	inflightWait time.Duration
	// reportSlots are the machines' load reports' own (as many as inflight's).
	reportSlots chan struct{}
	// hub wakes the agents' filtered watches (placedhub.go; nil: they wait on the state
	// machine like any watch).
	hub *placedHub
}

// RequireClientCerts turns mutual TLS on for the API: a process holding the token gets a
// certificate signed by ca (POST /v1/certs), and every other request must present one.
// Serve the API with the CA's identity's BootstrapServer configuration.
func (a *API) RequireClientCerts(ca *pki.CA) {
	a.au, _ = newAuthority(ca, "", a.log) // without a directory it cannot fail
}

// NewAPI returns the API of one head.
func NewAPI(ctl *Controller, rep *paxos.Replica, sm *metaserver.StateMachine, token string, heads func() []api.HeadInfo, log *zap.Logger) *API {
	if log == nil {
		log = zap.NewNop()
	}
	a := &API{ctl: ctl, rep: rep, sm: sm, token: token, heads: heads, log: log.Named("api"), placed: api.NewGangFilter(),
		meta:  &metaserver.Handler{Replica: rep, SM: sm, Token: token, Logger: log},
		authn: newAuthenticator(token, sm), state: stateView{sm: sm}}
	a.meta.Authenticated = func(r *http.Request) bool { _, ok := identityOf(r); return ok }
	a.meta.Readable = a.readable
	m := http.NewServeMux()
	for _, p := range []string{"/v1/get", "/v1/range", "/v1/status", "/v1/members/"} {
		m.Handle(p, a.meta)
	}
	a.authRoutes(m) // POST /v1/certs, /v1/txn, /v1/tokens, GET /v1/whoami
	m.Handle("/v1/propose", timedProposals(ctl.obs, a.meta))
	m.HandleFunc("GET /v1/list", a.list)
	m.HandleFunc("GET /v1/watch", a.watch)
	m.HandleFunc("GET /v1/cluster", a.cluster)
	m.HandleFunc("POST /v1/machines/register", post(a, func(ctx context.Context, m api.Machine) (any, error) { return ctl.RegisterMachine(ctx, m) }))
	m.HandleFunc("POST /v1/machines/load", post(a, func(_ context.Context, r api.LoadReport) (any, error) {
		ans, err := ctl.ReportLoad(r)
		if err == nil && a.au != nil {
			ans.Trust = a.au.tag() // the agent asks for the CAs only when this changes
		}
		return ans, err
	}))
	m.HandleFunc("POST /v1/jobs", postReq(a, func(r *http.Request, j api.Job) (any, error) {
		j.Principal = principalOf(r) // the job is its submitter's (authz.go)
		return ctl.SubmitJob(a.ctx(r), j)
	}))
	m.HandleFunc("POST /v1/jobs/stop", func(w http.ResponseWriter, r *http.Request) {
		a.answer(w, r, nil, a.ctl.StopJob(a.ctx(r), r.URL.Query().Get("job")))
	})
	m.HandleFunc("POST /v1/gangs", post(a, func(ctx context.Context, s api.GangSpec) (any, error) { return ctl.SpawnGang(ctx, s) }))
	m.HandleFunc("POST /v1/gangs/stop", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		a.answer(w, r, nil, a.ctl.StopGang(a.ctx(r), q.Get("job"), q.Get("gang")))
	})
	m.HandleFunc("POST /v1/services", post(a, func(ctx context.Context, s api.ServiceSpec) (any, error) { return ctl.SpawnService(ctx, s) }))
	m.HandleFunc("POST /v1/services/stop", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		a.answer(w, r, nil, a.ctl.StopService(a.ctx(r), q.Get("job"), q.Get("service")))
	})
	m.HandleFunc("POST /v1/services/load", post(a, func(_ context.Context, l api.ServiceLoad) (any, error) { return nil, ctl.ReportServiceLoad(l) }))
	m.HandleFunc("POST /v1/workers/ready", post(a, func(ctx context.Context, wk api.Worker) (any, error) { return nil, ctl.WorkerReady(ctx, wk) }))
	m.HandleFunc("POST /v1/workers/exited", post(a, func(ctx context.Context, x api.WorkerExit) (any, error) { return nil, ctl.WorkerExited(ctx, x) }))
	m.HandleFunc("POST /v1/gangs/yield", post(a, func(ctx context.Context, y api.Yield) (any, error) { return nil, ctl.Yield(ctx, y) }))
	m.HandleFunc("POST /v1/gangs/world", post(a, func(ctx context.Context, w api.WorldChange) (any, error) { return nil, ctl.TakeWorld(ctx, w) }))
	m.HandleFunc("POST /v1/gangs/checkpointed", post(a, func(_ context.Context, r api.CheckpointReport) (any, error) { return nil, ctl.CheckpointReported(r) }))
	m.HandleFunc("POST /v1/costs", post(a, func(_ context.Context, r api.CostReport) (any, error) { return nil, ctl.ObserveCost(r) }))
	m.HandleFunc("POST /v1/machines/drain", postReq(a, func(r *http.Request, d api.DrainRequest) (any, error) {
		return nil, ctl.DrainAs(a.ctx(r), caller(r, d.By), d)
	}))
	m.HandleFunc("POST /v1/machines/undrain", postReq(a, func(r *http.Request, u api.UndrainRequest) (any, error) {
		return nil, ctl.Undrain(a.ctx(r), u.Machine, caller(r, u.By))
	}))
	m.HandleFunc("POST /v1/pools/interrupt", post(a, func(_ context.Context, r api.InterruptRequest) (any, error) { return nil, ctl.InjectInterruption(r) }))
	m.HandleFunc("GET /v1/scheduler", func(w http.ResponseWriter, r *http.Request) {
		conf, err := a.ctl.SchedulerConfig()
		a.answer(w, r, conf, err)
	})
	m.HandleFunc("PUT /v1/scheduler", post(a, func(ctx context.Context, conf api.SchedulerConfig) (any, error) {
		return ctl.SetSchedulerConfig(ctx, conf)
	}))
	m.HandleFunc("POST /v1/progress", post(a, func(_ context.Context, p api.Progress) (any, error) { return nil, ctl.ReportProgress(p) }))
	// Go's profiles of this head (go tool pprof -http : with the token as a bearer header),
	// behind the same credentials as every route: the cluster token, and under mutual TLS a
	// certificate of the cluster CA.
	m.HandleFunc("GET /debug/pprof/", pprof.Index)
	m.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	m.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	m.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
	a.mux = m
	return a
}

// ServeHTTP implements http.Handler: each request is authenticated and decided against
// runtime/authz's table before it is served (authz.go).
func (a *API) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if a.inflight != nil && r.URL.Path != "/v1/watch" {
		// Machines' load reports, their heartbeats, have slots of their own: shed behind a
		// burst of other requests, they would have the leader declare live machines dead
		// (as the Kubernetes API server's priority levels keep node leases apart).
		slots := a.inflight
		if r.URL.Path == "/v1/machines/load" {
			slots = a.reportSlots
		}
		if !a.admit(r, slots) {
			if slots == a.reportSlots {
				a.shedReport(r)
			}
			if r.Context().Err() == nil {
				writeJSON(w, http.StatusServiceUnavailable, api.ErrorBody{Kind: "unavailable", RetryAfterMS: 100,
					Error: fmt.Sprintf("this head is busy: %d requests in flight, the bound (max_inflight); retry", cap(slots))})
			}
			return
		}
		slot := &apiSlot{slots: slots}
		defer slot.release()
		r = r.WithContext(context.WithValue(r.Context(), slotKey{}, slot))
	}
	a.serveAuthorized(w, r)
}

// shedReport keeps a load report this head had no slot for as a heartbeat of the machine
// its client certificate names (an agent's certificate of one machine, signed by the
// cluster CA; its credential not revoked); its body is not read. The report is still
// answered busy. After a failover at 2,000 machines the new leader shed about 1,000
// reports in 20 s, and counting their silence against the machines declared live ones
// dead.
func (a *API) shedReport(r *http.Request) {
	g, ok, err := authz.ParseGrant(pki.GrantOf(pki.PeerCert(r.TLS)))
	if err != nil || !ok || g.Principal.Role != authz.RoleAgent || g.Principal.Machine == authz.AnyMachine {
		return
	}
	if a.authn != nil && a.authn.Revoked != nil && g.TokenID != "" && a.authn.Revoked(g.TokenID) {
		return
	}
	a.ctl.heardShed(g.Principal.Machine)
}

// slotKey carries a request's slot of the API's bound (apiSlot) in its context.
type slotKey struct{}

// apiSlot is a request's slot of the API's bound on requests served at once. A request
// that waits for the log to commit its decisions gives it back while it waits (await):
// the bound is on requests that use the CPU, and a submission waiting on a commit uses
// none (with the slot held for the whole request, 32 slots on two cores made the
// scenario tests' clusters three times slower).
type apiSlot struct {
	once  sync.Once
	slots chan struct{}
}

func (s *apiSlot) release() { s.once.Do(func() { <-s.slots }) }

// releaseSlot gives back the slot of the request ctx belongs to, if it holds one.
func releaseSlot(ctx context.Context) {
	if s, ok := ctx.Value(slotKey{}).(*apiSlot); ok {
		s.release()
	}
}

// admit takes one of slots, waiting up to inflightWait for one.
// Requests over the bound wait blocked, not runnable: a head serving thousands of agents
// keeps its goroutines' run queue short, so that its Paxos replica's goroutines run when
// due (at 2,000 machines, with every request served at once, wakeups waited up to 1.9 s to
// run and the leader lost its followers' acknowledgments, over and over). Long polls
// (/v1/watch) wait on the log, not the CPU, and are not counted.
func (a *API) admit(r *http.Request, slots chan struct{}) bool {
	select {
	case slots <- struct{}{}:
		return true
	default:
	}
	t := time.NewTimer(a.inflightWait)
	defer t.Stop()
	select {
	case slots <- struct{}{}:
		return true
	case <-t.C:
		a.ctl.obs.busy()
		return false
	case <-r.Context().Done():
		return false
	}
}

// DefaultMaxInflight is the API's bound on requests served at once (long polls aside), for
// GOMAXPROCS procs: 16 per core, at least 32.
func DefaultMaxInflight(procs int) int { return max(32, 16*procs) }

type ctxKey struct{}

// ctx is the request's context with a server-side deadline (timeout_ms, or the default).
func (a *API) ctx(r *http.Request) context.Context {
	if ctx, ok := r.Context().Value(ctxKey{}).(context.Context); ok {
		return ctx
	}
	return r.Context()
}

func withDeadline(r *http.Request) (*http.Request, context.CancelFunc) {
	d := DefaultRequestTimeout
	if ms, err := strconv.Atoi(r.URL.Query().Get("timeout_ms")); err == nil && ms > 0 {
		d = min(time.Duration(ms)*time.Millisecond, 5*time.Minute)
	}
	ctx, cancel := context.WithTimeout(r.Context(), d)
	return r.WithContext(context.WithValue(ctx, ctxKey{}, ctx)), cancel
}

// caller names who makes a request: the name the caller declares, after the name of its
// certificate when it has one ("cli-admin: alice@host").
func caller(r *http.Request, declared string) string {
	if len(declared) > 200 {
		declared = declared[:200]
	}
	if cn, ok := pki.Verified(r.TLS); ok {
		if declared == "" {
			return cn
		}
		return cn + ": " + declared
	}
	return declared
}

// bounded is a request whose free-form fields have limits (api.MaxKindBytes and the
// others): it is refused with a 400 naming the field before anything is decided.
type bounded interface{ CheckBounds() error }

// post decodes a JSON body into In, checks its bounds, calls fn, and answers its result.
func post[In any](a *API, fn func(context.Context, In) (any, error)) http.HandlerFunc {
	return postReq(a, func(r *http.Request, in In) (any, error) { return fn(a.ctx(r), in) })
}

// postReq is post for a handler that reads the request too (its caller).
func postReq[In any](a *API, fn func(*http.Request, In) (any, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		r, cancel := withDeadline(r)
		defer cancel()
		body, err := readBody(w, r, MaxBodyBytes)
		if err != nil {
			a.answer(w, r, nil, err)
			return
		}
		var in In
		if err := json.Unmarshal(body, &in); err != nil {
			a.answer(w, r, nil, fmt.Errorf("%w: %s: %v", api.ErrInvalid, r.URL.Path, err))
			return
		}
		if b, ok := any(&in).(bounded); ok {
			if err := b.CheckBounds(); err != nil {
				a.answer(w, r, nil, fmt.Errorf("%s: %w", r.URL.Path, err))
				return
			}
		}
		out, err := fn(r, in)
		a.answer(w, r, out, err)
	}
}

// readBody reads a request body of at most limit bytes, never more: a body declared or
// found larger is refused with api.ErrTooLarge (413), naming the limit.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	if r.ContentLength > limit {
		return nil, fmt.Errorf("%w: %s: a body of %d bytes is over this head's limit of %d bytes", api.ErrTooLarge, r.URL.Path, r.ContentLength, limit)
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return nil, fmt.Errorf("%w: %s: the body is over this head's limit of %d bytes", api.ErrTooLarge, r.URL.Path, limit)
	case err != nil:
		return nil, fmt.Errorf("%w: %s: body unreadable: %v", api.ErrInvalid, r.URL.Path, err)
	}
	return body, nil
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// answer writes out (200, or 204 when nil) or the error with its status and kind.
func (a *API) answer(w http.ResponseWriter, r *http.Request, out any, err error) {
	if err == nil {
		if out == nil {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		writeJSON(w, http.StatusOK, out)
		return
	}
	var nl *paxos.NotLeaderError
	if errors.As(err, &nl) && nl.Leader != 0 {
		writeJSON(w, http.StatusMisdirectedRequest, api.ErrorBody{Error: err.Error(), Leader: nl.Leader})
		return
	}
	var mnl *meta.NotLeaderError // a meta.Client's view of the same answer
	if errors.As(err, &mnl) && mnl.Leader != 0 {
		writeJSON(w, http.StatusMisdirectedRequest, api.ErrorBody{Error: err.Error(), Leader: mnl.Leader})
		return
	}
	code, body := api.Body(err)
	if body.Kind == "" && (paxos.IsRetryable(err) || errors.Is(err, context.DeadlineExceeded)) {
		code, body.Kind = http.StatusServiceUnavailable, "unavailable"
	}
	if code == http.StatusInternalServerError {
		a.log.Warn("request failed", zap.String("path", r.URL.Path), zap.Error(err))
	}
	if body.RetryAfterMS > 0 {
		w.Header().Set("Retry-After", strconv.FormatInt((body.RetryAfterMS+999)/1000, 10))
	}
	writeJSON(w, code, body)
}

// list answers a linearizable read of a prefix with the revision to watch from.
func (a *API) list(w http.ResponseWriter, r *http.Request) {
	r, cancel := withDeadline(r)
	defer cancel()
	prefix := r.URL.Query().Get("prefix")
	if _, ok := meta.OfKey(prefix); !ok && !strings.HasSuffix(prefix, "/") {
		a.answer(w, r, nil, fmt.Errorf("%w: prefix %q is not under a table", api.ErrInvalid, prefix))
		return
	}
	limit := 0 // every key
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			a.answer(w, r, nil, fmt.Errorf("%w: list limit %q: want a positive integer", api.ErrInvalid, v))
			return
		}
		limit = n
	}
	if err := a.rep.Read(a.ctx(r)); err != nil {
		a.answer(w, r, nil, err)
		return
	}
	machine, err := a.placedOn(r, prefix)
	if err != nil {
		a.answer(w, r, nil, err)
		return
	}
	rev := a.sm.Revision() // read before the range: a watch from it may repeat, never miss
	kvs := metaserver.Keep(a.sm.Range(prefix), a.readable(r))
	if machine != "" {
		kept := kvs[:0]
		for _, kv := range kvs {
			if a.placed.Concerns(kv, machine) {
				kept = append(kept, kv)
			}
		}
		kvs = kept
	}
	more := limit > 0 && len(kvs) > limit
	if more {
		kvs = kvs[:limit]
	}
	a.answer(w, r, api.Listing{Revision: rev, KVs: kvs, More: more}, nil)
}

// placedOn is a request's machine=NAME: the gangs table as that machine's agent needs it
// (api.GangConcerns). It is refused on another prefix than the gangs table's.
func (a *API) placedOn(r *http.Request, prefix string) (string, error) {
	m := r.URL.Query().Get("machine")
	if m == "" {
		return "", nil
	}
	if prefix != api.TableGangs {
		return "", fmt.Errorf("%w: machine=%q filters the gangs table (prefix %q), not prefix %q", api.ErrInvalid, m, api.TableGangs, prefix)
	}
	if err := api.CheckName("machine", m); err != nil {
		return "", err
	}
	return m, nil
}

// watch answers the events after rev under prefix, waiting up to wait_ms for the first.
// Any replica answers: revisions are the log's.
func (a *API) watch(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	prefix := q.Get("prefix")
	rev, err := strconv.ParseInt(q.Get("rev"), 10, 64)
	if err != nil || rev < 0 {
		a.answer(w, r, nil, fmt.Errorf("%w: watch rev %q: want a revision >= 0", api.ErrInvalid, q.Get("rev")))
		return
	}
	machine, err := a.placedOn(r, prefix)
	if err != nil {
		a.answer(w, r, nil, err)
		return
	}
	wait := time.Second
	if ms, err := strconv.Atoi(q.Get("wait_ms")); err == nil && ms >= 0 {
		wait = min(time.Duration(ms)*time.Millisecond, MaxWatchWait)
	}
	ctx, cancel := context.WithTimeout(r.Context(), wait)
	defer cancel()
	keep := a.readable(r)
	var events []meta.Event
	var covered int64
	filtered := false
	for {
		if machine != "" && a.hub != nil {
			// An agent's watch scans when an event may concern its machine (placedHub),
			// not at every commit, and copies only the events that concern it.
			events, covered, err = a.placedEvents(prefix, rev, machine, keep)
			filtered = true
			if err == nil && len(events) == 0 {
				woken, stop := a.hub.wait(machine, covered)
				select {
				case <-woken:
				case <-ctx.Done():
				}
				stop()
				if ctx.Err() == nil {
					rev = covered
					continue
				}
			}
		} else {
			events, covered, err = a.sm.EventsSince(ctx, prefix, rev, maxWatchEvents)
		}
		if errors.Is(err, meta.ErrCompacted) {
			writeJSON(w, http.StatusOK, api.WatchAnswer{Revision: rev, Compacted: true})
			return
		}
		if err != nil {
			a.answer(w, r, nil, err)
			return
		}
		if r.Context().Err() != nil {
			return
		}
		if !filtered && (keep != nil || machine != "") {
			kept := events[:0:0]
			for _, ev := range events {
				if (keep == nil || keep(ev.KV.Key)) && (machine == "" || ev.Type == meta.EventDelete || a.placed.Concerns(ev.KV, machine)) {
					kept = append(kept, ev)
				}
			}
			events = kept
		}
		// A filtered watch waits on for the events that concern its machine: answering
		// every other machine's change at once would have each agent ask again for each.
		if len(events) > 0 || machine == "" || ctx.Err() != nil || covered <= rev {
			break
		}
		rev = covered
	}
	if events == nil {
		events = []meta.Event{}
	}
	writeJSON(w, http.StatusOK, api.WatchAnswer{Revision: covered, Events: events})
}

// placedEvents is the events of prefix after rev that machine's agent may read (keep) and
// that concern it (api.GangConcerns), and the revision they cover: at most maxWatchEvents,
// whole revisions. It reads the history at the revisions the placedHub listed for the
// machine only, without a copy (every woken machine used to scan every event since its
// last answer: a third of the leader's CPU while 2,000 machines took 21,000 gangs); where
// the hub's lists cannot say (a watch from before what they hold), the whole history
// after rev.
func (a *API) placedEvents(prefix string, rev int64, machine string, keep func(string) bool) ([]meta.Event, int64, error) {
	revs, covered, listed := a.hub.concerning(machine, rev)
	if listed && len(revs) == 0 {
		return nil, covered, nil
	}
	view, all, err := a.sm.EventsView(rev)
	if err != nil {
		return nil, rev, err
	}
	if !listed {
		covered = all
	}
	var out []meta.Event
	concerns := func(ev meta.Event) bool {
		return strings.HasPrefix(ev.KV.Key, prefix) && (keep == nil || keep(ev.KV.Key)) && (ev.Type == meta.EventDelete || a.placed.Concerns(ev.KV, machine))
	}
	if !listed {
		for _, ev := range view {
			if len(out) >= maxWatchEvents && ev.Revision != out[len(out)-1].Revision {
				return out, out[len(out)-1].Revision, nil
			}
			if concerns(ev) {
				out = append(out, ev)
			}
		}
		return out, covered, nil
	}
	for _, r := range revs {
		if len(out) >= maxWatchEvents {
			return out, out[len(out)-1].Revision, nil
		}
		i := sort.Search(len(view), func(i int) bool { return view[i].Revision >= r })
		for ; i < len(view) && view[i].Revision == r; i++ {
			if concerns(view[i]) {
				out = append(out, view[i])
			}
		}
		view = view[i:]
	}
	return out, covered, nil
}

// cluster answers the cluster's status (at the leader).
func (a *API) cluster(w http.ResponseWriter, r *http.Request) {
	st, err := a.ctl.Status()
	if err != nil {
		a.answer(w, r, nil, err)
		return
	}
	rs := a.rep.Status()
	st.Leader = rs.Leader
	if a.heads != nil {
		st.Heads = a.heads()
		for i := range st.Heads {
			st.Heads[i].Leader = st.Heads[i].ID == rs.Leader
		}
	}
	if a.dashboard != nil {
		st.Dashboard = a.dashboard()
	}
	a.answer(w, r, st, nil)
}
