package metabench

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
)

// A short run of every Atoll path, in clear and over mutual TLS, with a baseline stub:
// each produces figures and the report names them (the harness must not rot; the figures
// of a run this short mean nothing).
func TestRunSmoke(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Dir = t.TempDir()
	cfg.Duration = 200 * time.Millisecond
	cfg.SeqWrites = 20
	cfg.Clients = 4
	cfg.TLS = true
	cfg.Logger = zaptest.NewLogger(t)
	cfg.BaselineName = "stub"
	cfg.Baseline = func(ctx context.Context, cfg Config, dir string) (Stats, error) {
		return Measure(ctx, cfg, func(context.Context, string, []byte) error { return nil })
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for name, s := range map[string]*Stats{"atoll": &res.Atoll, "atoll_http": &res.AtollHTTP, "atoll_tls": res.AtollTLS, "atoll_http_tls": res.AtollHTTPTLS, "stub": res.Baseline} {
		if s == nil || s.P50us <= 0 || s.WritesPerS <= 0 {
			t.Errorf("%s: %+v", name, s)
		}
	}
	if res.Floor.FsyncUs <= 0 || res.Floor.RTTUs <= 0 {
		t.Errorf("floor %+v", res.Floor)
	}
	var out bytes.Buffer
	WriteReport(&out, cfg, res)
	for _, want := range []string{"atoll_http_tls", "over mutual TLS / in clear", "atoll / stub writes/s"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
}

func TestConfigBounds(t *testing.T) {
	for _, mod := range []func(*Config){
		func(c *Config) { c.Clients = -1 },
		func(c *Config) { c.Clients = 5000 },
		func(c *Config) { c.Duration = 0 },
		func(c *Config) { c.SeqWrites = 5 },
		func(c *Config) { c.ValueSize = 2 << 20 },
	} {
		c := DefaultConfig()
		mod(&c)
		if _, err := Run(context.Background(), c); err == nil {
			t.Errorf("config %+v accepted", c)
		}
	}
}
