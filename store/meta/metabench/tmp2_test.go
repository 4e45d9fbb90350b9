package metabench

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/atoll-run/atoll/store/meta"
)

func TestTmpConc(t *testing.T) {
	cc := meta.DefaultClusterConfig()
	cc.Dir = t.TempDir()
	cc.TCP = true
	cl, err := meta.StartCluster(cc)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	cl.WaitLeader(ctx)
	c, _ := cl.Client(meta.DefaultClientConfig())
	var n atomic.Int64
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for i := 0; i < 64; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for cctx.Err() == nil {
				if _, err := c.Put(cctx, "k", make([]byte, 128)); err == nil {
					n.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("writes/s %v", float64(n.Load())/2)
}
