package transfer

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap/zaptest"

	"github.com/atoll-run/atoll/store/object"
)

// testCA is a throwaway certificate authority made for one test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newTestCA(t testing.TB, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool}
}

// issue makes a certificate for name, valid for 127.0.0.1, for servers and clients.
func (ca *testCA) issue(t testing.TB, name string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// serverTLS and clientTLS are the configs a cluster member gets from its CA.
func (ca *testCA) serverTLS(t testing.TB, name string) *tls.Config {
	return &tls.Config{Certificates: []tls.Certificate{ca.issue(t, name)}, ClientCAs: ca.pool}
}

func (ca *testCA) clientTLS(t testing.TB, name string) *tls.Config {
	return &tls.Config{Certificates: []tls.Certificate{ca.issue(t, name)}, RootCAs: ca.pool}
}

// tlsServer serves a store over mutual TLS and returns its address and metrics.
func tlsServer(t *testing.T, st *object.Store, cfg *tls.Config) (string, *Metrics) {
	t.Helper()
	m, _ := NewMetrics(prometheus.NewRegistry())
	scfg := DefaultServerConfig()
	scfg.Token, scfg.Logger, scfg.Metrics, scfg.TLS = testToken, zaptest.NewLogger(t), m, cfg
	srv, err := NewServer(scfg, StoreSource{st})
	if err != nil {
		t.Fatal(err)
	}
	addr, err := srv.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	return addr, m
}

// TestMutualTLS: with TLS on the server, a client with a certificate from the
// cluster CA and the token pulls; a client without a certificate, with one
// from another CA, without TLS, or with the wrong token is refused and gets no
// byte; a TLS client cannot talk to a plain server either.
func TestMutualTLS(t *testing.T) {
	ca, rogue := newTestCA(t, "cluster CA"), newTestCA(t, "rogue CA")
	src := newNode(t, zaptest.NewLogger(t), nil)
	ctx := ctxT(t)
	data := randBytes(3<<20+7, 9)
	id, _ := src.store.Put(ctx, "o", data)
	addr, sm := tlsServer(t, src.store, ca.serverTLS(t, "agent-1"))

	good := newNode(t, zaptest.NewLogger(t), func(c *ClientConfig) { c.TLS = ca.clientTLS(t, "agent-2") })
	if err := good.client.Pull(ctx, good.store, id, []string{addr}, PullOptions{}); err != nil {
		t.Fatalf("pull over mutual TLS: %v", err)
	}
	if !bytes.Equal(getBytes(t, good.store, id), data) {
		t.Fatal("bytes differ")
	}

	for _, tc := range []struct {
		name string
		mut  func(*ClientConfig)
	}{
		{"no client certificate", func(c *ClientConfig) { c.TLS = &tls.Config{RootCAs: ca.pool} }},
		{"certificate from another CA", func(c *ClientConfig) { c.TLS = rogue.clientTLS(t, "intruder") }},
		{"server not trusted", func(c *ClientConfig) {
			c.TLS = &tls.Config{Certificates: ca.clientTLS(t, "x").Certificates, RootCAs: rogue.pool}
		}},
		{"no TLS", func(c *ClientConfig) {}},
		{"wrong token", func(c *ClientConfig) { c.TLS = ca.clientTLS(t, "agent-3"); c.Token = []byte("not-the-cluster-token!!") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := newNode(t, zaptest.NewLogger(t), tc.mut)
			err := bad.client.Pull(ctx, bad.store, id, []string{addr}, PullOptions{})
			if !errors.Is(err, ErrObjectLost) || !errors.Is(err, ErrAuth) && tc.name != "no TLS" {
				t.Fatalf("pull: %v, want refused", err)
			}
			if bad.store.Contains(id) || testutil.ToFloat64(bad.m.BytesPulled) != 0 {
				t.Fatal("bytes crossed without authentication")
			}
		})
	}
	// The server counts a refusal when its side of the handshake ends, which may be after
	// the client, which failed first, has returned: wait for the counts.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		tlsErrs, authErrs := testutil.ToFloat64(sm.Errors.WithLabelValues(reasonTLS)), testutil.ToFloat64(sm.Errors.WithLabelValues(reasonAuth))
		if tlsErrs >= 3 && authErrs >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("server counted %v failed TLS handshakes (want at least 3) and %v wrong tokens inside TLS (want at least 1)", tlsErrs, authErrs)
		}
	}
	// A TLS client and a plain server do not talk either.
	plain := newNode(t, zaptest.NewLogger(t), func(c *ClientConfig) { c.TLS = ca.clientTLS(t, "agent-4"); c.DialTimeout = time.Second })
	if err := plain.client.Pull(ctx, plain.store, id, []string{src.addr}, PullOptions{}); !errors.Is(err, ErrObjectLost) {
		t.Fatalf("TLS client to a plain server: %v", err)
	}
}

func TestServerTLSConfigValidated(t *testing.T) {
	ca := newTestCA(t, "ca")
	cert := ca.issue(t, "s")
	for _, tc := range []struct {
		name string
		cfg  *tls.Config
	}{
		{"no certificate", &tls.Config{ClientCAs: ca.pool}},
		{"no client CAs", &tls.Config{Certificates: []tls.Certificate{cert}}},
	} {
		c := DefaultServerConfig()
		c.Token, c.TLS = testToken, tc.cfg
		if err := c.Validate(); err == nil {
			t.Errorf("%s: accepted", tc.name)
		}
	}
	// A config that asks for no client certificate gets one required anyway.
	c := DefaultServerConfig()
	c.Token, c.TLS = testToken, &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: ca.pool, ClientAuth: tls.NoClientCert}
	srv, err := NewServer(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	if srv.cfg.TLS.ClientAuth != tls.RequireAndVerifyClientCert || c.TLS.ClientAuth != tls.NoClientCert {
		t.Fatal("client certificates not required, or the caller's config changed")
	}
}

// TestAuthorizeDecidesByThePeer: a server's Authorize sees the peer's verified
// certificate and decides each object it opens; a refused peer gets ErrDenied and no
// byte, an admitted one pulls.
func TestAuthorizeDecidesByThePeer(t *testing.T) {
	ca := newTestCA(t, "cluster CA")
	src := newNode(t, zaptest.NewLogger(t), nil)
	ctx := ctxT(t)
	data := randBytes(1<<20+3, 5)
	id, _ := src.store.Put(ctx, "o", data)
	m, _ := NewMetrics(prometheus.NewRegistry())
	scfg := DefaultServerConfig()
	scfg.Token, scfg.Logger, scfg.Metrics, scfg.TLS = testToken, zaptest.NewLogger(t), m, ca.serverTLS(t, "agent-1")
	var mu sync.Mutex
	var seen []string
	scfg.Authorize = func(_ context.Context, peer *x509.Certificate, oid object.ID) error {
		if peer == nil || oid != id {
			return errors.New("no certificate, or another object")
		}
		mu.Lock()
		seen = append(seen, peer.Subject.CommonName)
		mu.Unlock()
		if peer.Subject.CommonName != "reader" {
			return errors.New(peer.Subject.CommonName + " may not read it")
		}
		return nil
	}
	srv, err := NewServer(scfg, StoreSource{src.store})
	if err != nil {
		t.Fatal(err)
	}
	addr, err := srv.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(context.Background())

	bad := newNode(t, zaptest.NewLogger(t), func(c *ClientConfig) { c.TLS = ca.clientTLS(t, "intruder") })
	if err := bad.client.Pull(ctx, bad.store, id, []string{addr}, PullOptions{}); err == nil || bad.store.Contains(id) {
		t.Fatalf("a refused peer pulled: %v", err)
	}
	cc := DefaultClientConfig()
	cc.Token, cc.TLS = testToken, ca.clientTLS(t, "intruder")
	cl, err := NewClient(cc)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	cn, err := cl.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cn.Open(ctx, id); !errors.Is(err, ErrDenied) || !strings.Contains(err.Error(), "intruder may not read it") {
		t.Fatalf("open: %v, want ErrDenied with the reason", err)
	}
	cn.Close()
	good := newNode(t, zaptest.NewLogger(t), func(c *ClientConfig) { c.TLS = ca.clientTLS(t, "reader") })
	if err := good.client.Pull(ctx, good.store, id, []string{addr}, PullOptions{}); err != nil {
		t.Fatalf("an admitted peer: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !bytes.Equal(getBytes(t, good.store, id), data) || !slices.Contains(seen, "intruder") || !slices.Contains(seen, "reader") {
		t.Fatalf("bytes or the peers seen (%v) differ", seen)
	}
}
