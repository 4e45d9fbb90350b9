package head

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/atoll-run/atoll/internal/pki"
	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/runtime/authz"
	"github.com/atoll-run/atoll/runtime/member"
	"github.com/atoll-run/atoll/store/meta"
	"github.com/atoll-run/atoll/store/meta/metaserver"
	"github.com/atoll-run/atoll/store/paxos"
)

// Least privilege on the head API. Every request is authenticated (authz.Authenticator:
// the cluster token is admin; a scoped token, or a certificate's grant, names a narrower
// principal), then its route's rule (routeRules) names the action of runtime/authz's table
// and reads what the request acts on, and authz.Decide decides. A refusal is a 403 that
// names the role and the action, and an audit event (`atoll events`); so is every success
// of an action only admin may take. A route without a rule is admin only
// (TestEveryRouteHasARule keeps the list whole).
//
// A follower that refuses a request answers 421 with the leader instead, as it does every
// write: the leader refuses it, and records the event, since only the leader commits
// events. Without a known leader the refusal is a 403 whose event is only logged.

// principalKey carries the authenticated identity in a request's context.
type principalKey struct{}

// identityOf is the identity the API authenticated a request as.
func identityOf(r *http.Request) (authz.Identity, bool) {
	id, ok := r.Context().Value(principalKey{}).(authz.Identity)
	return id, ok
}

// routeRule is how a route is decided.
type routeRule struct {
	action authz.Action
	// target reads what the request acts on (nil: the cluster). An error is a 400.
	target func(r *http.Request, id authz.Identity, body []byte) (authz.Target, error)
	// check decides instead of action and target (POST /v1/txn: key by key); adminOnly
	// says the request needed admin (it is audited).
	check func(a *API, id authz.Identity, body []byte) (adminOnly bool, what string, err error)
	// key names the query parameter of a log read's key or prefix: its table decides
	// (authz.ReadOf), and a range's answer keeps only the keys the caller may read.
	key string
}

// bodyTarget decodes a JSON body into T and reads the target from it.
func bodyTarget[T any](fn func(T) authz.Target) func(*http.Request, authz.Identity, []byte) (authz.Target, error) {
	return func(r *http.Request, _ authz.Identity, body []byte) (authz.Target, error) {
		var in T
		if err := json.Unmarshal(body, &in); err != nil {
			return authz.Target{}, fmt.Errorf("%w: %s: %v", api.ErrInvalid, r.URL.Path, err)
		}
		return fn(in), nil
	}
}

func queryTarget(r *http.Request, _ authz.Identity, _ []byte) (authz.Target, error) {
	q := r.URL.Query()
	return authz.Target{Job: q.Get("job"), Gang: q.Get("gang")}, nil
}

func read() routeRule                { return routeRule{action: authz.ActRead} }
func readKey(param string) routeRule { return routeRule{key: param} }
func admin(a authz.Action) routeRule { return routeRule{action: a} }

// routeRules maps each route pattern of the API (as its mux registers it) to its rule.
var routeRules = map[string]routeRule{
	"/v1/get":                    readKey("key"),
	"/v1/range":                  readKey("prefix"),
	"/v1/status":                 read(),
	"GET /v1/list":               readKey("prefix"),
	"GET /v1/watch":              readKey("prefix"),
	"GET /v1/cluster":            read(),
	"GET /v1/scheduler":          read(),
	"GET /v1/whoami":             read(),
	"GET /v1/trust":              read(),
	"/v1/members/":               admin(authz.ActMembers),
	"/v1/propose":                admin(authz.ActPropose),
	"POST /v1/txn":               {check: checkTxn},
	"POST /v1/certs":             {action: authz.ActCertSign, target: certTarget},
	"POST /v1/tokens":            {action: authz.ActTokenMint, target: tokenTarget},
	"POST /v1/tokens/revoke":     admin(authz.ActTokenRevoke),
	"POST /v1/tokens/review":     {action: authz.ActTokenReview},
	"POST /v1/audit":             {action: authz.ActAuditReport},
	"POST /v1/machines/register": {action: authz.ActMachineReport, target: bodyTarget(func(m api.Machine) authz.Target { return authz.Target{Machine: m.Name} })},
	"POST /v1/machines/load":     {action: authz.ActMachineReport, target: bodyTarget(func(l api.LoadReport) authz.Target { return authz.Target{Machine: l.Machine} })},
	"POST /v1/jobs":              {action: authz.ActJobSubmit, target: jobTarget},
	"POST /v1/jobs/stop":         {action: authz.ActJobWrite, target: queryTarget},
	"POST /v1/gangs":             {action: authz.ActGangWrite, target: bodyTarget(func(s api.GangSpec) authz.Target { return authz.Target{Job: s.Job, Gang: s.Name} })},
	"POST /v1/gangs/stop":        {action: authz.ActGangWrite, target: queryTarget},
	"POST /v1/gangs/yield":       {action: authz.ActGangWrite, target: bodyTarget(func(y api.Yield) authz.Target { return authz.Target{Job: y.Job, Gang: y.Gang} })},
	"POST /v1/gangs/world":       {action: authz.ActGangWrite, target: bodyTarget(func(w api.WorldChange) authz.Target { return authz.Target{Job: w.Job, Gang: w.Gang} })},
	"POST /v1/gangs/checkpointed": {action: authz.ActGangWrite, target: bodyTarget(func(c api.CheckpointReport) authz.Target {
		return authz.Target{Job: c.Job, Gang: c.Gang}
	})},
	"POST /v1/services":      {action: authz.ActGangWrite, target: bodyTarget(func(s api.ServiceSpec) authz.Target { return authz.Target{Job: s.Job} })},
	"POST /v1/services/stop": {action: authz.ActGangWrite, target: queryTarget},
	"POST /v1/services/load": {action: authz.ActProgress, target: bodyTarget(func(l api.ServiceLoad) authz.Target { return authz.Target{Job: l.Job} })},
	"POST /v1/workers/ready": {action: authz.ActWorkerReady, target: bodyTarget(func(w api.Worker) authz.Target {
		return authz.Target{For: authz.Worker(w.Job, w.Gang, w.Rank)}
	})},
	"POST /v1/workers/exited": {action: authz.ActWorkerExited, target: bodyTarget(func(x api.WorkerExit) authz.Target {
		return authz.Target{For: authz.Worker(x.Job, x.Gang, x.Rank)}
	})},
	"POST /v1/costs":            {action: authz.ActCostReport, target: bodyTarget(func(c api.CostReport) authz.Target { return authz.Target{Machine: c.Machine} })},
	"POST /v1/progress":         {action: authz.ActProgress, target: bodyTarget(func(p api.Progress) authz.Target { return authz.Target{Job: p.Job, Gang: p.Gang} })},
	"POST /v1/machines/drain":   admin(authz.ActMachineDrain),
	"POST /v1/machines/undrain": admin(authz.ActMachineDrain),
	"POST /v1/pools/interrupt":  admin(authz.ActPoolInterrupt),
	"PUT /v1/scheduler":         admin(authz.ActConfigWrite),
	"GET /debug/pprof/":         admin(authz.ActDebug),
	"GET /debug/pprof/profile":  admin(authz.ActDebug),
	"GET /debug/pprof/trace":    admin(authz.ActDebug),
	"GET /debug/pprof/symbol":   admin(authz.ActDebug),
}

// forTarget is a target on behalf of a principal's text (an unparsable one names nobody:
// only admin passes).
func forTarget(s string) authz.Target {
	p, err := authz.ParsePrincipal(s)
	if err != nil {
		return authz.Target{What: fmt.Sprintf("principal %q", s)}
	}
	return authz.Target{For: p}
}

// tokenTarget: a credential for a worker (its gang member's machine decides), or for the
// driver of a job that runs as a member of a driver gang (that member's machine).
func tokenTarget(r *http.Request, id authz.Identity, body []byte) (authz.Target, error) {
	var req api.TokenRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return authz.Target{}, fmt.Errorf("%w: /v1/tokens: %v", api.ErrInvalid, err)
	}
	t := forTarget(req.Principal)
	if t.For.Role != authz.RoleDriver {
		return t, nil
	}
	t.Machine = "?" // no machine unless a driver gang of the job has the member
	if s, ok := r.Context().Value(stateKey{}).(stateView); ok {
		kv, found := s.sm.Get(api.TableGangs + t.For.Job + "/" + req.Gang)
		var g api.Gang
		if found && json.Unmarshal(kv.Value, &g) == nil && g.Spec.Driver {
			if m, ok := s.MemberMachine(t.For.Job, req.Gang, req.Rank); ok {
				t.Machine = m
			}
		}
	}
	return t, nil
}

// jobTarget: a job submitted, and whether one of its name exists and is stopped.
func jobTarget(r *http.Request, _ authz.Identity, body []byte) (authz.Target, error) {
	var j api.Job
	if err := json.Unmarshal(body, &j); err != nil {
		return authz.Target{}, fmt.Errorf("%w: /v1/jobs: %v", api.ErrInvalid, err)
	}
	t := authz.Target{Job: j.Name}
	if s, ok := r.Context().Value(stateKey{}).(stateView); ok {
		if kv, found := s.sm.Get(api.TableJobs + j.Name); found {
			var old api.Job
			t.Stopped = json.Unmarshal(kv.Value, &old) == nil && old.State == api.JobStopped
		}
	}
	return t, nil
}

// stateKey carries the API's state view to a route's target function.
type stateKey struct{}

// certTarget: a certificate for the principal asked for, or for the token's own.
func certTarget(r *http.Request, id authz.Identity, body []byte) (authz.Target, error) {
	var req api.CertRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return authz.Target{}, fmt.Errorf("%w: /v1/certs: %v", api.ErrInvalid, err)
	}
	if req.Principal == "" {
		return authz.Target{For: id.Principal}, nil
	}
	return forTarget(req.Principal), nil
}

// stateView answers what decisions read of the cluster from this head's state machine
// (as applied here: a follower may lag the leader by a few entries).
type stateView struct{ sm *metaserver.StateMachine }

var _ authz.State = stateView{}

func (s stateView) MemberMachine(job, gang string, rank int) (string, bool) {
	kv, ok := s.sm.Get(api.TableGangs + job + "/" + gang)
	if !ok {
		return "", false
	}
	var g api.Gang
	if json.Unmarshal(kv.Value, &g) != nil || g.Placement == nil || rank < 0 || rank >= len(g.Placement.Members) {
		return "", false
	}
	m := g.Placement.Members[rank]
	return m.Machine, !m.Removed
}

func (s stateView) OwnerPrincipal(owner string) (authz.Principal, bool) {
	kv, ok := s.sm.Get(api.TableOwners + owner)
	if !ok {
		return authz.Principal{}, false
	}
	var o api.Owner
	if json.Unmarshal(kv.Value, &o) != nil {
		return authz.Principal{}, false
	}
	if o.Principal == "" {
		return authz.Admin(), true
	}
	p, err := authz.ParsePrincipal(o.Principal)
	return p, err == nil
}

func (s stateView) JobPrincipal(job string) (authz.Principal, bool) {
	kv, ok := s.sm.Get(api.TableJobs + job)
	if !ok {
		return authz.Principal{}, false
	}
	var j api.Job
	if json.Unmarshal(kv.Value, &j) != nil {
		return authz.Principal{}, true // a record of no principal: not the caller's
	}
	return principalOr(j.Principal), true
}

// principalOr reads a record's principal ("" and unreadable ones are admin's).
func principalOr(s string) authz.Principal {
	p, err := authz.ParsePrincipal(s)
	if err != nil {
		return authz.Admin()
	}
	return p
}

// principalOf is the principal the API authenticated a request as (the zero principal,
// unauthenticated, when it did not).
func principalOf(r *http.Request) string {
	id, _ := identityOf(r)
	return id.Principal.String()
}

func (s stateView) revoked(id string) bool {
	_, ok := s.sm.Get(api.RevokedKey(id))
	return ok
}

func (s stateView) jobEnded(job string) bool {
	kv, ok := s.sm.Get(api.TableJobs + job)
	if !ok {
		return true
	}
	var j api.Job
	return json.Unmarshal(kv.Value, &j) == nil && j.State == api.JobStopped
}

// newAuthenticator is the API's authenticator over this head's state machine.
func newAuthenticator(token string, sm *metaserver.StateMachine) *authz.Authenticator {
	s := stateView{sm: sm}
	return &authz.Authenticator{Secret: []byte(token), Revoked: s.revoked, JobEnded: s.jobEnded}
}

// bearer is a request's bearer token.
func bearer(r *http.Request) string {
	h := r.Header.Get("Authorization")
	if t, ok := strings.CutPrefix(h, "Bearer "); ok {
		return t
	}
	return ""
}

// serveAuthorized authenticates a request, decides it, and serves it (ServeHTTP).
func (a *API) serveAuthorized(w http.ResponseWriter, r *http.Request) {
	id, err := a.authn.Authenticate(bearer(r), r.TLS)
	if err != nil {
		a.log.Warn("unauthenticated request refused", zap.String("remote", r.RemoteAddr), zap.String("path", r.URL.Path), zap.Error(err))
		writeJSON(w, http.StatusUnauthorized, api.ErrorBody{Error: "unauthenticated: " + strings.TrimPrefix(err.Error(), "unauthenticated: "), Kind: "unauthenticated"})
		return
	}
	if a.au != nil {
		c := pki.PeerCert(r.TLS)
		if c == nil && !(r.Method == http.MethodPost && r.URL.Path == "/v1/certs") {
			a.log.Warn("request without a client certificate refused", zap.String("remote", r.RemoteAddr), zap.String("path", r.URL.Path))
			writeJSON(w, http.StatusUnauthorized, api.ErrorBody{Error: "unauthenticated: a client certificate of the cluster CA is required (POST /v1/certs with the token gets one)", Kind: "unauthenticated"})
			return
		}
		if c != nil && a.au.observe(c, id.Principal.String()) {
			w.Header().Set("Connection", "close") // its next request shakes hands again
		}
	}
	_, pattern := a.mux.Handler(r)
	if pattern == "" { // no such route: the mux answers 404 or 405
		a.mux.ServeHTTP(w, r)
		return
	}
	rule, listed := routeRules[pattern]
	var body []byte
	if rule.target != nil || rule.check != nil {
		if body, err = readBody(w, r, MaxBodyBytes); err != nil {
			a.answer(w, r, nil, err)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
	}
	action, adminOnly, what := rule.action, authz.AdminOnly(rule.action) && rule.action != authz.ActDebug, "" // a profile is no write
	switch {
	case !listed:
		action, adminOnly = authz.Action(pattern), true
		if id.Principal.Role != authz.RoleAdmin {
			err = &authz.Denied{Principal: id.Principal, Action: action, Target: authz.Target{What: pattern}}
		}
	case rule.check != nil:
		action = authz.ActKVControl
		adminOnly, what, err = rule.check(a, id, body)
	case rule.key != "":
		key := r.URL.Query().Get(rule.key)
		var t authz.Target
		action, t = authz.ReadOf(key)
		adminOnly = false // a read changes nothing: no audit of its success
		if rule.key == "prefix" && action == authz.ActReadJob && t.Job == "" {
			break // a range over every job's records: answered key by key (readable)
		}
		err = authz.Decide(id.Principal, action, t, a.state)
		what = t.String()
	default:
		var t authz.Target
		if rule.target != nil {
			if t, err = rule.target(r.WithContext(context.WithValue(r.Context(), stateKey{}, a.state)), id, body); err != nil {
				a.answer(w, r, nil, err)
				return
			}
		}
		err = authz.Decide(id.Principal, action, t, a.state)
		what = t.String()
	}
	var denied *authz.Denied
	switch {
	case errors.As(err, &denied):
		a.refuse(w, r, denied)
		return
	case err != nil:
		a.answer(w, r, nil, err)
		return
	}
	r = r.WithContext(context.WithValue(r.Context(), principalKey{}, id))
	if !adminOnly || id.Principal.Role != authz.RoleAdmin {
		a.mux.ServeHTTP(w, r)
		return
	}
	sw := &statusWriter{ResponseWriter: w, code: http.StatusOK}
	a.mux.ServeHTTP(sw, r)
	if sw.code < 300 {
		a.audit(api.Event{Kind: api.EventAdminWrite, By: id.Principal.String(), Action: string(action),
			Reason: fmt.Sprintf("%s %s: %s", r.Method, r.URL.Path, what)})
	}
}

// refuse answers a refusal: at the leader a 403 naming the role and the action, and its
// audit event; at a follower that knows the leader, a 421 that sends the caller there.
func (a *API) refuse(w http.ResponseWriter, r *http.Request, d *authz.Denied) {
	if st := a.rep.Status(); st.Leader != 0 && st.Leader != st.ID {
		a.answer(w, r, nil, &paxos.NotLeaderError{Leader: st.Leader})
		return
	}
	a.log.Warn("request refused", zap.String("principal", d.Principal.String()), zap.String("action", string(d.Action)),
		zap.String("path", r.URL.Path), zap.String("target", d.Target.String()), zap.String("remote", r.RemoteAddr))
	ev := api.Event{Kind: api.EventRefused, By: d.Principal.String(), Action: string(d.Action), Job: d.Target.Job,
		Reason: fmt.Sprintf("%s %s: %s", r.Method, r.URL.Path, d.Target)}
	if len(ev.Reason) > api.MaxTextBytes {
		ev.Reason = ev.Reason[:api.MaxTextBytes]
	}
	a.audit(ev)
	writeJSON(w, http.StatusForbidden, api.ErrorBody{Error: d.Error(), Kind: "forbidden"})
}

// Audit events are bounded: a burst of auditBurst, then auditRate a second; what is over
// is counted and said in the next event that goes (a hostile caller cannot fill the log
// with its refusals).
const (
	auditRate  = 20.0
	auditBurst = 100.0
)

type auditLimiter struct {
	mu      sync.Mutex
	tokens  float64
	last    time.Time
	dropped int
}

// audit commits an audit event, at the leader (elsewhere it is only logged).
func (a *API) audit(ev api.Event) {
	now := time.Now()
	l := &a.limit
	l.mu.Lock()
	if l.last.IsZero() {
		l.tokens = auditBurst
	} else {
		l.tokens = min(auditBurst, l.tokens+now.Sub(l.last).Seconds()*auditRate)
	}
	l.last = now
	if l.tokens < 1 {
		l.dropped++
		l.mu.Unlock()
		return
	}
	l.tokens--
	dropped := l.dropped
	l.dropped = 0
	l.mu.Unlock()
	if dropped > 0 {
		ev.Reason += fmt.Sprintf(" (and %d more audit events not recorded: over %g a second)", dropped, auditRate)
	}
	ev.Time = now
	if err := a.ctl.Audit(ev); err != nil {
		a.log.Info("audit event not committed (this head does not lead)", zap.String("kind", string(ev.Kind)), zap.String("by", ev.By), zap.String("reason", ev.Reason), zap.Error(err))
	}
}

// checkTxn decides a /v1/txn request key by key: each op's table names its action
// (objects/ by the record's owner, before and after; checkpoints/ by its job; owners/ by
// the principal its record names; binaries/ puts; every other table is admin's).
func checkTxn(a *API, id authz.Identity, body []byte) (adminOnly bool, what string, err error) {
	var req meta.Request
	if err := json.Unmarshal(body, &req); err != nil {
		return false, "", fmt.Errorf("%w: /v1/txn: %v", api.ErrInvalid, err)
	}
	p := id.Principal
	var keys []string
	for _, op := range req.Ops {
		keys = append(keys, string(op.Type)+" "+op.Key)
		t, _ := meta.OfKey(op.Key)
		desc := string(op.Type) + " " + op.Key
		var checks []struct {
			a authz.Action
			t authz.Target
		}
		add := func(a authz.Action, t authz.Target) {
			t.What = desc
			checks = append(checks, struct {
				a authz.Action
				t authz.Target
			}{a, t})
		}
		switch {
		case t == meta.TableObjects:
			for _, o := range a.objectOwners(op) {
				add(authz.ActKVObjects, authz.Target{Owner: o})
			}
		case t == meta.TableCheckpoints:
			job, _, _ := strings.Cut(strings.TrimPrefix(op.Key, api.TableCheckpoints), "/")
			add(authz.ActKVCheckpoints, authz.Target{Job: job})
		case t == meta.TableBinaries && op.Type == meta.OpPut:
			add(authz.ActKVBinaries, authz.Target{})
		case t == meta.TableOwners:
			for _, who := range a.ownerPrincipals(op) {
				add(authz.ActKVOwners, forTarget(who))
			}
		default:
			adminOnly = true
			add(authz.ActKVControl, authz.Target{})
		}
		for _, c := range checks {
			if err := authz.Decide(p, c.a, c.t, a.state); err != nil {
				return adminOnly, "", err
			}
		}
	}
	what = strings.Join(keys, ", ")
	if len(what) > 300 {
		what = what[:300] + "..."
	}
	return adminOnly, what, nil
}

// objectOwners are the owners an op on an object record touches: the record's now, and
// the one it puts.
func (a *API) objectOwners(op meta.Op) []string {
	type rec struct {
		Owner string `json:"owner"`
	}
	var out []string
	if kv, ok := a.sm.Get(op.Key); ok {
		var r rec
		_ = json.Unmarshal(kv.Value, &r)
		out = append(out, r.Owner)
	}
	if op.Type == meta.OpPut {
		var r rec
		_ = json.Unmarshal(op.Value, &r)
		out = append(out, r.Owner)
	}
	return out
}

// ownerPrincipals are the principals an op on an owner record touches: the record's now,
// and the one it puts ("" reads as admin).
func (a *API) ownerPrincipals(op meta.Op) []string {
	var out []string
	prin := func(b []byte) string {
		var o api.Owner
		_ = json.Unmarshal(b, &o)
		if o.Principal == "" {
			return string(authz.RoleAdmin)
		}
		return o.Principal
	}
	if kv, ok := a.sm.Get(op.Key); ok {
		out = append(out, prin(kv.Value))
	}
	if op.Type == meta.OpPut {
		out = append(out, prin(op.Value))
	}
	return out
}

// authRoutes adds the routes of credentials to the API's mux.
func (a *API) authRoutes(m *http.ServeMux) {
	m.Handle("POST /v1/txn", timedProposals(a.ctl.obs, a.meta))
	m.HandleFunc("POST /v1/certs", a.signCert)
	m.HandleFunc("GET /v1/trust", func(w http.ResponseWriter, r *http.Request) {
		if a.au == nil {
			a.answer(w, r, nil, fmt.Errorf("%w: this head runs without TLS: it has no cluster CA", api.ErrInvalid))
			return
		}
		a.answer(w, r, a.au.info(), nil)
	})
	m.HandleFunc("GET /v1/whoami", func(w http.ResponseWriter, r *http.Request) {
		id, _ := identityOf(r)
		who := api.WhoAmI{Principal: id.Principal.String(), LinkKey: string(authz.LinkKey([]byte(a.token))), TokenID: id.TokenID}
		switch id.Principal.Role {
		case authz.RoleAdmin, authz.RoleHead, authz.RoleAgent: // the processes that gossip and serve /metrics
			who.GossipKey = hex.EncodeToString(member.GossipKey([]byte(a.token)))
			who.DashboardToken = api.DashboardToken([]byte(a.token))
		}
		a.answer(w, r, who, nil)
	})
	m.HandleFunc("POST /v1/tokens/review", postReq(a, func(r *http.Request, req api.TokenReview) (any, error) {
		id, err := a.authn.Authenticate(req.Token, nil)
		if err != nil {
			return api.TokenReviewAnswer{Error: err.Error()}, nil
		}
		return api.TokenReviewAnswer{Principal: id.Principal.String(), TokenID: id.TokenID, Expires: id.Expires, JobBound: id.JobBound}, nil
	}))
	m.HandleFunc("POST /v1/tokens", postReq(a, func(r *http.Request, req api.TokenRequest) (any, error) { return a.mintToken(req) }))
	m.HandleFunc("POST /v1/audit", postReq(a, func(r *http.Request, ev api.Event) (any, error) {
		id, _ := identityOf(r)
		if len(ev.Reason) > api.MaxTextBytes || len(ev.By) > 256 || len(ev.Action) > 64 || len(ev.Job) > api.MaxNameBytes {
			return nil, fmt.Errorf("%w: /v1/audit: a field over its bound", api.ErrInvalid)
		}
		if st := a.rep.Status(); st.Leader != 0 && st.Leader != st.ID { // only the leader commits events
			return nil, &paxos.NotLeaderError{Leader: st.Leader}
		}
		a.audit(api.Event{Kind: api.EventRefused, By: ev.By, Action: ev.Action, Job: ev.Job, Machine: id.Principal.Machine,
			Reason: ev.Reason + " (refused by " + id.Principal.String() + ")"})
		return nil, nil
	}))
	m.HandleFunc("POST /v1/tokens/revoke", postReq(a, func(r *http.Request, rev api.Revocation) (any, error) {
		id, _ := identityOf(r)
		return nil, a.revoke(a.ctx(r), id, rev)
	}))
}

// signCert signs a process's certificate request, for the principal the request's
// credential allows (the rule of POST /v1/certs decided it): the certificate carries the
// principal, the id of the scoped token it was asked with, and ends when the token does.
func (a *API) signCert(w http.ResponseWriter, r *http.Request) {
	if a.au == nil {
		a.answer(w, r, nil, fmt.Errorf("%w: this head runs without TLS: it signs no certificates", api.ErrInvalid))
		return
	}
	body, err := readBody(w, r, 64<<10)
	if err != nil {
		a.answer(w, r, nil, err)
		return
	}
	var req api.CertRequest
	if err := json.Unmarshal(body, &req); err != nil {
		a.answer(w, r, nil, fmt.Errorf("%w: /v1/certs: %v", api.ErrInvalid, err))
		return
	}
	if err := pki.ValidName(req.Name); err != nil {
		a.answer(w, r, nil, fmt.Errorf("%w: /v1/certs: %v", api.ErrInvalid, err))
		return
	}
	id, _ := identityOf(r)
	p := id.Principal
	if req.Principal != "" {
		if p, err = authz.ParsePrincipal(req.Principal); err != nil {
			a.answer(w, r, nil, fmt.Errorf("%w: /v1/certs: %v", api.ErrInvalid, err))
			return
		}
	}
	if err := checkCertHosts(p, req.Hosts); err != nil {
		a.answer(w, r, nil, fmt.Errorf("%w: /v1/certs: %v", api.ErrInvalid, err))
		return
	}
	cert, err := a.au.signer().SignCSRGrant([]byte(req.CSR), req.Name, pki.Grant{URI: authz.Grant(p, id.TokenID, id.JobBound), NotAfter: id.Expires}, req.Hosts...)
	if err != nil {
		a.answer(w, r, nil, fmt.Errorf("%w: /v1/certs: %v", api.ErrInvalid, err))
		return
	}
	a.log.Info("certificate signed", zap.String("name", req.Name), zap.String("principal", p.String()), zap.String("remote", r.RemoteAddr))
	writeJSON(w, http.StatusOK, api.CertReply{Cert: string(cert), CA: string(a.au.bundle()), Principal: p.String()})
}

// checkCertHosts checks the hosts a certificate request names: only an agent's (a server
// other machines and operators reach at its addresses), at most api.MaxCertHosts, each an
// IP address or a DNS name.
func checkCertHosts(p authz.Principal, hosts []string) error {
	if len(hosts) == 0 {
		return nil
	}
	if p.Role != authz.RoleAgent {
		return fmt.Errorf("hosts %q: only an agent's certificate names hosts, not a %s's", hosts, p.Role)
	}
	if len(hosts) > api.MaxCertHosts {
		return fmt.Errorf("%d hosts: at most %d", len(hosts), api.MaxCertHosts)
	}
	for _, h := range hosts {
		if net.ParseIP(h) == nil && !validDNSName(h) {
			return fmt.Errorf("host %q is neither an IP address nor a DNS name", h)
		}
	}
	return nil
}

// validDNSName reports whether s is a DNS name: dot-separated labels of letters, digits
// and inner hyphens, each 1..63 bytes, 253 in all.
func validDNSName(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for _, l := range strings.Split(s, ".") {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for _, c := range l {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
				return false
			}
		}
	}
	return true
}

// mintToken makes a credential for a process an agent launches: a worker of a gang
// member, or the driver of a submitted job (the rule of POST /v1/tokens decided that the
// member is placed on the agent's machine). It ends with its job.
func (a *API) mintToken(req api.TokenRequest) (api.TokenReply, error) {
	p, err := authz.ParsePrincipal(req.Principal)
	if err != nil {
		return api.TokenReply{}, fmt.Errorf("%w: /v1/tokens: %v", api.ErrInvalid, err)
	}
	if p.Role != authz.RoleWorker && p.Role != authz.RoleDriver {
		return api.TokenReply{}, fmt.Errorf("%w: /v1/tokens: credentials are minted for workers and drivers only, not %s", api.ErrInvalid, p.Role)
	}
	tok, c, err := authz.NewToken([]byte(a.token), authz.Claims{Principal: p.String(), JobBound: true})
	if err != nil {
		return api.TokenReply{}, err
	}
	return api.TokenReply{Token: tok, ID: c.ID}, nil
}

// revoke commits a revocation through the log: every head refuses the credential from the
// entry on.
func (a *API) revoke(ctx context.Context, id authz.Identity, rev api.Revocation) error {
	rev.By, rev.Time = id.Principal.String(), time.Now()
	ev := api.Event{Time: rev.Time, Kind: api.EventCredentialRevoked, By: rev.By, Action: string(authz.ActTokenRevoke),
		Reason: strings.TrimSpace(fmt.Sprintf("credential %s of %s %s", rev.ID, rev.Principal, rev.Reason))}
	return a.ctl.Revoke(ctx, rev, ev)
}

// readable is the filter of a log read's answer: nil when the caller reads every key,
// else whether it may read each key (a range over several jobs keeps the caller's).
func (a *API) readable(r *http.Request) func(key string) bool {
	id, ok := identityOf(r)
	if !ok {
		return func(string) bool { return false }
	}
	if authz.ReadsAll(id.Principal) {
		return nil
	}
	return func(key string) bool { return authz.Readable(id.Principal, key, a.state) }
}
