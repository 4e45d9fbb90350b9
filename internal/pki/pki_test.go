package pki

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestMutualTLSWithTheClusterCA(t *testing.T) {
	dir := t.TempDir()
	ca, err := NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.Save(dir); err != nil {
		t.Fatal(err)
	}
	loaded, err := LoadCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := loaded.Issue("head-1")
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteIdentity(filepath.Join(dir, "head-1"), ca.CertPEM, certPEM, keyPEM); err != nil {
		t.Fatal(err)
	}
	server, err := LoadIdentity(filepath.Join(dir, "head-1"))
	if err != nil {
		t.Fatal(err)
	}
	csr, wkey, err := NewCSR("worker")
	if err != nil {
		t.Fatal(err)
	}
	wcert, err := ca.SignCSR(csr, "job/gang/0.g0")
	if err != nil {
		t.Fatal(err)
	}
	client, err := NewIdentity(ca.CertPEM, wcert, wkey)
	if err != nil {
		t.Fatal(err)
	}
	other, _ := NewCA("another cluster")
	ocert, okey, _ := other.Issue("intruder")
	intruder, _ := NewIdentity(other.CertPEM, ocert, okey)

	ln, err := tls.Listen("tcp", "127.0.0.1:0", server.Server())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	dial := func(cfg *tls.Config) error {
		c, err := tls.Dial("tcp", ln.Addr().String(), cfg)
		if err != nil {
			return err
		}
		defer c.Close()
		if _, err := c.Write([]byte("x")); err != nil {
			return err
		}
		b := make([]byte, 1)
		_, err = io.ReadFull(c, b)
		return err
	}
	if err := dial(client.Client()); err != nil {
		t.Fatalf("a cluster member: %v", err)
	}
	if err := dial(intruder.Client()); err == nil {
		t.Fatal("a certificate of another CA was accepted")
	}
	noCert, err := Trust(server.TrustPEM())
	if err != nil {
		t.Fatal(err)
	}
	if err := dial(noCert); err == nil {
		t.Fatal("a client without a certificate was accepted")
	}
	// A key others could read is refused.
	_ = os.Chmod(filepath.Join(dir, "head-1", KeyFile), 0o644)
	if _, err := LoadIdentity(filepath.Join(dir, "head-1")); !errors.Is(err, ErrKeyMode) {
		t.Fatalf("a world-readable key: %v", err)
	}
	if _, err := ca.SignCSR([]byte("not a csr"), "x"); err == nil {
		t.Fatal("a garbage CSR was signed")
	}
	_ = net.IPv4len
}

// TestGrant: a certificate carries its grant's URI, and no longer than its grant's expiry.
func TestGrant(t *testing.T) {
	ca, err := NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	end := time.Now().Add(2 * time.Hour).Truncate(time.Second)
	csr, _, err := NewCSR("asked-for")
	if err != nil {
		t.Fatal(err)
	}
	certPEM, err := ca.SignCSRGrant(csr, "driver/x", Grant{URI: "atoll:driver/x?tid=ab", NotAfter: end})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := pem.Decode(certPEM)
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if got := GrantOf(c); got != "atoll:driver/x?tid=ab" {
		t.Errorf("grant %q", got)
	}
	if !c.NotAfter.Equal(end) {
		t.Errorf("NotAfter %v, want %v", c.NotAfter, end)
	}
	plain, _, _ := ca.Issue("head-1")
	b, _ = pem.Decode(plain)
	pc, _ := x509.ParseCertificate(b.Bytes)
	if GrantOf(pc) != "" || pc.NotAfter.Before(time.Now().Add(300*24*time.Hour)) {
		t.Errorf("a certificate without a grant: %q, %v", GrantOf(pc), pc.NotAfter)
	}
	if PeerCert(nil) != nil || PeerCert(&tls.ConnectionState{}) != nil {
		t.Error("PeerCert of no chain")
	}
}

// echoServer serves echo over TLS with cfg until the test ends, and dials it.
func echoServer(t *testing.T, cfg *tls.Config) func(*tls.Config) error {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	return func(cfg *tls.Config) error {
		c, err := tls.Dial("tcp", ln.Addr().String(), cfg)
		if err != nil {
			return err
		}
		defer c.Close()
		if _, err := c.Write([]byte("x")); err != nil {
			return err
		}
		_, err = io.ReadFull(c, make([]byte, 1))
		return err
	}
}

// TestRotationWithoutRestarts rotates a CA directory through its three steps while one
// listener and one client configuration, made before it began, stay in use: every step
// keeps the old and the new connecting, and only the end refuses the old CA's certificates.
func TestRotationWithoutRestarts(t *testing.T) {
	dir := t.TempDir()
	ca, err := NewCA("rot")
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.Save(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := RotateActivate(dir); !errors.Is(err, ErrRotation) {
		t.Fatalf("activate before add: %v", err)
	}
	if err := RotateFinish(dir); !errors.Is(err, ErrRotation) {
		t.Fatalf("finish before add: %v", err)
	}
	server, _ := ca.IssueIdentity("head-1")
	client, _ := ca.IssueIdentity("agent/a")
	serverCfg, clientCfg := server.Server(), client.Client() // made once, used throughout
	dial := echoServer(t, serverCfg)
	if err := dial(clientCfg); err != nil {
		t.Fatalf("before the rotation: %v", err)
	}
	follow := func(ids ...*Identity) {
		t.Helper()
		b, err := TrustBundle(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range ids {
			if err := id.SetTrust(b); err != nil {
				t.Fatal(err)
			}
		}
	}

	// Add: the new CA is trusted; a process already holding one of its certificates (a
	// process started now) and the old ones all connect.
	next, err := RotateAdd(dir)
	if err != nil {
		t.Fatal(err)
	}
	if ph, _ := RotationPhase(dir); ph != PhaseAdded {
		t.Fatalf("phase %q after add", ph)
	}
	if _, err := RotateAdd(dir); !errors.Is(err, ErrRotation) {
		t.Fatalf("a second add: %v", err)
	}
	if signing, err := LoadCA(dir); err != nil || !signing.Cert.Equal(ca.Cert) {
		t.Fatalf("the old CA must still sign after add (%v)", err)
	}
	follow(server, client)
	fresh, _ := next.IssueIdentity("driver/j")
	if err := fresh.SetTrust(client.TrustPEM()); err != nil {
		t.Fatal(err)
	}
	if err := dial(fresh.Client()); err != nil {
		t.Fatalf("a certificate of the new CA after add: %v", err)
	}
	if err := dial(clientCfg); err != nil {
		t.Fatalf("the old certificate after add: %v", err)
	}

	// Activate: the new CA signs; the server renews, the client has not yet.
	signing, err := RotateActivate(dir)
	if err != nil {
		t.Fatal(err)
	}
	if loaded, err := LoadCA(dir); err != nil || !loaded.Cert.Equal(next.Cert) || !signing.Cert.Equal(next.Cert) {
		t.Fatalf("the new CA must sign after activate (%v)", err)
	}
	follow(server, client)
	renewed, _ := signing.IssueIdentity("head-1")
	if err := server.SetCert(renewed.Certificate()); err != nil {
		t.Fatal(err)
	}
	if !server.SignedBy(next.Cert) || client.SignedBy(next.Cert) {
		t.Fatal("SignedBy does not tell the renewed certificate from the old")
	}
	if err := dial(clientCfg); err != nil {
		t.Fatalf("an old certificate against a renewed server after activate: %v", err)
	}

	// Finish: the old CA is trusted no more; the client's old certificate is refused until
	// it renews, on the same configuration.
	if err := RotateFinish(dir); err != nil {
		t.Fatal(err)
	}
	if ph, _ := RotationPhase(dir); ph != PhaseSteady {
		t.Fatalf("phase %q after finish", ph)
	}
	follow(server, client)
	if err := dial(clientCfg); err == nil {
		t.Fatal("a certificate of the retired CA was accepted after finish")
	}
	cr, _ := signing.IssueIdentity("agent/a")
	if err := client.SetCert(cr.Certificate()); err != nil {
		t.Fatal(err)
	}
	if err := dial(clientCfg); err != nil {
		t.Fatalf("the renewed client after finish: %v", err)
	}
	// A dialer that trusts only the retired CA cannot verify the server any more.
	stale, _ := ca.IssueIdentity("agent/b")
	if err := dial(stale.Client()); err == nil {
		t.Fatal("a client trusting only the retired CA verified the renewed server")
	}
}

func TestLoadCARefusesAMismatchedKey(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	ca1, _ := NewCA("x")
	ca2, _ := NewCA("x")
	if err := ca1.Save(a); err != nil {
		t.Fatal(err)
	}
	if err := ca2.Save(b); err != nil {
		t.Fatal(err)
	}
	key, _ := os.ReadFile(filepath.Join(b, CAKeyFile))
	if err := os.WriteFile(filepath.Join(a, CAKeyFile), key, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadCA(a); err == nil {
		t.Fatal("a CA key of another certificate was loaded")
	}
	if _, err := JoinBundle([]byte("-----BEGIN EC PRIVATE KEY-----\nAAAA\n-----END EC PRIVATE KEY-----\n")); err == nil {
		t.Fatal("a key was taken into a trust bundle")
	}
}
