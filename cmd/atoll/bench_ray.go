package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/atoll-run/atoll/sdk"
	"github.com/atoll-run/atoll/sdk/local"
)

// `atoll bench ray` is Ray's release microbenchmark (python/ray/_private/ray_perf.py, the
// script behind `ray microbenchmark`) with the same names and the same workloads, written
// as a user's program would write it: through package sdk alone (and sdk/local for the
// embedded default). Each row is timed as Ray's timeit times it (a warm-up, then rounds
// of a fixed length, each counting whole operations times the row's multiplier), with
// shorter rounds so that the whole run takes about a minute.

// rayRelease is the Ray release whose published microbenchmark figures the rows carry, and
// the machine its release tests ran on (release/microbenchmark/tpl_64.yaml).
const (
	rayRelease = "2.22.0"
	rayMachine = "AWS m5.16xlarge (64 vCPU, 256 GiB), one node"
	raySource  = "github.com/ray-project/ray release/release_logs/2.22.0/microbenchmark.json"
)

// rayPublished is Ray 2.22.0's release microbenchmark, per row name (the mean of its
// timeit rounds, in the row's unit). Every row of ours has one.
var rayPublished = map[string]float64{
	"single_client_tasks_sync":       971.317197225919,
	"single_client_tasks_async":      8194.32696391844,
	"multi_client_tasks_async":       21743.557366389494,
	"1_1_actor_calls_sync":           2096.4576697416196,
	"1_1_actor_calls_async":          9062.792852859755,
	"1_n_actor_calls_async":          8606.08018065877,
	"n_n_actor_calls_async":          27688.27595653398,
	"single_client_put_calls":        5196.004383289357,  // "single_client_put_calls_Plasma_Store"
	"single_client_get_calls":        10269.932297010477, // "single_client_get_calls_Plasma_Store"
	"single_client_put_gigabytes":    20.09665460590859,
	"single_client_wait_1k_refs":     5.012190250895254,
	"placement_group_create_removal": 838.5131869401664, // "placement_group_create/removal"
}

// rayClusterTargets are issue 23's targets on a cluster of processes (3 heads, 4 agents,
// mutual TLS); the other rows have none there.
var rayClusterTargets = map[string]float64{
	"single_client_tasks_async":      5000,
	"single_client_tasks_sync":       1000,
	"1_1_actor_calls_async":          5000,
	"single_client_put_calls":        5000,
	"placement_group_create_removal": 500,
}

// The benchmark's program: Ray's small_value task and its Actor and Client classes.
type (
	// rayNone is a call or a task without arguments (Ray's small_value()).
	rayNone struct{}
	// raySmallValue asks an actor for b"ok" (Actor.small_value).
	raySmallValue struct{}
	// rayBatch asks an actor to run N small_value tasks (Actor.small_value_batch), or a
	// client to call each of its servers N times (Client.small_value_batch).
	rayBatch struct{ N int }
	// rayWork is the n:n row's task: N calls spread over Actors.
	rayWork struct {
		Actors []sdk.ActorRef
		N      int
	}
	// rayClientArgs are a Client's servers.
	rayClientArgs struct{ Servers []sdk.ActorRef }

	rayActor  struct{}
	rayClient struct{ servers []sdk.ActorRef }
)

var (
	raySmallValueTask = sdk.Task("ray.small_value", func(*sdk.Context, rayNone) ([]byte, error) { return []byte("ok"), nil })
	rayWorkTask       = sdk.Task("ray.work", func(ctx *sdk.Context, w rayWork) (int, error) {
		fs := make([]*sdk.Future[[]byte], w.N)
		for i := range fs {
			fs[i] = sdk.CallAsync[[]byte](ctx, ctx, w.Actors[i%len(w.Actors)], raySmallValue{})
		}
		return 0, awaitAll(ctx, fs)
	})
)

func (rayActor) Receive(ctx *sdk.Context, msg any) (any, error) {
	switch m := msg.(type) {
	case raySmallValue:
		return []byte("ok"), nil
	case rayBatch:
		fs := make([]*sdk.Future[[]byte], m.N)
		for i := range fs {
			fs[i] = raySmallValueTask.Remote(ctx, ctx.Job(), rayNone{})
		}
		return nil, awaitAll(ctx, fs)
	}
	return nil, fmt.Errorf("ray actor: %T", msg)
}

func (c rayClient) Receive(ctx *sdk.Context, msg any) (any, error) {
	m, ok := msg.(rayBatch)
	if !ok {
		return nil, fmt.Errorf("ray client: %T", msg)
	}
	var fs []*sdk.Future[[]byte]
	for _, s := range c.servers {
		for range m.N {
			fs = append(fs, sdk.CallAsync[[]byte](ctx, ctx, s, raySmallValue{}))
		}
	}
	return nil, awaitAll(ctx, fs)
}

func awaitAll[T any](ctx context.Context, fs []*sdk.Future[T]) error {
	for _, f := range fs {
		if _, err := f.Await(ctx); err != nil {
			return err
		}
	}
	return nil
}

func rayKinds() []sdk.Option {
	return []sdk.Option{
		sdk.Tasks(raySmallValueTask, rayWorkTask),
		sdk.Kind("ray-actor", func() sdk.Actor { return rayActor{} }, raySmallValue{}, rayBatch{}),
		sdk.KindOf("ray-client", func(a rayClientArgs) sdk.Actor { return rayClient{servers: a.Servers} }, rayBatch{}),
		sdk.Kind("ray-pg", func() sdk.Actor { return rayActor{} }),
	}
}

// rayTiming is how long timeit runs a row: Ray's is 1 s of warm-up and 4 rounds of 2 s.
type rayTiming struct {
	Warmup, Round time.Duration
	Rounds        int
}

// rayRow is one row's result.
type rayRow struct {
	Name         string   `json:"name"`
	Unit         string   `json:"unit"`
	Atoll        float64  `json:"atoll"`
	AtollSD      float64  `json:"atoll_sd"`
	Ops          int      `json:"ops"`
	Ray          *float64 `json:"ray"`
	RayNote      string   `json:"ray_note,omitempty"`
	Ratio        *float64 `json:"ratio"`
	Target       *float64 `json:"target"`
	Met          *bool    `json:"met"`
	Workload     string   `json:"workload"`
	Error        string   `json:"error,omitempty"`
	SecondsSpent float64  `json:"seconds"`
}

// timeit runs op as Ray's timeit does (a warm-up, then rounds counting whole operations,
// at least one each) and returns the mean and standard deviation of mult*ops/s over the
// rounds.
func timeit(ctx context.Context, t rayTiming, mult float64, op func(context.Context) error) (mean, sd float64, ops int, err error) {
	start := time.Now()
	for first := true; first || time.Since(start) < t.Warmup; first = false {
		if err := op(ctx); err != nil {
			return 0, 0, 0, err
		}
	}
	stats := make([]float64, 0, t.Rounds)
	for range t.Rounds {
		start, n := time.Now(), 0
		for n == 0 || time.Since(start) < t.Round {
			if err := op(ctx); err != nil {
				return 0, 0, 0, err
			}
			n++
		}
		ops += n
		stats = append(stats, mult*float64(n)/time.Since(start).Seconds())
	}
	for _, s := range stats {
		mean += s
	}
	mean /= float64(len(stats))
	for _, s := range stats {
		sd += (s - mean) * (s - mean)
	}
	return mean, math.Sqrt(sd / float64(len(stats))), ops, nil
}

// rayBench is one run of the rows on a cluster.
type rayBench struct {
	c      *sdk.Cluster
	job    *sdk.Job
	timing rayTiming
	nCPU   int // Ray's multiprocessing.cpu_count() // 2
	seq    int
}

func (b *rayBench) name(prefix string) string {
	b.seq++
	return fmt.Sprintf("%s-%d", prefix, b.seq)
}

func (b *rayBench) actors(ctx context.Context, n int) ([]sdk.ActorRef, error) {
	out := make([]sdk.ActorRef, n)
	for i := range out {
		a, err := b.job.SpawnActor(ctx, sdk.ActorSpec{Name: b.name("actor"), Kind: "ray-actor"})
		if err != nil {
			return nil, err
		}
		out[i] = a
	}
	return out, nil
}

// rayCase is a row: its workload (set up once, then the op that timeit repeats).
type rayCase struct {
	name, unit, workload string
	setup                func(ctx context.Context, b *rayBench) (op func(context.Context) error, mult float64, err error)
}

func rayCases() []rayCase {
	ok := func(ctx context.Context, f *sdk.Future[[]byte]) error {
		v, err := f.Await(ctx)
		if err == nil && string(v) != "ok" {
			err = fmt.Errorf("small_value returned %q", v)
		}
		return err
	}
	tasks := func(ctx context.Context, b *rayBench, n int) []*sdk.Future[[]byte] {
		fs := make([]*sdk.Future[[]byte], n)
		for i := range fs {
			fs[i] = raySmallValueTask.Remote(ctx, b.job, rayNone{})
		}
		return fs
	}
	calls := func(ctx context.Context, c sdk.Caller, a sdk.ActorRef, n int) []*sdk.Future[[]byte] {
		fs := make([]*sdk.Future[[]byte], n)
		for i := range fs {
			fs[i] = sdk.CallAsync[[]byte](ctx, c, a, raySmallValue{})
		}
		return fs
	}
	return []rayCase{
		{"single_client_put_calls", "puts/s", "sdk.Put of the int 0, one at a time, dropped after (ray.put(0): Ray frees it when its ref goes)",
			func(ctx context.Context, b *rayBench) (func(context.Context) error, float64, error) {
				return func(ctx context.Context) error {
					ref, err := sdk.Put(ctx, b.c, 0)
					if err != nil {
						return err
					}
					return sdk.Free(ctx, b.c, ref)
				}, 1, nil
			}},
		{"single_client_get_calls", "gets/s", "sdk.Get of one object holding the int 0 (ray.get(value))",
			func(ctx context.Context, b *rayBench) (func(context.Context) error, float64, error) {
				ref, err := sdk.Put(ctx, b.c, 0)
				if err != nil {
					return nil, 0, err
				}
				return func(ctx context.Context) error {
					v, err := sdk.Get(ctx, b.c, ref)
					if err == nil && v != 0 {
						err = fmt.Errorf("got %d", v)
					}
					return err
				}, 1, nil
			}},
		{"single_client_put_gigabytes", "GB/s", "sdk.Put of 800 MB of zeros ([]byte: Ray's np.zeros(100Mi, int64)), dropped after (Ray frees it when its ref goes)",
			func(ctx context.Context, b *rayBench) (func(context.Context) error, float64, error) {
				arr := make([]byte, 800<<20)
				return func(ctx context.Context) error {
					ref, err := sdk.Put(ctx, b.c, arr)
					if err != nil {
						return err
					}
					return sdk.Free(ctx, b.c, ref)
				}, 8 * 0.1, nil
			}},
		{"single_client_tasks_sync", "tasks/s", "one small_value task (returns b\"ok\", one CPU) submitted and awaited at a time",
			func(ctx context.Context, b *rayBench) (func(context.Context) error, float64, error) {
				return func(ctx context.Context) error { return ok(ctx, raySmallValueTask.Remote(ctx, b.job, rayNone{})) }, 1, nil
			}},
		{"single_client_tasks_async", "tasks/s", "1,000 small_value tasks submitted, then all awaited",
			func(ctx context.Context, b *rayBench) (func(context.Context) error, float64, error) {
				return func(ctx context.Context) error {
					for _, f := range tasks(ctx, b, 1000) {
						if err := ok(ctx, f); err != nil {
							return err
						}
					}
					return nil
				}, 1000, nil
			}},
		{"multi_client_tasks_async", "tasks/s", "4 actors (no resources) each submit 10,000 small_value tasks and await them",
			func(ctx context.Context, b *rayBench) (func(context.Context) error, float64, error) {
				const n, m = 10000, 4
				as, err := b.actors(ctx, m)
				if err != nil {
					return nil, 0, err
				}
				return func(ctx context.Context) error {
					fs := make([]*sdk.Future[any], m)
					for i, a := range as {
						fs[i] = sdk.CallAsync[any](ctx, b.c, a, rayBatch{N: n})
					}
					return awaitAll(ctx, fs)
				}, n * m, nil
			}},
		{"1_1_actor_calls_sync", "calls/s", "one call to an actor (no resources) at a time, answered b\"ok\"",
			func(ctx context.Context, b *rayBench) (func(context.Context) error, float64, error) {
				as, err := b.actors(ctx, 1)
				if err != nil {
					return nil, 0, err
				}
				return func(ctx context.Context) error {
					return ok(ctx, sdk.CallAsync[[]byte](ctx, b.c, as[0], raySmallValue{}))
				}, 1, nil
			}},
		{"1_1_actor_calls_async", "calls/s", "1,000 calls to one actor sent, then all awaited",
			func(ctx context.Context, b *rayBench) (func(context.Context) error, float64, error) {
				as, err := b.actors(ctx, 1)
				if err != nil {
					return nil, 0, err
				}
				return func(ctx context.Context) error {
					for _, f := range calls(ctx, b.c, as[0], 1000) {
						if err := ok(ctx, f); err != nil {
							return err
						}
					}
					return nil
				}, 1000, nil
			}},
		{"1_n_actor_calls_async", "calls/s", "a client actor calls each of cpu_count/2 actors 5,000 times, then awaits them",
			func(ctx context.Context, b *rayBench) (func(context.Context) error, float64, error) {
				const n = 5000
				as, err := b.actors(ctx, b.nCPU)
				if err != nil {
					return nil, 0, err
				}
				client, err := b.job.SpawnActor(ctx, sdk.ActorSpec{Name: b.name("client"), Kind: "ray-client", Args: rayClientArgs{Servers: as}})
				if err != nil {
					return nil, 0, err
				}
				return func(ctx context.Context) error {
					_, err := sdk.Call[any](ctx, b.c, client, rayBatch{N: n})
					return err
				}, float64(n * len(as)), nil
			}},
		{"n_n_actor_calls_async", "calls/s", "4 tasks each make 5,000 calls spread over cpu_count/2 actors, then await them",
			func(ctx context.Context, b *rayBench) (func(context.Context) error, float64, error) {
				const n, m = 5000, 4
				as, err := b.actors(ctx, b.nCPU)
				if err != nil {
					return nil, 0, err
				}
				return func(ctx context.Context) error {
					fs := make([]*sdk.Future[int], m)
					for i := range fs {
						fs[i] = rayWorkTask.Remote(ctx, b.job, rayWork{Actors: as, N: n})
					}
					return awaitAll(ctx, fs)
				}, n * m, nil
			}},
		{"single_client_wait_1k_refs", "ops/s", "1,000 small_value tasks submitted, then sdk.Wait for one of the pending 1,000 times",
			func(ctx context.Context, b *rayBench) (func(context.Context) error, float64, error) {
				return func(ctx context.Context) error {
					fs := tasks(ctx, b, 1000)
					for len(fs) > 0 {
						ready, pending, err := sdk.Wait(ctx, fs, 1)
						if err != nil {
							return err
						}
						if len(ready) != 1 {
							return fmt.Errorf("wait returned %d ready, want 1", len(ready))
						}
						rest := make([]*sdk.Future[[]byte], 0, len(pending))
						for _, i := range pending {
							rest = append(rest, fs[i])
						}
						fs = rest
					}
					return nil
				}, 1, nil
			}},
		{"placement_group_create_removal", "gangs/s", "gangs of one worker on one GPU: min(100, free GPUs) spawned at once, awaited running, then stopped one by one",
			func(ctx context.Context, b *rayBench) (func(context.Context) error, float64, error) {
				st, err := b.c.Status(ctx)
				if err != nil {
					return nil, 0, err
				}
				free := 0
				for _, m := range st.Machines {
					if m.Alive {
						free += m.FreeGPUs
					}
				}
				num := min(100, free)
				if num == 0 {
					return nil, 0, errors.New("no free GPU")
				}
				return func(ctx context.Context) error {
					gs := make([]*sdk.Gang, num)
					errs := make([]error, num)
					var wg sync.WaitGroup
					for i := range gs {
						name := b.name("pg")
						wg.Add(1)
						go func() {
							defer wg.Done()
							gs[i], errs[i] = b.job.SpawnGang(ctx, sdk.GangSpec{Name: name, Kind: "ray-pg", Workers: 1, GPUsPerWorker: 1})
						}()
					}
					wg.Wait()
					for i, g := range gs {
						if g == nil {
							continue
						}
						if err := g.Stop(ctx); err != nil && errs[i] == nil {
							errs[i] = err
						}
					}
					return errors.Join(errs...)
				}, float64(num), nil
			}},
	}
}

// runRayBench runs the rows (those whose name contains only, when given) on c.
func runRayBench(ctx context.Context, c *sdk.Cluster, timing rayTiming, only string, cluster bool, progress func(rayRow)) ([]rayRow, error) {
	// Ray's calls and gets wait as long as they take; the SDK's calls default to a 30 s
	// deadline, which a row of 40,000 tasks in one call may pass on a slow cluster.
	ctx, cancel := context.WithTimeout(ctx, 30*time.Minute)
	defer cancel()
	job, err := c.Submit(ctx, sdk.JobSpec{Name: fmt.Sprintf("bench-ray-%d", time.Now().UnixNano()%1e6)})
	if err != nil {
		return nil, err
	}
	defer func() { _ = job.Stop(context.Background()) }()
	b := &rayBench{c: c, job: job, timing: timing, nCPU: max(1, runtime.NumCPU()/2)}
	var rows []rayRow
	for _, rc := range rayCases() {
		if only != "" && !slices.ContainsFunc(strings.Split(only, ","), func(o string) bool { return strings.Contains(rc.name, o) }) {
			continue
		}
		start := time.Now()
		row := rayRow{Name: rc.name, Unit: rc.unit, Workload: rc.workload}
		if v, ok := rayPublished[rc.name]; ok {
			row.Ray = &v
		} else {
			row.RayNote = "no published figure found"
		}
		target := row.Ray
		if cluster {
			target = nil
			if v, ok := rayClusterTargets[rc.name]; ok {
				target = &v
			}
		}
		row.Target = target
		op, mult, err := rc.setup(ctx, b)
		if err == nil {
			row.Atoll, row.AtollSD, row.Ops, err = timeit(ctx, timing, mult, op)
		}
		if err != nil {
			row.Error = err.Error()
		} else {
			if row.Ray != nil {
				r := row.Atoll / *row.Ray
				row.Ratio = &r
			}
			if target != nil {
				met := row.Atoll >= *target
				row.Met = &met
			}
		}
		row.SecondsSpent = time.Since(start).Seconds()
		rows = append(rows, row)
		if progress != nil {
			progress(row)
		}
		if ctx.Err() != nil {
			return rows, ctx.Err()
		}
	}
	return rows, nil
}

func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:min(3, len(f))], " ")
}

func newBenchRayCmd() *cobra.Command {
	var dir, only, cpuProfile, memProfile string
	var timing rayTiming
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "ray",
		Short: "Ray's release microbenchmark (ray_perf.py: same names, same workloads) through the SDK, beside Ray 2.22's published figures",
		Long: `ray runs Ray's release microbenchmark (python/ray/_private/ray_perf.py) through package sdk, as
a user's program would: tasks, actor calls, puts, gets, waits and gangs of one GPU. Each row is
in operations per second (single_client_put_gigabytes in GB/s), timed as Ray's timeit times it
with shorter rounds, beside Ray 2.22.0's published figure (an m5.16xlarge, 64 vCPUs) and the
ratio. On the embedded default (the default) the target of every row is Ray's figure; with
--dir it runs against that cluster of processes, with issue 23's targets for five rows.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if sdk.InWorker() { // an agent started this binary as one of the benchmark's workers
				os.Exit(sdk.WorkerMain(rayKinds()...))
			}
			if timing.Rounds < 1 || timing.Round <= 0 || timing.Warmup < 0 {
				return fmt.Errorf("bench ray: --rounds %d (>= 1), --round %v (> 0), --warmup %v (>= 0)", timing.Rounds, timing.Round, timing.Warmup)
			}
			ctx := cmd.Context()
			opts := rayKinds()
			cluster := dir != ""
			if cluster {
				addr, _, err := clusterAddress(dir, "")
				if err != nil {
					return fmt.Errorf("bench ray: %w", err)
				}
				opts = append(opts, sdk.WithAddress(addr))
			}
			started := time.Now().UTC()
			load0 := loadAverage()
			c, err := local.Start(ctx, opts...)
			if err != nil {
				return fmt.Errorf("bench ray: %w", err)
			}
			defer func() { _ = c.Shutdown(context.Background()) }()
			if cpuProfile != "" {
				f, err := os.Create(cpuProfile)
				if err != nil {
					return fmt.Errorf("bench ray: %w", err)
				}
				defer f.Close()
				if err := pprof.StartCPUProfile(f); err != nil {
					return fmt.Errorf("bench ray: %w", err)
				}
				defer pprof.StopCPUProfile()
			}
			progress := func(r rayRow) {
				if r.Error != "" {
					fmt.Fprintf(cmd.ErrOrStderr(), "%-32s error: %s\n", r.Name, r.Error)
					return
				}
				ratio := "-"
				if r.Ratio != nil {
					ratio = fmt.Sprintf("%.2f", *r.Ratio)
				}
				ray := "-"
				if r.Ray != nil {
					ray = fmt.Sprintf("%.1f", *r.Ray)
				}
				w := cmd.ErrOrStderr()
				if !asJSON {
					w = cmd.OutOrStdout()
				}
				fmt.Fprintf(w, "%-32s %12.1f ± %-9.1f %-8s Ray %10s  ratio %s\n", r.Name, r.Atoll, r.AtollSD, r.Unit, ray, ratio)
			}
			rows, err := runRayBench(ctx, c, timing, only, cluster, progress)
			if memProfile != "" {
				if perr := writeHeapProfile(memProfile); perr != nil {
					return fmt.Errorf("bench ray: %w", perr)
				}
			}
			if err != nil {
				return fmt.Errorf("bench ray: %w", err)
			}
			mode := "embedded"
			if cluster {
				mode = "cluster"
			}
			var failed, met, missed []string
			for _, r := range rows {
				switch {
				case r.Error != "":
					failed = append(failed, r.Name)
				case r.Met != nil && *r.Met:
					met = append(met, r.Name)
				case r.Met != nil:
					missed = append(missed, r.Name)
				}
			}
			out := map[string]any{
				"date": started.Format(time.RFC3339), "mode": mode, "dir": dir, "cpus": runtime.NumCPU(),
				"load_average_before": load0, "load_average_after": loadAverage(),
				"timing": map[string]any{"warmup_s": timing.Warmup.Seconds(), "round_s": timing.Round.Seconds(), "rounds": timing.Rounds,
					"ray_timing": "warm-up 1 s, 4 rounds of 2 s"},
				"ray":  map[string]any{"version": rayRelease, "machine": rayMachine, "source": raySource},
				"rows": rows, "met": met, "missed": missed, "failed": failed,
			}
			for _, r := range rows {
				if r.Name == "single_client_tasks_sync" && r.Atoll > 0 {
					out["warm_task_round_trip_ms"] = 1e3 / r.Atoll
					out["warm_task_round_trip_target_ms"] = 1.0
				}
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(out)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s, %d CPUs, load %s -> %s; targets met %d, missed %d, failed %d\n", mode, runtime.NumCPU(),
				load0, out["load_average_after"], len(met), len(missed), len(failed))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "dir", "", "run against the cluster in `DIR`, as atoll up --dir DIR started it (default: the embedded default)")
	f.StringVar(&only, "only", "", "run only the rows whose name contains this (Ray's TESTS_TO_RUN), or one of these, comma-separated")
	f.DurationVar(&timing.Warmup, "warmup", 500*time.Millisecond, "warm-up of each row (at least one operation)")
	f.DurationVar(&timing.Round, "round", time.Second, "length of each measured round (at least one operation)")
	f.IntVar(&timing.Rounds, "rounds", 3, "measured rounds per row")
	f.StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of the rows (this process: the driver, and on the embedded default the whole cluster) to `FILE`")
	f.StringVar(&memProfile, "memprofile", "", "write a heap profile of this process after the rows (on the embedded default the whole cluster's) to `FILE`")
	f.BoolVar(&asJSON, "json", false, "print one JSON object")
	return cmd
}

// writeHeapProfile writes the heap's live objects (after a collection) to path.
func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	runtime.GC()
	if err := pprof.WriteHeapProfile(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
