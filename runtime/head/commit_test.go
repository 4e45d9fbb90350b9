package head

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/store/meta"
)

// TestSplitWork: decisions made together are cut into parts of at most maxBatchOps, in
// order, none cut in two; a decision larger than the bound alone is a part of its own, and
// decisions that fit one transaction stay one part.
func TestSplitWork(t *testing.T) {
	fn := func(ops, events int) commitFn {
		return commitFn{what: fmt.Sprintf("%d+%d", ops, events), ops: make([]meta.Op, ops), events: make([]api.Event, events)}
	}
	for _, tc := range []struct {
		name  string
		work  []commitFn
		sizes []int // the parts' weights
	}{
		{"fits", []commitFn{fn(10, 1), fn(1000, 1)}, []int{1014}},
		{"the bound exactly", []commitFn{fn(1022, 1)}, []int{1024}},
		{"a job's stop", slices.Repeat([]commitFn{fn(1, 1)}, 1000), []int{1023, 1023, 954}},
		{"one decision over the bound alone", []commitFn{fn(5, 0), fn(3000, 0), fn(5, 0)}, []int{5, 3000, 5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parts := splitWork(tc.work)
			var sizes []int
			var joined []commitFn
			for _, p := range parts {
				n := 0
				for _, w := range p {
					n += workOps(w)
				}
				sizes = append(sizes, n)
				joined = append(joined, p...)
			}
			if !slices.Equal(sizes, tc.sizes) {
				t.Fatalf("parts weigh %v, want %v", sizes, tc.sizes)
			}
			if len(joined) != len(tc.work) {
				t.Fatalf("%d decisions in the parts, want %d", len(joined), len(tc.work))
			}
			for i := range joined {
				if joined[i].what != tc.work[i].what || len(joined[i].ops) != len(tc.work[i].ops) {
					t.Fatalf("decision %d of the parts is %s, want %s (in order)", i, joined[i].what, tc.work[i].what)
				}
			}
		})
	}
}

// TestStopJobInBoundedTransactions: stopping a job of 600 gangs (some 1,800 ops with their
// events) commits in transactions of at most maxBatchOps, more than one of them large, and
// the stop answers once every gang is stopped in the log.
func TestStopJobInBoundedTransactions(t *testing.T) {
	heads, c := setupHeads(t, 1, api.SchedulerConfig{MaxPending: 1000}, "big")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const n = 600
	for i := range n {
		if _, err := c.SpawnGang(ctx, api.GangSpec{Job: "big", Name: fmt.Sprintf("g%03d", i), Kind: "k", Workers: 1, Resources: api.Resources{GPUs: 1}}); err != nil {
			t.Fatal(err)
		}
	}
	obs := leader(t, heads).Controller().obs
	// over is how many transactions so far had more ops than bound.
	over := func(bound float64) uint64 {
		var m dto.Metric
		if err := obs.txOps.Write(&m); err != nil {
			t.Fatal(err)
		}
		h := m.GetHistogram()
		for _, b := range h.GetBucket() {
			if b.GetUpperBound() == bound {
				return h.GetSampleCount() - b.GetCumulativeCount()
			}
		}
		t.Fatalf("no bucket of atoll_decision_transaction_ops bounds %v", bound)
		return 0
	}
	large, huge := over(256), over(maxBatchOps)
	if err := c.StopJob(ctx, "big"); err != nil {
		t.Fatal(err)
	}
	if got := over(maxBatchOps) - huge; got != 0 {
		t.Fatalf("%d transactions over %d ops for the stop", got, maxBatchOps)
	}
	if got := over(256) - large; got < 2 {
		t.Fatalf("%d transactions over 256 ops for the stop of %d gangs, want 2 or more (the stop in parts)", got, n)
	}
	l, err := c.List(ctx, api.TableGangs+"big/")
	if err != nil {
		t.Fatal(err)
	}
	stopped := 0
	for _, kv := range l.KVs {
		var g api.Gang
		if err := json.Unmarshal(kv.Value, &g); err != nil {
			t.Fatal(err)
		}
		if g.State == api.GangStopped {
			stopped++
		}
	}
	if stopped != n {
		t.Fatalf("%d of %d gangs stopped in the log when the stop answered", stopped, n)
	}
}
