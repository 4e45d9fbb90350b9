package paxos

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/atoll-run/atoll/internal/devcert"
)

// Three replicas over mutual TLS commit; a peer without TLS, without a certificate, with a
// certificate of another CA or with the wrong token is refused; a dialer that does not
// trust the cluster's CA refuses the listener.
func TestTCPMutualTLS(t *testing.T) {
	ca, err := devcert.NewCA("cluster")
	if err != nil {
		t.Fatal(err)
	}
	other, err := devcert.NewCA("other")
	if err != nil {
		t.Fatal(err)
	}
	addrs := freeAddrs(t, 4)
	peers := map[uint64]string{1: addrs[0], 2: addrs[1], 3: addrs[2]}
	ids := []uint64{1, 2, 3}
	token := []byte("cluster-secret-token")
	c := &testCluster{t: t, ids: ids, reps: map[uint64]*Replica{}, sms: map[uint64]*testSM{}}
	dir := t.TempDir()
	for _, id := range ids {
		cfg, err := ca.MutualConfig(fmt.Sprintf("replica-%d", id), "127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		tr, err := NewTCPTransport(TCPConfig{ID: id, Peers: peers, Token: token, TLS: cfg, HandshakeTimeout: 500 * time.Millisecond, Logger: zaptest.NewLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		w, err := OpenWAL(filepath.Join(dir, fmt.Sprint(id)), WALOptions{NoSync: true})
		if err != nil {
			t.Fatal(err)
		}
		rc := DefaultReplicaConfig(id, ids)
		rc.Logger = zaptest.NewLogger(t)
		c.sms[id] = &testSM{data: map[string]string{}}
		r, err := StartReplica(rc, w, tr, c.sms[id])
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		c.reps[id] = r
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := 0; i < 20; i++ {
		if err := c.put(ctx, fmt.Sprintf("k%d", i), "v"); err != nil {
			t.Fatalf("put over mutual TLS: %v", err)
		}
	}

	// Intruders against replica 1's listener, each trying the token handshake as replica 2.
	good, _ := ca.MutualConfig("intruder", "127.0.0.1")
	foreign, _ := other.MutualConfig("intruder", "127.0.0.1")
	noCert := &tls.Config{RootCAs: ca.Pool, MinVersion: tls.VersionTLS13}
	foreignCert := good.Clone()
	foreignCert.Certificates = foreign.Certificates
	intruders := []struct {
		name    string
		tls     *tls.Config // nil: plain TCP
		token   string
		wantErr string // "" = the handshake succeeds
	}{
		{"plain-tcp", nil, string(token), "EOF"}, // the listener waits for a TLS hello, then drops it
		{"tls-without-certificate", noCert, string(token), "certificate"},
		{"certificate-of-another-ca", foreignCert, string(token), "certificate"},
		{"wrong-token", good, "not-the-cluster-token", "the cluster tokens differ"},
		{"right-certificate-and-token", good, string(token), ""},
	}
	for _, in := range intruders {
		conn, err := net.DialTimeout("tcp", peers[1], time.Second)
		if err != nil {
			t.Fatal(err)
		}
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		if in.tls != nil {
			cfg := in.tls.Clone()
			cfg.ServerName = "127.0.0.1"
			conn = tls.Client(conn, cfg)
		}
		pt := &TCPTransport{cfg: TCPConfig{ID: 2, Token: []byte(in.token)}}
		err = pt.clientHandshake(conn, 1)
		conn.Close()
		switch {
		case in.wantErr == "" && err != nil:
			t.Errorf("%s: %v", in.name, err)
		case in.wantErr != "" && (err == nil || !strings.Contains(err.Error(), in.wantErr)):
			t.Errorf("%s: %v, want an error mentioning %q", in.name, err, in.wantErr)
		}
	}

	// A replica that does not trust the cluster's CA refuses the listener's certificate; one
	// whose certificate is another CA's is refused by the listener. Each says so.
	distrust := good.Clone()
	distrust.RootCAs = other.Pool
	for i, rc := range []struct {
		tls  *tls.Config
		want string
	}{
		{distrust, "certificate signed by unknown authority"},
		{foreignCert, "refused this replica's TLS certificate"},
	} {
		core, logs := observer.New(zap.WarnLevel)
		rogue, err := NewTCPTransport(TCPConfig{ID: 2, Listen: addrs[3], Peers: map[uint64]string{1: peers[1]}, Token: token, TLS: rc.tls, Logger: zap.New(core)})
		if err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for logs.FilterMessage("handshake with peer failed").Len() == 0 && time.Now().Before(deadline) {
			rogue.Send(Message{Type: MsgLearn, From: 2, To: 1})
			time.Sleep(10 * time.Millisecond)
		}
		rogue.Close()
		if e := logs.FilterMessage("handshake with peer failed").All(); len(e) == 0 || !strings.Contains(e[0].ContextMap()["error"].(string), rc.want) {
			t.Fatalf("rogue dialer %d logged %v, want %q", i, e, rc.want)
		}
	}
	for i := 0; i < 5; i++ {
		if err := c.put(ctx, fmt.Sprintf("after-%d", i), "v"); err != nil {
			t.Fatalf("cluster after the intruders: %v", err)
		}
	}
}

func TestTCPConfigTLSValidation(t *testing.T) {
	ca, err := devcert.NewCA("cluster")
	if err != nil {
		t.Fatal(err)
	}
	full, err := ca.MutualConfig("r", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	base := TCPConfig{ID: 1, Listen: "127.0.0.1:0", Token: []byte("cluster-secret-token")}
	for _, tc := range []struct {
		name string
		mod  func(*tls.Config)
		want string
	}{
		{"complete", func(*tls.Config) {}, ""},
		{"no-certificate", func(c *tls.Config) { c.Certificates = nil }, "no certificate"},
		{"no-client-cas", func(c *tls.Config) { c.ClientCAs = nil }, "ClientCAs"},
		{"no-root-cas", func(c *tls.Config) { c.RootCAs = nil }, "RootCAs"},
	} {
		cfg := base
		cfg.TLS = full.Clone()
		tc.mod(cfg.TLS)
		err := cfg.Validate()
		if (tc.want == "") != (err == nil) || (err != nil && (!errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want))) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}
