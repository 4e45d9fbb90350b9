package agent

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/atoll-run/atoll/internal/freeport"
	"github.com/atoll-run/atoll/internal/pki"
	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/runtime/authz"
	"github.com/atoll-run/atoll/runtime/head"
	"github.com/atoll-run/atoll/store/meta"
	"github.com/atoll-run/atoll/topology"
)

func freeTCP(t *testing.T) string {
	t.Helper()
	addrs, err := freeport.Addrs("127.0.0.1", 1) // below the ephemeral range: see freeport
	if err != nil {
		t.Fatal(err)
	}
	return addrs[0]
}

// TestHollowMachines: 20 hollow agents in this process, each with its own scoped credential
// and its own certificate from the cluster CA, register with a head over mutual TLS (Paxos
// on TCP, four of them gossiping with it), report their loads, and run a gang of one worker
// on every machine holding all its GPUs: every worker is launched hollow, reported ready by
// its agent, and the gang runs; a worker that exits is reported and restarted; stopping the
// job ends every hollow worker.
func TestHollowMachines(t *testing.T) {
	const n = 20
	ca, err := pki.NewCA("hollow-test")
	if err != nil {
		t.Fatal(err)
	}
	// A report rate of 4 a second paces the 20 machines' reports: each is asked for one
	// every 5 s, capped at a third of the 10 s heartbeat timeout.
	h, err := head.Start(head.Config{ID: 1, Peers: map[uint64]string{1: freeTCP(t)}, DataDir: t.TempDir(), NoSync: true, Token: headToken,
		CA: ca, Gossip: "127.0.0.1:0", Logger: zaptest.NewLogger(t), Controller: head.ControllerConfig{ReportRate: 4}})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tc, err := topology.Load("dgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	spec := tc.Machines[0].Spec
	launches := make(chan api.WorkerSpec, 4*n)
	agents := make([]*Agent, n)
	launchers := make([]*HollowLauncher, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		name := fmt.Sprintf("hollow-%02d", i)
		tok, _, err := authz.NewToken(headToken, authz.Claims{Principal: authz.Agent(name).String()})
		if err != nil {
			t.Fatal(err)
		}
		launchers[i] = &HollowLauncher{OnLaunch: func(s api.WorkerSpec) { launches <- s }}
		gossip := ""
		if i < 4 {
			gossip = "127.0.0.1:0"
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			agents[i], errs[i] = Start(ctx, Config{Name: name, Spec: spec, Simulated: true, Heads: []string{h.Address()}, Token: []byte(tok),
				CACert: ca.CertPEM, Dir: t.TempDir(), ShmDir: t.TempDir(), ObjectCapacity: 4 << 20, Launcher: launchers[i], Load: HollowLoad,
				LoadInterval: 50 * time.Millisecond, Gossip: gossip, Logger: zaptest.NewLogger(t).Named(name)})
		}()
	}
	wg.Wait()
	for i, a := range agents {
		if errs[i] != nil {
			t.Fatalf("hollow agent %d: %v", i, errs[i])
		}
		defer a.Shutdown(context.Background())
		if a.Identity() == nil || a.Identity().Leaf() == nil {
			t.Fatalf("%s has no certificate of its own", a.Name())
		}
		if cn := a.Identity().Leaf().Subject.CommonName; cn != "agent/"+a.Name() {
			t.Fatalf("%s's certificate names %q", a.Name(), cn)
		}
	}
	c := agents[0].Client()
	// An admin's client (the cluster token) submits; every machine is registered, alive,
	// with a load report of its own.
	id, err := api.RequestIdentity(ctx, []string{h.Address()}, string(headToken), ca.CertPEM, "admin-test")
	if err != nil {
		t.Fatal(err)
	}
	admin, err := api.NewClient(ctx, api.ClientConfig{Heads: []string{h.Address()}, Token: string(headToken), TLS: id.Client()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.SubmitJob(ctx, api.Job{Name: "j"}); err != nil {
		t.Fatal(err)
	}
	g, err := admin.SpawnGang(ctx, api.GangSpec{Job: "j", Name: "g", Kind: "k", Workers: n, Resources: api.Resources{GPUs: 8}, MaxRestarts: 5})
	if err != nil {
		t.Fatal(err)
	}
	machines := map[string]bool{}
	for range n {
		select {
		case s := <-launches:
			if len(s.Member.GPUs) != 8 || s.Machine == "" || machines[s.Machine] {
				t.Fatalf("launch %+v: want one worker of 8 GPUs on each machine", s.Member)
			}
			machines[s.Machine] = true
		case <-ctx.Done():
			t.Fatalf("%d of %d hollow workers launched", len(machines), n)
		}
	}
	running := watchGang(ctx, t, c, "j/g", func(g api.Gang) bool { return g.State == api.GangRunning })
	if running.Generation != g.Generation {
		t.Fatalf("the gang runs in generation %d, want %d", running.Generation, g.Generation)
	}
	// Each machine's own report says its 8 cards are held (the hollow load's GPU figure).
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		st, err := admin.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		full := 0
		for _, m := range st.Machines {
			if m.Alive && m.Load != nil && m.Load.GPU == 1 && m.GPUs == 8 {
				full++
			}
		}
		if full == n {
			break
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatalf("%d of %d machines report their cards held: %+v", full, n, st.Machines)
		}
	}
	// Every agent took the period the leader asked in its answers.
	for _, a := range agents {
		for time.Duration(a.period.Load()) != 3333*time.Millisecond {
			select {
			case <-tick.C:
			case <-ctx.Done():
				t.Fatalf("%s reports every %v, want the leader's 3.333s", a.Name(), time.Duration(a.period.Load()))
			}
		}
	}
	// A hollow worker that exits is reported: the gang restarts (the next generation is
	// launched on every machine again).
	key := fmt.Sprintf("j/g/%d.g%d", 0, running.Generation)
	exited := false
	for _, l := range launchers {
		exited = exited || l.Exit(key, fmt.Errorf("hollow crash"))
	}
	if !exited {
		t.Fatalf("no hollow worker %s to exit", key)
	}
	watchGang(ctx, t, c, "j/g", func(g api.Gang) bool { return g.State == api.GangRunning && g.Generation > running.Generation })
	if err := admin.StopJob(ctx, "j"); err != nil {
		t.Fatal(err)
	}
	for i, a := range agents {
		waitAgent(t, a, "the stopped job's hollow workers end", func() bool { return len(a.workers) == 0 })
		if r := launchers[i].Running(); r != 0 {
			t.Fatalf("%s: %d hollow workers still running after the job stopped", a.Name(), r)
		}
	}
}

// watchGang follows the gangs table until the gang key satisfies ok.
func watchGang(ctx context.Context, t *testing.T, c *api.Client, key string, ok func(api.Gang) bool) api.Gang {
	t.Helper()
	var got api.Gang
	errDone := fmt.Errorf("done")
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	gangs := map[string]api.Gang{}
	err := c.Watch(wctx, api.TableGangs, func(reset bool, l api.Listing, evs []meta.Event) error {
		gangs = applyGangs(gangs, reset, l, evs)
		if g, found := gangs[key]; found && ok(g) {
			got = g
			return errDone
		}
		return nil
	})
	if err != errDone {
		t.Fatalf("watching gang %s: %v (last %+v)", key, err, gangs[key])
	}
	return got
}
