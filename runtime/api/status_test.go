package api

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/atoll-run/atoll/internal/jsoncheck"
)

// TestStatusListsAreNeverNull: a fresh cluster's status (no gang, no pool, no queue
// listed) writes every list as [], so that `atoll status --json` and the pages reading it
// never meet a null where they iterate.
func TestStatusListsAreNeverNull(t *testing.T) {
	for name, st := range map[string]Status{
		"zero":       {},
		"fresh":      {Leader: 1, Machines: []MachineStatus{{Name: "m0", GPUs: 8, Alive: true}}},
		"no pools":   {Pools: &PoolsStatus{}},
		"empty ones": {Heads: []HeadInfo{}, Gangs: []GangStatus{}},
	} {
		nulls, err := jsoncheck.Marshal(st)
		if err != nil {
			t.Fatal(err)
		}
		if len(nulls) > 0 {
			t.Errorf("%s: the status's JSON has null at %v", name, nulls)
		}
		b, _ := json.Marshal(st)
		var m map[string]json.RawMessage
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{"heads", "machines", "gangs", "queues", "services"} {
			if string(m[k]) == "" || m[k][0] != '[' {
				t.Errorf("%s: %q is %s, want a list", name, k, m[k])
			}
		}
		var back Status
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatal(err)
		}
		if back.Leader != st.Leader || len(back.Machines) != len(st.Machines) || !reflect.DeepEqual(back.Pools != nil, st.Pools != nil) {
			t.Errorf("%s: read back as %+v", name, back)
		}
	}
}
