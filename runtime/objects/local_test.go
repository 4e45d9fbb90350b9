package objects

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/atoll-run/atoll/store/object"
	"github.com/atoll-run/atoll/store/transfer"
)

func newTestLocal(t *testing.T) *Local {
	t.Helper()
	nc := transfer.DefaultNodeConfig()
	nc.Name, nc.Dir, nc.Token = "m1", t.TempDir(), []byte("a token of the tests")
	nc.Store.Capacity, nc.Store.ShmDir, nc.LeaseReapInterval = 64<<20, t.TempDir(), -1
	node, err := transfer.StartNode(nc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = node.Shutdown(ctx)
	})
	return NewLocal(node)
}

// TestReleaseHolderReleasesItsOwnOnly: a holder's end releases every reference it holds
// (twice held: both), an object it shares with another holder stays for that one, and
// what other holders alone hold is untouched; a freed object and a released reference
// leave the index too.
func TestReleaseHolderReleasesItsOwnOnly(t *testing.T) {
	ctx := context.Background()
	l := newTestLocal(t)
	put := func(holder string) object.ID {
		id, err := l.Put(ctx, holder, []byte("bytes of "+holder))
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	mine, shared, theirs, freed, released := put("w1"), put("w2"), put("w2"), put("w1"), put("w1")
	l.hold(mine, "w1") // a second reference of the same holder
	l.hold(shared, "w1")
	if err := l.Free(ctx, freed); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx, released, "w1"); err != nil {
		t.Fatal(err)
	}
	l.mu.Lock()
	n := len(l.held["w1"])
	l.mu.Unlock()
	if n != 2 {
		t.Fatalf("w1 indexed with %d objects, want 2 (mine, shared)", n)
	}
	if err := l.ReleaseHolder(ctx, "w1"); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Node.Store.Get(ctx, mine); !errors.Is(err, object.ErrNotFound) {
		t.Errorf("w1's own object after its end: %v, want ErrNotFound", err)
	}
	for _, id := range []object.ID{shared, theirs} {
		v, err := l.Node.Store.Get(ctx, id)
		if err != nil {
			t.Fatalf("w2's object %s after w1's end: %v", id.Short(), err)
		}
		v.Release()
		if !l.Held(id) {
			t.Errorf("w2's object %s no longer held", id.Short())
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.held["w1"]; ok {
		t.Error("w1 still indexed after its end")
	}
	if len(l.holders[shared]) != 1 || l.holders[shared]["w2"] != 1 {
		t.Errorf("shared object's holders %v, want w2 once", l.holders[shared])
	}
}
