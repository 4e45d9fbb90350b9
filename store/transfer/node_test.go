package transfer

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/atoll-run/atoll/store/object"
)

func TestNodesShareDirectory(t *testing.T) {
	dir := object.NewMemDirectory()
	reg := prometheus.NewRegistry()
	a, b := startTestNodes(t, dir, reg)
	ctx := ctxT(t)
	data := randBytes(5<<20+3, 11)
	id, err := a.Store.Put(ctx, "driver", data)
	if err != nil {
		t.Fatal(err)
	}
	v, err := b.Get(ctx, id, "worker")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(v.Bytes(), data) {
		t.Fatal("bytes differ")
	}
	v.Release()
	m, err := dir.Lookup(ctx, id)
	if err != nil || !slices.Contains(m.Locations, a.Addr) || !slices.Contains(m.Locations, b.Addr) || m.Fingerprint == 0 {
		t.Fatalf("directory after pull: %+v %v", m, err)
	}
	// Freed on a: only b remains a location; freed on b too: gone.
	if err := a.Store.Release(ctx, id, "driver"); err != nil {
		t.Fatal(err)
	}
	// a's server may still hold b's region registration for a moment (it ends
	// when b's connections close), which pins the object; then it is freed.
	eventually(t, func() bool {
		m, _ := dir.Lookup(ctx, id)
		return len(m.Locations) == 1 && m.Locations[0] == b.Addr
	}, "only b is a location after a frees")
	if err := b.Store.Release(ctx, id, "worker"); err != nil {
		t.Fatal(err)
	}
	eventually(t, func() bool {
		_, err := dir.Lookup(ctx, id)
		return errors.Is(err, object.ErrNotFound)
	}, "directory forgets the id after both free")
	if _, err := b.Get(ctx, id, "worker"); !errors.Is(err, object.ErrNotFound) {
		t.Fatalf("get of a freed id: %v", err)
	}
}

// eventually waits up to 5s for cond, for effects that follow a connection closing.
func eventually(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// startTestNodes starts two nodes, "a" and "b", sharing a directory (and a registry when
// reg is not nil), stopped at the end of the test.
func startTestNodes(t *testing.T, dir object.Directory, reg prometheus.Registerer) (*Node, *Node) {
	t.Helper()
	var nodes []*Node
	for _, name := range []string{"a", "b"} {
		cfg := DefaultNodeConfig()
		cfg.Name, cfg.Dir, cfg.Token, cfg.Registerer, cfg.Logger = name, t.TempDir(), testToken, reg, zaptest.NewLogger(t)
		cfg.Store.Capacity = 64 << 20
		cfg.Store.Directory = dir
		n, err := StartNode(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			n.Shutdown(ctx)
		})
		nodes = append(nodes, n)
	}
	return nodes[0], nodes[1]
}
