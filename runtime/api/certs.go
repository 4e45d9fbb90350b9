package api

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/atoll-run/atoll/internal/pki"
)

// CertRequest asks a head to sign a certificate for a process (POST /v1/certs, with a
// token): Name names the process (its certificate's subject), CSR is a PEM certificate
// request. Principal is the principal the certificate grants (runtime/authz): "" for the
// token's own (admin for the cluster token); a scoped token gets a certificate for its
// own principal only, the cluster token one for any.
type CertRequest struct {
	Name      string `json:"name"`
	CSR       string `json:"csr"`
	Principal string `json:"principal,omitempty"`
	// Hosts are the IP addresses and DNS names a server is reached at (an agent's listen
	// and advertised hosts), named in its certificate beside pki.ServerName so that a
	// client checking the host it dialed (curl --cacert) verifies it. Only an agent's
	// certificate names hosts, at most MaxCertHosts.
	Hosts []string `json:"hosts,omitempty"`
}

// MaxCertHosts bounds CertRequest.Hosts.
const MaxCertHosts = 16

// CertReply is the signed certificate and the cluster CA's, both PEM, and the principal
// the certificate grants.
type CertReply struct {
	Cert      string `json:"cert"`
	CA        string `json:"ca"`
	Principal string `json:"principal,omitempty"`
}

// Secure reports whether the heads are reached over TLS (every URL https); a mix of
// http and https is refused.
func Secure(heads []string) (bool, error) {
	n := 0
	for _, h := range heads {
		if strings.HasPrefix(h, "https://") {
			n++
		}
	}
	if n != 0 && n != len(heads) {
		return false, fmt.Errorf("%w: the heads' addresses mix http and https: %v", ErrInvalid, heads)
	}
	return n > 0, nil
}

// RequestIdentity gets this process a certificate of the cluster: it makes a key and a
// certificate request, sends it with the token to the first head that answers (over TLS
// that checks the head against the CA certificate caPEM, without a client certificate),
// and returns the identity for mutual TLS on every later link. The private key never
// leaves this process. It retries until ctx ends.
func RequestIdentity(ctx context.Context, heads []string, token string, caPEM []byte, name string) (*pki.Identity, error) {
	return RequestIdentityAs(ctx, heads, token, caPEM, name, "")
}

// RequestIdentityAs is RequestIdentity for a certificate that grants principal (see
// CertRequest.Principal) and names hosts (see CertRequest.Hosts).
func RequestIdentityAs(ctx context.Context, heads []string, token string, caPEM []byte, name, principal string, hosts ...string) (*pki.Identity, error) {
	if err := pki.ValidName(name); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	trust, err := pki.Trust(caPEM)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	csr, key, err := pki.NewCSR(name)
	if err != nil {
		return nil, err
	}
	body, _ := json.Marshal(CertRequest{Name: name, CSR: string(csr), Principal: principal, Hosts: hosts})
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = trust
	hc := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	defer tr.CloseIdleConnections()
	var last error
	for attempt := 0; ; attempt++ {
		for _, h := range heads {
			u, perr := url.Parse(h)
			if perr != nil || u.Scheme != "https" {
				return nil, fmt.Errorf("%w: head %q: a certificate is asked for over https only", ErrInvalid, h)
			}
			req, rerr := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(h, "/")+"/v1/certs", bytes.NewReader(body))
			if rerr != nil {
				return nil, rerr
			}
			req.Header.Set("Authorization", "Bearer "+token)
			req.Header.Set("Content-Type", "application/json")
			resp, derr := hc.Do(req)
			if derr != nil {
				last = fmt.Errorf("%s: %w", h, derr)
				continue
			}
			data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				var eb ErrorBody
				_ = json.Unmarshal(data, &eb)
				err := errorFromBody(eb, resp.StatusCode)
				if resp.StatusCode == http.StatusUnauthorized {
					return nil, fmt.Errorf("%w: %s refused the cluster token when asked for a certificate (is this the right token file?)", ErrUnauthenticated, h)
				}
				if errors.Is(err, ErrInvalid) || errors.Is(err, ErrForbidden) {
					return nil, err
				}
				last = fmt.Errorf("%s: %w", h, err)
				continue
			}
			var rep CertReply
			if err := json.Unmarshal(data, &rep); err != nil {
				return nil, fmt.Errorf("api: decode the certificate from %s: %w", h, err)
			}
			// Trust the CA we were given, not the one the head sent back.
			return pki.NewIdentity(caPEM, []byte(rep.Cert), key)
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%w: no head signed a certificate for %s: %v (last: %v)", ErrUnavailable, name, ctx.Err(), last)
		}
		select {
		case <-ctx.Done():
		case <-time.After(min(time.Duration(attempt+1)*50*time.Millisecond, time.Second)):
		}
	}
}

// TrustInfo answers GET /v1/trust: the cluster CAs as the answering head reads them, for
// processes that follow a rotation of the cluster CA (KeepIdentity).
type TrustInfo struct {
	// Bundle is every CA certificate the cluster trusts now (PEM).
	Bundle string `json:"bundle"`
	// Signing is the CA certificate that signs new certificates (PEM).
	Signing string `json:"signing"`
	// Phase is the rotation's phase: steady, added or activated (see internal/pki).
	Phase string `json:"phase"`
	// Tag is TrustTag(Bundle, Signing): what a process that follows the CA acts on. The
	// agents' load reports carry the answering head's (LoadAnswer.Trust).
	Tag string `json:"tag"`
	// Stale lists the callers this head saw, within the last StaleWindow, present a
	// certificate that the signing CA did not sign: processes that have not renewed yet.
	Stale []StaleCert `json:"stale"`
}

// StaleCert is a caller seen with a certificate of a CA other than the signing one.
type StaleCert struct {
	Name      string    `json:"name"`
	Principal string    `json:"principal"`
	LastSeen  time.Time `json:"last_seen"`
}

// StaleWindow is how long a head remembers a caller seen with a certificate of another CA.
const StaleWindow = time.Minute

// Trust asks a head for the cluster's CAs (GET /v1/trust).
func (c *Client) Trust(ctx context.Context) (TrustInfo, error) {
	var ti TrustInfo
	err := c.Do(ctx, http.MethodGet, "/v1/trust", nil, &ti)
	return ti, err
}

// Renewal is what a process asked its certificate with (RequestIdentityAs's arguments), to
// ask again when the cluster CA changes.
type Renewal struct {
	Heads     []string
	Token     string
	Name      string
	Principal string
	Hosts     []string
}

// TrustPoll is how often a process asks the heads for the cluster's CAs (KeepIdentity).
const TrustPoll = 5 * time.Second

// TrustHintedPoll is how often a process that hears the heads' trust tag on another
// call's answers (FollowIdentity's hints: an agent's load reports) asks for the CAs all
// the same. At 2,000 machines the agents' polls every TrustPoll were 400 requests a
// second to the leader, about as many as their load reports, and 14% of a hollow
// agents' process's CPU (parsing the bundle and checking a signature each time).
const TrustHintedPoll = 2 * time.Minute

// TrustTag names a trust bundle and a signing CA (PEM): two heads with the same CA
// answer the same tag, and a rotation's every step changes it.
func TrustTag(bundle, signing string) string {
	h := sha256.New()
	h.Write([]byte(bundle))
	h.Write([]byte{0})
	h.Write([]byte(signing))
	return hex.EncodeToString(h.Sum(nil)[:12])
}

// KeepIdentity follows a rotation of the cluster CA for a process's identity until ctx
// ends: every `every` (TrustPoll when zero) it asks a head for the cluster's CAs over c
// (GET /v1/trust); when the bundle changed it trusts the new one, and when its own
// certificate was not signed by the signing CA it asks for a new one as it asked for the
// first (POST /v1/certs with its token) and presents it from then on. Links made before
// follow: the identity's TLS configurations read the current trust and certificate at
// every handshake. A failed round is logged and tried again next time.
func KeepIdentity(ctx context.Context, c *Client, id *pki.Identity, r Renewal, every time.Duration, log *zap.Logger) {
	FollowIdentity(ctx, c, id, r, every, nil, log)
}

// FollowIdentity is KeepIdentity for a process that hears the heads' trust tag
// (TrustInfo.Tag) on hints, from the answers of calls it makes anyway (an agent's load
// reports, LoadAnswer.Trust): it asks for the CAs at once when a tag differs from the one
// it last followed, and once it has heard a tag, on its own only every TrustHintedPoll (or
// `every`, if longer). Until then, and from heads that send no tag (""), it polls every
// `every`. A round that fails is tried again at the next differing hint or poll.
func FollowIdentity(ctx context.Context, c *Client, id *pki.Identity, r Renewal, every time.Duration, hints <-chan string, log *zap.Logger) {
	if every <= 0 {
		every = TrustPoll
	}
	if log == nil {
		log = zap.NewNop()
	}
	period := every
	t := time.NewTimer(period)
	defer t.Stop()
	followed := "" // the tag of the last round that succeeded
	for {
		select {
		case <-ctx.Done():
			return
		case tag := <-hints:
			if tag == "" {
				continue
			}
			if hinted := max(every, TrustHintedPoll); period != hinted {
				period = hinted
				t.Reset(period)
			}
			if tag == followed {
				continue
			}
		case <-t.C:
		}
		before := id.Leaf()
		tag, err := followTrust(ctx, c, id, r)
		switch {
		case err != nil && ctx.Err() == nil:
			log.Warn("cluster CA: following its rotation failed (tried again)", zap.String("name", r.Name), zap.Error(err))
		case err == nil && id.Leaf() != before:
			log.Info("cluster CA: certificate renewed", zap.String("name", r.Name), zap.String("issuer", id.Leaf().Issuer.CommonName))
		}
		if err == nil {
			followed = tag
		}
		t.Reset(period)
	}
}

// FollowTrust is one round of KeepIdentity.
func FollowTrust(ctx context.Context, c *Client, id *pki.Identity, r Renewal) error {
	_, err := followTrust(ctx, c, id, r)
	return err
}

// followTrust is FollowTrust; it returns the tag of the CAs it followed.
func followTrust(ctx context.Context, c *Client, id *pki.Identity, r Renewal) (string, error) {
	ti, err := c.Trust(ctx)
	if err != nil {
		return "", err
	}
	if ti.Bundle != string(id.TrustPEM()) {
		if err := id.SetTrust([]byte(ti.Bundle)); err != nil {
			return "", fmt.Errorf("the trust bundle from the heads: %w", err)
		}
	}
	blk, _ := pem.Decode([]byte(ti.Signing))
	if blk == nil {
		return "", errors.New("the heads named no signing CA")
	}
	signing, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return "", fmt.Errorf("the signing CA from the heads: %w", err)
	}
	if id.SignedBy(signing) {
		return ti.Tag, nil
	}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	nid, err := RequestIdentityAs(rctx, r.Heads, r.Token, id.TrustPEM(), r.Name, r.Principal, r.Hosts...)
	if err != nil {
		return "", fmt.Errorf("renewing %s's certificate: %w", r.Name, err)
	}
	if !nid.SignedBy(signing) {
		// A head that had not yet read the rotation signed it: next round asks again.
		return "", fmt.Errorf("renewing %s's certificate: signed by %q, not the signing CA %q yet", r.Name, nid.Leaf().Issuer.CommonName, signing.Subject.CommonName)
	}
	return ti.Tag, id.SetCert(nid.Certificate())
}
