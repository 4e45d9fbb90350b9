package main

import (
	"github.com/spf13/cobra"

	"github.com/atoll-run/atoll/internal/bench/metabench"
)

// newBenchMetaCmd is `atoll bench meta`: Atoll's Paxos metadata log on this machine against
// its floor (and, with --tls, over mutual TLS against the same group in clear). The
// comparison with etcd is a separate build, so that the atoll binary links no etcd:
// `go run ./cmd/atoll-benchmeta`.
func newBenchMetaCmd() *cobra.Command {
	return metabench.Command("meta",
		"Metadata writes of 3 Atoll Paxos replicas against the fsync and RTT floor (with etcd: go run ./cmd/atoll-benchmeta)", nil, "")
}
