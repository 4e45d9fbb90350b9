// Package metabench measures metadata write latency and throughput of a three-replica
// Atoll Paxos group (store/meta over store/paxos, fsync on, loopback TCP), together with
// the floor (this disk's fsync latency and a loopback round trip), optionally over mutual
// TLS against the same group in clear, and against a baseline system such as etcd when the
// caller links one in (package etcdbaseline; `go run ./cmd/atoll-benchmeta`). Every ratio
// compares figures measured in the same run.
//
//	cfg := metabench.DefaultConfig()
//	cfg.TLS = true
//	cfg.Baseline, cfg.BaselineName = etcdbaseline.Run, "etcd"
//	res, err := metabench.Run(ctx, cfg)
//	metabench.WriteReport(os.Stdout, cfg, res)
//
// It is a benchmark harness, not product code: the atoll binary links it without any
// baseline (`atoll bench meta`), so that no etcd server is linked into the product.
package metabench
