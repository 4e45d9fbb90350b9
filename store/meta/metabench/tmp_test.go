package metabench

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/atoll-run/atoll/store/meta"
)

func TestTmpLatency(t *testing.T) {
	for _, nosync := range []bool{false, true} {
		cc := meta.DefaultClusterConfig()
		cc.Dir = t.TempDir()
		cc.TCP = true
		cc.NoSync = nosync
		cl, err := meta.StartCluster(cc)
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		cl.WaitLeader(ctx)
		c, _ := cl.Client(meta.DefaultClientConfig())
		var lat []time.Duration
		for i := 0; i < 1000; i++ {
			t0 := time.Now()
			if _, err := c.Put(ctx, "k", make([]byte, 128)); err != nil {
				t.Fatal(err)
			}
			lat = append(lat, time.Since(t0))
		}
		slices.Sort(lat)
		t.Logf("nosync=%v p50=%v p99=%v", nosync, lat[500], lat[990])
		cl.Close()
	}
}
