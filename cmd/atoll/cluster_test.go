package main

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/atoll-run/atoll/cmd/atoll/internal/clustertest"
	"github.com/atoll-run/atoll/internal/pki"
	"github.com/atoll-run/atoll/internal/testtime"
	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/sdk"
	"github.com/atoll-run/atoll/store/transfer"
)

// The cluster tests run real processes: `atoll up` starts heads and agents, and the agents
// start worker processes. A test that drives a job itself (through sdk.Connect) is the
// job's program, so the agents run this test binary as its workers: TestMain serves them.

type tick struct{}

// counter counts ticks and checkpoints its count.
type counter struct{ N int }

func (c *counter) Receive(*sdk.Context, any) (any, error) { c.N++; return c.N, nil }
func (c *counter) Checkpoint() ([]byte, error)            { return []byte{byte(c.N)}, nil }
func (c *counter) Restore(b []byte) error                 { c.N = int(b[0]); return nil }

func testKinds() []sdk.Option {
	return []sdk.Option{sdk.Kind("counter", func() sdk.Actor { return &counter{} }, tick{}),
		sdk.Kind("blob", func() sdk.Actor { return &blob{} }, bump{}, digestReq{}, putDetached{}, putOwned{}),
		sdk.Kind("hostile", func() sdk.Actor { return hostile{} }, probe{})}
}

func TestMain(m *testing.M) {
	if sdk.InWorker() { // an agent started this binary as a worker: serve it
		os.Exit(sdk.WorkerMain(testKinds()...))
	}
	os.Exit(clustertest.Run(m))
}

// upCluster starts a cluster of real processes and stops it when the test ends
// (clustertest.Up).
func upCluster(t *testing.T, agents int, upArgs ...string) (bin, dir string) {
	return clustertest.Up(t, agents, upArgs...)
}

// printLogs prints a cluster's logs for a failed test (clustertest.PrintLogs).
func printLogs(t *testing.T, dir string) { clustertest.PrintLogs(t, dir) }

// TestClusterSurvivesFailures drives a gang on a cluster of processes through a worker
// SIGKILL, an agent SIGKILL and a SIGKILL of the leader head, and checks that it restarts
// from its checkpoint (on other machines when its machine is lost) and that nothing
// committed is lost.
func TestClusterSurvivesFailures(t *testing.T) {
	t.Parallel()
	_, dir := upCluster(t, 3)
	cf, err := readClusterFile(dir)
	if err != nil {
		t.Fatal(err)
	}
	addr, _, err := clusterAddress(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	checkLinksAreMutualTLS(t, addr)
	ctx, cancel := testtime.Context(t, 2*time.Minute)
	defer cancel()
	c, job := connectJob(ctx, t, dir, "survivor")
	g, err := job.SpawnGang(ctx, sdk.GangSpec{Name: "g", Kind: "counter", Workers: 4, GPUsPerWorker: 1, SameIsland: true, MaxRestarts: 5})
	if err != nil {
		t.Fatal(err)
	}
	tickAll := func(want int) {
		t.Helper()
		for r := 0; r < 4; r++ {
			n, err := sdk.Call[int](ctx, c, g.Worker(r), tick{})
			if err != nil || n != want {
				t.Fatalf("rank %d tick: %d, %v; want %d", r, n, err, want)
			}
		}
	}
	tickAll(1)
	if err := g.Checkpoint(ctx, 1); err != nil {
		t.Fatal(err)
	}
	tickAll(2) // lost by each restart below

	// 1. A worker process is killed: the gang restarts all-for-one from the checkpoint.
	w := g.Workers()
	if len(w) != 4 || w[0].PID == os.Getpid() {
		t.Fatalf("workers %+v: want 4 worker processes", w)
	}
	start := time.Now()
	if err := syscall.Kill(w[2].PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if _, err := g.AwaitRunning(ctx, 1); err != nil {
		t.Fatal(err)
	}
	t.Logf("worker SIGKILL -> gang running again in %v", time.Since(start))
	tickAll(2)

	// 2. The agent of the gang's machine is killed: serf declares it dead, and the gang
	// restarts on another machine from its checkpoint.
	lost := g.Placement().Machines[0]
	var agentPID int
	for _, a := range cf.Agents {
		if a.Name == lost {
			agentPID = a.PID
		}
	}
	start = time.Now()
	if err := syscall.Kill(agentPID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	gen, err := g.AwaitRunning(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("agent SIGKILL -> gang running on %v in %v (generation %d)", g.Placement().Machines, time.Since(start), gen)
	if slices.Contains(g.Placement().Machines, lost) {
		t.Fatalf("gang still placed on the lost machine %s", lost)
	}
	tickAll(2)
	st, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range st.Machines {
		if m.Name == lost && m.Alive {
			t.Fatalf("machine %s of the killed agent is still alive in the status", lost)
		}
	}

	// 3. The leader head is killed: another head leads, the gang keeps running (its
	// workers are not restarted), and every acknowledged decision is still there.
	var leaderPID int
	for _, h := range cf.Heads {
		if h.ID == st.Leader {
			leaderPID = h.PID
		}
	}
	genBefore := g.Generation()
	start = time.Now()
	if err := syscall.Kill(leaderPID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := g.Checkpoint(ctx, 3); err != nil { // a commit through the new leader
		t.Fatal(err)
	}
	t.Logf("leader SIGKILL -> commit through the new leader after %v", time.Since(start))
	tickAll(3)
	if g.Generation() != genBefore {
		t.Fatalf("the gang restarted (generation %d -> %d) when only the leader head died", genBefore, g.Generation())
	}
	g2, err := job.SpawnGang(ctx, sdk.GangSpec{Name: "after", Kind: "counter", Workers: 2, GPUsPerWorker: 1, MaxRestarts: 1})
	if err != nil {
		t.Fatalf("the new leader schedules: %v", err)
	}
	if n, err := sdk.Call[int](ctx, c, g2.Worker(1), tick{}); err != nil || n != 1 {
		t.Fatalf("new gang: %d %v", n, err)
	}
	step, ok, err := g.LatestCheckpoint(ctx)
	if err != nil || !ok || step != 3 {
		t.Fatalf("latest checkpoint %d %v %v; want 3", step, ok, err)
	}
	st2, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st2.Leader == st.Leader || st2.Leader == 0 {
		t.Fatalf("leader %d after the old leader %d was killed", st2.Leader, st.Leader)
	}
	found := 0
	for _, gs := range st2.Gangs {
		if gs.Job == "survivor" && (gs.Name == "g" || gs.Name == "after") && gs.State == sdk.GangRunning {
			found++
		}
	}
	if found != 2 {
		t.Fatalf("gangs after the failover: %+v", st2.Gangs)
	}
	if err := job.Stop(ctx); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}

// checkLinksAreMutualTLS checks that a cluster of `atoll up` serves nothing to a process
// without a certificate of its CA: not the heads' API in clear, not an agent's API with the
// token alone, not an agent's transfer plane with the token alone.
func checkLinksAreMutualTLS(t *testing.T, address string) {
	t.Helper()
	ctx, cancel := testtime.Context(t, 30*time.Second)
	defer cancel()
	d, err := dialCluster(ctx, address)
	if err != nil {
		t.Fatal(err)
	}
	l, err := d.List(ctx, api.TableMachines)
	if err != nil || len(l.KVs) == 0 {
		t.Fatalf("machines: %v (%d)", err, len(l.KVs))
	}
	a, _ := sdk.ParseClusterAddress(address)
	caPEM, err := pki.ReadCACert(a.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	trust, _ := pki.Trust(caPEM)
	get := func(hc *http.Client, u string) (int, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		req.Header.Set("Authorization", "Bearer "+d.token)
		resp, err := hc.Do(req)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	tokenOnly := &http.Client{Transport: &http.Transport{TLSClientConfig: trust}}
	for _, h := range a.Heads {
		if code, _ := get(http.DefaultClient, "http://"+strings.TrimPrefix(h, "https://")+"/v1/status"); code == http.StatusOK {
			t.Errorf("head %s answered in clear", h)
		}
		if code, _ := get(tokenOnly, h+"/v1/status"); code == http.StatusOK {
			t.Errorf("head %s answered a client without a certificate", h)
		}
	}
	for _, kv := range l.KVs {
		var m api.Machine
		if err := json.Unmarshal(kv.Value, &m); err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(m.Agent.API, "https://") {
			t.Errorf("agent of %s at %s: want https", m.Name, m.Agent.API)
		}
		if code, err := get(tokenOnly, m.Agent.API+"/v1/workers"); err == nil && code == http.StatusOK {
			t.Errorf("agent of %s answered a client without a certificate", m.Name)
		}
		if code, _ := get(d.hc, m.Agent.API+"/v1/workers"); code != http.StatusOK {
			t.Errorf("agent of %s refused a certified client: %d", m.Name, code)
		}
		// A client that checks the host it dialed (curl --cacert DIR/tls/ca.crt) verifies
		// the agent: its certificate names its address.
		byHost := d.hc.Transport.(*http.Transport).Clone()
		byHost.TLSClientConfig.ServerName = ""
		if code, err := get(&http.Client{Transport: byHost}, m.Agent.API+"/v1/workers"); code != http.StatusOK {
			t.Errorf("agent of %s, checked by the host dialed: %d %v", m.Name, code, err)
		}
		cc := transfer.DefaultClientConfig()
		cc.Token = []byte(d.token)
		cl, err := transfer.NewClient(cc)
		if err != nil {
			t.Fatal(err)
		}
		dctx, dcancel := context.WithTimeout(ctx, 3*time.Second)
		if c, err := cl.Dial(dctx, m.Agent.Transfer); err == nil {
			c.Close()
			t.Errorf("the transfer plane of %s took a connection without TLS", m.Name)
		}
		dcancel()
		cl.Close()
	}
}

// connectJob connects a driver to the cluster in dir and submits a job of that name; the
// driver shuts down when the test ends.
func connectJob(ctx context.Context, t *testing.T, dir, name string) (*sdk.Cluster, *sdk.Job) {
	t.Helper()
	addr, _, err := clusterAddress(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	c, err := sdk.Connect(ctx, addr, testKinds()...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Shutdown(context.Background()) })
	job, err := c.Submit(ctx, sdk.JobSpec{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	return c, job
}
