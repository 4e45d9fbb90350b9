package main

import (
	"os/exec"
	"strings"
	"testing"
)

// The etcd baseline lives in this binary only: the atoll binary links no etcd package
// (issue 9: it used to carry an etcd server).
func TestAtollLinksNoEtcd(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/atoll-run/atoll/cmd/atoll").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if strings.Contains(pkg, "etcd") {
			t.Errorf("cmd/atoll depends on %s", pkg)
		}
	}
	out, err = exec.Command("go", "list", "-deps", "github.com/atoll-run/atoll/cmd/atoll-benchmeta").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "go.etcd.io/etcd/server/v3/embed") {
		t.Fatalf("cmd/atoll-benchmeta should link the embedded etcd: %v", err)
	}
}
