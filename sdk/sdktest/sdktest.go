// Package sdktest runs a program's tests on a cluster of real processes: Up starts one with
// `atoll up` (three heads and agents of simulated machines, each its own process) and stops
// it when the test ends. The test connects with sdk.Connect(ctx, c.Address, ...); the
// agents then run the test binary itself as the job's workers, so the test's TestMain must
// serve them:
//
//	func TestMain(m *testing.M) {
//		if sdk.InWorker() { // an agent started this binary as a worker: serve it
//			os.Exit(sdk.WorkerMain(kinds()...))
//		}
//		os.Exit(m.Run())
//	}
package sdktest

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/atoll-run/atoll/internal/testtime"
)

// Cluster is a running cluster of processes.
type Cluster struct {
	// Dir is the cluster's directory (its token, data and logs).
	Dir string
	// Address is what sdk.Connect and ATOLL_ADDRESS take: the heads' URLs and the token
	// file.
	Address string
	// Heads and Agents are its processes.
	Heads, Agents []Process
	// Bin is the atoll executable that started it.
	Bin string
}

// Process is one process of the cluster.
type Process struct {
	ID   uint64 `json:"id,omitempty"`
	Name string `json:"name"`
	PID  int    `json:"pid"`
	Log  string `json:"log"`
}

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
)

// Run runs a test binary's tests (call it from TestMain: os.Exit(sdktest.Run(m))) and then
// removes the atoll command Atoll built for them.
func Run(m *testing.M) int {
	code := m.Run()
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
	return code
}

// Atoll builds the atoll command once per test binary and returns its path. The binary is
// removed when the tests end if TestMain runs them with Run.
func Atoll(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "atoll-sdktest-")
		if buildErr != nil {
			return
		}
		out, err := exec.Command("go", "build", "-o", filepath.Join(buildDir, "atoll"), "github.com/atoll-run/atoll/cmd/atoll").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build atoll: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return filepath.Join(buildDir, "atoll")
}

// Up starts a cluster of three heads and agents processes, each declaring one machine of
// type machine ("dgx-h100" when empty), and stops it (atoll down) when the test ends; the
// processes' logs are printed when the test failed. It skips the test under -short. The
// cluster is started with UpFlags.
func Up(t testing.TB, agents int, machine string) *Cluster {
	t.Helper()
	return UpWith(t, agents, machine)
}

// UpWith is Up with more `atoll up` flags (--trusted-fabric, ...).
func UpWith(t testing.TB, agents int, machine string, flags ...string) *Cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a cluster of processes")
	}
	if machine == "" {
		machine = "dgx-h100"
	}
	bin := Atoll(t)
	dir := filepath.Join(t.TempDir(), "cluster")
	out, err := exec.Command(bin, append([]string{"up", "--dir", dir, "--agents", fmt.Sprint(agents), "--machine", machine, "--json"},
		append(UpFlags(), flags...)...)...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			out = append(out, ee.Stderr...)
		}
		t.Fatalf("atoll up: %v\n%s", err, out)
	}
	var cf struct {
		Address   string    `json:"address"`
		TokenFile string    `json:"token_file"`
		CACert    string    `json:"ca_cert"`
		Heads     []Process `json:"heads"`
		Agents    []Process `json:"agents"`
	}
	if err := json.Unmarshal(out, &cf); err != nil {
		t.Fatalf("atoll up --json: %v\n%s", err, out)
	}
	address := cf.Address + ";token-file=" + cf.TokenFile
	if cf.CACert != "" { // the cluster runs mutual TLS: its CA's certificate
		address += ";ca=" + cf.CACert
	}
	c := &Cluster{Dir: dir, Address: address, Heads: cf.Heads, Agents: cf.Agents, Bin: bin}
	t.Cleanup(func() {
		if t.Failed() { // before down, so that the tails show the cluster as the test left it
			c.printLogs(t)
		}
		if out, err := exec.Command(bin, "down", "--dir", dir, "--grace", "5s").CombinedOutput(); err != nil {
			t.Errorf("atoll down: %v\n%s", err, out)
		}
	})
	return c
}

// UpFlags are the `atoll up` flags of a test's cluster: a minute to come up, and a failure
// detection that takes a busy process for a dead one no sooner than on a quiet machine,
// each stretched by the slowness of this one (the load average per CPU, or
// ATOLL_TEST_SLOWDOWN=factor): on a loaded 2-core machine the defaults (gossip probes
// every 500 ms, 10 s without a load report) declare live agents dead.
func UpFlags() []string {
	return []string{"--timeout", testtime.Scale(time.Minute).String(),
		"--gossip-probe", testtime.Scale(500 * time.Millisecond).String(),
		"--heartbeat-timeout", testtime.Scale(10 * time.Second).String()}
}

// printLogs prints the tail of every log of the cluster (its processes' and its workers').
func (c *Cluster) printLogs(t testing.TB) {
	var logs []string
	_ = filepath.Walk(c.Dir, func(path string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() && strings.HasSuffix(path, ".log") {
			logs = append(logs, path)
		}
		return nil
	})
	for _, l := range logs {
		b, _ := os.ReadFile(l)
		if len(b) > 3000 {
			b = b[len(b)-3000:]
		}
		t.Logf("--- %s (tail)\n%s", strings.TrimPrefix(l, c.Dir+"/"), b)
	}
}
