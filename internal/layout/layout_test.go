// Package layout checks the shape of the module: the layers import one way only, a program
// that imports only the SDK links no control plane, and the heavy optional parts stay in
// modules of their own. It has no code: `go list` is its input.
package layout

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const module = "github.com/atoll-run/atoll"

// layers ranks the module's folders from the bottom: a package may import packages of its
// own rank or lower, never higher. The longest matching prefix decides.
var layers = []struct {
	prefix string
	rank   int
}{
	{"proto/", 0}, {"internal/jsonpos", 0}, {"internal/codec", 0}, {"internal/pki", 0},
	{"internal/cudactx", 0}, {"internal/devcert", 0}, {"internal/jsoncheck", 0}, {"internal/testtime", 0}, {"internal/lockdir", 0}, {"internal/freeport", 0}, {"internal/tlsgate", 0}, {"internal/dockerapi", 0},
	{"topology", 1}, {"store/object", 1}, {"store/paxos", 1}, {"gang", 1},
	{"store/transfer", 2}, {"store/meta", 2}, {"gang/", 2}, {"pools", 2}, {"internal/topoview", 2},
	{"store/meta/metaserver", 3}, {"actors", 3},
	{"runtime/", 4}, {"internal/bench/", 4},
	{"sdk", 5}, {"sdk/", 5},
	{"internal/digits", 6}, {"examples/", 7}, {"cmd/", 8}, {"internal/layout", 9},
}

func rank(t *testing.T, pkg string) int {
	rel := strings.TrimPrefix(strings.TrimPrefix(pkg, module), "/")
	best, r := -1, -1
	for _, l := range layers {
		p := l.prefix
		if rel == strings.TrimSuffix(p, "/") || strings.HasPrefix(rel, p) || (!strings.HasSuffix(p, "/") && strings.HasPrefix(rel, p+"/")) {
			if len(p) > best {
				best, r = len(p), l.rank
			}
		}
	}
	if r < 0 {
		t.Errorf("%s is in no layer: add its folder to layout_test.go's table", pkg)
	}
	return r
}

func goList(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list"}, args...)...)
	cmd.Dir = filepath.Join("..", "..")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %v: %v\n%s", args, err, stderr.String())
	}
	return string(out)
}

// TestLayersImportDownward: no arrow runs back up the layers.
func TestLayersImportDownward(t *testing.T) {
	out := goList(t, "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, "./...")
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		from := rank(t, f[0])
		for _, imp := range f[1:] {
			if !strings.HasPrefix(imp, module+"/") {
				continue
			}
			if to := rank(t, imp); to > from {
				t.Errorf("%s (layer %d) imports %s (layer %d): an arrow up the layers", f[0], from, imp, to)
			}
		}
	}
}

// TestSDKProgramLinksNoControlPlane: a program that imports only the SDK (examples/square)
// links the client side only, and the atoll binary links no benchmark peer.
func TestSDKProgramLinksNoControlPlane(t *testing.T) {
	banned := []string{module + "/runtime/head", module + "/runtime/agent", module + "/store/paxos",
		module + "/store/meta/metaserver", module + "/runtime/dashboard", "go.etcd.io/", "k8s.io/", "github.com/chromedp/", "github.com/hashicorp/serf"}
	for _, pkg := range []string{"./sdk", "./examples/square"} {
		for _, dep := range strings.Fields(goList(t, "-deps", pkg)) {
			for _, b := range banned {
				if strings.HasPrefix(dep, b) {
					t.Errorf("%s links %s", pkg, dep)
				}
			}
		}
	}
	for _, dep := range strings.Fields(goList(t, "-deps", "./cmd/atoll")) {
		if strings.HasPrefix(dep, "go.etcd.io/") || strings.HasPrefix(dep, "github.com/chromedp/") {
			t.Errorf("cmd/atoll links %s", dep)
		}
		if strings.HasPrefix(dep, module+"/examples/") {
			t.Errorf("cmd/atoll imports an example: %s", dep)
		}
	}
}

// TestRootModuleRequiresNoHeavyOptionalParts: client-go, chromedp and etcd's server live
// in the modules that need them (pools/provider/kubernetes, runtime/dashboard/browsertest,
// cmd/atoll-benchmeta), never in the root module's requirements. (A dependency's own
// go.mod may name them, as protoactor-go's names client-go for a cluster provider we do not
// import: that puts them in the graph, not in any build.)
func TestRootModuleRequiresNoHeavyOptionalParts(t *testing.T) {
	cmd := exec.Command("go", "mod", "edit", "-json")
	cmd.Dir = filepath.Join("..", "..")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go mod edit -json: %v", err)
	}
	var mod struct {
		Require []struct{ Path string }
	}
	if err := json.Unmarshal(out, &mod); err != nil {
		t.Fatal(err)
	}
	if len(mod.Require) == 0 {
		t.Fatal("go.mod requires nothing: the test read the wrong file")
	}
	for _, r := range mod.Require {
		for _, m := range []string{"k8s.io/", "github.com/chromedp/", "go.etcd.io/etcd/server/"} {
			if strings.HasPrefix(r.Path, m) {
				t.Errorf("the root go.mod requires %s", r.Path)
			}
		}
	}
}
