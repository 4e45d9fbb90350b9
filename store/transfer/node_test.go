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
	// b's pull ended its region registration on a (CloseRegion); once a's
	// server has handled that, nothing pins a's copy and the release frees it.
	settle(t, b.Client, a.Addr)
	if m, _ := dir.Lookup(ctx, id); len(m.Locations) != 1 || m.Locations[0] != b.Addr {
		t.Fatalf("locations after a frees: %v, want only b", m.Locations)
	}
	if err := b.Store.Release(ctx, id, "worker"); err != nil {
		t.Fatal(err)
	}
	if _, err := dir.Lookup(ctx, id); !errors.Is(err, object.ErrNotFound) {
		t.Fatalf("directory after both free: %v, want the id forgotten", err)
	}
	if _, err := b.Get(ctx, id, "worker"); !errors.Is(err, object.ErrNotFound) {
		t.Fatalf("get of a freed id: %v", err)
	}
}

// settle returns once the server at addr has handled every frame cl's pooled
// connections to it have sent (a region's close, a chunk's accounting): frames
// on one connection are handled in order, so a ping's answer comes after them.
func settle(t *testing.T, cl *Client, addr string) {
	t.Helper()
	cs := pooledConns(cl, addr)
	if len(cs) == 0 {
		t.Fatal("no pooled connection to settle")
	}
	for _, c := range cs {
		if err := c.Ping(ctxT(t)); err != nil {
			t.Fatal(err)
		}
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
