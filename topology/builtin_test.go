package topology

import (
	"errors"
	"io/fs"
	"strings"
	"testing"
)

// TestBuiltinFiles: every file under machines/ is a valid machine spec named after its file,
// whose name a shorthand can use (it starts with a letter), with well-formed PCI bus ids,
// and whose cluster builds.
func TestBuiltinFiles(t *testing.T) {
	entries, err := fs.ReadDir(machineFiles, "machines")
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != len(BuiltinNames()) || len(entries) == 0 {
		t.Fatalf("%d files, %d names", len(entries), len(BuiltinNames()))
	}
	for _, n := range BuiltinNames() {
		m, err := BuiltinMachine(n)
		if err != nil {
			t.Fatal(err)
		}
		if c := n[0]; !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z') {
			t.Errorf("%s: a built-in name must start with a letter (shorthands read a leading number as a count)", n)
		}
		for i, g := range m.GPUs {
			if !busIDRE.MatchString(g.PCIBusID) {
				t.Errorf("%s: GPU %d bus id %q is not dddd:bb:dd.f", n, i, g.PCIBusID)
			}
		}
		if m.Description == "" {
			t.Errorf("%s: no description", n)
		}
		c := mustLoad(t, n)
		if c.NumGPUs() == 0 || !c.Machines[0].Simulated {
			t.Errorf("%s: %d GPUs, simulated %v", n, c.NumGPUs(), c.Machines[0].Simulated)
		}
		// Each call returns a fresh copy.
		m.GPUs[0].Model = "changed"
		if again, _ := BuiltinMachine(n); again.GPUs[0].Model == "changed" {
			t.Fatalf("%s: BuiltinMachine returned shared state", n)
		}
	}
	for _, bad := range []string{"", "../machines/dgx-h100", "machines/dgx-h100", "dgx-h100.json", "README", "README.md"} {
		if _, err := BuiltinMachine(bad); !errors.Is(err, ErrUnknownMachine) || !strings.Contains(err.Error(), "dgx-h100") {
			t.Errorf("BuiltinMachine(%q): err = %v, want ErrUnknownMachine listing the names", bad, err)
		}
	}
}
