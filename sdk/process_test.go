package sdk_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/atoll-run/atoll/internal/testtime"
	"github.com/atoll-run/atoll/sdk"
)

// TestProcessGangEmbedded: a process gang on the embedded default: each member of a
// shell command sees torchrun's variables for its rank (one rendezvous address for all),
// the placed GPUs and its job; it runs until the test lets it exit 0, and the gang is then
// completed.
func TestProcessGangEmbedded(t *testing.T) {
	c := newCluster(t)
	ctx, cancel := testtime.Context(t, time.Minute)
	defer cancel()
	job, err := c.Submit(ctx, sdk.JobSpec{Name: "procs"})
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	script := `echo "$RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $MASTER_ADDR:$MASTER_PORT $CUDA_VISIBLE_DEVICES $ATOLL_JOB" > "$OUT/rank-$RANK.tmp" &&
mv "$OUT/rank-$RANK.tmp" "$OUT/rank-$RANK"; while [ ! -e "$OUT/go" ]; do sleep 0.02; done`
	g, err := job.SpawnProcessGang(ctx, sdk.ProcessGangSpec{Name: "sh", Command: []string{"/bin/sh", "-c", script}, Env: map[string]string{"OUT": out},
		Workers: 2, GPUsPerWorker: 1, SameIsland: true})
	if err != nil {
		t.Fatal(err)
	}
	var lines [2][]string
	for r := range 2 {
		path := filepath.Join(out, fmt.Sprintf("rank-%d", r))
		for {
			b, err := os.ReadFile(path)
			if err == nil {
				lines[r] = strings.Fields(string(b))
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("rank %d never wrote its environment (%v)", r, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	for r, f := range lines {
		if len(f) != 7 || f[0] != fmt.Sprint(r) || f[2] != "2" || f[6] != "procs" || f[5] == "" || !strings.Contains(f[4], ":") || f[4] != lines[0][4] {
			t.Errorf("rank %d's environment %q: want RANK %d, WORLD_SIZE 2, one MASTER_ADDR:PORT for both, its GPU, job procs", r, f, r)
		}
	}
	if err := os.WriteFile(filepath.Join(out, "go"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for g.State() != sdk.GangStopped {
		if ctx.Err() != nil {
			t.Fatalf("the gang is %s after its members exited 0; want stopped (completed)", g.State())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if g.Restarts() != 0 {
		t.Errorf("restarts %d, want 0", g.Restarts())
	}
}
