package head

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/atoll-run/atoll/runtime/api"
)

// TestEndedGangsBeyondTheBoundAreDeleted: with KeepEndedGangs 3, the leader keeps the three
// gangs that ended last and deletes older ones with their worker records; a live gang is
// never deleted, a checkpoint record is not touched; a new leader orders the ended gangs it
// reads by the time they ended, not by name.
func TestEndedGangsBeyondTheBoundAreDeleted(t *testing.T) {
	heads, c := groupWith(t, func(cfg *Config) { cfg.Controller.KeepEndedGangs = 3 })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := c.RegisterMachine(ctx, machine(t, "m0")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SubmitJob(ctx, api.Job{Name: "j"}); err != nil {
		t.Fatal(err)
	}
	spawn := func(name string) api.Gang {
		t.Helper()
		g, err := c.SpawnGang(ctx, api.GangSpec{Job: "j", Name: name, Kind: "k", Workers: 1, Resources: api.Resources{GPUs: 1}})
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	live := spawn("live")
	if err := c.WorkerReady(ctx, api.Worker{Job: "j", Gang: "live", Rank: 0, GangUID: live.UID, Machine: "m0", Address: "a"}); err != nil {
		t.Fatal(err)
	}
	// A checkpoint record of a gang that will be deleted stays.
	ckpt := api.TableCheckpoints + "j/g0/00000000000000000001"
	if _, err := c.Meta().Put(ctx, ckpt, []byte(`{"job":"j","gang":"g0","step":1}`)); err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		name := fmt.Sprintf("g%d", i)
		g := spawn(name)
		if err := c.WorkerReady(ctx, api.Worker{Job: "j", Gang: name, Rank: 0, GangUID: g.UID, Machine: "m0", Address: "a"}); err != nil {
			t.Fatal(err)
		}
	}
	// They end in reverse name order: g5 first, g0 last.
	for i := 5; i >= 0; i-- {
		if err := c.StopGang(ctx, "j", fmt.Sprintf("g%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	// Commits are in order: once a later decision is committed, so are the deletes queued
	// behind the last stop.
	sync := func() {
		t.Helper()
		if _, err := c.SubmitJob(ctx, api.Job{Name: fmt.Sprintf("sync-%d", time.Now().UnixNano())}); err != nil {
			t.Fatal(err)
		}
	}
	sync()
	gangsLeft := func() []string {
		t.Helper()
		l, err := c.List(ctx, api.TableGangs+"j/")
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, kv := range l.KVs {
			names = append(names, strings.TrimPrefix(kv.Key, api.TableGangs+"j/"))
		}
		slices.Sort(names)
		return names
	}
	if got, want := gangsLeft(), []string{"g0", "g1", "g2", "live"}; !slices.Equal(got, want) {
		t.Fatalf("gangs in the log %v, want %v (the three that ended last, and the live one)", got, want)
	}
	for _, name := range []string{"g3", "g4", "g5"} {
		if _, _, err := c.Gang(ctx, "j", name); !errors.Is(err, api.ErrNotFound) {
			t.Fatalf("deleted gang %s: %v, want ErrNotFound", name, err)
		}
		l, err := c.List(ctx, api.TableWorkers+"j/"+name+"/")
		if err != nil || len(l.KVs) != 0 {
			t.Fatalf("worker records of deleted gang %s: %v, %v", name, l.KVs, err)
		}
	}
	if l, err := c.List(ctx, api.TableWorkers+"j/g0/"); err != nil || len(l.KVs) != 1 {
		t.Fatalf("worker records of kept gang g0: %v, %v", l.KVs, err)
	}
	if _, ok, err := c.Meta().Get(ctx, ckpt); err != nil || !ok {
		t.Fatalf("a checkpoint record: found %v, %v", ok, err)
	}
	if n := testutil.ToFloat64(leader(t, heads).Controller().obs.endedDeleted); n != 3 {
		t.Fatalf("atoll_ended_gangs_deleted_total %v on the leader, want 3", n)
	}
	// A new leader reads g0, g1 and g2 in name order; g2 ended first of them.
	failOver(t, heads)
	spawn("g6")
	if err := c.StopGang(ctx, "j", "g6"); err != nil {
		t.Fatal(err)
	}
	sync()
	if got, want := gangsLeft(), []string{"g0", "g1", "g6", "live"}; !slices.Equal(got, want) {
		t.Fatalf("gangs in the log after a failover and one more end %v, want %v (g2 ended first)", got, want)
	}
}

// TestEndedRefsDoNotPileUp: a gang name reused 20,000 times (each gang ended before the
// next of the name) leaves the queue of ended gangs within twice the ended gangs plus its
// slack, though no ref is popped below the bound; refs of the gangs still ended stay.
func TestEndedRefsDoNotPileUp(t *testing.T) {
	l := ledger{gangs: map[string]*gangEntry{}}
	at := time.Unix(0, 0)
	for i := range 20000 {
		at = at.Add(time.Second)
		name := "reused"
		if i%1000 == 0 {
			name = fmt.Sprintf("kept-%d", i) // 20 gangs that stay ended
		}
		rec := api.Gang{Spec: api.GangSpec{Job: "j", Name: name}, UID: fmt.Sprint(i), State: api.GangStopped, Updated: at}
		l.putGang(rec.Spec.Key(), &gangEntry{rec: rec})
	}
	g := l.endedGangs
	if g.n != 21 || len(g.queue)-g.head > 2*g.n+1024 {
		t.Fatalf("%d ended gangs, %d refs queued; want 21 and at most %d", g.n, len(g.queue)-g.head, 2*g.n+1024)
	}
	valid := 0
	for _, r := range g.queue[g.head:] {
		if l.endedEntry(r) != nil {
			valid++
		}
	}
	if valid != 21 {
		t.Fatalf("%d refs name a gang still ended, want 21", valid)
	}
}
