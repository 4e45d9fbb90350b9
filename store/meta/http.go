package meta

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/atoll-run/atoll/store/paxos"
)

// MaxRequestBytes bounds a client API request body.
const MaxRequestBytes = 4 << 20

// Handler is the head's client API over HTTP: POST /v1/propose (body: JSON Request),
// GET /v1/get?key=K, GET /v1/range?prefix=P, GET /v1/status. Every call needs
// "Authorization: Bearer <token>". A follower answers 421 with {"leader": id}; no leader
// yet answers 503 (retryable).
type Handler struct {
	Replica *paxos.Replica
	SM      *StateMachine
	Token   string
	Logger  *zap.Logger
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
	case paxos.IsRetryable(err), errors.Is(err, context.DeadlineExceeded):
		code = http.StatusServiceUnavailable
	case errors.Is(err, ErrBadRequest):
		code = http.StatusBadRequest
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(body)
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
		http.Error(w, "unauthenticated", http.StatusUnauthorized)
		return
	}
	ctx := r.Context()
	if d, err := strconv.Atoi(r.URL.Query().Get("timeout_ms")); err == nil && d > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(d)*time.Millisecond)
		defer cancel()
	}
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
			"commit": st.Commit, "applied": st.Applied, "revision": h.SM.Revision()})
	default:
		http.NotFound(w, r)
	}
}

// HTTPConn is a Conn to a head's client API.
type HTTPConn struct {
	// BaseURL is like "http://127.0.0.1:7001".
	BaseURL string
	Token   string
	HTTP    *http.Client
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
	}
	return nil, resp.StatusCode, fmt.Errorf("meta: %s %s: status %d: %s", method, path, resp.StatusCode, out)
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
