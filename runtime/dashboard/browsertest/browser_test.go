package browsertest_test

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"go.uber.org/zap/zaptest"

	"github.com/atoll-run/atoll/sdk"
	"github.com/atoll-run/atoll/sdk/local"
)

// The browser tests open the dashboard of an embedded cluster (local.Cluster: three heads and
// four simulated DGX H100 machines, 32 GPUs) in headless Chromium. Set
// ATOLL_SCREENSHOTS=DIR to keep the screenshots (docs/ holds the committed ones).

// chromium finds a Chromium or Chrome executable, or skips the test.
func chromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("ATOLL_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Skip("headless Chromium is not installed (Debian: apt-get install -y chromium; or set ATOLL_CHROMIUM): the dashboard's browser test is skipped")
	return ""
}

// browser starts headless Chromium and returns its first tab's context; each
// chromedp.NewContext of it is a new tab (with its own session storage).
func browser(t *testing.T) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromium(t)), chromedp.NoSandbox,
		chromedp.WindowSize(1400, 1900), chromedp.Flag("disable-dev-shm-usage", true), chromedp.UserDataDir(t.TempDir()),
		chromedp.Env("TMPDIR="+t.TempDir())) // its singleton socket dirs go with the test
	alloc, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancel)
	ctx, cancel2 := chromedp.NewContext(alloc)
	t.Cleanup(cancel2)
	if err := chromedp.Do(ctx); err != nil { // starts the browser (no deadline on this first call)
		t.Fatalf("start Chromium: %v", err)
	}
	return ctx
}

// tab opens a new tab with a deadline.
func tab(t *testing.T, b context.Context, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := chromedp.NewContext(b)
	t.Cleanup(cancel)
	ctx, cancel2 := context.WithTimeout(ctx, d)
	t.Cleanup(cancel2)
	return ctx
}

// eval evaluates a JavaScript expression in the tab.
func eval[T any](t *testing.T, ctx context.Context, expr string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

type ping struct{}

type worker struct{ N int }

func (w *worker) Receive(*sdk.Context, any) (any, error) { w.N++; return w.N, nil }
func (w *worker) Checkpoint() ([]byte, error)            { return []byte{byte(w.N)}, nil }
func (w *worker) Restore(b []byte) error                 { w.N = int(b[0]); return nil }

// cluster starts the embedded default with a running 8-worker gang that restarted once
// (a worker killed), and a 4-worker gang beside it; it returns the dashboard's URL.
func cluster(t *testing.T) (string, *sdk.Cluster) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := local.Cluster(ctx, sdk.WithLogger(zaptest.NewLogger(t)), sdk.Kind("worker", func() sdk.Actor { return &worker{} }, ping{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Shutdown(context.Background()) })
	job, err := c.Submit(ctx, sdk.JobSpec{Name: "demo"})
	if err != nil {
		t.Fatal(err)
	}
	dp, err := job.SpawnGang(ctx, sdk.GangSpec{Name: "dp", Kind: "worker", Workers: 8, GPUsPerWorker: 1, SameIsland: true, MaxRestarts: 3})
	if err != nil {
		t.Fatal(err)
	}
	eval, err := job.SpawnGang(ctx, sdk.GangSpec{Name: "eval", Kind: "worker", Workers: 4, GPUsPerWorker: 1, SameIsland: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := eval.AwaitRunning(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := dp.AwaitRunning(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if err := dp.Checkpoint(ctx, 10); err != nil {
		t.Fatal(err)
	}
	if err := dp.Kill(ctx, 3); err != nil { // the restart shows up as an event
		t.Fatal(err)
	}
	if _, err := dp.AwaitRunning(ctx, 1); err != nil {
		t.Fatal(err)
	}
	st, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(st.Dashboard, "/ui/?token=") {
		t.Fatalf("the cluster status names no dashboard: %q", st.Dashboard)
	}
	return st.Dashboard, c
}

func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	dir := os.Getenv("ATOLL_SCREENSHOTS")
	if dir == "" {
		dir = t.TempDir()
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%d bytes)", path, len(png))
}

func TestDashboardInBrowser(t *testing.T) {
	b := browser(t)
	dash, _ := cluster(t)
	ctx := tab(t, b, 45*time.Second)
	err := chromedp.Do(ctx,
		chromedp.Navigate(dash),
		chromedp.WaitVisible(chromedp.CSS(`#map .gpu`)),
		// The plots draw the samples the heads take every second: wait for a few.
		chromedp.Poll[chromedp.Void](`document.body.dataset.ready === "1" && Chart.getChart("p-util").data.datasets[0].data.length >= 3 &&
			document.querySelector('tr[data-gang="demo/dp"]').dataset.state === "running" &&
			document.querySelectorAll('#events tr[data-kind="gang_restart"]').length > 0`, chromedp.WithPollingInterval(100*time.Millisecond)),
	)
	if err != nil {
		t.Fatalf("the dashboard at %s: %v", dash, err)
	}
	gpus := eval[int](t, ctx, `document.querySelectorAll("#map .gpu").length`)
	dpGPUs := eval[int](t, ctx, `document.querySelectorAll('#map .gpu[data-gang="demo/dp"]').length`)
	evalGPUs := eval[int](t, ctx, `document.querySelectorAll('#map .gpu[data-gang="demo/eval"]').length`)
	dpState := eval[string](t, ctx, `document.querySelector('tr[data-gang="demo/dp"]').dataset.state`)
	restarts := eval[int](t, ctx, `document.querySelectorAll('#events tr[data-kind="gang_restart"]').length`)
	if gpus != 32 || dpGPUs != 8 || evalGPUs != 4 || dpState != "running" || restarts != 1 {
		t.Fatalf("the map shows %d GPUs (want 32), %d of demo/dp (want 8), %d of demo/eval (want 4); demo/dp is %q; %d restart events (want 1)",
			gpus, dpGPUs, evalGPUs, dpState, restarts)
	}
	if address := eval[string](t, ctx, `window.location.href`); strings.Contains(address, "token=") {
		t.Errorf("the page left its token in the address bar: %s", address)
	}
	screenshot(t, ctx, "dashboard.png")
	// A click on a gang highlights its GPUs and shows its placement.
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`tr[data-gang="demo/dp"]`)), chromedp.WaitVisible(chromedp.CSS(`#detail`))); err != nil {
		t.Fatal(err)
	}
	dimmed := eval[int](t, ctx, `document.querySelectorAll("#map .gpu.dim").length`)
	detail := eval[string](t, ctx, `document.getElementById("detail").textContent`)
	if dimmed != 24 || !strings.Contains(detail, "modeled AllReduce") || !strings.Contains(detail, "rank 7") {
		t.Errorf("after a click on demo/dp: %d GPUs dimmed (want the 24 others), detail %q", dimmed, detail)
	}
	screenshot(t, ctx, "dashboard-gang.png")
}

// TestDashboardWithoutToken opens the dashboard without its token, and with wrong ones:
// the page shows nothing of the cluster.
func TestDashboardWithoutToken(t *testing.T) {
	b := browser(t)
	dash, _ := cluster(t)
	u, err := url.Parse(dash)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"", "?token=0123456789abcdef", "?token=" + strings.Repeat("f", 64)} {
		t.Run(fmt.Sprintf("query%q", q), func(t *testing.T) {
			ctx := tab(t, b, 30*time.Second)
			if err := chromedp.Do(ctx, chromedp.Navigate(u.Scheme+"://"+u.Host+"/ui/"+q), chromedp.WaitVisible(chromedp.CSS(`#auth`))); err != nil {
				t.Fatal(err)
			}
			auth := eval[string](t, ctx, `document.body.dataset.auth`)
			gpus := eval[int](t, ctx, `document.querySelectorAll(".gpu").length`)
			rows := eval[int](t, ctx, `document.querySelectorAll("#gangs tbody tr").length`)
			hidden := eval[bool](t, ctx, `document.getElementById("app").hidden`)
			if auth != "refused" || gpus != 0 || rows != 0 || !hidden {
				t.Fatalf("without a valid token: auth %q, %d GPUs, %d gang rows, app hidden %v", auth, gpus, rows, hidden)
			}
			body := eval[string](t, ctx, `document.body.innerText`)
			for _, leak := range []string{"dgx-h100", "demo/dp", "H100"} {
				if strings.Contains(body, leak) {
					t.Errorf("the page without a valid token shows %q", leak)
				}
			}
		})
	}
}
