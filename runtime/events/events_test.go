package events

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/store/meta"
)

func TestFromGang(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	spec := api.GangSpec{Job: "j", Name: "g"}
	placed := &api.Placement{Machines: []string{"m0"}, Islands: 1, Scores: map[string]float64{"total": 1.5}}
	gang := func(s api.GangState, gen int, p *api.Placement, reason string) api.Gang {
		return api.Gang{Spec: spec, State: s, Generation: gen, Placement: p, Reason: reason, Updated: at}
	}
	for _, tc := range []struct {
		name string
		old  *api.Gang
		new  api.Gang
		want string // kind and reason, or "" for no event
	}{
		{"a new gang placed at once", nil, gang(api.GangStarting, 0, placed, ""), "gang_placed"},
		{"a waiting gang placed", ptr(gang(api.GangPending, 1, nil, "no room")), gang(api.GangStarting, 1, placed, ""), "gang_placed"},
		{"its workers ready", ptr(gang(api.GangStarting, 0, placed, "")), gang(api.GangRunning, 0, placed, ""), "gang_running"},
		{"a worker failed", ptr(gang(api.GangRunning, 0, placed, "")), gang(api.GangRestarting, 1, placed, "worker 3 exited"), "gang_restart: worker 3 exited"},
		{"the next generation after its backoff", ptr(gang(api.GangRestarting, 1, placed, "worker 3 exited")), gang(api.GangStarting, 1, placed, "worker 3 exited"), ""},
		{"its agent restarted", ptr(gang(api.GangRunning, 0, placed, "")), gang(api.GangStarting, 1, placed, "the agent of m0 restarted"), "gang_restart: the agent of m0 restarted"},
		{"its machine lost", ptr(gang(api.GangRunning, 0, placed, "")), gang(api.GangPending, 1, nil, "restarting elsewhere: m0 died"), "gang_waiting: restarting elsewhere: m0 died"},
		{"out of restarts", ptr(gang(api.GangRunning, 2, placed, "")), gang(api.GangFailed, 2, placed, "after 3 restarts"), "gang_failed: after 3 restarts"},
		{"stopped", ptr(gang(api.GangRunning, 0, placed, "")), gang(api.GangStopped, 0, placed, "its job stopped"), "gang_stopped: its job stopped"},
		{"running again (a record rewritten)", ptr(gang(api.GangRunning, 0, placed, "")), gang(api.GangRunning, 0, placed, ""), ""},
		{"still waiting", ptr(gang(api.GangPending, 1, nil, "a")), gang(api.GangPending, 1, nil, "b"), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			evs := FromGang(tc.old, tc.new)
			got := ""
			if len(evs) > 1 {
				t.Fatalf("%d events: %+v", len(evs), evs)
			}
			if len(evs) == 1 {
				e := evs[0]
				got = string(e.Kind)
				if e.Reason != "" {
					got += ": " + e.Reason
				}
				if e.Job != "j" || e.Gang != "g" || e.Generation != tc.new.Generation || !e.Time.Equal(at) {
					t.Errorf("event %+v: want j/g generation %d at %v", e, tc.new.Generation, at)
				}
				if e.Kind == api.EventGangPlaced && (len(e.Machines) != 1 || e.Scores["total"] != 1.5) {
					t.Errorf("placement event %+v lacks the placement", e)
				}
			}
			if got != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// apply runs ops on a map standing for the table.
func apply(table map[string][]byte, ops []meta.Op) {
	for _, op := range ops {
		switch op.Type {
		case meta.OpPut:
			table[op.Key] = op.Value
		case meta.OpDelete:
			delete(table, op.Key)
		}
	}
}

func TestLogIsBoundedAndResumes(t *testing.T) {
	table := map[string][]byte{}
	l := NewLog(5)
	for i := 0; i < 12; i++ {
		apply(table, l.Ops([]api.Event{{Kind: api.EventGangRunning, Job: "j", Gang: "g", Generation: i}}))
	}
	if len(table) != 5 {
		t.Fatalf("the table holds %d events, want its bound 5", len(table))
	}
	for seq := int64(8); seq <= 12; seq++ {
		b, ok := table[api.TableEvents+api.EventKey(seq)]
		var e api.Event
		if !ok || json.Unmarshal(b, &e) != nil || e.Seq != seq || e.Generation != int(seq-1) {
			t.Fatalf("event %d: %s", seq, b)
		}
	}
	// A new leader resumes after the newest, and deletes what a failed commit left over.
	table[api.TableEvents+api.EventKey(2)] = []byte(`{"seq":2}`)
	var kvs []meta.KeyValue
	for k, v := range table {
		kvs = append(kvs, meta.KeyValue{Key: k, Value: v})
	}
	kvs = append(kvs, meta.KeyValue{Key: api.TableEvents + "not-a-number"})
	l2 := NewLog(5)
	prune := l2.Resume(kvs)
	if len(prune) != 1 || prune[0].Type != meta.OpDelete || !strings.HasSuffix(prune[0].Key, api.EventKey(2)) {
		t.Fatalf("resume prunes %+v, want the delete of event 2", prune)
	}
	apply(table, prune)
	ops := l2.Ops([]api.Event{{Kind: api.EventJobStopped, Job: "j"}})
	if len(ops) != 2 || ops[0].Key != api.TableEvents+api.EventKey(13) || ops[1].Key != api.TableEvents+api.EventKey(8) {
		t.Fatalf("the first event after resuming: %+v, want a put of 13 and the delete of 8", ops)
	}
}

func TestFilter(t *testing.T) {
	evs := []api.Event{{Job: "a"}, {Machine: "m"}, {Job: "b"}, {Job: "a"}}
	if got := Filter(evs, "a"); len(got) != 2 {
		t.Fatalf("job a: %d events", len(got))
	}
	if got := Filter(evs, ""); len(got) != 4 {
		t.Fatalf("all: %d events", len(got))
	}
}
