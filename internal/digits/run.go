package digits

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/atoll-run/atoll/sdk"
	"github.com/atoll-run/atoll/sdk/local"
	"github.com/atoll-run/atoll/topology"
)

// Options configure a training run. DefaultOptions is what `atoll demo` runs.
type Options struct {
	// Steps of synchronous data-parallel SGD.
	Steps int
	// Workers in the gang (one GPU each, all inside one NVLink island).
	Workers int
	// Hidden is the MLP's hidden width.
	Hidden int
	// Batch is the per-worker minibatch.
	Batch int
	// LR and Momentum of SGD.
	LR, Momentum float32
	// CheckpointEvery steps the gang checkpoints.
	CheckpointEvery int
	// KillAtStep crashes one worker before that step (negative: never).
	KillAtStep int
	// KillRank is the worker crashed.
	KillRank int
	// Seed drives the data split, the weights and the minibatches.
	Seed uint64
	// Progress, if set, receives a live progress line and the placement.
	Progress io.Writer
	// Logger receives the cluster's logs.
	Logger *zap.Logger
	// ClusterOptions configure the cluster: the embedded default's machines, or the address
	// of a running cluster (sdk.WithAddress; ATOLL_ADDRESS does the same).
	ClusterOptions []sdk.Option
	// MaxFailedSteps bounds the steps in a row that may fail (each then waits for the gang
	// to recover) before the run gives up with the last error.
	MaxFailedSteps int
	// Hooks let the caller follow the run (the CLI's dashboard and progress reports).
	Hooks Hooks
}

// Hooks are called as a run goes; each is optional and must not block for long (but
// Finished, which may keep the cluster up as long as it likes).
type Hooks struct {
	// Started: the gang is placed (job "digits", gang "dp").
	Started func(ctx context.Context, c *sdk.Cluster, job string, gang *sdk.Gang)
	// Step: a training step completed with this mean minibatch loss.
	Step func(step int64, loss float64)
	// Finished: training is over; the cluster is still up until it returns.
	Finished func(ctx context.Context)
}

// DefaultOptions: 8 workers, 300 steps, a crash at step 130 (checkpoints every 25 steps).
func DefaultOptions() Options {
	return Options{Steps: 300, Workers: 8, Hidden: 32, Batch: 32, LR: 0.1, Momentum: 0.9,
		CheckpointEvery: 25, KillAtStep: 130, KillRank: 3, Seed: 1, MaxFailedSteps: 20}
}

// Result is the summary of a run; its JSON is `atoll demo --json`'s output.
type Result struct {
	GPUsTotal     int  `json:"gpus_total"`
	Machines      int  `json:"machines"`
	SimulatedGPUs bool `json:"simulated_gpus"`
	GangSize      int  `json:"gang_size"`
	IslandsUsed   int  `json:"islands_used"`
	// Islands lists the gang's GPUs (global ids) grouped by NVLink island.
	Islands         [][]int   `json:"islands"`
	Placement       []Placed  `json:"placement"`
	Placer          string    `json:"placer"`
	Scores          ScoreList `json:"scores,omitempty"`
	InitialLoss     float64   `json:"initial_loss"`
	FinalLoss       float64   `json:"final_loss"`
	TestLoss        float64   `json:"test_loss"`
	Accuracy        float64   `json:"accuracy"`
	Restarts        int       `json:"restarts"`
	RestoredStep    int64     `json:"restored_from_step"`
	StepsReplayed   int64     `json:"steps_replayed"`
	Steps           int       `json:"steps"`
	Checkpoints     int       `json:"checkpoints"`
	SamplesPerSec   float64   `json:"samples_per_s"`
	WallSeconds     float64   `json:"wall_s"`
	TrainExamples   int       `json:"train_examples"`
	TestExamples    int       `json:"test_examples"`
	ModelParameters int       `json:"model_parameters"`
	// WorkerPIDs are the worker processes' ids by rank (the driver's own in the embedded
	// default, whose workers live in its process); MachinesUsed the machines of the gang.
	WorkerPIDs   []int    `json:"worker_pids"`
	MachinesUsed []string `json:"machines_used"`
	// Embedded says the run used the embedded default (no address).
	Embedded bool `json:"embedded"`

	where                      string
	islandCount, largestIsland int
}

// Placed is where one worker runs.
type Placed struct {
	Rank    int    `json:"rank"`
	Machine string `json:"machine"`
	GPUs    []int  `json:"gpus"`
	Island  []int  `json:"island"`
}

// ScoreList is a placement's scores, sorted by name.
type ScoreList []Score

// Score is one named placement score.
type Score struct {
	Name  string  `json:"name"`
	Value float64 `json:"value"`
}

// Kinds are this program's actor kinds: a worker process (started by an agent, running
// this same program) must register them exactly as the driver does.
func Kinds() []sdk.Option {
	return []sdk.Option{sdk.KindOf("digits-worker", newWorker, stepMsg{}, stateReq{}, evalReq{})}
}

// Run starts (or connects to) a cluster, trains the MLP on the digits data with a gang of
// workers inside one NVLink island, crashes one worker part-way (the gang restarts from its
// newest checkpoint), and returns the summary.
func Run(ctx context.Context, o Options) (Result, error) {
	start := time.Now()
	if o.Workers <= 0 || o.Steps <= 0 || o.Batch <= 0 || o.Hidden <= 0 || o.CheckpointEvery <= 0 {
		return Result{}, fmt.Errorf("digits: workers %d, steps %d, batch %d, hidden %d, checkpoint every %d: all must be positive",
			o.Workers, o.Steps, o.Batch, o.Hidden, o.CheckpointEvery)
	}
	if o.KillAtStep >= 0 && (o.KillRank < 0 || o.KillRank >= o.Workers) {
		return Result{}, fmt.Errorf("digits: kill rank %d is not a rank of a gang of %d workers", o.KillRank, o.Workers)
	}
	if o.MaxFailedSteps <= 0 {
		o.MaxFailedSteps = 20
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	progress := o.Progress
	if progress == nil {
		progress = io.Discard
	}
	c, err := local.Start(ctx, append(append([]sdk.Option{sdk.WithLogger(o.Logger)}, Kinds()...), o.ClusterOptions...)...)
	if err != nil {
		return Result{}, err
	}
	defer func() { _ = c.Shutdown(context.WithoutCancel(ctx)) }()
	train, test, err := Load(o.Seed, 0.2)
	if err != nil {
		return Result{}, err
	}
	sets, err := sdk.Put(ctx, c, [2]Dataset{train, test})
	if err != nil {
		return Result{}, err
	}
	job, err := c.Submit(ctx, sdk.JobSpec{Name: "digits"})
	if err != nil {
		return Result{}, err
	}
	defer func() { _ = job.Stop(context.WithoutCancel(ctx)) }()
	args := workerArgs{Data: sets, Hidden: o.Hidden, Batch: o.Batch, LR: o.LR, Momentum: o.Momentum, Seed: o.Seed}
	gang, err := job.SpawnGang(ctx, sdk.GangSpec{Name: "dp", Kind: "digits-worker", Args: args, Workers: o.Workers, GPUsPerWorker: 1,
		SameIsland: o.Workers <= 8, MaxRestarts: 3, Backoff: 20 * time.Millisecond, AllReduceBytes: int64(4 * NumParams(o.Hidden))})
	if err != nil {
		return Result{}, err
	}
	res, err := describe(ctx, c, gang)
	if err != nil {
		return res, err
	}
	res.Steps, res.TrainExamples, res.TestExamples, res.ModelParameters = o.Steps, train.Len(), test.Len(), NumParams(o.Hidden)
	printPlacement(progress, res)
	if o.Hooks.Started != nil {
		o.Hooks.Started(ctx, c, job.Name(), gang)
	}

	first, err := sdk.Call[evalReply](ctx, c, gang.Worker(0), evalReq{})
	if err != nil {
		return res, err
	}
	res.InitialLoss = first.TrainLoss

	live := newProgressLine(progress, o.Steps)
	var step int64
	var samples, failed int
	trainStart := time.Now()
	for step < int64(o.Steps) {
		if int(step) == o.KillAtStep && res.Restarts == 0 {
			recovered, err := crashAndRecover(ctx, c, gang, o.KillRank, live)
			if err != nil {
				return res, err
			}
			res.RestoredStep, res.StepsReplayed = recovered, step-recovered
			step = recovered
			res.Restarts = gang.Restarts()
			continue
		}
		loss, n, err := trainStep(ctx, c, gang, step)
		if err != nil {
			failed++
			if failed > o.MaxFailedSteps {
				return res, fmt.Errorf("digits: %d steps in a row failed; the last at step %d: %w", failed, step, err)
			}
			recovered, rerr := resync(ctx, c, gang)
			if rerr != nil {
				return res, fmt.Errorf("digits: step %d failed (%v) and the gang did not recover: %w", step, err, rerr)
			}
			step = recovered
			continue
		}
		failed = 0
		step++
		samples += n
		if step%int64(o.CheckpointEvery) == 0 {
			if err := gang.Checkpoint(ctx, step); err != nil {
				// A machine lost while its workers saved: the last complete checkpoint
				// stands, and the gang (restarting) resumes from it.
				failed++
				if failed > o.MaxFailedSteps {
					return res, fmt.Errorf("digits: checkpoint at step %d: %w", step, err)
				}
				live.note(fmt.Sprintf("checkpoint at step %d failed (%v); going on from the last complete one", step, err))
				recovered, rerr := resync(ctx, c, gang)
				if rerr != nil {
					return res, fmt.Errorf("digits: checkpoint at step %d failed (%v) and the gang did not recover: %w", step, err, rerr)
				}
				step = recovered
				continue
			}
			res.Checkpoints++
		}
		live.update(step, loss, float64(samples)/time.Since(trainStart).Seconds(), gang.Restarts())
		if o.Hooks.Step != nil {
			o.Hooks.Step(step, loss)
		}
	}
	live.done()
	last, err := sdk.Call[evalReply](ctx, c, gang.Worker(0), evalReq{})
	if err != nil {
		return res, err
	}
	res.FinalLoss, res.TestLoss, res.Accuracy = last.TrainLoss, last.TestLoss, last.TestAccuracy
	res.Restarts = gang.Restarts()
	res.SamplesPerSec = float64(samples) / time.Since(trainStart).Seconds()
	res.WallSeconds = time.Since(start).Seconds()
	for _, w := range gang.Workers() {
		res.WorkerPIDs = append(res.WorkerPIDs, w.PID)
	}
	if o.Hooks.Finished != nil {
		o.Hooks.Finished(ctx)
	}
	return res, nil
}

// trainStep runs one synchronous step on every worker and returns the mean minibatch loss.
func trainStep(ctx context.Context, c *sdk.Cluster, g *sdk.Gang, step int64) (float64, int, error) {
	gen := g.Generation()
	fs := make([]*sdk.Future[stepResult], g.Size())
	for r := range fs {
		fs[r] = sdk.CallAsync[stepResult](ctx, c, g.Worker(r), stepMsg{Gen: gen, Step: step})
	}
	var loss float64
	var n int
	var errs []error
	for r, f := range fs {
		sr, err := f.Await(ctx)
		if err != nil {
			errs = append(errs, fmt.Errorf("rank %d: %w", r, err))
			continue
		}
		loss += sr.Loss
		n += sr.Count
	}
	if err := errors.Join(errs...); err != nil {
		return 0, 0, err
	}
	return loss / float64(n), n, nil
}

// crashAndRecover kills one worker, waits for the gang's all-for-one restart, and returns the
// step every worker was restored to.
func crashAndRecover(ctx context.Context, c *sdk.Cluster, g *sdk.Gang, rank int, live *progressLine) (int64, error) {
	gen := g.Generation()
	live.note(fmt.Sprintf("killing worker %d (injected crash) — the gang restarts all-for-one from its newest checkpoint", rank))
	if err := g.Kill(ctx, rank); err != nil {
		return 0, err
	}
	if _, err := g.AwaitRunning(ctx, gen+1); err != nil {
		return 0, err
	}
	step, err := resync(ctx, c, g)
	if err == nil {
		live.note(fmt.Sprintf("gang restarted (restart %d): every worker restored from the checkpoint at step %d", g.Restarts(), step))
	}
	return step, err
}

// resyncWait bounds how long resync waits for the workers of a gang to agree again. After a
// lost machine the runtime must first notice the loss (gossip: seconds on a quiet host,
// more on a loaded one) before it restarts the gang; until then the workers left answer,
// and disagree with the dead ones.
const resyncWait = time.Minute

// resync waits for the gang to run and returns the step all its workers agree on.
func resync(ctx context.Context, c *sdk.Cluster, g *sdk.Gang) (int64, error) {
	deadline := time.Now().Add(resyncWait)
	for wait := 20 * time.Millisecond; time.Now().Before(deadline); wait = min(2*wait, 500*time.Millisecond) {
		if err := g.Err(); err != nil {
			return 0, err
		}
		gen, err := g.AwaitRunning(ctx, g.Generation())
		if err != nil {
			return 0, err
		}
		steps := map[int64]bool{}
		ok := true
		for r := 0; r < g.Size(); r++ {
			s, err := sdk.Call[int64](ctx, c, g.Worker(r), stateReq{})
			if err != nil {
				ok = false
				break
			}
			steps[s] = true
		}
		if ok && len(steps) == 1 && gen == g.Generation() {
			for s := range steps {
				return s, nil
			}
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	return 0, fmt.Errorf("digits: workers of gang %q do not agree on a step after %v", g.Name(), resyncWait)
}

func describe(ctx context.Context, c *sdk.Cluster, g *sdk.Gang) (Result, error) {
	topo, err := c.Topology(ctx)
	if err != nil {
		return Result{}, err
	}
	p := g.Placement()
	res := Result{GPUsTotal: topo.NumGPUs(), Machines: len(topo.Machines), GangSize: g.Size(), IslandsUsed: p.Islands,
		Placer: "gang", MachinesUsed: p.Machines, Embedded: c.Embedded()}
	for _, m := range topo.Machines {
		res.SimulatedGPUs = res.SimulatedGPUs || m.Simulated
	}
	byName := map[string]*topology.Machine{}
	for _, m := range topo.Machines {
		byName[m.Name] = m
	}
	byIsland := map[int][]int{}
	var islands []int
	var gpus []int
	for r, m := range p.Members {
		tm := byName[m.Machine]
		var global []int
		for _, gi := range m.GPUs {
			if tm != nil && gi < len(tm.GPUs) {
				id := tm.GPUs[gi].ID
				global = append(global, id)
				is := topo.IslandOf(id)
				if _, ok := byIsland[is]; !ok {
					islands = append(islands, is)
				}
				byIsland[is] = append(byIsland[is], id)
			}
		}
		gpus = append(gpus, global...)
		res.Placement = append(res.Placement, Placed{Rank: r, Machine: m.Machine, GPUs: global, Island: m.Islands})
	}
	for _, is := range islands {
		res.Islands = append(res.Islands, byIsland[is])
	}
	res.IslandsUsed = len(islands)
	res.where = topo.DescribePlacement(gpus)
	res.islandCount, res.largestIsland = len(topo.Islands()), 0
	for _, is := range topo.Islands() {
		res.largestIsland = max(res.largestIsland, len(is))
	}
	for k, v := range p.Scores {
		res.Scores = append(res.Scores, Score{Name: k, Value: v})
	}
	sort.Slice(res.Scores, func(i, j int) bool { return res.Scores[i].Name < res.Scores[j].Name })
	return res, nil
}

func printPlacement(w io.Writer, r Result) {
	kind := "real"
	if r.SimulatedGPUs {
		kind = "simulated"
	}
	fmt.Fprintf(w, "cluster: %d machines, %d %s GPUs, %d NVLink islands (largest %d)\n",
		r.Machines, r.GPUsTotal, kind, r.islandCount, r.largestIsland)
	fmt.Fprintf(w, "gang dp: %d workers x 1 GPU, placed by the gang scheduler: %s\n", r.GangSize, r.where)
	scores := map[string]float64{}
	for _, s := range r.Scores {
		scores[s.Name] = s.Value
	}
	var parts []string
	for _, name := range []string{"topology", "fragmentation", "load", "binpack"} {
		if v, ok := scores[name]; ok {
			parts = append(parts, fmt.Sprintf("%s %.2f", name, v))
		}
	}
	if len(parts) > 0 {
		fmt.Fprintf(w, "  scores: %s; total %.2f; modeled AllReduce of the gradients %.0f µs; spans %d island(s), %.0f machine(s), %.0f rack(s)\n",
			strings.Join(parts, ", "), scores["total"], scores["allreduce_us"], r.IslandsUsed, scores["machines_crossed"], scores["racks_crossed"])
	}
	for _, p := range r.Placement {
		fmt.Fprintf(w, "  rank %d -> %s GPU %v (island %v)\n", p.Rank, p.Machine, p.GPUs, p.Island)
	}
	fmt.Fprintf(w, "training a %d-parameter MLP on %d digits (%d held out)\n", r.ModelParameters, r.TrainExamples, r.TestExamples)
}

// progressLine draws a live status line on a terminal, or a line every tenth of the run
// elsewhere.
type progressLine struct {
	mu    sync.Mutex // two gangs' trainers may share it (the scenarios)
	w     io.Writer
	total int
	tty   bool
	last  int64
}

func newProgressLine(w io.Writer, total int) *progressLine {
	tty := false
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			tty = true
		}
	}
	return &progressLine{w: w, total: total, tty: tty}
}

func (p *progressLine) update(step int64, loss, rate float64, restarts int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	const width = 30
	filled := int(step) * width / p.total
	bar := strings.Repeat("█", filled) + strings.Repeat("·", width-filled)
	line := fmt.Sprintf("[%s] step %4d/%d  loss %.4f  %8.0f samples/s  restarts %d", bar, step, p.total, loss, rate, restarts)
	if p.tty {
		fmt.Fprintf(p.w, "\r%s", line)
		return
	}
	if step == int64(p.total) || step-p.last >= int64(max(p.total/10, 1)) {
		p.last = step
		fmt.Fprintln(p.w, line)
	}
}

func (p *progressLine) note(s string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty {
		fmt.Fprint(p.w, "\r\033[K")
	}
	fmt.Fprintln(p.w, s)
}

func (p *progressLine) done() {
	if p.tty {
		fmt.Fprintln(p.w)
	}
}
