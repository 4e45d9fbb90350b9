package head

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/store/meta"
)

// TestPlacedWatchWakesItsMachine: an agent's filtered watch of the gangs table is answered
// as soon as a gang is placed on its machine, within a second (its long poll waits 10 s:
// a watch the placedHub failed to wake would answer late), never with a gang placed on
// another machine, not even when that gang stops, and sees its own gang stop.
func TestPlacedWatchWakesItsMachine(t *testing.T) {
	c := setup(t, 2, api.SchedulerConfig{}, "j")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	type seen struct {
		reset bool
		gang  api.Gang
	}
	got := make(chan seen, 64)
	go func() {
		_ = c.WatchPlaced(ctx, "m1", func(reset bool, l api.Listing, evs []meta.Event) error {
			if reset {
				got <- seen{reset: true}
			}
			for _, ev := range evs {
				var g api.Gang
				if ev.Type == meta.EventPut && json.Unmarshal(ev.KV.Value, &g) == nil {
					got <- seen{gang: g}
				}
			}
			return nil
		})
	}()
	select {
	case s := <-got:
		if !s.reset {
			t.Fatalf("first call %+v, want the listing", s)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no listing")
	}
	next := func(what string) api.Gang {
		t.Helper()
		select {
		case s := <-got:
			return s.gang
		case <-time.After(time.Second):
			t.Fatalf("%s: no event within a second", what)
		}
		return api.Gang{}
	}
	onM1 := func(g api.Gang) bool {
		if g.Placement == nil {
			return false
		}
		for _, m := range g.Placement.Members {
			if m.Machine == "m1" {
				return true
			}
		}
		return false
	}
	var here string
	for _, name := range []string{"a", "b"} { // one island each: one lands on m1
		spec := island("j", name, "")
		if _, err := c.SpawnGang(ctx, spec); err != nil {
			t.Fatal(err)
		}
	}
	g := next("a gang placed on m1")
	if !onM1(g) {
		t.Fatalf("m1's watch saw %s placed on %v", g.Spec.Key(), g.Placement)
	}
	here = g.Spec.Name
	elsewhere := map[string]string{"a": "b", "b": "a"}[here]
	select {
	case s := <-got:
		if s.gang.Spec.Name == elsewhere && s.gang.State.Live() {
			t.Fatalf("m1's watch saw %s, placed on another machine", elsewhere)
		}
	case <-time.After(200 * time.Millisecond):
	}
	if err := c.StopGang(ctx, "j", elsewhere); err != nil {
		t.Fatal(err)
	}
	if err := c.StopGang(ctx, "j", here); err != nil {
		t.Fatal(err)
	}
	for {
		g := next("m1's gang stopped")
		if g.Spec.Name == elsewhere {
			t.Fatalf("m1's watch saw %s %s, placed on another machine", elsewhere, g.State)
		}
		if g.Spec.Name == here && g.State == api.GangStopped {
			break
		}
	}
}

// TestPlacedHubDispatch: the hub wakes the machines a record places a member on, the
// machines it was placed on when it ends, every machine for a record that may concern
// any (a gang it never saw placed), and a waiter that comes after a concerning event at
// once.
func TestPlacedHubDispatch(t *testing.T) {
	h := newPlacedHub(nil)
	put := func(v string) meta.Event {
		return meta.Event{Type: meta.EventPut, KV: meta.KeyValue{Key: api.TableGangs + "j/g", Value: []byte(v)}}
	}
	a, stopA := h.wait("a", 0)
	b, stopB := h.wait("b", 0)
	defer stopA()
	defer stopB()
	h.dispatch([]meta.Event{put(`{"state":"starting","placement":{"members":[{"machine":"a"}]}}`)}, 5, false)
	if !closed(a) || closed(b) {
		t.Fatalf("a placement on a: a woken %v, b woken %v; want a only", closed(a), closed(b))
	}
	if late, stop := h.wait("a", 4); !closed(late) {
		t.Fatal("a waiter from before the event's revision was not woken at once")
	} else {
		stop()
	}
	h.dispatch([]meta.Event{put(`{"state":"pending","generation":0}`)}, 6, false)
	if closed(b) {
		t.Fatal("a new pending gang woke b")
	}
	a2, stopA2 := h.wait("a", 6)
	defer stopA2()
	h.dispatch([]meta.Event{put(`{"state":"stopped"}`)}, 7, false)
	if !closed(a2) || closed(b) {
		t.Fatalf("a gang placed on a ended: a woken %v, b woken %v; want a only", closed(a2), closed(b))
	}
	other := meta.Event{Type: meta.EventPut, KV: meta.KeyValue{Key: api.TableGangs + "j/never", Value: []byte(`{"state":"stopped"}`)}}
	h.dispatch([]meta.Event{other}, 7, false)
	if !closed(b) {
		t.Fatal("a gang the hub never saw placed ended and did not wake b")
	}
	c, stopC := h.wait("c", 7)
	defer stopC()
	// The deletion of a gang the hub did not see end (j/g's is in the test below).
	h.dispatch([]meta.Event{{Type: meta.EventDelete, KV: meta.KeyValue{Key: api.TableGangs + "j/h"}}}, 8, false)
	if !closed(c) {
		t.Fatal("a delete did not wake c")
	}
}

// TestPlacedHubDeleteOfAnEndedGangWakesNobody: the deletion of a gang whose last record
// was ended (the retention of ended gangs) wakes no machine's watch; the deletion of one
// the hub did not see end wakes every machine.
func TestPlacedHubDeleteOfAnEndedGangWakesNobody(t *testing.T) {
	h := newPlacedHub(nil)
	rec := func(g api.Gang) []byte {
		b, err := json.Marshal(g)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	put := func(key string, g api.Gang) meta.Event {
		return meta.Event{Type: meta.EventPut, KV: meta.KeyValue{Key: key, Value: rec(g)}}
	}
	del := func(key string) meta.Event { return meta.Event{Type: meta.EventDelete, KV: meta.KeyValue{Key: key}} }
	ended := api.Gang{Spec: api.GangSpec{Job: "j", Name: "a"}, State: api.GangStopped}
	h.dispatch([]meta.Event{put(api.TableGangs+"j/a", ended)}, 1, false)
	w, stop := h.wait("m1", 1)
	defer stop()
	h.dispatch([]meta.Event{del(api.TableGangs + "j/a")}, 2, false)
	if closed(w) {
		t.Fatal("the deletion of an ended gang woke m1's watch")
	}
	h.dispatch([]meta.Event{del(api.TableGangs + "j/b")}, 3, false)
	if !closed(w) {
		t.Fatal("the deletion of a gang the hub did not see end did not wake m1's watch")
	}
	// A gang of the name that lives again is no longer taken for ended.
	h.dispatch([]meta.Event{put(api.TableGangs+"j/a", ended), put(api.TableGangs+"j/a", api.Gang{State: api.GangPending})}, 4, false)
	w2, stop2 := h.wait("m1", 4)
	defer stop2()
	h.dispatch([]meta.Event{del(api.TableGangs + "j/a")}, 5, false)
	if !closed(w2) {
		t.Fatal("the deletion of a gang whose last record was live did not wake m1's watch")
	}
}

// closed reports whether ch is closed now.
func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// TestPlacedHubLists: the hub lists, by machine, the revisions of the events that concern
// it, merged with those that concern every machine; a watch from before what a list holds
// (a trimmed list, a hub that fell behind the history) is told to read the whole history.
func TestPlacedHubLists(t *testing.T) {
	h := newPlacedHub(nil)
	put := func(rev int64, v string) meta.Event {
		return meta.Event{Type: meta.EventPut, Revision: rev, KV: meta.KeyValue{Key: api.TableGangs + "j/g", Value: []byte(v)}}
	}
	onA := `{"state":"starting","placement":{"members":[{"machine":"a"}]}}`
	onB := `{"state":"starting","placement":{"members":[{"machine":"b"}]}}`
	h.dispatch([]meta.Event{put(2, onA), put(3, onB), put(3, onA), put(4, `{"state":"pending"}`), put(5, `{"state":"stopped"}`), put(6, onB)}, 7, false)
	want := func(machine string, rev int64, revs []int64) {
		t.Helper()
		got, covered, ok := h.concerning(machine, rev)
		if !ok || covered != 7 || fmt.Sprint(got) != fmt.Sprint(revs) {
			t.Fatalf("%s after %d: %v covering %d (listed %v); want %v covering 7", machine, rev, got, covered, ok, revs)
		}
	}
	want("a", 0, []int64{2, 3, 5}) // 5: j/g, placed on a (last at 3), stopped
	want("b", 0, []int64{3, 6})
	want("b", 3, []int64{6})
	want("c", 0, nil)
	want("a", 7, nil)
	never := meta.Event{Type: meta.EventPut, Revision: 8, KV: meta.KeyValue{Key: api.TableGangs + "j/never", Value: []byte(`{"state":"failed"}`)}}
	h.dispatch([]meta.Event{never}, 8, false)
	if revs, _, _ := h.concerning("c", 7); fmt.Sprint(revs) != "[8]" {
		t.Fatalf("c after a gang the hub never saw placed failed: %v, want [8]", revs)
	}
	for r := int64(10); r < 10+maxConcernRevs+1; r++ {
		h.dispatch([]meta.Event{put(r, onA)}, r, false)
	}
	if _, _, ok := h.concerning("a", 5); ok {
		t.Fatal("a watch from before a's trimmed list was answered from it")
	}
	if revs, _, ok := h.concerning("a", 10+maxConcernRevs-2); !ok || len(revs) != 2 {
		t.Fatalf("a's newest revisions: %v (listed %v), want 2", revs, ok)
	}
	h.dispatch(nil, 9000, true) // fell behind the history
	if _, _, ok := h.concerning("b", 8000); ok {
		t.Fatal("a watch from before the hub lost events was answered from its lists")
	}
	if revs, covered, ok := h.concerning("b", 9000); !ok || len(revs) != 0 || covered != 9000 {
		t.Fatalf("b after the loss: %v covering %d (listed %v)", revs, covered, ok)
	}
}
