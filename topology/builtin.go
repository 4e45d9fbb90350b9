package topology

import (
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strings"
)

// machineFiles holds the built-in machine types, one JSON machine spec per file, in the
// format users write (docs/topology.md). A file's base name is its type name and must equal
// the spec's "name". Adding a machine type is adding a file; machines/README.md says where
// each one's figures come from.
//
//go:embed machines/*.json
var machineFiles embed.FS

// BuiltinNames returns the names of the built-in machine types, sorted.
func BuiltinNames() []string {
	entries, err := fs.ReadDir(machineFiles, "machines")
	if err != nil { // cannot happen: the directory is embedded
		return nil
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		if n, ok := strings.CutSuffix(e.Name(), ".json"); ok {
			names = append(names, n)
		}
	}
	slices.Sort(names) // not ReadDir's order: "dgx-a100-mig.json" sorts before "dgx-a100.json"
	return names
}

// BuiltinMachine returns a fresh copy of a built-in machine type; the caller may change it.
// An unknown name gives an error wrapping ErrUnknownMachine that lists the known names.
func BuiltinMachine(name string) (*MachineSpec, error) {
	unknown := func() error {
		return fmt.Errorf("topology: machine type %.64q: %w (built-in: %s)", name, ErrUnknownMachine, strings.Join(BuiltinNames(), ", "))
	}
	if checkName(name) != nil {
		return nil, unknown() // no file name can be made of it
	}
	file := path.Join("machines", name+".json")
	data, err := machineFiles.ReadFile(file)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, unknown()
	}
	if err != nil {
		return nil, fmt.Errorf("topology: built-in %s: %w", file, err)
	}
	m, err := parseMachine(data, file)
	if err != nil {
		return nil, err
	}
	if m.Name != name {
		return nil, fmt.Errorf("topology: built-in %s: name %q differs from the file name: %w", file, m.Name, ErrInvalidSpec)
	}
	return m, nil
}
