// Package kubernetes is the pools provider that runs each machine as an agent pod
// (deploy/kubernetes/ has the heads' manifests and the RBAC the leader needs). It pulls in
// client-go, so it is a Go module of its own, and the head runs it as an Exec provider
// program (cmd/atoll-provider-kubernetes): the atoll binary never links it.
package kubernetes

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8s "k8s.io/client-go/kubernetes"

	"github.com/atoll-run/atoll/pools/provider"
)

// Config configures the provider.
type Config struct {
	// Namespace the pods live in. Default "atoll".
	Namespace string
	// Image is the agent image (deploy/Dockerfile's). Required.
	Image string
	// Cluster labels the pods (atoll.run/cluster) so that List sees only this cluster's.
	Cluster string
	// Join is the heads' API URLs as pods reach them (the heads' Service). Required.
	Join string
	// TokenSecret is the Secret holding the cluster token under the key "token"; it is
	// mounted read-only and passed as --token-file. Required.
	TokenSecret string
	// CASecret is the Secret holding the cluster CA under the key "ca.crt" (atoll init's
	// tls/ca.crt): only that key is mounted, and passed as --ca-cert, so that the agent
	// gets its certificate from https heads. Empty: the heads serve without TLS.
	CASecret string
	// Discover makes the agents discover their machine (NVML: the image is the -tags nvml
	// build with the node's libnvidia-ml.so.1) instead of declaring the pool's machine
	// type with simulated GPUs.
	Discover bool
	// GPUResource is the extended resource a pod asks per GPU of its machine type
	// ("nvidia.com/gpu"); empty asks none (simulated GPUs: --machine declares them).
	GPUResource string
	// GPUs is the number of GPUs to ask per pod when GPUResource is set.
	GPUs int
	// NodeSelector and SpotNodeSelector choose the nodes of on-demand and spot pools
	// (cloud node pools label spot nodes, e.g. cloud.google.com/gke-spot=true).
	NodeSelector     map[string]string
	SpotNodeSelector map[string]string
	// ServiceAccount the pods run as (default "default").
	ServiceAccount string
	// GracePeriod is the pods' termination grace. Default 30 s.
	GracePeriod time.Duration
	// Now is the clock for notices.
	Now func() time.Time
}

// Provider runs machines as agent pods.
type Provider struct {
	cfg Config
	cs  k8s.Interface

	mu      sync.Mutex
	pending []provider.Notice
}

var (
	_ provider.Provider    = (*Provider)(nil)
	_ provider.Interrupter = (*Provider)(nil)
)

// Labels of the pods.
const (
	LabelCluster = "atoll.run/cluster"
	LabelPool    = "atoll.run/pool"
	LabelMachine = "atoll.run/machine"
)

var nameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// New returns a provider over a clientset (kubernetes.NewForConfig on a cluster,
// fake.NewSimpleClientset in tests).
func New(cfg Config, cs k8s.Interface) (*Provider, error) {
	if cfg.Namespace == "" {
		cfg.Namespace = "atoll"
	}
	if cfg.GracePeriod == 0 {
		cfg.GracePeriod = 30 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Image == "" || cfg.Join == "" || cfg.TokenSecret == "" || cfg.Cluster == "" {
		return nil, fmt.Errorf("%w: the kubernetes provider needs an image, the heads' address, the token Secret and a cluster label", provider.ErrInvalid)
	}
	if cs == nil {
		return nil, fmt.Errorf("%w: no Kubernetes clientset", provider.ErrInvalid)
	}
	return &Provider{cfg: cfg, cs: cs}, nil
}

// podName is a machine's pod: pod names are DNS labels, so machine names must be lower case.
func podName(machine string) (string, error) {
	if !nameRE.MatchString(machine) {
		return "", fmt.Errorf("%w: machine name %q is not a DNS label (lower-case letters, digits, '-')", provider.ErrInvalid, machine)
	}
	return "atoll-agent-" + machine, nil
}

// Pod returns the pod a machine runs as.
func (p *Provider) Pod(req provider.LaunchRequest, machine string) (*corev1.Pod, error) {
	name, err := podName(machine)
	if err != nil {
		return nil, err
	}
	grace := int64(p.cfg.GracePeriod / time.Second)
	sel := p.cfg.NodeSelector
	if req.Spot {
		sel = p.cfg.SpotNodeSelector
	}
	c := corev1.Container{
		Name:  "agent",
		Image: p.cfg.Image,
		Args: []string{"agent", "--join", p.cfg.Join, "--name", machine, "--rack", strconv.Itoa(req.Rack),
			"--dir", "/var/lib/atoll", "--token-file", "/etc/atoll/token/token",
			"--listen", "0.0.0.0:7070", "--transfer-listen", "0.0.0.0:7071", "--gossip", "0.0.0.0:7946", "--advertise", "$(POD_IP)"},
		Env: []corev1.EnvVar{{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}}},
		VolumeMounts: []corev1.VolumeMount{
			{Name: "token", MountPath: "/etc/atoll/token", ReadOnly: true},
			{Name: "data", MountPath: "/var/lib/atoll"},
			{Name: "shm", MountPath: "/dev/shm"},
		},
		Ports: []corev1.ContainerPort{{Name: "api", ContainerPort: 7070}, {Name: "transfer", ContainerPort: 7071}, {Name: "gossip", ContainerPort: 7946}},
	}
	if !p.cfg.Discover {
		c.Args = append(c.Args, "--machine", req.Machine) // simulated GPUs, declared as such
	}
	var caVolume []corev1.Volume
	if p.cfg.CASecret != "" {
		c.Args = append(c.Args, "--ca-cert", "/etc/atoll/ca/ca.crt")
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "ca", MountPath: "/etc/atoll/ca", ReadOnly: true})
		caMode := int32(0o444)
		caVolume = []corev1.Volume{{Name: "ca", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: p.cfg.CASecret,
			Items: []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}, DefaultMode: &caMode}}}} // the certificate, never the CA's key
	}
	if p.cfg.GPUResource != "" && p.cfg.GPUs > 0 {
		q := resource.MustParse(strconv.Itoa(p.cfg.GPUs))
		c.Resources.Limits = corev1.ResourceList{corev1.ResourceName(p.cfg.GPUResource): q}
	}
	mode := int32(0o400)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: p.cfg.Namespace,
			Labels: map[string]string{LabelCluster: p.cfg.Cluster, LabelPool: req.Pool, LabelMachine: machine, "app.kubernetes.io/name": "atoll-agent"}},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever, // a machine that fails is replaced by the pools, not restarted in place
			ServiceAccountName:            p.cfg.ServiceAccount,
			TerminationGracePeriodSeconds: &grace,
			NodeSelector:                  sel,
			Containers:                    []corev1.Container{c},
			Volumes: append([]corev1.Volume{
				{Name: "token", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: p.cfg.TokenSecret, DefaultMode: &mode}}},
				{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
				{Name: "shm", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory}}},
			}, caVolume...),
		},
	}, nil
}

// Launch creates one agent pod per name; a pod that exists is left as it is.
func (p *Provider) Launch(ctx context.Context, req provider.LaunchRequest) error {
	var pods []*corev1.Pod
	for _, m := range req.Names {
		pod, err := p.Pod(req, m)
		if err != nil {
			return err
		}
		pods = append(pods, pod)
	}
	for _, pod := range pods {
		_, err := p.cs.CoreV1().Pods(p.cfg.Namespace).Create(ctx, pod, metav1.CreateOptions{})
		switch {
		case err == nil, apierrors.IsAlreadyExists(err):
		case apierrors.IsForbidden(err) && isQuota(err):
			return fmt.Errorf("%w: pod %s: %v", provider.ErrNoCapacity, pod.Name, err)
		default:
			return fmt.Errorf("%w: create pod %s: %v", provider.ErrUnavailable, pod.Name, err)
		}
	}
	return nil
}

func isQuota(err error) bool {
	var st apierrors.APIStatus
	if errors.As(err, &st) {
		return regexp.MustCompile(`exceeded quota`).MatchString(st.Status().Message)
	}
	return false
}

// Terminate deletes a machine's pod.
func (p *Provider) Terminate(ctx context.Context, machine string) error {
	name, err := podName(machine)
	if err != nil {
		return err
	}
	grace := int64(p.cfg.GracePeriod / time.Second)
	err = p.cs.CoreV1().Pods(p.cfg.Namespace).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &grace})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("%w: delete pod %s: %v", provider.ErrUnavailable, name, err)
	}
	return nil
}

// List returns this cluster's agent pods.
func (p *Provider) List(ctx context.Context) ([]provider.Instance, error) {
	l, err := p.cs.CoreV1().Pods(p.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: LabelCluster + "=" + p.cfg.Cluster})
	if err != nil {
		return nil, fmt.Errorf("%w: list pods: %v", provider.ErrUnavailable, err)
	}
	out := make([]provider.Instance, 0, len(l.Items))
	for _, pod := range l.Items {
		running := pod.Status.Phase == corev1.PodRunning || pod.Status.Phase == corev1.PodPending || pod.Status.Phase == ""
		out = append(out, provider.Instance{Name: pod.Labels[LabelMachine], Pool: pod.Labels[LabelPool], Running: running && pod.DeletionTimestamp == nil,
			Started: pod.CreationTimestamp.Time, Detail: "pod " + pod.Name})
	}
	return out, nil
}

// Interrupt injects a notice (on a cloud, a node-termination handler's taint or the
// node's preemption event is the real source: see docs/pools.md).
func (p *Provider) Interrupt(machine string, after time.Duration) error {
	if _, err := podName(machine); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pending = append(p.pending, provider.Notice{Machine: machine, Deadline: p.cfg.Now().Add(after)})
	return nil
}

// Notices returns the notices not yet returned.
func (p *Provider) Notices() []provider.Notice {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := p.pending
	p.pending = nil
	return out
}

// Settings are the kubernetes provider's settings in a pool file.
type Settings struct {
	Namespace        string            `json:"namespace,omitempty"`
	Image            string            `json:"image"`
	Join             string            `json:"join,omitempty"`
	TokenSecret      string            `json:"token_secret"`
	CASecret         string            `json:"ca_secret,omitempty"`
	Discover         bool              `json:"discover,omitempty"`
	GPUResource      string            `json:"gpu_resource,omitempty"`
	GPUs             int               `json:"gpus,omitempty"`
	NodeSelector     map[string]string `json:"node_selector,omitempty"`
	SpotNodeSelector map[string]string `json:"spot_node_selector,omitempty"`
	ServiceAccount   string            `json:"service_account,omitempty"`
}

// ParseSettings reads a pool's settings strictly: an unknown key is refused by name.
func ParseSettings(raw []byte) (Settings, error) {
	var s Settings
	if len(raw) == 0 {
		return s, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return Settings{}, fmt.Errorf("%w: kubernetes settings: %v", provider.ErrInvalid, err)
	}
	return s, nil
}

// Config is the provider's configuration of these settings for a cluster whose heads
// the pods reach at join.
func (s Settings) Config(cluster, join string) Config {
	return Config{Namespace: s.Namespace, Image: s.Image, Cluster: cluster, Join: join, TokenSecret: s.TokenSecret, CASecret: s.CASecret,
		Discover: s.Discover, GPUResource: s.GPUResource, GPUs: s.GPUs, NodeSelector: s.NodeSelector, SpotNodeSelector: s.SpotNodeSelector,
		ServiceAccount: s.ServiceAccount}
}
