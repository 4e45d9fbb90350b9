// Command sweep runs a hyper-parameter sweep on tasks, as a Ray user writes one with
// remote functions and ray.wait: every trial (a learning rate and a hidden width) trains
// the digits MLP in a task holding a quarter of a GPU; the driver takes the results as
// they come with sdk.Wait, and once a trial reaches the target accuracy it cancels the
// trials still running.
//
//	go run ./examples/sweep                  # on the embedded default
//	ATOLL_ADDRESS=... go run ./examples/sweep  # unchanged, on a cluster of processes
package main

import (
	"context"
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

// Trial is one point of the sweep.
type Trial struct {
	LR     float32
	Hidden int
	Steps  int
	Seed   uint64
	Data   sdk.Ref[[2]digits.Dataset]
}

// Score is a trial's result.
type Score struct {
	Accuracy, Loss float64
	Machine        string
	GPU            []int
	Milli          int
}

// train is the task: it trains one model on the trial's hyper-parameters and scores it on
// the held-out set. It stops early when its context is cancelled.
var train = sdk.Task("train", func(c *sdk.Context, t Trial) (Score, error) {
	sets, err := sdk.Get(c, c, t.Data)
	if err != nil {
		return Score{}, err
	}
	tr, test := sets[0], sets[1]
	m := digits.NewMLP(t.Hidden, t.Seed)
	grad := make([]float32, len(m.Params))
	r := rand.New(rand.NewPCG(t.Seed, uint64(t.Hidden)))
	batch := make([]int, 32)
	for step := 0; step < t.Steps; step++ {
		if err := c.Err(); err != nil {
			return Score{}, err // cancelled: stop early
		}
		for i := range batch {
			batch[i] = r.IntN(tr.Len())
		}
		clear(grad)
		m.Gradient(tr, batch, grad)
		for i, g := range grad {
			m.Params[i] -= t.LR * g / float32(len(batch))
		}
	}
	loss, acc := m.Evaluate(test)
	p := c.Placement()
	return Score{Accuracy: acc, Loss: loss, Machine: p.Machine, GPU: p.GPUs, Milli: p.Milli}, nil
})

// Options of a sweep.
type Options struct {
	LRs     []float32
	Hiddens []int
	Steps   int
	// Target stops the sweep (cancelling the trials still running) once a trial reaches
	// it; 0 runs every trial.
	Target  float64
	Cluster []sdk.Option
}

// Result of a sweep.
type Result struct {
	Best      Trial
	BestScore Score
	Done      []Trial
	Scores    []Score
	Cancelled int
}

// Run runs the sweep.
func Run(ctx context.Context, o Options) (Result, error) {
	c, err := local.Start(ctx, append([]sdk.Option{sdk.Tasks(train)}, o.Cluster...)...)
	if err != nil {
		return Result{}, err
	}
	defer c.Shutdown(context.WithoutCancel(ctx))
	trainSet, testSet, err := digits.Load(1, 0.2)
	if err != nil {
		return Result{}, err
	}
	data, err := sdk.Put(ctx, c, [2]digits.Dataset{trainSet, testSet}) // once, for every trial
	if err != nil {
		return Result{}, err
	}
	job, err := c.Submit(ctx, sdk.JobSpec{Name: "sweep"})
	if err != nil {
		return Result{}, err
	}
	defer job.Stop(context.WithoutCancel(ctx))

	quarterGPU := train.With(sdk.TaskOptions{Resources: sdk.Resources{GPUs: 1, GPUMilli: 250}})
	sweepCtx, stop := context.WithCancel(ctx)
	defer stop()
	var trials []Trial
	var pending []*sdk.Future[Score]
	for _, lr := range o.LRs {
		for _, h := range o.Hiddens {
			t := Trial{LR: lr, Hidden: h, Steps: o.Steps, Seed: 7, Data: data}
			trials = append(trials, t)
			pending = append(pending, quarterGPU.Remote(sweepCtx, job, t))
		}
	}
	var res Result
	index := make([]int, len(pending)) // pending[i] is trial index[i]
	for i := range index {
		index[i] = i
	}
	for len(pending) > 0 {
		ready, rest, err := sdk.Wait(ctx, pending, 1)
		if err != nil {
			return res, err
		}
		for _, i := range ready {
			t := trials[index[i]]
			s, err := pending[i].Await(ctx)
			switch {
			case errors.Is(err, context.Canceled):
				res.Cancelled++
				continue
			case err != nil:
				return res, fmt.Errorf("trial lr %g hidden %d: %w", t.LR, t.Hidden, err)
			}
			res.Done, res.Scores = append(res.Done, t), append(res.Scores, s)
			fmt.Fprintf(os.Stderr, "lr %-5g hidden %-3d accuracy %5.1f%%  loss %.3f  (%s GPU %v, %d/1000 of it)\n",
				t.LR, t.Hidden, 100*s.Accuracy, s.Loss, s.Machine, s.GPU, s.Milli)
			if s.Accuracy > res.BestScore.Accuracy {
				res.Best, res.BestScore = t, s
			}
			if o.Target > 0 && s.Accuracy >= o.Target {
				stop() // good enough: the others stop early
			}
		}
		next, nextIndex := make([]*sdk.Future[Score], 0, len(rest)), make([]int, 0, len(rest))
		for _, i := range rest {
			next, nextIndex = append(next, pending[i]), append(nextIndex, index[i])
		}
		pending, index = next, nextIndex
	}
	return res, nil
}

// DefaultOptions: 4 learning rates x 3 widths, 300 steps each.
func DefaultOptions() Options {
	return Options{LRs: []float32{0.01, 0.05, 0.2, 0.5}, Hiddens: []int{8, 32, 64}, Steps: 300}
}

func main() {
	if sdk.InWorker() { // an agent started this program as one of the job's workers
		os.Exit(sdk.WorkerMain(sdk.Tasks(train)))
	}
	o := DefaultOptions()
	flag.Float64Var(&o.Target, "target", 0, "stop the sweep once a trial reaches this test accuracy (0: run every trial)")
	flag.IntVar(&o.Steps, "steps", o.Steps, "training steps per trial")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	res, err := Run(ctx, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sweep:", err)
		os.Exit(1)
	}
	fmt.Printf("best: lr %g, hidden %d: accuracy %.1f%% (%d trials done, %d cancelled)\n",
		res.Best.LR, res.Best.Hidden, 100*res.BestScore.Accuracy, len(res.Done), res.Cancelled)
}
