package digits

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/atoll-run/atoll/sdk"
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
	// ClusterOptions configure the embedded cluster.
	ClusterOptions []sdk.Option
}

// DefaultOptions: 8 workers, 300 steps, a crash at step 130 (checkpoints every 25 steps).
func DefaultOptions() Options {
	return Options{Steps: 300, Workers: 8, Hidden: 32, Batch: 32, LR: 0.1, Momentum: 0.9,
		CheckpointEvery: 25, KillAtStep: 130, KillRank: 3, Seed: 1}
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

// Run starts an embedded cluster, trains the MLP on the digits data with a gang of workers
// inside one NVLink island, crashes one worker part-way (the gang restarts from its newest
// checkpoint), and returns the summary.
func Run(ctx context.Context, o Options) (Result, error) {
	start := time.Now()
	if o.Workers <= 0 || o.Steps <= 0 || o.Batch <= 0 || o.Hidden <= 0 || o.CheckpointEvery <= 0 {
		return Result{}, fmt.Errorf("digits: workers %d, steps %d, batch %d, hidden %d, checkpoint every %d: all must be positive",
			o.Workers, o.Steps, o.Batch, o.Hidden, o.CheckpointEvery)
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	progress := o.Progress
	if progress == nil {
		progress = io.Discard
	}
	train, test, err := Load(o.Seed, 0.2)
	if err != nil {
		return Result{}, err
	}
	c, err := sdk.Local(ctx, append([]sdk.Option{sdk.WithLogger(o.Logger)}, o.ClusterOptions...)...)
	if err != nil {
		return Result{}, err
	}
	defer func() { _ = c.Shutdown(context.WithoutCancel(ctx)) }()

	dataRef := new(sdk.Ref[[2]Dataset])
	if err := c.Register("digits-worker", func() sdk.Actor { return &worker{opts: &o, dataRef: dataRef} }); err != nil {
		return Result{}, err
	}
	sets, err := sdk.Put(ctx, c, [2]Dataset{train, test})
	if err != nil {
		return Result{}, err
	}
	*dataRef = sets

	job, err := c.Submit(ctx, sdk.JobSpec{Name: "digits"})
	if err != nil {
		return Result{}, err
	}
	gang, err := job.SpawnGang(ctx, sdk.GangSpec{Name: "dp", Kind: "digits-worker", Workers: o.Workers, GPUsPerWorker: 1,
		SameIsland: true, MaxRestarts: 3, Backoff: 20 * time.Millisecond, AllReduceBytes: int64(4 * NumParams(o.Hidden))})
	if err != nil {
		return Result{}, err
	}
	res := describe(c, gang)
	res.Steps, res.TrainExamples, res.TestExamples, res.ModelParameters = o.Steps, train.Len(), test.Len(), NumParams(o.Hidden)
	printPlacement(progress, c, res)

	first, err := sdk.Call[evalReply](ctx, c, gang.Worker(0), evalReq{})
	if err != nil {
		return res, err
	}
	res.InitialLoss = first.TrainLoss

	live := newProgressLine(progress, o.Steps)
	var step int64
	var samples int
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
			recovered, rerr := resync(ctx, c, gang)
			if rerr != nil {
				return res, fmt.Errorf("digits: step %d failed (%v) and the gang did not recover: %w", step, err, rerr)
			}
			step = recovered
			continue
		}
		step++
		samples += n
		if step%int64(o.CheckpointEvery) == 0 {
			if err := gang.Checkpoint(ctx, step); err != nil {
				return res, err
			}
			res.Checkpoints++
		}
		live.update(step, loss, float64(samples)/time.Since(trainStart).Seconds(), gang.Restarts())
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
	return res, job.Stop(ctx)
}

// trainStep runs one synchronous step on every worker and returns the mean minibatch loss.
func trainStep(ctx context.Context, c *sdk.Cluster, g *sdk.Gang, step int64) (float64, int, error) {
	gen := g.Generation()
	fs := make([]sdk.Future[stepResult], g.Size())
	for r := range fs {
		fs[r] = sdk.CallAsync[stepResult](c, g.Worker(r), stepMsg{Gen: gen, Step: step})
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
	if err := g.Kill(rank, "demo: worker killed"); err != nil {
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

// resync waits for the gang to run and returns the step all its workers agree on.
func resync(ctx context.Context, c *sdk.Cluster, g *sdk.Gang) (int64, error) {
	for attempt := 0; attempt < 50; attempt++ {
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
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	return 0, fmt.Errorf("digits: workers of gang %q do not agree on a step", g.Name())
}

func describe(c *sdk.Cluster, g *sdk.Gang) Result {
	topo := c.Topology()
	p := g.Placement()
	res := Result{GPUsTotal: topo.NumGPUs(), Machines: len(topo.Machines), GangSize: g.Size(), IslandsUsed: len(p.Islands), Placer: p.Placer}
	for _, m := range topo.Machines {
		res.SimulatedGPUs = res.SimulatedGPUs || m.Simulated
	}
	// Islands: the gang's GPUs grouped by the NVLink island they sit in.
	byIsland := map[int][]int{}
	for _, g := range p.GPUs() {
		gpu, _ := topo.GPU(g)
		byIsland[gpu.Island] = append(byIsland[gpu.Island], g)
	}
	for _, is := range p.Islands {
		res.Islands = append(res.Islands, byIsland[is])
	}
	for r, m := range p.Members {
		res.Placement = append(res.Placement, Placed{Rank: r, Machine: m.MachineName, GPUs: m.GPUs, Island: m.Islands})
	}
	for k, v := range p.Scores {
		res.Scores = append(res.Scores, Score{Name: k, Value: v})
	}
	sort.Slice(res.Scores, func(i, j int) bool { return res.Scores[i].Name < res.Scores[j].Name })
	return res
}

func printPlacement(w io.Writer, c *sdk.Cluster, r Result) {
	topo := c.Topology()
	kind := "real"
	if r.SimulatedGPUs {
		kind = "simulated"
	}
	fmt.Fprintf(w, "cluster: %d machines, %d %s GPUs, %d NVLink islands (largest %d)\n",
		r.Machines, r.GPUsTotal, kind, len(topo.Islands), topo.LargestIsland())
	where := fmt.Sprintf("%d island(s)", r.IslandsUsed)
	if topo.Topology != nil {
		var gpus []int
		for _, p := range r.Placement {
			gpus = append(gpus, p.GPUs...)
		}
		where = topo.Topology.DescribePlacement(gpus)
	}
	fmt.Fprintf(w, "gang dp: %d workers x 1 GPU, placed by %s: %s\n", r.GangSize, r.Placer, where)
	scores := map[string]float64{}
	for _, s := range r.Scores {
		scores[s.Name] = s.Value
	}
	var parts []string
	for _, s := range r.Scores {
		if wt, ok := scores[s.Name+"_weight"]; ok {
			parts = append(parts, fmt.Sprintf("%s %.2f×%.1f", s.Name, s.Value, wt))
		}
	}
	if len(parts) > 0 {
		fmt.Fprintf(w, "  scores: %s = %.2f; modeled AllReduce of the gradients %.0f µs; spans %.0f island(s), %.0f machine(s), %.0f rack(s)\n",
			strings.Join(parts, " + "), scores["total"], scores["allreduce_us"], scores["islands_crossed"], scores["machines_crossed"], scores["racks_crossed"])
	}
	for _, p := range r.Placement {
		fmt.Fprintf(w, "  rank %d -> %s GPU %v (island %v)\n", p.Rank, p.Machine, p.GPUs, p.Island)
	}
	fmt.Fprintf(w, "training a %d-parameter MLP on %d digits (%d held out)\n", r.ModelParameters, r.TrainExamples, r.TestExamples)
}

// progressLine draws a live status line on a terminal, or a line every tenth of the run
// elsewhere.
type progressLine struct {
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
