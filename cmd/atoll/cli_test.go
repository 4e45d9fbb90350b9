package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/atoll-run/atoll/pools"
)

func runCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := newRootCmd()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

func TestHelpListsEveryCommandWithAPurpose(t *testing.T) {
	root := newRootCmd()
	for _, c := range root.Commands() {
		if c.Short == "" {
			t.Errorf("command %q has no one-line purpose", c.Name())
		}
		for _, sub := range c.Commands() {
			if sub.Short == "" {
				t.Errorf("command %q %q has no one-line purpose", c.Name(), sub.Name())
			}
		}
	}
	out, err := runCLI(t, "--help")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"demo", "bench"} {
		if !strings.Contains(out, want) {
			t.Errorf("--help does not list %q:\n%s", want, out)
		}
	}
}

func TestDemoJSONContract(t *testing.T) {
	out, err := runCLI(t, "demo", "--json", "--steps", "60", "--kill-at", "33")
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		t.Fatalf("demo --json printed something other than one JSON object: %v\n%s", err, out)
	}
	for _, k := range []string{"gpus_total", "gang_size", "islands_used", "initial_loss", "final_loss", "accuracy", "restarts", "steps", "wall_s"} {
		if _, ok := m[k]; !ok {
			t.Errorf("demo --json lacks %q", k)
		}
	}
	if m["gang_size"] != 8.0 || m["islands_used"] != 1.0 || m["restarts"] != 1.0 || m["gpus_total"] != 32.0 {
		t.Errorf("demo --json: gang %v on %v islands, %v restarts, %v GPUs", m["gang_size"], m["islands_used"], m["restarts"], m["gpus_total"])
	}
}

// TestDemoScenariosJSONContract: the scenarios on the embedded default print the fields
// their issue names, and carry them out (a shrink and a grow, no restart).
func TestDemoScenariosJSONContract(t *testing.T) {
	out, err := runCLI(t, "demo", "--scenario", "preempt", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var p map[string]any
	if err := json.Unmarshal([]byte(out), &p); err != nil {
		t.Fatalf("demo --scenario preempt --json: %v\n%s", err, out)
	}
	for _, k := range []string{"high_prio_wait_s", "victim_checkpointed", "victim_steps_lost", "victim_shrunk_to", "victim_resumed", "cost_s",
		"victim_final_loss", "victim_accuracy", "high_final_loss", "high_accuracy"} {
		if _, ok := p[k]; !ok {
			t.Errorf("preempt --json lacks %q", k)
		}
	}
	if p["embedded"] != true || p["victim_shrunk_to"] != 24.0 || p["victim_checkpointed"] != true || p["victim_steps_lost"].(float64) > 1 || p["victim_accuracy"].(float64) < 0.9 {
		t.Errorf("preempt: %v", p)
	}
	out, err = runCLI(t, "demo", "--scenario", "elastic", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var e struct {
		Resizes []struct {
			From    *int     `json:"from"`
			To      *int     `json:"to"`
			Seconds *float64 `json:"seconds"`
		} `json:"resizes"`
		Restarts *int     `json:"restarts"`
		Accuracy *float64 `json:"accuracy"`
	}
	if err := json.Unmarshal([]byte(out), &e); err != nil {
		t.Fatalf("demo --scenario elastic --json: %v\n%s", err, out)
	}
	if len(e.Resizes) != 3 || e.Restarts == nil || *e.Restarts != 0 || e.Accuracy == nil || *e.Accuracy < 0.9 {
		t.Fatalf("elastic: %s", out)
	}
	for _, r := range e.Resizes {
		if r.From == nil || r.To == nil || r.Seconds == nil || *r.Seconds <= 0 {
			t.Fatalf("elastic resize without from, to or seconds: %s", out)
		}
	}
}

// TestDemoSmallGang: a gang smaller than the default crash rank still trains and restarts.
func TestDemoSmallGang(t *testing.T) {
	out, err := runCLI(t, "demo", "--json", "--workers", "2", "--steps", "60", "--kill-at", "33")
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		Restarts int `json:"restarts"`
	}
	if err := json.Unmarshal([]byte(out), &m); err != nil || m.Restarts != 1 {
		t.Fatalf("demo --workers 2: %v %s", err, out)
	}
}

func TestBenchActorsJSONContract(t *testing.T) {
	out, err := runCLI(t, "bench", "actors", "--json", "--duration", "50ms", "--rounds", "1")
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, k := range []string{"atoll_calls_per_s", "protoactor_calls_per_s", "ratio"} {
		if v, ok := m[k].(float64); !ok || v <= 0 {
			t.Errorf("bench actors --json: %q = %v", k, m[k])
		}
	}
}

func TestBadArgumentsAreRefused(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "nosuch"}, `unknown command "nosuch"`},
		{[]string{"nosuch"}, `unknown command "nosuch"`},
		{[]string{"bench", "actors", "--pairs", "-1,8"}, "pairs entry 1 is -1"},
		{[]string{"bench", "actors", "--duration", "-1s"}, "duration -1s"},
		{[]string{"demo", "extra"}, "unknown command"},
		{[]string{"up"}, "--dir is required"},
		{[]string{"up", "--dir", t.TempDir(), "--heads", "2"}, "--heads 2"},
		{[]string{"up", "--dir", t.TempDir(), "--machine", "../../x"}, "--machine"},
		{[]string{"status", "--dir", t.TempDir()}, "no cluster runs in"},
		{[]string{"logs", "../job"}, "job name"},
		{[]string{"submit", "--gpus-per-worker", "2", "--", "/bin/true"}, "--gpus-per-worker is a process gang's flag"},
		{[]string{"submit", "--workers", "0", "--", "python3"}, "--workers 0"},
		{[]string{"submit", "--workers", "2", "--min-workers", "3", "--", "python3"}, "min workers 3"},
		{[]string{"submit", "--workers", "2", "--notice-signal", "KILL", "--", "python3"}, `notice signal "KILL"`},
		{[]string{"submit", "--workers", "2", "--yield-exit-code", "0", "--", "python3"}, "--yield-exit-code 0"},
		{[]string{"submit", "--workers", "2", "--env", "RANK=1", "--", "python3"}, "RANK is the agent's"},
		{[]string{"submit", "--workers", "2", "--image", "bad image", "--", "python3"}, `image "bad image"`},
		{[]string{"submit", "--workers", "2", "--mount", "/a:/b", "--", "python3"}, "mounts but no image"},
		{[]string{"submit", "--workers", "2", "--image", "py", "--mount", "a:/b", "--", "python3"}, `mount "a:/b"`},
		{[]string{"submit", "--image", "py", "--", "/bin/true"}, "--image is a process gang's flag"},
		{[]string{"submit", "--workers", "2", "--dir", t.TempDir(), "--", "python3"}, "no cluster runs in"},
	} {
		_, err := runCLI(t, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("atoll %v: %v, want an error mentioning %q", tc.args, err, tc.want)
		}
	}
}

// TestFlagPlaceholders checks what --help shows after each flag: pflag takes a backquoted
// word of a flag's usage as its placeholder, so a usage quoting a command ("of `atoll
// up`") showed --dir atoll up. A backquoted placeholder is an upper-case word, and a
// directory flag reads --dir DIR.
// TestUpRefusesACorruptClusterFile: atoll up on a directory whose cluster.json does not
// parse says so instead of starting a new cluster over it.
func TestUpRefusesACorruptClusterFile(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, clusterFileName), []byte(`{"heads": [`), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := runCLI(t, "up", "--dir", dir, "--agents", "1")
	if err == nil || !strings.Contains(err.Error(), clusterFileName) || !strings.Contains(err.Error(), "fix or remove it") {
		t.Fatalf("atoll up on a corrupt %s: %v", clusterFileName, err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, clusterFileName)); string(b) != `{"heads": [` {
		t.Fatalf("the corrupt file was written over: %q", b)
	}
}

func TestFlagPlaceholders(t *testing.T) {
	placeholder := regexp.MustCompile(`^[A-Z][A-Z0-9_]*$`)
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.Flags().VisitAll(func(f *pflag.Flag) {
			name, _ := pflag.UnquoteUsage(f)
			if strings.Contains(f.Usage, "`") && !placeholder.MatchString(name) {
				t.Errorf("%s --%s shows the placeholder %q (usage %q): backquote an upper-case word, or none", c.CommandPath(), f.Name, name, f.Usage)
			}
			if f.Name == "dir" && name != "DIR" {
				t.Errorf("%s --dir shows the placeholder %q: want DIR", c.CommandPath(), name)
			}
		})
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(newRootCmd())
	out, err := runCLI(t, "status", "--help")
	if err != nil || !strings.Contains(out, "--dir DIR ") || strings.Contains(out, "atoll up`") {
		t.Errorf("atoll status --help: %v\n%s", err, out)
	}
}

// TestStoppedClusterAnswersAtOnce runs every command that reaches a cluster against the
// directory of one that does not run: each says so and what to do (before, status and
// logs retried for 15 s and printed a certificate error, demo waited for ever), and down
// says it had nothing to stop.
func TestStoppedClusterAnswersAtOnce(t *testing.T) {
	dir := t.TempDir()
	tf, _, err := initDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := newClusterFile(dir, 3, "dgx-h100", true, "") // its addresses are free: nothing listens
	if err != nil {
		t.Fatal(err)
	}
	cf.TokenFile = tf
	cf.Agents = []procInfo{{Name: "node-0", PID: 0, Dir: filepath.Join(dir, "agents", "node-0")}}
	if err := writeClusterFile(dir, cf); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("no cluster runs in %s: start one with atoll up --dir %s", dir, dir)
	for _, args := range [][]string{
		{"status"}, {"status", "--json"}, {"logs", "digits", "--rank", "3"}, {"logs", "digits", "--follow"},
		{"demo"}, {"demo", "--scenario", "autoscale"}, {"checkpoints", "--json"}, {"events"}, {"dashboard"},
		{"queues"}, {"drain", "node-0"}, {"undrain", "node-0"}, {"submit", "--dir", dir, "--", "/bin/true"},
		{"kill-worker", "digits"}, {"token", "revoke", "abc"}, {"token", "revoked"}, {"address"},
	} {
		if !slices.Contains(args, "--dir") {
			args = append(args, "--dir", dir)
		}
		_, err := runCLI(t, args...)
		if !errors.Is(err, errNoCluster) || !strings.Contains(err.Error(), want) {
			t.Errorf("atoll %s --dir DIR: %v\nwant %q", strings.Join(args, " "), err, want)
		}
	}
	out, err := runCLI(t, "down", "--dir", dir)
	if err != nil || !strings.Contains(out, "nothing to stop") {
		t.Errorf("atoll down on a stopped cluster: %v\n%s", err, out)
	}
	// An address whose heads do not listen is answered at once too.
	_, err = runCLI(t, "status", "--address", cf.Address+";token-file="+tf)
	if !errors.Is(err, errNoCluster) {
		t.Errorf("atoll status --address of a stopped cluster: %v", err)
	}
}

// TestExampleFiles checks the files README.md names: the queue file atoll queues --set
// takes, and the pool file of atoll up --pools, which is the autoscale scenario's own.
func TestExampleFiles(t *testing.T) {
	conf, err := readSchedulerConfig(nil, "../../examples/queues.json")
	if err != nil {
		t.Fatal(err)
	}
	if conf.DefaultQueue != "research" || len(conf.Queues) != 2 || len(conf.PriorityClasses) != 2 {
		t.Errorf("examples/queues.json: %+v", conf)
	}
	file, err := pools.LoadFile("../../examples/pools.json")
	if err != nil {
		t.Fatal(err)
	}
	builtin, err := pools.Parse([]byte(builtinPools), "builtin", ".")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(file.Pools, builtin.Pools) {
		t.Errorf("examples/pools.json is not the autoscale scenario's pools:\n%+v\n%+v", file.Pools, builtin.Pools)
	}
}
