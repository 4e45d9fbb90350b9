package provider

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/atoll-run/atoll/internal/dockerapi"
)

// DockerConfig configures the Docker provider.
type DockerConfig struct {
	// Socket is the Docker Engine's unix socket. Default /var/run/docker.sock.
	Socket string
	// Image is the agent image: deploy/Dockerfile's FROM-scratch atoll image. Required.
	Image string
	// Cluster labels the containers (atoll.cluster=<Cluster>) so that List sees only this
	// cluster's. Required.
	Cluster string
	// Join is the heads' API URLs as the containers reach them (the agents' --join).
	Join string
	// Network is the container network (default "bridge"; "host" shares this machine's).
	Network string
	// Env is added to the agents' environment (ATOLL_TOKEN=... for the cluster secret, which
	// the Engine keeps in the container's config: give a token file through Binds instead
	// where that matters).
	Env []string
	// Binds are bind mounts ("host:container:ro"), e.g. a token file.
	Binds []string
	// Credential, when set, makes each machine's agent credential (a scoped token of
	// agent/<name>), given as the container's ATOLL_TOKEN instead of any in Env: the
	// Engine keeps it in the container's config, and it is that machine's agent's only.
	Credential func(machine string) (string, error)
	// Discover makes the agents discover their machine (NVML: Image is then deploy's
	// Dockerfile.nvml build) instead of declaring the pool's machine (simulated GPUs):
	// each container gets the host's GPUs as a device request (the NVIDIA container
	// runtime), GPUs of them (0: all), and the agent registers what it sees.
	Discover bool
	GPUs     int
	// StopTimeout is the grace docker stop gives an agent. Default 10 s.
	StopTimeout time.Duration
	// APIVersion is the Engine API version in request paths. Default v1.41 (Docker 20.10+).
	APIVersion string
	// Now is the clock for notices (default time.Now).
	Now func() time.Time
}

// Docker runs each machine as an agent container through the Docker Engine API
// (https://docs.docker.com/reference/api/engine/), over its unix socket.
type Docker struct {
	cfg DockerConfig
	api *dockerapi.Client
	notices
}

var _ Provider = (*Docker)(nil)
var _ Interrupter = (*Docker)(nil)

// Container labels.
const (
	labelCluster = "atoll.cluster"
	labelPool    = "atoll.pool"
	labelMachine = "atoll.machine"
)

// NewDocker returns a Docker provider.
func NewDocker(cfg DockerConfig) (*Docker, error) {
	if cfg.Socket == "" {
		cfg.Socket = "/var/run/docker.sock"
	}
	if cfg.Network == "" {
		cfg.Network = "bridge"
	}
	if cfg.StopTimeout == 0 {
		cfg.StopTimeout = 10 * time.Second
	}
	if cfg.APIVersion == "" {
		cfg.APIVersion = "v1.41"
	}
	if cfg.Image == "" || cfg.Cluster == "" || cfg.Join == "" {
		return nil, fmt.Errorf("%w: the docker provider needs an image, a cluster label and the heads' address", ErrInvalid)
	}
	if !nameRE.MatchString(cfg.Cluster) {
		return nil, fmt.Errorf("%w: cluster label %q", ErrInvalid, cfg.Cluster)
	}
	return &Docker{cfg: cfg, api: dockerapi.New(cfg.Socket, cfg.APIVersion), notices: notices{now: cfg.Now}}, nil
}

// containerName is the container of a machine: <cluster>-<machine>.
func (d *Docker) containerName(machine string) string { return d.cfg.Cluster + "-" + machine }

// call does one Engine API request; out, when not nil, receives the JSON answer. It
// returns the status code; an Engine it cannot reach is ErrUnavailable.
func (d *Docker) call(ctx context.Context, method, path string, q url.Values, body, out any) (int, error) {
	code, err := d.api.Call(ctx, method, path, q, body, out)
	switch {
	case errors.Is(err, dockerapi.ErrUnreachable):
		return code, fmt.Errorf("%w: %v", ErrUnavailable, err)
	case err != nil:
		return code, fmt.Errorf("provider: %w", err)
	}
	return code, nil
}

// Launch creates and starts one agent container per name.
func (d *Docker) Launch(ctx context.Context, req LaunchRequest) error {
	for _, name := range req.Names {
		if !nameRE.MatchString(name) {
			return fmt.Errorf("%w: machine name %q", ErrInvalid, name)
		}
	}
	for _, name := range req.Names {
		cname := d.containerName(name)
		machine := req.Machine
		binds := append([]string(nil), d.cfg.Binds...)
		if strings.ContainsRune(machine, '/') || strings.HasSuffix(machine, ".json") {
			abs, err := filepath.Abs(machine)
			if err != nil {
				return err
			}
			binds = append(binds, abs+":/etc/atoll/machine.json:ro")
			machine = "/etc/atoll/machine.json"
		}
		cmd := []string{"agent", "--join", d.cfg.Join, "--name", name}
		if !d.cfg.Discover {
			cmd = append(cmd, "--machine", machine)
		}
		cmd = append(cmd, "--rack", strconv.Itoa(req.Rack), "--dir", "/var/lib/atoll")
		if d.cfg.Network != "host" {
			cmd = append(cmd, "--listen", "0.0.0.0:7070", "--transfer-listen", "0.0.0.0:7071", "--gossip", "0.0.0.0:7946", "--advertise", cname)
		}
		env := d.cfg.Env
		if d.cfg.Credential != nil {
			tok, err := d.cfg.Credential(name)
			if err != nil {
				return fmt.Errorf("provider: agent %s: its credential: %w", name, err)
			}
			env = []string{"ATOLL_TOKEN=" + tok}
			for _, e := range d.cfg.Env {
				if !strings.HasPrefix(e, "ATOLL_TOKEN=") && !strings.HasPrefix(e, "ATOLL_TOKEN_FILE=") {
					env = append(env, e)
				}
			}
		}
		host := map[string]any{
			"NetworkMode": d.cfg.Network,
			"Binds":       binds,
			"Tmpfs":       map[string]string{"/var/lib/atoll": "rw,size=1g", "/tmp": "rw"},
			"ShmSize":     1 << 30,
		}
		if d.cfg.Discover {
			count := d.cfg.GPUs
			if count <= 0 {
				count = -1 // every GPU of the host
			}
			host["DeviceRequests"] = []map[string]any{{"Driver": "nvidia", "Count": count, "Capabilities": [][]string{{"gpu"}}}}
		}
		create := map[string]any{
			"Image":      d.cfg.Image,
			"Cmd":        cmd,
			"Env":        env,
			"Labels":     map[string]string{labelCluster: d.cfg.Cluster, labelPool: req.Pool, labelMachine: name},
			"HostConfig": host,
		}
		code, err := d.call(ctx, http.MethodPost, "/containers/create", url.Values{"name": {cname}}, create, nil)
		if err != nil && code != http.StatusConflict { // 409: it exists (a retried launch): start it
			return err
		}
		if code, err := d.call(ctx, http.MethodPost, "/containers/"+cname+"/start", nil, nil, nil); err != nil && code != http.StatusNotModified {
			return err
		}
	}
	return nil
}

// Terminate stops and removes a machine's container.
func (d *Docker) Terminate(ctx context.Context, name string) error {
	cname := d.containerName(name)
	q := url.Values{"t": {strconv.Itoa(int(d.cfg.StopTimeout / time.Second))}}
	code, err := d.call(ctx, http.MethodPost, "/containers/"+cname+"/stop", q, nil, nil)
	if code == http.StatusNotFound {
		return nil
	}
	if err != nil && code != http.StatusNotModified {
		return err
	}
	code, err = d.call(ctx, http.MethodDelete, "/containers/"+cname, url.Values{"force": {"1"}, "v": {"1"}}, nil, nil)
	if code == http.StatusNotFound {
		return nil
	}
	return err
}

// List returns this cluster's agent containers, running or not.
func (d *Docker) List(ctx context.Context) ([]Instance, error) {
	filters, _ := json.Marshal(map[string][]string{"label": {labelCluster + "=" + d.cfg.Cluster}})
	var cs []struct {
		ID      string            `json:"Id"`
		State   string            `json:"State"`
		Created int64             `json:"Created"`
		Labels  map[string]string `json:"Labels"`
	}
	if _, err := d.call(ctx, http.MethodGet, "/containers/json", url.Values{"all": {"1"}, "filters": {string(filters)}}, nil, &cs); err != nil {
		return nil, err
	}
	out := make([]Instance, 0, len(cs))
	for _, c := range cs {
		out = append(out, Instance{Name: c.Labels[labelMachine], Pool: c.Labels[labelPool], Running: c.State == "running",
			Started: time.Unix(c.Created, 0), Detail: "container " + c.ID[:min(12, len(c.ID))]})
	}
	return out, nil
}

// Interrupt injects an interruption notice for a machine of this cluster.
func (d *Docker) Interrupt(name string, after time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := d.List(ctx)
	if err != nil {
		return err
	}
	known := false
	for _, i := range l {
		known = known || i.Name == name
	}
	return d.add(name, after, known)
}

// Notices returns the injected notices not yet returned.
func (d *Docker) Notices() []Notice { return d.take() }
