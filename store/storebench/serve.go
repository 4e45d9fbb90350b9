package storebench

import (
	"bufio"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"

	"go.uber.org/zap"

	"github.com/atoll-run/atoll/store/object"
	"github.com/atoll-run/atoll/store/transfer"
)

// ServeInfo is the line the serving process prints.
type ServeInfo struct {
	Addr    string `json:"addr"`     // transfer server
	TCPAddr string `json:"tcp_addr"` // bare TCP: each connection gets the object's bytes, then EOF
	ID      string `json:"id"`
	Size    int64  `json:"size"`
}

// Serve puts one object of size pseudo-random bytes into a fresh store, serves it
// through a transfer server and through a bare TCP listener, prints a ServeInfo
// line to out, and runs until stdin reaches EOF or ctx ends. With sendfile the
// transfer server sends chunks with sendfile(2) (ServerConfig.Sendfile).
func Serve(ctx context.Context, size int64, tokenHex string, sendfile bool, stdin io.Reader, out io.Writer, log *zap.Logger) error {
	token, err := hex.DecodeString(tokenHex)
	if err != nil {
		return fmt.Errorf("storebench: serve: token %q is not hex: %w", tokenHex, err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	tln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "atoll-store-serve")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	cfg := object.DefaultConfig()
	cfg.Capacity = size + 64<<20
	cfg.Location = ln.Addr().String()
	cfg.Logger = log
	st, err := object.Open(cfg, dir)
	if err != nil {
		return err
	}
	defer st.Close()
	id, err := st.Put(ctx, "bench", pattern(int(size)))
	if err != nil {
		return err
	}
	v, err := st.Get(ctx, id)
	if err != nil {
		return err
	}
	defer v.Release()
	scfg := transfer.DefaultServerConfig()
	scfg.Token, scfg.Logger, scfg.Sendfile = token, log, sendfile
	srv, err := transfer.NewServer(scfg, transfer.StoreSource{Store: st})
	if err != nil {
		return err
	}
	go srv.Serve(ln)
	defer srv.Shutdown(context.Background())
	go func() {
		for {
			c, err := tln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = c.Write(v.Bytes()) // straight from the mapped object, as the store serves it
			}()
		}
	}()
	defer tln.Close()
	if err := json.NewEncoder(out).Encode(ServeInfo{Addr: ln.Addr().String(), TCPAddr: tln.Addr().String(), ID: id.String(), Size: size}); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, bufio.NewReader(stdin)); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
	return nil
}

// pattern returns n bytes that do not compress to nothing (an xorshift stream).
func pattern(n int) []byte {
	b := make([]byte, n)
	x := uint64(0x9e3779b97f4a7c15)
	for i := 0; i+8 <= n; i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		for j := range 8 {
			b[i+j] = byte(x >> (8 * j))
		}
	}
	return b
}
