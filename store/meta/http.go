package meta

import (
	"bytes"
	"context"
	"crypto/subtle"
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

// DefaultMembershipTimeout bounds a membership change request without timeout_ms
// (adding a replica waits for it to catch up with the log first).
const DefaultMembershipTimeout = 30 * time.Second

// Handler is the head's client API over HTTP: POST /v1/propose (body: JSON Request),
// GET /v1/get?key=K, GET /v1/range?prefix=P, GET /v1/status, and membership changes
// through the log, at the leader: POST /v1/members/add?id=N&addr=HOST:PORT (the new
// replica runs with `atoll head --join`) and POST /v1/members/remove?id=N, each answering
// {"epoch","members"} once the change is chosen (default deadline
// DefaultMembershipTimeout, or timeout_ms). Every call needs
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
	case errors.Is(err, ErrBadRequest), errors.Is(err, paxos.ErrBadConfChange):
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
	} else if strings.HasPrefix(r.URL.Path, "/v1/members/") {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultMembershipTimeout)
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
			"commit": st.Commit, "applied": st.Applied, "revision": h.SM.Revision(), "epoch": st.Epoch, "members": st.Members})
	case "/v1/members/add", "/v1/members/remove":
		if r.Method != http.MethodPost {
			h.fail(w, fmt.Errorf("%w: %s needs POST, got %s", ErrBadRequest, r.URL.Path, r.Method))
			return
		}
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
