package store

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
)

func TestMain(m *testing.M) {
	if os.Getenv("ATOLL_BENCHSTORE_SERVE") == "1" {
		// Invoked as the serving process: its configuration comes on stdin.
		if err := Serve(context.Background(), os.Stdin, os.Stdout, nil); err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestRunSmall(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MinSize, cfg.MaxSize, cfg.BytesPerSize, cfg.SmallCount, cfg.PullRuns = 64<<10, 1<<20, 4<<20, 2000, 3
	cfg.ReadPairs, cfg.SmallPulls, cfg.TLS = 3, 20, true
	cfg.CkptBytes, cfg.CkptParts, cfg.CkptRuns = 8<<20, 4, 2
	cfg.ServeCmd = []string{os.Args[0], "-test.run=^$"}
	cfg.ServeEnv = []string{"ATOLL_BENCHSTORE_SERVE=1"}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := Run(ctx, cfg, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := res.Met["ckpt_second_copy_vs_send"]; !ok || res.CkptBytes != 8<<20 || res.CkptRuns != 2 {
		t.Errorf("checkpoint commit not measured: %d bytes, %d runs, met %v", res.CkptBytes, res.CkptRuns, res.Met)
	}
	if len(res.Sizes) != 3 || res.PullBytes != 1<<20 || res.SmallPulls != 20 || !res.TLS {
		t.Fatalf("sizes %d, pull bytes %d, small pulls %d, tls %v", len(res.Sizes), res.PullBytes, res.SmallPulls, res.TLS)
	}
	for _, sz := range res.Sizes {
		if !(sz.GetReadRatioLo <= sz.GetReadRatio && sz.GetReadRatio <= sz.GetReadRatioHi) || sz.ReadsPerSample < 1 {
			t.Errorf("size %d: ratio %v outside its quartiles [%v, %v] or %d reads per sample", sz.Size, sz.GetReadRatio, sz.GetReadRatioLo, sz.GetReadRatioHi, sz.ReadsPerSample)
		}
	}
	for name, q := range map[string][3]float64{"pull": {res.PullRatioLo, res.PullRatio, res.PullRatioHi}, "tls": {res.TLSRatioLo, res.TLSRatio, res.TLSRatioHi}} {
		if !(q[0] <= q[1] && q[1] <= q[2]) {
			t.Errorf("%s ratio %v outside its quartiles [%v, %v]", name, q[1], q[0], q[2])
		}
	}
	for name, v := range map[string]float64{"memcpy": res.MemcpyGBps, "put": res.PutGBps, "get ratio": res.GetReadRatio,
		"pull": res.PullGBps, "tcp": res.TCPGBps, "pull ratio": res.PullRatio, "pull cpu": res.PullCPUPerGB, "small puts": res.SmallPutsPerS,
		"small gets": res.SmallGetsPerS, "small pull pooled": res.SmallPullPooledUS, "small pull dial": res.SmallPullDialUS,
		"small pulls/s": res.SmallPullsPooledPS, "tls pull": res.PullTLSGBps, "tls ratio": res.TLSRatio,
		"tls small pull": res.SmallPullTLSPooledUS, "tls small dial": res.SmallPullTLSDialUS,
		"checkpoint one copy": res.CkptCommit1S, "checkpoint two copies": res.CkptCommit2S, "checkpoint send": res.CkptSendS} {
		if !(v > 0) {
			t.Errorf("%s = %v, want a positive measurement", name, v)
		}
	}
}

// TestServeConfigErrors: the serving process refuses a bad config line (it
// takes its token there, never from its command line).
func TestServeConfigErrors(t *testing.T) {
	for _, in := range []string{"", "not json\n", `{"token":"zz","size":10}` + "\n", `{"token":"00","size":0}` + "\n"} {
		var out strings.Builder
		if err := Serve(context.Background(), strings.NewReader(in), &out, nil); err == nil {
			t.Errorf("config %q accepted", in)
		}
	}
}
