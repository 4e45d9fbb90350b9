package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/atoll-run/atoll/internal/testtime"
	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/runtime/objects"
	"github.com/atoll-run/atoll/sdk"
)

// The durability tests run clusters of real processes through the failures issue 21
// names: SIGKILL and restart of the agent that wrote a gang's checkpoints, the loss of
// that machine for good, `atoll down` then `atoll up`, and SIGKILL of every process then
// `atoll up`. After each, every checkpoint is read back verified (`atoll checkpoints`),
// and the gang resumes from the newest one with its state equal byte for byte.

// blob is a worker whose state is a few MiB derived from its rank and its step: whether a
// resumed worker's state is the checkpoint's, byte for byte, is told by its digest.
type blob struct{ state []byte }

type (
	bump        struct{}          // the next step: returns it
	digestReq   struct{}          // the SHA-256 of the state, in hex
	putDetached struct{ N int }   // put N detached objects: returns their ids
	putOwned    struct{ Tag int } // put an ordinary object (owned by this worker): returns its id
)

const blobSize = 3<<20 + 17

// blobState is rank's state at step: its rank and step, then bytes drawn from them.
func blobState(rank, step int) []byte {
	b := make([]byte, blobSize)
	binary.LittleEndian.PutUint64(b, uint64(rank))
	binary.LittleEndian.PutUint64(b[8:], uint64(step))
	r := rand.New(rand.NewPCG(uint64(rank)+1, uint64(step)+7))
	for i := 16; i+8 <= len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.Uint64())
	}
	return b
}

func digest(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// detachedBytes is the content of the i-th detached object.
func detachedBytes(i int) []byte {
	return bytes.Repeat([]byte(fmt.Sprintf("detached object %d;", i)), 3000)
}

func (b *blob) Receive(ctx *sdk.Context, msg any) (any, error) {
	switch m := msg.(type) {
	case bump:
		step := 0
		if len(b.state) >= 16 {
			step = int(binary.LittleEndian.Uint64(b.state[8:]))
		}
		b.state = blobState(ctx.Rank(), step+1)
		return step + 1, nil
	case digestReq:
		return digest(b.state), nil
	case putDetached:
		ids := make([]string, m.N)
		for i := range ids {
			r, err := sdk.Put(ctx, ctx, detachedBytes(i), sdk.Detached())
			if err != nil {
				return nil, err
			}
			ids[i] = r.ID
		}
		return ids, nil
	case putOwned:
		r, err := sdk.Put(ctx, ctx, []byte(fmt.Sprintf("owned by a worker incarnation, %d", m.Tag)))
		return r.ID, err
	}
	return nil, fmt.Errorf("blob: unknown message %T", msg)
}

func (b *blob) Checkpoint() ([]byte, error) { return b.state, nil }
func (b *blob) Restore(p []byte) error      { b.state = append([]byte(nil), p...); return nil }

// bumpAll moves every rank of g to the next step, which must be want.
func bumpAll(ctx context.Context, t *testing.T, c *sdk.Cluster, g *sdk.Gang, want int) {
	t.Helper()
	for r := 0; r < g.Size(); r++ {
		if n, err := sdk.Call[int](ctx, c, g.Worker(r), bump{}); err != nil || n != want {
			t.Fatalf("rank %d bump: %d, %v; want step %d", r, n, err, want)
		}
	}
}

// checkResumed checks that every rank of g holds its state of step, byte for byte, and
// that the newest checkpoint reads back as those states.
func checkResumed(ctx context.Context, t *testing.T, c *sdk.Cluster, g *sdk.Gang, step int) {
	t.Helper()
	for r := 0; r < g.Size(); r++ {
		got, err := sdk.Call[string](ctx, c, g.Worker(r), digestReq{})
		if err != nil {
			t.Fatalf("rank %d digest: %v", r, err)
		}
		if want := digest(blobState(r, step)); got != want {
			t.Fatalf("rank %d resumed with state %s, want step %d's %s", r, got[:12], step, want[:12])
		}
	}
	parts, got, err := g.ReadCheckpoint(ctx, -1)
	if err != nil || got != int64(step) || len(parts) != g.Size() {
		t.Fatalf("newest checkpoint: step %d, %d parts, %v; want step %d", got, len(parts), err, step)
	}
	for r, p := range parts {
		if !bytes.Equal(p, blobState(r, step)) {
			t.Fatalf("checkpoint at step %d, rank %d: the bytes read back differ", step, r)
		}
	}
}

// checkCheckpoints runs `atoll checkpoints --dir D --json` and checks that it lists the
// steps of job/gang, every part of each read back verified.
func checkCheckpoints(t *testing.T, bin, dir, job, gang string, steps ...int64) {
	t.Helper()
	out, err := exec.Command(bin, "checkpoints", "--dir", dir, "--json").Output()
	if err != nil {
		t.Fatalf("atoll checkpoints: %v", err)
	}
	var es []checkpointEntry
	if err := json.Unmarshal(out, &es); err != nil {
		t.Fatalf("atoll checkpoints --json: %v\n%s", err, out)
	}
	var got []int64
	for _, e := range es {
		if e.Job != job || e.Gang != gang {
			continue
		}
		got = append(got, e.Step)
		if e.Parts == 0 || e.ReadableParts != e.Parts || e.Bytes != int64(e.Parts)*blobSize {
			t.Fatalf("checkpoint %+v: want every part readable, %d bytes each", e, blobSize)
		}
	}
	if !slices.Equal(got, steps) {
		t.Fatalf("checkpoints of %s/%s: steps %v, want %v\n%s", job, gang, got, steps, out)
	}
}

// checkDetached reads every detached object back.
func checkDetached(ctx context.Context, t *testing.T, c *sdk.Cluster, ids []string) {
	t.Helper()
	for i, id := range ids {
		b, err := sdk.Get(ctx, c, sdk.Ref[[]byte]{ID: id})
		if err != nil || !bytes.Equal(b, detachedBytes(i)) {
			t.Fatalf("detached object %d of %d: %d bytes, %v", i, len(ids), len(b), err)
		}
	}
}

// waitFor polls the cluster's state until ok holds, failing the test at the deadline (within
// on a quiet machine, scaled by testtime) with what ok last said.
func waitFor(t *testing.T, what string, within time.Duration, ok func() (bool, string)) {
	t.Helper()
	within = testtime.Scale(within)
	deadline := time.Now().Add(within)
	for {
		done, why := ok()
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %v: %s", what, within, why)
		}
		time.Sleep(100 * time.Millisecond) // polling the cluster's state, not sequencing the test
	}
}

// machine reads a machine's record.
func machine(ctx context.Context, t *testing.T, d *dialed, name string) api.Machine {
	t.Helper()
	var m api.Machine
	if ok, err := d.Get(ctx, api.TableMachines+name, &m); err != nil || !ok {
		t.Fatalf("machine %s: %v", name, err)
	}
	return m
}

// restartAgent starts the agent of a machine of an `atoll up` cluster again, as `atoll up`
// started it (its directory, its name), records its new pid in the cluster file, and
// waits until it is registered again.
func restartAgent(ctx context.Context, t *testing.T, bin, dir, name string, d *dialed) int {
	t.Helper()
	before := machine(ctx, t, d, name)
	return startAgent(ctx, t, bin, dir, name, d, before.Incarnation)
}

// startAgent starts an agent of machine name in an `atoll up` cluster (its directory under
// the cluster's, the options atoll up gave its agents), records it in the cluster file (so
// that atoll down stops it), and waits until it is registered past incarnation.
func startAgent(ctx context.Context, t *testing.T, bin, dir, name string, d *dialed, incarnation uint64) int {
	t.Helper()
	return startAgentAs(ctx, t, bin, dir, name, "", d, incarnation)
}

// startAgentAs is startAgent with the credential in tokenFile ("": the cluster token, as
// atoll up gives its agents).
func startAgentAs(ctx context.Context, t *testing.T, bin, dir, name, tokenFile string, d *dialed, incarnation uint64) int {
	t.Helper()
	cf, err := readClusterFile(dir)
	if err != nil {
		t.Fatal(err)
	}
	if tokenFile == "" { // the credential atoll up gave it, or (a new machine) the cluster token
		tokenFile = cf.TokenFile
		if c := filepath.Join(dir, "agents", name, agentCredentialFile); fileExists(c) {
			tokenFile = c
		}
	}
	logf, err := os.OpenFile(filepath.Join(dir, "logs", name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	adir := filepath.Join(dir, "agents", name)
	args := []string{"agent", "--join", cf.Address, "--name", name, "--machine", cf.Machine, "--dir", adir}
	if cf.GossipProbe != "" {
		args = append(args, "--gossip-probe", cf.GossipProbe)
	}
	cmd := exec.Command(bin, append(args, cf.AgentArgs...)...) // as atoll up starts its agents
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), "ATOLL_TOKEN_FILE="+tokenFile, api.CACertEnv+"="+cf.CACert)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = cmd.Wait() }()
	i := slices.IndexFunc(cf.Agents, func(p procInfo) bool { return p.Name == name })
	if i < 0 {
		cf.Agents = append(cf.Agents, procInfo{Name: name, Log: logf.Name(), Dir: adir})
		i = len(cf.Agents) - 1
	}
	p := &cf.Agents[i]
	p.PID, p.Start, p.Cmdline = cmd.Process.Pid, 0, nil
	if err := p.identify(); err != nil { // so that atoll down knows it, as one atoll up started
		t.Fatal(err)
	}
	if err := writeClusterFile(dir, cf); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the agent registers", time.Minute, func() (bool, string) {
		var m api.Machine
		ok, err := d.Get(ctx, api.TableMachines+name, &m)
		return err == nil && ok && m.Alive && m.Incarnation > incarnation, fmt.Sprintf("%+v %v", m.Agent, err)
	})
	return cmd.Process.Pid
}

// kill sends SIGKILL to pids and waits until they are gone.
func kill(t *testing.T, pids ...int) {
	t.Helper()
	for _, p := range pids {
		if err := syscall.Kill(p, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			t.Fatalf("kill %d: %v", p, err)
		}
	}
	waitFor(t, "the killed processes are gone", 30*time.Second, func() (bool, string) {
		for _, p := range pids {
			if alive(p) {
				return false, fmt.Sprintf("pid %d", p)
			}
		}
		return true, ""
	})
}

func agentPID(t *testing.T, dir, name string) int {
	t.Helper()
	cf, err := readClusterFile(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range cf.Agents {
		if a.Name == name {
			return a.PID
		}
	}
	t.Fatalf("no agent %s in the cluster file", name)
	return 0
}

// deadLocations lists the object records that still name a store that is not live (no
// alive machine's, no live driver's).
func deadLocations(ctx context.Context, d *dialed) (int, string) {
	l, err := d.List(ctx, api.TableMachines)
	if err != nil {
		return -1, err.Error()
	}
	live := map[string]bool{}
	for _, kv := range l.KVs {
		var m api.Machine
		if json.Unmarshal(kv.Value, &m) == nil && m.Alive {
			live[m.Agent.Transfer] = true
			if d := m.Agent.CheckpointDir; d != "" {
				live[objects.SharedLocation(d)] = true
			}
		}
	}
	owners, err := d.Meta().Range(ctx, api.TableOwners)
	if err != nil {
		return -1, err.Error()
	}
	for _, kv := range owners {
		var o api.Owner
		if json.Unmarshal(kv.Value, &o) == nil && o.Store != "" {
			live[o.Store] = true
		}
	}
	kvs, err := d.Meta().Range(ctx, api.TableObjects)
	if err != nil {
		return -1, err.Error()
	}
	n, example := 0, ""
	for _, kv := range kvs {
		var rec objects.Record
		if json.Unmarshal(kv.Value, &rec) != nil {
			continue
		}
		for _, loc := range append(rec.Locations, rec.Durable...) {
			if !live[loc] {
				n++
				example = fmt.Sprintf("%s (owner %s) at %s", rec.ID[:12], rec.Owner, loc)
				break
			}
		}
	}
	return n, example
}

// TestDurableAgentRestartAndMachineLoss: a gang's checkpoints (and detached objects its
// worker put) stay readable, and the gang resumes from its newest checkpoint byte for byte,
// after (a) SIGKILL and restart of the agent that wrote them, whose store re-adopts its
// durable files at its new address, and (b) the loss of that machine for good (its agent
// killed and its disk gone). Reconciliation then leaves no record naming a dead store, and
// an ordinary object whose owner (a worker incarnation) ended is refused with
// ErrOwnerDied.
func TestDurableAgentRestartAndMachineLoss(t *testing.T) {
	t.Parallel()
	bin, dir := upCluster(t, 3, "--reconcile-interval", "500ms")
	ctx, cancel := testtime.Context(t, 5*time.Minute)
	defer cancel()
	addr, _, err := clusterAddress(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	d, err := dialCluster(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	c, err := sdk.Connect(ctx, addr, testKinds()...)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Shutdown(context.Background())
	job, err := c.Submit(ctx, sdk.JobSpec{Name: "dur"})
	if err != nil {
		t.Fatal(err)
	}
	spec := sdk.GangSpec{Name: "g", Kind: "blob", Workers: 2, GPUsPerWorker: 1, SameIsland: true, MaxRestarts: 10}
	g, err := job.SpawnGang(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	bumpAll(ctx, t, c, g, 1)
	if err := g.Checkpoint(ctx, 1); err != nil {
		t.Fatal(err)
	}
	bumpAll(ctx, t, c, g, 2)
	if err := g.Checkpoint(ctx, 2); err != nil {
		t.Fatal(err)
	}
	bumpAll(ctx, t, c, g, 3) // lost by the restart below
	writer := g.Placement().Machines[0]
	detached, err := sdk.Call[[]string](ctx, c, g.Worker(0), putDetached{N: 20})
	if err != nil {
		t.Fatal(err)
	}
	owned, err := sdk.Call[string](ctx, c, g.Worker(1), putOwned{Tag: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sdk.Get(ctx, c, sdk.Ref[[]byte]{ID: owned}); err != nil {
		t.Fatalf("an object of a live worker: %v", err)
	}
	checkCheckpoints(t, bin, dir, "dur", "g", 1, 2)

	// (a) The agent that wrote them is killed and restarted at once.
	oldAddr := machine(ctx, t, d, writer).Agent.Transfer
	kill(t, agentPID(t, dir, writer))
	start := time.Now()
	restartAgent(ctx, t, bin, dir, writer, d)
	newAddr := machine(ctx, t, d, writer).Agent.Transfer
	gen, err := g.AwaitRunning(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("(a) agent of %s SIGKILLed and restarted (%s -> %s): gang running again in %v (generation %d)", writer, oldAddr, newAddr, time.Since(start), gen)
	checkResumed(ctx, t, c, g, 2)
	checkCheckpoints(t, bin, dir, "dur", "g", 1, 2)
	checkDetached(ctx, t, c, detached)
	// The restarted store re-adopted its durable files at its new address.
	var cp api.Checkpoint
	if ok, err := d.Get(ctx, api.TableCheckpoints+api.CheckpointKey("dur", "g", 2), &cp); err != nil || !ok {
		t.Fatal(err)
	}
	for r, id := range cp.Objects {
		var rec objects.Record
		if _, err := d.Get(ctx, api.TableObjects+id, &rec); err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(rec.Durable, newAddr) || slices.Contains(rec.Locations, oldAddr) {
			t.Fatalf("rank %d's part after the restart: locations %v, durable %v; want the new address %s, not the old %s",
				r, rec.Locations, rec.Durable, newAddr, oldAddr)
		}
	}
	// The worker incarnation that owned an ordinary object died with the agent: refused.
	waitFor(t, "the object of a dead worker incarnation is refused", time.Minute, func() (bool, string) {
		_, err := sdk.Get(ctx, c, sdk.Ref[[]byte]{ID: owned})
		return errors.Is(err, sdk.ErrOwnerDied), fmt.Sprint(err)
	})
	bumpAll(ctx, t, c, g, 3) // lost again below

	// (b) The machine is lost for good: its agent killed, its disk gone.
	kill(t, agentPID(t, dir, writer))
	if err := os.RemoveAll(filepath.Join(dir, "agents", writer)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the lost machine is declared dead", time.Minute, func() (bool, string) {
		m := machine(ctx, t, d, writer)
		return !m.Alive, m.Reason
	})
	if err := g.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	spec.Resume = true
	g, err = job.SpawnGang(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(g.Placement().Machines, writer) {
		t.Fatalf("gang placed on the lost machine %s", writer)
	}
	checkResumed(ctx, t, c, g, 2)
	checkCheckpoints(t, bin, dir, "dur", "g", 1, 2)
	checkDetached(ctx, t, c, detached)
	waitFor(t, "reconciliation drops every location of a dead store", time.Minute, func() (bool, string) {
		n, example := deadLocations(ctx, d)
		return n == 0, fmt.Sprintf("%d records name a dead store, e.g. %s", n, example)
	})
	// A checkpoint still commits durably on the two machines left, and a new worker
	// incarnation's object is refused once its gang stops.
	bumpAll(ctx, t, c, g, 3)
	if err := g.Checkpoint(ctx, 3); err != nil {
		t.Fatal(err)
	}
	checkCheckpoints(t, bin, dir, "dur", "g", 2, 3)
	owned, err = sdk.Call[string](ctx, c, g.Worker(0), putOwned{Tag: 2})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sdk.Get(ctx, c, sdk.Ref[[]byte]{ID: owned}); err != nil {
		t.Fatalf("an object of a live worker: %v", err)
	}
	if err := g.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the object of a stopped worker is refused", 30*time.Second, func() (bool, string) {
		_, err := sdk.Get(ctx, c, sdk.Ref[[]byte]{ID: owned})
		return errors.Is(err, sdk.ErrOwnerDied), fmt.Sprint(err)
	})
}

// TestDurableClusterRestart: a gang's checkpoints stay readable, and a gang resumes from
// its newest one byte for byte, after (c) `atoll down` then `atoll up`, and (d) SIGKILL of
// every process (heads, agents, workers) then `atoll up`; detached objects too.
func TestDurableClusterRestart(t *testing.T) {
	t.Parallel()
	bin, dir := upCluster(t, 2)
	ctx, cancel := testtime.Context(t, 6*time.Minute)
	defer cancel()
	connect := func() (*sdk.Cluster, *dialed) {
		t.Helper()
		addr, _, err := clusterAddress(dir, "")
		if err != nil {
			t.Fatal(err)
		}
		d, err := dialCluster(ctx, addr)
		if err != nil {
			t.Fatal(err)
		}
		c, err := sdk.Connect(ctx, addr, testKinds()...)
		if err != nil {
			t.Fatal(err)
		}
		// A driver left connected renews its owner record against the dead heads' ports
		// after the test, which other tests' processes may hold by then.
		t.Cleanup(func() { _ = c.Shutdown(context.Background()) })
		return c, d
	}
	up := func() {
		t.Helper()
		if out, err := exec.Command(bin, "up", "--dir", dir, "--agents", "2", "--machine", "dgx-h100").CombinedOutput(); err != nil {
			t.Fatalf("atoll up again: %v\n%s", err, out)
		}
	}
	spec := sdk.GangSpec{Name: "g", Kind: "blob", Workers: 2, GPUsPerWorker: 1, SameIsland: true, MaxRestarts: 10}
	c, _ := connect()
	job, err := c.Submit(ctx, sdk.JobSpec{Name: "dur"})
	if err != nil {
		t.Fatal(err)
	}
	g, err := job.SpawnGang(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	bumpAll(ctx, t, c, g, 1)
	if err := g.Checkpoint(ctx, 1); err != nil {
		t.Fatal(err)
	}
	bumpAll(ctx, t, c, g, 2)
	if err := g.Checkpoint(ctx, 2); err != nil {
		t.Fatal(err)
	}
	bumpAll(ctx, t, c, g, 3)
	detached, err := sdk.Call[[]string](ctx, c, g.Worker(1), putDetached{N: 10})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Shutdown(ctx); err != nil { // the driver goes: its job stops
		t.Fatal(err)
	}

	// (c) atoll down, then atoll up on the same directory.
	if out, err := exec.Command(bin, "down", "--dir", dir, "--grace", "5s").CombinedOutput(); err != nil {
		t.Fatalf("atoll down: %v\n%s", err, out)
	}
	up()
	checkCheckpoints(t, bin, dir, "dur", "g", 1, 2)
	c, d := connect()
	job, err = c.Submit(ctx, sdk.JobSpec{Name: "dur"})
	if err != nil {
		t.Fatal(err)
	}
	spec.Resume = true
	if g, err = job.SpawnGang(ctx, spec); err != nil {
		t.Fatal(err)
	}
	checkResumed(ctx, t, c, g, 2)
	checkDetached(ctx, t, c, detached)
	bumpAll(ctx, t, c, g, 3)

	// (d) SIGKILL of every process (the gang running), then atoll up.
	cf, err := readClusterFile(dir)
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, p := range append(cf.Heads, cf.Agents...) {
		pids = append(pids, p.PID)
	}
	for _, w := range g.Workers() {
		pids = append(pids, w.PID)
	}
	kill(t, pids...)
	sctx, scancel := context.WithTimeout(ctx, 3*time.Second)
	_ = c.Shutdown(sctx) // its cluster is gone
	scancel()
	up()
	checkCheckpoints(t, bin, dir, "dur", "g", 1, 2)
	c, d = connect()
	defer c.Shutdown(context.Background())
	if err := d.StopJob(ctx, "dur"); err != nil { // the killed driver's job, still running in the log
		t.Fatal(err)
	}
	if job, err = c.Submit(ctx, sdk.JobSpec{Name: "dur"}); err != nil {
		t.Fatal(err)
	}
	if g, err = job.SpawnGang(ctx, spec); err != nil {
		t.Fatal(err)
	}
	checkResumed(ctx, t, c, g, 2)
	checkDetached(ctx, t, c, detached)
	st, err := exec.Command(bin, "status", "--dir", dir, "--json").Output()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(st), `"objects"`) {
		t.Fatalf("atoll status --json counts no objects:\n%s", st)
	}
}

// TestSharedCheckpointDir: with a shared checkpoint directory (atoll up --checkpoint-dir),
// a cluster of one machine commits checkpoints and detached objects durably (their second
// copy is in the directory), and when that machine is lost for good a new machine that
// mounts the directory resumes the gang from its newest checkpoint, byte for byte. Without
// one, a single machine cannot commit a checkpoint (ErrNotDurable).
func TestSharedCheckpointDir(t *testing.T) {
	t.Parallel()
	shared := filepath.Join(t.TempDir(), "shared-checkpoints")
	bin, dir := upCluster(t, 1, "--checkpoint-dir", shared, "--reconcile-interval", "500ms")
	ctx, cancel := testtime.Context(t, 4*time.Minute)
	defer cancel()
	addr, _, err := clusterAddress(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	d, err := dialCluster(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	c, err := sdk.Connect(ctx, addr, testKinds()...)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Shutdown(context.Background())
	job, err := c.Submit(ctx, sdk.JobSpec{Name: "shared"})
	if err != nil {
		t.Fatal(err)
	}
	spec := sdk.GangSpec{Name: "g", Kind: "blob", Workers: 2, GPUsPerWorker: 1, MaxRestarts: 10}
	g, err := job.SpawnGang(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	bumpAll(ctx, t, c, g, 1)
	if err := g.Checkpoint(ctx, 1); err != nil {
		t.Fatal(err)
	}
	bumpAll(ctx, t, c, g, 2)
	if err := g.Checkpoint(ctx, 2); err != nil {
		t.Fatal(err)
	}
	bumpAll(ctx, t, c, g, 3)
	detached, err := sdk.Call[[]string](ctx, c, g.Worker(0), putDetached{N: 5})
	if err != nil {
		t.Fatal(err)
	}
	checkCheckpoints(t, bin, dir, "shared", "g", 1, 2)
	var cp api.Checkpoint
	if ok, err := d.Get(ctx, api.TableCheckpoints+api.CheckpointKey("shared", "g", 2), &cp); err != nil || !ok || cp.SharedDir != shared || cp.Copies != 2 {
		t.Fatalf("checkpoint record %+v (%v): want its second copies in %s", cp, err, shared)
	}
	for _, p := range cp.Objects {
		if _, err := os.Stat(filepath.Join(shared, p+".obj")); err != nil {
			t.Fatalf("part %s in the shared directory: %v", p[:12], err)
		}
	}

	// The only machine is lost for good; a new one that mounts the directory joins.
	kill(t, agentPID(t, dir, "node-0"))
	if err := os.RemoveAll(filepath.Join(dir, "agents", "node-0")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the lost machine is declared dead", time.Minute, func() (bool, string) {
		m := machine(ctx, t, d, "node-0")
		return !m.Alive, m.Reason
	})
	startAgent(ctx, t, bin, dir, "node-1", d, 0)
	if err := g.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	spec.Resume = true
	if g, err = job.SpawnGang(ctx, spec); err != nil {
		t.Fatal(err)
	}
	checkResumed(ctx, t, c, g, 2)
	checkCheckpoints(t, bin, dir, "shared", "g", 1, 2)
	checkDetached(ctx, t, c, detached)
	waitFor(t, "reconciliation drops the lost machine's locations", time.Minute, func() (bool, string) {
		n, example := deadLocations(ctx, d)
		return n == 0, fmt.Sprintf("%d records name a dead store, e.g. %s", n, example)
	})
}

// TestCheckpointNeedsTwoCopies: on a cluster of one machine without a shared checkpoint
// directory, a checkpoint is not committed (it could not survive the machine's loss), nor
// is a detached object put.
func TestCheckpointNeedsTwoCopies(t *testing.T) {
	t.Parallel()
	_, dir := upCluster(t, 1)
	ctx, cancel := testtime.Context(t, 2*time.Minute)
	defer cancel()
	c, job := connectJob(ctx, t, dir, "single")
	g, err := job.SpawnGang(ctx, sdk.GangSpec{Name: "g", Kind: "blob", Workers: 1, GPUsPerWorker: 1})
	if err != nil {
		t.Fatal(err)
	}
	bumpAll(ctx, t, c, g, 1)
	if err := g.Checkpoint(ctx, 1); !errors.Is(err, sdk.ErrNotDurable) {
		t.Fatalf("a checkpoint on a single machine: %v, want ErrNotDurable", err)
	}
	if _, ok, err := g.LatestCheckpoint(ctx); ok || err != nil {
		t.Fatalf("a checkpoint was committed (%v, %v)", ok, err)
	}
	// (The worker's error crosses the process boundary as text: ErrNotDurable has no wire code.)
	if _, err := sdk.Call[[]string](ctx, c, g.Worker(0), putDetached{N: 1}); err == nil || !strings.Contains(err.Error(), sdk.ErrNotDurable.Error()) {
		t.Fatalf("a detached put on a single machine: %v, want ErrNotDurable", err)
	}
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
