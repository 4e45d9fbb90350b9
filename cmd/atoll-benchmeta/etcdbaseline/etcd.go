// Package etcdbaseline is the etcd side of the metadata benchmark: an embedded
// three-member etcd cluster (v3.7, defaults, fsync on) on loopback, written through
// clientv3 with one client per eight writers, as etcd's own benchmark tool shares
// connections. Only cmd/atoll-benchmeta, its own Go module, links it: the atoll binary and the root
// module carry no etcd.
package etcdbaseline

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/atoll-run/atoll/internal/bench/metabench"
)

var _ metabench.Baseline = Run

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// Run starts an embedded three-member etcd cluster with its defaults (fsync on) on
// loopback and writes through clientv3.
func Run(ctx context.Context, cfg metabench.Config, dir string) (metabench.Stats, error) {
	type member struct {
		name         string
		peer, client url.URL
	}
	var ms []member
	initial := ""
	for i := 1; i <= 3; i++ {
		pp, err := freePort()
		if err != nil {
			return metabench.Stats{}, err
		}
		cp, err := freePort()
		if err != nil {
			return metabench.Stats{}, err
		}
		m := member{name: fmt.Sprintf("e%d", i)}
		m.peer = url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", pp)}
		m.client = url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", cp)}
		ms = append(ms, m)
		if initial != "" {
			initial += ","
		}
		initial += m.name + "=" + m.peer.String()
	}
	var servers []*embed.Etcd
	defer func() {
		for _, e := range servers {
			e.Close()
		}
	}()
	for _, m := range ms {
		ec := embed.NewConfig()
		ec.Name = m.name
		ec.Dir = filepath.Join(dir, m.name)
		ec.ListenPeerUrls = []url.URL{m.peer}
		ec.AdvertisePeerUrls = []url.URL{m.peer}
		ec.ListenClientUrls = []url.URL{m.client}
		ec.AdvertiseClientUrls = []url.URL{m.client}
		ec.InitialCluster = initial
		ec.InitialClusterToken = "atoll-bench"
		ec.ClusterState = embed.ClusterStateFlagNew
		ec.LogLevel = "error"
		e, err := embed.StartEtcd(ec)
		if err != nil {
			return metabench.Stats{}, fmt.Errorf("etcdbaseline: start etcd %s: %w", m.name, err)
		}
		servers = append(servers, e)
	}
	for _, e := range servers {
		select {
		case <-e.Server.ReadyNotify():
		case <-time.After(60 * time.Second):
			return metabench.Stats{}, fmt.Errorf("etcdbaseline: etcd not ready after 60s")
		case <-ctx.Done():
			return metabench.Stats{}, ctx.Err()
		}
	}
	var eps []string
	for _, m := range ms {
		eps = append(eps, m.client.String())
	}
	// One client per 8 writers, as etcd's own benchmark tool shares connections.
	nc := max(1, cfg.Clients/8)
	var clients []*clientv3.Client
	for i := 0; i < nc; i++ {
		c, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			return metabench.Stats{}, fmt.Errorf("etcdbaseline: etcd client: %w", err)
		}
		defer c.Close()
		clients = append(clients, c)
	}
	var rr atomic.Uint64
	return metabench.Measure(ctx, cfg, func(ctx context.Context, key string, val []byte) error {
		c := clients[int(rr.Add(1))%len(clients)]
		_, err := c.Put(ctx, key, string(val))
		return err
	})
}
