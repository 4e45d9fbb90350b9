package kubernetes

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/kubernetes/scheme"
)

// TestManifests checks deploy/kubernetes without a live cluster (none runs here): every
// object decodes strictly with client-go's scheme (an unknown or misspelt field fails),
// every flag a container passes to atoll exists in that command's help (from a build of
// this repository's atoll), no container runs a shell (the image is FROM scratch), every
// mount has its volume, the agents get the CA's certificate and never its key, and the
// pool file's provider settings decode strictly.
func TestManifests(t *testing.T) {
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(root, "deploy", "kubernetes", "*.yaml"))
	if err != nil || len(files) < 4 {
		t.Fatalf("manifests %v %v: want heads, agents, pools and rbac", files, err)
	}
	dec := serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()
	var objs []runtime.Object
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		// Only the heads hold the cluster token: agents and pool pods get agent/*.
		if base := filepath.Base(f); base != "heads.yaml" && strings.Contains(regexp.MustCompile(`(?m)#.*$`).ReplaceAllString(string(b), ""), "atoll-token") {
			t.Errorf("%s mounts the cluster token (Secret atoll-token): agents get atoll-agent-credential (agent/*)", base)
		}
		for i, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(b), -1) {
			if strings.TrimSpace(regexp.MustCompile(`(?m)^\s*#.*$`).ReplaceAllString(doc, "")) == "" {
				continue
			}
			obj, gvk, err := dec.Decode([]byte(doc), nil, nil)
			if err != nil {
				t.Errorf("%s, document %d: %v", filepath.Base(f), i+1, err)
				continue
			}
			t.Logf("%s: %s", filepath.Base(f), gvk.Kind)
			objs = append(objs, obj)
		}
	}
	bin := filepath.Join(t.TempDir(), "atoll")
	build := exec.Command("go", "build", "-o", bin, "./cmd/atoll")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/atoll: %v\n%s", err, out)
	}
	helps := map[string]string{}
	help := func(cmd string) string {
		if h, ok := helps[cmd]; ok {
			return h
		}
		out, err := exec.Command(bin, cmd, "--help").CombinedOutput()
		if err != nil {
			t.Fatalf("atoll %s --help: %v\n%s", cmd, err, out)
		}
		helps[cmd] = string(out)
		return helps[cmd]
	}
	kinds := map[string]bool{}
	for _, o := range objs {
		var name string
		var spec *corev1.PodSpec
		switch x := o.(type) {
		case *appsv1.StatefulSet:
			name, spec = x.Name, &x.Spec.Template.Spec
			for _, c := range x.Spec.VolumeClaimTemplates { // a volume of its own per pod
				spec.Volumes = append(spec.Volumes, corev1.Volume{Name: c.Name})
			}
		case *appsv1.DaemonSet:
			name, spec = x.Name, &x.Spec.Template.Spec
		case *corev1.ConfigMap:
			if raw, ok := x.Data["pools.json"]; ok {
				checkPools(t, raw)
			}
			continue
		default:
			continue
		}
		kinds[name] = true
		vols := map[string]corev1.Volume{}
		for _, v := range spec.Volumes {
			vols[v.Name] = v
		}
		for _, c := range spec.Containers {
			if len(c.Command) != 1 || c.Command[0] != "/atoll" || len(c.Args) == 0 {
				t.Errorf("%s/%s: command %q args %q: want /atoll and a subcommand (no shell in a FROM-scratch image)", name, c.Name, c.Command, c.Args)
				continue
			}
			h := help(c.Args[0])
			for _, a := range c.Args[1:] {
				if !strings.HasPrefix(a, "--") {
					t.Errorf("%s/%s: argument %q: want --flag=value", name, c.Name, a)
					continue
				}
				flag, _, _ := strings.Cut(a, "=")
				if !regexp.MustCompile(`(?m)^\s+(-\w, )?` + regexp.QuoteMeta(flag) + `\b`).MatchString(h) {
					t.Errorf("%s/%s: atoll %s has no flag %s", name, c.Name, c.Args[0], flag)
				}
			}
			for _, m := range c.VolumeMounts {
				v, ok := vols[m.Name]
				if !ok {
					t.Errorf("%s/%s: mount %s has no volume", name, c.Name, m.Name)
					continue
				}
				if v.Secret != nil && v.Secret.SecretName == "atoll-ca" && c.Args[0] != "head" {
					if len(v.Secret.Items) != 1 || v.Secret.Items[0].Key != "ca.crt" {
						t.Errorf("%s/%s: mounts the CA Secret %+v: an agent gets ca.crt alone, never the CA's key", name, c.Name, v.Secret.Items)
					}
				}
			}
		}
	}
	if !kinds["atoll-head"] || !kinds["atoll-agent"] {
		t.Errorf("workloads %v: want the heads' StatefulSet and the agents' DaemonSet", kinds)
	}
}

// checkPools decodes the pool file's kubernetes settings strictly.
func checkPools(t *testing.T, raw string) {
	t.Helper()
	var f struct {
		Pools []struct {
			Name     string `json:"name"`
			Provider struct {
				Type     string          `json:"type"`
				Settings json.RawMessage `json:"settings"`
			} `json:"provider"`
		} `json:"pools"`
	}
	if err := json.Unmarshal([]byte(raw), &f); err != nil || len(f.Pools) == 0 {
		t.Fatalf("pools.json: %v (%d pools)", err, len(f.Pools))
	}
	for _, p := range f.Pools {
		if p.Provider.Type != "kubernetes" {
			continue
		}
		s, err := ParseSettings(p.Provider.Settings)
		if err != nil {
			t.Errorf("pool %s: %v", p.Name, err)
			continue
		}
		if _, err := New(s.Config("c", "https://atoll-heads:7000"), nil); err == nil || !strings.Contains(err.Error(), "clientset") {
			t.Errorf("pool %s: settings %+v: %v (want only the clientset missing)", p.Name, s, err)
		}
	}
}
