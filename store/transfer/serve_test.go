package transfer

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/atoll-run/atoll/store/object"
)

// stallDirectory is a MemDirectory whose fingerprint registrations (Register
// with a known fingerprint) block until their context ends, as a consensus
// write does without a quorum.
type stallDirectory struct {
	*object.MemDirectory
	stalled      atomic.Int32
	hadDeadline  atomic.Bool
	stallEntered chan struct{}
}

func (d *stallDirectory) Register(ctx context.Context, m object.Meta) error {
	if m.Fingerprint == 0 {
		return d.MemDirectory.Register(ctx, m)
	}
	d.stalled.Add(1)
	_, ok := ctx.Deadline()
	d.hadDeadline.Store(ok)
	select {
	case d.stallEntered <- struct{}{}:
	default:
	}
	<-ctx.Done()
	return ctx.Err()
}

// TestOpenFingerprintBounded: serving an object whose fingerprint is not yet
// known records it in the directory under the server's bounded context, not a
// background one: with a directory that cannot write (no quorum), the Open is
// still answered, with the right fingerprint, after ReadyTimeout.
func TestOpenFingerprintBounded(t *testing.T) {
	log := zaptest.NewLogger(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dir := &stallDirectory{MemDirectory: object.NewMemDirectory(), stallEntered: make(chan struct{}, 1)}
	cfg := object.DefaultLocalConfig()
	cfg.Location, cfg.Logger, cfg.Directory = ln.Addr().String(), log, dir
	st, err := object.Open(cfg, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	m, _ := NewMetrics(prometheus.NewRegistry())
	scfg := DefaultServerConfig()
	scfg.Token, scfg.Logger, scfg.Metrics, scfg.ReadyTimeout = testToken, log, m, 100*time.Millisecond
	srv, err := NewServer(scfg, StoreSource{st})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		st.Close()
	})
	ctx := ctxT(t)
	data := randBytes(100<<10, 8)
	id, err := st.Put(ctx, "o", data) // fingerprint not computed on put
	if err != nil {
		t.Fatal(err)
	}
	cl, err := NewClient(func() ClientConfig { c := DefaultClientConfig(); c.Token = testToken; return c }())
	if err != nil {
		t.Fatal(err)
	}
	c, err := cl.Dial(ctx, ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	octx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	r, err := c.Open(octx, id)
	if err != nil {
		t.Fatalf("open while the directory cannot write: %v", err)
	}
	select {
	case <-dir.stallEntered:
	default:
		t.Fatal("the fingerprint was never recorded in the directory")
	}
	if r.Fingerprint != xxhash.Sum64(data) {
		t.Fatalf("fingerprint %x, want %x", r.Fingerprint, xxhash.Sum64(data))
	}
	if !dir.hadDeadline.Load() {
		t.Fatal("the directory write had no deadline")
	}
}
