package browsertest_test

import (
	"bufio"
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	cdpruntime "github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"go.uber.org/zap/zaptest"

	"github.com/atoll-run/atoll/internal/testtime"
	"github.com/atoll-run/atoll/runtime/agent"
	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/runtime/head"
	"github.com/atoll-run/atoll/sdk"
	"github.com/atoll-run/atoll/sdk/local"
	"github.com/atoll-run/atoll/store/paxos"
	"github.com/atoll-run/atoll/topology"
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

// tab opens a new tab with a deadline (d on a quiet machine, scaled by the load).
func tab(t *testing.T, b context.Context, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := chromedp.NewContext(b)
	t.Cleanup(cancel)
	ctx, cancel2 := context.WithTimeout(ctx, testtime.Scale(d))
	t.Cleanup(cancel2)
	return ctx
}

// pageErrors collects what goes wrong in a tab: uncaught exceptions and console errors.
type pageErrors struct {
	mu   sync.Mutex
	errs []string
}

// watch starts collecting a tab's errors (before it navigates).
func watch(t *testing.T, ctx context.Context) *pageErrors {
	t.Helper()
	pe := &pageErrors{}
	err := chromedp.Listen(ctx, func(ev any) {
		var msg string
		switch ev := ev.(type) {
		case *cdpruntime.EventExceptionThrown:
			msg = "exception: " + ev.ExceptionDetails.Text
			if ev.ExceptionDetails.Exception != nil {
				msg += " " + ev.ExceptionDetails.Exception.Description
			}
		case *cdpruntime.EventConsoleAPICalled:
			if ev.Type != cdpruntime.ConsoleAPICalledTypeError {
				return
			}
			msg = "console error:"
			for _, a := range ev.Args {
				msg += " " + string(a.Value) + a.Description
			}
		default:
			return
		}
		pe.mu.Lock()
		pe.errs = append(pe.errs, msg)
		pe.mu.Unlock()
	})
	if err != nil {
		t.Fatalf("listen to the tab: %v", err)
	}
	return pe
}

// pageOK fails the test on any error of the page: an exception or console error seen in
// the tab, the page's own error mark (body data-error: a section it could not draw), or
// error text on the page ("no answer", "page error", a JavaScript message, NaN).
func pageOK(t *testing.T, ctx context.Context, pe *pageErrors) {
	t.Helper()
	for _, p := range pageProblems(t, ctx, pe) {
		t.Error(p)
	}
}

// pageProblems lists what pageOK fails on.
func pageProblems(t *testing.T, ctx context.Context, pe *pageErrors) []string {
	t.Helper()
	pe.mu.Lock()
	var out []string
	for _, e := range pe.errs {
		out = append(out, "the page: "+e)
	}
	pe.mu.Unlock()
	if mark := eval[string](t, ctx, `document.body.dataset.error || ""`); mark != "" {
		out = append(out, "the page marks an error of its own: "+mark)
	}
	body := eval[string](t, ctx, `document.body.innerText`)
	for _, bad := range []string{"no answer", "page error", "Cannot read", "is not a function", "undefined", "NaN", "null"} {
		if i := strings.Index(body, bad); i >= 0 {
			out = append(out, fmt.Sprintf("the page says %q: …%s…", bad, body[max(0, i-80):min(len(body), i+80)]))
		}
	}
	return out
}

// plotted is a JavaScript expression: the points drawn on a plot (its canvas's
// data-points, set at each draw).
func plotted(id string) string {
	return `Number(document.getElementById("` + id + `").dataset.points || 0)`
}

// timeAxis checks that a plot's time axis is on the heads' clock: within a day of now, its
// labels not all alike (an axis without data once read 00:00:00 everywhere).
func timeAxis(t *testing.T, ctx context.Context, id string) {
	t.Helper()
	lo := eval[float64](t, ctx, `Chart.getChart("`+id+`").scales.x.min`)
	labels := eval[[]string](t, ctx, `Chart.getChart("`+id+`").scales.x.ticks.map(t => t.label)`)
	now := float64(time.Now().UnixMilli())
	distinct := map[string]bool{}
	for _, l := range labels {
		distinct[l] = true
	}
	if lo < now-86_400_000 || lo > now+86_400_000 || len(distinct) < 2 {
		t.Errorf("plot %s: its time axis starts at %v (now %v), labels %q", id, lo, now, labels)
	}
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

// fresh starts the embedded default (four simulated machines of 8 GPUs) with no job and
// returns the dashboard's URL.
func fresh(t *testing.T) (string, *sdk.Cluster) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testtime.Scale(time.Minute))
	defer cancel()
	c, err := local.Cluster(ctx, sdk.WithLogger(zaptest.NewLogger(t)), sdk.Kind("worker", func() sdk.Actor { return &worker{} }, ping{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Shutdown(context.Background()) })
	st, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(st.Dashboard, "/ui/?token=") {
		t.Fatalf("the cluster status names no dashboard: %q", st.Dashboard)
	}
	return st.Dashboard, c
}

// cluster starts the embedded default with a running 8-worker gang that restarted once
// (a worker killed), and a 4-worker gang beside it; it returns the dashboard's URL and the
// 4-worker gang.
func cluster(t *testing.T) (string, *sdk.Cluster, *sdk.Job) {
	t.Helper()
	dash, c := fresh(t)
	ctx, cancel := context.WithTimeout(context.Background(), testtime.Scale(time.Minute))
	defer cancel()
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
	return dash, c, job
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
	dash, _, job := cluster(t)
	ctx := tab(t, b, 45*time.Second)
	pe := watch(t, ctx)
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
	pageOK(t, ctx, pe)

	// Two runs of one gang name are two series of the training plot, each labelled by its
	// run: the eval gang reports, stops, is spawned again and reports.
	rctx, cancel := context.WithTimeout(context.Background(), testtime.Scale(time.Minute))
	defer cancel()
	for run := 1; run <= 2; run++ {
		var ev *sdk.Gang
		var err error
		if run == 1 {
			ev, err = job.Gang(rctx, "eval")
		} else {
			ev, err = job.SpawnGang(rctx, sdk.GangSpec{Name: "eval", Kind: "worker", Workers: 4, GPUsPerWorker: 1, SameIsland: true})
		}
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ev.AwaitRunning(rctx, 0); err != nil {
			t.Fatal(err)
		}
		for step := int64(1); step <= 5; step++ {
			if err := ev.Report(rctx, step, map[string]float64{"loss": float64(run) + 1/float64(step)}); err != nil {
				t.Fatal(err)
			}
		}
		if err := chromedp.Do(ctx, chromedp.Poll[chromedp.Void](fmt.Sprintf(`Chart.getChart("p-prog").data.datasets.filter(d => d.label.includes("demo/eval loss · run %d")).length === 1 && %s >= %d`,
			run, plotted("p-prog"), 5*run), chromedp.WithPollingInterval(100*time.Millisecond))); err != nil {
			t.Fatalf("run %d of demo/eval on the training plot: %v (labels %q)", run, err, progLabels(t, ctx))
		}
		if run == 1 {
			if err := ev.Stop(rctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n := eval[int](t, ctx, `Chart.getChart("p-prog").data.datasets.length`); n != 2 {
		t.Errorf("the training plot has %d series (%q), want demo/eval's two runs", n, progLabels(t, ctx))
	}
	timeAxis(t, ctx, "p-prog")

	// A service has its line: the replicas the leader decided, its bounds, the cards its
	// replicas hold.
	if _, err := job.SpawnService(rctx, sdk.ServiceSpec{Name: "serve", Kind: "worker", MinReplicas: 1, MaxReplicas: 2, GPUsPerReplica: 1}); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(ctx, chromedp.Poll[chromedp.Void](`(r => !!r && r.cells[1].textContent === "1" && r.cells[2].textContent === "1–2" && r.cells[3].textContent === "1")(document.querySelector('#services tr[data-service="demo/serve"]'))`,
		chromedp.WithPollingInterval(100*time.Millisecond))); err != nil {
		t.Fatalf("the service's line: %v; the table: %q", err, eval[string](t, ctx, `document.getElementById("services").textContent`))
	}
	pageOK(t, ctx, pe)
}

// progLabels are the training plot's series.
func progLabels(t *testing.T, ctx context.Context) []string {
	t.Helper()
	return eval[[]string](t, ctx, `Chart.getChart("p-prog").data.datasets.map(d => d.label)`)
}

// TestDashboardWithoutToken opens the dashboard without its token, and with wrong ones:
// the page shows nothing of the cluster.
func TestDashboardWithoutToken(t *testing.T) {
	b := browser(t)
	dash, _, _ := cluster(t)
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

// TestFreshClusterInBrowser: the embedded default before any job, as an operator sees it
// right after starting a cluster: every machine and GPU on the map, no gang, and no error
// (the head once sent null lists, and the page stopped before drawing the map).
func TestFreshClusterInBrowser(t *testing.T) {
	b := browser(t)
	dash, _ := fresh(t)
	ctx := tab(t, b, 45*time.Second)
	pe := watch(t, ctx)
	err := chromedp.Do(ctx,
		chromedp.Navigate(dash),
		chromedp.WaitVisible(chromedp.CSS(`#map .gpu`)),
		chromedp.Poll[chromedp.Void](`document.body.dataset.ready === "1" && `+plotted("p-util")+` >= 3`, chromedp.WithPollingInterval(100*time.Millisecond)),
	)
	if err != nil {
		t.Fatalf("the dashboard at %s: %v", dash, err)
	}
	gpus := eval[int](t, ctx, `document.querySelectorAll("#map .gpu").length`)
	machines := eval[int](t, ctx, `document.querySelectorAll("#map .machine").length`)
	gangRows := eval[int](t, ctx, `document.querySelectorAll("#gangs tbody tr[data-gang]").length`)
	queues := eval[[]string](t, ctx, `[...document.querySelectorAll("#queues tbody tr[data-queue]")].map(r => r.dataset.queue)`)
	free := eval[string](t, ctx, `document.querySelector('[data-tile="gpus-free"] .v').textContent`)
	if gpus != 32 || machines != 4 || gangRows != 0 || free != "32" || len(queues) != 1 || queues[0] != "default" {
		t.Errorf("a fresh cluster: %d GPUs on the map (want 32), %d machines (want 4), %d gang rows (want 0), %s free (want 32), queues %q (want default)",
			gpus, machines, gangRows, free, queues)
	}
	for _, id := range []string{"p-util", "p-gangs", "p-store"} {
		timeAxis(t, ctx, id)
	}
	if note := eval[int](t, ctx, plotted("p-prog")); note != 0 {
		t.Errorf("the training plot of a cluster without a job has %d points", note)
	}
	screenshot(t, ctx, "dashboard-fresh.png")
	pageOK(t, ctx, pe)

	// The check itself: an exception thrown on the page is caught, and the page marks it.
	if err := chromedp.Do(ctx, chromedp.Evaluate[chromedp.Void](`setTimeout(() => { throw new Error("injected by the test") }, 0)`),
		chromedp.Poll[chromedp.Void](`(document.body.dataset.error || "").includes("injected by the test")`, chromedp.WithPollingInterval(50*time.Millisecond))); err != nil {
		t.Fatalf("the page did not mark an exception: %v", err)
	}
	if got := strings.Join(pageProblems(t, ctx, pe), "\n"); !strings.Contains(got, "exception") || !strings.Contains(got, "marks an error") || !strings.Contains(got, "page error") {
		t.Errorf("an exception on the page: the check found %q, want the exception, the page's mark and its text", got)
	}
}

// TestLeaderChangeInBrowser: three heads and two agents (each head's API and dashboard on
// its own socket, the heads' Paxos over an in-memory network); the page is opened on a
// follower, then the leader is closed. The page shows the new leader's view, the
// machines still drawn, and no error.
func TestLeaderChangeInBrowser(t *testing.T) {
	b := browser(t)
	ctx, cancel := context.WithTimeout(context.Background(), testtime.Scale(time.Minute))
	defer cancel()
	token := []byte("browser-test-cluster-secret-0123456789")
	net := paxos.NewMemNetwork(1)
	dir := t.TempDir()
	var heads []*head.Head
	var urls []string
	for id := uint64(1); id <= 3; id++ {
		h, err := head.Start(head.Config{ID: id, Initial: []uint64{1, 2, 3}, Transport: net.Transport(id), DataDir: filepath.Join(dir, fmt.Sprintf("head-%d", id)),
			NoSync: true, Token: token, Logger: zaptest.NewLogger(t).Named(fmt.Sprintf("head-%d", id))})
		if err != nil {
			t.Fatal(err)
		}
		heads = append(heads, h)
		urls = append(urls, h.Address())
	}
	t.Cleanup(func() {
		for _, h := range heads {
			_ = h.Close()
		}
	})
	var infos []api.HeadInfo
	for _, h := range heads {
		infos = append(infos, api.HeadInfo{ID: h.ID(), Address: h.Address()})
	}
	for _, h := range heads {
		h.SetHeads(infos)
	}
	tc, err := topology.Load("dgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		name := fmt.Sprintf("node-%d", i)
		a, err := agent.Start(ctx, agent.Config{Name: name, Spec: tc.Machines[0].Spec, Simulated: true, Heads: urls, Token: token,
			Dir: filepath.Join(dir, name), Logger: zaptest.NewLogger(t).Named(name)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = a.Shutdown(context.Background()) })
	}
	c, err := api.NewClient(ctx, api.ClientConfig{Heads: urls, Token: string(token)})
	if err != nil {
		t.Fatal(err)
	}
	var st api.Status
	for st, err = c.Status(ctx); err != nil || len(st.Machines) < 2; st, err = c.Status(ctx) {
		select {
		case <-ctx.Done():
			t.Fatalf("the agents did not register: %+v, %v", st.Machines, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
	var lead, follower *head.Head
	for _, h := range heads {
		if h.ID() == st.Leader {
			lead = h
		} else {
			follower = h
		}
	}
	if lead == nil {
		t.Fatalf("no head is leader %d", st.Leader)
	}

	tctx := tab(t, b, 60*time.Second)
	pe := watch(t, tctx)
	err = chromedp.Do(tctx,
		chromedp.Navigate(follower.DashboardURL()),
		chromedp.Poll[chromedp.Void](fmt.Sprintf(`document.body.dataset.ready === "1" && document.querySelectorAll("#map .gpu").length === 16 && document.getElementById("where").textContent.startsWith("leader head %d ")`, lead.ID()),
			chromedp.WithPollingInterval(100*time.Millisecond)),
	)
	if err != nil {
		t.Fatalf("the dashboard on head %d: %v", follower.ID(), err)
	}
	if err := lead.Close(); err != nil {
		t.Fatal(err)
	}
	// The new leader's view: another head leads, and it answers (not a follower's view).
	err = chromedp.Do(tctx, chromedp.Poll[chromedp.Void](fmt.Sprintf(`(() => {
		const w = document.getElementById("where").textContent;
		const m = /^leader head (\d+) /.exec(w);
		return m && m[1] !== "0" && m[1] !== "%d" && !w.includes("follower") &&
			document.getElementById("live").textContent.startsWith("updated") &&
			document.querySelectorAll("#map .gpu").length === 16 && document.querySelectorAll("#map .machine.dead").length === 0;
	})()`, lead.ID()), chromedp.WithPollingInterval(100*time.Millisecond)))
	if err != nil {
		t.Fatalf("after head %d (the leader) closed, the page shows %q, %q: %v", lead.ID(),
			eval[string](t, tctx, `document.getElementById("where").textContent`), eval[string](t, tctx, `document.getElementById("live").textContent`), err)
	}
	timeAxis(t, tctx, "p-util")
	screenshot(t, tctx, "dashboard-leader-changed.png")
	pageOK(t, tctx, pe)
}

// atoll builds the atoll command of this repository.
func atoll(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "atoll")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/atoll")
	cmd.Dir = filepath.Join("..", "..", "..") // the root module
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/atoll: %v\n%s", err, out)
	}
	return bin
}

// TestEmbeddedDemoInBrowser runs `atoll demo --dashboard` as a user does (the embedded
// default, in one process): the digits gang trains, a worker is killed and the gang
// restarts from its checkpoint. The page plots the loss the demo reports, on the heads'
// clock (the panel was empty and every time label 00:00:00), one run with its line broken
// at the restart.
func TestEmbeddedDemoInBrowser(t *testing.T) {
	b := browser(t)
	bin := atoll(t)
	const steps = 2000 // some 10 s of training on the embedded default: a loss curve to read
	cmd := exec.Command(bin, "demo", "--dashboard", "--linger", "10m", "--steps", fmt.Sprint(steps))
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	urls := make(chan string, 1)
	trained := make(chan struct{}) // the demo printed "training done" (its reports are sent)
	var out strings.Builder
	var outMu sync.Mutex
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			outMu.Lock()
			out.WriteString(line + "\n")
			outMu.Unlock()
			if u, ok := strings.CutPrefix(line, "dashboard: "); ok && strings.Contains(u, "/ui/?token=") {
				urls <- u
			}
			if strings.HasPrefix(line, "training done") {
				close(trained)
			}
		}
		exited <- cmd.Wait()
	}()
	t.Cleanup(func() { // Ctrl-C ends the lingering demo
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("atoll demo after Ctrl-C: %v", err)
			}
		case <-time.After(testtime.Scale(30 * time.Second)):
			_ = cmd.Process.Kill()
			t.Errorf("atoll demo did not end on Ctrl-C")
		}
	})
	output := func() string { outMu.Lock(); defer outMu.Unlock(); return out.String() }
	var dash string
	select {
	case dash = <-urls:
	case err := <-exited:
		t.Fatalf("atoll demo ended before it printed the dashboard's address: %v\n%s", err, output())
	case <-time.After(testtime.Scale(2 * time.Minute)):
		t.Fatalf("atoll demo printed no dashboard address:\n%s", output())
	}
	ctx := tab(t, b, 2*time.Minute)
	pe := watch(t, ctx)
	if err := chromedp.Do(ctx, chromedp.Navigate(dash), chromedp.WaitVisible(chromedp.CSS(`#map .gpu`))); err != nil {
		t.Fatalf("the demo's dashboard at %s: %v\n%s", dash, err, output())
	}
	select {
	case <-trained:
	case err := <-exited:
		t.Fatalf("atoll demo ended: %v\n%s", err, output())
	case <-ctx.Done():
		t.Fatalf("the demo did not finish training:\n%s", output())
	}
	err = chromedp.Do(ctx, chromedp.Poll[chromedp.Void](fmt.Sprintf(`document.body.dataset.ready === "1" && %s >= %d &&
		Chart.getChart("p-prog").data.datasets.length > 0 && Chart.getChart("p-prog").data.datasets[0].data.some(p => p.v === null) &&
		document.querySelectorAll('#events tr[data-kind="gang_restart"]').length > 0`,
		plotted("p-prog"), steps/4), chromedp.WithPollingInterval(200*time.Millisecond)))
	if err != nil {
		t.Fatalf("the demo's dashboard at %s: %v\n%s", dash, err, output())
	}
	labels := progLabels(t, ctx)
	breaks := eval[int](t, ctx, `Chart.getChart("p-prog").data.datasets[0].data.filter(p => p.v === null).length`)
	restarts := eval[int](t, ctx, `document.querySelectorAll('#events tr[data-kind="gang_restart"]').length`)
	if len(labels) != 1 || !strings.HasPrefix(labels[0], "digits/dp loss · run 1 from ") || breaks < 1 || restarts != 1 {
		t.Errorf("the training plot: series %q (want digits/dp's loss, run 1), %d breaks (want the restart's), %d restart events (want 1)", labels, breaks, restarts)
	}
	for _, id := range []string{"p-prog", "p-util", "p-lat"} {
		timeAxis(t, ctx, id)
	}
	screenshot(t, ctx, "dashboard-demo.png")
	pageOK(t, ctx, pe)
}
