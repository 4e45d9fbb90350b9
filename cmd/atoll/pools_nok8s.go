//go:build !kubernetes

package main

import (
	"encoding/json"

	"github.com/atoll-run/atoll/runtime/autoscale"
)

// kubernetesProvider is not linked without -tags kubernetes (client-go is large).
func kubernetesProvider(json.RawMessage, string, string) (autoscale.Provider, error) {
	return nil, errNoKubernetes
}
