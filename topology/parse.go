package topology

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/atoll-run/atoll/internal/jsonpos"
)

// ParseSpecFile reads a JSON spec file: either one machine (an object with "gpus") or a
// cluster (an object with "machines"). A single machine becomes a cluster of one (or of
// one NVLink domain for rack fabrics). The spec is validated (names, the bounds on every
// number, contradictions; see docs/topology.md). Errors name the file, line:col and JSON
// path of each problem and wrap ErrSyntax or ErrInvalidSpec.
func ParseSpecFile(path string) (*ClusterSpec, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("topology: read spec: %w", err)
	}
	return ParseSpec(data, path)
}

// ParseSpec parses and validates spec JSON as ParseSpecFile does; name (a file name) is
// used in error messages.
func ParseSpec(data []byte, name string) (*ClusterSpec, error) {
	if name == "" {
		name = "<spec>"
	}
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 {
		return nil, fmt.Errorf("topology: %s: empty file, want a JSON object with \"gpus\" (a machine) or \"machines\" (a cluster): %w", name, ErrSyntax)
	}
	if trimmed[0] != '{' {
		return nil, fmt.Errorf("topology: %s: want a JSON object with \"gpus\" (a machine) or \"machines\" (a cluster), found %q...: %w",
			name, trimmed[:min(len(trimmed), 16)], ErrSyntax)
	}
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(trimmed, &keys); err != nil {
		return nil, jsonError(name, data, err)
	}
	var spec *ClusterSpec
	switch {
	case keys["machines"] != nil:
		spec = &ClusterSpec{}
		if err := strictDecode(data, spec); err != nil {
			return nil, jsonError(name, data, err)
		}
		for _, g := range spec.Machines {
			if g.Machine != nil {
				normalizeMachine(g.Machine)
			}
		}
		for k, mt := range spec.MachineTypes {
			if mt != nil {
				normalizeMachine(mt)
				if mt.Name == "" {
					mt.Name = k
				}
			}
		}
	case keys["gpus"] != nil:
		m := &MachineSpec{}
		if err := strictDecode(data, m); err != nil {
			return nil, jsonError(name, data, err)
		}
		normalizeMachine(m)
		spec = &ClusterSpec{Name: m.Name, Machines: []MachineGroup{{Machine: m}}}
	default:
		return nil, fmt.Errorf("topology: %s: the top-level object has neither \"gpus\" (a machine) nor \"machines\" (a cluster): %w", name, ErrSyntax)
	}
	var p problems
	if keys["gpus"] != nil {
		// Paths in a machine file start at its top level.
		spec.Machines[0].Machine.validate("", &p)
	} else {
		spec.validate(&p, spec.resolver())
	}
	if err := p.err("", name, data); err != nil {
		return nil, err
	}
	if spec.Name == "" {
		spec.Name = name
	}
	return spec, nil
}

// parseMachine parses and validates one machine spec file (a built-in); name is the file
// name used in errors.
func parseMachine(data []byte, name string) (*MachineSpec, error) {
	m := &MachineSpec{}
	if err := strictDecode(data, m); err != nil {
		return nil, jsonError(name, data, err)
	}
	normalizeMachine(m)
	var p problems
	m.validate("", &p)
	if err := p.err("", name, data); err != nil {
		return nil, err
	}
	return m, nil
}

// normalizeMachine fills omitted GPU indexes (an index of 0 past position 0 means omitted).
func normalizeMachine(m *MachineSpec) {
	for i := range m.GPUs {
		if m.GPUs[i].Index == 0 {
			m.GPUs[i].Index = i
		}
	}
}

func strictDecode(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if _, ok := err.(*json.SyntaxError); ok {
			return err
		}
		if _, ok := err.(*json.UnmarshalTypeError); ok {
			return err
		}
		// Unknown fields: report where the decoder stopped.
		return &offsetError{err: err, offset: dec.InputOffset()}
	}
	if dec.More() {
		return &offsetError{err: errors.New("unexpected data after the top-level object"), offset: dec.InputOffset()}
	}
	return nil
}

type offsetError struct {
	err    error
	offset int64
}

func (e *offsetError) Error() string { return e.err.Error() }

// jsonError turns an encoding/json error into one naming the file, line:col and JSON path.
func jsonError(name string, data []byte, err error) error {
	var (
		syn *json.SyntaxError
		typ *json.UnmarshalTypeError
		off *offsetError
	)
	switch {
	case errors.As(err, &syn):
		// Offset counts the offending byte; point at it.
		line, col := jsonpos.LineCol(data, syn.Offset-1)
		return fmt.Errorf("topology: %s:%d:%d: %s: %w", name, line, col, syn.Error(), ErrSyntax)
	case errors.As(err, &typ):
		line, col := jsonpos.LineCol(data, typ.Offset)
		path := typ.Field
		if path == "" {
			path = "(top level)"
		}
		return fmt.Errorf("topology: %s:%d:%d: at %s: expected %s, found JSON %s: %w", name, line, col, path, typ.Type, typ.Value, ErrSyntax)
	case errors.As(err, &off):
		at := off.offset
		// For an unknown field, point at its key: the last occurrence before where the
		// decoder stopped.
		if f, ok := strings.CutPrefix(off.err.Error(), "json: unknown field "); ok {
			if k := bytes.LastIndex(data[:min(at, int64(len(data)))], []byte(f)); k >= 0 {
				at = int64(k)
			}
		}
		line, col := jsonpos.LineCol(data, at)
		msg := strings.TrimPrefix(off.err.Error(), "json: ")
		return fmt.Errorf("topology: %s:%d:%d: %s: %w", name, line, col, msg, ErrSyntax)
	}
	return fmt.Errorf("topology: %s: %v: %w", name, err, ErrSyntax)
}

// locate finds, for each JSON path (as join and joinKey build them), the 1-based line and
// column of its value in data, or of the nearest enclosing value present. It reads data,
// which has already been decoded without error, once.
func locate(data []byte, paths []string) map[string][2]int {
	type best struct {
		depth int
		at    int64
	}
	found := make(map[string]best, len(paths))
	dec := json.NewDecoder(bytes.NewReader(data))
	start := func() int64 { // where the next value begins
		at := dec.InputOffset()
		for at < int64(len(data)) && strings.IndexByte(" \t\r\n:,", data[at]) >= 0 {
			at++
		}
		return at
	}
	var walk func(path string) bool
	walk = func(path string) bool {
		at := start()
		for _, t := range paths {
			if t == path || path == "" || strings.HasPrefix(t, path) && strings.IndexByte(".[", t[len(path)]) >= 0 {
				if b, ok := found[t]; !ok || len(path) >= b.depth {
					found[t] = best{depth: len(path), at: at}
				}
			}
		}
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		switch tok {
		case json.Delim('{'):
			for dec.More() {
				k, err := dec.Token()
				key, ok := k.(string)
				if err != nil || !ok || !walk(joinKey(path, key)) {
					return false
				}
			}
		case json.Delim('['):
			for i := 0; dec.More(); i++ {
				if !walk(join(path, "["+strconv.Itoa(i)+"]")) {
					return false
				}
			}
		default:
			return true
		}
		_, err = dec.Token() // the closing delimiter
		return err == nil
	}
	walk("")
	out := make(map[string][2]int, len(found))
	for t, b := range found {
		line, col := jsonpos.LineCol(data, b.at)
		out[t] = [2]int{line, col}
	}
	return out
}

// Load builds a cluster from a built-in machine name ("dgx-h100"), a shorthand
// ("64xdgx-h100/8") or a spec file path. A string naming an existing file is read as a
// file; otherwise it must parse as a shorthand.
func Load(nameOrFileOrShorthand string) (*Cluster, error) {
	s := strings.TrimSpace(nameOrFileOrShorthand)
	if st, err := os.Stat(s); err == nil && !st.IsDir() {
		spec, err := ParseSpecFile(s)
		if err != nil {
			return nil, err
		}
		return Build(spec)
	}
	spec, err := ParseShorthand(s)
	if err != nil {
		if strings.HasSuffix(s, ".json") || strings.ContainsRune(s, os.PathSeparator) {
			return nil, fmt.Errorf("topology: %q is neither a readable spec file nor a shorthand: %w", s, err)
		}
		return nil, err
	}
	return Build(spec)
}
