package head

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/store/meta"
	"github.com/atoll-run/atoll/store/meta/metaserver"
)

func applyOps(t *testing.T, sm *metaserver.StateMachine, ops ...meta.Op) {
	t.Helper()
	if r := sm.ApplyRequest(&meta.Request{Ops: ops}); r.Error != "" || !r.Succeeded {
		t.Fatal(r.Error)
	}
}

func gangPut(name, uid string) meta.Op {
	return putJSON(api.TableGangs+"j/"+name, api.Gang{Spec: api.GangSpec{Job: "j", Name: name}, UID: uid})
}

// decodedNow is what a term decodes from the state machine without a cache.
func decodedNow(t *testing.T, sm *metaserver.StateMachine) []api.Gang {
	t.Helper()
	gs, err := decodeAll[api.Gang](sm.Range(api.TableGangs), "gang")
	if err != nil {
		t.Fatal(err)
	}
	return gs
}

// TestWarmTablesFollowTheLog: a following head's decoded tables give a new term exactly
// what decoding the state machine gives, taking from the cache only the records unchanged
// since it decoded them: one changed, deleted, deleted and put again (the same version, a
// new revision) or added after the last refresh is decoded again.
func TestWarmTablesFollowTheLog(t *testing.T) {
	sm := metaserver.NewStateMachine(0)
	for i := 1; i <= 4; i++ {
		applyOps(t, sm, gangPut(fmt.Sprintf("g%d", i), "a"))
	}
	w := newWarmTables(sm)
	w.refresh() // the whole tables
	applyOps(t, sm, gangPut("g1", "b"))
	applyOps(t, sm, meta.Op{Type: meta.OpDelete, Key: api.TableGangs + "j/g2"})
	w.refresh() // what was applied since
	if len(w.gangs.byKey) != 3 {
		t.Fatalf("cache holds %d gangs after a delete, want 3", len(w.gangs.byKey))
	}
	// After the last refresh: g3 deleted and put again (version 1 again), g5 added.
	applyOps(t, sm, meta.Op{Type: meta.OpDelete, Key: api.TableGangs + "j/g3"})
	applyOps(t, sm, gangPut("g3", "c"))
	applyOps(t, sm, gangPut("g5", "a"))
	tabs, err := w.take()
	if err != nil {
		t.Fatal(err)
	}
	if want := decodedNow(t, sm); !reflect.DeepEqual(tabs.gangs, want) {
		t.Fatalf("term's gangs %+v, want %+v", tabs.gangs, want)
	}
	if tabs.warm != 2 || tabs.decoded != 2 { // g1 and g4 cached; g3 and g5 decoded
		t.Fatalf("warm %d, decoded %d: want 2 and 2", tabs.warm, tabs.decoded)
	}
	if g := tabs.gangs[1]; g.Spec.Name != "g3" || g.UID != "c" { // g1, g3, g4, g5
		t.Fatalf("g3 put again: %s UID %q, want g3 c (the cached record is of the deleted one)", g.Spec.Name, g.UID)
	}
	// Taken, the cache is empty: the records are the term's alone.
	if len(w.gangs.byKey) != 0 || w.next != 0 {
		t.Fatalf("cache after take: %d gangs, revision %d", len(w.gangs.byKey), w.next)
	}
	tabs, err = w.take()
	if err != nil || tabs.warm != 0 || tabs.decoded != 4 {
		t.Fatalf("a second take: warm %d decoded %d (%v), want 0 and 4", tabs.warm, tabs.decoded, err)
	}
}

// TestWarmTablesPastTheHistory: a refresh whose revisions the state machine's history no
// longer holds decodes the whole tables again, and a record that does not decode is left
// to the term, which reports it.
func TestWarmTablesPastTheHistory(t *testing.T) {
	sm := metaserver.NewStateMachine(4)
	applyOps(t, sm, gangPut("g1", "a"))
	w := newWarmTables(sm)
	w.refresh()
	for i := range 10 { // past the history of 4 events
		applyOps(t, sm, gangPut(fmt.Sprintf("g%d", i%3+1), fmt.Sprint(i)))
	}
	if _, _, err := sm.EventsView(w.next); !errors.Is(err, meta.ErrCompacted) {
		t.Fatalf("the history still holds revision %d: %v", w.next, err)
	}
	w.refresh()
	tabs, err := w.take()
	if err != nil {
		t.Fatal(err)
	}
	if want := decodedNow(t, sm); !reflect.DeepEqual(tabs.gangs, want) || tabs.warm != 3 {
		t.Fatalf("after the history was cut: %+v (warm %d), want %+v, all 3 warm", tabs.gangs, tabs.warm, want)
	}
	bad := meta.Op{Type: meta.OpPut, Key: api.TableGangs + "j/bad", Value: []byte("{not json")}
	applyOps(t, sm, bad)
	w.refresh()
	if _, err := w.take(); err == nil || !strings.Contains(err.Error(), "j/bad") {
		t.Fatalf("a record that does not decode: %v, want its key named", err)
	}
	var syn *json.SyntaxError
	if _, err := w.take(); !errors.As(err, &syn) {
		t.Fatalf("the error %v does not carry the decoder's", err)
	}
}

// TestNewLeaderStartsFromWarmTables: in a group of three heads, a follower that decoded
// the machines and the job's gang while it followed takes them from its warm tables when it
// becomes leader (it decodes none of them again), and its term has every record.
func TestNewLeaderStartsFromWarmTables(t *testing.T) {
	heads, c, net, ctx := heads3WithJob(t)
	if _, err := c.SpawnGang(ctx, api.GangSpec{Job: "j", Name: "g", Kind: "k", Workers: 2, Resources: api.Resources{GPUs: 8}}); err != nil {
		t.Fatal(err)
	}
	old := leader(t, heads)
	rev := old.Controller().sm.Revision()
	warmBefore := map[*Head]float64{}
	for _, h := range heads {
		if h == old {
			continue
		}
		// The follower applies what the leader had applied (woken by each change), then
		// decodes it.
		sm := h.Controller().sm
		for sm.Revision() < rev {
			if _, _, err := sm.EventsSince(ctx, "", sm.Revision(), 0); err != nil {
				t.Fatal(err)
			}
		}
		h.Controller().warm.refresh()
		warmBefore[h] = testutil.ToFloat64(h.Controller().obs.termRecords.WithLabelValues("warm"))
	}
	nl := changeLeader(t, heads, net)
	warm := testutil.ToFloat64(nl.Controller().obs.termRecords.WithLabelValues("warm")) - warmBefore[nl]
	if warm < 3 { // two machines and the gang, at least
		t.Fatalf("the new leader took %v records from its warm tables, want the 2 machines and the gang at least", warm)
	}
	st, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Machines) != 2 || len(st.Gangs) != 1 {
		t.Fatalf("the new leader's status: %d machines, %d gangs; want 2 and 1", len(st.Machines), len(st.Gangs))
	}
}
