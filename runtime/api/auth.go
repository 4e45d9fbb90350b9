package api

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// Credentials: what the heads say about a caller, mint for a launch, and revoke
// (runtime/authz decides; these are the wire types).

// WhoAmI answers GET /v1/whoami: the caller's principal as the head authenticated it, and
// the link key of the cluster's process links (actor remote, collectives, transfer plane),
// which every principal of the cluster proves on them.
type WhoAmI struct {
	Principal string `json:"principal"`
	LinkKey   string `json:"link_key"`
	// TokenID is the id of the scoped token the caller used ("" for the cluster token).
	TokenID string `json:"token_id,omitempty"`
	// GossipKey (hex) and DashboardToken are what an agent with a scoped credential needs
	// of the cluster secret: the membership gossip's key and the read-only token its
	// /metrics takes. Given to admin, heads and agents only.
	GossipKey      string `json:"gossip_key,omitempty"`
	DashboardToken string `json:"dashboard_token,omitempty"`
}

// TokenReview asks the heads who a bearer token names (POST /v1/tokens/review): an agent
// with a scoped credential holds no cluster secret to check tokens with.
type TokenReview struct {
	Token string `json:"token"`
}

// TokenReviewAnswer is the heads' answer: Error says why the token is not valid (expired,
// revoked, ended with its job, not of this cluster), else Principal is who it names.
type TokenReviewAnswer struct {
	Principal string    `json:"principal,omitempty"`
	TokenID   string    `json:"token_id,omitempty"`
	Expires   time.Time `json:"expires,omitzero"`
	JobBound  bool      `json:"job_bound,omitempty"`
	Error     string    `json:"error,omitempty"`
}

// TokenRequest asks a head for a credential for a process an agent launches
// (POST /v1/tokens): a worker (Principal worker/<job>/<gang>/<rank>) or a submitted driver
// (driver/<job>) placed on the agent's machine. The token ends with its job.
type TokenRequest struct {
	Principal string `json:"principal"`
	// Gang and Rank name the gang member a submitted driver runs as (a gang whose spec
	// says Driver); a worker's principal names its own.
	Gang string `json:"gang,omitempty"`
	Rank int    `json:"rank,omitempty"`
}

// TokenReply is a minted credential.
type TokenReply struct {
	Token   string    `json:"token"`
	ID      string    `json:"id"`
	Expires time.Time `json:"expires,omitempty"`
}

// Revocation is a revoked credential's record (auth/revoked/<id>), committed through the
// log so that every head refuses it (POST /v1/tokens/revoke, admin only).
type Revocation struct {
	ID        string    `json:"id"`
	Principal string    `json:"principal,omitempty"`
	Reason    string    `json:"reason,omitempty"`
	By        string    `json:"by,omitempty"`
	Time      time.Time `json:"time"`
}

// RevokedPrefix is where revocations are kept.
const RevokedPrefix = TableAuth + "revoked/"

// RevokedKey is a revoked credential's key.
func RevokedKey(id string) string { return RevokedPrefix + id }

// CheckBounds implements the API's bounds (a 400 naming the field).
func (r *Revocation) CheckBounds() error {
	if r.ID == "" || len(r.ID) > 64 || strings.ContainsAny(r.ID, "/ ") {
		return fmt.Errorf("%w: revocation: id %q: want 1 to 64 characters, no '/' or space", ErrInvalid, r.ID)
	}
	if len(r.Principal) > 256 || len(r.Reason) > MaxTextBytes {
		return fmt.Errorf("%w: revocation: principal or reason too long", ErrInvalid)
	}
	return nil
}

// WhoAmI asks the heads who this client's credential names, with the keys its role is
// given (GET /v1/whoami).
func (c *Client) WhoAmI(ctx context.Context) (WhoAmI, error) {
	var who WhoAmI
	err := c.Do(ctx, http.MethodGet, "/v1/whoami", nil, &who)
	return who, err
}

// ReviewToken asks the heads who a bearer token names (POST /v1/tokens/review). A token
// the heads refuse is an answer with Error set, not an error.
func (c *Client) ReviewToken(ctx context.Context, token string) (TokenReviewAnswer, error) {
	var a TokenReviewAnswer
	err := c.Do(ctx, http.MethodPost, "/v1/tokens/review", TokenReview{Token: token}, &a)
	return a, err
}
