package api

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/atoll-run/atoll/store/meta"
)

// ErrorBody is the JSON body of every error answer of the head API.
type ErrorBody struct {
	Error string `json:"error"`
	// Kind names the sentinel ("invalid", "never_fits", "no_capacity", "not_found",
	// "exists", "stale", "unavailable", "unauthenticated").
	Kind string `json:"kind,omitempty"`
	// Leader is the leader's replica id, on a 421 from a follower.
	Leader uint64 `json:"leader,omitempty"`
	// RetryAfterMS is when to retry a submission refused for saturation (429).
	RetryAfterMS int64 `json:"retry_after_ms,omitempty"`
}

var errorKinds = []struct {
	kind string
	err  error
	code int
}{
	{"invalid", ErrInvalid, http.StatusBadRequest},
	{"never_fits", ErrNeverFits, http.StatusUnprocessableEntity},
	{"no_capacity", ErrNoCapacity, http.StatusConflict},
	{"not_found", ErrNotFound, http.StatusNotFound},
	{"exists", ErrExists, http.StatusConflict},
	{"stale", ErrStale, http.StatusGone},
	{"unavailable", ErrUnavailable, http.StatusServiceUnavailable},
	{"unauthenticated", ErrUnauthenticated, http.StatusUnauthorized},
	{"forbidden", ErrForbidden, http.StatusForbidden},
	{"saturated", ErrSaturated, http.StatusTooManyRequests},
	{"too_large", ErrTooLarge, http.StatusRequestEntityTooLarge},
}

// Body is the error answer of err: its status and body (with the retry hint of a
// saturation refusal).
func Body(err error) (int, ErrorBody) {
	code, kind := ErrorStatus(err)
	b := ErrorBody{Error: err.Error(), Kind: kind}
	if d, ok := RetryAfter(err); ok {
		b.RetryAfterMS = d.Milliseconds()
	}
	return code, b
}

// ErrorStatus maps an error to its HTTP status and body kind.
func ErrorStatus(err error) (int, string) {
	for _, k := range errorKinds {
		if errors.Is(err, k.err) {
			return k.code, k.kind
		}
	}
	return http.StatusInternalServerError, ""
}

// apiError is an error answered by a head: its text is the head's, and Is matches the
// sentinel its kind names.
type apiError struct {
	msg      string
	sentinel error
}

func (e *apiError) Error() string { return e.msg }
func (e *apiError) Unwrap() error { return e.sentinel }

func errorFromBody(b ErrorBody, status int) error {
	if b.Kind == "saturated" {
		return &SaturatedError{Msg: b.Error, RetryAfter: time.Duration(b.RetryAfterMS) * time.Millisecond}
	}
	for _, k := range errorKinds {
		if k.kind == b.Kind {
			return &apiError{msg: b.Error, sentinel: k.err}
		}
	}
	if b.Error == "" {
		b.Error = http.StatusText(status)
	}
	return fmt.Errorf("api: head answered %d: %s", status, b.Error)
}

// ClientConfig configures a Client.
type ClientConfig struct {
	// Heads are the heads' API base URLs ("http://127.0.0.1:7001"); list every head.
	Heads []string
	// Token is the cluster secret (sent as a bearer token).
	Token string
	// TLS, when set, is used for https heads (with a client certificate for mutual TLS).
	TLS *tls.Config
	// AttemptTimeout bounds one request to one head. Default 5 s (watches add their wait).
	AttemptTimeout time.Duration
	// Logger (default no-op).
	Logger *zap.Logger
	// MaxConnsPerHead bounds the client's connections to each head, dialing, in use and
	// idle together (0: no bound). A request that finds them all in use waits for one, within
	// its attempt's time. Over HTTP/1.1 every request in flight holds a connection of its
	// own; an agent bounds itself (AgentConnsPerHead) so that a large cluster's agents do not
	// fill a head's bound on connections. Over HTTP/2 a client needs one.
	MaxConnsPerHead int
}

// AgentConnsPerHead is the agents' MaxConnsPerHead: the watch's long poll holds one, the
// load reports, ready reports, reads and writes share the rest. Unbounded, the agents of
// 2,000 machines held 2 to 5 connections each to every head over HTTP/1.1, and every head
// sat at its bound of 10,000 (half of this machine's open-file limit) with new connections,
// and the load reports on them, waiting to be accepted until their machines were declared
// dead (BENCHMARKS.md, "The heads' connections").
const AgentConnsPerHead = 3

// Client talks to the heads: it finds the leader by itself (following the 421 answers of
// followers and trying the other heads when one does not answer), retries what can be
// retried until its context ends, and reads and watches the metadata tables. It is safe for
// concurrent use.
type Client struct {
	cfg ClientConfig
	hc  *http.Client
	log *zap.Logger

	mu     sync.Mutex
	ids    map[uint64]string // replica id -> base URL
	target int               // index into cfg.Heads of the head believed to lead
	meta   *meta.Client
}

// HTTP/2 health checks of a client's connections (NewClient).
const (
	h2PingAfter   = 10 * time.Second
	h2PingTimeout = 10 * time.Second
)

// NewClient returns a client of the heads. It asks each head for its replica id (so that a
// follower's hint names a URL), tolerating heads that do not answer, and fails when none
// answers before ctx ends (ErrUnavailable), or at once when a head refuses the token or
// the client certificate (ErrUnauthenticated).
func NewClient(ctx context.Context, cfg ClientConfig) (*Client, error) {
	if len(cfg.Heads) == 0 {
		return nil, fmt.Errorf("%w: no head addresses", ErrInvalid)
	}
	cfg.Heads = append([]string(nil), cfg.Heads...) // the caller's slice is not ours to trim
	for i, h := range cfg.Heads {
		u, err := url.Parse(h)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("%w: head address %d %q: want http(s)://host:port", ErrInvalid, i+1, h)
		}
		cfg.Heads[i] = strings.TrimRight(h, "/")
	}
	if cfg.MaxConnsPerHead < 0 {
		return nil, fmt.Errorf("%w: MaxConnsPerHead %d: want 0 (no bound) or more", ErrInvalid, cfg.MaxConnsPerHead)
	}
	if cfg.AttemptTimeout == 0 {
		cfg.AttemptTimeout = 5 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = cfg.TLS.Clone() // HTTP/2 adds its protocol to it: the caller's is not ours to change
	tr.MaxIdleConnsPerHost = 64
	tr.MaxConnsPerHost = cfg.MaxConnsPerHead
	// Heads that offer HTTP/2 (atoll head --http2) get one connection for all of a
	// client's requests (a request given up resets its stream, not its connection). A connection that carries
	// nothing for h2PingAfter is pinged, and closed when the ping is not answered within
	// h2PingTimeout: a dead head's connection is not kept (as client-go does).
	tr.ForceAttemptHTTP2 = true
	tr.HTTP2 = &http.HTTP2Config{SendPingTimeout: h2PingAfter, PingTimeout: h2PingTimeout}
	c := &Client{cfg: cfg, hc: &http.Client{Transport: tr}, log: cfg.Logger.Named("api-client"), ids: map[uint64]string{}}
	for {
		if err := c.learnIDs(ctx, false); err == nil {
			break
		} else if errors.Is(err, ErrUnauthenticated) {
			return nil, err
		} else if ctx.Err() != nil {
			return nil, fmt.Errorf("%w: no head answered at %v: %v", ErrUnavailable, cfg.Heads, err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
	conns := map[uint64]meta.Conn{}
	for id, u := range c.ids {
		conns[id] = c.metaConn(u)
	}
	mc, err := meta.NewClient(meta.ClientConfig{AttemptTimeout: cfg.AttemptTimeout, MinBackoff: 2 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, Logger: cfg.Logger,
		Resolve: c.resolve}, conns)
	if err != nil {
		return nil, err
	}
	c.meta = mc
	return c, nil
}

// learnIDs asks every head for its id; it succeeds when at least one answers, and stops at
// the first head that refuses the client (ErrUnauthenticated: no retry can help).
func (c *Client) learnIDs(ctx context.Context, onlyUnknown bool) error {
	var last error
	found := false
	for i, h := range c.cfg.Heads {
		if onlyUnknown && c.knows(h) {
			continue
		}
		var st struct {
			ID     uint64 `json:"id"`
			Leader uint64 `json:"leader"`
		}
		actx, cancel := context.WithTimeout(ctx, min(c.cfg.AttemptTimeout, time.Second))
		_, err := c.once(actx, h, http.MethodGet, "/v1/status", nil, &st)
		cancel()
		if errors.Is(err, ErrUnauthenticated) {
			return err
		}
		if err != nil {
			last = err
			continue
		}
		found = true
		c.mu.Lock()
		c.ids[st.ID] = h
		if st.Leader == st.ID {
			c.target = i
		}
		c.mu.Unlock()
	}
	if !found {
		return last
	}
	return nil
}

// KeepWarm keeps a connection open to every head the client does not believe leads, until
// ctx ends: every `every` (jittered by a quarter either way) it asks each of them for its
// status over the client's pool, whose idle connections would otherwise close after 90 s.
// When the leader dies, a process that keeps warm reaches the new one over a connection
// whose TLS handshake is done: at 2,000 machines every agent's first report to a new
// leader waited behind the other agents' handshakes (two at a time, on a leader given a
// fraction of two cores), timed out, gave up its connection and queued again, for a
// minute. The agents use it (a status request per follower every 30 s: 133 a second at
// 2,000 machines, on heads that otherwise idle).
func (c *Client) KeepWarm(ctx context.Context, every time.Duration) {
	for {
		d := every*3/4 + rand.N(every/2+1)
		select {
		case <-ctx.Done():
			return
		case <-time.After(d):
		}
		c.mu.Lock()
		target := c.target
		c.mu.Unlock()
		for i, h := range c.cfg.Heads {
			if i == target || ctx.Err() != nil {
				continue
			}
			actx, cancel := context.WithTimeout(ctx, min(c.cfg.AttemptTimeout, 5*time.Second))
			_, _ = c.once(actx, h, http.MethodGet, "/v1/status", nil, nil)
			cancel()
		}
	}
}

// metaConn is the metadata client's conn to the head at base URL u.
func (c *Client) metaConn(u string) meta.Conn {
	return meta.HTTPConn{BaseURL: u, Token: c.cfg.Token, HTTP: c.hc}
}

// knows reports whether the client has learned the replica id of the head at u.
func (c *Client) knows(u string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, v := range c.ids {
		if v == u {
			return true
		}
	}
	return false
}

// resolve finds the head of replica id, asking the heads whose ids the client has not
// learned (those that did not answer when it was made): the metadata client's conn to it.
func (c *Client) resolve(ctx context.Context, id uint64) (meta.Conn, bool) {
	u, ok := c.urlOf(id)
	if !ok {
		_ = c.learnIDs(ctx, true)
		u, ok = c.urlOf(id)
	}
	if !ok {
		return nil, false
	}
	return c.metaConn(u), true
}

// Meta is a client of the metadata log (reads, writes, transactions) over the heads.
func (c *Client) Meta() *meta.Client { return c.meta }

// Heads lists the heads' base URLs.
func (c *Client) Heads() []string { return append([]string(nil), c.cfg.Heads...) }

// once sends one request to one head and decodes a 2xx answer into out.
func (c *Client) once(ctx context.Context, base, method, path string, in, out any) (int, error) {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return 0, fmt.Errorf("%w: encode %s: %v", ErrInvalid, path, err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, base+path, body)
	if err != nil {
		return 0, fmt.Errorf("%w: %s %s: %v", ErrInvalid, method, path, err)
	}
	req.Header.Set("Authorization", "Bearer "+c.cfg.Token)
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 256<<20))
	if err != nil {
		// An answer cut short is no answer (status 0: Do tries again, as for a head that did
		// not answer): over HTTP/2 its headers and its body are frames of their own, and an
		// attempt's deadline can fall between them on a starved head.
		return 0, fmt.Errorf("api: read %s from %s: %w", path, base, err)
	}
	if resp.StatusCode/100 == 2 {
		if out != nil && len(data) > 0 {
			if err := json.Unmarshal(data, out); err != nil {
				return resp.StatusCode, fmt.Errorf("api: decode %s from %s: %w", path, base, err)
			}
		}
		return resp.StatusCode, nil
	}
	var eb ErrorBody
	_ = json.Unmarshal(data, &eb)
	if eb.Error == "" {
		eb.Error = strings.TrimSpace(string(data))
	}
	if resp.StatusCode == http.StatusMisdirectedRequest {
		return resp.StatusCode, &notLeader{leader: eb.Leader}
	}
	if resp.StatusCode == http.StatusUnauthorized {
		if strings.Contains(eb.Error, "certificate") {
			return resp.StatusCode, fmt.Errorf("%w: %s: %s", ErrUnauthenticated, base, eb.Error)
		}
		return resp.StatusCode, fmt.Errorf("%w: %s refused the cluster token (is this the right cluster, and the right token file?)", ErrUnauthenticated, base)
	}
	return resp.StatusCode, errorFromBody(eb, resp.StatusCode)
}

type notLeader struct{ leader uint64 }

func (e *notLeader) Error() string { return fmt.Sprintf("not the leader (leader is %d)", e.leader) }

// maxRetryBackoff bounds Do's wait between two attempts while no head answers as leader.
const maxRetryBackoff = 500 * time.Millisecond

// Do sends a request to the leader head and decodes its answer into out, retrying (with
// backoff, on another head when one does not answer) until ctx ends. Errors the head
// answered (invalid, not found, ...) are returned at once.
func (c *Client) Do(ctx context.Context, method, path string, in, out any) error {
	return c.do(ctx, method, path, in, out, false)
}

// do is Do; periodic says the request is sent again on its own schedule (a load report):
// a head that answers "unavailable" (no leader elected yet, or one shedding load) is not
// asked again, the next request comes in its place. Heads that do not answer, and
// redirects, are followed as for any request.
func (c *Client) do(ctx context.Context, method, path string, in, out any, periodic bool) error {
	backoff := 5 * time.Millisecond
	var last error
	for attempt := 0; ; attempt++ {
		c.mu.Lock()
		idx := c.target
		c.mu.Unlock()
		base := c.cfg.Heads[idx]
		actx, cancel := context.WithTimeout(ctx, c.cfg.AttemptTimeout)
		status, err := c.once(actx, base, method, path, in, out)
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil && last != nil {
			// The caller's deadline cut this attempt short: the last answer says more.
			return fmt.Errorf("%w: %s %s: %v (last: %v)", ErrUnavailable, method, path, ctx.Err(), last)
		}
		var nl *notLeader
		retry := false
		switch {
		case errors.As(err, &nl):
			retry = true
			if u, ok := c.leaderURL(ctx, nl.leader); ok {
				c.setTarget(idx, u)
				last = err
				continue
			}
			c.rotate(idx)
		case status == 0: // the head did not answer
			retry = true
			c.rotate(idx)
		case errors.Is(err, ErrUnavailable) && periodic:
			// Every agent of a cluster whose leader died retried its report two or three
			// times a second until a new leader took office: at 1,000 machines, by that
			// schedule, thousands of requests a second on the two heads left, whose
			// election and taking office waited behind them.
			return err
		case errors.Is(err, ErrUnavailable):
			retry = true
			if attempt%4 == 3 {
				c.rotate(idx)
			}
		}
		if !retry {
			return err
		}
		last = err
		if ctx.Err() != nil {
			return fmt.Errorf("%w: %s %s: %v (last: %v)", ErrUnavailable, method, path, ctx.Err(), last)
		}
		// Half the backoff and a random part of the other half: the clients of a whole
		// cluster that lost its leader at once (every agent's) spread their retries
		// instead of arriving together.
		t := time.NewTimer(backoff/2 + rand.N(backoff/2+1))
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w: %s %s: %v (last: %v)", ErrUnavailable, method, path, ctx.Err(), last)
		case <-t.C:
		}
		backoff = min(2*backoff, maxRetryBackoff)
	}
}

// leaderURL is the URL of the head of replica id that a redirect named, asking the heads
// the client has not heard from yet when it does not know it.
func (c *Client) leaderURL(ctx context.Context, id uint64) (string, bool) {
	if id == 0 {
		return "", false
	}
	if u, ok := c.urlOf(id); ok {
		return u, true
	}
	_ = c.learnIDs(ctx, true)
	return c.urlOf(id)
}

func (c *Client) urlOf(id uint64) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	u, ok := c.ids[id]
	return u, ok
}

func (c *Client) setTarget(from int, u string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.target != from {
		return
	}
	for i, h := range c.cfg.Heads {
		if h == u {
			c.target = i
		}
	}
}

func (c *Client) rotate(from int) {
	c.mu.Lock()
	if c.target == from {
		c.target = (from + 1) % len(c.cfg.Heads)
	}
	c.mu.Unlock()
}

// KV is one metadata entry with its version.
type KV = meta.KeyValue

// Listing is a consistent read of a table prefix with the revision to watch from.
type Listing struct {
	Revision int64 `json:"revision"`
	KVs      []KV  `json:"kvs"`
	// More says a ListFirst answer left keys out (past its limit).
	More bool `json:"more,omitempty"`
}

// ListFirst reads the first n keys with the prefix in key order (GET /v1/list with
// limit=n), as List does; More says there are others.
func (c *Client) ListFirst(ctx context.Context, prefix string, n int) (Listing, error) {
	var l Listing
	err := c.Do(ctx, http.MethodGet, fmt.Sprintf("/v1/list?prefix=%s&limit=%d", url.QueryEscape(prefix), n), nil, &l)
	return l, err
}

// List reads every key with the prefix, linearizably (at the leader), with the revision
// to watch from.
func (c *Client) List(ctx context.Context, prefix string) (Listing, error) {
	var l Listing
	err := c.Do(ctx, http.MethodGet, "/v1/list?prefix="+url.QueryEscape(prefix), nil, &l)
	return l, err
}

// WatchAnswer is one answer of GET /v1/watch.
type WatchAnswer struct {
	// Revision is the revision the answer reaches: watch again from it.
	Revision int64        `json:"revision"`
	Events   []meta.Event `json:"events"`
	// Compacted says events after the asked revision are gone: list again.
	Compacted bool `json:"compacted,omitempty"`
}

// WatchOnce returns the events after rev under prefix, waiting up to wait for the first
// one. Any head answers (followers too: revisions are the log's, the same everywhere).
func (c *Client) WatchOnce(ctx context.Context, prefix string, rev int64, wait time.Duration) (WatchAnswer, error) {
	return c.watchOnce(ctx, prefix, "", rev, wait)
}

// watchOnce is WatchOnce with the gangs table filtered for a machine (machine != "").
func (c *Client) watchOnce(ctx context.Context, prefix, machine string, rev int64, wait time.Duration) (WatchAnswer, error) {
	var a WatchAnswer
	path := fmt.Sprintf("/v1/watch?prefix=%s&rev=%d&wait_ms=%d", url.QueryEscape(prefix), rev, wait.Milliseconds())
	if machine != "" {
		path += "&machine=" + url.QueryEscape(machine)
	}
	c.mu.Lock()
	idx := c.target
	c.mu.Unlock()
	actx, cancel := context.WithTimeout(ctx, wait+c.cfg.AttemptTimeout)
	defer cancel()
	_, err := c.once(actx, c.cfg.Heads[idx], http.MethodGet, path, nil, &a)
	var nl *notLeader
	switch {
	case err == nil:
	case errors.As(err, &nl):
		// A head that sends the watch to the leader: the next attempt goes there (a
		// resumed watch that asked the same head again would never move).
		if u, ok := c.leaderURL(ctx, nl.leader); ok {
			c.setTarget(idx, u)
		} else {
			c.rotate(idx)
		}
	default: // no answer, or a head that cannot answer now: the next head
		c.rotate(idx)
	}
	return a, err
}

// Watch lists prefix and then follows its changes: fn sees the whole listing first (reset
// true), then each batch of events; a watch a head interrupted (it failed, it was
// restarting) resumes from its revision on any head, and only after a gap (the events
// since were compacted) does fn see a fresh listing again. It returns when ctx ends or fn returns an error.
func (c *Client) Watch(ctx context.Context, prefix string, fn func(reset bool, l Listing, events []meta.Event) error) error {
	return c.watch(ctx, prefix, "", fn)
}

// WatchPlaced is Watch of the gangs table as the agent of machine needs it: the records
// that concern it (GangConcerns), deletes, and nothing else. The heads filter it.
func (c *Client) WatchPlaced(ctx context.Context, machine string, fn func(reset bool, l Listing, events []meta.Event) error) error {
	return c.watch(ctx, TableGangs, machine, fn)
}

func (c *Client) watch(ctx context.Context, prefix, machine string, fn func(reset bool, l Listing, events []meta.Event) error) error {
	const wait = 10 * time.Second
	for {
		var l Listing
		path := "/v1/list?prefix=" + url.QueryEscape(prefix)
		if machine != "" {
			path += "&machine=" + url.QueryEscape(machine)
		}
		err := c.Do(ctx, http.MethodGet, path, nil, &l)
		if err != nil {
			return err
		}
		if err := fn(true, l, nil); err != nil {
			return err
		}
		rev := l.Revision
		backoff := 20 * time.Millisecond
		for {
			a, err := c.watchOnce(ctx, prefix, machine, rev, wait)
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if err == nil && a.Compacted {
				break // the events after rev are gone: list again
			}
			if err != nil {
				if !watchRetryable(err) {
					return err
				}
				// A revision is the log's, the same on every head: the watch resumes
				// from it (on the next head if this one did not answer) instead of
				// listing the table again. A whole cluster's agents relisting at once
				// when a head dies was the new leader's first minute at scale.
				c.log.Debug("watch interrupted; resuming", zap.String("prefix", prefix), zap.Int64("rev", rev), zap.Error(err))
				t := time.NewTimer(backoff/2 + rand.N(backoff/2+1))
				select {
				case <-ctx.Done():
					t.Stop()
					return ctx.Err()
				case <-t.C:
				}
				backoff = min(2*backoff, maxRetryBackoff)
				continue
			}
			backoff = 20 * time.Millisecond
			if a.Revision > rev {
				rev = a.Revision
			}
			if len(a.Events) > 0 {
				if err := fn(false, Listing{Revision: rev}, a.Events); err != nil {
					return err
				}
			}
		}
	}
}

// watchRetryable says whether a watch that failed with err may be resumed: a head that
// did not answer or could not answer now, yes; a refusal of the request itself (a bad
// prefix, a credential the heads refuse), no.
func watchRetryable(err error) bool {
	return !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrUnauthenticated) && !errors.Is(err, ErrForbidden) && !errors.Is(err, ErrNotFound)
}

// Get reads one key linearizably.
func (c *Client) Get(ctx context.Context, key string, out any) (bool, error) {
	kv, ok, err := c.meta.Get(ctx, key)
	if err != nil || !ok {
		return ok, err
	}
	if err := json.Unmarshal(kv.Value, out); err != nil {
		return true, fmt.Errorf("api: decode %s: %w", key, err)
	}
	return true, nil
}

// Typed calls of the head API.

// RegisterMachine registers (or re-registers) this agent's machine; the answer carries its
// incarnation.
func (c *Client) RegisterMachine(ctx context.Context, m Machine) (Machine, error) {
	var out Machine
	err := c.Do(ctx, http.MethodPost, "/v1/machines/register", m, &out)
	return out, err
}

// ReportLoad sends a machine's load sample to the leader; the answer carries the period
// the leader asks of the reports. Reports are periodic: one that a head answers
// "unavailable" is not retried (the next report takes its place).
func (c *Client) ReportLoad(ctx context.Context, r LoadReport) (LoadAnswer, error) {
	var a LoadAnswer
	err := c.do(ctx, http.MethodPost, "/v1/machines/load", r, &a, true)
	return a, err
}

// SubmitJob creates a job.
func (c *Client) SubmitJob(ctx context.Context, j Job) (Job, error) {
	var out Job
	err := c.Do(ctx, http.MethodPost, "/v1/jobs", j, &out)
	return out, err
}

// StopJob stops a job and all its gangs.
func (c *Client) StopJob(ctx context.Context, job string) error {
	return c.Do(ctx, http.MethodPost, "/v1/jobs/stop?job="+url.QueryEscape(job), nil, nil)
}

// SpawnGang asks the leader to place a gang; the answer is its record (starting, or an
// error wrapping ErrNeverFits or ErrNoCapacity).
func (c *Client) SpawnGang(ctx context.Context, s GangSpec) (Gang, error) {
	var out Gang
	err := c.Do(ctx, http.MethodPost, "/v1/gangs", s, &out)
	return out, err
}

// StopGang stops a gang and frees its GPUs.
func (c *Client) StopGang(ctx context.Context, job, gang string) error {
	return c.Do(ctx, http.MethodPost, "/v1/gangs/stop?job="+url.QueryEscape(job)+"&gang="+url.QueryEscape(gang), nil, nil)
}

// WorkerReady records a ready worker (ErrStale when its generation has ended).
func (c *Client) WorkerReady(ctx context.Context, w Worker) error {
	return c.Do(ctx, http.MethodPost, "/v1/workers/ready", w, nil)
}

// WorkerExited reports a worker that stopped without being asked to.
func (c *Client) WorkerExited(ctx context.Context, e WorkerExit) error {
	return c.Do(ctx, http.MethodPost, "/v1/workers/exited", e, nil)
}

// Yield answers a gang's stop notice: it may stop now (after its checkpoint).
func (c *Client) Yield(ctx context.Context, y Yield) error {
	return c.Do(ctx, http.MethodPost, "/v1/gangs/yield", y, nil)
}

// TakeWorld takes an elastic gang's resize: its program works with the new members.
func (c *Client) TakeWorld(ctx context.Context, w WorldChange) error {
	return c.Do(ctx, http.MethodPost, "/v1/gangs/world", w, nil)
}

// ReportCheckpoint tells the leader a gang committed a checkpoint.
func (c *Client) ReportCheckpoint(ctx context.Context, r CheckpointReport) error {
	return c.Do(ctx, http.MethodPost, "/v1/gangs/checkpointed", r, nil)
}

// ReportCost gives the leader a measured restart cost.
func (c *Client) ReportCost(ctx context.Context, r CostReport) error {
	return c.Do(ctx, http.MethodPost, "/v1/costs", r, nil)
}

// Drain drains a machine (see DrainRequest).
func (c *Client) Drain(ctx context.Context, d DrainRequest) error {
	return c.Do(ctx, http.MethodPost, "/v1/machines/drain", d, nil)
}

// Undrain lifts a machine's drain or cordon (see UndrainRequest).
func (c *Client) Undrain(ctx context.Context, u UndrainRequest) error {
	return c.Do(ctx, http.MethodPost, "/v1/machines/undrain", u, nil)
}

// InjectInterruption injects a spot interruption notice for a pool machine (a drill).
func (c *Client) InjectInterruption(ctx context.Context, r InterruptRequest) error {
	return c.Do(ctx, http.MethodPost, "/v1/pools/interrupt", r, nil)
}

// SchedulerConfig reads the operator's scheduler configuration.
func (c *Client) SchedulerConfig(ctx context.Context) (SchedulerConfig, error) {
	var out SchedulerConfig
	err := c.Do(ctx, http.MethodGet, "/v1/scheduler", nil, &out)
	return out, err
}

// SetSchedulerConfig sets the operator's scheduler configuration; the answer is the
// configuration with its defaults filled in.
func (c *Client) SetSchedulerConfig(ctx context.Context, conf SchedulerConfig) (SchedulerConfig, error) {
	var out SchedulerConfig
	err := c.Do(ctx, http.MethodPut, "/v1/scheduler", conf, &out)
	return out, err
}

// Status is the cluster as the leader sees it.
func (c *Client) Status(ctx context.Context) (Status, error) {
	var s Status
	err := c.Do(ctx, http.MethodGet, "/v1/cluster", nil, &s)
	return s, err
}

// Gang reads a gang's record and its version.
func (c *Client) Gang(ctx context.Context, job, gang string) (Gang, int64, error) {
	kv, ok, err := c.meta.Get(ctx, TableGangs+job+"/"+gang)
	if err != nil {
		return Gang{}, 0, err
	}
	if !ok {
		return Gang{}, 0, fmt.Errorf("%w: gang %s/%s", ErrNotFound, job, gang)
	}
	var g Gang
	if err := json.Unmarshal(kv.Value, &g); err != nil {
		return Gang{}, 0, fmt.Errorf("api: decode gang %s/%s: %w", job, gang, err)
	}
	return g, kv.ModRevision, nil
}

// Workers reads the workers of a gang by rank (those of older generations included; check
// Worker.Generation).
func (c *Client) Workers(ctx context.Context, job, gang string) (map[int]Worker, error) {
	kvs, err := c.meta.Range(ctx, TableWorkers+job+"/"+gang+"/")
	if err != nil {
		return nil, err
	}
	out := map[int]Worker{}
	for _, kv := range kvs {
		var w Worker
		if err := json.Unmarshal(kv.Value, &w); err != nil {
			return nil, fmt.Errorf("api: decode worker %s: %w", kv.Key, err)
		}
		out[w.Rank] = w
	}
	return out, nil
}

// FormatAddress joins head URLs into an ATOLL_ADDRESS value.
func FormatAddress(heads []string) string { return strings.Join(heads, ",") }

// ParseAddress splits an ATOLL_ADDRESS value ("http://h1:7001,http://h2:7001"; a bare
// host:port means http) into head URLs.
func ParseAddress(s string) ([]string, error) {
	var out []string
	for i, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		if !strings.Contains(part, "://") {
			part = "http://" + part
		}
		u, err := url.Parse(part)
		if err != nil || u.Host == "" {
			return nil, fmt.Errorf("%w: address entry %d %q: want http(s)://host:port", ErrInvalid, i+1, part)
		}
		if _, err := strconv.Atoi(u.Port()); err != nil {
			return nil, fmt.Errorf("%w: address entry %d %q has no port", ErrInvalid, i+1, part)
		}
		out = append(out, strings.TrimRight(part, "/"))
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: empty address", ErrInvalid)
	}
	return out, nil
}

// ReportProgress sends a gang's training progress (step, metrics) to the leader, for the
// dashboard.
func (c *Client) ReportProgress(ctx context.Context, p Progress) error {
	return c.Do(ctx, http.MethodPost, "/v1/progress", p, nil)
}

// Events reads the event log after seq (0: from its start), oldest first, at most limit
// (0: all that are kept), with the revision to watch from.
func (c *Client) Events(ctx context.Context, after int64, limit int) ([]Event, int64, error) {
	l, err := c.List(ctx, TableEvents)
	if err != nil {
		return nil, 0, err
	}
	evs, err := DecodeEvents(l.KVs, after)
	if limit > 0 && len(evs) > limit {
		evs = evs[len(evs)-limit:]
	}
	return evs, l.Revision, err
}

// DecodeEvents decodes event records (from a listing or a watch), keeping those after seq.
func DecodeEvents(kvs []KV, after int64) ([]Event, error) {
	var out []Event
	for _, kv := range kvs {
		if len(kv.Value) == 0 {
			continue
		}
		var e Event
		if err := json.Unmarshal(kv.Value, &e); err != nil {
			return out, fmt.Errorf("api: decode event %s: %w", kv.Key, err)
		}
		if e.Seq > after {
			out = append(out, e)
		}
	}
	return out, nil
}
