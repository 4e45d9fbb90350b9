package store

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"time"
)

// benchCA makes a throwaway CA and two certificates it signs (one for the
// serving process, one for the puller), valid for 127.0.0.1 for an hour: what
// the benchmark's mutual TLS runs on. Nothing is written to disk.
func benchCA() (server, client TLSPEM, err error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return server, client, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "atoll bench CA"},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return server, client, err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return server, client, err
	}
	caPEM := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}))
	issue := func(serial int64, name string) (TLSPEM, error) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return TLSPEM{}, err
		}
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: now.Add(-time.Minute), NotAfter: now.Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
			IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			return TLSPEM{}, err
		}
		kder, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			return TLSPEM{}, err
		}
		return TLSPEM{CA: caPEM, Cert: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})),
			Key: string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}))}, nil
	}
	if server, err = issue(2, "bench server"); err != nil {
		return server, client, fmt.Errorf("benchstore: server certificate: %w", err)
	}
	if client, err = issue(3, "bench client"); err != nil {
		return server, client, fmt.Errorf("benchstore: client certificate: %w", err)
	}
	return server, client, nil
}
