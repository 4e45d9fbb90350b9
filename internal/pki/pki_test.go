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
