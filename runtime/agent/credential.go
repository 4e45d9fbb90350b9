package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/runtime/authz"
	"github.com/atoll-run/atoll/runtime/member"
)

// An agent runs with the cluster token or with a scoped credential of its own machine
// (`atoll token create --role agent --machine NAME`). With the cluster token it derives
// the keys it needs from it. With a scoped one it holds no cluster secret: the heads give
// it the keys of its role (GET /v1/whoami: the link key of actor links and the transfer
// plane, the gossip key, the dashboard's read-only token), and it asks them who the
// bearer tokens of its callers name (POST /v1/tokens/review, cached). A stolen agent
// credential then acts as that machine's agent, not as admin.

// keys are what the agent uses of the cluster secret.
type keys struct {
	link      []byte // actor links and the transfer plane (authz.LinkKey)
	gossip    []byte // serf's encryption key (member.GossipKey)
	dashboard string // the read-only token /metrics takes
	admin     string // the cluster token ("" with a scoped credential)
}

// agentKeys derives the keys from the cluster token, or asks the heads for them when the
// agent's token is a scoped credential, which must be this machine's agent's.
func agentKeys(ctx context.Context, cfg Config, client *api.Client) (keys, error) {
	tok := string(cfg.Token)
	if !authz.IsScopedToken(tok) {
		return derivedKeys(cfg.Token), nil
	}
	who, err := client.WhoAmI(ctx)
	if err != nil {
		return keys{}, fmt.Errorf("its credential: %w", err)
	}
	if want := authz.Agent(cfg.Name).String(); who.Principal != want {
		return keys{}, fmt.Errorf("%w: its credential is %s's, and this agent is %s (atoll token create --role agent --machine %s)",
			authz.ErrForbidden, who.Principal, want, cfg.Name)
	}
	g, err := hex.DecodeString(who.GossipKey)
	if err != nil || len(g) != 32 || who.LinkKey == "" || who.DashboardToken == "" {
		return keys{}, fmt.Errorf("%w: the heads gave %s no gossip key, link key or dashboard token", api.ErrInvalid, who.Principal)
	}
	return keys{link: []byte(who.LinkKey), gossip: g, dashboard: who.DashboardToken}, nil
}

// derivedKeys are the keys of the cluster token.
func derivedKeys(token []byte) keys {
	return keys{link: authz.LinkKey(token), gossip: member.GossipKey(token), dashboard: api.DashboardToken(token), admin: string(token)}
}

// How long a review is kept: a valid token's for reviewTTL (a revocation still takes
// effect within the agent's own 5 s: authz.Authenticator checks it again), a refused
// one's for refusedTTL; at most reviewsKept of them.
const (
	reviewTTL   = 30 * time.Second
	refusedTTL  = 2 * time.Second
	reviewsKept = 10_000
)

type reviewed struct {
	id    authz.Identity
	err   error
	until time.Time
}

// reviews caches the heads' token reviews by the token's hash.
type reviews struct {
	mu sync.Mutex
	m  map[[32]byte]reviewed
}

// review says who a bearer token names, as the heads do (authz.Authenticator.Review).
func (a *Agent) review(bearer string) (authz.Identity, error) {
	k := sha256.Sum256([]byte(bearer))
	now := time.Now()
	a.reviews.mu.Lock()
	r, ok := a.reviews.m[k]
	a.reviews.mu.Unlock()
	if ok && now.Before(r.until) {
		return r.id, r.err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ans, err := a.client.ReviewToken(ctx, bearer)
	if err != nil { // not cached: the next request asks again (a 503: the caller retries)
		return authz.Identity{}, fmt.Errorf("%w: the heads could not review the caller's token: %v", api.ErrUnavailable, err)
	}
	r = reviewed{until: now.Add(reviewTTL)}
	if ans.Error != "" {
		r.err = fmt.Errorf("%w: %s", authz.ErrUnauthenticated, strings.TrimPrefix(ans.Error, "unauthenticated: "))
		r.until = now.Add(refusedTTL)
	} else if p, perr := authz.ParsePrincipal(ans.Principal); perr != nil {
		r.err = fmt.Errorf("%w: the heads' review names %q: %v", authz.ErrUnauthenticated, ans.Principal, perr)
		r.until = now.Add(refusedTTL)
	} else {
		r.id = authz.Identity{Principal: p, TokenID: ans.TokenID, Expires: ans.Expires, JobBound: ans.JobBound}
	}
	a.reviews.mu.Lock()
	if a.reviews.m == nil || len(a.reviews.m) >= reviewsKept {
		a.reviews.m = map[[32]byte]reviewed{}
	}
	a.reviews.m[k] = r
	a.reviews.mu.Unlock()
	return r.id, r.err
}

// authenticator is the API's: with the cluster secret, or through the heads' reviews.
func (a *Agent) authenticator() *authz.Authenticator {
	if a.keys.admin != "" || a.client == nil {
		return &authz.Authenticator{Secret: a.cfg.Token, Revoked: a.state.Revoked}
	}
	return &authz.Authenticator{Review: a.review, Revoked: a.state.Revoked}
}
