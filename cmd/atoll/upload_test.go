package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/atoll-run/atoll/internal/testtime"
	"github.com/atoll-run/atoll/runtime/api"
)

// countingReader yields n bytes of 'x', counting what was read; with fail it then fails
// instead of ending.
type countingReader struct {
	n, read int64
	fail    bool
}

func (r *countingReader) Read(p []byte) (int, error) {
	if r.read >= r.n {
		if r.fail {
			return 0, errors.New("the uploader broke off")
		}
		return 0, io.EOF
	}
	k := int(min(int64(len(p)), r.n-r.read))
	for i := range p[:k] {
		p[i] = 'x'
	}
	r.read += int64(k)
	return k, nil
}

// rssAnon is a process's anonymous resident memory (its heap, not the shared memory of
// its object store), from /proc.
func rssAnon(t *testing.T, pid int) int64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "RssAnon:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	t.Skip("no RssAnon in /proc/pid/status")
	return 0
}

// storeMetric reads one value of atoll_agent_object_store_bytes from an agent's /metrics.
func storeMetric(ctx context.Context, t *testing.T, d *dialed, agentURL, tier string) float64 {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, agentURL+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+d.token)
	resp, err := d.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	prefix := fmt.Sprintf(`atoll_agent_object_store_bytes{tier="%s"} `, tier)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), prefix); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	t.Fatalf("no %s in the agent's metrics", prefix)
	return 0
}

// TestAgentUploadsStreamedAndBounded: an agent streams an upload into its store instead of
// buffering it (two 100 MB uploads leave its heap where it was), refuses one over its
// object size limit with a 413 naming the limit before reading it, refuses a body of
// undeclared length (411), and gives back at once what a body that broke off held;
// `atoll submit` refuses a program that is not a regular file (/dev/zero) instead of
// reading it; a head refuses a body over its limit with a 413 naming the limit.
func TestAgentUploadsStreamedAndBounded(t *testing.T) {
	t.Parallel()
	const limit = 128 << 20
	bin, dir := upCluster(t, 1, "--max-object-size", strconv.Itoa(limit))
	ctx, cancel := testtime.Context(t, 3*time.Minute)
	defer cancel()
	addr, _, err := clusterAddress(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	d, err := dialCluster(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	m := machine(ctx, t, d, "node-0")
	put := func(body io.Reader, length int64) (int, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, m.Agent.API+"/v1/objects/put?holder="+url.QueryEscape("test/uploader"), body)
		req.ContentLength = length
		req.Header.Set("Authorization", "Bearer "+d.token)
		resp, err := d.hc.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return resp.StatusCode, string(b)
	}

	before := rssAnon(t, m.PID)
	var ids []string
	for i := 0; i < 2; i++ {
		code, body := put(&countingReader{n: 100_000_000}, 100_000_000)
		if code != http.StatusOK {
			t.Fatalf("a 100 MB upload: %d %s", code, body)
		}
		var in api.ObjectInfo
		if err := json.Unmarshal([]byte(body), &in); err != nil || in.Size != 100_000_000 || in.Fingerprint == 0 {
			t.Fatalf("upload answer %s: %v", body, err)
		}
		ids = append(ids, in.ID)
	}
	if grew := rssAnon(t, m.PID) - before; grew > 48<<20 {
		t.Fatalf("two 100 MB uploads grew the agent's heap by %d MiB: the bodies were buffered", grew>>20)
	}

	big := &countingReader{n: 1 << 40}
	code, body := put(big, 1<<40)
	if code != http.StatusRequestEntityTooLarge || !strings.Contains(body, strconv.Itoa(limit)) || !strings.Contains(body, api.KindTooLarge) {
		t.Fatalf("an upload over the limit: %d %s; want 413 naming the limit %d", code, body, limit)
	}
	if big.read > 64<<20 {
		t.Fatalf("the agent read %d MiB of a body it refused", big.read>>20)
	}
	if code, body := put(io.MultiReader(strings.NewReader("no length")), -1); code != http.StatusLengthRequired {
		t.Fatalf("an upload of undeclared length: %d %s; want 411", code, body)
	}

	inUse := func() float64 {
		return storeMetric(ctx, t, d, m.Agent.API, "shm") - storeMetric(ctx, t, d, m.Agent.API, "recycled")
	}
	held := inUse()
	code, body = put(&countingReader{n: 30 << 20, fail: true}, 90<<20)
	if code == http.StatusOK {
		t.Fatalf("an upload that broke off was accepted: %s", body)
	}
	// The agent answers once the broken body has been let go: nothing is still held.
	waitFor(t, "the broken upload's room is given back", 10*time.Second, func() (bool, string) {
		now := inUse()
		return now == held, fmt.Sprintf("%.0f bytes in use, %.0f before", now, held)
	})

	// A head refuses a body over its limit with a 413 naming it, before reading it whole.
	hb := &countingReader{n: 64 << 20}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, d.Heads()[0]+"/v1/jobs", hb)
	req.ContentLength = 64 << 20
	req.Header.Set("Authorization", "Bearer "+d.token)
	if resp, err := d.hc.Do(req); err != nil {
		t.Fatalf("a large body to a head: %v", err)
	} else {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(string(b), "4194304") {
			t.Fatalf("a body over a head's limit: %d %s; want 413 naming its limit", resp.StatusCode, b)
		}
	}
	if hb.read > 16<<20 {
		t.Fatalf("the head read %d MiB of a body it refused", hb.read>>20)
	}

	// `atoll submit` streams a regular file and refuses anything else.
	sctx, scancel := context.WithTimeout(ctx, testtime.Scale(30*time.Second))
	defer scancel()
	out, err := exec.CommandContext(sctx, bin, "submit", "--dir", dir, "--name", "zero", "--", "/dev/zero").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "not a regular file") {
		t.Fatalf("atoll submit -- /dev/zero: %v\n%s", err, out)
	}
	for _, id := range ids {
		b, _ := json.Marshal(api.ObjectRef{ID: id})
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, m.Agent.API+"/v1/objects/free", bytes.NewReader(b))
		req.Header.Set("Authorization", "Bearer "+d.token)
		if resp, err := d.hc.Do(req); err == nil {
			resp.Body.Close()
		}
	}
}
