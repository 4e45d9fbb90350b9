package metaserver

import (
	"context"
	"crypto/subtle"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/atoll-run/atoll/internal/pki"
	"github.com/atoll-run/atoll/store/meta"
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

// Handler is the head's client API over HTTP: POST /v1/propose and POST /v1/txn (body: JSON
// Request; the same here: a head checks the keys of /v1/txn against the caller's role and
// keeps /v1/propose for admin),
// GET /v1/get?key=K, GET /v1/range?prefix=P (with &limit=N&after=K: one page, {"kvs", "next"}), GET /v1/status (this replica's role, commit and
// applied slots, and "disk_full" and "error" while its storage fails), and membership changes
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
	// Authenticated, when set, decides instead of Token whether a request is
	// authenticated: the head's API authenticates every request before it gets here.
	Authenticated func(*http.Request) bool
	// Readable, when set, names the keys a request may read (nil: every key): a get of
	// another is refused, a range keeps only these.
	Readable func(*http.Request) func(key string) bool
	Logger   *zap.Logger
	// RequestTimeout is the deadline of a request without timeout_ms, other than a
	// membership change (default DefaultRequestTimeout).
	RequestTimeout time.Duration
}

func (h *Handler) fail(w http.ResponseWriter, err error) {
	code := http.StatusInternalServerError
	body := meta.ErrorBody{Error: err.Error()}
	var nl *paxos.NotLeaderError
	switch {
	case errors.As(err, &nl) && nl.Leader != 0:
		code, body.Leader = http.StatusMisdirectedRequest, nl.Leader
	case paxos.IsRetryable(err), errors.Is(err, context.DeadlineExceeded), errors.Is(err, paxos.ErrLearnerBehind):
		code = http.StatusServiceUnavailable
	case errors.Is(err, meta.ErrBadRequest), errors.Is(err, paxos.ErrBadConfChange):
		code = http.StatusBadRequest
	case errors.Is(err, meta.ErrUnauthenticated):
		code = http.StatusUnauthorized
	case errors.Is(err, meta.ErrForbidden):
		code = http.StatusForbidden
	case errors.Is(err, errMethod):
		code = http.StatusMethodNotAllowed
	}
	writeError(w, code, body)
}

func writeError(w http.ResponseWriter, code int, body meta.ErrorBody) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(body)
}

// errMethod marks a request with the wrong HTTP method (405).
var errMethod = errors.New("meta: method not allowed")

// routeMethod returns the one method a client API path accepts.
func routeMethod(path string) (string, bool) {
	switch path {
	case "/v1/propose", "/v1/txn", "/v1/members/add", "/v1/members/remove":
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
			return 0, fmt.Errorf("%w: timeout_ms %q must be a whole number of milliseconds >= 1", meta.ErrBadRequest, v)
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
	if h.Authenticated != nil && !h.Authenticated(r) || h.Authenticated == nil && subtle.ConstantTimeCompare([]byte(got), []byte(want)) != 1 {
		log.Warn("unauthenticated client request refused", zap.String("remote", r.RemoteAddr), zap.String("path", r.URL.Path))
		writeError(w, http.StatusUnauthorized, meta.ErrorBody{Error: "unauthenticated: missing or wrong bearer token"})
		return
	}
	method, ok := routeMethod(r.URL.Path)
	if !ok {
		writeError(w, http.StatusNotFound, meta.ErrorBody{Error: fmt.Sprintf("no such path %q", r.URL.Path)})
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
	case "/v1/propose", "/v1/txn":
		body, err := io.ReadAll(io.LimitReader(r.Body, MaxRequestBytes+1))
		if err != nil || len(body) > MaxRequestBytes {
			h.fail(w, fmt.Errorf("%w: body unreadable or over %d bytes", meta.ErrBadRequest, MaxRequestBytes))
			return
		}
		var req meta.Request
		if err := json.Unmarshal(body, &req); err != nil {
			h.fail(w, fmt.Errorf("%w: %v", meta.ErrBadRequest, err))
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
		var keep func(string) bool
		if h.Readable != nil {
			keep = h.Readable(r)
		}
		if r.URL.Path == "/v1/get" {
			key := r.URL.Query().Get("key")
			if keep != nil && !keep(key) {
				h.fail(w, fmt.Errorf("%w: may not read %q", meta.ErrForbidden, key))
				return
			}
			kv, ok := h.SM.Get(key)
			if !ok {
				w.WriteHeader(http.StatusNotFound)
			}
			json.NewEncoder(w).Encode(kv)
			return
		}
		q := r.URL.Query()
		if l := q.Get("limit"); l != "" { // one page: {"kvs": [...], "next": KEY}
			n, err := strconv.Atoi(l)
			if err != nil || n < 1 || n > MaxPage {
				h.fail(w, fmt.Errorf("%w: range limit %q: want 1 to %d", meta.ErrBadRequest, l, MaxPage))
				return
			}
			kvs, next := h.SM.RangePage(q.Get("prefix"), q.Get("after"), n)
			json.NewEncoder(w).Encode(meta.Page{KVs: Keep(kvs, keep), Next: next})
			return
		}
		json.NewEncoder(w).Encode(Keep(h.SM.Range(q.Get("prefix")), keep))
	case "/v1/status":
		st := h.Replica.Status()
		out := map[string]any{"id": st.ID, "role": st.Role.String(), "leader": st.Leader,
			"commit": st.Commit, "applied": st.Applied, "revision": h.SM.Revision(), "epoch": st.Epoch, "members": st.Members,
			"ballot": st.Promised} // the highest ballot promised: it rises at every election
		if err := h.Replica.Err(); err != nil { // a full disk it waits out, or the failure that stopped it
			out["disk_full"], out["error"] = errors.Is(err, paxos.ErrDiskFull), err.Error()
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(out)
	case "/v1/members/add", "/v1/members/remove":
		q := r.URL.Query()
		id, err := strconv.ParseUint(q.Get("id"), 10, 16)
		if err != nil || id == 0 {
			h.fail(w, fmt.Errorf("%w: id %q must be a replica id in 1..65535", meta.ErrBadRequest, q.Get("id")))
			return
		}
		if r.URL.Path == "/v1/members/add" {
			addr := q.Get("addr")
			if _, _, err := net.SplitHostPort(addr); err != nil {
				h.fail(w, fmt.Errorf("%w: addr %q must be host:port: %v", meta.ErrBadRequest, addr, err))
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
		json.NewEncoder(w).Encode(meta.MembershipResult{Epoch: st.Epoch, Members: st.Members})
	}
}

// NewHTTPServer returns an http.Server for a Handler with the client API's timeouts. With
// tlsConfig set it serves mutual TLS (client certificates required and verified against
// tlsConfig.ClientCAs): start it with srv.ServeTLS(ln, "", ""), otherwise srv.Serve(ln).
func NewHTTPServer(h http.Handler, tlsConfig *tls.Config) *http.Server {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: 2 * time.Minute}
	if tlsConfig != nil {
		srv.TLSConfig = tlsConfig.Clone()
		pki.RequireClientCert(srv.TLSConfig)
	}
	return srv
}

// MaxPage bounds the keys of one page of /v1/range.
const MaxPage = 10000

// Keep returns the pairs whose keys keep accepts (all of them when keep is nil).
func Keep(kvs []meta.KeyValue, keep func(key string) bool) []meta.KeyValue {
	if keep == nil {
		return kvs
	}
	out := kvs[:0:0]
	for _, kv := range kvs {
		if keep(kv.Key) {
			out = append(out, kv)
		}
	}
	return out
}
