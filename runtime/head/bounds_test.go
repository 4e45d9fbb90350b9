package head

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"maps"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/atoll-run/atoll/runtime/api"
)

// TestZeroResourceGangsAreBounded: a gang of 100,000 workers that asks for nothing is
// refused by the per-job bound; with the bounds raised, by the CPU share every member
// counts; a gang placed counts that share per member; the per-job and per-cluster bounds
// refuse a gang naming the bound, and ended gangs do not count.
func TestZeroResourceGangsAreBounded(t *testing.T) {
	heads, c := setupHeads(t, 1, api.SchedulerConfig{}, "j", "k") // one dgx-h100: 224 cores
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	huge := api.GangSpec{Job: "j", Name: "huge", Kind: "k", Workers: 100000}
	_, err := c.SpawnGang(ctx, huge)
	if !errors.Is(err, api.ErrInvalid) || !strings.Contains(err.Error(), "max_job_workers") || !strings.Contains(err.Error(), "10000") {
		t.Fatalf("100,000 zero-resource workers: %v; want a refusal naming max_job_workers and its default", err)
	}
	if _, err := c.SetSchedulerConfig(ctx, api.SchedulerConfig{MaxJobWorkers: 200000, MaxClusterWorkers: 200000}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SpawnGang(ctx, huge); !errors.Is(err, api.ErrNeverFits) || !strings.Contains(err.Error(), "milli-CPU") {
		t.Fatalf("100,000 zero-resource workers within the raised bounds: %v; want never fits for their CPU shares", err)
	}
	if _, err := c.SpawnGang(ctx, api.GangSpec{Job: "j", Name: "over", Kind: "k", Workers: 2241}); !errors.Is(err, api.ErrNeverFits) {
		t.Fatalf("2241 zero-resource workers on 224 cores: %v; want never fits", err)
	}
	g, err := c.SpawnGang(ctx, api.GangSpec{Job: "j", Name: "small", Kind: "k", Workers: 4})
	if err != nil || g.Placement == nil {
		t.Fatalf("4 zero-resource workers: %+v %v", g, err)
	}
	for i, m := range g.Placement.Members {
		if m.CPUMilli != MinMemberCPUMilli {
			t.Fatalf("member %d holds %d milli-CPU: want the minimal share %d", i, m.CPUMilli, MinMemberCPUMilli)
		}
	}
	if err := c.StopGang(ctx, "j", "small"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SetSchedulerConfig(ctx, api.SchedulerConfig{MaxJobWorkers: 16, MaxClusterWorkers: 20}); err != nil {
		t.Fatal(err)
	}
	spawn := func(job, name string, n int) error {
		_, err := c.SpawnGang(ctx, api.GangSpec{Job: job, Name: name, Kind: "k", Workers: n})
		return err
	}
	if err := spawn("j", "a", 15); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		job, name string
		n         int
		bound     string
	}{{"j", "b", 2, "max_job_workers"}, {"k", "c", 6, "max_cluster_workers"}} {
		if err := spawn(tt.job, tt.name, tt.n); !errors.Is(err, api.ErrInvalid) || !strings.Contains(err.Error(), tt.bound) {
			t.Fatalf("%s/%s of %d workers: %v; want a refusal naming %s", tt.job, tt.name, tt.n, err, tt.bound)
		}
	}
	if err := spawn("k", "c", 5); err != nil {
		t.Fatalf("5 more workers, at the cluster bound: %v", err)
	}
	if err := c.StopGang(ctx, "j", "a"); err != nil {
		t.Fatal(err)
	}
	if err := spawn("k", "d", 11); err != nil { // k: 16 with c; cluster: 16 (a ended)
		t.Fatalf("after a gang ended: %v", err)
	}
	checkWorkerCount(t, heads)
	if err := c.StopGang(ctx, "k", "d"); err != nil {
		t.Fatal(err)
	}
	if err := spawn("k", "d", 11); err != nil { // spawned again under the ended gang's name
		t.Fatalf("a gang spawned again: %v", err)
	}
	checkWorkerCount(t, heads)
	if err := spawn("j", "e", 5); !errors.Is(err, api.ErrInvalid) || !strings.Contains(err.Error(), "max_cluster_workers") {
		t.Fatalf("5 more workers beside 16, past the cluster's 20: %v; want a refusal naming max_cluster_workers", err)
	}
}

// checkWorkerCount: the leader's running count of live workers is what counting every
// gang gives.
func checkWorkerCount(t *testing.T, heads []*Head) {
	t.Helper()
	led := 0
	for _, h := range heads {
		c := h.Controller()
		c.mu.Lock()
		if c.t != nil {
			led++
			var want workerCount
			for _, e := range c.t.gangs {
				want.add(e.rec, 1)
			}
			if got := c.t.workers; got.all != want.all || !maps.Equal(got.jobs, want.jobs) {
				t.Errorf("head %d's ledger counts %d workers %v; counting every gang gives %d %v", h.ID(), got.all, got.jobs, want.all, want.jobs)
			}
		}
		c.mu.Unlock()
	}
	if led == 0 {
		t.Fatal("no head leads: no count to check")
	}
}

// TestOversizeFieldsAreRefused: a kind, name, arguments or environment over its limit is
// refused with a 400 naming the field and its limit, and nothing is committed.
func TestOversizeFieldsAreRefused(t *testing.T) {
	heads, c := group(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.RegisterMachine(ctx, machine(t, "m0")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SubmitJob(ctx, api.Job{Name: "j"}); err != nil {
		t.Fatal(err)
	}
	mib := strings.Repeat("x", 1<<20)
	gang := func(f func(*api.GangSpec)) api.GangSpec {
		s := api.GangSpec{Job: "j", Name: "g", Kind: "k", Workers: 1}
		f(&s)
		return s
	}
	tests := []struct {
		name string
		call func() error
		want string
	}{
		{"kind", func() error {
			_, err := c.SpawnGang(ctx, gang(func(s *api.GangSpec) { s.Kind = mib }))
			return err
		}, "kind is 1048576 bytes, over its limit of 256 bytes"},
		{"gang name", func() error {
			_, err := c.SpawnGang(ctx, gang(func(s *api.GangSpec) { s.Name = mib }))
			return err
		}, "gang name is 1048576 bytes, over its limit of 63"},
		{"args", func() error {
			_, err := c.SpawnGang(ctx, gang(func(s *api.GangSpec) { s.Args = &api.Payload{Type: "t", Data: []byte(mib)} }))
			return err
		}, "args.data is 1048576 bytes, over its limit of 65536 bytes"},
		{"job args", func() error {
			_, err := c.SubmitJob(ctx, api.Job{Name: "j2", Args: []string{mib}})
			return err
		}, "args is 1048576 bytes, over its limit of 65536 bytes"},
		{"job env", func() error {
			_, err := c.SubmitJob(ctx, api.Job{Name: "j2", Env: []string{"A=" + mib}})
			return err
		}, "env is 1048578 bytes, over its limit of 65536 bytes"},
		{"drain reason", func() error {
			return c.Drain(ctx, api.DrainRequest{Machine: "m0", Reason: mib})
		}, "reason is 1048576 bytes, over its limit of 1024 bytes"},
	}
	for _, tt := range tests {
		err := tt.call()
		if !errors.Is(err, api.ErrInvalid) || !strings.Contains(err.Error(), tt.want) || len(err.Error()) > 1024 {
			t.Errorf("%s: %.300v; want a refusal saying %q (and not echoing the value)", tt.name, err, tt.want)
		}
	}
	if _, _, err := c.Gang(ctx, "j", "g"); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("the refused gang: %v; want nothing committed", err)
	}
	// The answer is a 400, from any head (the bounds are checked before the leader is asked).
	body, _ := json.Marshal(gang(func(s *api.GangSpec) { s.Kind = mib }))
	for _, h := range heads {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.Address()+"/v1/gangs", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+string(testToken))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var eb api.ErrorBody
		_ = json.NewDecoder(resp.Body).Decode(&eb)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(eb.Error, "kind") {
			t.Fatalf("head %d: %d %q; want 400 naming the kind", h.ID(), resp.StatusCode, eb.Error)
		}
	}
}
