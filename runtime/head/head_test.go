package head

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/store/meta"
	"github.com/atoll-run/atoll/store/paxos"
	"github.com/atoll-run/atoll/topology"
)

var testToken = []byte("head-test-token-0123456789")

// group starts three heads on an in-memory Paxos network, each with its own API.
func group(t *testing.T) ([]*Head, *api.Client) {
	t.Helper()
	return groupWith(t, nil)
}

// groupWith is group with each head's configuration changed by mut.
func groupWith(t *testing.T, mut func(*Config)) ([]*Head, *api.Client) {
	t.Helper()
	net := paxos.NewMemNetwork(1)
	var heads []*Head
	var urls []string
	dir := t.TempDir()
	for id := uint64(1); id <= 3; id++ {
		cfg := Config{ID: id, Initial: []uint64{1, 2, 3}, Transport: net.Transport(id), DataDir: fmt.Sprintf("%s/h%d", dir, id),
			NoSync: true, Token: testToken, Logger: zaptest.NewLogger(t)}
		if mut != nil {
			mut(&cfg)
		}
		h, err := Start(cfg)
		if err != nil {
			t.Fatal(err)
		}
		heads = append(heads, h)
		urls = append(urls, h.Address())
	}
	t.Cleanup(func() {
		for _, h := range heads {
			_ = h.Close()
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := api.NewClient(ctx, api.ClientConfig{Heads: urls, Token: string(testToken)})
	if err != nil {
		t.Fatal(err)
	}
	return heads, c
}

// groupKnowingHeads is group with every head told the group's heads (as a cluster's
// configuration or gossip tells them), for what lists them: the status, the dashboard.
func groupKnowingHeads(t *testing.T) ([]*Head, *api.Client) {
	t.Helper()
	heads, c := group(t)
	var infos []api.HeadInfo
	for _, h := range heads {
		infos = append(infos, api.HeadInfo{ID: h.ID(), Address: h.Address()})
	}
	for _, h := range heads {
		h.SetHeads(infos)
	}
	return heads, c
}

func machine(t *testing.T, name string) api.Machine {
	t.Helper()
	tc, err := topology.Load("dgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	return api.Machine{Name: name, Spec: tc.Machines[0].Spec, Simulated: true}
}

// failOver closes the leading head and waits until another leads.
func failOver(t *testing.T, heads []*Head) {
	t.Helper()
	old := leader(t, heads)
	_ = old.Close()
	var rest []*Head
	for _, h := range heads {
		if h != old {
			rest = append(rest, h)
		}
	}
	leader(t, rest)
}

func leader(t *testing.T, heads []*Head) *Head {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		for _, h := range heads {
			if h.Controller().Leading() {
				return h
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("no head leads")
	return nil
}

func TestGangLifecycleThroughTheLog(t *testing.T) {
	heads, c := group(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, n := range []string{"m0", "m1"} {
		m, err := c.RegisterMachine(ctx, machine(t, n))
		if err != nil {
			t.Fatal(err)
		}
		if m.Incarnation != 1 || !m.Alive {
			t.Fatalf("registered %+v", m)
		}
	}
	if _, err := c.SubmitJob(ctx, api.Job{Name: "j"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SubmitJob(ctx, api.Job{Name: "j"}); !errors.Is(err, api.ErrExists) {
		t.Fatalf("second job of one name: %v", err)
	}
	spec := api.GangSpec{Job: "j", Name: "dp", Kind: "k", Workers: 8, Resources: api.Resources{GPUs: 1}, SameIsland: true, MaxRestarts: 1, Backoff: api.Duration(time.Millisecond)}
	g, err := c.SpawnGang(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if g.State != api.GangStarting || g.Placement == nil || len(g.Placement.Members) != 8 || g.Placement.Islands != 1 {
		t.Fatalf("gang %+v", g)
	}
	machine := g.Placement.Members[0].Machine
	for _, m := range g.Placement.Members {
		if m.Machine != machine || len(m.UUIDs) != 1 || !strings.HasPrefix(m.UUIDs[0], "GPU-sim-") {
			t.Fatalf("member %+v: want every rank on %s with one simulated GPU", m, machine)
		}
	}
	// Errors with their reasons.
	if _, err := c.SpawnGang(ctx, api.GangSpec{Job: "j", Name: "big", Kind: "k", Workers: 9, Resources: api.Resources{GPUs: 1}, SameIsland: true}); !errors.Is(err, api.ErrNeverFits) {
		t.Fatalf("gang over an island: %v", err)
	}
	// A gang over the free GPUs waits in its queue, with the reason.
	more, err := c.SpawnGang(ctx, api.GangSpec{Job: "j", Name: "more", Kind: "k", Workers: 9, Resources: api.Resources{GPUs: 1}})
	if err != nil || more.State != api.GangPending || more.Placement != nil || more.Reason == "" {
		t.Fatalf("gang over the free GPUs: %+v, %v; want it pending with a reason", more, err)
	}
	if _, err := c.SpawnGang(ctx, spec); !errors.Is(err, api.ErrExists) {
		t.Fatalf("the same gang twice: %v", err)
	}
	if _, err := c.SpawnGang(ctx, api.GangSpec{Job: "j", Name: "../x", Kind: "k", Workers: 1}); !errors.Is(err, api.ErrInvalid) {
		t.Fatalf("a bad gang name: %v", err)
	}
	// Workers become ready; the gang runs once all are.
	for r := 0; r < 8; r++ {
		if err := c.WorkerReady(ctx, api.Worker{Job: "j", Gang: "dp", Rank: r, Generation: 0, Machine: machine, Address: "a", ActorID: fmt.Sprint(r)}); err != nil {
			t.Fatal(err)
		}
	}
	g, _, err = c.Gang(ctx, "j", "dp")
	if err != nil || g.State != api.GangRunning {
		t.Fatalf("after all ready: %+v %v", g, err)
	}
	// A worker exits: the gang restarts in generation 1 on the same GPUs after its backoff.
	if err := c.WorkerExited(ctx, api.WorkerExit{Job: "j", Gang: "dp", Rank: 3, Generation: 0, Machine: machine, Reason: "killed"}); err != nil {
		t.Fatal(err)
	}
	if err := c.WorkerReady(ctx, api.Worker{Job: "j", Gang: "dp", Rank: 0, Generation: 0}); !errors.Is(err, api.ErrStale) {
		t.Fatalf("a worker of the ended generation: %v", err)
	}
	g = waitGang(t, c, "j", "dp", func(g api.Gang) bool { return g.State == api.GangStarting && g.Generation == 1 })
	if g.Restarts != 1 || g.Placement.Members[0].Machine != machine {
		t.Fatalf("restarted gang %+v", g)
	}
	// The leader goes away: another head takes over, rebuilds the scheduler from the log,
	// and sees the gang's GPUs as taken.
	failOver(t, heads)
	st, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	free := 0
	for _, m := range st.Machines {
		free += m.FreeGPUs
	}
	if free != 8 || len(st.Gangs) != 2 || st.Gangs[0].Generation != 1 || st.Gangs[1].State != api.GangPending {
		t.Fatalf("status after failover (the new leader must count the running gang and keep the waiting one): %d free GPUs, gangs %+v", free, st.Gangs)
	}
	// The second failure is past MaxRestarts: the gang fails and frees its GPUs.
	if err := c.WorkerExited(ctx, api.WorkerExit{Job: "j", Gang: "dp", Rank: 1, Generation: 1, Machine: machine, Reason: "again"}); err != nil {
		t.Fatal(err)
	}
	g = waitGang(t, c, "j", "dp", func(g api.Gang) bool { return g.State == api.GangFailed })
	if !strings.Contains(g.Reason, "again") {
		t.Fatalf("failed gang's reason %q", g.Reason)
	}
	// Its GPUs are free: the waiting gang is placed on them.
	waitGang(t, c, "j", "more", func(g api.Gang) bool { return g.State == api.GangStarting && len(g.Placement.Members) == 9 })
	if err := c.StopJob(ctx, "j"); err != nil {
		t.Fatal(err)
	}
	g = waitGang(t, c, "j", "more", func(g api.Gang) bool { return g.State == api.GangStopped })
}

func TestMachineLossMovesGangs(t *testing.T) {
	_, c := group(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, n := range []string{"m0", "m1"} {
		if _, err := c.RegisterMachine(ctx, machine(t, n)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.SubmitJob(ctx, api.Job{Name: "j"}); err != nil {
		t.Fatal(err)
	}
	g, err := c.SpawnGang(ctx, api.GangSpec{Job: "j", Name: "a", Kind: "k", Workers: 4, Resources: api.Resources{GPUs: 1}, SameIsland: true, MaxRestarts: 3})
	if err != nil {
		t.Fatal(err)
	}
	from := g.Placement.Members[0].Machine
	if err := c.Do(ctx, "POST", "/v1/machines/register", machine(t, from), nil); err != nil {
		t.Fatal(err)
	}
	// Registering again without being declared dead means the agent restarted: the gang
	// restarts in its next generation.
	g = waitGang(t, c, "j", "a", func(g api.Gang) bool { return g.Generation == 1 })
	if g.State != api.GangStarting {
		t.Fatalf("after its agent restarted the gang is %+v", g)
	}
}

// waitGang follows the gang's record through the log's watch until ok holds.
func waitGang(t *testing.T, c *api.Client, job, name string, ok func(api.Gang) bool) api.Gang {
	t.Helper()
	return waitRecord(t, c, api.TableGangs+job+"/"+name, 10*time.Second, "the state", ok)
}

// waitRecord follows a record (JSON of T) through the log's watch until ok holds of it,
// for at most timeout; it fails the test naming what it waited for otherwise.
func waitRecord[T any](t *testing.T, c *api.Client, key string, timeout time.Duration, what string, ok func(T) bool) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var last T
	found := errors.New("found")
	check := func(v []byte) error {
		if err := json.Unmarshal(v, &last); err != nil {
			return err
		}
		if ok(last) {
			return found
		}
		return nil
	}
	err := c.Watch(ctx, key, func(_ bool, l api.Listing, evs []meta.Event) error {
		for _, kv := range l.KVs {
			if err := check(kv.Value); err != nil {
				return err
			}
		}
		for _, ev := range evs {
			if err := check(ev.KV.Value); err != nil {
				return err
			}
		}
		return nil
	})
	if !errors.Is(err, found) {
		t.Fatalf("%s never reached %s (%v); last %+v", key, what, err, last)
	}
	return last
}

// GET /v1/list with limit answers the first keys in key order and says when it left some
// out; a bad limit is refused, naming it.
func TestListFirst(t *testing.T) {
	_, c := group(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, n := range []string{"m2", "m0", "m1"} {
		if _, err := c.RegisterMachine(ctx, machine(t, n)); err != nil {
			t.Fatal(err)
		}
	}
	l, err := c.ListFirst(ctx, api.TableMachines, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(l.KVs) != 2 || !l.More || l.KVs[0].Key != api.TableMachines+"m0" || l.KVs[1].Key != api.TableMachines+"m1" {
		t.Fatalf("the first 2 machines: %d keys (more %v): %+v", len(l.KVs), l.More, l.KVs)
	}
	if l, err = c.ListFirst(ctx, api.TableMachines, 3); err != nil || len(l.KVs) != 3 || l.More {
		t.Fatalf("the first 3 of 3 machines: %d keys (more %v), %v", len(l.KVs), l.More, err)
	}
	err = c.Do(ctx, "GET", "/v1/list?prefix=machines/&limit=0", nil, nil)
	if !errors.Is(err, api.ErrInvalid) || !strings.Contains(err.Error(), "limit") {
		t.Fatalf("limit=0: %v", err)
	}
}
