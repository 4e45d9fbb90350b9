package gang

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The scenario tests replay testdata/*.txt scripts, in the style of cockroachdb/datadriven:
// each block is a command line, a "----" line, and the expected output, ended by a blank
// line. ATOLL_REWRITE=1 rewrites the expected output from the actual one.
//
// Commands:
//
//	cluster nodes=N gpus=G per-rack=R [cpu=M] [mem=MiB] [model=X] [islands=I] [mig=K]
//	        [queues=a:1,b:3] [quota=a:8] [preemption=false] [backfill=false] [fifo=true]
//	        [sort=priority] [strict=true] [grow=false] [topowait=1h] [minrun=15m] [bfafter=0s]
//	submit id=X [members=N] [max=N] [gpus=G] [milli=M] [mig=P] [cpu=M] [mem=MiB] [prio=P]
//	       [queue=Q] [dur=1h] [t=S] [models=A|B] [save=30s] [restore=1m] [interval=10m]
//	       [jit=true] [island=true]
//	cycle t=S
//	finish id=X t=S
//	evict id=X t=S [ckpt=true]
//	resized id=X t=S
//	util
func TestScenarios(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scenario files: %v", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) { runScenario(t, f) })
	}
}

type scenario struct {
	s *Scheduler
}

func kv(args []string) map[string]string {
	m := map[string]string{}
	for _, a := range args {
		k, v, _ := strings.Cut(a, "=")
		m[k] = v
	}
	return m
}

func atoi(t *testing.T, m map[string]string, k string, def int) int {
	t.Helper()
	v, ok := m[k]
	if !ok {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		t.Fatalf("%s=%q: %v", k, v, err)
	}
	return n
}

func dur(t *testing.T, m map[string]string, k string) time.Duration {
	t.Helper()
	v, ok := m[k]
	if !ok {
		return 0
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		t.Fatalf("%s=%q: %v", k, v, err)
	}
	return d
}

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func at(t *testing.T, m map[string]string) time.Time {
	return epoch.Add(time.Duration(atoi(t, m, "t", 0)) * time.Second)
}

func (sc *scenario) run(t *testing.T, cmd string, args []string) string {
	m := kv(args)
	var b strings.Builder
	switch cmd {
	case "cluster":
		nodes, gpus, perRack := atoi(t, m, "nodes", 4), atoi(t, m, "gpus", 8), atoi(t, m, "per-rack", 4)
		isl := atoi(t, m, "islands", 1)
		mig := atoi(t, m, "mig", 0)
		cpu, mem := int64(atoi(t, m, "cpu", 128000)), int64(atoi(t, m, "mem", 1<<20))
		model := m["model"]
		if model == "" {
			model = "H100"
		}
		var snap Snapshot
		for i := 0; i < nodes; i++ {
			n := Node{Name: fmt.Sprintf("n%d", i), Rack: i / perRack, CPUMilli: cpu, MemMiB: mem, FreeCPU: cpu, FreeMem: mem}
			for g := 0; g < gpus; g++ {
				gp := GPU{Model: model, Island: i*isl + g*isl/gpus, FreeMilli: Milli}
				if g < mig {
					gp.MIG, gp.FreeSlices = true, MIGSlicesPerGPU
				}
				n.GPUs = append(n.GPUs, gp)
			}
			snap.Nodes = append(snap.Nodes, n)
		}
		cfg := DefaultConfig()
		if q := m["queues"]; q != "" {
			cfg.Queues = nil
			for _, e := range strings.Split(q, ",") {
				name, w, _ := strings.Cut(e, ":")
				wf, _ := strconv.ParseFloat(w, 64)
				cfg.Queues = append(cfg.Queues, QueueConfig{Name: name, Weight: wf})
			}
			cfg.DefaultQueue = cfg.Queues[0].Name
		}
		if q := m["quota"]; q != "" {
			for _, e := range strings.Split(q, ",") {
				name, v, _ := strings.Cut(e, ":")
				for i := range cfg.Queues {
					if cfg.Queues[i].Name == name {
						cfg.Queues[i].Quota, _ = strconv.Atoi(v)
					}
				}
			}
			cfg.QuotaAdmission = true
		}
		if m["preemption"] == "false" {
			cfg.Preemption, cfg.FairShareReclaim = false, false
		}
		if m["backfill"] == "false" {
			cfg.Backfill = false
		}
		if m["fifo"] == "true" {
			cfg.StrictFIFO = true
		}
		cfg.Plugins.QueueSort = m["sort"]
		if m["grow"] == "false" {
			cfg.ElasticGrow = false
		}
		if _, ok := m["topowait"]; ok {
			cfg.TopologyWait = dur(t, m, "topowait")
		}
		if _, ok := m["bfafter"]; ok {
			cfg.BackfillAfter = dur(t, m, "bfafter")
		}
		cfg.StrictClasses = m["strict"] == "true"
		if _, ok := m["minrun"]; ok {
			cfg.MinRunBeforePreempt = dur(t, m, "minrun")
		}
		s, err := New(cfg, snap)
		if err != nil {
			return "error: " + err.Error()
		}
		sc.s = s
		fmt.Fprintf(&b, "ok: %d nodes, %d racks, %d GPUs", nodes, len(sc.s.c.rackIDs), sc.s.c.totalMilli/Milli)
	case "submit":
		r := Request{
			ID: m["id"], Queue: m["queue"], Priority: atoi(t, m, "prio", 0),
			Min: atoi(t, m, "members", 1), Max: atoi(t, m, "max", 0),
			Member: Member{GPUs: atoi(t, m, "gpus", 1), GPUMilli: atoi(t, m, "milli", 0), MIG: m["mig"],
				CPUMilli: int64(atoi(t, m, "cpu", 1000)), MemMiB: int64(atoi(t, m, "mem", 1024))},
			Duration:   dur(t, m, "dur"),
			Checkpoint: Checkpoint{Save: dur(t, m, "save"), Restore: dur(t, m, "restore"), Interval: dur(t, m, "interval"), JustInTime: m["jit"] == "true"},
			SameIsland: m["island"] == "true",
		}
		if v := m["models"]; v != "" {
			r.GPUModels = strings.Split(v, "|")
		}
		st, err := sc.s.Submit(r, at(t, m))
		fmt.Fprintf(&b, "%s", st.State)
		if st.Reason != "" {
			fmt.Fprintf(&b, ": %s", st.Reason)
		}
		if err != nil && st.State != Rejected {
			fmt.Fprintf(&b, " (error %v)", err)
		}
	case "cycle":
		d := sc.s.Cycle(at(t, m))
		for _, p := range d.Placements {
			fmt.Fprintf(&b, "place %s:", p.Gang)
			for _, mp := range p.Members {
				fmt.Fprintf(&b, " %s%v", mp.NodeName, mp.GPUs)
				if mp.Milli > 0 && mp.Milli < Milli {
					fmt.Fprintf(&b, "@%d", mp.Milli)
				}
				if mp.MIG != "" {
					fmt.Fprintf(&b, "@%s", mp.MIG)
				}
			}
			fmt.Fprintf(&b, " machines=%d racks=%d", p.Machines, p.Racks)
			if p.Backfill {
				b.WriteString(" backfill")
			}
			if p.Preemptor {
				b.WriteString(" preemptor")
			}
			b.WriteString("\n")
		}
		for _, p := range d.Preemptions {
			fmt.Fprintf(&b, "preempt %s for %s (%s) cost=%.0f deadline=+%s\n", p.Victim, p.For, p.Reason, p.Cost, p.Deadline.Sub(d.Now))
		}
		for _, r := range d.Resizes {
			fmt.Fprintf(&b, "resize %s %d->%d:", r.Gang, r.From, r.To)
			for _, mp := range r.Add {
				fmt.Fprintf(&b, " +%s%v", mp.NodeName, mp.GPUs)
			}
			for _, mp := range r.Remove {
				fmt.Fprintf(&b, " -%s%v", mp.NodeName, mp.GPUs)
			}
			if r.For != "" {
				fmt.Fprintf(&b, " for %s cost=%.0f deadline=+%s", r.For, r.Cost.GPUSeconds, r.Deadline.Sub(d.Now))
			}
			b.WriteString("\n")
		}
		for _, r := range d.Reservations {
			kind := "reserve"
			if r.Preemptor {
				kind = "hold"
			}
			fmt.Fprintf(&b, "%s %s start=+%s nodes=%v\n", kind, r.Gang, r.Start.Sub(d.Now), r.Nodes)
		}
		var waits []string
		for _, w := range d.Waiting {
			waits = append(waits, fmt.Sprintf("wait %s (%s): %s", w.Gang, w.Kind, w.Reason))
		}
		sort.Strings(waits)
		for _, w := range waits {
			b.WriteString(w + "\n")
		}
		if !d.NextCycle.IsZero() {
			fmt.Fprintf(&b, "next cycle +%s\n", d.NextCycle.Sub(d.Now))
		}
		if b.Len() == 0 {
			b.WriteString("nothing\n")
		}
		return strings.TrimSuffix(b.String(), "\n")
	case "finish":
		if err := sc.s.Finish(m["id"], at(t, m)); err != nil {
			return "error: " + err.Error()
		}
		b.WriteString("ok")
	case "evict":
		if err := sc.s.Evicted(m["id"], at(t, m), m["ckpt"] == "true"); err != nil {
			return "error: " + err.Error()
		}
		b.WriteString("ok")
	case "resized":
		if err := sc.s.ResizeDone(m["id"], at(t, m)); err != nil {
			return "error: " + err.Error()
		}
		b.WriteString("ok")
	case "util":
		fmt.Fprintf(&b, "util=%.3f pending=%d running=%d", sc.s.Utilization(), sc.s.Pending(), sc.s.Running())
	default:
		t.Fatalf("unknown command %q", cmd)
	}
	return b.String()
}

func runScenario(t *testing.T, path string) {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(data), "\n")
	var out strings.Builder
	sc := &scenario{}
	rewrite := os.Getenv("ATOLL_REWRITE") == "1"
	failed := false
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		if strings.TrimSpace(line) == "" || strings.HasPrefix(line, "#") {
			out.WriteString(line + "\n")
			continue
		}
		fields := strings.Fields(line)
		if i+1 >= len(lines) || lines[i+1] != "----" {
			t.Fatalf("%s:%d: command %q not followed by ----", path, i+1, line)
		}
		start := i + 2
		end := start
		for end < len(lines) && lines[end] != "" {
			end++
		}
		want := strings.Join(lines[start:end], "\n")
		got := sc.run(t, fields[0], fields[1:])
		if got != want && !rewrite {
			t.Errorf("%s:%d: %s\n--- want:\n%s\n--- got:\n%s", path, i+1, line, want, got)
			failed = true
		}
		out.WriteString(line + "\n----\n" + got + "\n")
		i = end - 1
	}
	if rewrite && !failed {
		if err := os.WriteFile(path, []byte(strings.TrimRight(out.String(), "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
