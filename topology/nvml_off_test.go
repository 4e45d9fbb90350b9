//go:build !nvml || !cgo

package topology

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// TestBuildWithoutNVMLSaysHowToGetIt: the default build compiles no go-nvml; its discovery
// says in one line how to get NVML, and still reads sysfs.
func TestBuildWithoutNVMLSaysHowToGetIt(t *testing.T) {
	if err := SystemNVML().Init(); !errors.Is(err, ErrNoNVML) || !strings.Contains(err.Error(), "-tags nvml") {
		t.Fatalf("Init: %v", err)
	}
	m, rep, err := Discover(context.Background(), DiscoverOptions{SysRoot: fixture, Hostname: "h"})
	if err != nil {
		t.Fatal(err)
	}
	want := "NVML: not available: this atoll was built without NVML; build with -tags nvml"
	if !strings.HasPrefix(rep.NVML, want) || rep.NVMLAvailable || len(m.GPUs) != 0 || len(m.NICs) != 3 || rep.GPUsOnPCI != 3 {
		t.Fatalf("report %+v, machine GPUs %d NICs %d", rep, len(m.GPUs), len(m.NICs))
	}
}
