package meta

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// ErrorBody is the client API's error answer: {"error": "...", "leader": id}.
type ErrorBody struct {
	Error  string `json:"error"`
	Leader uint64 `json:"leader,omitempty"`
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
	var eb ErrorBody
	json.Unmarshal(out, &eb)
	switch resp.StatusCode {
	case http.StatusMisdirectedRequest:
		return nil, resp.StatusCode, &NotLeaderError{Leader: eb.Leader}
	case http.StatusServiceUnavailable:
		return nil, resp.StatusCode, fmt.Errorf("meta: %s: %s: %w", c.BaseURL, eb.Error, ErrNotLeader)
	case http.StatusBadRequest:
		return nil, resp.StatusCode, fmt.Errorf("meta: %s: %s: %w", c.BaseURL, eb.Error, ErrBadRequest)
	case http.StatusUnauthorized:
		return nil, resp.StatusCode, fmt.Errorf("meta: the head at %s refused this client's token (401): check the client's cluster token: %w", c.BaseURL, ErrUnauthenticated)
	case http.StatusForbidden:
		return nil, resp.StatusCode, fmt.Errorf("meta: %s: %s: %w", c.BaseURL, eb.Error, ErrForbidden)
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
	out, _, err := c.call(ctx, http.MethodPost, "/v1/txn", req)
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

// RangePage implements Conn (GET /v1/range with limit and after).
func (c HTTPConn) RangePage(ctx context.Context, prefix, after string, limit int) (Page, error) {
	q := url.Values{"prefix": {prefix}, "after": {after}, "limit": {strconv.Itoa(limit)}}
	out, _, err := c.call(ctx, http.MethodGet, "/v1/range?"+q.Encode(), nil)
	if err != nil {
		return Page{}, err
	}
	var p Page
	if err := json.Unmarshal(out, &p); err != nil {
		return Page{}, fmt.Errorf("meta: decode a page of %q: %w", prefix, err)
	}
	return p, nil
}

// MembershipResult answers a membership change: the configuration now in effect.
type MembershipResult struct {
	// Epoch is the configuration epoch.
	Epoch uint64 `json:"epoch"`
	// Members are the voting replica ids.
	Members []uint64 `json:"members"`
}

// AddReplica asks this head (it must be the leader: otherwise a *NotLeaderError
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
