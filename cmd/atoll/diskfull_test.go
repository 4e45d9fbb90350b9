package main

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

	"github.com/atoll-run/atoll/runtime/api"
)

// headGet answers a GET on one head's API with the cluster token.
func headGet(t *testing.T, c *dialed, base, path string) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, base+path, nil)
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := c.hc.Do(req)
	if err != nil {
		t.Fatalf("GET %s%s: %v", base, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

type replicaStatus struct {
	ID       uint64 `json:"id"`
	Role     string `json:"role"`
	Revision int64  `json:"revision"`
	DiskFull bool   `json:"disk_full"`
	Error    string `json:"error"`
}

func replicaOf(t *testing.T, c *dialed, base string) replicaStatus {
	t.Helper()
	var st replicaStatus
	if b := headGet(t, c, base, "/v1/status"); json.Unmarshal([]byte(b), &st) != nil {
		t.Fatalf("%s/v1/status: %s", base, b)
	}
	return st
}

// TestHeadDiskFullThenFreed runs three head processes, head 1's data on a 4 MiB file system.
// When that fills, head 1 steps down and says so (atoll status, /metrics) while the others
// go on acknowledging writes; once space frees, the same process rejoins and holds every
// acknowledged write.
func TestHeadDiskFullThenFreed(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster of processes")
	}
	tmp := t.TempDir()
	bin := buildAtoll(t, tmp)
	dir := filepath.Join(tmp, "cluster")
	disk := filepath.Join(dir, "heads", "1")
	if err := os.MkdirAll(disk, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", disk).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a small file system here (needs root): %v %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", disk).Run() })
	if out, err := exec.Command(bin, "up", "--dir", dir, "--heads", "3", "--agents", "0", "--timeout", "2m").CombinedOutput(); err != nil {
		t.Fatalf("atoll up: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command(bin, "down", "--dir", dir, "--grace", "5s").CombinedOutput(); err != nil {
			t.Errorf("atoll down: %v\n%s", err, out)
		}
		if t.Failed() {
			logs, _ := filepath.Glob(filepath.Join(dir, "logs", "*.log"))
			for _, l := range logs {
				b, _ := os.ReadFile(l)
				if len(b) > 3000 {
					b = b[len(b)-3000:]
				}
				t.Logf("--- %s (tail)\n%s", filepath.Base(l), b)
			}
		}
	})
	cf, err := readClusterFile(dir)
	if err != nil {
		t.Fatal(err)
	}
	head1 := cf.Heads[0]
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	addr, _, err := clusterAddress(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	c, err := dialCluster(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	var acked []string
	submit := func() {
		t.Helper()
		name := fmt.Sprintf("job-%d", len(acked))
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		// A submission whose answer the full leader never gave is retried at the next one,
		// which may hold it already.
		if _, err := c.SubmitJob(sctx, api.Job{Name: name, Driver: strings.Repeat("d", 512)}); err != nil && !errors.Is(err, api.ErrExists) {
			t.Fatalf("submit %s: %v", name, err)
		}
		acked = append(acked, name)
	}
	// Fill head 1's disk: its next writes fail, the other two acknowledge them.
	filler, err := os.Create(filepath.Join(disk, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	for buf := make([]byte, 64<<10); ; {
		if _, err := filler.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			break
		}
	}
	filler.Close()
	for !replicaOf(t, c, head1.API).DiskFull {
		if len(acked) == 200 {
			t.Fatal("head 1 took 200 writes on a full disk")
		}
		submit()
	}
	for range 5 {
		submit()
	}
	st := clusterStatus(t, bin, dir)
	if len(st.Heads) != 3 || st.Heads[0].ID != 1 || !st.Heads[0].DiskFull || !strings.Contains(st.Heads[0].Error, "no space left") || st.Leader == 1 {
		t.Fatalf("atoll status while head 1's disk is full: %+v (leader %d)", st.Heads, st.Leader)
	}
	if out, _ := exec.Command(bin, "status", "--dir", dir).CombinedOutput(); !strings.Contains(string(out), "disk full") {
		t.Fatalf("atoll status does not say head 1's disk is full:\n%s", out)
	}
	if m := headGet(t, c, head1.API, "/metrics"); !strings.Contains(m, "atoll_head_disk_full 1") {
		t.Fatal("head 1's /metrics lacks atoll_head_disk_full 1")
	}
	// Space frees: the same process rejoins and catches up with every acknowledged write.
	if err := os.Remove(filepath.Join(disk, "filler")); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		submit()
	}
	for {
		h1 := replicaOf(t, c, head1.API)
		var want int64
		for _, h := range cf.Heads[1:] {
			want = max(want, replicaOf(t, c, h.API).Revision)
		}
		if !h1.DiskFull && h1.Error == "" && h1.Revision == want {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("head 1 never rejoined: %+v, the others at revision %d", h1, want)
		case <-time.After(50 * time.Millisecond):
		}
	}
	if !head1.running() {
		id, err := readProc(head1.PID)
		t.Fatalf("head 1 is not the process `up` started any more (it rejoins without a restart): recorded %+v, now %+v %v", head1, id, err)
	}
	if m := headGet(t, c, head1.API, "/metrics"); !strings.Contains(m, "atoll_head_disk_full 0") {
		t.Fatal("head 1's /metrics lacks atoll_head_disk_full 0 once space freed")
	}
	if st := clusterStatus(t, bin, dir); st.Heads[0].DiskFull || st.Heads[0].Error != "" {
		t.Fatalf("atoll status after space freed: %+v", st.Heads[0])
	}
	for _, name := range acked {
		var j api.Job
		if ok, err := c.Get(ctx, api.TableJobs+name, &j); err != nil || !ok {
			t.Fatalf("acknowledged job %s: found %v, %v", name, ok, err)
		}
	}
}
