package authz

import (
	"crypto/subtle"
	"crypto/tls"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/atoll-run/atoll/internal/pki"
)

// Authenticator turns a request's bearer token and TLS state into a principal. A head and
// an agent each hold one, with the cluster secret. Its methods are safe for concurrent use
// when its functions are.
type Authenticator struct {
	// Secret is the cluster token: its bearer is admin (unless a certificate grants less),
	// and it checks scoped tokens.
	Secret []byte
	// Review, when Secret is empty, says who a bearer token names (an agent with a scoped
	// credential asks the heads: POST /v1/tokens/review). Its identity's expiry,
	// revocation and job are checked again here.
	Review func(bearer string) (Identity, error)
	// Revoked reports whether a token id was revoked (nil: none is).
	Revoked func(id string) bool
	// JobEnded reports whether a job is stopped or gone, for job-bound credentials (nil:
	// none is known ended).
	JobEnded func(job string) bool
	// Now is the clock (default time.Now).
	Now func() time.Time

	// verified are scoped tokens whose MAC this authenticator checked, with their claims
	// (parse): a head hears each agent's token at every load report, and checking the MAC
	// and decoding the claims every time was 5% of a leader's CPU at 2,000 machines.
	// Expiry, revocation and the job are still checked at every request.
	verified  sync.Map // token → verifiedToken
	nVerified atomic.Int64
}

// verifiedToken is a scoped token's claims, its MAC checked.
type verifiedToken struct {
	c Claims
	p Principal
}

// maxVerified bounds the tokens an Authenticator remembers (forgotten all at once when
// full, as a head's checked certificates are).
const maxVerified = 1 << 14

// parse is ParseToken with the Authenticator's secret, remembering the tokens that pass.
func (a *Authenticator) parse(tok string) (Claims, Principal, error) {
	if v, ok := a.verified.Load(tok); ok {
		e := v.(verifiedToken)
		return e.c, e.p, nil
	}
	c, p, err := ParseToken(a.Secret, tok)
	if err != nil {
		return Claims{}, Principal{}, err
	}
	if a.nVerified.Add(1) > maxVerified {
		a.verified.Clear()
		a.nVerified.Store(1)
	}
	a.verified.Store(tok, verifiedToken{c, p})
	return c, p, nil
}

// Identity is an authenticated caller.
type Identity struct {
	Principal Principal
	// TokenID is the scoped token's id ("" for the cluster token).
	TokenID string
	// Certified says the principal comes from a client certificate's grant.
	Certified bool
	// Expires and JobBound are the scoped token's limits (a certificate made for it ends
	// with it).
	Expires  time.Time
	JobBound bool
}

// Authenticate checks a bearer token (the Authorization header without "Bearer ") and,
// when the request came over mutual TLS, its verified client certificate:
//   - the token must be the cluster token or a valid scoped token (not expired, revoked
//     or past its job);
//   - a certificate with a grant names the principal; with a scoped token the two must
//     name the same one (a token cannot widen a certificate, nor the other way), or the
//     token be agent/* and the certificate one machine's agent (it narrows the token);
//   - without a certificate, or one without a grant, the token names it: the cluster
//     token is admin.
func (a *Authenticator) Authenticate(bearer string, st *tls.ConnectionState) (Identity, error) {
	var id Identity
	switch {
	case bearer == "":
		return Identity{}, fmt.Errorf("%w: a token is required (the cluster token, or a scoped one)", ErrUnauthenticated)
	case len(a.Secret) == 0 && a.Review != nil:
		r, err := a.Review(bearer)
		if err != nil {
			return Identity{}, err
		}
		if err := a.live(r.TokenID, r.Expires, r.JobBound, r.Principal); err != nil {
			return Identity{}, err
		}
		id = Identity{Principal: r.Principal, TokenID: r.TokenID, Expires: r.Expires, JobBound: r.JobBound}
	case len(a.Secret) > 0 && subtle.ConstantTimeCompare([]byte(bearer), a.Secret) == 1:
		id.Principal = Admin()
	case IsScopedToken(bearer):
		c, p, err := a.parse(bearer)
		if err != nil {
			return Identity{}, err
		}
		if err := a.live(c.ID, c.ExpiresAt(), c.JobBound, p); err != nil {
			return Identity{}, err
		}
		id.Principal, id.TokenID, id.Expires, id.JobBound = p, c.ID, c.ExpiresAt(), c.JobBound
	default:
		return Identity{}, fmt.Errorf("%w: the token is neither the cluster token nor a scoped token of this cluster", ErrUnauthenticated)
	}
	cert := pki.PeerCert(st)
	g, ok, err := ParseGrant(pki.GrantOf(cert))
	if err != nil {
		return Identity{}, fmt.Errorf("%w: the client certificate: %v", ErrUnauthenticated, err)
	}
	if !ok {
		return id, nil
	}
	if err := a.live(g.TokenID, time.Time{}, g.JobBound, g.Principal); err != nil {
		return Identity{}, fmt.Errorf("the client certificate: %w", err)
	}
	if id.Principal.Role != RoleAdmin && !id.Principal.Covers(g.Principal) {
		return Identity{}, fmt.Errorf("%w: a certificate of %s with a token of %s", ErrUnauthenticated, g.Principal, id.Principal)
	}
	if id.TokenID == "" {
		id.TokenID, id.JobBound = g.TokenID, g.JobBound
	}
	id.Principal, id.Certified = g.Principal, true
	return id, nil
}

// live checks a credential's expiry, revocation and job.
func (a *Authenticator) live(tokenID string, expires time.Time, jobBound bool, p Principal) error {
	now := time.Now
	if a.Now != nil {
		now = a.Now
	}
	if !expires.IsZero() && !now().Before(expires) {
		return fmt.Errorf("%w: the credential of %s expired at %s", ErrUnauthenticated, p, expires.UTC().Format(time.RFC3339))
	}
	if tokenID != "" && a.Revoked != nil && a.Revoked(tokenID) {
		return fmt.Errorf("%w: the credential %s of %s was revoked", ErrUnauthenticated, tokenID, p)
	}
	if jobBound && p.Job != "" && a.JobEnded != nil && a.JobEnded(p.Job) {
		return fmt.Errorf("%w: the credential of %s ended with its job", ErrUnauthenticated, p)
	}
	return nil
}
