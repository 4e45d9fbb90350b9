// Command atoll-provider-kubernetes is the Kubernetes provider of autoscaling pools, as an
// Exec provider program (pools/provider.Exec): a head whose pool file names the provider
// "kubernetes" runs it once per operation, with one JSON request on its standard input and
// one JSON answer on its standard output. It runs agent pods in the cluster the head runs
// in (in-cluster configuration). It is its own Go module, so that client-go never enters
// the atoll binary:
//
//	go -C pools/provider/kubernetes build -o /usr/local/bin/atoll-provider-kubernetes ./cmd/atoll-provider-kubernetes
//
// The head finds it in PATH, or where ATOLL_PROVIDER_KUBERNETES names it.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/atoll-run/atoll/pools/provider"
	"github.com/atoll-run/atoll/pools/provider/kubernetes"
)

// newProvider makes the provider for one request (strict settings: an unknown key is
// refused by name).
func newProvider(req provider.ExecRequest) (provider.Provider, error) {
	s, err := kubernetes.ParseSettings(req.Settings)
	if err != nil {
		return nil, err
	}
	rc, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("%w: kubernetes: %v", provider.ErrUnavailable, err)
	}
	cs, err := k8s.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("%w: kubernetes: %v", provider.ErrUnavailable, err)
	}
	join := req.Join
	if s.Join != "" {
		join = s.Join
	}
	return kubernetes.New(s.Config(req.Cluster, join), cs)
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := provider.ServeExec(ctx, os.Stdin, os.Stdout, newProvider); err != nil {
		fmt.Fprintln(os.Stderr, "atoll-provider-kubernetes:", err)
		stop()
		os.Exit(1)
	}
}
