package api

import (
	"encoding/json"
	"testing"

	"github.com/atoll-run/atoll/store/meta"
)

func TestGangConcerns(t *testing.T) {
	on := func(state GangState, gen int, machines ...string) Gang {
		g := Gang{State: state, Generation: gen}
		if machines != nil {
			g.Placement = &Placement{}
			for _, m := range machines {
				g.Placement.Members = append(g.Placement.Members, Member{Machine: m})
			}
		}
		return g
	}
	removed := on(GangRunning, 1, "b", "m")
	removed.Placement.Members[1].Removed = true
	cases := []struct {
		name string
		g    Gang
		want bool
	}{
		{"placed here", on(GangRunning, 0, "a", "m"), true},
		{"starting here", on(GangStarting, 3, "m"), true},
		{"restarting here", on(GangRestarting, 2, "m"), true},
		{"a member removed from here", removed, true},
		{"running elsewhere", on(GangRunning, 0, "a", "b"), false},
		{"starting elsewhere", on(GangStarting, 4, "a"), false},
		{"restarting elsewhere", on(GangRestarting, 4, "a"), false},
		{"never placed", on(GangPending, 0), false},
		{"requeued (it may have run here)", on(GangPending, 2), true},
		{"stopped", on(GangStopped, 0, "a"), true},
		{"failed", on(GangFailed, 1), true},
	}
	f := NewGangFilter()
	for i, c := range cases {
		b, err := json.Marshal(c.g)
		if err != nil {
			t.Fatal(err)
		}
		if got := GangConcerns(b, "m"); got != c.want {
			t.Errorf("%s: GangConcerns %v, want %v", c.name, got, c.want)
		}
		// The filter tells apart two values of one key written at one revision (one
		// transaction may write both): by their versions.
		kv := meta.KeyValue{Key: "gangs/j/g", Value: b, ModRevision: 7, CreateRevision: 3, Version: int64(i + 1)}
		if got := f.Concerns(kv, "m"); got != c.want {
			t.Errorf("%s: GangFilter.Concerns %v, want %v", c.name, got, c.want)
		}
	}
	if !GangConcerns([]byte("{"), "m") {
		t.Error("a record that does not decode must concern every machine")
	}
}
