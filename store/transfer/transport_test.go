package transfer

import (
	"bytes"
	"context"
	"errors"
	"testing"
)

// bytesRegion is a registered slice.
type bytesRegion struct {
	b      []byte
	closed chan struct{}
}

func (r *bytesRegion) Bytes() []byte                               { return r.b }
func (r *bytesRegion) Size() int64                                 { return int64(len(r.b)) }
func (r *bytesRegion) Fingerprint(context.Context) (uint64, error) { return 0, nil }
func (r *bytesRegion) WaitReady(context.Context, int64) error      { return nil }
func (r *bytesRegion) Close()                                      { close(r.closed) }

// TestTransports: the TCP transport and the in-memory one keep the same contract
// (register, one-sided reads by key, bad keys and ranges refused, deregistration).
func TestTransports(t *testing.T) {
	tok := []byte("transport-test-token-0123456789")
	mk := map[string]func(t *testing.T) (Transport, Transport){
		"tcp": func(t *testing.T) (Transport, Transport) {
			mkOne := func() Transport {
				scfg := DefaultServerConfig()
				scfg.Token = tok
				srv, err := NewServer(scfg, nil)
				if err != nil {
					t.Fatal(err)
				}
				addr, err := srv.Listen("127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				ccfg := DefaultClientConfig()
				ccfg.Token = tok
				cl, err := NewClient(ccfg)
				if err != nil {
					t.Fatal(err)
				}
				tr := NewTCPTransport(srv, addr, cl)
				t.Cleanup(func() { _ = tr.Shutdown(context.Background()) })
				return tr
			}
			return mkOne(), mkOne()
		},
		"mem": func(t *testing.T) (Transport, Transport) {
			n := NewMemNetwork()
			return n.Transport(), n.Transport()
		},
	}
	for name, pair := range mk {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			a, b := pair(t)
			data := make([]byte, 3<<20)
			for i := range data {
				data[i] = byte(i * 7)
			}
			r := &bytesRegion{b: data, closed: make(chan struct{})}
			k := a.Register(r)
			ep, err := b.Dial(ctx, a.Addr())
			if err != nil {
				t.Fatal(err)
			}
			defer ep.Close()
			if ep.Addr() != a.Addr() || ep.Closed() {
				t.Fatalf("endpoint %s closed=%v, want %s open", ep.Addr(), ep.Closed(), a.Addr())
			}
			for _, rg := range []struct{ off, n int }{{0, 10}, {1 << 20, 1 << 20}, {len(data) - 5, 5}} {
				dst := make([]byte, rg.n)
				if err := ep.Read(ctx, k, int64(rg.off), dst); err != nil {
					t.Fatalf("read [%d,+%d): %v", rg.off, rg.n, err)
				}
				if !bytes.Equal(dst, data[rg.off:rg.off+rg.n]) {
					t.Fatalf("read [%d,+%d): wrong bytes", rg.off, rg.n)
				}
			}
			if err := ep.Read(ctx, k, int64(len(data)-4), make([]byte, 8)); !errors.Is(err, ErrRange) {
				t.Fatalf("read past the end: %v, want ErrRange", err)
			}
			forged := k
			forged[15] ^= 1
			if err := ep.Read(ctx, forged, 0, make([]byte, 8)); !errors.Is(err, ErrBadKey) {
				t.Fatalf("read with a forged key: %v, want ErrBadKey", err)
			}
			if !a.Deregister(k) || a.Deregister(k) {
				t.Fatal("deregister: want true once, then false")
			}
			<-r.closed // the region is closed when its registration ends
			if err := ep.Read(ctx, k, 0, make([]byte, 8)); !errors.Is(err, ErrBadKey) {
				t.Fatalf("read after deregistration: %v, want ErrBadKey", err)
			}
		})
	}
}
