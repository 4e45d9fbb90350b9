package metaserver

import (
	"crypto/tls"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/atoll-run/atoll/internal/devcert"
	"github.com/atoll-run/atoll/store/meta"
)

// A cluster over mutual TLS serves its client API over mutual TLS: a client with a
// certificate of the cluster's CA and the token writes and reads; a client without a
// certificate, with another CA's, distrusting the head's, or with the wrong token is told
// which, at once (ErrUnauthenticated, not retried).
func TestClusterAndClientAPIOverMutualTLS(t *testing.T) {
	ca, err := devcert.NewCA("cluster")
	if err != nil {
		t.Fatal(err)
	}
	other, err := devcert.NewCA("other")
	if err != nil {
		t.Fatal(err)
	}
	headTLS, err := ca.MutualConfig("head", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	c, _, ctx := startTestCluster(t, func(cfg *ClusterConfig) { cfg.TCP, cfg.TLS = true, headTLS })
	urls := map[uint64]string{}
	for id, r := range c.Replicas {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := NewHTTPServer(&Handler{Replica: r, SM: c.SMs[id], Token: "tok", Logger: zaptest.NewLogger(t)}, headTLS)
		go srv.ServeTLS(ln, "", "")
		defer srv.Close()
		urls[id] = "https://" + ln.Addr().String()
	}
	client := func(tlsCfg *tls.Config, token string) *meta.Client {
		conns := map[uint64]meta.Conn{}
		for id, u := range urls {
			conns[id] = meta.HTTPConn{BaseURL: u, Token: token, HTTP: meta.NewHTTPClient(tlsCfg, 4)}
		}
		cl, err := meta.NewClient(meta.DefaultClientConfig(), conns)
		if err != nil {
			t.Fatal(err)
		}
		return cl
	}
	driverTLS, _ := ca.MutualConfig("driver")
	cl := client(driverTLS, "tok")
	if _, err := cl.Put(ctx, meta.TableJobs.Key("j"), []byte("v")); err != nil {
		t.Fatalf("put over mutual TLS: %v", err)
	}
	if kv, ok, err := cl.Get(ctx, meta.TableJobs.Key("j")); err != nil || !ok || string(kv.Value) != "v" {
		t.Fatalf("get over mutual TLS: %+v %v %v", kv, ok, err)
	}

	foreign, _ := other.MutualConfig("driver")
	foreignCert := driverTLS.Clone()
	foreignCert.Certificates = foreign.Certificates
	distrust := driverTLS.Clone()
	distrust.RootCAs = other.Pool
	for _, tc := range []struct {
		name  string
		tls   *tls.Config
		token string
		want  string
	}{
		{"no-client-certificate", &tls.Config{RootCAs: ca.Pool, MinVersion: tls.VersionTLS13}, "tok", "refused this client's TLS session"},
		{"certificate-of-another-ca", foreignCert, "tok", "refused this client's TLS session"},
		{"distrusts-the-head", distrust, "tok", "failed verification"},
		{"wrong-token", driverTLS, "nope", "refused this client's token"},
	} {
		start := time.Now()
		_, err := client(tc.tls, tc.token).Put(ctx, meta.TableJobs.Key("x"), nil)
		if !errors.Is(err, meta.ErrUnauthenticated) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want meta.ErrUnauthenticated saying %q", tc.name, err, tc.want)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("%s: retried for %v", tc.name, d)
		}
	}
}
