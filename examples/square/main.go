// Command square is the smallest program for a running cluster: Ray's first example,
// tasks that square numbers fanned out with Remote and gathered with Wait, and an actor
// that counts them. It imports the SDK alone, so its binary links the client side only
// (API client, actor system, object client, worker mode): no head, Paxos or agent. It
// runs where ATOLL_ADDRESS points (or is submitted there):
//
//	atoll up --dir ./mycluster --agents 2 --machine dgx-h100
//	ATOLL_ADDRESS=$(atoll address --dir ./mycluster) go run ./examples/square
//	go build -o square ./examples/square && atoll submit --dir ./mycluster --wait -- ./square
//
// Without a cluster it says so (sdk.ErrNoCluster); a program that also wants the embedded
// default imports sdk/local (examples/sweep does).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/atoll-run/atoll/sdk"
)

// square is the task: one CPU by default.
var square = sdk.Task("square", func(_ *sdk.Context, x int) (int, error) { return x * x, nil })

// counter is an actor that counts what it is told.
type counter struct{ n int }

// add is counter's message.
type add struct{ N int }

func (c *counter) Receive(_ *sdk.Context, msg any) (any, error) {
	m, ok := msg.(add)
	if !ok {
		return nil, fmt.Errorf("counter: unknown message %T", msg)
	}
	c.n += m.N
	return c.n, nil
}

func kinds() []sdk.Option {
	return []sdk.Option{sdk.Tasks(square), sdk.Kind("counter", func() sdk.Actor { return &counter{} }, add{})}
}

// Run squares 0..n-1 on the cluster's workers and sums the squares in a counter actor.
func Run(ctx context.Context, n int, opts ...sdk.Option) (int, error) {
	c, err := sdk.Start(ctx, append(kinds(), opts...)...)
	if err != nil {
		return 0, err
	}
	defer c.Shutdown(context.WithoutCancel(ctx))
	job, err := c.Submit(ctx, sdk.JobSpec{Name: "square"})
	if err != nil {
		return 0, err
	}
	fs := make([]*sdk.Future[int], n)
	for i := range n {
		fs[i] = square.Remote(ctx, job, i)
	}
	ctr, err := job.SpawnActor(ctx, sdk.ActorSpec{Name: "sum", Kind: "counter"})
	if err != nil {
		return 0, err
	}
	sum := 0
	for pending := fs; len(pending) > 0; { // take results as they come, as ray.wait
		ready, rest, err := sdk.Wait(ctx, pending, 1)
		if err != nil {
			return 0, err
		}
		for _, i := range ready {
			v, err := pending[i].Await(ctx)
			if err != nil {
				return 0, err
			}
			if sum, err = sdk.Call[int](ctx, c, ctr, add{N: v}); err != nil {
				return 0, err
			}
		}
		next := make([]*sdk.Future[int], 0, len(rest))
		for _, i := range rest {
			next = append(next, pending[i])
		}
		pending = next
	}
	return sum, nil
}

func main() {
	if sdk.InWorker() { // an agent started this program as one of the job's workers
		os.Exit(sdk.WorkerMain(kinds()...))
	}
	n := flag.Int("n", 100, "numbers to square")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	sum, err := Run(ctx, *n)
	if errors.Is(err, sdk.ErrNoCluster) {
		fmt.Fprintln(os.Stderr, "square: no cluster to run on: set ATOLL_ADDRESS (atoll address --dir DIR prints it)")
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "square:", err)
		os.Exit(1)
	}
	fmt.Printf("sum of the squares of 0..%d: %d\n", *n-1, sum)
}
