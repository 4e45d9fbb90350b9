package agent

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/atoll-run/atoll/internal/pki"
	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/runtime/authz"
	"github.com/atoll-run/atoll/runtime/objects"
	"github.com/atoll-run/atoll/store/object"
)

// Least privilege on the agent's API. Every request is authenticated as on the heads
// (authz.Authenticator with the cluster secret: the cluster token is admin, a scoped token
// or a certificate's grant names a narrower principal), and its route's rule (agentRules)
// names the action of runtime/authz's table and what it acts on: the holder a worker or a
// driver names, the owner of the object it names. A refusal is a 403 naming the role and
// the action, logged here (the heads' event log records the refusals of the head API).
//
// What the agent reads to decide comes from the heads, cached for a few seconds
// (cacheTTL): a credential revoked on the heads is refused here within that time. A job's
// end is not checked here (the heads refuse a job-bound credential of an ended job; the
// agent stops that job's workers).

// cacheTTL bounds how long the agent trusts what it read of the heads to decide.
const cacheTTL = 5 * time.Second

// agentRule is how a route of the agent's API is decided.
type agentRule struct {
	// decide decides the request (its ObjectRef body decoded when ref is set); nil: the
	// action alone, on the cluster.
	action authz.Action
	decide func(a *Agent, p authz.Principal, r *http.Request, ref *api.ObjectRef) error
	ref    bool
}

// agentRules maps each route pattern of the agent's API to its rule.
var agentRules = map[string]agentRule{
	"POST /v1/objects/put": {decide: func(a *Agent, p authz.Principal, r *http.Request, _ *api.ObjectRef) error {
		return a.decideHolder(p, authz.ActObjectPut, r.URL.Query().Get("holder"))
	}},
	"POST /v1/objects/create": {decide: func(a *Agent, p authz.Principal, r *http.Request, _ *api.ObjectRef) error {
		q := r.URL.Query()
		if err := a.decideHolder(p, authz.ActObjectPut, q.Get("holder")); err != nil {
			return err
		}
		return a.decideHolder(p, authz.ActObjectHold, q.Get("lease"))
	}},
	"POST /v1/objects/seal":      {ref: true, decide: holderOf(authz.ActObjectPut)},
	"POST /v1/objects/abort":     {ref: true, decide: holderOf(authz.ActObjectPut)},
	"POST /v1/objects/map":       {ref: true, decide: readAndHold},
	"POST /v1/objects/verify":    {ref: true, decide: objectOf(authz.ActObjectRead)},
	"POST /v1/objects/persist":   {ref: true, decide: objectOf(authz.ActObjectRead)},
	"POST /v1/objects/export":    {ref: true, decide: objectOf(authz.ActObjectRead)},
	"POST /v1/objects/unmap":     {ref: true, decide: holderOf(authz.ActObjectHold)},
	"POST /v1/objects/release":   {ref: true, decide: holderOf(authz.ActObjectHold)},
	"POST /v1/leases/renew":      {ref: true, decide: holderOf(authz.ActObjectHold)},
	"POST /v1/objects/free":      {ref: true, decide: objectOf(authz.ActObjectWrite)},
	"POST /v1/objects/drop":      {ref: true, decide: objectOf(authz.ActObjectWrite)},
	"POST /v1/objects/unexport":  {ref: true, decide: objectOf(authz.ActObjectWrite)},
	"POST /v1/objects/replicate": {ref: true, decide: objectAndHolder(authz.ActObjectPut)},
	"GET /v1/workers":            {action: authz.ActAgentStateRead},
	"POST /v1/workers/kill": {decide: func(a *Agent, p authz.Principal, r *http.Request, _ *api.ObjectRef) error {
		return authz.Decide(p, authz.ActWorkerKill, authz.Target{Job: r.URL.Query().Get("job")}, a.state)
	}},
	"GET /v1/logs": {decide: func(a *Agent, p authz.Principal, r *http.Request, _ *api.ObjectRef) error {
		return authz.Decide(p, authz.ActLogsRead, authz.Target{Job: r.URL.Query().Get("job")}, a.state)
	}},
}

func holderOf(act authz.Action) func(*Agent, authz.Principal, *http.Request, *api.ObjectRef) error {
	return func(a *Agent, p authz.Principal, _ *http.Request, ref *api.ObjectRef) error {
		return a.decideHolder(p, act, ref.Holder)
	}
}

func objectOf(act authz.Action) func(*Agent, authz.Principal, *http.Request, *api.ObjectRef) error {
	return func(a *Agent, p authz.Principal, r *http.Request, ref *api.ObjectRef) error {
		return a.decideObject(r.Context(), p, act, ref.ID)
	}
}

func objectAndHolder(act authz.Action) func(*Agent, authz.Principal, *http.Request, *api.ObjectRef) error {
	return func(a *Agent, p authz.Principal, r *http.Request, ref *api.ObjectRef) error {
		if err := a.decideObject(r.Context(), p, authz.ActObjectRead, ref.ID); err != nil {
			return err
		}
		return a.decideHolder(p, act, ref.Holder)
	}
}

// readAndHold: a map reads the object and holds a reference in the holder's name.
func readAndHold(a *Agent, p authz.Principal, r *http.Request, ref *api.ObjectRef) error {
	if err := a.decideObject(r.Context(), p, authz.ActObjectRead, ref.ID); err != nil {
		return err
	}
	return a.decideHolder(p, authz.ActObjectHold, ref.Holder)
}

// decideHolder decides an action in a holder's name (the owner of what it puts, the
// holder of the references it takes or lets go).
func (a *Agent) decideHolder(p authz.Principal, act authz.Action, holder string) error {
	return authz.Decide(p, act, authz.Target{Owner: holder}, a.state)
}

// decideObject decides an action on an object by its owner, read from the directory
// (only for the roles whose scope depends on it). An object the directory does not know
// is ErrNotFound.
func (a *Agent) decideObject(ctx context.Context, p authz.Principal, act authz.Action, idText string) error {
	if authz.Decide(p, act, authz.Target{}, nil) == nil { // any target: no need to look
		return nil
	}
	id, err := object.ParseID(idText)
	if err != nil {
		return fmt.Errorf("%w: object id %q: %v", api.ErrInvalid, idText, err)
	}
	owner, err := a.state.objectOwner(ctx, id)
	if err != nil {
		return err
	}
	return authz.Decide(p, act, authz.Target{Owner: owner}, a.state)
}

// agentState answers the agent's decisions through its client of the heads, cached for
// cacheTTL.
type agentState struct {
	a *Agent

	mu      sync.Mutex
	owners  map[string]cached[authz.Principal] // driver owner -> its principal
	jobs    map[string]cached[authz.Principal] // job -> the principal that submitted it
	revoked map[string]cached[bool]            // token id -> revoked
	objects map[object.ID]string               // object -> owner (owners never change)
}

type cached[T any] struct {
	v    T
	ok   bool
	when time.Time
}

var _ authz.State = (*agentState)(nil)

func newAgentState(a *Agent) *agentState {
	return &agentState{a: a, owners: map[string]cached[authz.Principal]{}, jobs: map[string]cached[authz.Principal]{}, revoked: map[string]cached[bool]{},
		objects: map[object.ID]string{}}
}

// MemberMachine implements authz.State: no decision on an agent needs it.
func (s *agentState) MemberMachine(string, string, int) (string, bool) { return "", false }

// lookup answers key from m while its entry is younger than cacheTTL, else asks the
// heads (fetch) and caches the answer. On an error it returns the entry it had, if any
// (hit says whether there was one).
func lookup[T any](s *agentState, m map[string]cached[T], key string, fetch func(context.Context) (T, bool, error)) (c cached[T], hit bool, err error) {
	s.mu.Lock()
	c, hit = m[key]
	s.mu.Unlock()
	if hit && time.Since(c.when) < cacheTTL || s.a.client == nil {
		return c, hit, nil
	}
	ctx, cancel := context.WithTimeout(s.a.ctx, 5*time.Second)
	defer cancel()
	v, ok, err := fetch(ctx)
	if err != nil {
		return c, hit, err
	}
	c = cached[T]{v: v, ok: ok, when: time.Now()}
	s.mu.Lock()
	m[key] = c
	s.mu.Unlock()
	return c, true, nil
}

// OwnerPrincipal implements authz.State.
func (s *agentState) OwnerPrincipal(owner string) (authz.Principal, bool) {
	c, _, err := lookup(s, s.owners, owner, func(ctx context.Context) (authz.Principal, bool, error) {
		var o api.Owner
		found, err := s.a.client.Get(ctx, api.TableOwners+owner, &o)
		switch {
		case err != nil || !found:
			return authz.Principal{}, false, err
		case o.Principal == "":
			return authz.Admin(), true, nil
		}
		p, err := authz.ParsePrincipal(o.Principal)
		return p, err == nil, nil
	})
	if err != nil {
		return authz.Principal{}, false
	}
	return c.v, c.ok
}

// JobPrincipal implements authz.State.
func (s *agentState) JobPrincipal(job string) (authz.Principal, bool) {
	c, _, err := lookup(s, s.jobs, job, func(ctx context.Context) (authz.Principal, bool, error) {
		var j api.Job
		found, err := s.a.client.Get(ctx, api.TableJobs+job, &j)
		if err != nil {
			return authz.Principal{}, false, err
		}
		if p, err := authz.ParsePrincipal(j.Principal); err == nil {
			return p, found, nil
		}
		return authz.Admin(), found, nil
	})
	if err != nil {
		return authz.Principal{}, false
	}
	return c.v, c.ok
}

// Revoked reports whether a credential was revoked (unknown, when the heads do not
// answer: not revoked).
func (s *agentState) Revoked(id string) bool {
	c, hit, err := lookup(s, s.revoked, id, func(ctx context.Context) (bool, bool, error) {
		var rev api.Revocation
		found, err := s.a.client.Get(ctx, api.RevokedKey(id), &rev)
		return found, true, err
	})
	if err != nil {
		return hit && c.v
	}
	return c.v
}

// objectOwner is an object's owner: its directory record's (dead or alive).
func (s *agentState) objectOwner(ctx context.Context, id object.ID) (string, error) {
	s.mu.Lock()
	o, ok := s.objects[id]
	s.mu.Unlock()
	if ok {
		return o, nil
	}
	owner := ""
	switch d := s.a.node.Store.Directory().(type) {
	case *objects.Directory: // the record, dead or alive
		rec, found, err := d.Record(ctx, id)
		if err != nil {
			return "", err
		}
		if !found {
			return "", fmt.Errorf("%w: no object %s", object.ErrNotFound, id.Short())
		}
		owner = rec.Owner
	default:
		m, err := d.Lookup(ctx, id)
		if err != nil {
			return "", err
		}
		owner = m.Owner
	}
	s.mu.Lock()
	if len(s.objects) >= 100_000 { // bounded: start again
		s.objects = map[object.ID]string{}
	}
	s.objects[id] = owner
	s.mu.Unlock()
	return owner, nil
}

// authorize authenticates and decides a request of the agent's API; it answers the
// refusal itself and returns false, or returns the request to serve (its body restored).
func (a *Agent) authorize(w http.ResponseWriter, r *http.Request, mux *http.ServeMux) (*http.Request, bool) {
	bearer, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	id, err := a.authn.Authenticate(bearer, r.TLS)
	if errors.Is(err, api.ErrUnavailable) { // no head reviewed the token (credential.go)
		a.log.Warn("a request's token could not be reviewed", zap.String("remote", r.RemoteAddr), zap.String("path", r.URL.Path), zap.Error(err))
		a.fail(w, err)
		return nil, false
	}
	if err != nil {
		a.log.Warn("unauthenticated agent request refused", zap.String("remote", r.RemoteAddr), zap.String("path", r.URL.Path), zap.Error(err))
		writeJSON(w, http.StatusUnauthorized, api.ErrorBody{Error: "unauthenticated: " + strings.TrimPrefix(err.Error(), "unauthenticated: "), Kind: "unauthenticated"})
		return nil, false
	}
	_, pattern := mux.Handler(r)
	if pattern == "" {
		return r, true // the mux answers 404 or 405
	}
	rule, listed := agentRules[pattern]
	var ref *api.ObjectRef
	if rule.ref {
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<16))
		if err != nil {
			a.fail(w, fmt.Errorf("%w: %s: %v", api.ErrInvalid, r.URL.Path, err))
			return nil, false
		}
		ref = &api.ObjectRef{}
		if err := json.Unmarshal(body, ref); err != nil {
			a.fail(w, fmt.Errorf("%w: %s: %v", api.ErrInvalid, r.URL.Path, err))
			return nil, false
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
	}
	p := id.Principal
	switch {
	case !listed:
		if p.Role != authz.RoleAdmin {
			err = &authz.Denied{Principal: p, Action: authz.Action(pattern), Target: authz.Target{What: pattern}}
		}
	case rule.decide != nil:
		err = rule.decide(a, p, r, ref)
	default:
		err = authz.Decide(p, rule.action, authz.Target{}, a.state)
	}
	var denied *authz.Denied
	switch {
	case errors.As(err, &denied):
		a.log.Warn("agent request refused", zap.String("principal", p.String()), zap.String("action", string(denied.Action)),
			zap.String("path", r.URL.Path), zap.String("target", denied.Target.String()), zap.String("remote", r.RemoteAddr))
		a.reportRefusal(denied, r.Method+" "+r.URL.Path)
		writeJSON(w, http.StatusForbidden, api.ErrorBody{Error: denied.Error(), Kind: "forbidden"})
		return nil, false
	case err != nil:
		a.fail(w, err)
		return nil, false
	}
	return r, true
}

// credential gets a process this agent launches its own credential from the heads: a
// token for worker/<job>/<gang>/<rank>, or driver/<job> for a submitted driver, that ends
// with its job (the heads mint it only for a member placed on this machine).
func (a *Agent) credential(ctx context.Context, spec api.WorkerSpec) (string, error) {
	req := api.TokenRequest{Principal: authz.Worker(spec.Job, spec.Gang, spec.Rank).String()}
	if spec.Driver {
		req = api.TokenRequest{Principal: authz.Driver(spec.Job).String(), Gang: spec.Gang, Rank: spec.Rank}
	}
	var rep api.TokenReply
	if err := a.client.Do(ctx, http.MethodPost, "/v1/tokens", req, &rep); err != nil {
		return "", err
	}
	return rep.Token, nil
}

// authorizePull decides an object a peer opens on this machine's transfer plane, by the
// principal its certificate's grant names (a certificate without one was not made for a
// principal: it is the operator's). A driver or a worker reads its job's objects and
// shared ones.
func (a *Agent) authorizePull(ctx context.Context, peer *x509.Certificate, id object.ID) error {
	g, ok, err := authz.ParseGrant(pki.GrantOf(peer))
	if err != nil {
		return fmt.Errorf("%w: %v", authz.ErrForbidden, err)
	}
	if !ok {
		return nil
	}
	err = a.decideObject(ctx, g.Principal, authz.ActObjectRead, id.String())
	var denied *authz.Denied
	switch {
	case errors.As(err, &denied):
		a.reportRefusal(denied, "transfer plane: open "+id.Short())
	case err != nil && errors.Is(err, object.ErrNotFound):
		return nil // unknown to the directory: the store answers not found itself
	}
	return err
}

// reportRefusal sends a refusal to the heads for their event log (POST /v1/audit), in the
// background: at most a few at once, the others only logged here.
func (a *Agent) reportRefusal(d *authz.Denied, where string) {
	if a.client == nil || a.ctx == nil {
		return
	}
	select {
	case a.reports <- struct{}{}:
	default:
		return
	}
	ev := api.Event{By: d.Principal.String(), Action: string(d.Action), Job: d.Target.Job, Reason: where + ": " + d.Target.String()}
	if len(ev.Reason) > api.MaxTextBytes/2 {
		ev.Reason = ev.Reason[:api.MaxTextBytes/2]
	}
	go func() {
		defer func() { <-a.reports }()
		ctx, cancel := context.WithTimeout(a.ctx, 10*time.Second)
		defer cancel()
		if err := a.client.Do(ctx, http.MethodPost, "/v1/audit", ev, nil); err != nil {
			a.log.Info("a refusal was not reported to the heads", zap.Error(err))
		}
	}()
}
