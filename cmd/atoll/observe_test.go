package main

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/atoll-run/atoll/internal/pki"
	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/sdk"
)

// TestClusterObservability checks, on a cluster of processes, what an operator reads:
// status's dashboard address, the dashboard token, /metrics on every head and agent, the
// event log and the Prometheus configuration.
func TestClusterObservability(t *testing.T) {
	t.Parallel()
	bin, dir := upCluster(t, 2)
	secret, err := sdk.ReadTokenFile(filepath.Join(dir, "token"))
	if err != nil {
		t.Fatal(err)
	}
	dash := api.DashboardToken(secret)
	out, err := exec.Command(bin, "status", "--dir", dir, "--json").Output()
	if err != nil {
		t.Fatal(err)
	}
	var st api.Status
	if err := json.Unmarshal(out, &st); err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(st.Dashboard, "/ui/?token="+dash) || strings.Contains(st.Dashboard, string(secret)) {
		t.Fatalf("status --json dashboard %q: want the URL with the dashboard token, not the secret", st.Dashboard)
	}
	text, err := exec.Command(bin, "status", "--dir", dir).Output()
	if err != nil || !strings.Contains(string(text), "dashboard: "+st.Dashboard) {
		t.Errorf("status does not print the dashboard: %v\n%s", err, text)
	}
	tok, err := exec.Command(bin, "dashboard", "--dir", dir, "--token").Output()
	if err != nil || strings.TrimSpace(string(tok)) != dash {
		t.Errorf("dashboard --token: %q %v", tok, err)
	}
	// A Prometheus server scrapes with the dashboard token, trusting the cluster's CA, and
	// without a client certificate of its own.
	caPEM, err := pki.ReadCACert(filepath.Join(dir, "tls", pki.CACertFile))
	if err != nil {
		t.Fatal(err)
	}
	trust, _ := pki.Trust(caPEM)
	promClient := &http.Client{Transport: &http.Transport{TLSClientConfig: trust}}
	scrape := func(url, token string) (int, string) {
		req, _ := http.NewRequest(http.MethodGet, url+"/metrics", nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := promClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	cf, err := readClusterFile(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range cf.Heads {
		code, body := scrape(h.API, dash)
		if code != http.StatusOK || !strings.Contains(body, "\natoll_gpus_total 16\n") || !strings.Contains(body, "\natoll_gpus_allocated 0\n") ||
			!strings.Contains(body, "atoll_schedule_cycle_seconds_bucket") || !strings.Contains(body, "atoll_paxos_commit_seconds_bucket") {
			t.Errorf("%s /metrics: %d\n%.2000s", h.Name, code, body)
		}
		if code, _ := scrape(h.API, ""); code != http.StatusUnauthorized {
			t.Errorf("%s /metrics without a token: %d", h.Name, code)
		}
	}
	exported := map[string]bool{}
	help := func(body string) {
		for _, line := range strings.Split(body, "\n") {
			if f := strings.Fields(line); len(f) > 2 && f[0] == "#" && f[1] == "HELP" {
				exported[f[2]] = true
			}
		}
	}
	_, body := scrape(cf.Heads[0].API, dash)
	help(body)
	for _, m := range st.Machines {
		code, body := scrape(m.Agent, dash)
		help(body)
		if code != http.StatusOK || !strings.Contains(body, `atoll_agent_gpus{state="free"} 8`) || !strings.Contains(body, `atoll_agent_object_store_capacity_bytes`) ||
			!strings.Contains(body, `atoll_transfer_served_bytes_total{node="`+m.Name+`"}`) {
			t.Errorf("agent %s /metrics: %d\n%.2000s", m.Name, code, body)
		}
		if code, _ := scrape(m.Agent, "not-the-token"); code != http.StatusUnauthorized {
			t.Errorf("agent %s /metrics with a wrong token: %d", m.Name, code)
		}
	}
	// Every metric the Grafana dashboard queries is one the heads or agents export (those
	// of live gangs' progress and machines' loads only appear with them).
	grafana, err := os.ReadFile("../../deploy/grafana/atoll.json")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range regexp.MustCompile(`atoll_[a-z_]+`).FindAllString(string(grafana), -1) {
		base := strings.TrimSuffix(name, "_bucket")
		if !exported[base] && base != "atoll_gang_progress" && base != "atoll_machine_load" {
			t.Errorf("deploy/grafana/atoll.json queries %s, which no head or agent exports", name)
		}
	}
	evs, err := exec.Command(bin, "events", "--dir", dir).Output()
	if err != nil || strings.Count(string(evs), "machine_up") != 2 {
		t.Errorf("events: %v\n%s", err, evs)
	}
	cmd := exec.Command(bin, "events", "--dir", dir, "--job", "../x")
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "job name") {
		t.Errorf("events --job ../x: %v %s", err, out)
	}
	prom, err := exec.Command(bin, "dashboard", "--dir", dir, "--prometheus").Output()
	if err != nil || !strings.Contains(string(prom), "credentials_file") || !strings.Contains(string(prom), strings.TrimPrefix(cf.Heads[0].API, "https://")) ||
		!strings.Contains(string(prom), "server_name: "+pki.ServerName) {
		t.Errorf("dashboard --prometheus: %v\n%s", err, prom)
	}
}

// TestDemoDashboard runs the demo on the embedded default with --dashboard: it prints the
// dashboard's address, which answers with its token while the cluster lingers.
func TestDemoDashboard(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the demo")
	}
	t.Parallel()
	bin := buildAtoll(t)
	cmd := exec.Command(bin, "demo", "--steps", "5", "--kill-at", "-1", "--dashboard", "--linger", "1m", "--json")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	lines := bufio.NewScanner(stderr)
	var url string
	for url == "" && lines.Scan() {
		if u, ok := strings.CutPrefix(lines.Text(), "dashboard: "); ok {
			url = u
		}
	}
	if !strings.Contains(url, "/ui/?token=") {
		t.Fatalf("the demo printed no dashboard address (last line %q)", lines.Text())
	}
	for lines.Scan() && !strings.HasPrefix(lines.Text(), "training done") {
	}
	base, token, _ := strings.Cut(url, "/ui/?token=")
	req, _ := http.NewRequest(http.MethodGet, base+"/ui/api/state", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("the dashboard after training: %v", err)
	}
	defer resp.Body.Close()
	var st struct {
		Totals struct{ GPUs, Allocated int }
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil || resp.StatusCode != http.StatusOK || st.Totals.GPUs != 32 || st.Totals.Allocated != 8 {
		t.Fatalf("the dashboard after training: %d %+v %v", resp.StatusCode, st, err)
	}
	_ = cmd.Process.Signal(syscall.SIGINT) // ends the linger: the demo prints its summary
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the demo after Ctrl-C: %v", err)
	}
}
