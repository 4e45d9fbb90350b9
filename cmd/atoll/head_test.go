package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/atoll-run/atoll/cmd/atoll/internal/clustertest"
	"github.com/atoll-run/atoll/internal/testtime"
	"github.com/atoll-run/atoll/store/meta"
)

func freePorts(t *testing.T, n int) []string {
	addrs, err := freeAddrs(n)
	if err != nil {
		t.Fatal(err)
	}
	return addrs
}

type headProc struct {
	cmd *exec.Cmd
	id  int
}

func startHead(t *testing.T, bin string, id int, peers, clientAddr, dir, token string, extra ...string) *headProc {
	t.Helper()
	args := []string{"head", "--id", fmt.Sprint(id), "--peers", peers, "--client-listen", clientAddr,
		"--data-dir", filepath.Join(dir, fmt.Sprint(id)), "--tick", "5ms"}
	cmd := exec.Command(bin, append(args, extra...)...)
	cmd.Env = append(os.Environ(), "ATOLL_TOKEN="+token)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(dir, fmt.Sprintf("head-%d-%d.log", id, time.Now().UnixNano())))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Killed at the test's end whatever happens: a test that fails before it set up its
	// own stop (a later head that did not start) must not leave this one running.
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "client-api http://") {
		t.Fatalf("head %d first line %q: %v", id, line, err)
	}
	return &headProc{cmd: cmd, id: id}
}

func headStatus(addr, token string) (map[string]any, error) {
	req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/v1/status", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	c := &http.Client{Timeout: time.Second}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var st map[string]any
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

// TestHeadProcessesSurviveLeaderKill runs three real `atoll head` processes on loopback,
// writes, SIGKILLs the leader, restarts it, and checks every acknowledged write survives.
func TestHeadProcessesSurviveLeaderKill(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the atoll binary and runs real processes")
	}
	t.Parallel()
	dir := t.TempDir()
	bin := buildAtoll(t)
	const token = "real-process-test-token"
	addrs := freePorts(t, 6)
	peerAddrs, clientAddrs := addrs[:3], addrs[3:]
	ps := peerList(peerAddrs)
	peers := strings.Join(ps, ",")
	procs := map[int]*headProc{}
	for id := 1; id <= 3; id++ {
		procs[id] = startHead(t, bin, id, peers, clientAddrs[id-1], dir, token)
	}
	defer func() {
		for _, p := range procs {
			p.cmd.Process.Kill()
			p.cmd.Wait()
		}
	}()
	conns := map[uint64]meta.Conn{}
	for id := 1; id <= 3; id++ {
		conns[uint64(id)] = meta.HTTPConn{BaseURL: "http://" + clientAddrs[id-1], Token: token}
	}
	cfg := meta.DefaultClientConfig()
	cfg.AttemptTimeout = time.Second
	client, err := meta.NewClient(cfg, conns)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := testtime.Context(t, 60*time.Second)
	defer cancel()

	w := startAckWriter(t, ctx, client, "jobs/w")
	waitAcked := w.waitAcked
	waitAcked(100)
	leader := 0
	for id := 1; id <= 3 && leader == 0; id++ {
		if st, err := headStatus(clientAddrs[id-1], token); err == nil && st["role"] == "leader" {
			leader = id
		}
	}
	if leader == 0 {
		t.Fatal("no leader found")
	}
	if err := procs[leader].cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	procs[leader].cmd.Wait()
	before := w.count()
	waitAcked(before + 100) // the survivors elect a leader and keep committing
	procs[leader] = startHead(t, bin, leader, peers, clientAddrs[leader-1], dir, token)
	waitAcked(before + 200)
	acked := w.finish()
	for k, v := range acked {
		kv, ok, err := client.Get(ctx, k)
		if err != nil {
			t.Fatalf("get %s: %v", k, err)
		}
		if !ok || string(kv.Value) != v {
			t.Fatalf("acknowledged write %s=%s lost (found=%v %q)", k, v, ok, kv.Value)
		}
	}
	// The restarted replica catches up to the same revision.
	deadline := testtime.Deadline(t, 15*time.Second)
	for {
		revs := map[float64]bool{}
		for id := 1; id <= 3; id++ {
			st, err := headStatus(clientAddrs[id-1], token)
			if err == nil {
				revs[st["revision"].(float64)] = true
			}
		}
		if len(revs) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("replicas at different revisions: %v", revs)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("%d acknowledged writes survived killing leader %d", len(acked), leader)
}

// ackWriter writes keys through a client in the background and remembers every write that
// was acknowledged, so a test can check none is lost.
type ackWriter struct {
	t     *testing.T
	ctx   context.Context
	mu    sync.Mutex
	acked map[string]string
	stop  chan struct{}
	done  chan struct{}
}

func startAckWriter(t *testing.T, ctx context.Context, client *meta.Client, prefix string) *ackWriter {
	w := &ackWriter{t: t, ctx: ctx, acked: map[string]string{}, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for i := 0; ; i++ {
			select {
			case <-w.stop:
				return
			default:
			}
			k, v := fmt.Sprintf("%s%d", prefix, i), fmt.Sprintf("value-%d", i)
			wctx, wcancel := context.WithTimeout(ctx, 3*time.Second)
			_, err := client.Put(wctx, k, []byte(v))
			wcancel()
			if err == nil {
				w.mu.Lock()
				w.acked[k] = v
				w.mu.Unlock()
			}
		}
	}()
	return w
}

// count is the number of acknowledged writes so far.
func (w *ackWriter) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.acked)
}

// waitAcked waits until n writes are acknowledged, failing the test at ctx's deadline.
func (w *ackWriter) waitAcked(n int) {
	w.t.Helper()
	for {
		got := w.count()
		if got >= n {
			return
		}
		if w.ctx.Err() != nil {
			w.t.Fatalf("only %d of %d writes acknowledged", got, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// finish stops the writer and returns the acknowledged writes.
func (w *ackWriter) finish() map[string]string {
	close(w.stop)
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.acked
}

// buildAtoll returns the atoll binary for the tests that run real processes
// (clustertest.Atoll).
func buildAtoll(t *testing.T) string { return clustertest.Atoll(t) }

// peerList names replicas 1..n at addrs, as --peers entries "id=addr".
func peerList(addrs []string) []string {
	ps := make([]string, len(addrs))
	for i, a := range addrs {
		ps[i] = fmt.Sprintf("%d=%s", i+1, a)
	}
	return ps
}
