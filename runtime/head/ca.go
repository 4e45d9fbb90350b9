package head

import (
	"crypto/x509"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/atoll-run/atoll/internal/pki"
	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/runtime/authz"
)

// authority is a head's view of the cluster CA: the CA that signs processes' certificates,
// the bundle of CAs every process trusts, and the callers still presenting certificates of
// another CA. With a directory it follows a rotation of the CA there (reload): see
// docs/hardening.md, "Rotating the cluster CA".
type authority struct {
	dir string // the CA directory (--ca-dir); "" when the CA was given in memory
	log *zap.Logger
	cur atomic.Pointer[caView]

	mu      sync.Mutex
	checked map[string]bool      // certificate (raw) → signed by the current signing CA
	stale   map[string]staleSeen // certificate name → when seen with another CA's
}

// caView is an authority at one time.
type caView struct {
	ca     *pki.CA
	bundle []byte
	phase  string
	tag    string // api.TrustTag of the bundle and the signing CA
}

func newCAView(ca *pki.CA, phase string) *caView {
	b := ca.TrustPEM()
	return &caView{ca: ca, bundle: b, phase: phase, tag: api.TrustTag(string(b), string(ca.CertPEM))}
}

type staleSeen struct {
	principal string
	at        time.Time
}

// maxChecked bounds the memory of checked certificates (cleared when full).
const maxChecked = 1 << 14

func newAuthority(ca *pki.CA, dir string, log *zap.Logger) (*authority, error) {
	au := &authority{dir: dir, log: log, checked: map[string]bool{}, stale: map[string]staleSeen{}}
	v := newCAView(ca, pki.PhaseSteady)
	if dir != "" {
		var err error
		if v, err = readCAView(dir); err != nil {
			return nil, err
		}
	}
	au.cur.Store(v)
	return au, nil
}

func readCAView(dir string) (*caView, error) {
	ca, err := pki.LoadCA(dir)
	if err != nil {
		return nil, err
	}
	phase, err := pki.RotationPhase(dir)
	if err != nil {
		return nil, err
	}
	return newCAView(ca, phase), nil
}

// signer is the CA that signs now.
func (au *authority) signer() *pki.CA { return au.cur.Load().ca }

// bundle is the CAs trusted now (PEM).
func (au *authority) bundle() []byte { return au.cur.Load().bundle }

// tag is the trust tag now (api.TrustTag): the agents' load reports carry it back.
func (au *authority) tag() string { return au.cur.Load().tag }

// reload reads the CA directory again: it reports whether the signing CA or the bundle
// changed. A directory caught between two files of a step (a key of one CA beside the
// certificate of the other) is an error; the view stays as it was until the next read.
func (au *authority) reload() (signer, bundle bool, err error) {
	if au.dir == "" {
		return false, false, nil
	}
	v, err := readCAView(au.dir)
	if err != nil {
		return false, false, err
	}
	old := au.cur.Load()
	signer = !v.ca.Cert.Equal(old.ca.Cert)
	bundle = string(v.bundle) != string(old.bundle)
	if !signer && !bundle && v.phase == old.phase {
		return false, false, nil
	}
	au.cur.Store(v)
	if signer {
		au.mu.Lock()
		clear(au.checked)
		clear(au.stale)
		au.mu.Unlock()
	}
	au.log.Info("cluster CA reloaded", zap.String("dir", au.dir), zap.String("phase", v.phase),
		zap.Bool("signer_changed", signer), zap.Bool("trust_changed", bundle), zap.String("signer", v.ca.Cert.Subject.CommonName))
	return signer, bundle, nil
}

// observe notes a caller's certificate: one the signing CA did not sign (a process that
// has not renewed since the CA was activated) is remembered for StaleWindow, or until the
// same name is seen with a certificate the signing CA signed.
//
// It reports whether the certificate is stale: the caller's connection should then end
// after this request, so that its next one shakes hands again with the certificate it
// holds by then (a renewed process keeps its pooled connections otherwise).
func (au *authority) observe(c *x509.Certificate, principal string) (stale bool) {
	au.mu.Lock()
	ok, known := au.checked[string(c.Raw)] // no copy of the key for a lookup
	au.mu.Unlock()
	if !known {
		ok = c.CheckSignatureFrom(au.signer().Cert) == nil
		au.mu.Lock()
		if len(au.checked) >= maxChecked {
			clear(au.checked)
		}
		au.checked[string(c.Raw)] = ok
		au.mu.Unlock()
	}
	au.mu.Lock()
	if ok {
		delete(au.stale, c.Subject.CommonName) // renewed
	} else {
		au.stale[c.Subject.CommonName] = staleSeen{principal: principal, at: time.Now()}
	}
	au.mu.Unlock()
	return !ok
}

// info answers GET /v1/trust.
func (au *authority) info() api.TrustInfo {
	v := au.cur.Load()
	ti := api.TrustInfo{Bundle: string(v.bundle), Signing: string(v.ca.CertPEM), Phase: v.phase, Tag: v.tag, Stale: []api.StaleCert{}}
	now := time.Now()
	au.mu.Lock()
	for name, s := range au.stale {
		if now.Sub(s.at) > api.StaleWindow {
			delete(au.stale, name)
			continue
		}
		ti.Stale = append(ti.Stale, api.StaleCert{Name: name, Principal: s.principal, LastSeen: s.at})
	}
	au.mu.Unlock()
	sort.Slice(ti.Stale, func(i, j int) bool { return ti.Stale[i].Name < ti.Stale[j].Name })
	return ti
}

// followCA reloads the CA directory every interval until stop closes: when the bundle
// changes the head trusts the new one, when the signing CA changes the head renews its
// own certificate with it (trust first, so that its peers' renewed certificates verify).
func (h *Head) followCA(every time.Duration, stop <-chan struct{}) {
	t := time.NewTicker(every)
	defer t.Stop()
	var lastErr string
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		signer, bundle, err := h.au.reload()
		if err != nil {
			if err.Error() != lastErr {
				h.log.Warn("cluster CA: the directory could not be read (kept the CA as it was)", zap.String("dir", h.au.dir), zap.Error(err))
			}
			lastErr = err.Error()
			continue
		}
		lastErr = ""
		if bundle {
			if err := h.id.SetTrust(h.au.bundle()); err != nil {
				h.log.Error("cluster CA: the new trust bundle", zap.Error(err))
			}
		}
		if signer {
			if err := h.renewOwn(); err != nil {
				h.log.Error("cluster CA: renewing this head's certificate", zap.Error(err))
			}
		}
	}
}

// issueOwn issues this head's certificate with the signing CA.
func (h *Head) issueOwn() (*pki.Identity, error) {
	id, err := h.au.signer().IssueIdentityGrant(fmt.Sprintf("head-%d", h.cfg.ID), pki.Grant{URI: authz.Grant(authz.Head(), "", false)}, apiHosts(h.cfg)...)
	if err != nil {
		return nil, fmt.Errorf("head %d: its certificate: %w", h.cfg.ID, err)
	}
	return id, nil
}

// renewOwn replaces this head's certificate with one of the signing CA.
func (h *Head) renewOwn() error {
	id, err := h.issueOwn()
	if err != nil {
		return err
	}
	if err := h.id.SetCert(id.Certificate()); err != nil {
		return err
	}
	h.log.Info("cluster CA: this head's certificate renewed", zap.String("issuer", h.au.signer().Cert.Subject.CommonName))
	return nil
}
