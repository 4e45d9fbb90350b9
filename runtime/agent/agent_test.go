package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/store/meta"
)

func gangRecord(job, name, uid string, state api.GangState, gen int, members ...api.Member) api.Gang {
	g := api.Gang{Spec: api.GangSpec{Job: job, Name: name, Kind: "k", Workers: len(members)}, UID: uid, State: state, Generation: gen}
	if len(members) > 0 {
		g.Placement = &api.Placement{Members: members}
	}
	return g
}

func kvOf(t *testing.T, g api.Gang) meta.KeyValue {
	t.Helper()
	b, err := json.Marshal(g)
	if err != nil {
		t.Fatal(err)
	}
	return meta.KeyValue{Key: api.TableGangs + g.Spec.Key(), Value: b}
}

func TestApplyGangs(t *testing.T) {
	a := gangRecord("j", "a", "u1", api.GangRunning, 0)
	b := gangRecord("j", "b", "u2", api.GangPending, 0)
	a2 := gangRecord("j", "a", "u1", api.GangRunning, 1)
	bad := meta.KeyValue{Key: api.TableGangs + "j/bad", Value: []byte("{")}
	cases := []struct {
		name  string
		start map[string]api.Gang
		reset bool
		l     api.Listing
		evs   []meta.Event
		want  map[string]int // generation by key
	}{
		{name: "a reset replaces everything with the listing, undecodable records aside", start: map[string]api.Gang{"x/y": {}}, reset: true,
			l: api.Listing{KVs: []meta.KeyValue{kvOf(t, a), kvOf(t, b), bad}}, want: map[string]int{"j/a": 0, "j/b": 0}},
		{name: "puts replace, deletes remove", start: map[string]api.Gang{"j/a": a, "j/b": b},
			evs:  []meta.Event{{Type: meta.EventPut, KV: kvOf(t, a2)}, {Type: meta.EventDelete, KV: meta.KeyValue{Key: api.TableGangs + "j/b"}}},
			want: map[string]int{"j/a": 1}},
		{name: "a put that does not decode keeps the old record", start: map[string]api.Gang{"j/bad": a},
			evs: []meta.Event{{Type: meta.EventPut, KV: bad}}, want: map[string]int{"j/bad": 0}},
		{name: "ended gangs are dropped, from a listing and from puts", start: map[string]api.Gang{"j/a": a}, reset: true,
			l:    api.Listing{KVs: []meta.KeyValue{kvOf(t, a), kvOf(t, gangRecord("j", "s", "u4", api.GangStopped, 0))}},
			evs:  []meta.Event{{Type: meta.EventPut, KV: kvOf(t, gangRecord("j", "a", "u1", api.GangFailed, 0))}, {Type: meta.EventPut, KV: kvOf(t, b)}},
			want: map[string]int{"j/b": 0}},
		{name: "a reset with events after it", start: nil, reset: true, l: api.Listing{KVs: []meta.KeyValue{kvOf(t, a)}},
			evs: []meta.Event{{Type: meta.EventPut, KV: kvOf(t, b)}}, want: map[string]int{"j/a": 0, "j/b": 0}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := map[string]int{}
			for k, g := range applyGangs(c.start, c.reset, c.l, c.evs) {
				got[k] = g.Generation
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("gangs %v, want %v", got, c.want)
			}
		})
	}
}

func TestDesired(t *testing.T) {
	base := api.WorkerSpec{Machine: "m1", Simulated: true, Heads: []string{"http://h:1"}, Token: "tok", Agent: "http://m1:9", Transfer: "m1:10"}
	on := func(machine string, gpus ...int) api.Member { return api.Member{Machine: machine, GPUs: gpus} }
	removed := on("m1", 5)
	removed.Removed = true
	elastic := gangRecord("j", "el", "u3", api.GangRunning, 2, on("m1", 0), on("m2", 0), on("m1", 1))
	elastic.World = &api.World{Epoch: 4, Members: []int{2, 0}}
	driver := gangRecord("j", "driver", "u4", api.GangStarting, 0, on("m1"))
	driver.Spec.Driver = true
	gangs := map[string]api.Gang{
		"j/run":     gangRecord("j", "run", "u1", api.GangRunning, 1, on("m1", 0, 1), on("m2", 0), on("m1", 2)),
		"j/pending": gangRecord("j", "pending", "u2", api.GangPending, 0, on("m1", 3)),
		"j/stopped": gangRecord("j", "stopped", "u5", api.GangStopped, 0, on("m1", 4)),
		"j/nowhere": gangRecord("j", "nowhere", "u6", api.GangRunning, 0),
		"j/shrunk":  gangRecord("j", "shrunk", "u7", api.GangRunning, 0, removed, on("m1", 6)),
		"j/el":      elastic,
		"j/driver":  driver,
	}
	exited := map[string]bool{"u1/j/run/2.g1": true}
	got := desired(gangs, exited, base)
	var keys []string
	for k := range got {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	want := []string{"j/driver/0", "j/el/0", "j/el/2", "j/run/0", "j/shrunk/1"}
	if !reflect.DeepEqual(keys, want) {
		t.Fatalf("workers %v, want %v (only starting and running gangs' members here, not removed, not exited)", keys, want)
	}
	r := got["j/run/0"]
	if r.Job != "j" || r.Gang != "run" || r.Rank != 0 || r.Generation != 1 || r.GangUID != "u1" || r.Kind != "k" ||
		!reflect.DeepEqual(r.Member.GPUs, []int{0, 1}) || len(r.Placement.Members) != 3 || r.Holder != "worker/j/run/0.g1" ||
		r.Machine != "m1" || !r.Simulated || r.Token != "tok" || r.Agent != base.Agent || r.Transfer != base.Transfer || r.Driver ||
		!reflect.DeepEqual(r.World, []int{0, 1, 2}) || r.Epoch != 0 {
		t.Errorf("j/run/0: %+v", r)
	}
	if e := got["j/el/2"]; !reflect.DeepEqual(e.World, []int{2, 0}) || e.Epoch != 4 || e.Rank != 2 {
		t.Errorf("an elastic gang's worker: world %v epoch %d rank %d, want [2 0], 4, 2", e.World, e.Epoch, e.Rank)
	}
	if !got["j/driver/0"].Driver {
		t.Error("a driver's spec does not say so")
	}
	// Each spec has its own copy of the heads.
	r.Heads[0] = "changed"
	if got["j/el/0"].Heads[0] != "http://h:1" || base.Heads[0] != "http://h:1" {
		t.Error("specs share their heads")
	}
}

func TestForgetExits(t *testing.T) {
	gangs := map[string]api.Gang{"j/a": gangRecord("j", "a", "u1", api.GangRunning, 3)}
	exited := map[string]bool{
		"u1/j/a/0.g1": true, // an older generation of a gang still there: kept
		"u1/j/a/1.g3": true,
		"u0/j/a/0.g0": true, // an earlier gang of the same names: forgotten
		"u2/j/b/0.g0": true, // a gang gone: forgotten
		"garbage":     true,
	}
	forgetExits(exited, gangs)
	if want := map[string]bool{"u1/j/a/0.g1": true, "u1/j/a/1.g3": true}; !reflect.DeepEqual(exited, want) {
		t.Errorf("exits %v, want %v", exited, want)
	}
	if k := exitKey(api.WorkerSpec{GangUID: "u1", Job: "j", Gang: "a", Rank: 1, Generation: 3}); !exited[k] {
		t.Errorf("exitKey %q is not the key remembered", k)
	}
}

func TestReconcilePlan(t *testing.T) {
	w := func(gen int, stopping bool) *worker {
		return &worker{spec: api.WorkerSpec{Generation: gen}, stopping: stopping}
	}
	spec := func(gen int) api.WorkerSpec { return api.WorkerSpec{Generation: gen} }
	keep, old, gone, leaving := w(1, false), w(0, false), w(0, false), w(0, true)
	cases := []struct {
		name    string
		workers map[string]*worker
		want    map[string]api.WorkerSpec
		stop    []*worker
		start   []string
	}{
		{name: "nothing", workers: map[string]*worker{}, want: map[string]api.WorkerSpec{}},
		{name: "start what is missing, sorted", workers: map[string]*worker{"b": keep}, want: map[string]api.WorkerSpec{"c": spec(0), "a": spec(0), "b": spec(1)},
			start: []string{"a", "c"}},
		{name: "stop what is no longer wanted or of another generation", workers: map[string]*worker{"b": keep, "old": old, "gone": gone},
			want: map[string]api.WorkerSpec{"b": spec(1), "old": spec(1)}, stop: []*worker{old, gone}},
		{name: "a worker stopping is not stopped again nor started before it is gone", workers: map[string]*worker{"x": leaving},
			want: map[string]api.WorkerSpec{"x": spec(1)}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			stop, start := reconcilePlan(c.workers, c.want)
			if len(stop) != len(c.stop) || !reflect.DeepEqual(start, c.start) {
				t.Fatalf("stop %d, start %v; want %d, %v", len(stop), start, len(c.stop), c.start)
			}
			for _, s := range c.stop {
				found := false
				for _, x := range stop {
					found = found || x == s
				}
				if !found {
					t.Errorf("worker %+v not stopped", s)
				}
			}
		})
	}
}

func TestPermanent(t *testing.T) {
	cases := []struct {
		err  error
		want bool
	}{
		{nil, false},
		{errors.New("x"), false},
		{permanentErr{errors.New("x")}, true},
		{fmt.Errorf("launch: %w", permanentErr{errors.New("x")}), true},
	}
	for _, c := range cases {
		if got := isPermanent(c.err); got != c.want {
			t.Errorf("isPermanent(%v) = %v", c.err, got)
		}
	}
	inner := errors.New("inner")
	if !errors.Is(permanentErr{inner}, inner) {
		t.Error("a permanent error does not unwrap")
	}
}

func TestLogPath(t *testing.T) {
	if got, want := LogPath("/d", "job", "gang", 3, 7), filepath.Join("/d", "logs", "job", "gang.3.g7.log"); got != want {
		t.Errorf("LogPath %q, want %q", got, want)
	}
}

func TestBinaryWithoutFetch(t *testing.T) {
	content := []byte("#!/bin/sh\necho hi\n")
	sum := sha256.Sum256(content)
	hash := hex.EncodeToString(sum[:])
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bin", hash), content, 0o700); err != nil {
		t.Fatal(err)
	}
	otherSum := sha256.Sum256([]byte("other"))
	other := hex.EncodeToString(otherSum[:])
	cases := []struct {
		name      string
		bin       *api.Binary
		path      string
		err       string
		permanent bool
	}{
		{name: "no executable: workers run in the driver", err: "has no executable", permanent: true},
		{name: "not a sha256", bin: &api.Binary{SHA256: "abc"}, err: "is not a sha256", permanent: true},
		{name: "already here with its hash and size: not fetched", bin: &api.Binary{SHA256: hash, Size: int64(len(content)), Object: "not fetched"},
			path: filepath.Join(dir, "bin", hash)},
		{name: "not here, and an object id that does not parse", bin: &api.Binary{SHA256: other, Size: 5, Object: "zz"},
			path: filepath.Join(dir, "bin", other), err: "executable object", permanent: true},
	}
	// No object store: any fetch would fail on it.
	a := &Agent{cfg: Config{Dir: dir}, binaries: map[string]*sync.Once{}, binErr: map[string]error{}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path, err := a.binary(context.Background(), api.Job{Name: "j", Binary: c.bin})
			if c.path != "" && path != c.path {
				t.Errorf("path %q, want %q", path, c.path)
			}
			if c.err == "" && err != nil || c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)) || isPermanent(err) != c.permanent {
				t.Errorf("error %v (permanent %v), want %q (%v)", err, isPermanent(err), c.err, c.permanent)
			}
		})
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.binaries[other]; ok {
		t.Error("a failed fetch is remembered: a later launch would not try again")
	}
	if _, ok := a.binaries[hash]; !ok {
		t.Error("a good executable is checked again at every launch")
	}
}

func TestFileSHA256(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(path, []byte("abc"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := fileSHA256(path); err != nil || got != "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad" {
		t.Errorf("sha256 %s, %v", got, err)
	}
	if _, err := fileSHA256(path + ".missing"); err == nil {
		t.Error("the hash of a missing file")
	}
}

// TestRetryUnavailable: a report the heads could not take (unavailable: no leader, a
// timeout, a busy head) is tried again until it is taken; one refused for good is not;
// the worker's end stops the tries.
func TestRetryUnavailable(t *testing.T) {
	ctx := context.Background()
	calls := 0
	n, err := retryUnavailable(ctx, nil, time.Millisecond, 2*time.Millisecond, func(context.Context) error {
		calls++
		if calls < 3 {
			return fmt.Errorf("%w: waiting for the commit: context deadline exceeded", api.ErrUnavailable)
		}
		return nil
	})
	if err != nil || n != 3 || calls != 3 {
		t.Fatalf("unavailable twice, then taken: %d tries, %v; want 3 tries and no error", n, err)
	}
	n, err = retryUnavailable(ctx, nil, time.Millisecond, time.Millisecond, func(context.Context) error {
		return fmt.Errorf("%w: the gang moved", api.ErrNotFound)
	})
	if n != 1 || !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("refused for good: %d tries, %v; want 1 try and the refusal", n, err)
	}
	stop := make(chan struct{})
	n, err = retryUnavailable(ctx, stop, time.Hour, time.Hour, func(context.Context) error {
		close(stop) // the worker ends while its report waits
		return api.ErrUnavailable
	})
	if n != 1 || !errors.Is(err, api.ErrUnavailable) {
		t.Fatalf("the worker ended: %d tries, %v; want 1 try and the last error", n, err)
	}
}
