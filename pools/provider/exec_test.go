package provider

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// dirProvider keeps its machines as files in a directory, so that an Exec program, run
// once per operation, finds what the last one did.
type dirProvider struct {
	dir     string
	cluster string
	full    bool
}

func newDirProvider(dir string, req ExecRequest) (*dirProvider, error) {
	var s struct {
		Full bool `json:"full"`
	}
	if len(req.Settings) > 0 {
		dec := json.NewDecoder(strings.NewReader(string(req.Settings)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&s); err != nil {
			return nil, fmt.Errorf("%w: settings: %v", ErrInvalid, err)
		}
	}
	return &dirProvider{dir: dir, cluster: req.Cluster, full: s.Full}, nil
}

func (d *dirProvider) Launch(_ context.Context, req LaunchRequest) error {
	if d.full {
		return fmt.Errorf("%w: the test says so", ErrNoCapacity)
	}
	for _, n := range req.Names {
		if err := os.WriteFile(filepath.Join(d.dir, n), []byte(req.Pool+" "+d.cluster), 0o600); err != nil {
			return err
		}
	}
	return nil
}

func (d *dirProvider) Terminate(_ context.Context, name string) error {
	if err := os.Remove(filepath.Join(d.dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

func (d *dirProvider) List(context.Context) ([]Instance, error) {
	es, err := os.ReadDir(d.dir)
	if err != nil {
		return nil, err
	}
	var out []Instance
	for _, e := range es {
		b, _ := os.ReadFile(filepath.Join(d.dir, e.Name()))
		pool, _, _ := strings.Cut(string(b), " ")
		out = append(out, Instance{Name: e.Name(), Pool: pool, Running: true})
	}
	return out, nil
}

func execProvider(t *testing.T, settings string) *Exec {
	t.Helper()
	dir := t.TempDir()
	e, err := NewExec(ExecConfig{Command: []string{os.Args[0]}, Settings: json.RawMessage(settings), Cluster: "c1",
		Env: []string{"ATOLL_FAKE_EXEC_PROVIDER=" + dir}})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// An Exec provider carries launch, list and terminate to its program and back, one
// process per operation.
func TestExecProviderRoundTrip(t *testing.T) {
	ctx := context.Background()
	e := execProvider(t, "")
	if err := e.Launch(ctx, LaunchRequest{Pool: "h100", Names: []string{"h100-1", "h100-2"}, Machine: "dgx-h100"}); err != nil {
		t.Fatal(err)
	}
	if err := e.Terminate(ctx, "h100-1"); err != nil {
		t.Fatal(err)
	}
	if err := e.Terminate(ctx, "h100-1"); err != nil { // already gone: not an error
		t.Fatal(err)
	}
	ins, err := e.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ins) != 1 || ins[0].Name != "h100-2" || ins[0].Pool != "h100" {
		t.Fatalf("instances %+v, want h100-2 of pool h100", ins)
	}
}

// The program's errors keep their kind across the process boundary; a program that is
// missing, or answers nonsense, is a clear error.
func TestExecProviderErrors(t *testing.T) {
	ctx := context.Background()
	if err := execProvider(t, `{"full": true}`).Launch(ctx, LaunchRequest{Pool: "p", Names: []string{"m"}}); !errors.Is(err, ErrNoCapacity) {
		t.Errorf("a full provider's launch: %v, want ErrNoCapacity", err)
	}
	if _, err := execProvider(t, `{"nosuch": 1}`).List(ctx); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "nosuch") {
		t.Errorf("bad settings: %v, want ErrInvalid naming the field", err)
	}
	if _, err := NewExec(ExecConfig{Command: []string{"atoll-provider-nosuch"}}); !errors.Is(err, ErrInvalid) {
		t.Errorf("a missing program: %v, want ErrInvalid", err)
	}
	if _, err := NewExec(ExecConfig{}); !errors.Is(err, ErrInvalid) {
		t.Errorf("no command: %v, want ErrInvalid", err)
	}
	e, err := NewExec(ExecConfig{Command: []string{"sh", "-c", "echo not json; exit 3"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.List(ctx); !errors.Is(err, ErrUnavailable) {
		t.Errorf("a program answering nonsense: %v, want ErrUnavailable", err)
	}
}

// ServeExec refuses an unknown operation and a malformed request, and still answers JSON.
func TestServeExecRefusesBadRequests(t *testing.T) {
	for _, in := range []string{`{"op":"reboot"}`, `{"op":`, `{"op":"launch"}`} {
		var out strings.Builder
		err := ServeExec(context.Background(), strings.NewReader(in), &out, func(ExecRequest) (Provider, error) { return NewSim(nil), nil })
		var resp ExecResponse
		if !errors.Is(err, ErrInvalid) || json.Unmarshal([]byte(out.String()), &resp) != nil || resp.Kind != "invalid" {
			t.Errorf("%s: err %v, answer %q", in, err, out.String())
		}
	}
	if !slices.Contains([]string{"no_capacity"}, errorKind(fmt.Errorf("x: %w", ErrNoCapacity))) {
		t.Error("errorKind lost a wrapped sentinel")
	}
}
