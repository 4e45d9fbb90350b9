//go:build kubernetes

package main

import (
	"encoding/json"
	"fmt"

	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/atoll-run/atoll/pools/provider/kubernetes"
	"github.com/atoll-run/atoll/runtime/autoscale"
)

// kubernetesSettings are the kubernetes provider's settings in a pool file.
type kubernetesSettings struct {
	Namespace        string            `json:"namespace,omitempty"`
	Image            string            `json:"image"`
	Join             string            `json:"join,omitempty"`
	TokenSecret      string            `json:"token_secret"`
	GPUResource      string            `json:"gpu_resource,omitempty"`
	GPUs             int               `json:"gpus,omitempty"`
	NodeSelector     map[string]string `json:"node_selector,omitempty"`
	SpotNodeSelector map[string]string `json:"spot_node_selector,omitempty"`
	ServiceAccount   string            `json:"service_account,omitempty"`
}

// kubernetesProvider runs agent pods in the cluster the head runs in (in-cluster config).
func kubernetesProvider(raw json.RawMessage, cluster, join string) (autoscale.Provider, error) {
	var s kubernetesSettings
	if err := decodeSettings(raw, &s); err != nil {
		return nil, fmt.Errorf("settings: %w", err)
	}
	rc, err := rest.InClusterConfig()
	if err != nil {
		return nil, err
	}
	cs, err := k8s.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	if s.Join != "" {
		join = s.Join
	}
	return kubernetes.New(kubernetes.Config{Namespace: s.Namespace, Image: s.Image, Cluster: cluster, Join: join, TokenSecret: s.TokenSecret,
		GPUResource: s.GPUResource, GPUs: s.GPUs, NodeSelector: s.NodeSelector, SpotNodeSelector: s.SpotNodeSelector, ServiceAccount: s.ServiceAccount}, cs)
}
