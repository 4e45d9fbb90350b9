// Package metabench measures metadata write latency and throughput of a three-replica
// Atoll Paxos group (store/meta over store/paxos, fsync on, loopback TCP) against an
// embedded three-member etcd cluster on the same machine, in the same run, together with
// the floor: this disk's fsync latency and a loopback round trip.
//
//	res, err := metabench.Run(ctx, metabench.DefaultConfig())
//	json.NewEncoder(os.Stdout).Encode(res)
package metabench
