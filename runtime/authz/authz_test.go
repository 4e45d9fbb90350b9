package authz

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/atoll-run/atoll/internal/pki"
)

func TestPrincipalText(t *testing.T) {
	for _, p := range []Principal{Admin(), Head(), Agent("m-1"), Agent(AnyMachine), Driver("train"), Worker("train", "trainers", 3)} {
		got, err := ParsePrincipal(p.String())
		if err != nil || got != p {
			t.Errorf("ParsePrincipal(%q) = %v, %v", p, got, err)
		}
		g, ok, err := ParseGrant(Grant(p, "abc", true))
		if err != nil || !ok || g.Principal != p || g.TokenID != "abc" || !g.JobBound {
			t.Errorf("grant of %s: %+v %v %v", p, g, ok, err)
		}
	}
	for _, bad := range []string{"", "root", "admin/x", "agent", "agent/", "driver/a/b", "driver/../x", "worker/j/g", "worker/j/g/-1",
		"worker/j/g/01", "worker/j/g/x", "driver/a b", "agent/" + strings.Repeat("m", 129), "driver/*", "worker/*/g/0", "agent/*/x"} {
		if _, err := ParsePrincipal(bad); !errors.Is(err, ErrPrincipal) {
			t.Errorf("ParsePrincipal(%q): %v, want ErrPrincipal", bad, err)
		}
	}
	if _, ok, err := ParseGrant(""); ok || err != nil {
		t.Errorf("no grant: %v %v", ok, err)
	}
	if _, _, err := ParseGrant("https://driver/x"); err == nil {
		t.Error("a grant of another scheme was read")
	}
}

var secret = []byte("0123456789abcdef0123456789abcdef")

func TestScopedTokens(t *testing.T) {
	tok, c, err := NewToken(secret, Claims{Principal: "driver/train", Expires: time.Now().Add(time.Hour).Unix()})
	if err != nil {
		t.Fatal(err)
	}
	if c.ID == "" || c.Issued == 0 {
		t.Fatalf("claims not filled in: %+v", c)
	}
	got, p, err := ParseToken(secret, tok)
	if err != nil || p != Driver("train") || got != c {
		t.Fatalf("ParseToken: %+v %v %v", got, p, err)
	}
	if rc, err := ReadClaims(tok); err != nil || rc != c {
		t.Fatalf("ReadClaims: %+v %v", rc, err)
	}
	// Another cluster's secret, a changed claim, a changed MAC: all refused.
	if _, _, err := ParseToken([]byte("another cluster's secret 0123456"), tok); !errors.Is(err, ErrUnauthenticated) {
		t.Errorf("another secret: %v", err)
	}
	parts := strings.Split(tok, ".")
	forged, _, _ := NewToken([]byte("another cluster's secret 0123456"), Claims{Principal: "driver/other"})
	fparts := strings.Split(forged, ".")
	for _, bad := range []string{parts[0] + "." + fparts[1] + "." + parts[2], tok + "x", tok[:len(tok)-2], "atoll1.x", "atoll1.a.b.c"} {
		if _, _, err := ParseToken(secret, bad); !errors.Is(err, ErrUnauthenticated) {
			t.Errorf("ParseToken(%q): %v", bad, err)
		}
	}
	if _, _, err := NewToken(secret, Claims{Principal: "admin"}); err == nil {
		t.Error("a scoped token for admin was made")
	}
	if _, _, err := NewToken([]byte("short"), Claims{Principal: "driver/x"}); err == nil {
		t.Error("a token was made with a short secret")
	}
	if string(LinkKey(secret)) == string(secret) || len(LinkKey(secret)) != 64 {
		t.Error("the link key is not derived")
	}
}

// certState is the TLS state of a request that presented a certificate of ca with grant g.
func certState(t *testing.T, ca *pki.CA, g pki.Grant) *tls.ConnectionState {
	t.Helper()
	certPEM, _, err := ca.IssueGrant("test", g)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := pem.Decode(certPEM)
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{c, ca.Cert}}}
}

func TestAuthenticate(t *testing.T) {
	ca, err := pki.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	revoked := map[string]bool{"gone": true}
	ended := map[string]bool{"stopped": true}
	a := &Authenticator{Secret: secret, Revoked: func(id string) bool { return revoked[id] }, JobEnded: func(j string) bool { return ended[j] },
		Now: func() time.Time { return now }}
	tok := func(c Claims) string {
		s, _, err := NewToken(secret, c)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	driver := tok(Claims{Principal: "driver/train", Expires: now.Add(time.Hour).Unix()})
	worker := tok(Claims{Principal: "worker/train/g/0", JobBound: true})
	anyAgent := tok(Claims{Principal: "agent/*"})
	cases := []struct {
		name   string
		bearer string
		st     *tls.ConnectionState
		want   Principal
		err    string
	}{
		{"cluster token", string(secret), nil, Admin(), ""},
		{"cluster token, agent certificate", string(secret), certState(t, ca, pki.Grant{URI: Grant(Agent("m1"), "", false)}), Agent("m1"), ""},
		{"cluster token, certificate without a grant", string(secret), certState(t, ca, pki.Grant{}), Admin(), ""},
		{"driver token", driver, nil, Driver("train"), ""},
		{"driver token, its certificate", driver, certState(t, ca, pki.Grant{URI: Grant(Driver("train"), "", false)}), Driver("train"), ""},
		{"driver token, another's certificate", driver, certState(t, ca, pki.Grant{URI: Grant(Driver("other"), "", false)}), Principal{}, "a certificate of driver/other with a token of driver/train"},
		{"driver token, admin certificate", driver, certState(t, ca, pki.Grant{URI: Grant(Admin(), "", false)}), Principal{}, "a certificate of admin"},
		{"no token", "", nil, Principal{}, "a token is required"},
		{"wrong token", "not the secret at all", nil, Principal{}, "neither the cluster token"},
		{"expired", tok(Claims{Principal: "driver/train", Expires: now.Add(-time.Second).Unix()}), nil, Principal{}, "expired"},
		{"revoked", tok(Claims{ID: "gone", Principal: "driver/train"}), nil, Principal{}, "revoked"},
		{"certificate of a revoked token", string(secret), certState(t, ca, pki.Grant{URI: Grant(Driver("train"), "gone", false)}), Principal{}, "revoked"},
		{"worker of a live job", worker, nil, Worker("train", "g", 0), ""},
		{"agent/* token alone", anyAgent, nil, Agent(AnyMachine), ""},
		{"agent/* token, one machine's certificate (it narrows)", anyAgent, certState(t, ca, pki.Grant{URI: Grant(Agent("m7"), "", false)}), Agent("m7"), ""},
		{"agent/* token, a driver's certificate", anyAgent, certState(t, ca, pki.Grant{URI: Grant(Driver("train"), "", false)}), Principal{}, "a certificate of driver/train with a token of agent/*"},
		{"one machine's token, agent/* certificate (no widening)", tok(Claims{Principal: "agent/m1"}), certState(t, ca, pki.Grant{URI: Grant(Agent(AnyMachine), "", false)}), Principal{}, "a certificate of agent/* with a token of agent/m1"},
		{"worker of a stopped job", tok(Claims{Principal: "worker/stopped/g/0", JobBound: true}), nil, Principal{}, "ended with its job"},
		{"job-bound certificate of a stopped job", string(secret), certState(t, ca, pki.Grant{URI: Grant(Worker("stopped", "g", 0), "", true)}), Principal{}, "ended with its job"},
	}
	// Twice: the second time the scoped tokens' MACs are remembered (parse), and every
	// case must come out the same.
	cases = append(cases, cases...)
	for _, c := range cases {
		id, err := a.Authenticate(c.bearer, c.st)
		switch {
		case c.err == "" && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.err != "" && (err == nil || !errors.Is(err, ErrUnauthenticated) || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%s: got %v, %v; want an ErrUnauthenticated saying %q", c.name, id.Principal, err, c.err)
		case c.err == "" && id.Principal != c.want:
			t.Errorf("%s: principal %v, want %v", c.name, id.Principal, c.want)
		}
	}
	// A token remembered is still refused once revoked, expired, or past its job.
	later := tok(Claims{ID: "later", Principal: "driver/train", Expires: now.Add(time.Hour).Unix()})
	bound := tok(Claims{Principal: "worker/ending/g/0", JobBound: true})
	for _, b := range []string{later, bound} {
		if _, err := a.Authenticate(b, nil); err != nil {
			t.Fatal(err)
		}
	}
	revoked["later"], ended["ending"] = true, true
	if _, err := a.Authenticate(later, nil); err == nil || !strings.Contains(err.Error(), "revoked") {
		t.Errorf("a remembered token revoked since: %v; want it refused as revoked", err)
	}
	if _, err := a.Authenticate(bound, nil); err == nil || !strings.Contains(err.Error(), "ended with its job") {
		t.Errorf("a remembered job-bound token whose job ended since: %v; want it refused", err)
	}
	revoked["later"] = false
	now = now.Add(2 * time.Hour)
	if _, err := a.Authenticate(later, nil); err == nil || !strings.Contains(err.Error(), "expired") {
		t.Errorf("a remembered token past its expiry: %v; want it refused as expired", err)
	}
	// A token with a bad MAC is never remembered as good: one byte changed is refused.
	forged := later[:len(later)-2] + string(later[len(later)-2]^1) + later[len(later)-1:]
	if _, err := a.Authenticate(forged, nil); err == nil {
		t.Error("a token with its MAC changed was accepted")
	}
}

type fakeState struct {
	members map[string]string // job/gang/rank -> machine
	owners  map[string]Principal
	jobs    map[string]Principal // job -> who submitted it
}

func (s fakeState) MemberMachine(job, gang string, rank int) (string, bool) {
	m, ok := s.members[Worker(job, gang, rank).String()]
	return m, ok
}

func (s fakeState) JobPrincipal(job string) (Principal, bool) {
	p, ok := s.jobs[job]
	return p, ok
}

func (s fakeState) OwnerPrincipal(o string) (Principal, bool) {
	p, ok := s.owners[o]
	return p, ok
}

func TestDecide(t *testing.T) {
	st := fakeState{
		members: map[string]string{"worker/a/g/0": "m1", "worker/a/g/1": "m2", "worker/b/g/0": "m1"},
		owners:  map[string]Principal{"driver/h/1": Driver("a"), "driver/h/2": Driver("b"), "driver/h/3": Admin()},
		jobs:    map[string]Principal{"a": Driver("a"), "b": Admin(), "sub": Driver("a"), "x": Admin(), "submitted": Admin()},
	}
	da, db, wa0, wa1 := Driver("a"), Driver("b"), Worker("a", "g", 0), Worker("a", "g", 1)
	m1 := Agent("m1")
	anyAgent := Agent(AnyMachine)
	cases := []struct {
		p    Principal
		a    Action
		t    Target
		want bool
	}{
		// agent/*: the agent of any one machine, and nothing more.
		{anyAgent, ActMachineReport, Target{Machine: "m9"}, true},
		{anyAgent, ActTokenMint, Target{For: wa0}, true},
		{anyAgent, ActTokenMint, Target{For: Worker("a", "g", 7)}, false}, // placed nowhere
		{anyAgent, ActTokenMint, Target{For: da, Machine: "?"}, false},    // a driver placed nowhere
		{anyAgent, ActCertSign, Target{For: Agent("m9")}, true},
		{anyAgent, ActCertSign, Target{For: anyAgent}, false},
		{anyAgent, ActCertSign, Target{For: da}, false},
		{anyAgent, ActCertSign, Target{For: Admin()}, false},
		{anyAgent, ActPropose, Target{}, false},
		{anyAgent, ActConfigWrite, Target{}, false},
		{anyAgent, ActMachineDrain, Target{Machine: "m9"}, false},
		{anyAgent, ActJobWrite, Target{Job: "a"}, false},
		{Admin(), ActPropose, Target{}, true},
		{da, ActPropose, Target{}, false},
		{wa0, ActPropose, Target{}, false},
		{m1, ActPropose, Target{}, false},
		{Head(), ActPropose, Target{}, false},
		{da, ActMembers, Target{}, false},
		{da, ActConfigWrite, Target{}, false},
		{da, ActJobWrite, Target{Job: "a"}, true},
		{da, ActJobWrite, Target{Job: "b"}, false},
		{da, ActJobWrite, Target{Job: "sub"}, true}, // it submitted it
		{db, ActJobWrite, Target{Job: "sub"}, false},
		{da, ActJobSubmit, Target{Job: "new"}, true}, // a name not taken
		{da, ActJobSubmit, Target{Job: "x"}, false},  // taken by another
		{da, ActJobSubmit, Target{Job: "sub"}, true},
		{wa0, ActJobSubmit, Target{Job: "new"}, false},
		{Driver("submitted"), ActJobSubmit, Target{Job: "x", Stopped: true}, true}, // its submitter's, stopped
		{Driver("submitted"), ActJobSubmit, Target{Job: "x"}, false},               // running
		{da, ActJobSubmit, Target{Job: "x", Stopped: true}, false},                 // not its submitter's
		{da, ActKVObjects, Target{Owner: "job/sub"}, true},
		{db, ActObjectRead, Target{Owner: "worker/sub/g/0.g0"}, false},
		{Worker("sub", "g", 0), ActObjectRead, Target{Owner: "driver/h/1"}, true}, // the driver that submitted its job
		{Worker("sub", "g", 0), ActObjectRead, Target{Owner: "driver/h/2"}, false},
		{Worker("sub", "g", 0), ActObjectWrite, Target{Owner: "driver/h/1"}, false},
		{wa0, ActObjectPut, Target{Owner: "checkpoint/a/g"}, true},
		{wa0, ActObjectPut, Target{Owner: "checkpoint/a/other"}, false},
		{wa0, ActJobWrite, Target{Job: "a"}, false},
		{wa0, ActGangWrite, Target{Job: "a", Gang: "tasks"}, true},
		{wa0, ActGangWrite, Target{Job: "b", Gang: "g"}, false},
		{da, ActGangWrite, Target{Job: "a", Gang: "x"}, true},
		{db, ActGangWrite, Target{Job: "a", Gang: "x"}, false},
		{wa0, ActWorkerReady, Target{For: wa0}, true},
		{wa0, ActWorkerReady, Target{For: wa1}, false},
		{m1, ActWorkerReady, Target{For: wa0}, true},  // placed on m1
		{m1, ActWorkerReady, Target{For: wa1}, false}, // placed on m2
		{m1, ActWorkerExited, Target{For: Worker("a", "nope", 0)}, false},
		{m1, ActMachineReport, Target{Machine: "m1"}, true},
		{m1, ActMachineReport, Target{Machine: "m2"}, false},
		{wa0, ActCostReport, Target{Machine: "m1"}, true},
		{wa0, ActCostReport, Target{Machine: "m2"}, false},
		{m1, ActTokenMint, Target{For: wa0}, true},
		{m1, ActTokenMint, Target{For: wa1}, false},
		{da, ActTokenMint, Target{For: wa0}, false},
		{da, ActCertSign, Target{For: da}, true},
		{da, ActCertSign, Target{For: db}, false},
		{da, ActCertSign, Target{For: Admin()}, false},
		{da, ActKVObjects, Target{Owner: "job/a"}, true},
		{da, ActKVObjects, Target{Owner: "worker/a/g/0.g2"}, true},
		{da, ActKVObjects, Target{Owner: "driver/h/1/binary"}, true},
		{da, ActKVObjects, Target{Owner: "driver/h/2"}, false},
		{da, ActKVObjects, Target{Owner: "driver/h/3"}, false}, // an admin's: readable, not writable
		{da, ActKVObjects, Target{Owner: "driver/h/9"}, false}, // no owner record
		{da, ActKVObjects, Target{Owner: "detached"}, false},
		{da, ActKVObjects, Target{Owner: "job/b"}, false},
		{da, ActKVObjects, Target{Owner: "checkpoint/b/g"}, false},
		{da, ActKVObjects, Target{Owner: "mystery"}, false},
		{wa0, ActKVObjects, Target{Owner: "worker/a/g/0.g1"}, true},
		{wa0, ActKVObjects, Target{Owner: "worker/a/g/1.g1"}, false},
		{wa0, ActKVObjects, Target{Owner: "job/a"}, true},
		{wa0, ActKVObjects, Target{Owner: "driver/h/1"}, false},
		{m1, ActKVObjects, Target{Owner: "job/b"}, true},
		{wa0, ActObjectRead, Target{Owner: "driver/h/1"}, true},
		{wa0, ActObjectRead, Target{Owner: "driver/h/3"}, true},
		{wa0, ActObjectRead, Target{Owner: "detached"}, true},
		{wa0, ActObjectRead, Target{Owner: "driver/h/2"}, false},
		{wa0, ActObjectRead, Target{Owner: "worker/b/g/0.g0"}, false},
		{db, ActObjectRead, Target{Owner: "checkpoint/a/g"}, false},
		{db, ActObjectWrite, Target{Owner: "job/a"}, false},
		{da, ActKVCheckpoints, Target{Job: "a"}, true},
		{da, ActKVCheckpoints, Target{Job: "b"}, false},
		{da, ActKVOwners, Target{For: da}, true},
		{da, ActKVOwners, Target{For: Admin()}, false},
		{da, ActKVControl, Target{What: "put gangs/a/g"}, false},
		{m1, ActKVControl, Target{What: "put nodes/m1"}, false},
		{da, ActWorkerKill, Target{Job: "a"}, true},
		{da, ActWorkerKill, Target{Job: "b"}, false},
		{wa0, ActActorLink, Target{Job: "a"}, true},
		{Worker("b", "g", 0), ActActorLink, Target{Job: "a"}, false},
		{da, Action("no.such.action"), Target{}, false},
		{Admin(), Action("no.such.action"), Target{}, false},
	}
	for _, c := range cases {
		err := Decide(c.p, c.a, c.t, st)
		if (err == nil) != c.want {
			t.Errorf("Decide(%s, %s, %s) = %v, want allowed %v", c.p, c.a, c.t, err, c.want)
		}
		var d *Denied
		if err != nil && (!errors.As(err, &d) || !errors.Is(err, ErrForbidden) ||
			!strings.Contains(err.Error(), "role "+string(c.p.Role)) || !strings.Contains(err.Error(), string(c.a))) {
			t.Errorf("refusal %q does not name the role and the action", err)
		}
	}
	if err := LinkAdmits(Driver("a"), Worker("b", "g", 0), st); err == nil {
		t.Error("a worker of job b was admitted into job a's driver")
	}
	if err := LinkAdmits(Driver("a"), Worker("sub", "g", 0), st); err != nil {
		t.Errorf("a worker of a job driver/a submitted was refused: %v", err)
	}
	if err := LinkAdmits(Worker("sub", "g", 0), Driver("a"), st); err != nil {
		t.Errorf("the driver that submitted a job was refused by its worker: %v", err)
	}
	if err := LinkAdmits(Worker("sub", "g", 0), Driver("b"), st); err == nil {
		t.Error("another job's driver was admitted into a worker")
	}
	if err := LinkAdmits(Admin(), Worker("b", "g", 0), st); err != nil {
		t.Errorf("an admin's driver refused a worker: %v", err)
	}
	if err := LinkAdmits(Worker("a", "g", 1), Agent("m1"), st); err != nil {
		t.Errorf("an agent was refused: %v", err)
	}
}

// TestEveryActionHasOneRule: the table has one row per action and a scope for every role.
func TestEveryActionHasOneRule(t *testing.T) {
	seen := map[Action]bool{}
	for _, r := range Table() {
		if seen[r.Action] {
			t.Errorf("%s: two rows", r.Action)
		}
		seen[r.Action] = true
		if r.Scopes[RoleAdmin] != ScopeAny {
			t.Errorf("%s: admin may not take it", r.Action)
		}
		if len(r.Scopes) != len(Roles()) || r.Where == "" {
			t.Errorf("%s: incomplete row", r.Action)
		}
	}
	for _, a := range []Action{ActPropose, ActMembers, ActConfigWrite, ActMachineDrain, ActPoolInterrupt, ActTokenRevoke, ActKVControl, ActDebug} {
		if !AdminOnly(a) {
			t.Errorf("%s is not admin only", a)
		}
	}
	if AdminOnly(ActJobWrite) || AdminOnly(ActRead) {
		t.Error("job.write or log.read is admin only")
	}
}

// TestDocsShowTheTable: docs/hardening.md shows the table as the code has it.
func TestDocsShowTheTable(t *testing.T) {
	b, err := os.ReadFile("../../docs/hardening.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), Markdown()) {
		t.Errorf("docs/hardening.md does not show the role × action table as runtime/authz has it; put this there:\n%s", Markdown())
	}
}

// TestReadable: a log read is decided by its key's table: a job's records by its jobs, the
// control tables by the privileged roles only, the cluster's shared tables by everyone.
func TestReadable(t *testing.T) {
	st := fakeState{jobs: map[string]Principal{"a": Driver("a"), "b": Admin(), "sub": Driver("a")}}
	da, wa0, m1 := Driver("a"), Worker("a", "g", 0), Agent("m1")
	cases := []struct {
		p    Principal
		key  string
		want bool
	}{
		{da, "jobs/a", true},
		{da, "jobs/sub", true}, // it submitted it
		{da, "jobs/b", false},
		{da, "gangs/a/g", true},
		{da, "gangs/ab/g", false}, // a name that begins like its job's is another job
		{da, "gangs/b/g", false},
		{da, "actors/b/g/0", false},
		{da, "checkpoints/b/g/00000001", false},
		{wa0, "checkpoints/a/g/00000001", true},
		{wa0, "gangs/sub/g", false}, // a worker's job is its own only
		{da, "nodes/m1", true},
		{wa0, "objects/o1", true},
		{da, "config/scheduler", true},
		{da, "events/00000001", false},
		{wa0, "owners/driver/h/1", false},
		{da, "control/term", false},
		{da, "auth/revoked/x", false},
		{da, "", false},
		{da, "mystery/x", false},
		{m1, "auth/revoked/x", true},
		{m1, "gangs/b/g", true},
		{Head(), "events/00000001", true},
		{Admin(), "", true},
	}
	for _, c := range cases {
		if got := Readable(c.p, c.key, st); got != c.want {
			a, tg := ReadOf(c.key)
			t.Errorf("%s reads %q (%s on %s): %v, want %v", c.p, c.key, a, tg, got, c.want)
		}
	}
	if !ReadsAll(Admin()) || !ReadsAll(m1) || ReadsAll(da) || ReadsAll(wa0) {
		t.Error("ReadsAll: admin, heads and agents read every key; drivers and workers do not")
	}
}
