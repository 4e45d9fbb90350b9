package meta

import (
	"bytes"
	"context"
	"crypto/subtle"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/atoll-run/atoll/store/paxos"
)

// MaxRequestBytes bounds a client API request body.
const MaxRequestBytes = 4 << 20

// Server-side deadlines of the client API: every request has one, so that no request waits
// forever while there is no quorum.
const (
	// DefaultRequestTimeout bounds a request without timeout_ms (Handler.RequestTimeout
	// overrides it).
	DefaultRequestTimeout = 10 * time.Second
	// DefaultMembershipTimeout bounds a membership change request without timeout_ms
	// (adding a replica waits for it to catch up with the log first).
	DefaultMembershipTimeout = 30 * time.Second
	// MaxRequestTimeout caps timeout_ms: a longer one is shortened to it.
	MaxRequestTimeout = 5 * time.Minute
)

// Handler is the head's client API over HTTP: POST /v1/propose (body: JSON Request),
// GET /v1/get?key=K, GET /v1/range?prefix=P, GET /v1/status, and membership changes
// through the log, at the leader: POST /v1/members/add?id=N&addr=HOST:PORT (the new
// replica runs with `atoll head --join`) and POST /v1/members/remove?id=N, each answering
// {"epoch","members"} once the change is chosen. Any other method is refused (405): a
// write is never a GET.
//
// Every call needs "Authorization: Bearer <token>" (401 otherwise). Every call has a
// deadline: timeout_ms (milliseconds, at most MaxRequestTimeout) or, without it,
// RequestTimeout (DefaultRequestTimeout) and DefaultMembershipTimeout for membership
// changes. A follower answers 421 with {"leader": id}; no leader yet (or a deadline passed)
// answers 503 (retryable); a malformed request 400. Errors are JSON {"error": "..."}.
// Serve it over TLS with an http.Server whose TLSConfig requires client certificates for
// mutual TLS; the token is checked either way.
type Handler struct {
	Replica *paxos.Replica
	SM      *StateMachine
	Token   string
	Logger  *zap.Logger
	// RequestTimeout is the deadline of a request without timeout_ms, other than a
	// membership change (default DefaultRequestTimeout).
	RequestTimeout time.Duration
}

type errorBody struct {
	Error  string `json:"error"`
	Leader uint64 `json:"leader,omitempty"`
}

func (h *Handler) fail(w http.ResponseWriter, err error) {
	code := http.StatusInternalServerError
	body := errorBody{Error: err.Error()}
	var nl *paxos.NotLeaderError
	switch {
	case errors.As(err, &nl) && nl.Leader != 0:
		code, body.Leader = http.StatusMisdirectedRequest, nl.Leader
	case paxos.IsRetryable(err), errors.Is(err, context.DeadlineExceeded), errors.Is(err, paxos.ErrLearnerBehind):
		code = http.StatusServiceUnavailable
	case errors.Is(err, ErrBadRequest), errors.Is(err, paxos.ErrBadConfChange):
		code = http.StatusBadRequest
	case errors.Is(err, ErrUnauthenticated):
		code = http.StatusUnauthorized
	case errors.Is(err, errMethod):
		code = http.StatusMethodNotAllowed
	}
	writeError(w, code, body)
}

func writeError(w http.ResponseWriter, code int, body errorBody) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(body)
}

// errMethod marks a request with the wrong HTTP method (405).
var errMethod = errors.New("meta: method not allowed")

// routeMethod returns the one method a client API path accepts.
func routeMethod(path string) (string, bool) {
	switch path {
	case "/v1/propose", "/v1/members/add", "/v1/members/remove":
		return http.MethodPost, true
	case "/v1/get", "/v1/range", "/v1/status":
		return http.MethodGet, true
	}
	return "", false
}

// deadline returns the request's timeout: timeout_ms when given (capped at
// MaxRequestTimeout), else the path's default.
func (h *Handler) deadline(r *http.Request) (time.Duration, error) {
	if v := r.URL.Query().Get("timeout_ms"); v != "" {
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil || ms < 1 {
			return 0, fmt.Errorf("%w: timeout_ms %q must be a whole number of milliseconds >= 1", ErrBadRequest, v)
		}
		if ms > MaxRequestTimeout.Milliseconds() {
			return MaxRequestTimeout, nil
		}
		return time.Duration(ms) * time.Millisecond, nil
	}
	if strings.HasPrefix(r.URL.Path, "/v1/members/") {
		return DefaultMembershipTimeout, nil
	}
	if h.RequestTimeout > 0 {
		return h.RequestTimeout, nil
	}
	return DefaultRequestTimeout, nil
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	log := h.Logger
	if log == nil {
		log = zap.NewNop()
	}
	got := r.Header.Get("Authorization")
	want := "Bearer " + h.Token
	if subtle.ConstantTimeCompare([]byte(got), []byte(want)) != 1 {
		log.Warn("unauthenticated client request refused", zap.String("remote", r.RemoteAddr), zap.String("path", r.URL.Path))
		writeError(w, http.StatusUnauthorized, errorBody{Error: "unauthenticated: missing or wrong bearer token"})
		return
	}
	method, ok := routeMethod(r.URL.Path)
	if !ok {
		writeError(w, http.StatusNotFound, errorBody{Error: fmt.Sprintf("no such path %q", r.URL.Path)})
		return
	}
	if r.Method != method {
		w.Header().Set("Allow", method)
		h.fail(w, fmt.Errorf("%w: %s needs %s, got %s", errMethod, r.URL.Path, method, r.Method))
		return
	}
	timeout, err := h.deadline(r)
	if err != nil {
		h.fail(w, err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), timeout)
	defer cancel()
	switch r.URL.Path {
	case "/v1/propose":
		body, err := io.ReadAll(io.LimitReader(r.Body, MaxRequestBytes+1))
		if err != nil || len(body) > MaxRequestBytes {
			h.fail(w, fmt.Errorf("%w: body unreadable or over %d bytes", ErrBadRequest, MaxRequestBytes))
			return
		}
		var req Request
		if err := json.Unmarshal(body, &req); err != nil {
			h.fail(w, fmt.Errorf("%w: %v", ErrBadRequest, err))
			return
		}
		if err := req.Validate(); err != nil {
			h.fail(w, err)
			return
		}
		out, err := h.Replica.Propose(ctx, body)
		if err != nil {
			h.fail(w, err)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(out)
	case "/v1/get", "/v1/range":
		if err := h.Replica.Read(ctx); err != nil {
			h.fail(w, err)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/v1/get" {
			kv, ok := h.SM.Get(r.URL.Query().Get("key"))
			if !ok {
				w.WriteHeader(http.StatusNotFound)
			}
			json.NewEncoder(w).Encode(kv)
			return
		}
		json.NewEncoder(w).Encode(h.SM.Range(r.URL.Query().Get("prefix")))
	case "/v1/status":
		st := h.Replica.Status()
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"id": st.ID, "role": st.Role.String(), "leader": st.Leader,
			"commit": st.Commit, "applied": st.Applied, "revision": h.SM.Revision(), "epoch": st.Epoch, "members": st.Members})
	case "/v1/members/add", "/v1/members/remove":
		q := r.URL.Query()
		id, err := strconv.ParseUint(q.Get("id"), 10, 16)
		if err != nil || id == 0 {
			h.fail(w, fmt.Errorf("%w: id %q must be a replica id in 1..65535", ErrBadRequest, q.Get("id")))
			return
		}
		if r.URL.Path == "/v1/members/add" {
			addr := q.Get("addr")
			if _, _, err := net.SplitHostPort(addr); err != nil {
				h.fail(w, fmt.Errorf("%w: addr %q must be host:port: %v", ErrBadRequest, addr, err))
				return
			}
			err = h.Replica.AddReplica(ctx, id, addr)
		} else {
			err = h.Replica.RemoveReplica(ctx, id)
		}
		if err != nil {
			log.Warn("membership change failed", zap.String("path", r.URL.Path), zap.Uint64("replica", id), zap.Error(err))
			h.fail(w, err)
			return
		}
		st := h.Replica.Status()
		log.Info("membership changed", zap.String("path", r.URL.Path), zap.Uint64("replica", id), zap.Uint64("epoch", st.Epoch), zap.Uint64s("members", st.Members))
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(MembershipResult{Epoch: st.Epoch, Members: st.Members})
	}
}

// NewHTTPServer returns an http.Server for a Handler with the client API's timeouts. With
// tlsConfig set it serves mutual TLS (client certificates required and verified against
// tlsConfig.ClientCAs): start it with srv.ServeTLS(ln, "", ""), otherwise srv.Serve(ln).
func NewHTTPServer(h http.Handler, tlsConfig *tls.Config) *http.Server {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: 2 * time.Minute}
	if tlsConfig != nil {
		srv.TLSConfig = tlsConfig.Clone()
		srv.TLSConfig.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return srv
}

// NewHTTPClient returns an http.Client for HTTPConn that keeps up to maxIdlePerHost
// HTTP/1.1 connections open to each head, over TLS when tlsConfig is set (then use https
// BaseURLs; for mutual TLS the config carries this client's certificate and the heads' CA
// in RootCAs).
func NewHTTPClient(tlsConfig *tls.Config, maxIdlePerHost int) *http.Client {
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost: maxIdlePerHost,
		IdleConnTimeout:     90 * time.Second,
		TLSHandshakeTimeout: 5 * time.Second,
	}
	if tlsConfig != nil {
		tr.TLSClientConfig = tlsConfig.Clone()
	}
	return &http.Client{Transport: tr}
}

// HTTPConn is a Conn to a head's client API.
type HTTPConn struct {
	// BaseURL is like "http://127.0.0.1:7001", or "https://..." with an HTTP client made
	// by NewHTTPClient with a TLS config.
	BaseURL string
	// Token is the cluster token sent as a bearer token (also over TLS).
	Token string
	// HTTP is the client used (default http.DefaultClient).
	HTTP *http.Client
}

var _ Conn = HTTPConn{}

func (c HTTPConn) call(ctx context.Context, method, path string, body []byte) ([]byte, int, error) {
	u := c.BaseURL + path
	if dl, ok := ctx.Deadline(); ok {
		sep := "?"
		if bytes.ContainsRune([]byte(path), '?') {
			sep = "&"
		}
		u += sep + "timeout_ms=" + strconv.FormatInt(max(1, time.Until(dl).Milliseconds()), 10)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, bytes.NewReader(body))
	if err != nil {
		return nil, 0, fmt.Errorf("meta: http request %s: %w", u, err)
	}
	req.Header.Set("Authorization", "Bearer "+c.Token)
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		if terr := diagnoseTLS(ctx, hc, req.URL.Host, err); terr != nil {
			return nil, 0, fmt.Errorf("meta: %s: %w", c.BaseURL, terr)
		}
		return nil, 0, fmt.Errorf("meta: %s %s: %w", method, c.BaseURL+path, err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, 0, fmt.Errorf("meta: read %s: %w", path, err)
	}
	switch resp.StatusCode {
	case http.StatusOK, http.StatusNotFound:
		return out, resp.StatusCode, nil
	}
	var eb errorBody
	json.Unmarshal(out, &eb)
	switch resp.StatusCode {
	case http.StatusMisdirectedRequest:
		return nil, resp.StatusCode, &paxos.NotLeaderError{Leader: eb.Leader}
	case http.StatusServiceUnavailable:
		return nil, resp.StatusCode, fmt.Errorf("meta: %s: %s: %w", c.BaseURL, eb.Error, paxos.ErrNotLeader)
	case http.StatusBadRequest:
		return nil, resp.StatusCode, fmt.Errorf("meta: %s: %s: %w", c.BaseURL, eb.Error, ErrBadRequest)
	case http.StatusUnauthorized:
		return nil, resp.StatusCode, fmt.Errorf("meta: the head at %s refused this client's token (401): check the client's cluster token: %w", c.BaseURL, ErrUnauthenticated)
	}
	return nil, resp.StatusCode, fmt.Errorf("meta: %s %s: status %d: %s", method, path, resp.StatusCode, out)
}

// diagnoseTLS tells a TLS refusal (ErrUnauthenticated: this client's certificate or trust
// is wrong, not the head) from other failures of a request to host. The head's refusal of
// a client certificate reaches a TLS 1.3 client only after its handshake, often as a
// broken connection: a new handshake with a read shows the head's alert.
func diagnoseTLS(ctx context.Context, hc *http.Client, host string, err error) error {
	tr, ok := hc.Transport.(*http.Transport)
	if !ok || tr.TLSClientConfig == nil || ctx.Err() != nil {
		return nil
	}
	var verr *tls.CertificateVerificationError
	if !errors.As(err, &verr) && !isRemoteAlert(err) {
		dctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		cfg := tr.TLSClientConfig.Clone()
		if cfg.ServerName == "" {
			cfg.ServerName, _, _ = net.SplitHostPort(host)
		}
		conn, derr := (&tls.Dialer{Config: cfg}).DialContext(dctx, "tcp", host)
		if derr == nil {
			conn.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
			_, derr = conn.Read(make([]byte, 1))
			conn.Close()
		}
		err = derr
	}
	switch {
	case errors.As(err, &verr):
		return fmt.Errorf("the head's certificate failed verification (is the client's RootCAs the cluster's CA?): %v: %w", err, ErrUnauthenticated)
	case isRemoteAlert(err):
		return fmt.Errorf("the head refused this client's TLS session (its certificate is missing or not signed by the cluster's CA): %v: %w", err, ErrUnauthenticated)
	}
	return nil
}

// isRemoteAlert reports whether err is a TLS alert sent by the peer (crypto/tls reports it
// as a *net.OpError with Op "remote error").
func isRemoteAlert(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "remote error"
}

// Propose implements Conn.
func (c HTTPConn) Propose(ctx context.Context, req []byte) ([]byte, error) {
	out, _, err := c.call(ctx, http.MethodPost, "/v1/propose", req)
	return out, err
}

// Get implements Conn.
func (c HTTPConn) Get(ctx context.Context, key string) (KeyValue, bool, error) {
	out, code, err := c.call(ctx, http.MethodGet, "/v1/get?key="+url.QueryEscape(key), nil)
	if err != nil {
		return KeyValue{}, false, err
	}
	var kv KeyValue
	if err := json.Unmarshal(out, &kv); err != nil {
		return KeyValue{}, false, fmt.Errorf("meta: decode get %q: %w", key, err)
	}
	return kv, code == http.StatusOK, nil
}

// Range implements Conn.
func (c HTTPConn) Range(ctx context.Context, prefix string) ([]KeyValue, error) {
	out, _, err := c.call(ctx, http.MethodGet, "/v1/range?prefix="+url.QueryEscape(prefix), nil)
	if err != nil {
		return nil, err
	}
	var kvs []KeyValue
	if err := json.Unmarshal(out, &kvs); err != nil {
		return nil, fmt.Errorf("meta: decode range %q: %w", prefix, err)
	}
	return kvs, nil
}

// MembershipResult answers a membership change: the configuration now in effect.
type MembershipResult struct {
	// Epoch is the configuration epoch.
	Epoch uint64 `json:"epoch"`
	// Members are the voting replica ids.
	Members []uint64 `json:"members"`
}

// AddReplica asks this head (it must be the leader: otherwise a *paxos.NotLeaderError
// names it) to add replica id, reachable by the other replicas at addr, through the log.
func (c HTTPConn) AddReplica(ctx context.Context, id uint64, addr string) (MembershipResult, error) {
	return c.member(ctx, fmt.Sprintf("/v1/members/add?id=%d&addr=%s", id, url.QueryEscape(addr)))
}

// RemoveReplica asks this head (the leader) to remove replica id through the log.
func (c HTTPConn) RemoveReplica(ctx context.Context, id uint64) (MembershipResult, error) {
	return c.member(ctx, fmt.Sprintf("/v1/members/remove?id=%d", id))
}

func (c HTTPConn) member(ctx context.Context, path string) (MembershipResult, error) {
	out, _, err := c.call(ctx, http.MethodPost, path, nil)
	if err != nil {
		return MembershipResult{}, err
	}
	var res MembershipResult
	if err := json.Unmarshal(out, &res); err != nil {
		return MembershipResult{}, fmt.Errorf("meta: decode %s: %w", path, err)
	}
	return res, nil
}
