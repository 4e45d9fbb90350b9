package provider

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestDockerEngine runs the Docker provider against the real Docker Engine: it builds the
// FROM-scratch atoll image (deploy/Dockerfile), launches two agent containers, checks
// their command line, labels and state through the Engine API, relaunches one (nothing new
// is made), injects a notice, and terminates them. The agents cannot reach a head here
// (the engine's network is not this machine's loopback), so they are checked as
// containers, not as cluster members. Bounded to 5 minutes; skipped without an engine.
func TestDockerEngine(t *testing.T) {
	if testing.Short() {
		t.Skip("builds an image and runs containers")
	}
	sock := "/var/run/docker.sock"
	if c, err := net.DialTimeout("unix", sock, time.Second); err != nil {
		t.Skipf("no Docker Engine at %s (%v): the docker provider's engine test needs one", sock, err)
	} else {
		c.Close()
	}
	if _, err := exec.LookPath("docker"); err != nil {
		t.Skip("the docker CLI is not installed: it builds the test's image")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir := t.TempDir()
	build := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(dir, "atoll"), "../../cmd/atoll")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("static build: %v\n%s", err, out)
	}
	df, err := os.ReadFile("../../deploy/Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "Dockerfile"), df, 0o644); err != nil {
		t.Fatal(err)
	}
	cluster := fmt.Sprintf("poolstest%d", os.Getpid())
	image := "atoll:" + cluster
	if out, err := exec.CommandContext(ctx, "docker", "build", "-q", "-t", image, dir).CombinedOutput(); err != nil {
		t.Fatalf("docker build: %v\n%s", err, out)
	}
	d, err := NewDocker(DockerConfig{Socket: sock, Image: image, Cluster: cluster, Join: "http://heads.invalid:7000",
		Env: []string{"ATOLL_TOKEN=0123456789abcdef0123456789abcdef", "KEEP=1"}, StopTimeout: 2 * time.Second,
		Credential: func(m string) (string, error) { return "credential-of-" + m, nil }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if l, err := d.List(c); err == nil {
			for _, i := range l {
				_ = d.Terminate(c, i.Name)
			}
		}
		_ = exec.CommandContext(c, "docker", "rmi", "-f", image).Run()
	})
	req := LaunchRequest{Pool: "h100", Names: []string{"h100-0", "h100-1"}, Machine: "dgx-h100", Rack: 1}
	if err := d.Launch(ctx, req); err != nil {
		t.Fatal(err)
	}
	var info struct {
		Config struct {
			Cmd    []string          `json:"Cmd"`
			Env    []string          `json:"Env"`
			Labels map[string]string `json:"Labels"`
		} `json:"Config"`
		State struct {
			Status string `json:"Status"`
		} `json:"State"`
	}
	if _, err := d.call(ctx, http.MethodGet, "/containers/"+cluster+"-h100-0/json", nil, nil, &info); err != nil {
		t.Fatal(err)
	}
	cmd := strings.Join(info.Config.Cmd, " ")
	if !strings.HasPrefix(cmd, "agent --join http://heads.invalid:7000 --name h100-0 --machine dgx-h100 --rack 1") {
		t.Fatalf("container command %q", cmd)
	}
	// The machine's own credential replaces the cluster token; the rest of Env stays.
	if env := strings.Join(info.Config.Env, " "); !strings.Contains(env, "ATOLL_TOKEN=credential-of-h100-0") || strings.Contains(env, "0123456789abcdef") || !strings.Contains(env, "KEEP=1") {
		t.Fatalf("container env %q: want its credential, not the cluster token", env)
	}
	if info.Config.Labels[labelPool] != "h100" || info.Config.Labels[labelCluster] != cluster {
		t.Fatalf("labels %v", info.Config.Labels)
	}
	list, err := d.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 {
		t.Fatalf("list %+v, want the two machines", list)
	}
	// A retried launch of a machine that exists makes nothing new.
	if err := d.Launch(ctx, LaunchRequest{Pool: "h100", Names: []string{"h100-0"}, Machine: "dgx-h100"}); err != nil {
		t.Fatalf("relaunch: %v", err)
	}
	if l, _ := d.List(ctx); len(l) != 2 {
		t.Fatalf("after a relaunch: %+v", l)
	}
	if err := d.Interrupt("h100-1", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	if n := d.Notices(); len(n) != 1 || n[0].Machine != "h100-1" {
		t.Fatalf("notices %+v", n)
	}
	for _, name := range req.Names {
		if err := d.Terminate(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Terminate(ctx, "h100-0"); err != nil {
		t.Fatalf("terminating a gone machine: %v", err)
	}
	if l, err := d.List(ctx); err != nil || len(l) != 0 {
		t.Fatalf("after terminate: %+v %v", l, err)
	}
	code, err := d.call(ctx, http.MethodGet, "/containers/"+url.PathEscape(cluster+"-h100-0")+"/json", nil, nil, nil)
	if code != http.StatusNotFound || err == nil {
		t.Fatalf("removed container still inspectable: %d %v", code, err)
	}
	// A discovering pool: the agent declares no machine, and the container asks for the
	// host's GPUs. Where the Engine has no NVIDIA runtime (as here) the start fails, naming
	// the driver; the container was made with the request.
	gd, err := NewDocker(DockerConfig{Socket: sock, Image: image, Cluster: cluster, Join: "http://heads.invalid:7000", Discover: true, GPUs: 2,
		Env: []string{"ATOLL_TOKEN=0123456789abcdef0123456789abcdef"}, StopTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	lerr := gd.Launch(ctx, LaunchRequest{Pool: "gpu", Names: []string{"gpu-0"}, Machine: "dgx-h100"})
	if lerr != nil && !strings.Contains(lerr.Error(), "nvidia") {
		t.Fatalf("a discovering machine's launch failed for another reason than the NVIDIA runtime: %v", lerr)
	}
	var gi struct {
		Config struct {
			Cmd []string `json:"Cmd"`
		} `json:"Config"`
		HostConfig struct {
			DeviceRequests []struct {
				Driver       string
				Count        int
				Capabilities [][]string
			}
		} `json:"HostConfig"`
	}
	if _, err := gd.call(ctx, http.MethodGet, "/containers/"+cluster+"-gpu-0/json", nil, nil, &gi); err != nil {
		t.Fatalf("the discovering machine's container: %v (launch: %v)", err, lerr)
	}
	if c := strings.Join(gi.Config.Cmd, " "); strings.Contains(c, "--machine") {
		t.Errorf("a discovering agent declares a machine: %q", c)
	}
	if dr := gi.HostConfig.DeviceRequests; len(dr) != 1 || dr[0].Driver != "nvidia" || dr[0].Count != 2 || len(dr[0].Capabilities) != 1 || dr[0].Capabilities[0][0] != "gpu" {
		t.Errorf("device requests %+v: want 2 GPUs of the nvidia driver", dr)
	}
	if err := gd.Terminate(ctx, "gpu-0"); err != nil {
		t.Fatal(err)
	}
	// A socket with no engine behind it is ErrUnavailable.
	bad, _ := NewDocker(DockerConfig{Socket: filepath.Join(dir, "none.sock"), Image: image, Cluster: cluster, Join: "x"})
	if _, err := bad.List(ctx); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("no engine: %v", err)
	}
}
