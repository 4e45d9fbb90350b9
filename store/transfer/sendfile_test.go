package transfer

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap/zaptest"

	"github.com/atoll-run/atoll/store/object"
)

// TestSendfile serves objects (large ones in their own file, small ones in a slab
// at an offset) with ServerConfig.Sendfile and checks the bytes and that
// sendfile was used; a corrupted chunk is still caught and re-fetched.
func TestSendfile(t *testing.T) {
	log := zaptest.NewLogger(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := object.DefaultLocalConfig()
	cfg.Location, cfg.Logger = ln.Addr().String(), log
	st, err := object.Open(cfg, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	m, _ := NewMetrics(prometheus.NewRegistry())
	scfg := DefaultServerConfig()
	scfg.Token, scfg.Logger, scfg.Metrics, scfg.Sendfile = testToken, log, m, true
	srv, err := NewServer(scfg, StoreSource{st})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		st.Close()
	})
	addr := ln.Addr().String()
	for _, size := range []int{1, 3000, 40 << 10, 3<<20 + 11} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			ctx := ctxT(t)
			// A slab neighbour first, so a small object sits at a non-zero offset.
			if _, err := st.Put(ctx, "o", randBytes(size, 1)); err != nil {
				t.Fatal(err)
			}
			data := randBytes(size, uint64(size)+2)
			id, err := st.Put(ctx, "o", data)
			if err != nil {
				t.Fatal(err)
			}
			before := testutil.ToFloat64(m.ChunksSendfile)
			dst := newNode(t, log, nil)
			if err := dst.client.Pull(ctx, dst.store, id, []string{addr}, PullOptions{}); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(getBytes(t, dst.store, id), data) {
				t.Fatal("bytes differ")
			}
			// The server counts a chunk once its send returns, which may be just
			// after the client has it: settle waits for that.
			settle(t, dst.client, addr)
			if testutil.ToFloat64(m.ChunksSendfile) <= before {
				t.Fatal("no chunk went through sendfile")
			}
		})
	}
	t.Run("corrupt chunk", func(t *testing.T) {
		ctx := ctxT(t)
		data := randBytes(2<<20, 9)
		id, _ := st.Put(ctx, "o", data)
		dialed := 0
		dst := newNode(t, log, func(c *ClientConfig) {
			d := &net.Dialer{}
			c.Streams = 1
			c.Dial = func(ctx context.Context, a string) (net.Conn, error) {
				conn, err := d.DialContext(ctx, "tcp", a)
				if dialed++; err != nil || dialed > 1 {
					return conn, err
				}
				return &corruptConn{Conn: conn, at: 300_000}, nil
			}
		})
		if err := dst.client.Pull(ctx, dst.store, id, []string{addr}, PullOptions{}); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(getBytes(t, dst.store, id), data) {
			t.Fatal("bytes differ after re-fetch")
		}
		if testutil.ToFloat64(dst.m.ChunkRefetch) != 1 {
			t.Fatal("corrupt chunk not re-fetched")
		}
	})
}
