// Package clustertest starts clusters of atoll processes for the atoll command's tests,
// which live in three test binaries (cmd/atoll, cmd/atoll/scenariotest and
// cmd/atoll/readmetest) so that each stays within go test's default timeout on a busy
// machine.
package clustertest

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/atoll-run/atoll/sdk/sdktest"
)

// built is the atoll binary of this test binary's tests.
var built struct {
	once     sync.Once
	dir, bin string
	err      error
}

// Atoll returns the atoll binary for the tests that run real processes: built once per
// test binary, static (CGO_ENABLED=0) as the containers of deploy/ run it, so that the
// compose test runs the same one; Run removes it.
func Atoll(t testing.TB) string {
	t.Helper()
	built.once.Do(func() {
		if built.dir, built.err = os.MkdirTemp("", "atoll-cmdtest-"); built.err != nil {
			return
		}
		bin := filepath.Join(built.dir, "atoll")
		build := exec.Command("go", "build", "-o", bin, "github.com/atoll-run/atoll/cmd/atoll")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			built.err = fmt.Errorf("go build (CGO_ENABLED=0): %v\n%s", err, out)
			return
		}
		built.bin = bin
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.bin
}

// Run runs a test binary's tests (from its TestMain) and then removes the binary Atoll
// built. The parallel tests run clusters of processes and containers and spend most of
// their time waiting on them: three run at once, not GOMAXPROCS (two on the project's
// machine), unless -parallel says otherwise.
func Run(m *testing.M) int {
	flag.Parse()
	parallelSet := false
	flag.Visit(func(f *flag.Flag) { parallelSet = parallelSet || f.Name == "test.parallel" })
	if !parallelSet {
		_ = flag.Set("test.parallel", "3")
	}
	code := m.Run()
	if built.dir != "" {
		_ = os.RemoveAll(built.dir)
	}
	return code
}

// Up starts a cluster of real processes and stops it when the test ends; upArgs
// are more flags of atoll up.
func Up(t testing.TB, agents int, upArgs ...string) (bin, dir string) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a cluster of processes")
	}
	tmp := t.TempDir()
	bin = Atoll(t)
	dir = filepath.Join(tmp, "cluster")
	out, err := exec.Command(bin, append(append([]string{"up", "--dir", dir, "--agents", fmt.Sprint(agents), "--machine", "dgx-h100"},
		sdktest.UpFlags()...), upArgs...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("atoll up: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		if t.Failed() { // before down, so that the tails show the cluster as the test left it
			PrintLogs(t, dir)
		}
		if out, err := exec.Command(bin, "down", "--dir", dir, "--grace", "5s").CombinedOutput(); err != nil {
			t.Errorf("atoll down: %v\n%s", err, out)
		}
	})
	return bin, dir
}

// PrintLogs prints, for each log of the cluster in dir (its logs/), its warnings and errors (a machine declared
// dead, a lost leader: what explains a failure that started long before the end) and its
// tail.
func PrintLogs(t testing.TB, dir string) {
	logs, _ := filepath.Glob(filepath.Join(dir, "logs", "*.log"))
	for _, l := range logs {
		b, _ := os.ReadFile(l)
		var warn []string
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, `"level":"warn"`) || strings.Contains(line, `"level":"error"`) {
				warn = append(warn, line)
			}
		}
		if len(warn) > 30 {
			warn = append([]string{"..."}, warn[len(warn)-30:]...)
		}
		if len(b) > 3000 {
			b = b[len(b)-3000:]
		}
		t.Logf("--- %s: warnings and errors\n%s\n--- %s (tail)\n%s", filepath.Base(l), strings.Join(warn, "\n"), filepath.Base(l), b)
	}
	// Workers' logs (agents/<machine>/logs/<job>/<gang>.<rank>.g<generation>.log): the tails
	// of those that warned or failed (beyond the remote links dropped as processes end), at
	// most eight; then, up to eight in all, those of a restarted gang's workers (generation
	// above 0), whose restore and first steps a failure after a restart turns on.
	workers, _ := filepath.Glob(filepath.Join(dir, "agents", "*", "logs", "*", "*.log"))
	shown := 0
	show := func(l string, b []byte) {
		shown++
		if len(b) > 2000 {
			b = b[len(b)-2000:]
		}
		rel, _ := filepath.Rel(dir, l)
		t.Logf("--- %s (tail)\n%s", rel, b)
	}
	var restarted []string
	for _, l := range workers {
		b, _ := os.ReadFile(l)
		troubled := false
		for _, line := range strings.Split(string(b), "\n") {
			if (strings.Contains(line, `"level":"warn"`) || strings.Contains(line, `"level":"error"`)) && !strings.Contains(line, "EndpointWriter") {
				troubled = true
				break
			}
		}
		switch {
		case troubled && shown < 8:
			show(l, b)
		case !troubled && !strings.HasSuffix(l, ".g0.log"):
			restarted = append(restarted, l)
		}
	}
	for _, l := range restarted {
		if shown == 8 {
			break
		}
		b, _ := os.ReadFile(l)
		show(l, b)
	}
}
