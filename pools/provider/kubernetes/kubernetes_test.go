package kubernetes

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/atoll-run/atoll/pools/provider"
)

func newTest(t *testing.T) (*Provider, *fake.Clientset) {
	cs := fake.NewSimpleClientset()
	p, err := New(Config{Image: "atoll:dev", Cluster: "c1", Join: "http://atoll-heads:7000", TokenSecret: "atoll-token",
		GPUResource: "nvidia.com/gpu", GPUs: 8, SpotNodeSelector: map[string]string{"cloud.google.com/gke-spot": "true"}}, cs)
	if err != nil {
		t.Fatal(err)
	}
	return p, cs
}

func TestLaunchListTerminate(t *testing.T) {
	p, cs := newTest(t)
	ctx := context.Background()
	req := provider.LaunchRequest{Pool: "h100-spot", Names: []string{"h100-spot-0", "h100-spot-1"}, Machine: "dgx-h100", Spot: true, Rack: 3}
	if err := p.Launch(ctx, req); err != nil {
		t.Fatal(err)
	}
	pod, err := cs.CoreV1().Pods("atoll").Get(ctx, "atoll-agent-h100-spot-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	args := strings.Join(pod.Spec.Containers[0].Args, " ")
	for _, want := range []string{"--join http://atoll-heads:7000", "--name h100-spot-0", "--machine dgx-h100", "--rack 3", "--token-file /etc/atoll/token/token"} {
		if !strings.Contains(args, want) {
			t.Errorf("pod args %q lack %q", args, want)
		}
	}
	if pod.Spec.NodeSelector["cloud.google.com/gke-spot"] != "true" {
		t.Errorf("spot pod's node selector %v", pod.Spec.NodeSelector)
	}
	if q := pod.Spec.Containers[0].Resources.Limits["nvidia.com/gpu"]; q.Value() != 8 {
		t.Errorf("GPU limit %v", q.String())
	}
	if pod.Labels[LabelPool] != "h100-spot" || pod.Spec.RestartPolicy != corev1.RestartPolicyNever {
		t.Errorf("pod %+v", pod.ObjectMeta)
	}
	// A retried launch leaves the pods as they are.
	if err := p.Launch(ctx, req); err != nil {
		t.Fatalf("relaunch: %v", err)
	}
	// Another cluster's pod is not listed.
	other := pod.DeepCopy()
	other.Name, other.Labels = "other", map[string]string{LabelCluster: "c2"}
	if _, err := cs.CoreV1().Pods("atoll").Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	l, err := p.List(ctx)
	if err != nil || len(l) != 2 {
		t.Fatalf("list %+v %v", l, err)
	}
	if err := p.Terminate(ctx, "h100-spot-0"); err != nil {
		t.Fatal(err)
	}
	if err := p.Terminate(ctx, "h100-spot-0"); err != nil {
		t.Fatalf("terminating a gone machine: %v", err)
	}
	if l, _ := p.List(ctx); len(l) != 1 || l[0].Name != "h100-spot-1" {
		t.Fatalf("after terminate: %+v", l)
	}
	if err := p.Launch(ctx, provider.LaunchRequest{Pool: "p", Names: []string{"Upper_Case"}}); !errors.Is(err, provider.ErrInvalid) {
		t.Fatalf("bad pod name: %v", err)
	}
	_ = p.Interrupt("h100-spot-1", time.Minute)
	if n := p.Notices(); len(n) != 1 || n[0].Machine != "h100-spot-1" {
		t.Fatalf("notices %+v", n)
	}
}

func TestQuotaIsNoCapacity(t *testing.T) {
	p, cs := newTest(t)
	cs.PrependReactor("create", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(corev1.Resource("pods"), "x", errors.New("exceeded quota: gpu-quota"))
	})
	err := p.Launch(context.Background(), provider.LaunchRequest{Pool: "p", Names: []string{"p-0"}, Machine: "dgx-h100"})
	if !errors.Is(err, provider.ErrNoCapacity) {
		t.Fatalf("quota refusal: %v", err)
	}
	cs.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("connection refused")
	})
	if _, err := p.List(context.Background()); !errors.Is(err, provider.ErrUnavailable) {
		t.Fatalf("API down: %v", err)
	}
}

// TestPodWithCAAndDiscovery: with a CA Secret the pod mounts its certificate alone (never
// the CA's key) and passes --ca-cert; a discovering pool's agents declare no machine.
func TestPodWithCAAndDiscovery(t *testing.T) {
	p, err := New(Config{Image: "atoll:nvml", Cluster: "c1", Join: "https://atoll-heads:7000", TokenSecret: "atoll-token", CASecret: "atoll-ca",
		Discover: true, GPUResource: "nvidia.com/gpu", GPUs: 8}, fake.NewSimpleClientset())
	if err != nil {
		t.Fatal(err)
	}
	pod, err := p.Pod(provider.LaunchRequest{Pool: "h100", Machine: "dgx-h100"}, "h100-0")
	if err != nil {
		t.Fatal(err)
	}
	args := strings.Join(pod.Spec.Containers[0].Args, " ")
	if !strings.Contains(args, "--ca-cert /etc/atoll/ca/ca.crt") || strings.Contains(args, "--machine") {
		t.Errorf("args %q: want --ca-cert and no --machine (the agent discovers its GPUs)", args)
	}
	var ca *corev1.Volume
	for i := range pod.Spec.Volumes {
		if pod.Spec.Volumes[i].Name == "ca" {
			ca = &pod.Spec.Volumes[i]
		}
	}
	if ca == nil || ca.Secret == nil || ca.Secret.SecretName != "atoll-ca" || len(ca.Secret.Items) != 1 || ca.Secret.Items[0].Key != "ca.crt" {
		t.Fatalf("the CA volume %+v: want the Secret's ca.crt key alone", ca)
	}
	// Without them: the pool's machine declared (simulated GPUs), no CA.
	p2, _ := newTest(t)
	pod, err = p2.Pod(provider.LaunchRequest{Pool: "h100", Machine: "dgx-h100"}, "h100-1")
	if err != nil {
		t.Fatal(err)
	}
	if args := strings.Join(pod.Spec.Containers[0].Args, " "); !strings.Contains(args, "--machine dgx-h100") || strings.Contains(args, "--ca-cert") {
		t.Errorf("args %q: want --machine dgx-h100 and no --ca-cert", args)
	}
}
