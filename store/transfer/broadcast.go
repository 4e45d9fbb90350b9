package transfer

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/atoll-run/atoll/store/object"
)

// Receiver is one store taking part in a broadcast. Its Store must be served by a
// running Server at Store.Location(), so that its children can read from it
// while it is still receiving.
type Receiver struct {
	Store  *object.Store
	Client *Client
}

// BroadcastPlan returns, for each receiver i, the locations it pulls from in
// order: its parent first, then the parent's ancestors up to the source. Nodes are
// numbered source=0, receivers 1..n; node j's parent is (j-1)/fanout, so fanout 1
// is a pipeline (a chain) and fanout k a k-ary tree.
func BroadcastPlan(source string, receivers []string, fanout int) [][]string {
	fanout = max(fanout, 1)
	nodes := append([]string{source}, receivers...)
	plan := make([][]string, len(receivers))
	for i := range receivers {
		var locs []string
		for j := i + 1; j != 0; {
			j = (j - 1) / fanout
			locs = append(locs, nodes[j])
		}
		plan[i] = locs
	}
	return plan
}

// Broadcast copies object id from source to every receiver through a pipeline
// (fanout 1) or tree: each receiver pulls from its parent, which forwards chunks
// as they arrive, so the source sends the object about fanout times instead of
// len(receivers) times. A receiver starts once its parent has created its copy;
// if a parent dies, its children continue from the parent's ancestors. It returns
// the receivers' errors joined.
func Broadcast(ctx context.Context, id object.ID, source string, receivers []Receiver, fanout int, owner string) error {
	addrs := make([]string, len(receivers))
	for i, r := range receivers {
		addrs[i] = r.Store.Location()
	}
	plan := BroadcastPlan(source, addrs, fanout)
	fanout = max(fanout, 1)
	created := make([]chan struct{}, len(receivers)+1) // per node; node 0 (source) is ready
	for i := range created {
		created[i] = make(chan struct{})
	}
	close(created[0])
	errs := make([]error, len(receivers))
	var wg sync.WaitGroup
	for i, r := range receivers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			node := i + 1
			var once sync.Once
			ready := func() { once.Do(func() { close(created[node]) }) }
			defer ready() // children must not wait on a receiver that failed to start
			select {
			case <-created[(node-1)/fanout]:
			case <-ctx.Done():
				errs[i] = fmt.Errorf("transfer: broadcast to %s: %w", addrs[i], ctx.Err())
				return
			}
			if err := r.Client.Pull(ctx, r.Store, id, plan[i], PullOptions{Owner: owner, OnCreated: ready}); err != nil {
				errs[i] = fmt.Errorf("transfer: broadcast to %s: %w", addrs[i], err)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
