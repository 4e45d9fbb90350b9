package digits

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"go.uber.org/zap"

	"github.com/atoll-run/atoll/sdk"
)

// Messages between the driver and the workers.
type (
	// stepMsg asks a worker for one training step; Gen is the gang incarnation it is meant for
	// (a message queued before a restart must not run after it).
	stepMsg struct {
		Gen  int
		Step int64
	}
	stepResult struct {
		Loss    float64
		Count   int
		Correct int
	}
	stateReq  struct{}
	evalReq   struct{}
	evalReply struct {
		TrainLoss, TestLoss, TestAccuracy float64
	}
)

// workerArgs are a worker's constructor arguments: the runtime keeps them and gives them to
// every incarnation, in whatever process it runs.
type workerArgs struct {
	Data          sdk.Ref[[2]Dataset]
	Hidden, Batch int
	LR, Momentum  float32
	Seed          uint64
}

// logEvery is how often (in steps) a worker logs its minibatch loss: a worker's log
// (atoll logs digits --rank N) shows its training.
const logEvery = 10

func newWorker(a workerArgs) sdk.Actor { return &worker{opts: a} }

// worker is one data-parallel rank: it holds a replica of the model and a shard of the data.
type worker struct {
	opts workerArgs

	train, test Dataset // the whole sets; the shard is train rows rank, rank+size, ...
	shard       []int
	model       *MLP
	velocity    []float32
	grad        []float32
	step        int64
}

var (
	_ sdk.Checkpointer = (*worker)(nil)
	_ sdk.Starter      = (*worker)(nil)
	_ sdk.Resizer      = (*worker)(nil)
)

func (w *worker) Checkpoint() ([]byte, error) {
	return state{Step: w.step, Params: w.model.Params, Velocity: w.velocity}.marshal(), nil
}

func (w *worker) Restore(data []byte) error {
	var s state
	if err := s.unmarshal(data, NumParams(w.opts.Hidden)); err != nil {
		return err
	}
	w.model = &MLP{Hidden: w.opts.Hidden, Params: s.Params}
	w.velocity, w.step = s.Velocity, s.Step
	return nil
}

func (w *worker) Start(c *sdk.Context) error {
	ctx, cancel := context.WithTimeout(c, time.Minute)
	defer cancel()
	sets, err := sdk.Get(ctx, c, w.opts.Data)
	if err != nil {
		return fmt.Errorf("digits: worker %d: load data: %w", c.Rank(), err)
	}
	w.train, w.test = sets[0], sets[1]
	w.reshard(c)
	if w.model == nil { // not restored: every rank starts from the same seeded weights
		w.model = NewMLP(w.opts.Hidden, w.opts.Seed)
		w.velocity = make([]float32, len(w.model.Params))
	}
	w.grad = make([]float32, len(w.model.Params))
	c.Logger().Info("training", zap.Int64("step", w.step), zap.Int("world", c.Size()),
		zap.Int("shard", len(w.shard)), zap.Int("parameters", len(w.model.Params)))
	return nil
}

// reshard takes the rows of this rank: rank, rank+size, ... (none for a member that is not
// in its gang's world yet: a grow's new member, until its driver takes it in).
func (w *worker) reshard(c *sdk.Context) {
	w.shard = w.shard[:0]
	if c.Rank() < 0 {
		return
	}
	for i := c.Rank(); i < w.train.Len(); i += c.Size() {
		w.shard = append(w.shard, i)
	}
}

// Resized re-shards the data when an elastic gang's size changes.
func (w *worker) Resized(c *sdk.Context) error {
	w.reshard(c)
	return nil
}

func (w *worker) Receive(c *sdk.Context, msg any) (any, error) {
	switch m := msg.(type) {
	case stepMsg:
		if m.Gen != c.Generation() {
			return nil, fmt.Errorf("%w: step for generation %d reached generation %d", sdk.ErrStale, m.Gen, c.Generation())
		}
		if m.Step != w.step {
			return nil, fmt.Errorf("digits: rank %d is at step %d, asked for step %d", c.Rank(), w.step, m.Step)
		}
		return w.doStep(c)
	case stateReq:
		return w.step, nil
	case evalReq:
		trainLoss, _ := w.model.Evaluate(w.train)
		testLoss, acc := w.model.Evaluate(w.test)
		return evalReply{TrainLoss: trainLoss, TestLoss: testLoss, TestAccuracy: acc}, nil
	}
	return nil, fmt.Errorf("digits: worker got unexpected %T", msg)
}

// doStep computes the gradient on a minibatch of the shard, AllReduces it with the gang, and
// applies SGD with momentum: every rank applies the same summed gradient, so replicas stay equal.
func (w *worker) doStep(c *sdk.Context) (stepResult, error) {
	o := w.opts
	r := rand.New(rand.NewPCG(uint64(w.step), uint64(c.Rank())+o.Seed))
	batch := make([]int, min(o.Batch, len(w.shard)))
	for i := range batch {
		batch[i] = w.shard[r.IntN(len(w.shard))]
	}
	clear(w.grad)
	loss, correct := w.model.Gradient(w.train, batch, w.grad)
	ctx, cancel := context.WithTimeout(c, 30*time.Second)
	defer cancel()
	if err := c.AllReduce(ctx, w.grad); err != nil {
		return stepResult{}, err
	}
	scale := o.LR / float32(len(batch)*c.Size())
	for i, g := range w.grad {
		w.velocity[i] = o.Momentum*w.velocity[i] + g*scale
		w.model.Params[i] -= w.velocity[i]
	}
	w.step++
	if w.step%logEvery == 0 {
		c.Logger().Info("trained", zap.Int64("step", w.step), zap.Float64("loss", loss/float64(max(len(batch), 1))),
			zap.Int("correct", correct), zap.Int("batch", len(batch)))
	}
	return stepResult{Loss: loss, Count: len(batch), Correct: correct}, nil
}
