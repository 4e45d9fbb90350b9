package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/atoll-run/atoll/runtime/api"
	"github.com/atoll-run/atoll/sdk"
)

// `atoll bench controlplane` measures, in one run on a temporary cluster of processes (3
// heads, agents of declared machines) under a training load, the four figures of the
// control plane's targets:
//
//   - leader_changes: changes of leader while nothing is wrong (the idle window and the
//     loaded window): the leader term (`atoll status --json`'s term) read at their start
//     and end, and the leader identities the heads report, polled;
//   - false_machine_deaths: machines declared dead while the leader head is paused
//     (SIGSTOP, --pause, SIGCONT) and for --settle after, whose agent was never harmed;
//   - idle_cpu_pct: the CPU of the three heads of an idle cluster (agents registered, no
//     gang), from /proc/PID/stat, in percent of one core;
//   - leader_takeover_s: with --pending gangs waiting (the cluster held full by the load),
//     from the leader's SIGKILL to the first submission a new leader admits (see
//     cpProbeInOffice).

// cpConfig is the benchmark's configuration (its flags).
type cpConfig struct {
	agents       int
	machine      string
	pause        time.Duration
	settle       time.Duration
	idleWindow   time.Duration
	loadWindow   time.Duration
	step         time.Duration
	loadKiB      int
	pending      int
	concurrency  int
	setupTimeout time.Duration
	insecure     bool
	skipIdle     bool
	skipPause    bool
	skipTakeover bool
}

func (c cpConfig) validate() error {
	switch {
	case c.agents < 1 || c.agents > 64:
		return fmt.Errorf("--agents %d: want 1..64", c.agents)
	case c.pause < 0 || c.pause > 10*time.Minute:
		return fmt.Errorf("--pause %v: want 0..10m", c.pause)
	case c.settle < 0 || c.settle > 10*time.Minute:
		return fmt.Errorf("--settle %v: want 0..10m", c.settle)
	case c.idleWindow <= 0 && !c.skipIdle || c.idleWindow > 10*time.Minute:
		return fmt.Errorf("--idle-window %v: want (0, 10m] (or --skip-idle)", c.idleWindow)
	case c.loadWindow < 0 || c.loadWindow > time.Hour:
		return fmt.Errorf("--load-window %v: want 0..1h", c.loadWindow)
	case c.step < 0 || c.step > time.Minute:
		return fmt.Errorf("--step %v: want 0..1m", c.step)
	case c.loadKiB < 1 || c.loadKiB > 1<<20:
		return fmt.Errorf("--load-kib %d: want 1..1048576", c.loadKiB)
	case c.pending < 1 && !c.skipTakeover || c.pending > 100_000:
		return fmt.Errorf("--pending %d: want 1..100000 (or --skip-takeover)", c.pending)
	case c.concurrency < 1 || c.concurrency > 256:
		return fmt.Errorf("--concurrency %d: want 1..256", c.concurrency)
	case c.setupTimeout <= 0 || c.setupTimeout > 2*time.Hour:
		return fmt.Errorf("--setup-timeout %v: want (0, 2h]", c.setupTimeout)
	}
	return nil
}

// cpResult is the benchmark's JSON. The four figures are null when their part was skipped.
type cpResult struct {
	LeaderChanges      *int     `json:"leader_changes"`
	FalseMachineDeaths *int     `json:"false_machine_deaths"`
	IdleCPUPct         *float64 `json:"idle_cpu_pct"`
	LeaderTakeoverS    *float64 `json:"leader_takeover_s"`
	// Targets are the issue's; Met says which figures meet theirs (skipped parts absent).
	Targets map[string]float64 `json:"targets"`
	Met     map[string]bool    `json:"met"`

	Started string  `json:"started"`
	TotalS  float64 `json:"total_s"`
	Heads   int     `json:"heads"`
	Agents  int     `json:"agents"`
	Machine string  `json:"machine"`
	GPUs    int     `json:"gpus"`
	TLS     bool    `json:"tls"`
	CPUs    int     `json:"cpus"`
	// LoadAvg* are this machine's 1-minute load average (/proc/loadavg) at the start, and
	// its mean and maximum over the run (sampled every 2 s).
	LoadAvgStart float64 `json:"load_avg_start"`
	LoadAvgMean  float64 `json:"load_avg_mean"`
	LoadAvgMax   float64 `json:"load_avg_max"`

	// Leadership while nothing is wrong: the idle window and the loaded window.
	FaultFreeS            float64 `json:"fault_free_s"`
	TermStart             int64   `json:"term_start"`
	TermBeforeFaults      int64   `json:"term_before_faults"`
	TermEnd               int64   `json:"term_end"`
	LeaderIdentityChanges int     `json:"leader_identity_changes"`

	IdleWindowS       float64   `json:"idle_window_s,omitempty"`
	IdleCPUPctPerHead []float64 `json:"idle_cpu_pct_per_head,omitempty"`

	// The training load: gangs of worker processes, one per machine holding all its GPUs,
	// each step an AllReduce of LoadKiB then StepS of simulated device time.
	LoadGangs      int     `json:"load_gangs"`
	LoadWorkers    int     `json:"load_workers"`
	LoadKiB        int     `json:"load_kib"`
	StepS          float64 `json:"step_s"`
	LoadSteps      int64   `json:"load_steps"`
	LoadCallErrors int64   `json:"load_call_errors"`

	// The paused leader.
	PauseS               float64  `json:"pause_s,omitempty"`
	SettleS              float64  `json:"settle_s,omitempty"`
	PausedHead           uint64   `json:"paused_head,omitempty"`
	PauseLeaderChanges   int      `json:"pause_leader_changes,omitempty"`
	MachinesDeclaredDead []string `json:"machines_declared_dead,omitempty"`
	TrueMachineDeaths    int      `json:"true_machine_deaths"`
	GangsRestarted       int      `json:"gangs_restarted"`
	GangsFailed          int      `json:"gangs_failed"`
	AgentsAlive          int      `json:"agents_alive"`

	// The new leader with many gangs waiting.
	Pending        int     `json:"pending,omitempty"`
	PendingSubmitS float64 `json:"pending_submit_s,omitempty"`
	// PendingAdmitted counts the submissions admitted before --setup-timeout (all of them
	// unless the setup stalled); SetupLeaderChanges the leader terms the setup went
	// through; PendingSeen the gangs waiting when the leader was killed.
	PendingAdmitted    int   `json:"pending_admitted,omitempty"`
	SetupComplete      bool  `json:"setup_complete"`
	SetupLeaderChanges int64 `json:"setup_leader_changes"`
	PendingSeen        int   `json:"pending_seen,omitempty"`
	// SetupCycles and SetupCycleMeanMS are the scheduler cycles the heads ran during the
	// setup (one per admission, and timed ones) and their mean duration; SetupCommitMeanMS
	// the mean time of their log commits (from the heads' /metrics).
	SetupCycles       int64   `json:"setup_cycles"`
	SetupCycleMeanMS  float64 `json:"setup_cycle_mean_ms"`
	SetupCommitMeanMS float64 `json:"setup_commit_mean_ms"`
	KilledHead        uint64  `json:"killed_head,omitempty"`
	LeaderElectedS    float64 `json:"leader_elected_s,omitempty"`
	TakeoverHead      uint64  `json:"takeover_head,omitempty"`
	PendingAfter      int     `json:"pending_after,omitempty"`
	TakeoverRestarts  int     `json:"takeover_gang_restarts"`
}

func newBenchControlPlaneCmd() *cobra.Command {
	cfg := cpConfig{agents: 4, machine: "dgx-h100", pause: 12 * time.Second, settle: 15 * time.Second, idleWindow: 20 * time.Second,
		loadWindow: 30 * time.Second, step: 100 * time.Millisecond, loadKiB: 1024, pending: 10_000, concurrency: 16, setupTimeout: 20 * time.Minute}
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "controlplane",
		Short: "The control plane on a cluster of processes under a training load: leader changes, false machine deaths during a paused leader, idle heads' CPU, takeover with pending gangs",
		Long: `controlplane starts a temporary cluster (3 heads, --agents agents of --machine), then in one run:
1. idle heads: with no gang, the CPU of the three head processes over --idle-window
   (/proc/PID/stat), in percent of one core (target < 2);
2. a training load: gangs of worker processes holding every GPU, each step an AllReduce
   between processes and --step of simulated device time, for --load-window; the leader
   term (atoll status's term) and the leader the heads name are followed from the start:
   leader_changes counts the changes of leader over the idle and loaded windows (target 0);
3. a paused leader: SIGSTOP of the leader head for --pause, SIGCONT, --settle more: machines
   declared dead whose agent is alive are false_machine_deaths (target 0); gangs restarted or
   failed are reported beside it;
4. takeover: --pending gangs submitted that cannot run now (the load holds every GPU), the
   leader SIGKILLed: leader_takeover_s runs from the kill to the first submission a new
   leader admits, which needs the term committed and the scheduler rebuilt from the log with
   every pending gang (target < 1 s).
Every process it started is stopped on the way out, on error and on Ctrl-C too.`,
		Args: noSubcommand,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if sdk.InWorker() { // an agent started this binary as a benchmark worker: serve it
				os.Exit(benchWorkerMain())
			}
			if err := cfg.validate(); err != nil {
				return fmt.Errorf("bench controlplane: %w", err)
			}
			res, err := runControlPlaneBench(cmd.Context(), cfg, cmd.ErrOrStderr())
			if err != nil {
				return fmt.Errorf("bench controlplane: %w", err)
			}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(res)
			}
			printControlPlane(cmd.OutOrStdout(), res)
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&cfg.agents, "agents", cfg.agents, "agents of the temporary cluster (one declared machine each)")
	f.StringVar(&cfg.machine, "machine", cfg.machine, "the machine each agent declares (a built-in machine or a spec file; it needs GPUs)")
	f.DurationVar(&cfg.pause, "pause", cfg.pause, "how long the leader head is stopped (SIGSTOP)")
	f.DurationVar(&cfg.settle, "settle", cfg.settle, "how long machine deaths are still counted after the leader resumes (past the heads' 10 s heartbeat timeout)")
	f.DurationVar(&cfg.idleWindow, "idle-window", cfg.idleWindow, "how long the idle heads' CPU is measured")
	f.DurationVar(&cfg.loadWindow, "load-window", cfg.loadWindow, "how long the cluster runs under the training load, without faults, for leader_changes")
	f.DurationVar(&cfg.step, "step", cfg.step, "simulated device time of a training step (after its AllReduce)")
	f.IntVar(&cfg.loadKiB, "load-kib", cfg.loadKiB, "size of a training step's AllReduce, KiB")
	f.IntVar(&cfg.pending, "pending", cfg.pending, "gangs waiting when the leader is killed")
	f.IntVar(&cfg.concurrency, "concurrency", cfg.concurrency, "concurrent submissions of the pending gangs")
	f.DurationVar(&cfg.setupTimeout, "setup-timeout", cfg.setupTimeout, "how long the pending gangs' submission may take; past it the leader is killed with those admitted (pending_admitted, setup_complete false)")
	f.BoolVar(&cfg.insecure, "insecure-no-tls", false, "a temporary cluster without TLS (token only)")
	f.BoolVar(&cfg.skipIdle, "skip-idle", false, "do not measure the idle heads' CPU")
	f.BoolVar(&cfg.skipPause, "skip-pause", false, "do not pause the leader")
	f.BoolVar(&cfg.skipTakeover, "skip-takeover", false, "do not submit pending gangs and kill the leader")
	f.BoolVar(&asJSON, "json", false, "print one JSON object")
	return cmd
}

func printControlPlane(w io.Writer, r *cpResult) {
	fmt.Fprintf(w, "control plane: 3 heads, %d agents of %s (%d GPUs), load average %.1f (max %.1f) on %d CPUs\n",
		r.Agents, r.Machine, r.GPUs, r.LoadAvgMean, r.LoadAvgMax, r.CPUs)
	if r.LeaderChanges != nil {
		fmt.Fprintf(w, "leader changes without faults: %d over %.0f s (term %d -> %d; identities seen changing %d; target 0)\n",
			*r.LeaderChanges, r.FaultFreeS, r.TermStart, r.TermBeforeFaults, r.LeaderIdentityChanges)
	}
	if r.IdleCPUPct != nil {
		fmt.Fprintf(w, "idle heads: %.2f%% of one core together (each %v) over %.0f s (target < 2%%)\n", *r.IdleCPUPct, r.IdleCPUPctPerHead, r.IdleWindowS)
	}
	if r.FalseMachineDeaths != nil {
		fmt.Fprintf(w, "leader paused %.0f s (+%.0f s): %d false machine deaths %v, %d gangs restarted, %d failed (target 0)\n",
			r.PauseS, r.SettleS, *r.FalseMachineDeaths, r.MachinesDeclaredDead, r.GangsRestarted, r.GangsFailed)
	}
	if r.LeaderTakeoverS != nil {
		fmt.Fprintf(w, "leader SIGKILL with %d pending gangs: elected after %.3f s, in office (a submission admitted) after %.3f s (target < 1 s)\n",
			r.PendingSeen, r.LeaderElectedS, *r.LeaderTakeoverS)
	}
}

// cpBench is one run: the cluster it started and what it measured.
type cpBench struct {
	cfg cpConfig
	res *cpResult
	cf  *clusterFile
	d   *dialed
	c   *sdk.Cluster
	gpm int // GPUs per machine

	trainJob          *sdk.Job
	stopLoad          context.CancelFunc
	loadDone          sync.WaitGroup
	steps, callErrors atomic.Int64

	stopped atomic.Pointer[procInfo] // the head under SIGSTOP, if any

	mu       sync.Mutex
	leader   uint64      // the leader the heads name, last seen
	changes  []time.Time // when the named leader changed
	watching atomic.Bool
}

// runControlPlaneBench runs the benchmark; progress lines go to progress.
func runControlPlaneBench(ctx context.Context, cfg cpConfig, progress io.Writer) (*cpResult, error) {
	began := time.Now()
	res := &cpResult{Started: began.UTC().Format(time.RFC3339), Heads: 3, Agents: cfg.agents, Machine: cfg.machine, TLS: !cfg.insecure,
		CPUs: runtime.NumCPU(), LoadKiB: cfg.loadKiB, StepS: cfg.step.Seconds(),
		Targets: map[string]float64{"leader_changes": 0, "false_machine_deaths": 0, "idle_cpu_pct": 2, "leader_takeover_s": 1},
		Met:     map[string]bool{}}
	say := func(format string, args ...any) {
		fmt.Fprintf(progress, "bench controlplane: %s: "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
	}
	res.LoadAvgStart = loadAvg()
	loads := sampleLoadAvg(ctx)
	defer loads.stop()

	tmp, err := os.MkdirTemp("", "atoll-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	b := &cpBench{cfg: cfg, res: res}
	say("starting 3 heads and %d agents of %s", cfg.agents, cfg.machine)
	cf, _, err := startCluster(ctx, filepath.Join(tmp, "cluster"), 3, cfg.agents, cfg.machine, !cfg.insecure, 2*time.Minute, upOptions{})
	if err != nil {
		return nil, err
	}
	b.cf = cf
	defer b.teardown(say)
	if b.d, err = dialCluster(ctx, clusterAddr(cf)); err != nil {
		return nil, err
	}
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go b.watchLeader(wctx)

	st, err := b.d.Status(ctx)
	if err != nil {
		return nil, err
	}
	for _, m := range st.Machines {
		res.GPUs += m.GPUs
		if b.gpm == 0 || m.GPUs < b.gpm {
			b.gpm = m.GPUs
		}
	}
	if b.gpm == 0 {
		return nil, fmt.Errorf("--machine %s declares no GPU: the load and the pending gangs ask for GPUs", cfg.machine)
	}
	faultFree := time.Now()
	res.TermStart = st.Term
	b.observeLeader(ctx)

	if !cfg.skipIdle {
		say("idle heads: measuring their CPU for %v", cfg.idleWindow)
		if err := b.idle(ctx); err != nil {
			return nil, err
		}
	}
	say("training load: starting gangs on every machine")
	if err := b.startLoad(ctx); err != nil {
		return nil, err
	}
	say("training load: %d gangs, %d worker processes; %v without faults", res.LoadGangs, res.LoadWorkers, cfg.loadWindow)
	b.watching.Store(true)
	if err := sleepCtx(ctx, cfg.loadWindow); err != nil {
		return nil, err
	}
	b.observeLeader(ctx)
	if st, err = b.d.Status(ctx); err != nil {
		return nil, err
	}
	res.FaultFreeS = time.Since(faultFree).Seconds()
	res.TermBeforeFaults = st.Term
	res.TermEnd = st.Term
	b.mu.Lock()
	res.LeaderIdentityChanges = len(b.changes)
	b.mu.Unlock()
	changes := max(int(res.TermBeforeFaults-res.TermStart), res.LeaderIdentityChanges)
	res.LeaderChanges = &changes
	res.Met["leader_changes"] = changes == 0

	if !cfg.skipPause {
		say("pausing the leader head for %v, then %v more", cfg.pause, cfg.settle)
		if err := b.pauseLeader(ctx, st); err != nil {
			return nil, err
		}
	}
	if !cfg.skipTakeover {
		say("takeover: submitting %d gangs that wait", cfg.pending)
		if err := b.takeover(ctx, say); err != nil {
			return nil, err
		}
	}
	if st, err := b.d.Status(ctx); err == nil {
		res.TermEnd = st.Term
	}
	b.stopLoad()
	b.loadDone.Wait()
	res.LoadSteps, res.LoadCallErrors = b.steps.Load(), b.callErrors.Load()
	res.LoadAvgMean, res.LoadAvgMax = loads.stop()
	res.TotalS = time.Since(began).Seconds()
	return res, nil
}

// teardown stops what the run started: the load, every process (a paused head is resumed
// first; the agents end their workers), then the driver's connection. It runs on every way
// out. The jobs are not stopped one by one first: with thousands of gangs waiting that
// takes minutes, and the cluster's log goes with its directory.
func (b *cpBench) teardown(say func(string, ...any)) {
	if b.stopLoad != nil {
		b.stopLoad()
		b.loadDone.Wait()
	}
	if p := b.stopped.Swap(nil); p != nil {
		p.signal(syscall.SIGCONT)
	}
	say("stopping the cluster")
	stopProcs(b.cf, 5*time.Second)
	if b.c != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		_ = b.c.Shutdown(ctx)
		cancel()
	}
}

// idle measures the heads' CPU with no gang (after a short settling of the start).
func (b *cpBench) idle(ctx context.Context) error {
	if err := sleepCtx(ctx, 2*time.Second); err != nil {
		return err
	}
	pids := make([]int, len(b.cf.Heads))
	for i, h := range b.cf.Heads {
		pids[i] = h.PID
	}
	before, err := procsCPU(pids)
	if err != nil {
		return err
	}
	start := time.Now()
	if err := sleepCtx(ctx, b.cfg.idleWindow); err != nil {
		return err
	}
	after, err := procsCPU(pids)
	if err != nil {
		return err
	}
	wall := time.Since(start)
	sum := 0.0
	for i := range pids {
		pct := 100 * (after[i] - before[i]).Seconds() / wall.Seconds()
		b.res.IdleCPUPctPerHead = append(b.res.IdleCPUPctPerHead, round2(pct))
		sum += pct
	}
	sum = round2(sum)
	b.res.IdleCPUPct, b.res.IdleWindowS = &sum, wall.Seconds()
	b.res.Met["idle_cpu_pct"] = sum < 2
	b.observeLeader(ctx)
	return nil
}

// startLoad connects the driver and starts the training gangs: one worker per machine
// holding all its GPUs, two machines per gang, each driven in a loop of training steps
// until the run ends.
func (b *cpBench) startLoad(ctx context.Context) error {
	var err error
	if b.c, err = sdk.Connect(ctx, clusterAddr(b.cf), benchKinds()...); err != nil {
		return err
	}
	if b.trainJob, err = b.c.Submit(ctx, sdk.JobSpec{Name: "bench-cp-train"}); err != nil {
		return err
	}
	floats := b.cfg.loadKiB * 1024 / 4
	var gangs []*sdk.Gang
	for i, left := 0, b.cfg.agents; left > 0; i++ {
		w := min(2, left)
		left -= w
		g, err := b.trainJob.SpawnGang(ctx, sdk.GangSpec{Name: fmt.Sprintf("train-%d", i), Kind: "bench-train", Workers: w, GPUsPerWorker: b.gpm,
			NotPreemptible: true, MaxRestarts: 100, AllReduceBytes: int64(4 * floats)})
		if err != nil {
			return fmt.Errorf("the training load: %w", err)
		}
		gangs = append(gangs, g)
		b.res.LoadGangs++
		b.res.LoadWorkers += w
	}
	lctx, cancel := context.WithCancel(ctx)
	b.stopLoad = cancel
	req := trainReq{Floats: floats, Steps: 10, Compute: b.cfg.step}
	for _, g := range gangs {
		b.loadDone.Add(1)
		go func() {
			defer b.loadDone.Done()
			for lctx.Err() == nil {
				fs := make([]*sdk.Future[int], g.Size())
				for r := range fs {
					fs[r] = sdk.CallAsync[int](lctx, b.c, g.Worker(r), req)
				}
				failed := false
				for _, f := range fs {
					n, err := f.Await(lctx)
					if err != nil {
						failed = true
					}
					b.steps.Add(int64(n))
				}
				if failed && lctx.Err() == nil {
					b.callErrors.Add(1)
					_ = sleepCtx(lctx, 200*time.Millisecond)
				}
			}
		}()
	}
	return nil
}

// pauseLeader stops the leader head for the pause, resumes it, waits the settling time,
// and counts the machines declared dead (and the gangs restarted or failed) meanwhile.
func (b *cpBench) pauseLeader(ctx context.Context, st api.Status) error {
	evs, _, err := b.d.Events(ctx, 0, 0)
	if err != nil {
		return err
	}
	var lastSeq int64
	if len(evs) > 0 {
		lastSeq = evs[len(evs)-1].Seq
	}
	gens := map[string]int{}
	for _, g := range st.Gangs {
		gens[g.Job+"/"+g.Name] = g.Generation
	}
	b.mu.Lock()
	changesBefore := len(b.changes)
	b.mu.Unlock()
	leader, p, err := b.leaderNow(ctx)
	if err != nil {
		return err
	}
	b.res.PausedHead = leader
	if !p.signal(syscall.SIGSTOP) {
		return fmt.Errorf("could not pause head %d (pid %d)", leader, p.PID)
	}
	b.stopped.Store(&p)
	perr := sleepCtx(ctx, b.cfg.pause)
	b.stopped.Store(nil)
	if !p.signal(syscall.SIGCONT) {
		return fmt.Errorf("could not resume head %d (pid %d)", leader, p.PID)
	}
	if perr != nil {
		return perr
	}
	if err := sleepCtx(ctx, b.cfg.settle); err != nil {
		return err
	}
	b.res.PauseS, b.res.SettleS = b.cfg.pause.Seconds(), b.cfg.settle.Seconds()
	b.observeLeader(ctx)
	b.mu.Lock()
	b.res.PauseLeaderChanges = len(b.changes) - changesBefore
	b.mu.Unlock()

	after, err := b.d.Status(ctx)
	if err != nil {
		return err
	}
	if evs, _, err = b.d.Events(ctx, lastSeq, 0); err != nil {
		return err
	}
	dead := map[string]bool{}
	for _, e := range evs {
		if e.Kind == api.EventMachineDown {
			dead[e.Machine] = true
		}
	}
	for _, m := range after.Machines {
		if !m.Alive {
			dead[m.Name] = true
		}
	}
	falseDeaths := 0
	for name := range dead {
		b.res.MachinesDeclaredDead = append(b.res.MachinesDeclaredDead, name)
		if a, ok := b.agent(name); ok && a.running() {
			falseDeaths++
		} else {
			b.res.TrueMachineDeaths++
		}
	}
	slices.Sort(b.res.MachinesDeclaredDead)
	for _, a := range b.cf.Agents {
		if a.running() {
			b.res.AgentsAlive++
		}
	}
	for _, g := range after.Gangs {
		if old, ok := gens[g.Job+"/"+g.Name]; ok && g.Generation > old {
			b.res.GangsRestarted++
		}
		if g.State == api.GangFailed {
			b.res.GangsFailed++
		}
	}
	b.res.FalseMachineDeaths = &falseDeaths
	b.res.Met["false_machine_deaths"] = falseDeaths == 0
	return nil
}

// takeover submits the pending gangs, kills the leader, and times the new leader's taking
// office (see cpProbeInOffice).
func (b *cpBench) takeover(ctx context.Context, say func(string, ...any)) error {
	conf, err := b.d.SchedulerConfig(ctx)
	if err != nil {
		return err
	}
	// The bounds of the scheduler configuration let every pending gang in (one job holds
	// them all, a worker each).
	if need := b.cfg.pending + 1000; conf.MaxPending < need || conf.JobWorkersBound() < need || conf.ClusterWorkersBound() < need+b.cfg.agents {
		conf.MaxPending = max(conf.MaxPending, need)
		conf.MaxJobWorkers = max(conf.JobWorkersBound(), need)
		conf.MaxClusterWorkers = max(conf.ClusterWorkersBound(), need+b.cfg.agents)
		if _, err := b.d.SetSchedulerConfig(ctx, conf); err != nil {
			return fmt.Errorf("raise the scheduler's bounds (max_pending %d, max_job_workers %d): %w", conf.MaxPending, conf.MaxJobWorkers, err)
		}
	}
	if _, err = b.c.Submit(ctx, sdk.JobSpec{Name: "bench-cp-pending"}); err != nil {
		return err
	}
	before, err := b.d.Status(ctx)
	if err != nil {
		return err
	}
	m0 := b.scrapeMetrics(ctx)
	start := time.Now()
	admitted, err := b.submitPending(ctx)
	if err != nil {
		return err
	}
	m1 := b.scrapeMetrics(ctx)
	cycles, commits := m1["atoll_schedule_cycle_seconds_count"]-m0["atoll_schedule_cycle_seconds_count"], m1["atoll_paxos_commit_seconds_count"]-m0["atoll_paxos_commit_seconds_count"]
	b.res.SetupCycles = int64(cycles)
	if cycles > 0 {
		b.res.SetupCycleMeanMS = round2(1e3 * (m1["atoll_schedule_cycle_seconds_sum"] - m0["atoll_schedule_cycle_seconds_sum"]) / cycles)
	}
	if commits > 0 {
		b.res.SetupCommitMeanMS = round2(1e3 * (m1["atoll_paxos_commit_seconds_sum"] - m0["atoll_paxos_commit_seconds_sum"]) / commits)
	}
	b.res.Pending, b.res.PendingAdmitted, b.res.PendingSubmitS = b.cfg.pending, admitted, time.Since(start).Seconds()
	b.res.SetupComplete = admitted == b.cfg.pending
	st, err := b.d.Status(ctx)
	if err != nil {
		return err
	}
	b.res.SetupLeaderChanges = st.Term - before.Term
	gens := map[string]int{}
	for _, g := range st.Gangs {
		gens[g.Job+"/"+g.Name] = g.Generation
		if g.Job == "bench-cp-pending" && g.State == api.GangPending {
			b.res.PendingSeen++
		}
	}
	if !b.res.SetupComplete {
		say("takeover: only %d of %d submissions admitted in --setup-timeout %v (%d leader changes meanwhile)", admitted, b.cfg.pending, b.cfg.setupTimeout, b.res.SetupLeaderChanges)
	}
	leader, p, err := b.leaderNow(ctx)
	if err != nil {
		return err
	}
	say("takeover: %d gangs wait (submitted in %.1f s); killing leader head %d", b.res.PendingSeen, b.res.PendingSubmitS, leader)
	b.res.KilledHead = leader
	elected, inOffice, head, err := b.killAndProbe(ctx, leader, p)
	if err != nil {
		return err
	}
	takeover := inOffice.Seconds()
	b.res.LeaderTakeoverS, b.res.LeaderElectedS, b.res.TakeoverHead = &takeover, elected.Seconds(), head
	b.res.Met["leader_takeover_s"] = takeover < 1
	after, err := b.d.Status(ctx)
	if err != nil {
		return err
	}
	if after.Term <= st.Term || after.Leader == leader {
		return fmt.Errorf("after the kill of head %d the status says leader %d term %d (before: term %d)", leader, after.Leader, after.Term, st.Term)
	}
	for _, g := range after.Gangs {
		if g.Job == "bench-cp-pending" && g.Name != cpProbeInOffice && g.State == api.GangPending {
			b.res.PendingAfter++
		}
		if old, ok := gens[g.Job+"/"+g.Name]; ok && g.Generation > old {
			b.res.TakeoverRestarts++
		}
	}
	return nil
}

// submitPending submits the pending gangs, concurrently; each asks for a whole machine,
// which the load holds, so each waits. A saturation refusal is retried after its hint.
// Past --setup-timeout it stops and returns how many were admitted.
func (b *cpBench) submitPending(ctx context.Context) (int, error) {
	var next, admitted atomic.Int64
	errc := make(chan error, b.cfg.concurrency)
	sctx, cancel := context.WithTimeout(ctx, b.cfg.setupTimeout)
	defer cancel()
	for w := 0; w < b.cfg.concurrency; w++ {
		go func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= b.cfg.pending || sctx.Err() != nil {
					errc <- nil
					return
				}
				spec := api.GangSpec{Job: "bench-cp-pending", Name: fmt.Sprintf("p%06d", i), Kind: "bench-noop", Workers: 1,
					Resources: api.Resources{GPUs: b.gpm}}
				for {
					_, err := b.d.SpawnGang(sctx, spec)
					var se *api.SaturatedError
					switch {
					case err == nil || errors.Is(err, api.ErrExists): // admitted (perhaps by an attempt whose answer was lost)
						admitted.Add(1)
					case sctx.Err() != nil:
					case errors.As(err, &se):
						if sleepCtx(sctx, min(max(se.RetryAfter, 10*time.Millisecond), time.Second)) == nil {
							continue
						}
					default:
						errc <- fmt.Errorf("submit pending gang %d: %w", i, err)
						cancel()
						return
					}
					break
				}
			}
		}()
	}
	var first error
	for w := 0; w < b.cfg.concurrency; w++ {
		if err := <-errc; err != nil && first == nil {
			first = err
		}
	}
	if first == nil && ctx.Err() != nil {
		first = ctx.Err()
	}
	return int(admitted.Load()), first
}

// cpProbeInOffice is the probe gang's name. A new leader is in office when it admits a
// submission: the head has won the election, committed the next leader term, read the log's
// tables, rebuilt its scheduler with every pending gang, and committed its start-up
// decisions (the admission is committed after them). The kill itself is at time 0.
const cpProbeInOffice = "probe-in-office"

// killAndProbe SIGKILLs the leader and polls the other heads: GET /v1/status until one says
// it leads (elected), POST /v1/gangs of a probe gang until one admits it (in office).
func (b *cpBench) killAndProbe(ctx context.Context, leader uint64, p procInfo) (elected, inOffice time.Duration, head uint64, err error) {
	body, _ := json.Marshal(api.GangSpec{Job: "bench-cp-pending", Name: cpProbeInOffice, Kind: "bench-noop", Workers: 1,
		Resources: api.Resources{GPUs: b.gpm}})
	pctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var mu sync.Mutex
	var wg sync.WaitGroup
	done := make(chan struct{})
	var once sync.Once
	start := time.Now()
	if !p.signal(syscall.SIGKILL) {
		return 0, 0, 0, fmt.Errorf("could not kill head %d (pid %d)", leader, p.PID)
	}
	for _, h := range b.cf.Heads {
		if h.ID == leader {
			continue
		}
		wg.Add(2)
		go func() { // elected: the head's replica says it leads
			defer wg.Done()
			for pctx.Err() == nil {
				v, err := b.headStatus(pctx, h.API, time.Second)
				if err == nil && v.Role == "leader" && v.ID != leader {
					mu.Lock()
					if elected == 0 {
						elected = time.Since(start)
					}
					mu.Unlock()
					return
				}
				_ = sleepCtx(pctx, 5*time.Millisecond)
			}
		}()
		go func() { // in office: the head admits a submission
			defer wg.Done()
			for pctx.Err() == nil {
				rctx, rcancel := context.WithTimeout(pctx, 5*time.Second)
				code, kind := b.post(rctx, h.API+"/v1/gangs", body)
				rcancel()
				if code == http.StatusOK || kind == "exists" {
					once.Do(func() {
						mu.Lock()
						inOffice, head = time.Since(start), h.ID
						mu.Unlock()
						close(done)
						cancel()
					})
					return
				}
				_ = sleepCtx(pctx, 5*time.Millisecond)
			}
		}()
	}
	wg.Wait()
	select {
	case <-done:
	default:
		if ctx.Err() != nil {
			return 0, 0, 0, ctx.Err()
		}
		return 0, 0, 0, errors.New("no head admitted a submission within 2 minutes of the leader's kill")
	}
	mu.Lock()
	defer mu.Unlock()
	if elected == 0 || elected > inOffice {
		elected = inOffice // the admission came before a poll saw the role
	}
	return elected, inOffice, head, nil
}

// headView is one head's answer to GET /v1/status (its replica's view).
type headView struct {
	ID     uint64 `json:"id"`
	Role   string `json:"role"`
	Leader uint64 `json:"leader"`
}

func (b *cpBench) headStatus(ctx context.Context, base string, timeout time.Duration) (headView, error) {
	var v headView
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/status", nil)
	if err != nil {
		return v, err
	}
	req.Header.Set("Authorization", "Bearer "+b.d.token)
	resp, err := b.d.hc.Do(req)
	if err != nil {
		return v, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return v, fmt.Errorf("%s/v1/status: %s", base, resp.Status)
	}
	return v, json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&v)
}

// scrapeMetrics sums the scheduler-cycle and commit histograms' sums and counts over the
// heads' /metrics (a head that does not answer counts nothing).
func (b *cpBench) scrapeMetrics(ctx context.Context) map[string]float64 {
	out := map[string]float64{}
	for _, h := range b.cf.Heads {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		req, _ := http.NewRequestWithContext(rctx, http.MethodGet, h.API+"/metrics", nil)
		req.Header.Set("Authorization", "Bearer "+b.d.token)
		resp, err := b.d.hc.Do(req)
		if err == nil {
			data, _ := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
			resp.Body.Close()
			for _, line := range strings.Split(string(data), "\n") {
				name, val, ok := strings.Cut(line, " ")
				if !ok || !strings.HasPrefix(name, "atoll_schedule_cycle_seconds_") && !strings.HasPrefix(name, "atoll_paxos_commit_seconds_") {
					continue
				}
				if v, err := strconv.ParseFloat(val, 64); err == nil && (strings.HasSuffix(name, "_sum") || strings.HasSuffix(name, "_count")) {
					out[name] += v
				}
			}
		}
		cancel()
	}
	return out
}

// post sends a JSON body to one head and returns the status and the error kind answered.
func (b *cpBench) post(ctx context.Context, url string, body []byte) (int, string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, ""
	}
	req.Header.Set("Authorization", "Bearer "+b.d.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := b.d.hc.Do(req)
	if err != nil {
		return 0, ""
	}
	defer resp.Body.Close()
	var eb api.ErrorBody
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	_ = json.Unmarshal(data, &eb)
	return resp.StatusCode, eb.Kind
}

// observeLeader asks every head which head leads and records a change of the leader most
// of them name.
func (b *cpBench) observeLeader(ctx context.Context) {
	views := make([]uint64, len(b.cf.Heads))
	var wg sync.WaitGroup
	for i, h := range b.cf.Heads {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if v, err := b.headStatus(ctx, h.API, time.Second); err == nil {
				views[i] = v.Leader
			}
		}()
	}
	wg.Wait()
	votes := map[uint64]int{}
	var named uint64
	for _, l := range views {
		if l == 0 {
			continue
		}
		votes[l]++
		if votes[l] > votes[named] || votes[l] == votes[named] && l > named {
			named = l
		}
	}
	if named == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.leader != 0 && named != b.leader {
		b.changes = append(b.changes, time.Now())
	}
	b.leader = named
}

// watchLeader polls the heads' leader every 250 ms while watching is on (it is off while
// the idle heads are measured: the polls would be their work).
func (b *cpBench) watchLeader(ctx context.Context) {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if b.watching.Load() {
			b.observeLeader(ctx)
		}
	}
}

// leaderNow asks every head at once which leads, until one says it does and most name it
// (the leader at this instant, not the status's last word); it returns its id and process.
func (b *cpBench) leaderNow(ctx context.Context) (uint64, procInfo, error) {
	deadline := time.Now().Add(time.Minute)
	for {
		views := make([]headView, len(b.cf.Heads))
		var wg sync.WaitGroup
		for i, h := range b.cf.Heads {
			wg.Add(1)
			go func() {
				defer wg.Done()
				views[i], _ = b.headStatus(ctx, h.API, time.Second)
			}()
		}
		wg.Wait()
		for _, v := range views {
			if v.Role != "leader" {
				continue
			}
			named := 0
			for _, o := range views {
				if o.Leader == v.ID {
					named++
				}
			}
			if p, ok := b.head(v.ID); ok && 2*named > len(views) {
				return v.ID, p, nil
			}
		}
		if time.Now().After(deadline) {
			return 0, procInfo{}, errors.New("no head has led for a minute")
		}
		if err := sleepCtx(ctx, 20*time.Millisecond); err != nil {
			return 0, procInfo{}, err
		}
	}
}

func (b *cpBench) head(id uint64) (procInfo, bool) {
	for _, h := range b.cf.Heads {
		if h.ID == id {
			return h, true
		}
	}
	return procInfo{}, false
}

func (b *cpBench) agent(machine string) (procInfo, bool) {
	for _, a := range b.cf.Agents {
		if a.Name == machine {
			return a, true
		}
	}
	return procInfo{}, false
}

// clockTick is the unit of /proc/PID/stat's times (USER_HZ, 100 on Linux).
const clockTick = 10 * time.Millisecond

// procsCPU reads the CPU time (user and system) each process has used.
func procsCPU(pids []int) ([]time.Duration, error) {
	out := make([]time.Duration, len(pids))
	for i, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return nil, fmt.Errorf("the CPU time of pid %d: %w", pid, err)
		}
		// "pid (comm) state ...": utime and stime are fields 14 and 15, the 12th and 13th
		// after the command name.
		j := bytes.LastIndexByte(b, ')')
		fs := strings.Fields(string(b[j+1:]))
		if j < 0 || len(fs) < 13 {
			return nil, fmt.Errorf("/proc/%d/stat: unexpected %q", pid, b)
		}
		ut, err1 := strconv.ParseInt(fs[11], 10, 64)
		stime, err2 := strconv.ParseInt(fs[12], 10, 64)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("/proc/%d/stat: unexpected %q", pid, b)
		}
		out[i] = time.Duration(ut+stime) * clockTick
	}
	return out, nil
}

// loadAvg is the machine's 1-minute load average (0 where /proc/loadavg is missing).
func loadAvg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

// loadSampler samples the load average every 2 s until stop, which returns the mean and
// the maximum.
type loadSampler struct {
	cancel  context.CancelFunc
	done    chan struct{}
	samples []float64
}

func sampleLoadAvg(ctx context.Context) *loadSampler {
	ctx, cancel := context.WithCancel(ctx)
	s := &loadSampler{cancel: cancel, done: make(chan struct{}), samples: []float64{loadAvg()}}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(2 * time.Second)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				s.samples = append(s.samples, loadAvg())
			}
		}
	}()
	return s
}

func (s *loadSampler) stop() (mean, maxv float64) {
	s.cancel()
	<-s.done
	for _, v := range s.samples {
		mean += v
		maxv = max(maxv, v)
	}
	return round2(mean / float64(len(s.samples))), maxv
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func round2(x float64) float64 { return float64(int64(x*100+0.5)) / 100 }
