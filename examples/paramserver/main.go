// Command paramserver trains the digits MLP with a parameter server, as Ray's parameter
// server example does: one actor holds the model and applies gradients; a gang of CPU-only
// workers, spread over the machines, each pulls the newest parameters from it, computes a
// gradient on its shard of the data and pushes it back, asynchronously.
//
//	go run ./examples/paramserver                  # on the embedded default
//	ATOLL_ADDRESS=... go run ./examples/paramserver  # unchanged, on a cluster of processes
//
// The workers reach the server through its ref, passed in their constructor arguments (a
// ref crosses processes); another program could find it with sdk.Lookup(ctx, c,
// "paramserver/ps").
package main

import (
	"context"
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
	Workers, Rounds, StepsPerRound int
	Hidden, Batch                  int
	LR                             float32
	Seed                           uint64
	Cluster                        []sdk.Option
}

// Result of a run.
type Result struct {
	InitialLoss, FinalLoss, Accuracy float64
	Updates                          int64
	Machines                         []string
}

// Messages.
type (
	pull    struct{}
	pushed  struct{ Grad []float32 }
	evalReq struct{}
	evalRep struct {
		Loss, Accuracy float64
		Updates        int64
	}
	work struct{ Steps int }
)

// serverArgs and workerArgs are the actors' constructor arguments.
type (
	serverArgs struct {
		Data   sdk.Ref[[2]digits.Dataset]
		Hidden int
		Seed   uint64
		LR     float32
	}
	workerArgs struct {
		PS     sdk.ActorRef
		Data   sdk.Ref[[2]digits.Dataset]
		Hidden int
		Batch  int
		Seed   uint64
	}
)

// kinds are this program's actor kinds (the worker processes register them too).
func kinds() []sdk.Option {
	return []sdk.Option{
		sdk.KindOf("ps", func(a serverArgs) sdk.Actor { return &server{args: a} }, pull{}, pushed{}, evalReq{}),
		sdk.KindOf("ps-worker", func(a workerArgs) sdk.Actor { return &worker{args: a} }, work{}),
	}
}

// server holds the parameters and applies every gradient pushed to it (plain SGD).
type server struct {
	args    serverArgs
	model   *digits.MLP
	test    digits.Dataset
	updates int64
}

func (s *server) Start(c *sdk.Context) error {
	sets, err := sdk.Get(c, c, s.args.Data)
	if err != nil {
		return err
	}
	s.test = sets[1]
	s.model = digits.NewMLP(s.args.Hidden, s.args.Seed)
	return nil
}

func (s *server) Receive(_ *sdk.Context, msg any) (any, error) {
	switch m := msg.(type) {
	case pull:
		return s.model.Params, nil
	case pushed:
		if len(m.Grad) != len(s.model.Params) {
			return nil, fmt.Errorf("paramserver: a gradient of %d values for %d parameters", len(m.Grad), len(s.model.Params))
		}
		for i, g := range m.Grad {
			s.model.Params[i] -= s.args.LR * g
		}
		s.updates++
		return s.updates, nil
	case evalReq:
		loss, acc := s.model.Evaluate(s.test)
		return evalRep{Loss: loss, Accuracy: acc, Updates: s.updates}, nil
	}
	return nil, fmt.Errorf("paramserver: the server got %T", msg)
}

// worker computes gradients on its shard of the training set against the server's newest
// parameters.
type worker struct {
	args  workerArgs
	train digits.Dataset
	shard []int
	rng   *rand.Rand
}

func (w *worker) Start(c *sdk.Context) error {
	sets, err := sdk.Get(c, c, w.args.Data)
	if err != nil {
		return err
	}
	w.train = sets[0]
	for i := c.Rank(); i < w.train.Len(); i += c.Size() {
		w.shard = append(w.shard, i)
	}
	w.rng = rand.New(rand.NewPCG(w.args.Seed, uint64(c.Rank())))
	return nil
}

func (w *worker) Receive(c *sdk.Context, msg any) (any, error) {
	m, ok := msg.(work)
	if !ok {
		return nil, fmt.Errorf("paramserver: a worker got %T", msg)
	}
	model := &digits.MLP{Hidden: w.args.Hidden}
	grad := make([]float32, digits.NumParams(w.args.Hidden))
	batch := make([]int, w.args.Batch)
	var loss float64
	for step := 0; step < m.Steps; step++ {
		params, err := sdk.Call[[]float32](c, c, w.args.PS, pull{}) // a call from inside an actor
		if err != nil {
			return nil, err
		}
		model.Params = params
		for i := range batch {
			batch[i] = w.shard[w.rng.IntN(len(w.shard))]
		}
		clear(grad)
		l, _ := model.Gradient(w.train, batch, grad)
		loss += l / float64(len(batch))
		for i := range grad {
			grad[i] /= float32(len(batch))
		}
		if _, err := sdk.Call[int64](c, c, w.args.PS, pushed{Grad: grad}); err != nil {
			return nil, err
		}
	}
	return loss / float64(m.Steps), nil
}

// Run trains with a parameter server and returns the result.
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
	job, err := c.Submit(ctx, sdk.JobSpec{Name: "paramserver"})
	if err != nil {
		return Result{}, err
	}
	defer job.Stop(context.WithoutCancel(ctx))
	ps, err := job.SpawnActor(ctx, sdk.ActorSpec{Name: "ps", Kind: "ps", Resources: sdk.Resources{CPUMilli: 2000},
		Args: serverArgs{Data: data, Hidden: o.Hidden, Seed: o.Seed, LR: o.LR}})
	if err != nil {
		return Result{}, err
	}
	workers, err := job.SpawnGang(ctx, sdk.GangSpec{Name: "workers", Kind: "ps-worker", Workers: o.Workers,
		Resources: sdk.Resources{CPUMilli: 1000}, Strategy: sdk.Spread,
		Args: workerArgs{PS: ps, Data: data, Hidden: o.Hidden, Batch: o.Batch, Seed: o.Seed}})
	if err != nil {
		return Result{}, err
	}
	first, err := sdk.Call[evalRep](ctx, c, ps, evalReq{})
	if err != nil {
		return Result{}, err
	}
	res := Result{InitialLoss: first.Loss, Machines: workers.Placement().Machines}
	fmt.Fprintf(os.Stderr, "parameter server %s; %d workers on %v\n", ps, o.Workers, res.Machines)
	for round := 0; round < o.Rounds; round++ {
		fs := make([]*sdk.Future[float64], o.Workers)
		for r := range fs {
			fs[r] = sdk.CallAsync[float64](ctx, c, workers.Worker(r), work{Steps: o.StepsPerRound})
		}
		if _, _, err := sdk.Wait(ctx, fs, len(fs)); err != nil {
			return res, err
		}
		var loss float64
		for r, f := range fs {
			l, err := f.Await(ctx)
			if err != nil {
				return res, fmt.Errorf("round %d, worker %d: %w", round, r, err)
			}
			loss += l / float64(o.Workers)
		}
		ev, err := sdk.Call[evalRep](ctx, c, ps, evalReq{})
		if err != nil {
			return res, err
		}
		fmt.Fprintf(os.Stderr, "round %d: train loss %.3f, test loss %.3f, accuracy %.1f%% after %d updates\n",
			round, loss, ev.Loss, 100*ev.Accuracy, ev.Updates)
		res.FinalLoss, res.Accuracy, res.Updates = ev.Loss, ev.Accuracy, ev.Updates
	}
	return res, nil
}

// DefaultOptions: 4 workers, 8 rounds of 25 steps each.
func DefaultOptions() Options {
	return Options{Workers: 4, Rounds: 8, StepsPerRound: 25, Hidden: 32, Batch: 32, LR: 0.2, Seed: 1}
}

func main() {
	if sdk.InWorker() { // an agent started this program as one of the job's workers
		os.Exit(sdk.WorkerMain(kinds()...))
	}
	o := DefaultOptions()
	flag.IntVar(&o.Workers, "workers", o.Workers, "workers computing gradients")
	flag.IntVar(&o.Rounds, "rounds", o.Rounds, "rounds")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	res, err := Run(ctx, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "paramserver:", err)
		os.Exit(1)
	}
	fmt.Printf("test loss %.3f (from %.3f), accuracy %.1f%%, %d updates\n", res.FinalLoss, res.InitialLoss, 100*res.Accuracy, res.Updates)
}
