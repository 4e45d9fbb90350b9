package main

import (
	"encoding/json"
	"slices"
	"testing"
)

// TestBenchRayRowsAreRays: the rows are ray_perf.py's names, each with Ray 2.22's
// published figure, in Ray's units; the cluster targets name rows that exist.
func TestBenchRayRowsAreRays(t *testing.T) {
	want := []string{"single_client_put_calls", "single_client_get_calls", "single_client_put_gigabytes",
		"single_client_tasks_sync", "single_client_tasks_async", "multi_client_tasks_async", "1_1_actor_calls_sync",
		"1_1_actor_calls_async", "1_n_actor_calls_async", "n_n_actor_calls_async", "single_client_wait_1k_refs",
		"placement_group_create_removal"}
	var got []string
	for _, c := range rayCases() {
		got = append(got, c.name)
		if _, ok := rayPublished[c.name]; !ok {
			t.Errorf("row %s has no published figure", c.name)
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("rows %v, want %v", got, want)
	}
	if len(rayPublished) != len(want) {
		t.Fatalf("%d published figures for %d rows", len(rayPublished), len(want))
	}
	for name := range rayClusterTargets {
		if !slices.Contains(want, name) {
			t.Errorf("a cluster target for %s, which is no row", name)
		}
	}
}

// TestBenchRayJSON runs the two single-client task rows, briefly, on the embedded default and reads the JSON: each
// row measured, beside Ray's figure and the ratio, with the target of the embedded
// default (Ray's figure).
func TestBenchRayJSON(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the embedded default")
	}
	out, err := runCLI(t, "bench", "ray", "--json", "--only", "single_client_tasks", "--warmup", "0s", "--round", "20ms", "--rounds", "1")
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		Mode string `json:"mode"`
		Ray  struct {
			Version, Machine string
		} `json:"ray"`
		Rows []rayRow `json:"rows"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if r.Mode != "embedded" || r.Ray.Version != rayRelease || r.Ray.Machine != rayMachine {
		t.Fatalf("mode %q, Ray %+v", r.Mode, r.Ray)
	}
	var names []string
	for _, row := range r.Rows {
		names = append(names, row.Name)
		if row.Error != "" || row.Atoll <= 0 || row.Ops < 1 || row.Ray == nil || row.Ratio == nil || row.Target == nil || row.Met == nil {
			t.Errorf("row %+v", row)
			continue
		}
		if *row.Ray != rayPublished[row.Name] || *row.Target != *row.Ray || *row.Ratio != row.Atoll / *row.Ray || *row.Met != (row.Atoll >= *row.Ray) {
			t.Errorf("row %s: Ray %v, target %v, ratio %v, met %v for %v", row.Name, *row.Ray, *row.Target, *row.Ratio, *row.Met, row.Atoll)
		}
	}
	want := []string{"single_client_tasks_sync", "single_client_tasks_async"}
	if !slices.Equal(names, want) {
		t.Fatalf("rows %v, want %v", names, want)
	}
}
