// Command dataparallel trains the digits MLP with a data-parallel gang across machines and
// recovers exactly from a failure: 16 workers (one GPU each, so two 8-GPU machines) take
// synchronous SGD steps, summing their gradients with AllReduce; the gang checkpoints every
// few steps; part-way one worker is killed, the gang restarts all-for-one from its newest
// checkpoint, and the program checks that every worker's restored state equals the
// checkpoint byte for byte before it trains on. Training is deterministic, so the final
// parameters equal those of a run without the failure (their SHA-256 is printed).
//
//	go run ./examples/dataparallel                  # on the embedded default
//	ATOLL_ADDRESS=... go run ./examples/dataparallel  # unchanged, on a cluster of processes
package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"time"

	"github.com/atoll-run/atoll/internal/digits"
	"github.com/atoll-run/atoll/sdk"
	"github.com/atoll-run/atoll/sdk/local"
)

// Options of a run.
type Options struct {
	Workers, Steps, CheckpointEvery int
	// KillAt kills worker KillRank before that step (negative: never).
	KillAt, KillRank int
	Hidden, Batch    int
	LR, Momentum     float32
	Seed             uint64
	Cluster          []sdk.Option
}

// DefaultOptions: 16 workers, 60 steps, a checkpoint every 10, a worker killed at step 37.
func DefaultOptions() Options {
	return Options{Workers: 16, Steps: 60, CheckpointEvery: 10, KillAt: 37, KillRank: 11, Hidden: 32, Batch: 16,
		LR: 0.1, Momentum: 0.9, Seed: 3}
}

// Result of a run.
type Result struct {
	// FinalSHA256 is the hash of the final parameters (every rank holds the same).
	FinalSHA256 string
	Accuracy    float64
	// RestoredStep is the checkpoint the gang restarted from; RanksVerified how many
	// workers' restored state was checked equal, byte for byte, to their part of it.
	RestoredStep  int64
	RanksVerified int
	Restarts      int
	Machines      []string
	WorkerPIDs    []int
}

// Messages.
type (
	stepMsg struct {
		Gen  int
		Step int64
	}
	stateReq struct{}
	evalReq  struct{}
)

type workerArgs struct {
	Data          sdk.Ref[[2]digits.Dataset]
	Hidden, Batch int
	LR, Momentum  float32
	Seed          uint64
}

func kinds() []sdk.Option {
	return []sdk.Option{sdk.KindOf("dp-worker", func(a workerArgs) sdk.Actor { return &worker{args: a} }, stepMsg{}, stateReq{}, evalReq{})}
}

// worker is one data-parallel rank.
type worker struct {
	args        workerArgs
	train, test digits.Dataset
	shard       []int
	model       *digits.MLP
	velocity    []float32
	step        int64
}

// Checkpoint is the worker's whole state: step, parameters, momentum.
func (w *worker) Checkpoint() ([]byte, error) {
	var b bytes.Buffer
	_ = binary.Write(&b, binary.LittleEndian, w.step)
	_ = binary.Write(&b, binary.LittleEndian, w.model.Params)
	_ = binary.Write(&b, binary.LittleEndian, w.velocity)
	return b.Bytes(), nil
}

// Restore reads what Checkpoint wrote.
func (w *worker) Restore(state []byte) error {
	n := digits.NumParams(w.args.Hidden)
	if len(state) != 8+8*n {
		return fmt.Errorf("dataparallel: a checkpoint of %d bytes for %d parameters", len(state), n)
	}
	r := bytes.NewReader(state)
	w.model = &digits.MLP{Hidden: w.args.Hidden, Params: make([]float32, n)}
	w.velocity = make([]float32, n)
	_ = binary.Read(r, binary.LittleEndian, &w.step)
	_ = binary.Read(r, binary.LittleEndian, w.model.Params)
	return binary.Read(r, binary.LittleEndian, w.velocity)
}

func (w *worker) Start(c *sdk.Context) error {
	sets, err := sdk.Get(c, c, w.args.Data)
	if err != nil {
		return err
	}
	w.train, w.test = sets[0], sets[1]
	for i := c.Rank(); i < w.train.Len(); i += c.Size() {
		w.shard = append(w.shard, i)
	}
	if w.model == nil { // not restored: every rank starts from the same seeded weights
		w.model = digits.NewMLP(w.args.Hidden, w.args.Seed)
		w.velocity = make([]float32, len(w.model.Params))
	}
	return nil
}

func (w *worker) Receive(c *sdk.Context, msg any) (any, error) {
	switch m := msg.(type) {
	case stepMsg:
		if m.Gen != c.Generation() {
			return nil, fmt.Errorf("%w: a step for generation %d reached generation %d", sdk.ErrStale, m.Gen, c.Generation())
		}
		if m.Step != w.step {
			return nil, fmt.Errorf("dataparallel: rank %d is at step %d, asked for %d", c.Rank(), w.step, m.Step)
		}
		return w.doStep(c)
	case stateReq:
		return w.Checkpoint()
	case evalReq:
		_, acc := w.model.Evaluate(w.test)
		return acc, nil
	}
	return nil, fmt.Errorf("dataparallel: a worker got %T", msg)
}

// doStep: a gradient on a minibatch of the shard (seeded by step and rank), summed over
// the gang, then SGD with momentum: every rank applies the same sum, so replicas stay equal.
func (w *worker) doStep(c *sdk.Context) (float64, error) {
	r := rand.New(rand.NewPCG(uint64(w.step), uint64(c.Rank())+w.args.Seed))
	batch := make([]int, min(w.args.Batch, len(w.shard)))
	for i := range batch {
		batch[i] = w.shard[r.IntN(len(w.shard))]
	}
	grad := make([]float32, len(w.model.Params))
	loss, _ := w.model.Gradient(w.train, batch, grad)
	ctx, cancel := context.WithTimeout(c, 30*time.Second)
	defer cancel()
	if err := c.AllReduce(ctx, grad); err != nil {
		return 0, err
	}
	scale := w.args.LR / float32(len(batch)*c.Size())
	for i, g := range grad {
		w.velocity[i] = w.args.Momentum*w.velocity[i] + g*scale
		w.model.Params[i] -= w.velocity[i]
	}
	w.step++
	return loss / float64(len(batch)), nil
}

// Run trains, kills a worker part-way, checks the exact recovery, and trains to the end.
func Run(ctx context.Context, o Options) (Result, error) {
	c, err := local.Start(ctx, append(kinds(), o.Cluster...)...)
	if err != nil {
		return Result{}, err
	}
	defer c.Shutdown(context.WithoutCancel(ctx))
	train, test, err := digits.Load(o.Seed, 0.2)
	if err != nil {
		return Result{}, err
	}
	data, err := sdk.Put(ctx, c, [2]digits.Dataset{train, test})
	if err != nil {
		return Result{}, err
	}
	job, err := c.Submit(ctx, sdk.JobSpec{Name: "dataparallel"})
	if err != nil {
		return Result{}, err
	}
	defer job.Stop(context.WithoutCancel(ctx))
	g, err := job.SpawnGang(ctx, sdk.GangSpec{Name: "dp", Kind: "dp-worker", Workers: o.Workers, GPUsPerWorker: 1, MaxRestarts: 3,
		Backoff: 20 * time.Millisecond, AllReduceBytes: int64(4 * digits.NumParams(o.Hidden)),
		Args: workerArgs{Data: data, Hidden: o.Hidden, Batch: o.Batch, LR: o.LR, Momentum: o.Momentum, Seed: o.Seed}})
	if err != nil {
		return Result{}, err
	}
	res := Result{Machines: g.Placement().Machines, RestoredStep: -1}
	for _, w := range g.Workers() {
		res.WorkerPIDs = append(res.WorkerPIDs, w.PID)
	}
	fmt.Fprintf(os.Stderr, "gang of %d workers on machines %v\n", o.Workers, res.Machines)
	killed := false
	for step := int64(0); step < int64(o.Steps); {
		if int(step) == o.KillAt && !killed {
			killed = true
			gen := g.Generation()
			fmt.Fprintf(os.Stderr, "step %d: killing %s\n", step, g.Worker(o.KillRank))
			if err := g.Kill(ctx, o.KillRank); err != nil {
				return res, err
			}
			if _, err := g.AwaitRunning(ctx, gen+1); err != nil {
				return res, err
			}
			if step, err = verifyRestore(ctx, c, g, &res); err != nil {
				return res, err
			}
			continue
		}
		loss, err := trainStep(ctx, c, g, step)
		if errors.Is(err, sdk.ErrStale) { // an unplanned restart: resume from the checkpoint too
			if _, err := g.AwaitRunning(ctx, g.Generation()); err != nil {
				return res, err
			}
			if step, err = verifyRestore(ctx, c, g, &res); err != nil {
				return res, err
			}
			continue
		}
		if err != nil {
			return res, fmt.Errorf("step %d: %w", step, err)
		}
		step++
		if step%int64(o.CheckpointEvery) == 0 {
			if err := g.Checkpoint(ctx, step); err != nil {
				return res, err
			}
			fmt.Fprintf(os.Stderr, "step %d: loss %.3f, checkpointed\n", step, loss)
		}
	}
	// Every rank holds the same parameters: their hash is the run's.
	hashes := map[string]bool{}
	for r := 0; r < g.Size(); r++ {
		state, err := sdk.Call[[]byte](ctx, c, g.Worker(r), stateReq{})
		if err != nil {
			return res, err
		}
		sum := sha256.Sum256(state[8 : 8+4*digits.NumParams(o.Hidden)])
		hashes[hex.EncodeToString(sum[:])] = true
		res.FinalSHA256 = hex.EncodeToString(sum[:])
	}
	if len(hashes) != 1 {
		return res, fmt.Errorf("dataparallel: the ranks ended with %d different models", len(hashes))
	}
	if res.Accuracy, err = sdk.Call[float64](ctx, c, g.Worker(0), evalReq{}); err != nil {
		return res, err
	}
	res.Restarts = g.Restarts()
	return res, nil
}

// trainStep runs one synchronous step on every worker; it returns the mean loss.
func trainStep(ctx context.Context, c *sdk.Cluster, g *sdk.Gang, step int64) (float64, error) {
	gen := g.Generation()
	fs := make([]*sdk.Future[float64], g.Size())
	for r := range fs {
		fs[r] = sdk.CallAsync[float64](ctx, c, g.Worker(r), stepMsg{Gen: gen, Step: step})
	}
	var loss float64
	var errs []error
	for r, f := range fs {
		l, err := f.Await(ctx)
		if err != nil {
			errs = append(errs, fmt.Errorf("rank %d: %w", r, err))
		}
		loss += l / float64(len(fs))
	}
	return loss, errors.Join(errs...)
}

// verifyRestore checks that every worker of the restarted gang holds exactly its part of the
// newest checkpoint, and returns the step to go on from.
func verifyRestore(ctx context.Context, c *sdk.Cluster, g *sdk.Gang, res *Result) (int64, error) {
	parts, step, err := g.ReadCheckpoint(ctx, -1)
	if errors.Is(err, sdk.ErrNotFound) { // it failed before its first checkpoint: from the start
		fmt.Fprintf(os.Stderr, "gang restarted (generation %d) before its first checkpoint: from step 0\n", g.Generation())
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	for r := 0; r < g.Size(); r++ {
		state, err := sdk.Call[[]byte](ctx, c, g.Worker(r), stateReq{})
		if err != nil {
			return 0, err
		}
		if !bytes.Equal(state, parts[r]) {
			return 0, fmt.Errorf("dataparallel: rank %d restored %d bytes that differ from its %d-byte part of the checkpoint at step %d",
				r, len(state), len(parts[r]), step)
		}
	}
	res.RestoredStep, res.RanksVerified = step, g.Size()
	fmt.Fprintf(os.Stderr, "gang restarted (generation %d): all %d ranks restored the checkpoint of step %d byte for byte\n",
		g.Generation(), g.Size(), step)
	return step, nil
}

func main() {
	if sdk.InWorker() { // an agent started this program as one of the job's workers
		os.Exit(sdk.WorkerMain(kinds()...))
	}
	o := DefaultOptions()
	flag.IntVar(&o.Workers, "workers", o.Workers, "workers (one GPU each)")
	flag.IntVar(&o.Steps, "steps", o.Steps, "training steps")
	flag.IntVar(&o.KillAt, "kill-at", o.KillAt, "kill a worker before this step (negative: never)")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	res, err := Run(ctx, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "dataparallel:", err)
		os.Exit(1)
	}
	fmt.Printf("final parameters sha256 %s; accuracy %.1f%%; %d restart(s), restored step %d on %d ranks, machines %v\n",
		res.FinalSHA256[:16], 100*res.Accuracy, res.Restarts, res.RestoredStep, res.RanksVerified, res.Machines)
}
