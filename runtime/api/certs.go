package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

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
