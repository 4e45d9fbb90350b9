package provider

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
)

// Exec is a provider outside this binary: a program run once per operation, as CNI plugins
// and kubectl's credential plugins are. It gets one ExecRequest as JSON on its standard
// input and answers one ExecResponse as JSON on its standard output (ServeExec is that
// side). Providers with large dependencies live there (the Kubernetes provider is
// atoll-provider-kubernetes, its own Go module), so the atoll binary never links them.
//
// Injected interruptions (Interrupter) are not carried: a program that runs per operation
// keeps no notices between calls; a cloud's own notices reach the head through its agents.
type Exec struct {
	cfg ExecConfig
}

// ExecConfig configures an Exec provider.
type ExecConfig struct {
	// Command is the program and its arguments (Command[0] is looked up in PATH).
	Command []string
	// Settings are the pool file's provider settings, passed on as they are.
	Settings json.RawMessage
	// Cluster names the cluster the machines join; Join is the heads' address they dial.
	Cluster, Join string
	// Env is added to the program's environment.
	Env []string
}

// ExecRequest is one operation for an Exec program.
type ExecRequest struct {
	// Op is "launch", "terminate" or "list".
	Op       string          `json:"op"`
	Cluster  string          `json:"cluster"`
	Join     string          `json:"join,omitempty"`
	Settings json.RawMessage `json:"settings,omitempty"`
	// Launch is the launch's request (op launch); Name the machine to stop (op terminate).
	Launch *LaunchRequest `json:"launch,omitempty"`
	Name   string         `json:"name,omitempty"`
}

// ExecResponse is an Exec program's answer. Kind classifies an error: "no_capacity",
// "invalid", "unavailable" (the sentinels ErrNoCapacity, ErrInvalid, ErrUnavailable), or
// empty for any other failure.
type ExecResponse struct {
	Instances []Instance `json:"instances,omitempty"`
	Error     string     `json:"error,omitempty"`
	Kind      string     `json:"kind,omitempty"`
}

// maxExecAnswer bounds what an Exec program may print.
const maxExecAnswer = 16 << 20

var _ Provider = (*Exec)(nil)

// NewExec checks the configuration and finds the program.
func NewExec(cfg ExecConfig) (*Exec, error) {
	if len(cfg.Command) == 0 || cfg.Command[0] == "" {
		return nil, fmt.Errorf("%w: exec provider without a command", ErrInvalid)
	}
	path, err := exec.LookPath(cfg.Command[0])
	if err != nil {
		return nil, fmt.Errorf("%w: exec provider %q: %v", ErrInvalid, cfg.Command[0], err)
	}
	cfg.Command = append([]string{path}, cfg.Command[1:]...)
	return &Exec{cfg: cfg}, nil
}

// Launch implements Provider.
func (e *Exec) Launch(ctx context.Context, req LaunchRequest) error {
	_, err := e.call(ctx, ExecRequest{Op: "launch", Launch: &req})
	return err
}

// Terminate implements Provider.
func (e *Exec) Terminate(ctx context.Context, name string) error {
	_, err := e.call(ctx, ExecRequest{Op: "terminate", Name: name})
	return err
}

// List implements Provider.
func (e *Exec) List(ctx context.Context) ([]Instance, error) {
	r, err := e.call(ctx, ExecRequest{Op: "list"})
	return r.Instances, err
}

func (e *Exec) call(ctx context.Context, req ExecRequest) (ExecResponse, error) {
	req.Cluster, req.Join, req.Settings = e.cfg.Cluster, e.cfg.Join, e.cfg.Settings
	in, err := json.Marshal(req)
	if err != nil {
		return ExecResponse{}, fmt.Errorf("%w: exec provider: %v", ErrInvalid, err)
	}
	cmd := exec.CommandContext(ctx, e.cfg.Command[0], e.cfg.Command[1:]...)
	cmd.Env = append(cmd.Environ(), e.cfg.Env...)
	cmd.Stdin = bytes.NewReader(in)
	var out, stderr bytes.Buffer
	cmd.Stdout = &limitedWriter{w: &out, n: maxExecAnswer}
	cmd.Stderr = &limitedWriter{w: &stderr, n: 64 << 10}
	runErr := cmd.Run()
	var resp ExecResponse
	if derr := json.Unmarshal(out.Bytes(), &resp); derr != nil {
		if runErr == nil {
			runErr = derr
		}
		return ExecResponse{}, fmt.Errorf("%w: exec provider %s %s: %v: %s", ErrUnavailable, e.cfg.Command[0], req.Op, runErr, strings.TrimSpace(stderr.String()))
	}
	if resp.Error != "" {
		return resp, fmt.Errorf("exec provider %s %s: %s: %w", e.cfg.Command[0], req.Op, resp.Error, kindError(resp.Kind))
	}
	if runErr != nil {
		return resp, fmt.Errorf("%w: exec provider %s %s: %v: %s", ErrUnavailable, e.cfg.Command[0], req.Op, runErr, strings.TrimSpace(stderr.String()))
	}
	return resp, nil
}

// errOther is an Exec program's failure of no known kind.
var errOther = errors.New("provider failed")

func kindError(kind string) error {
	switch kind {
	case "no_capacity":
		return ErrNoCapacity
	case "invalid":
		return ErrInvalid
	case "unavailable":
		return ErrUnavailable
	}
	return errOther
}

func errorKind(err error) string {
	switch {
	case errors.Is(err, ErrNoCapacity):
		return "no_capacity"
	case errors.Is(err, ErrInvalid):
		return "invalid"
	case errors.Is(err, ErrUnavailable):
		return "unavailable"
	}
	return ""
}

// ServeExec is an Exec program's side: it reads one ExecRequest from r, makes the provider
// with newProvider (from the request's cluster, join and settings), carries the operation
// out, and writes one ExecResponse to w. It returns the operation's error too, so that the
// program can exit non-zero.
func ServeExec(ctx context.Context, r io.Reader, w io.Writer, newProvider func(ExecRequest) (Provider, error)) error {
	var req ExecRequest
	err := json.NewDecoder(io.LimitReader(r, maxExecAnswer)).Decode(&req)
	if err != nil {
		err = fmt.Errorf("%w: request: %v", ErrInvalid, err)
	}
	var resp ExecResponse
	if err == nil {
		resp, err = serve(ctx, req, newProvider)
	}
	if err != nil {
		resp = ExecResponse{Error: err.Error(), Kind: errorKind(err)}
	}
	if werr := json.NewEncoder(w).Encode(resp); werr != nil && err == nil {
		err = werr
	}
	return err
}

func serve(ctx context.Context, req ExecRequest, newProvider func(ExecRequest) (Provider, error)) (ExecResponse, error) {
	p, err := newProvider(req)
	if err != nil {
		return ExecResponse{}, err
	}
	switch req.Op {
	case "launch":
		if req.Launch == nil {
			return ExecResponse{}, fmt.Errorf("%w: launch without its request", ErrInvalid)
		}
		return ExecResponse{}, p.Launch(ctx, *req.Launch)
	case "terminate":
		return ExecResponse{}, p.Terminate(ctx, req.Name)
	case "list":
		ins, err := p.List(ctx)
		return ExecResponse{Instances: ins}, err
	}
	return ExecResponse{}, fmt.Errorf("%w: op %q: want launch, terminate or list", ErrInvalid, req.Op)
}

// limitedWriter keeps the first n bytes written and drops the rest.
type limitedWriter struct {
	w io.Writer
	n int
}

func (l *limitedWriter) Write(p []byte) (int, error) {
	k := min(len(p), l.n)
	if k > 0 {
		if _, err := l.w.Write(p[:k]); err != nil {
			return 0, err
		}
		l.n -= k
	}
	return len(p), nil
}
