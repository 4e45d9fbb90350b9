package storebench

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
)

func TestMain(m *testing.M) {
	if os.Getenv("ATOLL_STOREBENCH_SERVE") == "1" {
		// Invoked as the serving process: args are -test.run=^$ --size N --token T.
		var size int64
		var tok string
		for i, a := range os.Args {
			switch a {
			case "--size":
				size, _ = strconv.ParseInt(os.Args[i+1], 10, 64)
			case "--token":
				tok = os.Args[i+1]
			}
		}
		if err := Serve(context.Background(), size, tok, false, os.Stdin, os.Stdout, nil); err != nil {
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
	cfg.ReadPairs = 3
	cfg.ServeCmd = []string{os.Args[0], "-test.run=^$"}
	cfg.ServeEnv = []string{"ATOLL_STOREBENCH_SERVE=1"}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := Run(ctx, cfg, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Sizes) != 3 || res.PullBytes != 1<<20 {
		t.Fatalf("sizes %d, pull bytes %d", len(res.Sizes), res.PullBytes)
	}
	for _, sz := range res.Sizes {
		if !(sz.GetReadRatioLo <= sz.GetReadRatio && sz.GetReadRatio <= sz.GetReadRatioHi) || sz.ReadsPerSample < 1 {
			t.Errorf("size %d: ratio %v outside its quartiles [%v, %v] or %d reads per sample", sz.Size, sz.GetReadRatio, sz.GetReadRatioLo, sz.GetReadRatioHi, sz.ReadsPerSample)
		}
	}
	if !(res.PullRatioLo <= res.PullRatio && res.PullRatio <= res.PullRatioHi) {
		t.Errorf("pull ratio %v outside its quartiles [%v, %v]", res.PullRatio, res.PullRatioLo, res.PullRatioHi)
	}
	for name, v := range map[string]float64{"memcpy": res.MemcpyGBps, "put": res.PutGBps, "get ratio": res.GetReadRatio,
		"pull": res.PullGBps, "tcp": res.TCPGBps, "pull ratio": res.PullRatio, "pull cpu": res.PullCPUPerGB, "small puts": res.SmallPutsPerS, "small gets": res.SmallGetsPerS} {
		if !(v > 0) {
			t.Errorf("%s = %v, want a positive measurement", name, v)
		}
	}
}
