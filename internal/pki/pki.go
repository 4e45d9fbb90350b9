// Package pki is the cluster's certificate authority and the mutual TLS configurations of
// its links. `atoll init` (and `atoll up`) create the CA: an ECDSA P-256 key and a
// self-signed certificate in the cluster's directory; every process (head, agent, worker,
// driver) holds a certificate of its own signed by it. The leader head signs a certificate
// for each worker an agent starts (POST /v1/certs with a CSR, on an authenticated link).
//
// Every certificate names the same DNS name, ServerName, and every client asks for it: a
// peer is authenticated by its chain to the cluster CA (and, inside the TLS link, by the
// cluster token), not by its host name, so a process is reached at any address (loopback,
// a container's name, a worker's random port) without certificates per address.
//
// What a peer may do is named by its certificate's Grant: a URI (a subject alternative
// name) that runtime/authz reads as a role and its scope ("atoll:driver/train"), and an
// expiry no later than the credential it was issued for. This package signs and reads
// grants; it does not interpret them.
package pki

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"
)

// ServerName is the DNS name every certificate of a cluster carries and every client
// verifies.
const ServerName = "atoll.cluster"

// File names in a TLS directory.
const (
	CACertFile = "ca.crt"
	CAKeyFile  = "ca.key"
	CertFile   = "cert.crt"
	KeyFile    = "cert.key"
)

// Lifetimes.
const (
	caLifetime   = 10 * 365 * 24 * time.Hour
	certLifetime = 365 * 24 * time.Hour
)

// ErrKeyMode: a private key file others may read.
var ErrKeyMode = errors.New("pki: private key readable by others")

// CA is a cluster's certificate authority.
type CA struct {
	Cert    *x509.Certificate
	CertPEM []byte
	// Bundle is every CA certificate the cluster trusts (PEM): during a rotation the
	// other CA's too (LoadCA reads them from ca.crt); nil means CertPEM alone.
	Bundle []byte
	key    *ecdsa.PrivateKey
}

// TrustPEM is what a process issued a certificate by this CA is to trust: Bundle, or the
// CA's own certificate.
func (ca *CA) TrustPEM() []byte {
	if len(ca.Bundle) > 0 {
		return ca.Bundle
	}
	return ca.CertPEM
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	return n
}

// NewCA makes a CA named for the cluster.
func NewCA(cluster string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: "atoll cluster CA " + cluster},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(caLifetime),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, _ := x509.ParseCertificate(der)
	return &CA{Cert: cert, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), key: key}, nil
}

func keyPEM(k *ecdsa.PrivateKey) ([]byte, error) {
	b, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: b}), nil
}

// Save writes the CA's certificate (ca.crt, 0644) and key (ca.key, 0600) into dir.
func (ca *CA) Save(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	kp, err := keyPEM(ca.key)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, CACertFile), ca.CertPEM, 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, CAKeyFile), kp, 0o600)
}

// readKey reads a private key file, refusing one that others may read.
func readKey(path string) ([]byte, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("%w: %s has mode %v (chmod 600)", ErrKeyMode, path, st.Mode().Perm())
	}
	return os.ReadFile(path)
}

// LoadCA reads a CA (ca.crt and ca.key) from dir; the key must be the certificate's.
func LoadCA(dir string) (*CA, error) {
	certPEM, err := os.ReadFile(filepath.Join(dir, CACertFile))
	if err != nil {
		return nil, fmt.Errorf("pki: the cluster CA: %w", err)
	}
	kp, err := readKey(filepath.Join(dir, CAKeyFile))
	if err != nil {
		return nil, err
	}
	ca, err := parseCA(dir, certPEM, kp)
	if err != nil {
		return nil, err
	}
	if ca.Bundle, err = JoinBundle(certPEM); err != nil {
		return nil, fmt.Errorf("pki: %s: %w", filepath.Join(dir, CACertFile), err)
	}
	return ca, nil
}

func parseCA(dir string, certPEM, kp []byte) (*CA, error) {
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(kp)
	if cb == nil || kb == nil {
		return nil, fmt.Errorf("pki: %s: not PEM", dir)
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("pki: %s: %w", filepath.Join(dir, CACertFile), err)
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("pki: %s: %w", filepath.Join(dir, CAKeyFile), err)
	}
	if pub, ok := cert.PublicKey.(*ecdsa.PublicKey); !ok || !pub.Equal(&key.PublicKey) {
		return nil, fmt.Errorf("pki: %s: the CA key is not the CA certificate's (a rotation in progress?)", dir)
	}
	return &CA{Cert: cert, CertPEM: pem.EncodeToMemory(cb), key: key}, nil
}

// Grant is what a certificate grants its holder beyond its chain to the cluster CA.
type Grant struct {
	// URI names the holder's role and scope, carried as a URI subject alternative name
	// (runtime/authz writes and reads it); "" grants nothing.
	URI string
	// NotAfter ends the certificate before its default lifetime (a year): the expiry of
	// the credential it was issued for. Zero: the default.
	NotAfter time.Time
}

func (ca *CA) sign(name string, pub any, g Grant, hosts ...string) ([]byte, error) {
	notAfter := time.Now().Add(certLifetime)
	if !g.NotAfter.IsZero() && g.NotAfter.Before(notAfter) {
		notAfter = g.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: notAfter,
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:    []string{ServerName},
	}
	if g.URI != "" {
		u, err := url.Parse(g.URI)
		if err != nil {
			return nil, fmt.Errorf("pki: grant %q: %w", g.URI, err)
		}
		tmpl.URIs = []*url.URL{u}
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" && h != ServerName {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, pub, ca.key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}

// Issue makes a key and a certificate for a process named name (server and client use).
// Hosts (IP addresses or DNS names) are added to ServerName, for clients that check the
// host they dialed (a browser on a head's dashboard).
func (ca *CA) Issue(name string, hosts ...string) (certPEM, keyPEMBytes []byte, err error) {
	return ca.IssueGrant(name, Grant{}, hosts...)
}

// IssueGrant is Issue for a certificate that carries a grant.
func (ca *CA) IssueGrant(name string, g Grant, hosts ...string) (certPEM, keyPEMBytes []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	certPEM, err = ca.sign(name, &key.PublicKey, g, hosts...)
	if err != nil {
		return nil, nil, err
	}
	kp, err := keyPEM(key)
	return certPEM, kp, err
}

// SignCSR signs a certificate request (PEM) for a process named name; the request's own
// subject is ignored.
func (ca *CA) SignCSR(csrPEM []byte, name string) ([]byte, error) {
	return ca.SignCSRGrant(csrPEM, name, Grant{})
}

// SignCSRGrant is SignCSR for a certificate that carries a grant (the request's own
// extensions are ignored too). Hosts (IP addresses or DNS names) are added to ServerName,
// as Issue adds them.
func (ca *CA) SignCSRGrant(csrPEM []byte, name string, g Grant, hosts ...string) ([]byte, error) {
	b, _ := pem.Decode(csrPEM)
	if b == nil || b.Type != "CERTIFICATE REQUEST" {
		return nil, errors.New("pki: not a PEM certificate request")
	}
	csr, err := x509.ParseCertificateRequest(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("pki: certificate request: %w", err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("pki: certificate request: %w", err)
	}
	return ca.sign(name, csr.PublicKey, g, hosts...)
}

// NewCSR makes a key and a certificate request for it.
func NewCSR(name string) (csrPEM, keyPEMBytes []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: name}}, key)
	if err != nil {
		return nil, nil, err
	}
	kp, err := keyPEM(key)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), kp, err
}

// WriteIdentity writes a TLS directory: ca.crt, cert.crt and cert.key (0600).
func WriteIdentity(dir string, caPEM, certPEM, keyPEMBytes []byte) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, CACertFile), caPEM, 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, CertFile), certPEM, 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, KeyFile), keyPEMBytes, 0o600)
}

// Identity is a process's certificate and the cluster CAs it trusts. Both can change
// while the process runs (a rotation of the cluster CA: SetTrust, SetCert): the TLS
// configurations it hands out (Server, Client, BootstrapServer) read the current ones at
// every handshake, so a listener or a pooled dialer made before a change follows it
// without being rebuilt.
//
// Chains are checked by the configurations' VerifyConnection against the current trust
// (Go's own verification reads pools fixed when a configuration is made): a handshake
// whose peer's chain does not verify fails, so a completed connection's
// PeerCertificates[0] is a verified certificate (PeerCert).
type Identity struct {
	cur atomic.Pointer[material]
}

// material is what an Identity holds at one time.
type material struct {
	caPEM []byte
	pool  *x509.CertPool
	cert  tls.Certificate
	leaf  *x509.Certificate
}

// NewIdentity builds an identity from PEM bytes: caPEM holds one or more CA certificates
// (a trust bundle).
func NewIdentity(caPEM, certPEM, keyPEMBytes []byte) (*Identity, error) {
	cert, err := tls.X509KeyPair(certPEM, keyPEMBytes)
	if err != nil {
		return nil, fmt.Errorf("pki: certificate and key: %w", err)
	}
	return IdentityOf(caPEM, cert)
}

// IdentityOf builds an identity from a trust bundle and a certificate with its key.
func IdentityOf(caPEM []byte, cert tls.Certificate) (*Identity, error) {
	pool, err := bundlePool(caPEM)
	if err != nil {
		return nil, err
	}
	m, err := withCert(&material{caPEM: caPEM, pool: pool}, cert)
	if err != nil {
		return nil, err
	}
	id := &Identity{}
	id.cur.Store(m)
	return id, nil
}

func bundlePool(caPEM []byte) (*x509.CertPool, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("pki: the CA certificate is not PEM")
	}
	return pool, nil
}

func withCert(m *material, cert tls.Certificate) (*material, error) {
	if len(cert.Certificate) == 0 {
		return nil, errors.New("pki: an empty certificate")
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("pki: certificate: %w", err)
	}
	n := *m
	n.cert, n.leaf = cert, leaf
	return &n, nil
}

// LoadIdentity reads a TLS directory (ca.crt, cert.crt, cert.key with mode 0600).
func LoadIdentity(dir string) (*Identity, error) {
	caPEM, err := os.ReadFile(filepath.Join(dir, CACertFile))
	if err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	certPEM, err := os.ReadFile(filepath.Join(dir, CertFile))
	if err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	kp, err := readKey(filepath.Join(dir, KeyFile))
	if err != nil {
		return nil, err
	}
	return NewIdentity(caPEM, certPEM, kp)
}

// TrustPEM returns the CA certificates this identity trusts now (PEM, one or more).
func (id *Identity) TrustPEM() []byte { return id.cur.Load().caPEM }

// Certificate returns this process's certificate and key now.
func (id *Identity) Certificate() tls.Certificate { return id.cur.Load().cert }

// Leaf returns this process's certificate now, parsed.
func (id *Identity) Leaf() *x509.Certificate { return id.cur.Load().leaf }

// SetTrust replaces the CA certificates this identity trusts (a bundle of one or more);
// handshakes from then on verify peers against them.
func (id *Identity) SetTrust(caPEM []byte) error {
	pool, err := bundlePool(caPEM)
	if err != nil {
		return err
	}
	for {
		old := id.cur.Load()
		n := *old
		n.caPEM, n.pool = append([]byte(nil), caPEM...), pool
		if id.cur.CompareAndSwap(old, &n) {
			return nil
		}
	}
}

// SetCert replaces this process's certificate (a renewal); handshakes from then on
// present it.
func (id *Identity) SetCert(cert tls.Certificate) error {
	for {
		old := id.cur.Load()
		n, err := withCert(old, cert)
		if err != nil {
			return err
		}
		if id.cur.CompareAndSwap(old, n) {
			return nil
		}
	}
}

// SignedBy reports whether this process's certificate was signed by ca.
func (id *Identity) SignedBy(ca *x509.Certificate) bool {
	return ca != nil && id.Leaf().CheckSignatureFrom(ca) == nil
}

// Verify checks a peer's chain (leaf first) against the CAs trusted now: the leaf must
// name ServerName, as every certificate of a cluster does.
func (id *Identity) Verify(chain []*x509.Certificate) error {
	if len(chain) == 0 {
		return errors.New("pki: the peer presented no certificate")
	}
	m := id.cur.Load()
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	if _, err := chain[0].Verify(x509.VerifyOptions{Roots: m.pool, Intermediates: inter, DNSName: ServerName,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return fmt.Errorf("pki: the peer's certificate %q: %w", chain[0].Subject.CommonName, err)
	}
	return nil
}

// config is the configuration every link of this identity uses, as a server or as a
// client: TLS 1.3, the current certificate presented, the peer's chain verified against
// the current trust (a server asks for a client certificate as auth says).
func (id *Identity) config(auth tls.ClientAuthType) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13, ServerName: ServerName, ClientAuth: auth,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			c := id.Certificate()
			return &c, nil
		},
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			c := id.Certificate()
			return &c, nil
		},
		// Verification is ours (VerifyConnection), against the trust of the moment.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				// A server that does not require a client certificate (BootstrapServer);
				// a client always gets the server's (TLS requires it).
				return nil
			}
			return id.Verify(cs.PeerCertificates)
		},
	}
}

// Server is the configuration of a listener: TLS 1.3, a client certificate from the
// cluster CA required. It also dials (as the Paxos transport does with one
// configuration), verifying the server the same way.
func (id *Identity) Server() *tls.Config { return id.config(tls.RequireAnyClientCert) }

// Client is the configuration of a dialer: TLS 1.3, this process's certificate, the
// server's checked against the cluster CA for ServerName.
func (id *Identity) Client() *tls.Config { return id.config(tls.RequireAnyClientCert) }

// SelfVerifying reports whether a configuration verifies peers itself, as an Identity's do
// (VerifyConnection against the current CAs), rather than through RootCAs and ClientCAs.
func SelfVerifying(c *tls.Config) bool { return c.VerifyConnection != nil && c.InsecureSkipVerify }

// RequireClientCert makes a listener's configuration require a verified client
// certificate: one of an Identity's (whose VerifyConnection verifies) must get one,
// any other has Go verify it against ClientCAs. Packages that force mutual TLS on the
// configuration they are given call it.
func RequireClientCert(c *tls.Config) {
	if SelfVerifying(c) {
		c.ClientAuth = tls.RequireAnyClientCert
		return
	}
	c.ClientAuth = tls.RequireAndVerifyClientCert
}

// IssueIdentity makes an identity for a process named name, signed by this CA (a head's
// own: it holds the CA), valid also for hosts (see Issue).
func (ca *CA) IssueIdentity(name string, hosts ...string) (*Identity, error) {
	return ca.IssueIdentityGrant(name, Grant{}, hosts...)
}

// IssueIdentityGrant is IssueIdentity for a certificate that carries a grant.
func (ca *CA) IssueIdentityGrant(name string, g Grant, hosts ...string) (*Identity, error) {
	certPEM, kp, err := ca.IssueGrant(name, g, hosts...)
	if err != nil {
		return nil, err
	}
	return NewIdentity(ca.TrustPEM(), certPEM, kp)
}

// BootstrapServer is the configuration of a listener that also admits a client without a
// certificate (the head API, where a process holding the token asks for its certificate):
// a certificate given is verified against the cluster CA, and the handler refuses every
// other request that came without one.
func (id *Identity) BootstrapServer() *tls.Config { return id.config(tls.RequestClientCert) }

// Trust is the configuration of a dialer that has no certificate yet: it checks the
// server's against the cluster CA (caPEM) and presents none.
func Trust(caPEM []byte) (*tls.Config, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("pki: the CA certificate is not PEM")
	}
	return &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: pool, ServerName: ServerName}, nil
}

// ReadCACert reads a cluster CA certificate file (ca.crt) and checks that it is one.
func ReadCACert(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("pki: the cluster CA certificate: %w", err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("pki: %s: not a PEM certificate", path)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("pki: %s: %w", path, err)
	}
	if !c.IsCA {
		return nil, fmt.Errorf("pki: %s: not a CA certificate", path)
	}
	return b, nil
}

// Verified reports whether a TLS connection state carries a client certificate verified
// against the cluster CA, and the name it was issued to.
func Verified(st *tls.ConnectionState) (string, bool) {
	c := PeerCert(st)
	if c == nil {
		return "", false
	}
	return c.Subject.CommonName, true
}

// PeerCert returns the client certificate of a TLS connection state verified against the
// cluster CA, or nil when there is none: the first of a chain Go verified, or, on a
// connection of an Identity's configuration (which verifies in VerifyConnection and
// fails the handshake otherwise), the peer's certificate.
func PeerCert(st *tls.ConnectionState) *x509.Certificate {
	if st == nil {
		return nil
	}
	if len(st.VerifiedChains) > 0 && len(st.VerifiedChains[0]) > 0 {
		return st.VerifiedChains[0][0]
	}
	if len(st.PeerCertificates) > 0 {
		return st.PeerCertificates[0]
	}
	return nil
}

// GrantOf returns the grant URI a certificate carries ("" for none): the first URI
// subject alternative name of scheme "atoll".
func GrantOf(c *x509.Certificate) string {
	if c == nil {
		return ""
	}
	for _, u := range c.URIs {
		if u.Scheme == "atoll" {
			return u.String()
		}
	}
	return ""
}

// ValidName checks a process name for a certificate: 1 to 128 characters of letters,
// digits and ". _ - / :".
func ValidName(name string) error {
	if name == "" || len(name) > 128 {
		return fmt.Errorf("pki: certificate name %q: want 1 to 128 characters", name)
	}
	for _, r := range name {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '_', r == '-', r == '/', r == ':':
		default:
			return fmt.Errorf("pki: certificate name %q: character %q is not one of letters, digits and . _ - / :", name, r)
		}
	}
	return nil
}

// Files of a CA directory that a rotation of the cluster CA adds (see Rotate*): next.crt
// and next.key hold the CA that will sign once activated. Throughout a rotation ca.crt
// holds every CA the cluster trusts, the one that signs (ca.key's) first, so every
// process that reads ca.crt trusts them all.
const (
	NextCertFile = "next.crt"
	NextKeyFile  = "next.key"
)

// The phases of a rotation of the cluster CA, as a CA directory's files say.
const (
	// PhaseSteady: one CA signs and is trusted.
	PhaseSteady = "steady"
	// PhaseAdded: a new CA is trusted beside the one that signs (RotateAdd); processes
	// learn to trust it before anyone presents a certificate it signed.
	PhaseAdded = "added"
	// PhaseActivated: the new CA signs and the old one is still trusted
	// (RotateActivate); processes renew their certificates.
	PhaseActivated = "activated"
)

// ErrRotation: a rotation step that does not follow from the CA directory's phase.
var ErrRotation = errors.New("pki: CA rotation")

// RotationPhase reads a CA directory's phase.
func RotationPhase(dir string) (string, error) {
	_, err := os.Stat(filepath.Join(dir, NextCertFile))
	switch {
	case err == nil:
		return PhaseAdded, nil
	case !errors.Is(err, os.ErrNotExist):
		return "", fmt.Errorf("pki: %w", err)
	}
	b, err := TrustBundle(dir)
	if err != nil {
		return "", err
	}
	if n := bytes.Count(b, []byte("-----BEGIN CERTIFICATE-----")); n > 1 {
		return PhaseActivated, nil
	}
	return PhaseSteady, nil
}

// TrustBundle reads the CA certificates a CA directory's cluster trusts: every one in
// ca.crt (PEM, each once).
func TrustBundle(dir string) ([]byte, error) {
	b, err := os.ReadFile(filepath.Join(dir, CACertFile))
	if err != nil {
		return nil, fmt.Errorf("pki: the cluster CA: %w", err)
	}
	return JoinBundle(b)
}

// JoinBundle joins PEM bundles of CA certificates, each certificate once, in order;
// anything that is not a certificate is an error.
func JoinBundle(bundles ...[]byte) ([]byte, error) {
	var out []byte
	seen := map[string]bool{}
	for _, b := range bundles {
		for len(b) > 0 {
			var blk *pem.Block
			blk, b = pem.Decode(b)
			if blk == nil {
				break
			}
			if blk.Type != "CERTIFICATE" {
				return nil, fmt.Errorf("pki: a trust bundle holds a %s, not only certificates", blk.Type)
			}
			if _, err := x509.ParseCertificate(blk.Bytes); err != nil {
				return nil, fmt.Errorf("pki: a trust bundle's certificate: %w", err)
			}
			if !seen[string(blk.Bytes)] {
				seen[string(blk.Bytes)] = true
				out = append(out, pem.EncodeToMemory(blk)...)
			}
		}
	}
	if len(out) == 0 {
		return nil, errors.New("pki: an empty trust bundle")
	}
	return out, nil
}

// writeAtomic writes a file whole or not at all (a temporary file renamed), so that a
// head reading the directory meanwhile sees the old content or the new.
func writeAtomic(path string, b []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, mode); err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("pki: %w", err)
	}
	return nil
}

// RotateAdd begins a rotation of the cluster CA in dir: a new CA for the same cluster
// (next.crt, next.key) that every process is to trust beside the current one (ca.crt
// holds both, the current one first), while the current one still signs. It returns the
// new CA.
func RotateAdd(dir string) (*CA, error) {
	cur, err := LoadCA(dir)
	if err != nil {
		return nil, err
	}
	if ph, err := RotationPhase(dir); err != nil {
		return nil, err
	} else if ph != PhaseSteady {
		return nil, fmt.Errorf("%w: %s is in phase %q: finish that rotation first", ErrRotation, dir, ph)
	}
	next, err := NewCA(strings.TrimPrefix(cur.Cert.Subject.CommonName, "atoll cluster CA "))
	if err != nil {
		return nil, err
	}
	kp, err := keyPEM(next.key)
	if err != nil {
		return nil, err
	}
	both, err := JoinBundle(cur.CertPEM, next.CertPEM)
	if err != nil {
		return nil, err
	}
	if err := writeAtomic(filepath.Join(dir, NextKeyFile), kp, 0o600); err != nil {
		return nil, err
	}
	if err := writeAtomic(filepath.Join(dir, CACertFile), both, 0o644); err != nil {
		return nil, err
	}
	// next.crt last: its presence is the phase.
	if err := writeAtomic(filepath.Join(dir, NextCertFile), next.CertPEM, 0o644); err != nil {
		return nil, err
	}
	return next, nil
}

// RotateActivate makes the new CA of a rotation the one that signs (ca.key, and first in
// ca.crt); the old one stays trusted until RotateFinish. It returns the new signing CA.
func RotateActivate(dir string) (*CA, error) {
	if ph, err := RotationPhase(dir); err != nil {
		return nil, err
	} else if ph != PhaseAdded {
		return nil, fmt.Errorf("%w: %s is in phase %q, not %q: run the add step first", ErrRotation, dir, ph, PhaseAdded)
	}
	old, err := LoadCA(dir)
	if err != nil {
		return nil, err
	}
	nextPEM, err := os.ReadFile(filepath.Join(dir, NextCertFile))
	if err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	nextKey, err := readKey(filepath.Join(dir, NextKeyFile))
	if err != nil {
		return nil, err
	}
	next, err := parseCA(dir, nextPEM, nextKey)
	if err != nil {
		return nil, err
	}
	both, err := JoinBundle(next.CertPEM, old.CertPEM)
	if err != nil {
		return nil, err
	}
	// Two files change: a reader that sees the key of one CA with the other first in
	// ca.crt (LoadCA refuses the pair) reads again later; both stay trusted throughout.
	if err := writeAtomic(filepath.Join(dir, CAKeyFile), nextKey, 0o600); err != nil {
		return nil, err
	}
	if err := writeAtomic(filepath.Join(dir, CACertFile), both, 0o644); err != nil {
		return nil, err
	}
	for _, f := range []string{NextCertFile, NextKeyFile} {
		if err := os.Remove(filepath.Join(dir, f)); err != nil {
			return nil, fmt.Errorf("pki: %w", err)
		}
	}
	return next, nil
}

// RotateFinish ends a rotation: only the CA that signs stays in ca.crt, and a certificate
// the old one signed is refused from then on.
func RotateFinish(dir string) error {
	if ph, err := RotationPhase(dir); err != nil {
		return err
	} else if ph != PhaseActivated {
		return fmt.Errorf("%w: %s is in phase %q, not %q: activate the new CA first", ErrRotation, dir, ph, PhaseActivated)
	}
	ca, err := LoadCA(dir)
	if err != nil {
		return err
	}
	return writeAtomic(filepath.Join(dir, CACertFile), ca.CertPEM, 0o644)
}

// ParseBundle returns the certificates of a PEM bundle (those that parse).
func ParseBundle(b []byte) []*x509.Certificate {
	var out []*x509.Certificate
	for len(b) > 0 {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			break
		}
		if c, err := x509.ParseCertificate(blk.Bytes); err == nil && blk.Type == "CERTIFICATE" {
			out = append(out, c)
		}
	}
	return out
}
