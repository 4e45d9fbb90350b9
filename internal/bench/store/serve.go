package store

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"

	"go.uber.org/zap"

	"github.com/atoll-run/atoll/store/object"
	"github.com/atoll-run/atoll/store/transfer"
)

// ServeConfig is what the benchmark tells its serving process, as the first
// line of the process's stdin (JSON): the token and keys never appear on a
// command line, where ps would show them.
type ServeConfig struct {
	Token    string `json:"token"` // hex, at least 16 bytes
	Size     int64  `json:"size"`  // the large object's size
	Sendfile bool   `json:"sendfile"`
	// Room is store capacity beyond the objects it serves (for the parts the checkpoint
	// measurement has it pull).
	Room int64 `json:"room,omitempty"`
	// TLS, if set, adds a second transfer server that requires mutual TLS.
	TLS *TLSPEM `json:"tls,omitempty"`
}

// TLSPEM is a certificate and key with the CA that verifies peers, PEM-encoded.
type TLSPEM struct {
	CA   string `json:"ca"`
	Cert string `json:"cert"`
	Key  string `json:"key"`
}

// SmallSize is the size of the object the small-pull measurement pulls.
const SmallSize = 4 << 10

// ServeInfo is the line the serving process prints.
type ServeInfo struct {
	Addr    string `json:"addr"`               // transfer server
	TLSAddr string `json:"tls_addr,omitempty"` // transfer server with mutual TLS
	TCPAddr string `json:"tcp_addr"`           // bare TCP: each connection gets the object's bytes, then EOF
	ID      string `json:"id"`
	Size    int64  `json:"size"`
	SmallID string `json:"small_id"` // a SmallSize object
}

// Serve reads a ServeConfig line from stdin, puts one object of Size
// pseudo-random bytes and one of SmallSize into a fresh store, serves them
// through a transfer server (and one with mutual TLS if asked) and the large
// one through a bare TCP listener, prints a ServeInfo line to out, and then
// answers ServeCommand lines (one ServeReply line each) until stdin reaches EOF
// or ctx ends.
func Serve(ctx context.Context, stdin io.Reader, out io.Writer, log *zap.Logger) error {
	if log == nil {
		log = zap.NewNop()
	}
	in := bufio.NewReader(stdin)
	line, err := in.ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("benchstore: serve: read config from stdin: %w", err)
	}
	var sc ServeConfig
	if err := json.Unmarshal(line, &sc); err != nil {
		return fmt.Errorf("benchstore: serve: config line: %w", err)
	}
	token, err := hex.DecodeString(sc.Token)
	if err != nil {
		return fmt.Errorf("benchstore: serve: token is not hex: %w", err)
	}
	if sc.Size < 1 {
		return fmt.Errorf("benchstore: serve: size %d must be positive", sc.Size)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	tln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer tln.Close()
	dir, err := os.MkdirTemp("", "atoll-store-serve")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	cfg := object.DefaultConfig()
	cfg.Capacity = sc.Size + 64<<20 + max(sc.Room, 0)
	cfg.Location = ln.Addr().String()
	cfg.Logger = log
	st, err := object.Open(cfg, dir)
	if err != nil {
		return err
	}
	defer st.Close()
	id, err := st.Put(ctx, "bench", pattern(int(sc.Size)))
	if err != nil {
		return err
	}
	small, err := st.Put(ctx, "bench", pattern(SmallSize))
	if err != nil {
		return err
	}
	v, err := st.Get(ctx, id)
	if err != nil {
		return err
	}
	defer v.Release()
	info := ServeInfo{Addr: ln.Addr().String(), TCPAddr: tln.Addr().String(), ID: id.String(), Size: sc.Size, SmallID: small.String()}
	scfg := transfer.DefaultServerConfig()
	scfg.Token, scfg.Logger, scfg.Sendfile = token, log, sc.Sendfile
	srv, err := transfer.NewServer(scfg, transfer.StoreSource{Store: st})
	if err != nil {
		return err
	}
	go srv.Serve(ln)
	defer srv.Shutdown(context.Background())
	if sc.TLS != nil {
		tc, err := sc.TLS.config()
		if err != nil {
			return err
		}
		scfg.TLS = &tls.Config{Certificates: tc.Certificates, ClientCAs: tc.RootCAs}
		tsrv, err := transfer.NewServer(scfg, transfer.StoreSource{Store: st})
		if err != nil {
			return err
		}
		if info.TLSAddr, err = tsrv.Listen("127.0.0.1:0"); err != nil {
			return err
		}
		defer tsrv.Shutdown(context.Background())
	}
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
	enc := json.NewEncoder(out)
	if err := enc.Encode(info); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- serveCommands(ctx, in, enc, st, token, log) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	return nil
}

// config parses the PEM into a certificate and a pool of the CA.
func (p *TLSPEM) config() (*tls.Config, error) {
	cert, err := tls.X509KeyPair([]byte(p.Cert), []byte(p.Key))
	if err != nil {
		return nil, fmt.Errorf("benchstore: TLS key pair: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM([]byte(p.CA)) {
		return nil, errors.New("benchstore: TLS: no CA certificate in the PEM")
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool}, nil
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
