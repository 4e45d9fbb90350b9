package pki

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
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
	noCert := &tls.Config{RootCAs: server.Pool, ServerName: ServerName, MinVersion: tls.VersionTLS13}
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
