package tlsgate

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/atoll-run/atoll/internal/pki"
)

// identities returns a server's and a client's configuration of one new cluster CA.
func identities(t *testing.T) (server, client *tls.Config) {
	t.Helper()
	ca, err := pki.NewCA("tlsgate-test")
	if err != nil {
		t.Fatal(err)
	}
	mk := func(name string) *pki.Identity {
		cert, key, err := ca.Issue(name, "127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		id, err := pki.NewIdentity(ca.TrustPEM(), cert, key)
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	return mk("server").Server(), mk("client").Client()
}

// TestHandshakesWaitForASlot: with 2 slots and 5 clients whose handshakes are held
// (GetConfigForClient blocks), 2 handshakes run and 3 connections wait without starting
// theirs; released, all 5 are served over HTTP, and no more than 2 ever ran at once.
func TestHandshakesWaitForASlot(t *testing.T) {
	srvTLS, cliTLS := identities(t)
	const clients, limit = 5, 2
	var running, most atomic.Int32
	entered := make(chan struct{}, clients)
	release := make(chan struct{})
	held := srvTLS.Clone()
	held.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		n := running.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		entered <- struct{}{}
		<-release
		return nil, nil
	}
	verify := held.VerifyConnection
	held.VerifyConnection = func(cs tls.ConnectionState) error { running.Add(-1); return verify(cs) }
	waiting := make(chan struct{}, clients)
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := New(inner, Config{TLS: held, Limit: limit, onWait: func() { waiting <- struct{}{} }})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
			http.Error(w, "no client certificate", http.StatusForbidden)
			return
		}
		_, _ = io.WriteString(w, "ok")
	})}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: cliTLS, DisableKeepAlives: true}}
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for range clients {
		wg.Go(func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+ln.Addr().String()+"/", nil)
			resp, err := hc.Do(req)
			if err == nil {
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK || string(body) != "ok" {
					err = fmt.Errorf("%s %s", resp.Status, body)
				}
			}
			errs <- err
		})
	}
	for range limit {
		select {
		case <-entered:
		case <-ctx.Done():
			t.Fatal("the first handshakes never started")
		}
	}
	for range clients - limit {
		select {
		case <-waiting:
		case <-ctx.Done():
			t.Fatal("the other connections never waited for a slot")
		}
	}
	if n := running.Load(); n != limit {
		t.Fatalf("%d handshakes running while %d connections wait: want %d", n, clients-limit, limit)
	}
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if m := most.Load(); m != limit {
		t.Fatalf("at most %d handshakes at once: want %d", m, limit)
	}
}

// TestSilentClientHoldsASlotOnlyUntilTheTimeout: a connection that sends nothing holds the
// only slot until the handshake timeout, then the next client is served; the failure is
// reported.
func TestSilentClientHoldsASlotOnlyUntilTheTimeout(t *testing.T) {
	srvTLS, cliTLS := identities(t)
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	failed := make(chan error, 1)
	ln := New(inner, Config{TLS: srvTLS, Limit: 1, Timeout: 200 * time.Millisecond,
		OnError: func(_ net.Addr, err error) { failed <- err }})
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
	}()

	silent, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var d tls.Dialer
	d.Config = cliTLS
	c, err := d.DialContext(ctx, "tcp", ln.Addr().String())
	if err != nil {
		t.Fatalf("a client behind a silent one: %v", err)
	}
	defer c.Close()
	select {
	case err := <-failed:
		if err == nil {
			t.Fatal("the silent connection's failure reported without an error")
		}
	case <-ctx.Done():
		t.Fatal("the silent connection's failed handshake was not reported")
	}
	select {
	case sc := <-accepted:
		if _, ok := sc.(*tls.Conn); !ok {
			t.Fatalf("Accept returned a %T, want a *tls.Conn", sc)
		}
		sc.Close()
	case <-ctx.Done():
		t.Fatal("the client's connection was never accepted")
	}
}

// TestCloseEndsAccept: Close makes Accept return net.ErrClosed.
func TestCloseEndsAccept(t *testing.T) {
	srvTLS, _ := identities(t)
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := New(inner, Config{TLS: srvTLS, Limit: 1})
	errc := make(chan error, 1)
	go func() { _, err := ln.Accept(); errc <- err }()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != net.ErrClosed {
		t.Fatalf("Accept after Close: %v, want net.ErrClosed", err)
	}
}
