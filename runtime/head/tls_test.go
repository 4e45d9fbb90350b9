package head

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/atoll-run/atoll/internal/freeport"
	"github.com/atoll-run/atoll/internal/pki"
	"github.com/atoll-run/atoll/runtime/api"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	addrs, err := freeport.Addrs("127.0.0.1", 1) // below the ephemeral range: see freeport
	if err != nil {
		t.Fatal(err)
	}
	return addrs[0]
}

// A head with the cluster CA serves its API over mutual TLS: a process with the token gets a
// certificate (POST /v1/certs), then talks; without a certificate, with another cluster's,
// without the token or in clear, it is refused.
func TestHeadAPIIsMutualTLS(t *testing.T) {
	ca, err := pki.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	h, err := Start(Config{ID: 1, Peers: map[uint64]string{1: freeAddr(t)}, DataDir: t.TempDir(), NoSync: true, Token: testToken,
		CA: ca, HTTP2: true, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if !strings.HasPrefix(h.Address(), "https://") {
		t.Fatalf("address %s: want https", h.Address())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	heads := []string{h.Address()}

	// The token gets a certificate; the certificate gets the API.
	id, err := api.RequestIdentity(ctx, heads, string(testToken), ca.CertPEM, "worker/j/g/0.g0")
	if err != nil {
		t.Fatal(err)
	}
	if name := id.Leaf().Subject.CommonName; name != "worker/j/g/0.g0" {
		t.Fatalf("certificate for %q", name)
	}
	c, err := api.NewClient(ctx, api.ClientConfig{Heads: heads, Token: string(testToken), TLS: id.Client()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Status(ctx); err != nil {
		t.Fatal(err)
	}
	// With HTTP2 it offers HTTP/2: a process's requests share one connection (apiTLS).
	h2 := id.Client()
	h2.NextProtos = []string{"h2", "http/1.1"}
	conn, err := tls.Dial("tcp", strings.TrimPrefix(h.Address(), "https://"), h2)
	if err != nil {
		t.Fatal(err)
	}
	if p := conn.ConnectionState().NegotiatedProtocol; p != "h2" {
		t.Fatalf("negotiated %q, want h2", p)
	}
	conn.Close()

	// The wrong token gets no certificate.
	if _, err := api.RequestIdentity(ctx, heads, "not-the-cluster-token-xx", ca.CertPEM, "intruder"); !errors.Is(err, api.ErrUnauthenticated) {
		t.Fatalf("wrong token: %v, want ErrUnauthenticated", err)
	}
	// A head of another CA is not trusted.
	other, _ := pki.NewCA("other")
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	if _, err := api.RequestIdentity(short, heads, string(testToken), other.CertPEM, "w"); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("a head of another CA: %v, want a certificate error", err)
	}
	cancelShort()
	// A bad request and a bad name are refused as invalid.
	if _, err := api.RequestIdentity(ctx, heads, string(testToken), ca.CertPEM, "../x y"); !errors.Is(err, api.ErrInvalid) {
		t.Fatalf("bad name: %v, want ErrInvalid", err)
	}

	// An agent's certificate names the hosts it is reached at (a client that checks the
	// host it dialed verifies it); no other principal's does, and a host must be one.
	aid, err := api.RequestIdentityAs(ctx, heads, string(testToken), ca.CertPEM, "agent/node-0", "agent/node-0", "localhost", "127.0.0.1", "10.1.2.3", "node-0.example")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(aid.Certificate().Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"127.0.0.1", "10.1.2.3", "node-0.example", "localhost", pki.ServerName} {
		if err := leaf.VerifyHostname(h); err != nil {
			t.Errorf("the agent's certificate does not name %s: %v", h, err)
		}
	}
	for _, tc := range []struct{ principal, host, why string }{
		{"worker/j/g/0", "127.0.0.1", "only an agent"}, {"agent/node-0", "a b", "neither"}, {"agent/node-0", "-x.example", "neither"},
	} {
		_, err := api.RequestIdentityAs(ctx, heads, string(testToken), ca.CertPEM, "x", tc.principal, tc.host)
		if !errors.Is(err, api.ErrInvalid) || !strings.Contains(err.Error(), tc.why) {
			t.Errorf("a certificate of %s naming %q: %v, want ErrInvalid saying %q", tc.principal, tc.host, err, tc.why)
		}
	}

	// The token alone, over server-checked TLS, reaches nothing but /v1/certs.
	trust, _ := pki.Trust(ca.CertPEM)
	tokenOnly, err := api.NewClient(short, api.ClientConfig{Heads: heads, Token: string(testToken), TLS: trust})
	if err == nil {
		_, err = tokenOnly.Status(ctx)
	}
	if err == nil {
		t.Fatal("a client without a certificate was served")
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, h.Address()+"/v1/status", nil)
	req.Header.Set("Authorization", "Bearer "+string(testToken))
	resp, err := (&http.Client{Transport: &http.Transport{TLSClientConfig: trust}}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("no client certificate: %d, want 401", resp.StatusCode)
	}
	// Another cluster's certificate fails the handshake (or, as Go's client sends none that
	// the head's CA did not issue, is refused as no certificate).
	oid, _ := other.IssueIdentity("intruder")
	cfg := trust.Clone()
	ocert := oid.Certificate()
	cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &ocert, nil }
	req, _ = http.NewRequestWithContext(ctx, http.MethodGet, h.Address()+"/v1/status", nil)
	req.Header.Set("Authorization", "Bearer "+string(testToken))
	if resp, err := (&http.Client{Transport: &http.Transport{TLSClientConfig: cfg}}).Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("another cluster's certificate was served: %d", resp.StatusCode)
	}
	// Clear HTTP to the TLS port is not served.
	plain := "http://" + strings.TrimPrefix(h.Address(), "https://")
	req, _ = http.NewRequestWithContext(ctx, http.MethodGet, plain+"/v1/status", nil)
	req.Header.Set("Authorization", "Bearer "+string(testToken))
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Fatal("clear HTTP was served")
		}
	}
}
