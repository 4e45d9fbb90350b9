package head

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/store/paxos"
)

// smallDisk mounts a tmpfs of size bytes on a new directory (root only), unmounted when the
// test ends; it skips the test where mounting is not allowed.
func smallDisk(t *testing.T, size string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "disk")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a small file system here (needs root): %v %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", dir).Run() })
	return dir
}

// fillDisk writes a file until the file system is full, and returns its path.
func fillDisk(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	for {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			return path
		}
	}
}

// getHead answers a GET on one head with the cluster token: its status and body.
func getHead(t *testing.T, h *Head, path string) (int, string) {
	t.Helper()
	return requestHead(t, h, http.MethodGet, path, "")
}

// requestHead sends one request (a JSON body when body is not empty) to a head with the
// cluster token and answers its status and body.
func requestHead(t *testing.T, h *Head, method, path, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, h.Address()+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+string(testToken))
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestHeadRejoinsWhenItsDiskFrees runs a head on a 4 MiB file system: when the disk fills,
// the head stops leading, says so (status, cluster answer, /metrics), and once space frees
// it leads again by itself, without a restart; every acknowledged write is there, and after
// a restart too.
func TestHeadRejoinsWhenItsDiskFrees(t *testing.T) {
	disk := smallDisk(t, "4m")
	data := filepath.Join(disk, "head")
	start := func() *Head {
		h, err := Start(Config{ID: 1, Initial: []uint64{1}, Transport: paxos.NewMemNetwork(1).Transport(1), DataDir: data,
			Token: testToken, Logger: zaptest.NewLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	h := start()
	defer func() { _ = h.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := api.NewClient(ctx, api.ClientConfig{Heads: []string{h.Address()}, Token: string(testToken)})
	if err != nil {
		t.Fatal(err)
	}
	var acked []string
	submit := func(name string, within time.Duration) error {
		sctx, cancel := context.WithTimeout(ctx, within)
		defer cancel()
		_, err := c.SubmitJob(sctx, api.Job{Name: name, Driver: strings.Repeat("d", 512)})
		if err == nil {
			acked = append(acked, name)
		}
		return err
	}
	for i := range 5 {
		if err := submit(fmt.Sprintf("before-%d", i), 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	filler := fillDisk(t, disk)
	// The WAL's last page may still hold a few records; the next write past it fails.
	var failed error
	for i := 0; failed == nil; i++ {
		if i == 100 {
			t.Fatal("100 writes on a full disk succeeded")
		}
		failed = submit(fmt.Sprintf("full-%d", i), 2*time.Second)
	}
	if !errors.Is(failed, api.ErrUnavailable) {
		t.Fatalf("a write on the full disk: %v; want unavailable", failed)
	}
	if err := h.Replica().Err(); !errors.Is(err, paxos.ErrDiskFull) || h.Controller().Leading() {
		t.Fatalf("after the disk filled: replica error %v, leading %v; want disk full, not leading", err, h.Controller().Leading())
	}
	if code, body := getHead(t, h, "/v1/cluster"); code != http.StatusServiceUnavailable || !strings.Contains(body, "cannot write its log") {
		t.Fatalf("cluster status on the full head: %d %s", code, body)
	}
	var st struct {
		DiskFull bool   `json:"disk_full"`
		Error    string `json:"error"`
	}
	_, body := getHead(t, h, "/v1/status")
	if err := json.Unmarshal([]byte(body), &st); err != nil || !st.DiskFull || !strings.Contains(st.Error, "no space left") {
		t.Fatalf("/v1/status on the full head: %s (%v)", body, err)
	}
	if _, body := getHead(t, h, "/metrics"); !strings.Contains(body, "atoll_head_disk_full 1") {
		t.Fatalf("/metrics on the full head lacks atoll_head_disk_full 1")
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	// The head rejoins by itself (the replica retries with a backoff): writes are taken again.
	if err := submit("after", 30*time.Second); err != nil {
		t.Fatalf("a write once space freed: %v", err)
	}
	if err := h.Replica().Err(); err != nil || !h.Controller().Leading() {
		t.Fatalf("after space freed: replica error %v, leading %v", err, h.Controller().Leading())
	}
	if _, body := getHead(t, h, "/metrics"); !strings.Contains(body, "atoll_head_disk_full 0") {
		t.Fatalf("/metrics after space freed lacks atoll_head_disk_full 0")
	}
	check := func(when string) {
		for _, name := range acked {
			var j api.Job
			if ok, err := c.Get(ctx, api.TableJobs+name, &j); err != nil || !ok {
				t.Fatalf("%s: acknowledged job %s: found %v, %v", when, name, ok, err)
			}
		}
	}
	check("without a restart")
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	h = start()
	c, err = api.NewClient(ctx, api.ClientConfig{Heads: []string{h.Address()}, Token: string(testToken)})
	if err != nil {
		t.Fatal(err)
	}
	check("after a restart from the log")
}
