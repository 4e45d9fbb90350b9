// Package dockerapi is a small client of the Docker Engine API
// (https://docs.docker.com/reference/api/engine/) over its unix socket: JSON calls and
// streamed answers. The pools' Docker provider starts machines with it, and agents run
// process gang members in containers (--image) with it.
package dockerapi

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
)

// DefaultSocket is the Engine's usual socket; DefaultVersion the API version asked for
// (Docker Engine 20.10 and later serve it).
const (
	DefaultSocket  = "/var/run/docker.sock"
	DefaultVersion = "v1.41"
)

// ErrUnreachable: the Engine could not be reached (no socket, no daemon).
var ErrUnreachable = errors.New("docker: the engine cannot be reached")

// Client calls one Engine.
type Client struct {
	version string
	hc      *http.Client
}

// New returns a client of the Engine at socket ("" for DefaultSocket), asking for API
// version ("" for DefaultVersion).
func New(socket, version string) *Client {
	if socket == "" {
		socket = DefaultSocket
	}
	if version == "" {
		version = DefaultVersion
	}
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socket)
	}}
	return &Client{version: version, hc: &http.Client{Transport: tr}}
}

func (c *Client) request(ctx context.Context, method, path string, q url.Values, body any) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	u := "http://docker/" + c.version + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%w: %s %s: %v", ErrUnreachable, method, path, err)
	}
	if resp.StatusCode >= 400 {
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		var e struct {
			Message string `json:"message"`
		}
		_ = json.Unmarshal(b, &e)
		return resp, &Error{Method: method, Path: path, Status: resp.StatusCode, Message: strings.TrimSpace(e.Message)}
	}
	return resp, nil
}

// Error is an answer of the Engine with a status of 400 or more.
type Error struct {
	Method, Path string
	Status       int
	Message      string
}

func (e *Error) Error() string {
	return fmt.Sprintf("docker %s %s: %d %s", e.Method, e.Path, e.Status, e.Message)
}

// Call does one request with a JSON body (nil for none); out, when not nil, receives the
// JSON answer. It returns the status code (0 when the Engine was not reached).
func (c *Client) Call(ctx context.Context, method, path string, q url.Values, body, out any) (int, error) {
	resp, err := c.request(ctx, method, path, q, body)
	if resp == nil {
		return 0, err
	}
	if err != nil {
		return resp.StatusCode, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if out != nil && len(b) > 0 {
		if err := json.Unmarshal(b, out); err != nil {
			return resp.StatusCode, fmt.Errorf("docker %s %s: decode: %w", method, path, err)
		}
	}
	return resp.StatusCode, nil
}

// Stream does one request and returns its answer's body to read as it comes (logs
// followed, a wait): the caller closes it.
func (c *Client) Stream(ctx context.Context, method, path string, q url.Values, body any) (io.ReadCloser, error) {
	resp, err := c.request(ctx, method, path, q, body)
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// Demux copies a container's multiplexed log stream (a container without a terminal:
// frames of an 8-byte header, the stream in its first byte and the length in its last
// four, then the bytes) to w, both streams alike, until the stream ends.
func Demux(w io.Writer, r io.Reader) error {
	var hdr [8]byte
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		n := int64(binary.BigEndian.Uint32(hdr[4:]))
		if _, err := io.CopyN(w, r, n); err != nil {
			return err
		}
	}
}
