package sdk

import (
	"testing"

	"github.com/atoll-run/atoll/internal/jsoncheck"
	"github.com/atoll-run/atoll/runtime/api"
)

// TestStatusListsAreNeverNull: `atoll status --json` writes the SDK's Status; on a fresh
// cluster its lists are [], never null, whether the head's answer had them or not.
func TestStatusListsAreNeverNull(t *testing.T) {
	for name, st := range map[string]Status{
		"zero":      {},
		"converted": fromAPIStatus(api.Status{Leader: 1, Machines: []api.MachineStatus{{Name: "m0", GPUs: 8, Alive: true}}}),
		"no pools":  {Pools: &PoolsStatus{}},
	} {
		nulls, err := jsoncheck.Marshal(st)
		if err != nil {
			t.Fatal(err)
		}
		if len(nulls) > 0 {
			t.Errorf("%s: the status's JSON has null at %v", name, nulls)
		}
	}
}
