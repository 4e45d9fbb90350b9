package tlsgate

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/atoll-run/atoll/internal/pki"
)

// The storm's clients run in a child process (this test binary again), so that their
// handshakes' goroutines are not in the server's run queue.
const (
	stormAddrEnv    = "TLSGATE_STORM_ADDR"
	stormClientsEnv = "TLSGATE_STORM_CLIENTS"
	stormIDEnv      = "TLSGATE_STORM_IDENTITY"
)

func TestMain(m *testing.M) {
	if addr := os.Getenv(stormAddrEnv); addr != "" {
		os.Exit(stormClients(addr))
	}
	os.Exit(m.Run())
}

// stormClients connects the clients at once, each for one request, and exits 0 when every
// one was answered.
func stormClients(addr string) int {
	n, _ := strconv.Atoi(os.Getenv(stormClientsEnv))
	id, err := pki.LoadIdentity(os.Getenv(stormIDEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := make(chan struct{})
	var wg sync.WaitGroup
	failed := make(chan error, n)
	for range n {
		wg.Go(func() {
			hc := &http.Client{Transport: &http.Transport{TLSClientConfig: id.Client(), DisableKeepAlives: true}}
			<-start
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+addr+"/", nil)
			resp, err := hc.Do(req)
			if err != nil {
				failed <- err
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		})
	}
	close(start)
	wg.Wait()
	close(failed)
	for err := range failed {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// BenchmarkReconnectStorm: 1,000 clients of the cluster's CA connect at once, as a
// cluster's agents do when their leader head dies, each for one request; meanwhile a
// goroutine of the server process that wakes every 2 ms (a Paxos replica's loop stands
// for it) measures how late it runs. Reported per storm: the wake-up's p99 and maximum
// lateness (ms) and the storm's duration, on crypto/tls's listener (every handshake at
// once, net/http's way) and on this package's with half of GOMAXPROCS and GOMAXPROCS (the
// heads' default) handshakes at once.
func BenchmarkReconnectStorm(b *testing.B) {
	ca, err := pki.NewCA("storm")
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	issue := func(name string) *pki.Identity {
		cert, key, err := ca.Issue(name, "127.0.0.1")
		if err != nil {
			b.Fatal(err)
		}
		if err := pki.WriteIdentity(filepath.Join(dir, name), ca.TrustPEM(), cert, key); err != nil {
			b.Fatal(err)
		}
		id, err := pki.LoadIdentity(filepath.Join(dir, name))
		if err != nil {
			b.Fatal(err)
		}
		return id
	}
	srvID := issue("server")
	issue("client")
	const clients = 1000
	procs := runtime.GOMAXPROCS(0)
	for _, limit := range []int{0, max(1, procs/2), procs} {
		name := "tls.NewListener"
		if limit > 0 {
			name = fmt.Sprintf("tlsgate-%d", limit)
		}
		b.Run(name, func(b *testing.B) {
			var late []float64
			var storms []float64
			for b.Loop() {
				inner, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					b.Fatal(err)
				}
				var ln net.Listener
				if limit > 0 {
					ln = New(inner, Config{TLS: srvID.Server(), Limit: limit})
				} else {
					ln = tls.NewListener(inner, srvID.Server())
				}
				srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })}
				go func() { _ = srv.Serve(ln) }()

				stop := make(chan struct{})
				ticked := make(chan []float64)
				go func() {
					var l []float64
					const every = 2 * time.Millisecond
					t := time.NewTicker(every)
					defer t.Stop()
					next := time.Now().Add(every)
					for {
						select {
						case <-stop:
							ticked <- l
							return
						case <-t.C:
							now := time.Now()
							l = append(l, float64(max(0, now.Sub(next)))/1e6)
							next = now.Add(every)
						}
					}
				}()
				cmd := exec.Command(os.Args[0], "-test.run=^$")
				cmd.Env = append(os.Environ(), stormAddrEnv+"="+inner.Addr().String(),
					stormClientsEnv+"="+strconv.Itoa(clients), stormIDEnv+"="+filepath.Join(dir, "client"))
				cmd.Stderr = os.Stderr
				began := time.Now()
				if err := cmd.Run(); err != nil {
					b.Fatalf("the storm's clients: %v", err)
				}
				storms = append(storms, time.Since(began).Seconds())
				close(stop)
				late = append(late, <-ticked...)
				_ = srv.Close()
			}
			slices.Sort(late)
			b.ReportMetric(late[len(late)*99/100], "p99-late-ms")
			b.ReportMetric(late[len(late)-1], "max-late-ms")
			var sum float64
			for _, s := range storms {
				sum += s
			}
			b.ReportMetric(sum/float64(len(storms)), "storm-s")
		})
	}
}
