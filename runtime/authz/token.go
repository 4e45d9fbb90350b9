package authz

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// A scoped token is a bearer credential for one principal, made and checked with the
// cluster secret (the heads and the agents hold it; the token's holder does not): the
// claims in base64url JSON, and their HMAC-SHA256 under a key derived from the secret.
//
//	atoll1.<claims>.<mac>
//
// It expires (Claims.Expires), or ends with its job (Claims.JobBound: a worker's or a
// submitted driver's, made when it is launched), and it can be revoked by id: the heads
// keep the revoked ids in the log (auth/revoked/<id>), so every head refuses the same ones.

const tokenPrefix = "atoll1."

// Claims are what a scoped token says.
type Claims struct {
	// ID names the token (for revocation): 16 random hex digits.
	ID string `json:"id"`
	// Principal is whom the token stands for (Principal.String).
	Principal string `json:"p"`
	// Issued and Expires are Unix seconds; Expires 0: no time limit.
	Issued  int64 `json:"iat"`
	Expires int64 `json:"exp,omitempty"`
	// JobBound: the token ends when its principal's job stops (or is gone).
	JobBound bool `json:"jb,omitempty"`
}

// ExpiresAt is the expiry as a time (zero: none).
func (c Claims) ExpiresAt() time.Time {
	if c.Expires == 0 {
		return time.Time{}
	}
	return time.Unix(c.Expires, 0)
}

// NewTokenID is a fresh token id.
func NewTokenID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// derive is a key for one purpose, derived from the cluster secret.
func derive(secret []byte, purpose string) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(purpose))
	return m.Sum(nil)
}

// LinkKey is the secret of the links between a cluster's processes (actor remote, the
// collective plane, the transfer plane), derived from the cluster secret: every process
// proves it on those links, and it opens no route of a head or an agent. Under mutual TLS
// each link also checks the peer's certificate (LinkAdmits, Decide).
func LinkKey(secret []byte) []byte {
	return []byte(hex.EncodeToString(derive(secret, "atoll link key v1")))
}

// NewToken makes a scoped token for c (its ID filled in when empty, Issued when zero).
func NewToken(secret []byte, c Claims) (string, Claims, error) {
	if len(secret) < 16 {
		return "", Claims{}, fmt.Errorf("authz: the cluster secret has %d bytes, want at least 16", len(secret))
	}
	p, err := ParsePrincipal(c.Principal)
	if err != nil {
		return "", Claims{}, err
	}
	if p.Role == RoleAdmin {
		return "", Claims{}, fmt.Errorf("%w: no scoped token stands for admin (the cluster token does)", ErrPrincipal)
	}
	if c.ID == "" {
		c.ID = NewTokenID()
	}
	if c.Issued == 0 {
		c.Issued = time.Now().Unix()
	}
	b, err := json.Marshal(c)
	if err != nil {
		return "", Claims{}, err
	}
	body := tokenPrefix + base64.RawURLEncoding.EncodeToString(b)
	m := hmac.New(sha256.New, derive(secret, "atoll token v1"))
	m.Write([]byte(body))
	return body + "." + base64.RawURLEncoding.EncodeToString(m.Sum(nil)), c, nil
}

// IsScopedToken reports whether s has a scoped token's form (it is not checked).
func IsScopedToken(s string) bool { return strings.HasPrefix(s, tokenPrefix) }

// ParseToken checks a scoped token's MAC with the cluster secret and returns its claims and
// principal. It does not check expiry or revocation (Authenticator does).
func ParseToken(secret []byte, tok string) (Claims, Principal, error) {
	bad := func(why string) (Claims, Principal, error) {
		return Claims{}, Principal{}, fmt.Errorf("%w: scoped token: %s", ErrUnauthenticated, why)
	}
	if !IsScopedToken(tok) || len(tok) > 4096 {
		return bad("not a scoped token")
	}
	i := strings.LastIndexByte(tok, '.')
	body, sig := tok[:i], tok[i+1:]
	got, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil {
		return bad("malformed")
	}
	m := hmac.New(sha256.New, derive(secret, "atoll token v1"))
	m.Write([]byte(body))
	if !hmac.Equal(got, m.Sum(nil)) {
		return bad("not made with this cluster's secret")
	}
	raw, err := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(body, tokenPrefix))
	if err != nil {
		return bad("malformed claims")
	}
	var c Claims
	if err := json.Unmarshal(raw, &c); err != nil {
		return bad("malformed claims")
	}
	p, err := ParsePrincipal(c.Principal)
	if err != nil || p.Role == RoleAdmin {
		return bad("its principal " + c.Principal + " is not one a token may stand for")
	}
	return c, p, nil
}

// ReadClaims reads a scoped token's claims without checking its MAC: for the holder of a
// token (`atoll token revoke --token-file`), never for a decision.
func ReadClaims(tok string) (Claims, error) {
	if !IsScopedToken(tok) {
		return Claims{}, fmt.Errorf("%w: not a scoped token", ErrUnauthenticated)
	}
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return Claims{}, fmt.Errorf("%w: malformed scoped token", ErrUnauthenticated)
	}
	raw, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return Claims{}, fmt.Errorf("%w: malformed scoped token", ErrUnauthenticated)
	}
	var c Claims
	if err := json.Unmarshal(raw, &c); err != nil {
		return Claims{}, fmt.Errorf("%w: malformed scoped token", ErrUnauthenticated)
	}
	return c, nil
}
