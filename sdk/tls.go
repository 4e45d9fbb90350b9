package sdk

import (
	"context"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/atoll-run/atoll/actors"
	"github.com/atoll-run/atoll/internal/pki"
	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/runtime/authz"
	"github.com/atoll-run/atoll/runtime/coll"
	"github.com/atoll-run/atoll/store/transfer"
)

// A cluster whose heads are https runs mutual TLS on every link: each process (driver,
// worker) gets a certificate of its own from the heads, with the cluster token, over TLS
// that checks the heads against the cluster CA's certificate; its key never leaves the
// process. A cluster whose heads are http runs on the token alone (the embedded default,
// where every link is loopback inside one process).

// clusterIdentity gets this process its certificate when the heads are https, and nil
// when they are http.
func clusterIdentity(ctx context.Context, heads []string, token string, caPEM []byte, name string) (*pki.Identity, error) {
	secure, err := api.Secure(heads)
	if err != nil || !secure {
		return nil, err
	}
	if len(caPEM) == 0 {
		return nil, fmt.Errorf("%w: the heads are https but no cluster CA certificate was given (the address's ca=PATH, or %s)", ErrInvalid, api.CACertEnv)
	}
	return api.RequestIdentity(ctx, heads, token, caPEM, name)
}

// followCA follows a rotation of the cluster CA for this process's identity (nil: no TLS)
// while the connection lives: see api.KeepIdentity.
func (c *conn) followCA(id *pki.Identity, r api.Renewal) {
	if id == nil {
		return
	}
	go api.KeepIdentity(c.life, c.client, id, r, 0, c.log)
}

// readCA reads the cluster CA certificate a connecting process was given: caFile, or the
// file $ATOLL_CA_CERT names; nil when neither is set.
func readCA(caFile string) ([]byte, error) {
	if caFile == "" {
		caFile = os.Getenv(api.CACertEnv)
	}
	if caFile == "" {
		return nil, nil
	}
	b, err := pki.ReadCACert(caFile)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	return b, nil
}

// remoteConfig is the actor system's remote configuration: the link key, and mutual TLS
// with an identity, under which a link is admitted by its peer's certificate (self is this
// process's principal: a process of one job admits the processes of that job and the
// cluster's own, authz.LinkAdmits).
func remoteConfig(listen string, token []byte, id *pki.Identity, self string, client *api.Client) *actors.RemoteConfig {
	rc := &actors.RemoteConfig{Listen: listen, Token: token}
	if id != nil {
		rc.ServerTLS, rc.ClientTLS = id.Server(), id.Client()
		rc.Admit = linkAdmit(self, client)
	}
	return rc
}

// linkAdmit decides the links into a process whose principal is self, by the peer's
// certificate (authz.LinkAdmits): a process of one job admits that job's processes and the
// cluster's own (admin, heads, agents); a process of no job (an admin's driver), every one.
func linkAdmit(self string, client *api.Client) func(peer *x509.Certificate) error {
	me, err := authz.ParsePrincipal(self)
	if err != nil {
		me = authz.Admin() // a process that does not know itself confines no one
	}
	st := &jobsView{client: client, jobs: map[string]jobSeen{}}
	return func(peer *x509.Certificate) error {
		g, ok, err := authz.ParseGrant(pki.GrantOf(peer))
		if err != nil || !ok {
			if me.Job == "" {
				return nil
			}
			return fmt.Errorf("%w: a link into a process of job %s needs a certificate that names its principal", authz.ErrForbidden, me.Job)
		}
		return authz.LinkAdmits(me, g.Principal, st)
	}
}

// jobsView answers which principal submitted a job (the jobs a driver submitted are its
// own), from the heads, cached for a few seconds.
type jobsView struct {
	client *api.Client

	mu   sync.Mutex
	jobs map[string]jobSeen
}

type jobSeen struct {
	p    authz.Principal
	ok   bool
	when time.Time
}

var _ authz.State = (*jobsView)(nil)

func (v *jobsView) JobPrincipal(job string) (authz.Principal, bool) {
	v.mu.Lock()
	s, hit := v.jobs[job]
	v.mu.Unlock()
	if hit && time.Since(s.when) < 5*time.Second {
		return s.p, s.ok
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var j api.Job
	found, err := v.client.Get(ctx, api.TableJobs+job, &j)
	if err != nil {
		return authz.Principal{}, false
	}
	s = jobSeen{p: authz.Admin(), ok: found, when: time.Now()}
	if p, err := authz.ParsePrincipal(j.Principal); err == nil {
		s.p = p
	}
	v.mu.Lock()
	if len(v.jobs) > 10_000 {
		v.jobs = map[string]jobSeen{}
	}
	v.jobs[job] = s
	v.mu.Unlock()
	return s.p, s.ok
}

// MemberMachine implements authz.State: no link decision needs it.
func (v *jobsView) MemberMachine(string, string, int) (string, bool) { return "", false }

// OwnerPrincipal implements authz.State: no link decision needs it.
func (v *jobsView) OwnerPrincipal(string) (authz.Principal, bool) { return authz.Principal{}, false }

// secureLinks puts an identity on the client of the heads, the collective plane and an
// object store node's configuration (any may be nil).
func secureLinks(id *pki.Identity, cc *api.ClientConfig, plane *coll.Plane, nc *transfer.NodeConfig) {
	if id == nil {
		return
	}
	if cc != nil {
		cc.TLS = id.Client()
	}
	if plane != nil {
		plane.UseTLS(id.Server(), id.Client())
	}
	if nc != nil {
		nc.Server.TLS, nc.Client.TLS = id.Server(), id.Client()
	}
}

// httpClient is a client of an agent's API, with this process's certificate when it has
// one.
func httpClient(id *pki.Identity) *http.Client {
	if id == nil {
		return &http.Client{}
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = id.Client()
	return &http.Client{Transport: tr}
}
