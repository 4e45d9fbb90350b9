package authz

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/atoll-run/atoll/store/meta"
)

// Sentinel errors.
var (
	// ErrForbidden: the principal may not do this (HTTP 403). A *Denied wraps it. It is
	// the log client's own (a read or a transaction refused by a head is this error too).
	ErrForbidden = meta.ErrForbidden
	// ErrUnauthenticated: no valid credential (HTTP 401).
	ErrUnauthenticated = errors.New("unauthenticated")
	// ErrPrincipal: a principal's text does not parse.
	ErrPrincipal = errors.New("authz: bad principal")
)

// Role is what kind of process a principal is.
type Role string

// The roles.
const (
	RoleAdmin  Role = "admin"
	RoleHead   Role = "head"
	RoleAgent  Role = "agent"
	RoleDriver Role = "driver"
	RoleWorker Role = "worker"
)

// Roles lists the roles in the order the table shows them.
func Roles() []Role { return []Role{RoleAdmin, RoleHead, RoleAgent, RoleDriver, RoleWorker} }

// Principal is who makes a request: a role and its scope.
type Principal struct {
	Role Role
	// Machine is an agent's machine.
	Machine string
	// Job is a driver's or a worker's job; Gang and Rank a worker's place in it.
	Job  string
	Gang string
	Rank int
}

// AnyMachine is the machine of an agent credential for every machine ("agent/*"): what a
// DaemonSet's agents share, as Kubernetes' bootstrap tokens are shared by kubelets. It
// acts as the agent of any one machine and nothing more: with it an agent gets a
// certificate of its own machine (agent/<name>), which then names it on every link.
const AnyMachine = "*"

// Covers reports whether p may act as q: p is q, or p is agent/* and q one machine's agent.
func (p Principal) Covers(q Principal) bool {
	if p == q {
		return true
	}
	return p.Role == RoleAgent && p.Machine == AnyMachine && q.Role == RoleAgent && q.Machine != "" && q.Machine != AnyMachine
}

// Admin is the operator's principal.
func Admin() Principal { return Principal{Role: RoleAdmin} }

// Head is a head's principal.
func Head() Principal { return Principal{Role: RoleHead} }

// Agent is the principal of a machine's agent.
func Agent(machine string) Principal { return Principal{Role: RoleAgent, Machine: machine} }

// Driver is the principal of a driver of one job.
func Driver(job string) Principal { return Principal{Role: RoleDriver, Job: job} }

// Worker is the principal of one worker of a gang.
func Worker(job, gang string, rank int) Principal {
	return Principal{Role: RoleWorker, Job: job, Gang: gang, Rank: rank}
}

// String is the principal's text: "admin", "head", "agent/<machine>", "driver/<job>",
// "worker/<job>/<gang>/<rank>".
func (p Principal) String() string {
	switch p.Role {
	case RoleAgent:
		return "agent/" + p.Machine
	case RoleDriver:
		return "driver/" + p.Job
	case RoleWorker:
		return fmt.Sprintf("worker/%s/%s/%d", p.Job, p.Gang, p.Rank)
	}
	return string(p.Role)
}

// IsZero reports whether p names nobody.
func (p Principal) IsZero() bool { return p.Role == "" }

// Privileged reports whether p acts for the whole cluster (admin, a head, an agent): it is
// not confined to one job.
func (p Principal) Privileged() bool {
	return p.Role == RoleAdmin || p.Role == RoleHead || p.Role == RoleAgent
}

// ParsePrincipal reads a principal's text (String's form).
func ParsePrincipal(s string) (Principal, error) {
	parts := strings.Split(s, "/")
	bad := func(why string) (Principal, error) {
		return Principal{}, fmt.Errorf("%w: %q: %s", ErrPrincipal, s, why)
	}
	for _, x := range parts[1:] {
		if x == AnyMachine && len(parts) == 2 && Role(parts[0]) == RoleAgent {
			continue // agent/*: see AnyMachine
		}
		if err := checkScopeName(x); err != nil {
			return bad(err.Error())
		}
	}
	switch Role(parts[0]) {
	case RoleAdmin, RoleHead:
		if len(parts) != 1 {
			return bad("admin and head have no scope")
		}
		return Principal{Role: Role(parts[0])}, nil
	case RoleAgent:
		if len(parts) != 2 {
			return bad("want agent/<machine>")
		}
		return Agent(parts[1]), nil
	case RoleDriver:
		if len(parts) != 2 {
			return bad("want driver/<job>")
		}
		return Driver(parts[1]), nil
	case RoleWorker:
		if len(parts) != 4 {
			return bad("want worker/<job>/<gang>/<rank>")
		}
		r, err := strconv.Atoi(parts[3])
		if err != nil || r < 0 || strconv.Itoa(r) != parts[3] {
			return bad("the rank is not a whole number >= 0")
		}
		return Worker(parts[1], parts[2], r), nil
	}
	return bad("the role is not one of admin, head, agent, driver, worker")
}

// checkScopeName checks a machine, job or gang name: 1 to 128 characters of
// [A-Za-z0-9._-], not "." or "..". (The heads check jobs and gangs more strictly.)
func checkScopeName(s string) error {
	if s == "" || len(s) > 128 || s == "." || s == ".." {
		return fmt.Errorf("name %q: want 1 to 128 characters of [A-Za-z0-9._-]", s)
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return fmt.Errorf("name %q: character %q is not one of [A-Za-z0-9._-]", s, r)
		}
	}
	return nil
}

// grantScheme is the URI scheme of a certificate's grant.
const grantScheme = "atoll"

// Grant is the URI a certificate carries for a principal (pki.Grant.URI): "atoll:<principal>",
// with the id of the token it was issued for, if any ("?tid=ID"), and whether it ends with
// its job ("&jb=1").
func Grant(p Principal, tokenID string, jobBound bool) string {
	q := url.Values{}
	if tokenID != "" {
		q.Set("tid", tokenID)
	}
	if jobBound {
		q.Set("jb", "1")
	}
	u := url.URL{Scheme: grantScheme, Opaque: p.String(), RawQuery: q.Encode()}
	return u.String()
}

// GrantInfo is what a certificate's grant says.
type GrantInfo struct {
	Principal Principal
	TokenID   string
	JobBound  bool
}

// ParseGrant reads a grant URI ("" is no grant: ok false).
func ParseGrant(uri string) (g GrantInfo, ok bool, err error) {
	if uri == "" {
		return GrantInfo{}, false, nil
	}
	u, err := url.Parse(uri)
	if err != nil || u.Scheme != grantScheme || u.Opaque == "" {
		return GrantInfo{}, false, fmt.Errorf("%w: grant %q: want atoll:<principal>", ErrPrincipal, uri)
	}
	p, err := ParsePrincipal(u.Opaque)
	if err != nil {
		return GrantInfo{}, false, err
	}
	q := u.Query()
	return GrantInfo{Principal: p, TokenID: q.Get("tid"), JobBound: q.Get("jb") == "1"}, true, nil
}
