package agent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/atoll-run/atoll/internal/dockerapi"
	"github.com/atoll-run/atoll/runtime/api"
)

// Containers: a process gang member with an image (api.ProcessSpec.Image) runs in a
// container of the machine's Docker Engine, created through its API: the host's network
// (MASTER_ADDR:MASTER_PORT and every port as for a process), the member's environment,
// the notice file's directory mounted read-only at the same path, the spec's mounts, and
// the placed GPUs as device requests (by UUID, through the NVIDIA container runtime) when
// the machine's GPUs are real. Its output goes to the member's log as a process's does;
// a notice is the same signal, sent through the Engine; a stop is the Engine's stop with
// the grace. Containers carry labels naming the agent's directory, so that an agent that
// restarts removes those a dead run of it left (as it removes spec files).

// Labels of member containers.
const (
	labelAgentDir = "atoll.agent-dir"
	labelMember   = "atoll.member"
)

// docker returns the launcher's Engine client.
func (l *ExecLauncher) docker() *dockerapi.Client {
	l.dockerOnce.Do(func() {
		if l.Docker == nil {
			l.Docker = dockerapi.New(l.DockerSocket, "")
		}
	})
	return l.Docker
}

// containerSpec is the Engine's create body for a member.
func containerSpec(spec api.WorkerSpec, env []string, noticeDir, owner string) map[string]any {
	binds := []string{noticeDir + ":" + noticeDir + ":ro"}
	for _, m := range spec.Process.Mounts {
		binds = append(binds, m)
	}
	host := map[string]any{"NetworkMode": "host", "Binds": binds, "Init": true}
	if !spec.Simulated && len(spec.Member.UUIDs) > 0 {
		host["DeviceRequests"] = []map[string]any{{"Driver": "nvidia", "DeviceIDs": spec.Member.UUIDs, "Capabilities": [][]string{{"gpu"}}}}
	}
	return map[string]any{
		"Image": spec.Process.Image, "Cmd": spec.Process.Command, "Env": env,
		"Labels":     map[string]string{labelAgentDir: owner, labelMember: spec.Key()},
		"HostConfig": host,
	}
}

// launchContainer starts a member in a container: create (pulling the image once if the
// Engine lacks it), start, then follow its output into logf and wait for its exit.
func (l *ExecLauncher) launchContainer(spec api.WorkerSpec, env []string, noticePath string, logf *os.File) (Handle, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute) // a pull may take this long
	defer cancel()
	d := l.docker()
	body := containerSpec(spec, env, filepath.Dir(noticePath), l.Owner)
	var created struct {
		ID string `json:"Id"`
	}
	_, err := d.Call(ctx, http.MethodPost, "/containers/create", nil, body, &created)
	var de *dockerapi.Error
	if errors.As(err, &de) && de.Status == http.StatusNotFound { // no such image here: pull it
		if perr := l.pull(ctx, spec.Process.Image); perr != nil {
			return nil, permanentErr{fmt.Errorf("agent: member %s: image %s: %w", spec.Key(), spec.Process.Image, perr)}
		}
		_, err = d.Call(ctx, http.MethodPost, "/containers/create", nil, body, &created)
	}
	if err != nil {
		if errors.Is(err, dockerapi.ErrUnreachable) {
			return nil, fmt.Errorf("agent: member %s in a container: %w (is Docker running on this machine?)", spec.Key(), err)
		}
		return nil, permanentErr{fmt.Errorf("agent: member %s in a container: %w", spec.Key(), err)}
	}
	h := &containerHandle{d: d, id: created.ID, notice: noticePath, files: []string{noticePath}, log: logf, done: make(chan struct{})}
	if _, err := d.Call(ctx, http.MethodPost, "/containers/"+created.ID+"/start", nil, nil, nil); err != nil {
		h.remove()
		return nil, permanentErr{fmt.Errorf("agent: member %s: start its container: %w", spec.Key(), err)}
	}
	var info struct {
		State struct{ Pid int }
	}
	if _, err := d.Call(ctx, http.MethodGet, "/containers/"+created.ID+"/json", nil, nil, &info); err == nil {
		h.pid = info.State.Pid
	}
	go h.run()
	return h, nil
}

// pull pulls an image (POST /images/create), reading the Engine's progress to its end.
func (l *ExecLauncher) pull(ctx context.Context, image string) error {
	q := url.Values{"fromImage": {image}}
	if !strings.Contains(image[strings.LastIndex(image, "/")+1:], ":") && !strings.Contains(image, "@") {
		q.Set("tag", "latest")
	}
	rc, err := l.docker().Stream(ctx, http.MethodPost, "/images/create", q, nil)
	if err != nil {
		return err
	}
	defer rc.Close()
	b := make([]byte, 32<<10)
	var last []byte
	for {
		n, err := rc.Read(b)
		if n > 0 {
			last = append(last[:0], b[:n]...)
		}
		if err != nil {
			break
		}
	}
	if i := strings.Index(string(last), `"error"`); i >= 0 { // the Engine reports a failed pull in the stream
		return errors.New(strings.TrimSpace(string(last[i:])))
	}
	return nil
}

// removeContainers removes the member containers an earlier run of this agent left (they
// ran on after it died); it returns how many.
func (l *ExecLauncher) removeContainers(ctx context.Context) int {
	var list []struct {
		ID string `json:"Id"`
	}
	filters := `{"label":["` + labelAgentDir + `=` + l.Owner + `"]}`
	if _, err := l.docker().Call(ctx, http.MethodGet, "/containers/json", url.Values{"all": {"1"}, "filters": {filters}}, nil, &list); err != nil {
		return 0 // no Engine here: no containers either
	}
	n := 0
	for _, c := range list {
		if _, err := l.docker().Call(ctx, http.MethodDelete, "/containers/"+c.ID, url.Values{"force": {"1"}}, nil, nil); err == nil {
			n++
		}
	}
	return n
}

// containerHandle is a member running in a container.
type containerHandle struct {
	d      *dockerapi.Client
	id     string
	pid    int
	notice string
	files  []string
	log    *os.File
	done   chan struct{}

	mu  sync.Mutex
	err error
}

// run copies the container's output to its log until it exits, then records its exit,
// removes it and its files.
func (h *containerHandle) run() {
	ctx := context.Background()
	logs, err := h.d.Stream(ctx, http.MethodGet, "/containers/"+h.id+"/logs", url.Values{"follow": {"1"}, "stdout": {"1"}, "stderr": {"1"}}, nil)
	if err == nil {
		_ = dockerapi.Demux(h.log, logs)
		logs.Close()
	}
	var res struct {
		StatusCode int
		Error      *struct{ Message string }
	}
	_, werr := h.d.Call(ctx, http.MethodPost, "/containers/"+h.id+"/wait", nil, nil, &res)
	var exit error
	switch {
	case werr != nil:
		exit = fmt.Errorf("its container: %w", werr)
	case res.Error != nil && res.Error.Message != "":
		exit = fmt.Errorf("its container: %s", res.Error.Message)
	case res.StatusCode == 0:
		exit = ErrExitedZero
	case res.StatusCode == api.ExitPermanent:
		exit = permanentErr{fmt.Errorf("exited with status %d (permanent: a restart cannot help; see its log)", res.StatusCode)}
	case res.StatusCode == 137: // 128+SIGKILL: the Engine's kill, or the kernel's
		exit = fmt.Errorf("killed by signal %v", syscall.SIGKILL)
	default:
		exit = ExitStatusError{Status: res.StatusCode}
	}
	_ = h.log.Close()
	h.remove()
	removeFiles(h.files)
	h.mu.Lock()
	h.err = exit
	h.mu.Unlock()
	close(h.done)
}

func (h *containerHandle) remove() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, _ = h.d.Call(ctx, http.MethodDelete, "/containers/"+h.id, url.Values{"force": {"1"}}, nil, nil)
}

func (h *containerHandle) PID() int              { return h.pid }
func (h *containerHandle) Done() <-chan struct{} { return h.done }
func (h *containerHandle) NoticeFile() string    { return h.notice }
func (h *containerHandle) Err() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}

// Signal sends sig to the container's first process (the Engine's init passes it on to
// the command's process group).
func (h *containerHandle) Signal(sig syscall.Signal) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := h.d.Call(ctx, http.MethodPost, "/containers/"+h.id+"/kill", url.Values{"signal": {strconv.Itoa(int(sig))}}, nil, nil)
	return err
}

// Stop is the Engine's stop: SIGTERM, then SIGKILL after the grace.
func (h *containerHandle) Stop(ctx context.Context, grace time.Duration) error {
	secs := max(int(grace.Round(time.Second)/time.Second), 1)
	_, _ = h.d.Call(ctx, http.MethodPost, "/containers/"+h.id+"/stop", url.Values{"t": {strconv.Itoa(secs)}}, nil, nil)
	select {
	case <-h.done:
		return nil
	case <-ctx.Done():
		_ = h.Kill()
		return ctx.Err()
	}
}

func (h *containerHandle) Kill() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := h.d.Call(ctx, http.MethodPost, "/containers/"+h.id+"/kill", url.Values{"signal": {"SIGKILL"}}, nil, nil)
	return err
}
