package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
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
	"github.com/atoll-run/atoll/runtime/head"
)

// `atoll bench scale` measures the scale envelope of one head group: 3 real head processes
// and --machines hollow machines (the real agent with hollow workers, many per process,
// `atoll bench hollow-agents`), each with its own credential and certificate, over mutual
// TLS, then a workload of gangs and placed actors and 10,000 pending gangs.

// scaleConfig is the benchmark's configuration (its flags).
type scaleConfig struct {
	machines     int
	perProcess   int
	gossip       int
	gangs        int
	actors       int
	tasks        int
	pending      int
	probes       int
	concurrency  int
	window       time.Duration
	setupTimeout time.Duration
	skipLost     bool
	skipFailover bool
	// keep keeps the run's directory (the heads' and agents' logs) when it succeeds too.
	keep bool
	// nice is the hollow processes' scheduling niceness: on a real cluster the agents do
	// not share the heads' cores, here they yield them.
	nice int
	// groupNice is the niceness of the hollow processes' scheduling groups (the kernel's
	// autogroups: each process of its own session is one, and nice counts only inside it).
	groupNice int
	// election is the heads' Paxos election timeout (0: the heads' default).
	election time.Duration
	// reportRate is the heads' --report-rate (0: their default).
	reportRate float64
	// handshakes is the heads' --max-handshakes (0: their default, GOMAXPROCS).
	handshakes int
	// inflight is the heads' --max-inflight (0: their default, no bound).
	inflight int
	// http2 is the heads' --http2.
	http2 bool
	// probeProfile, when set, is where the leader's CPU profile taken while the probes
	// run is written (its /debug/pprof/profile, probeProfileFor long).
	probeProfile    string
	probeProfileFor time.Duration
	// failoverProfile, when set, is the prefix of the surviving heads' CPU profiles taken
	// from just before the leader's SIGKILL, failoverProfileFor long
	// (PREFIX-head<ID>.pprof): what the heads do while a new one takes office.
	failoverProfile    string
	failoverProfileFor time.Duration
	// workloadProfile, when set, is the prefix of the three heads' CPU profiles taken from
	// the start of the workload's submission, workloadProfileFor long
	// (PREFIX-head<ID>.pprof): what the heads do while thousands of gangs are placed.
	workloadProfile    string
	workloadProfileFor time.Duration
	// tasksProfile: the same from the start of the tasks' submission.
	tasksProfile    string
	tasksProfileFor time.Duration
	// pendingProfile: the same from the start of the pending gangs' submission.
	pendingProfile    string
	pendingProfileFor time.Duration
	// profileTrace: each phase's profiles come with the heads' execution traces of the
	// same span (PREFIX-head<ID>.trace: which goroutines waited to run, and for what).
	profileTrace bool
}

func (c scaleConfig) validate() error {
	switch {
	case c.machines < 2 || c.machines > 20_000:
		return fmt.Errorf("--machines %d: want 2..20000", c.machines)
	case c.perProcess < 1 || c.perProcess > 5_000:
		return fmt.Errorf("--per-process %d: want 1..5000", c.perProcess)
	case c.gossip < 0 || c.gossip > c.machines:
		return fmt.Errorf("--gossip-members %d: want 0..--machines", c.gossip)
	case c.gangs < -1 || c.actors < -1 || c.pending < 0 || c.pending > 100_000:
		return fmt.Errorf("--gangs %d --actors %d --pending %d: want gangs and actors ≥ -1 (-1: the default for the size), pending 0..100000", c.gangs, c.actors, c.pending)
	case c.tasks < -1 || c.tasks > 100_000:
		return fmt.Errorf("--tasks %d: want -1..100000 (-1: the default for the size)", c.tasks)
	case c.probes < 1 || c.probes > 10_000:
		return fmt.Errorf("--probes %d: want 1..10000", c.probes)
	case c.concurrency < 1 || c.concurrency > 256:
		return fmt.Errorf("--concurrency %d: want 1..256", c.concurrency)
	case c.window < time.Second || c.window > 10*time.Minute:
		return fmt.Errorf("--window %v: want 1s..10m", c.window)
	case c.nice < 0 || c.nice > 19:
		return fmt.Errorf("--hollow-nice %d: want 0..19", c.nice)
	case c.groupNice < 0 || c.groupNice > 19:
		return fmt.Errorf("--hollow-group-nice %d: want 0..19", c.groupNice)
	case c.election != 0 && checkTiming(head.DefaultTick, c.election) != nil:
		return fmt.Errorf("--election-timeout: %w", checkTiming(head.DefaultTick, c.election))
	case c.setupTimeout <= 0 || c.setupTimeout > 2*time.Hour:
		return fmt.Errorf("--setup-timeout %v: want (0, 2h]", c.setupTimeout)
	case c.handshakes < 0:
		return fmt.Errorf("--max-handshakes %d: want 0 (the heads' default) or more", c.handshakes)
	case c.inflight < 0:
		return fmt.Errorf("--max-inflight %d: want 0 (the heads' default, no bound) or more", c.inflight)
	}
	return nil
}

// scaleResult is the benchmark's JSON. A figure it could not measure is null, and notes
// say why.
type scaleResult struct {
	Machines int `json:"machines"`
	GPUs     int `json:"gpus"`
	// Registered counts the machines alive and reporting when registration ended (all of
	// them, or those up when --setup-timeout ran out).
	Registered int `json:"registered"`
	// RegisterS: from the first hollow agents' process started to every machine alive in
	// the leader's status (each machine got its certificate, registered, and reported).
	RegisterS *float64 `json:"register_s"`
	// HeadCPUCores and HeadRSSMiB: the leader head's CPU (cores: CPU seconds per second,
	// /proc/PID/stat) and resident memory (/proc/PID/status VmRSS) over --window in the
	// steady state with the workload running and the pending gangs waiting; HeadsCPUCores
	// the three heads together. Idle*: the same with every machine registered and no gang.
	HeadCPUCores      *float64  `json:"head_cpu_cores"`
	HeadRSSMiB        *float64  `json:"head_rss_mib"`
	HeadsCPUCores     *float64  `json:"heads_cpu_cores"`
	HeadsRSSMiB       []float64 `json:"heads_rss_mib,omitempty"`
	IdleHeadCPUCores  *float64  `json:"idle_head_cpu_cores"`
	IdleHeadsCPUCores *float64  `json:"idle_heads_cpu_cores"`
	IdleHeadRSSMiB    *float64  `json:"idle_head_rss_mib"`
	// MetaWritesPerS: the metadata log's writes per second in the same steady state (the
	// leader's state machine revision, which every committed write advances); LogCommitsPerS
	// its Paxos commits (batches); Idle*: with no gang.
	MetaWritesPerS     *float64 `json:"meta_writes_per_s"`
	LogCommitsPerS     *float64 `json:"log_commits_per_s"`
	IdleMetaWritesPerS *float64 `json:"idle_meta_writes_per_s"`
	// HollowCPUCores is the hollow agents' processes' CPU over the loaded window (what the
	// machines' side costs on this host, beside the heads); IdleHollowCPUCores over the
	// idle window.
	HollowCPUCores     *float64 `json:"hollow_cpu_cores"`
	IdleHollowCPUCores *float64 `json:"idle_hollow_cpu_cores"`
	// SchedP50MS and SchedP99MS: --probes gangs of one 1-GPU worker submitted one after
	// another while PendingGangs wait: from the submission to the gang placed (its record
	// starting or running).
	SchedP50MS   *float64 `json:"sched_p50_ms"`
	SchedP99MS   *float64 `json:"sched_p99_ms"`
	PendingGangs int      `json:"pending_gangs"`
	// SchedMaxMS is the slowest probe; ProbesPlacedInAnswer the probes whose submission's
	// answer already held their placement (the rest were read back until placed);
	// ProbeCycles and ProbeCycleMeanMS the leader's scheduling cycles while the probes ran
	// and their mean length, ProbeCommits and ProbeCommitMeanMS its log commits and theirs.
	SchedMaxMS           float64 `json:"sched_max_ms"`
	ProbesPlacedInAnswer int     `json:"probes_placed_in_answer"`
	ProbeCycles          int     `json:"probe_cycles"`
	ProbeCycleMeanMS     float64 `json:"probe_cycle_mean_ms"`
	ProbeCommits         int     `json:"probe_commits"`
	ProbeCommitMeanMS    float64 `json:"probe_commit_mean_ms"`
	// RunningGangs: multi-machine gangs running (2 workers of 4 GPUs each); Actors: placed
	// actors running (gangs of one worker without GPUs, Ray's actors); counted in the
	// leader's status after the workload was submitted.
	RunningGangs *int `json:"running_gangs"`
	Actors       *int `json:"actors"`
	// RunningTasks: --tasks tasks of one CPU submitted at once through the SDK, each
	// holding its task worker (hosted by its hollow machine's process, answering calls)
	// until released: how many the tasks themselves said run at once (a count actor's
	// count), when all had or --setup-timeout ran out; QueuedTasks: those then neither
	// started nor ended; TasksS: from the submission to that count; TasksEnded: tasks that
	// ended (failed) before it.
	RunningTasks *int     `json:"running_tasks"`
	QueuedTasks  *int     `json:"queued_tasks"`
	TasksS       *float64 `json:"tasks_s"`
	TasksEnded   int      `json:"tasks_ended_early"`
	// TasksStoppedS: from the tasks' release to the leader's status showing none of their
	// workers live (the job stopped: every task worker's gang ended at once); null with a
	// note when that did not happen within --setup-timeout.
	TasksStoppedS *float64 `json:"tasks_stopped_s"`
	// FailoverS: the leader head SIGKILLed at this size, to the first submission a new
	// leader admits (its term committed, its scheduler rebuilt from the log with every
	// machine and gang). LostMachineDetectS: one hollow machine's process SIGKILLed, to the
	// leader's status showing it dead.
	FailoverS *float64 `json:"failover_s"`
	// FailoverElectedS: the same kill to a surviving head's replica saying it leads (the
	// Paxos election; the rest of failover_s is the new leader loading its term).
	FailoverElectedS   *float64 `json:"failover_elected_s"`
	LostMachineDetectS *float64 `json:"lost_machine_detect_s"`
	Notes              []string `json:"notes"`

	Targets map[string]float64 `json:"targets"`
	Met     map[string]bool    `json:"met"`

	Started         string  `json:"started"`
	TotalS          float64 `json:"total_s"`
	Heads           int     `json:"heads"`
	TLS             bool    `json:"tls"`
	CPUs            int     `json:"cpus"`
	HollowProcesses int     `json:"hollow_processes"`
	GossipMembers   int     `json:"gossip_members"`
	HollowNice      int     `json:"hollow_nice"`
	HollowGroupNice int     `json:"hollow_group_nice"`
	// ElectionTimeoutS is the heads' Paxos election timeout (--election-timeout; their
	// default when 0 was asked).
	ElectionTimeoutS float64 `json:"election_timeout_s"`
	// ReportRate is the heads' --report-rate (their default when 0 was asked; negative:
	// the agents' reports were not paced).
	ReportRate float64 `json:"report_rate"`
	// MaxHandshakes is the heads' --max-handshakes (0: their default, GOMAXPROCS).
	MaxHandshakes int `json:"max_handshakes"`
	// MaxInflight is the heads' --max-inflight (0: no bound).
	MaxInflight int `json:"max_inflight"`
	// HTTP2 is the heads' --http2.
	HTTP2          bool    `json:"http2"`
	WindowS        float64 `json:"window_s"`
	SubmitS        float64 `json:"submit_s"`
	WorkloadSubmit int     `json:"workload_submitted"`
	// WorkloadFailed counts the workload's gangs that failed (or stopped), WorkloadRestarts
	// their restarts (a machine declared dead moves its gangs), when the count was taken.
	WorkloadFailed   int     `json:"workload_failed"`
	WorkloadRestarts int     `json:"workload_restarts"`
	PendingSubmitS   float64 `json:"pending_submit_s"`
	LoadAvgStart     float64 `json:"load_avg_start"`
	LoadAvgMean      float64 `json:"load_avg_mean"`
	LoadAvgMax       float64 `json:"load_avg_max"`
}

func newBenchScaleCmd() *cobra.Command {
	cfg := scaleConfig{machines: 100, perProcess: 500, gossip: 32, gangs: -1, actors: -1, tasks: -1, pending: 10_000, probes: 200, concurrency: 16,
		window: 20 * time.Second, setupTimeout: 30 * time.Minute}
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "scale",
		Short: "The scale envelope: 3 heads and --machines hollow machines of 8 GPUs, a workload of gangs and actors, 10,000 pending gangs",
		Long: `scale starts 3 heads (mutual TLS) and --machines hollow machines of 8 simulated GPUs each:
the real agent with hollow workers (no processes), --per-process of them per process, each
with its own credential and certificate; the first --gossip-members run a serf member, the
others are judged by their load reports (every second) alone. It measures:
  register_s          every machine registered and alive in the leader's status;
  idle_* figures      the heads' CPU, memory and metadata writes with no gang, over --window;
  running_gangs       gangs of 2 workers x 4 GPUs (--gangs, default min(1000, machines/2));
  actors              placed actors, gangs of one worker without GPUs (--actors, default
                      10 per machine);
  sched_p50/p99_ms    with --pending gangs waiting (pinned to a machine another gang holds),
                      --probes 1-GPU gangs submitted one at a time: submission to placement;
  head_cpu_cores ...  the leader head's CPU, RSS and the log's writes over --window with all
                      of it in place;
  lost_machine_detect_s  one hollow machine's process SIGKILLed to its death in the status;
  failover_s          the leader SIGKILLed to the first submission a new leader admits.
  running_tasks       tasks of one CPU (--tasks, default min(15000, 8 per machine)) submitted
                      at once through the SDK, each holding its task worker: how many run at
                      once by the tasks' own count (queued_tasks: those not started then).
Hollow workers run no program, except task workers (and the tasks' count actor): the hollow
agents' processes host those as real actors that answer calls, one actor system per process.`,
		Args: noSubcommand,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cfg.validate(); err != nil {
				return fmt.Errorf("bench scale: %w", err)
			}
			res, err := runScaleBench(cmd.Context(), cfg, cmd.ErrOrStderr())
			if err != nil {
				return fmt.Errorf("bench scale: %w", err)
			}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(res)
			}
			printScale(cmd.OutOrStdout(), res)
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&cfg.machines, "machines", cfg.machines, "hollow machines (8 simulated GPUs each)")
	f.IntVar(&cfg.perProcess, "per-process", cfg.perProcess, "hollow machines per hollow-agents process")
	f.IntVar(&cfg.gossip, "gossip-members", cfg.gossip, "hollow machines that run a serf member of their own (the others: load reports alone)")
	f.IntVar(&cfg.gangs, "gangs", cfg.gangs, "running gangs of 2 workers x 4 GPUs (-1: min(1000, machines/2))")
	f.IntVar(&cfg.actors, "actors", cfg.actors, "placed actors, one worker without GPUs each (-1: 10 per machine)")
	f.IntVar(&cfg.tasks, "tasks", cfg.tasks, "tasks held at once, each on its own task worker (-1: min(15000, 8 per machine); 0: none)")
	f.IntVar(&cfg.pending, "pending", cfg.pending, "gangs waiting while the scheduling latency is measured")
	f.IntVar(&cfg.probes, "probes", cfg.probes, "1-GPU gangs submitted one at a time to measure the scheduling latency")
	f.IntVar(&cfg.concurrency, "concurrency", cfg.concurrency, "concurrent submissions of the workload and the pending gangs")
	f.DurationVar(&cfg.window, "window", cfg.window, "how long each steady state is measured")
	f.DurationVar(&cfg.setupTimeout, "setup-timeout", cfg.setupTimeout, "how long registration and each submission phase may take")
	f.IntVar(&cfg.nice, "hollow-nice", 10, "the hollow processes' niceness (0..19): they yield the CPU to the heads, whose machines they would not share on a real cluster")
	f.IntVar(&cfg.groupNice, "hollow-group-nice", 0, "the niceness of the hollow processes' scheduling groups where the kernel groups processes by session (autogroup: --hollow-nice then counts only inside each process; 0..19): 10 gives the heads the CPU first, which at 1,000 machines on two cores starves the hollow agents' reports instead")
	f.DurationVar(&cfg.election, "election-timeout", 0, "the heads' Paxos election timeout (0: their default, atoll head --election-timeout): a longer one rides out a starved head's pauses, and bounds failover from below")
	f.BoolVar(&cfg.skipLost, "skip-lost", false, "do not kill a hollow machine")
	f.BoolVar(&cfg.skipFailover, "skip-failover", false, "do not kill the leader head")
	f.StringVar(&cfg.probeProfile, "probe-cpuprofile", "", "write the leader head's CPU profile, taken while the scheduling probes run, to this file")
	f.DurationVar(&cfg.probeProfileFor, "probe-cpuprofile-for", 10*time.Second, "how long the probes' CPU profile runs (give enough --probes to cover it)")
	f.StringVar(&cfg.failoverProfile, "failover-cpuprofile", "", "write the surviving heads' CPU profiles, taken from just before the leader's SIGKILL, to PREFIX-head<ID>.pprof")
	f.DurationVar(&cfg.failoverProfileFor, "failover-cpuprofile-for", 20*time.Second, "how long the failover's CPU profiles run")
	f.Float64Var(&cfg.reportRate, "report-rate", 0, "the heads' --report-rate (0: their default, 500; negative: the leader never paces the agents' reports)")
	f.IntVar(&cfg.handshakes, "max-handshakes", 0, "the heads' --max-handshakes (0: their default, GOMAXPROCS)")
	f.IntVar(&cfg.inflight, "max-inflight", 0, "the heads' --max-inflight (0: their default, no bound)")
	f.BoolVar(&cfg.http2, "http2", false, "the heads' --http2 (the API over HTTP/2: one connection per agent and head)")
	f.StringVar(&cfg.workloadProfile, "workload-cpuprofile", "", "write the heads' CPU profiles, taken from the start of the workload's submission, to PREFIX-head<ID>.pprof")
	f.DurationVar(&cfg.workloadProfileFor, "workload-cpuprofile-for", 30*time.Second, "how long the workload's CPU profiles run")
	f.StringVar(&cfg.tasksProfile, "tasks-cpuprofile", "", "write the heads' CPU profiles, taken from the start of the tasks' submission, to PREFIX-head<ID>.pprof")
	f.DurationVar(&cfg.tasksProfileFor, "tasks-cpuprofile-for", 30*time.Second, "how long the tasks' CPU profiles run")
	f.StringVar(&cfg.pendingProfile, "pending-cpuprofile", "", "write the heads' CPU profiles, taken from the start of the pending gangs' submission, to PREFIX-head<ID>.pprof")
	f.DurationVar(&cfg.pendingProfileFor, "pending-cpuprofile-for", 30*time.Second, "how long the pending gangs' CPU profiles run")
	f.BoolVar(&cfg.profileTrace, "profile-trace", false, "with each phase's CPU profiles, the heads' execution traces of the same span (PREFIX-head<ID>.trace)")
	f.BoolVar(&cfg.keep, "keep", false, "keep the run's directory (the heads' and agents' logs) even when the run succeeds")
	f.BoolVar(&asJSON, "json", false, "print one JSON object")
	return cmd
}

func printScale(w io.Writer, r *scaleResult) {
	f := func(p *float64) string {
		if p == nil {
			return "n/a"
		}
		return strconv.FormatFloat(*p, 'f', 2, 64)
	}
	i := func(p *int) string {
		if p == nil {
			return "n/a"
		}
		return strconv.Itoa(*p)
	}
	fmt.Fprintf(w, "scale: 3 heads, %d hollow machines (%d GPUs) in %d processes, %d gossiping; load average %.1f (max %.1f) on %d CPUs\n",
		r.Machines, r.GPUs, r.HollowProcesses, r.GossipMembers, r.LoadAvgMean, r.LoadAvgMax, r.CPUs)
	fmt.Fprintf(w, "registered in %s s; idle leader %s cores, %s MiB, %s writes/s\n", f(r.RegisterS), f(r.IdleHeadCPUCores), f(r.IdleHeadRSSMiB), f(r.IdleMetaWritesPerS))
	fmt.Fprintf(w, "running gangs %s, actors %s, running tasks %s, queued tasks %s, pending gangs %d\n", i(r.RunningGangs), i(r.Actors), i(r.RunningTasks), i(r.QueuedTasks), r.PendingGangs)
	if r.TasksS != nil {
		fmt.Fprintf(w, "tasks: %d ran at once %.1f s after their submission (%d ended before); their workers stopped %s s after the release\n",
			*r.RunningTasks, *r.TasksS, r.TasksEnded, f(r.TasksStoppedS))
	}
	fmt.Fprintf(w, "loaded leader %s cores (heads %s), %s MiB, %s writes/s; scheduling p50 %s ms p99 %s ms\n",
		f(r.HeadCPUCores), f(r.HeadsCPUCores), f(r.HeadRSSMiB), f(r.MetaWritesPerS), f(r.SchedP50MS), f(r.SchedP99MS))
	fmt.Fprintf(w, "lost machine detected in %s s; failover %s s\n", f(r.LostMachineDetectS), f(r.FailoverS))
	for _, n := range r.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
}

// scaleBench is one run.
type scaleBench struct {
	cfg     scaleConfig
	res     *scaleResult
	dir     string
	cf      *clusterFile
	d       *dialed
	hollows []procInfo // the hollow-agents processes; the last one holds the machine to lose
	say     func(string, ...any)
}

func runScaleBench(ctx context.Context, cfg scaleConfig, progress io.Writer) (_ *scaleResult, err error) {
	began := time.Now()
	res := &scaleResult{Started: began.UTC().Format(time.RFC3339), Machines: cfg.machines, Heads: 3, TLS: true, CPUs: runtime.NumCPU(),
		GossipMembers: cfg.gossip, HollowNice: cfg.nice, HollowGroupNice: cfg.groupNice, WindowS: cfg.window.Seconds(), Notes: []string{},
		ElectionTimeoutS: cmp.Or(cfg.election, head.DefaultElectionTimeout).Seconds(), ReportRate: cmp.Or(cfg.reportRate, head.DefaultReportRate), MaxHandshakes: cfg.handshakes, MaxInflight: cfg.inflight, HTTP2: cfg.http2,
		Targets: map[string]float64{"machines": 2000, "actors": 20000, "running_tasks": 15000, "running_gangs": 1000, "head_cpu_cores": 1,
			"sched_p99_ms": 100, "failover_s": 3, "lost_machine_detect_s": 10},
		Met: map[string]bool{}}
	say := func(format string, args ...any) {
		fmt.Fprintf(progress, "bench scale: %s: "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
	}
	res.LoadAvgStart = loadAvg()
	loads := sampleLoadAvg(ctx)
	defer loads.stop()
	tmp, err := os.MkdirTemp("", "atoll-scale-")
	if err != nil {
		return nil, err
	}
	defer func() {
		if err == nil && !cfg.keep {
			os.RemoveAll(tmp)
		} else {
			say("the run's directory (logs) is kept: %s", tmp)
		}
	}()
	if cfg.tasks < 0 {
		cfg.tasks = min(15_000, 8*cfg.machines)
	}
	b := &scaleBench{cfg: cfg, res: res, dir: tmp, say: say}
	say("starting 3 heads")
	cf, _, err := startCluster(ctx, filepath.Join(tmp, "cluster"), 3, 0, "dgx-h100", true, 2*time.Minute, upOptions{election: b.cfg.election, reportRate: b.cfg.reportRate, handshakes: b.cfg.handshakes, inflight: b.cfg.inflight, http2: b.cfg.http2})
	if err != nil {
		return nil, err
	}
	b.cf = cf
	defer b.teardown()
	if b.d, err = dialCluster(ctx, clusterAddr(cf)); err != nil {
		return nil, err
	}
	if err := b.register(ctx); err != nil {
		var nr errNotRegistered
		if !errors.As(err, &nr) {
			return nil, err
		}
		// Where it stops is the result: no figure after registration is measured.
		res.Registered = nr.alive
		res.Notes = append(res.Notes, nr.Error()+": nothing after registration was measured")
		res.LoadAvgMean, res.LoadAvgMax = loads.stop()
		res.TotalS = time.Since(began).Seconds()
		return res, nil
	}
	res.Registered = cfg.machines
	say("idle: measuring the heads for %v", cfg.window)
	idle, err := b.steady(ctx)
	if err != nil {
		return nil, err
	}
	res.IdleHeadCPUCores, res.IdleHeadsCPUCores, res.IdleHeadRSSMiB, res.IdleMetaWritesPerS = &idle.leaderCPU, &idle.headsCPU, &idle.leaderRSS, &idle.writes
	res.IdleHollowCPUCores = &idle.hollowCPU
	if err := b.workload(ctx); err != nil {
		return nil, err
	}
	if err := b.pendingGangs(ctx); err != nil {
		return nil, err
	}
	say("loaded: measuring the heads for %v", cfg.window)
	loaded, err := b.steady(ctx)
	if err != nil {
		return nil, err
	}
	res.HeadCPUCores, res.HeadsCPUCores, res.HeadRSSMiB, res.HeadsRSSMiB = &loaded.leaderCPU, &loaded.headsCPU, &loaded.leaderRSS, loaded.rss
	res.MetaWritesPerS, res.LogCommitsPerS, res.HollowCPUCores = &loaded.writes, &loaded.commits, &loaded.hollowCPU
	if err := b.schedLatency(ctx); err != nil {
		return nil, err
	}
	if !cfg.skipLost {
		if err := b.loseMachine(ctx); err != nil {
			return nil, err
		}
	} else {
		res.Notes = append(res.Notes, "lost_machine_detect_s: skipped (--skip-lost)")
	}
	if !cfg.skipFailover {
		if err := b.failover(ctx); err != nil {
			return nil, err
		}
	} else {
		res.Notes = append(res.Notes, "failover_s: skipped (--skip-failover)")
	}
	// The tasks come last: their workers' mass stop at the end is a storm of its own
	// (tasks_stopped_s), which the figures above are not taken in.
	if cfg.tasks != 0 {
		if err := b.tasks(ctx); err != nil {
			return nil, err
		}
	} else {
		res.Notes = append(res.Notes, "running_tasks, queued_tasks: not measured (--tasks 0)")
	}
	b.verdicts()
	res.LoadAvgMean, res.LoadAvgMax = loads.stop()
	res.TotalS = time.Since(began).Seconds()
	return res, nil
}

func (b *scaleBench) verdicts() {
	r := b.res
	if r.RegisterS != nil {
		r.Met["machines"] = r.Machines >= 2000
	}
	set := func(name string, p *float64, le float64) {
		if p != nil {
			r.Met[name] = *p <= le
		}
	}
	seti := func(name string, p *int, ge int) {
		if p != nil {
			r.Met[name] = *p >= ge
		}
	}
	set("head_cpu_cores", r.HeadCPUCores, 1)
	set("sched_p99_ms", r.SchedP99MS, 100)
	set("failover_s", r.FailoverS, 3)
	set("lost_machine_detect_s", r.LostMachineDetectS, 10)
	seti("running_gangs", r.RunningGangs, 1000)
	seti("actors", r.Actors, 20000)
	seti("running_tasks", r.RunningTasks, 15000)
}

// teardown stops the hollow agents' processes, then the heads.
func (b *scaleBench) teardown() {
	b.say("stopping the cluster")
	stopProcs(&clusterFile{Agents: b.hollows}, 20*time.Second)
	stopProcs(b.cf, 5*time.Second)
}

// register mints every machine's credential (a scoped agent token, as atoll up does),
// starts the hollow agents' processes, and waits until every machine is alive.
func (b *scaleBench) register(ctx context.Context) error {
	n := b.cfg.machines
	hdir := filepath.Join(b.dir, "hollow")
	for i := range n {
		name := hollowName(i)
		if _, err := agentCredential(b.cf.TokenFile, filepath.Join(hdir, "agents", name), name); err != nil {
			return fmt.Errorf("hollow machine %s: its credential: %w", name, err)
		}
	}
	// Machines 0..n-2 in processes of --per-process; the last alone in its own process (the
	// machine lost on purpose), gossiping when any does.
	type batch struct{ first, count, gossip int }
	var batches []batch
	gossipLeft := max(0, b.cfg.gossip-1)
	for first := 0; first < n-1; first += b.cfg.perProcess {
		c := min(b.cfg.perProcess, n-1-first)
		g := min(c, gossipLeft)
		gossipLeft -= g
		batches = append(batches, batch{first, c, g})
	}
	batches = append(batches, batch{n - 1, 1, min(1, b.cfg.gossip)})
	b.res.HollowProcesses = len(batches)
	env := []string{"ATOLL_TOKEN_FILE=/dev/null", api.CACertEnv + "=" + b.cf.CACert}
	b.say("starting %d hollow machines in %d processes (%d gossiping)", n, len(batches), b.cfg.gossip)
	start := time.Now()
	for i, bt := range batches {
		p := procInfo{Name: fmt.Sprintf("hollow-agents-%d", i), Log: filepath.Join(b.dir, fmt.Sprintf("hollow-%d.log", i))}
		pid, err := spawnNice(b.cfg.nice, b.cfg.groupNice, p.Log, env, "bench", "hollow-agents", "--join", b.cf.Address, "--dir", hdir, "--first", strconv.Itoa(bt.first),
			"--count", strconv.Itoa(bt.count), "--gossip", strconv.Itoa(bt.gossip), "--host="+strconv.FormatBool(b.cfg.tasks != 0))
		if err != nil {
			return fmt.Errorf("start %s: %w", p.Name, err)
		}
		p.PID = pid
		if err := p.identify(); err != nil {
			return err
		}
		b.hollows = append(b.hollows, p)
	}
	rctx, cancel := context.WithTimeout(ctx, b.cfg.setupTimeout)
	defer cancel()
	last, seen := -1, 0
	for {
		st, err := b.d.Status(rctx)
		if err == nil {
			alive, gpus := 0, 0
			for _, m := range st.Machines {
				if m.Alive && m.Load != nil {
					alive++
					gpus += m.GPUs
				}
			}
			seen = alive
			if alive/100 != last/100 {
				b.say("%d of %d machines alive and reporting after %.1f s", alive, n, time.Since(start).Seconds())
				last = alive
			}
			if alive == n {
				s := round2(time.Since(start).Seconds())
				b.res.RegisterS, b.res.GPUs = &s, gpus
				return nil
			}
		}
		for _, p := range b.hollows {
			if !p.running() {
				return fmt.Errorf("%s (pid %d) exited while the machines registered: see %s", p.Name, p.PID, p.Log)
			}
		}
		if err := sleepCtx(rctx, time.Second); err != nil {
			if ctx.Err() != nil {
				return err
			}
			return errNotRegistered{alive: seen, n: n, in: b.cfg.setupTimeout}
		}
	}
}

// errNotRegistered: not every hollow machine was alive and reporting within --setup-timeout.
type errNotRegistered struct {
	alive, n int
	in       time.Duration
}

func (e errNotRegistered) Error() string {
	return fmt.Sprintf("only %d of %d hollow machines were alive and reporting after --setup-timeout %v", e.alive, e.n, e.in)
}

// spawnNice is spawn at a niceness (nice(1) runs the executable: every thread of the
// process has it).
func spawnNice(nice, groupNice int, logPath string, env []string, args ...string) (int, error) {
	if nice == 0 && groupNice == 0 {
		return spawn(logPath, env, args...)
	}
	exe, err := os.Executable()
	if err != nil {
		return 0, err
	}
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return 0, err
	}
	defer logf.Close()
	cmd := exec.Command("nice", append([]string{"-n", strconv.Itoa(nice), exe}, args...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("nice -n %d %s: %w", nice, exe, err)
	}
	go func() { _ = cmd.Wait() }()
	// The process is identified by its command line: wait until nice has exec'd.
	pid := cmd.Process.Pid
	// With the kernel's autogroup scheduling (sched_autogroup_enabled, Linux's default on
	// desktops and many VMs), a process of its own session (Setsid) is a scheduling group
	// of its own, and niceness counts only inside the group: each hollow process takes as
	// much of the CPU as each head whatever its niceness (at 2,000 machines the leader got
	// 0.35 cores and its goroutines waited seconds to run). groupNice sets the group's,
	// where the kernel has them.
	if groupNice != 0 {
		if err := os.WriteFile(fmt.Sprintf("/proc/%d/autogroup", pid), []byte(strconv.Itoa(groupNice)), 0); err != nil && !errors.Is(err, os.ErrNotExist) {
			return 0, fmt.Errorf("nice %d for the autogroup of pid %d: %w", groupNice, pid, err)
		}
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil && strings.HasPrefix(string(b), exe+"\x00") {
			return pid, nil
		}
	}
	return 0, fmt.Errorf("nice -n %d %s (pid %d) did not start the executable within 5 s", nice, exe, pid)
}

// steadyFigures are one steady-state window's measurements.
type steadyFigures struct {
	leaderCPU, headsCPU, leaderRSS, writes, commits, hollowCPU float64
	rss                                                        []float64
}

// steady measures the heads over --window: CPU, RSS, and the log's writes and commits.
func (b *scaleBench) steady(ctx context.Context) (steadyFigures, error) {
	var f steadyFigures
	leader, err := b.leaderID(ctx)
	if err != nil {
		return f, err
	}
	var pids, hpids []int
	li := -1
	for i, h := range b.cf.Heads {
		pids = append(pids, h.PID)
		if h.ID == leader {
			li = i
		}
	}
	for _, p := range b.hollows {
		hpids = append(hpids, p.PID)
	}
	r0, c0, err := b.revision(ctx, leader)
	if err != nil {
		return f, err
	}
	cpu0, err := procsCPU(pids)
	if err != nil {
		return f, err
	}
	hcpu0, err := procsCPU(hpids)
	if err != nil {
		return f, err
	}
	start := time.Now()
	if err := sleepCtx(ctx, b.cfg.window); err != nil {
		return f, err
	}
	cpu1, err := procsCPU(pids)
	if err != nil {
		return f, err
	}
	hcpu1, err := procsCPU(hpids)
	if err != nil {
		return f, err
	}
	wall := time.Since(start).Seconds()
	r1, c1, err := b.revision(ctx, leader)
	if err != nil {
		return f, err
	}
	for i := range pids {
		c := (cpu1[i] - cpu0[i]).Seconds() / wall
		f.headsCPU += c
		if i == li {
			f.leaderCPU = round2(c)
		}
		rss := procRSSMiB(pids[i])
		f.rss = append(f.rss, round2(rss))
		if i == li {
			f.leaderRSS = round2(rss)
		}
	}
	for i := range hpids {
		f.hollowCPU += (hcpu1[i] - hcpu0[i]).Seconds() / wall
	}
	f.headsCPU, f.hollowCPU = round2(f.headsCPU), round2(f.hollowCPU)
	f.writes, f.commits = round2(float64(r1-r0)/wall), round2(float64(c1-c0)/wall)
	return f, nil
}

// leaderID is the head that leads now.
func (b *scaleBench) leaderID(ctx context.Context) (uint64, error) {
	cp := &cpBench{cf: b.cf, d: b.d}
	id, _, err := cp.leaderNow(ctx)
	return id, err
}

// revision reads a head's state machine revision and Paxos commit index (GET /v1/status).
func (b *scaleBench) revision(ctx context.Context, id uint64) (rev, commit int64, err error) {
	var base string
	for _, h := range b.cf.Heads {
		if h.ID == id {
			base = h.API
		}
	}
	var v struct {
		Revision int64 `json:"revision"`
		Commit   int64 `json:"commit"`
	}
	if err := getJSON(ctx, b.d, base+"/v1/status", &v); err != nil {
		return 0, 0, err
	}
	return v.Revision, v.Commit, nil
}

// getJSON GETs a head URL with the command's token and certificate.
func getJSON(ctx context.Context, d *dialed, url string, out any) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+d.token)
	resp, err := d.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(out)
}

// procRSSMiB is a process's resident memory (VmRSS), MiB (0 when unreadable).
func procRSSMiB(pid int) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			fs := strings.Fields(rest)
			if len(fs) > 0 {
				kb, _ := strconv.ParseFloat(fs[0], 64)
				return kb / 1024
			}
		}
	}
	return 0
}

// The workload's job and the pinned machine's gang.
const (
	scaleJob     = "bench-scale"
	scaleHolder  = "holder"
	scalePending = "bench-scale-pending"
	// scaleTasksJob is the job of the tasks (bench_scale_tasks.go).
	scaleTasksJob = "bench-scale-tasks"
)

// pinnedMachine is the machine the holder keeps and the pending gangs are pinned to: the
// first that runs no serf member (gossip's false failures of starved hollow processes
// declared machine 0 dead, and with it every pending gang was refused), machine 0 when
// every machine gossips.
func (b *scaleBench) pinnedMachine() string {
	if i := max(0, b.cfg.gossip-1); i < b.cfg.machines-1 {
		return hollowName(i)
	}
	return hollowName(0)
}

// workload submits the holder of the pinned machine (which the pending gangs are pinned
// to), the running gangs and the actors, and waits until they run.
func (b *scaleBench) workload(ctx context.Context) error {
	n := b.cfg.machines
	gangs, actors := b.cfg.gangs, b.cfg.actors
	if gangs < 0 {
		gangs = min(1000, n/2)
	}
	if actors < 0 {
		actors = 10 * n
	}
	conf, err := b.d.SchedulerConfig(ctx)
	if err != nil {
		return err
	}
	need := b.cfg.pending + gangs*2 + actors + max(b.cfg.tasks, 0) + b.cfg.probes + 1000
	if conf.MaxPending < need || conf.JobWorkersBound() < need || conf.ClusterWorkersBound() < need {
		conf.MaxPending = max(conf.MaxPending, need)
		conf.MaxJobWorkers = max(conf.JobWorkersBound(), need)
		conf.MaxClusterWorkers = max(conf.ClusterWorkersBound(), need)
		if _, err := b.d.SetSchedulerConfig(ctx, conf); err != nil {
			return fmt.Errorf("raise the scheduler's bounds to %d: %w", need, err)
		}
	}
	for _, j := range []string{scaleJob, scalePending} {
		if _, err := b.d.SubmitJob(ctx, api.Job{Name: j}); err != nil {
			return err
		}
	}
	if _, err := b.d.SpawnGang(ctx, api.GangSpec{Job: scaleJob, Name: scaleHolder, Kind: "hollow", Workers: 1, Resources: api.Resources{GPUs: 8},
		Machines: []string{b.pinnedMachine()}, NotPreemptible: true}); err != nil {
		return fmt.Errorf("the holder of %s: %w", b.pinnedMachine(), err)
	}
	var specs []api.GangSpec
	for i := range gangs {
		specs = append(specs, api.GangSpec{Job: scaleJob, Name: fmt.Sprintf("g%05d", i), Kind: "hollow", Workers: 2, Resources: api.Resources{GPUs: 4},
			NotPreemptible: true, MaxRestarts: 10})
	}
	for i := range actors {
		specs = append(specs, api.GangSpec{Job: scaleJob, Name: fmt.Sprintf("a%06d", i), Kind: "hollow", Workers: 1, NotPreemptible: true, MaxRestarts: 10})
	}
	b.say("workload: submitting %d gangs and %d actors", gangs, actors)
	if b.cfg.workloadProfile != "" {
		if leader, err := b.leaderID(ctx); err == nil {
			b.res.Notes = append(b.res.Notes, fmt.Sprintf("workload-cpuprofile: head %d led when the profiles began", leader))
		}
		defer b.profileHeads(ctx, "workload-cpuprofile", b.cfg.workloadProfile, b.cfg.workloadProfileFor, 0)()
	}
	start := time.Now()
	n0, err := b.submit(ctx, specs)
	b.res.SubmitS, b.res.WorkloadSubmit = round2(time.Since(start).Seconds()), n0
	if err != nil {
		return err
	}
	b.say("workload: %d submitted in %.1f s; waiting until they run", n0, b.res.SubmitS)
	wctx, cancel := context.WithTimeout(ctx, b.cfg.setupTimeout)
	defer cancel()
	for {
		st, err := b.d.Status(wctx)
		if err == nil {
			running, acting, failed, restarts := 0, 0, 0, 0
			for _, g := range st.Gangs {
				if g.Job != scaleJob || g.Name == scaleHolder {
					continue
				}
				restarts += g.Restarts
				switch {
				case g.State == api.GangRunning && strings.HasPrefix(g.Name, "g"):
					running++
				case g.State == api.GangRunning:
					acting++
				case g.State == api.GangFailed || g.State == api.GangStopped:
					failed++
				}
			}
			b.res.RunningGangs, b.res.Actors, b.res.WorkloadFailed, b.res.WorkloadRestarts = &running, &acting, failed, restarts
			if running+acting+failed >= n0 { // every admitted gang
				break
			}
		}
		if err := sleepCtx(wctx, time.Second); err != nil {
			b.res.Notes = append(b.res.Notes, fmt.Sprintf("running_gangs, actors: counted when --setup-timeout %v ran out, not all of the %d submitted ran", b.cfg.setupTimeout, len(specs)))
			break
		}
	}
	if b.res.RunningGangs == nil { // no leader answered the status all that time
		zero, none := 0, 0
		b.res.RunningGangs, b.res.Actors = &zero, &none
		b.res.Notes = append(b.res.Notes, "running_gangs, actors: no head answered the cluster's status before --setup-timeout ran out")
	}
	b.say("workload: %d gangs and %d actors run after %.1f s", *b.res.RunningGangs, *b.res.Actors, time.Since(start).Seconds())
	return nil
}

// pendingGangs submits the --pending gangs, pinned to the machine the holder keeps.
func (b *scaleBench) pendingGangs(ctx context.Context) error {
	var specs []api.GangSpec
	for i := range b.cfg.pending {
		specs = append(specs, api.GangSpec{Job: scalePending, Name: fmt.Sprintf("p%06d", i), Kind: "hollow", Workers: 1, Resources: api.Resources{GPUs: 8},
			Machines: []string{b.pinnedMachine()}})
	}
	b.say("pending: submitting %d gangs pinned to %s", len(specs), b.pinnedMachine())
	if b.cfg.pendingProfile != "" {
		if leader, err := b.leaderID(ctx); err == nil {
			b.res.Notes = append(b.res.Notes, fmt.Sprintf("pending-cpuprofile: head %d led when the profiles began", leader))
		}
		defer b.profileHeads(ctx, "pending-cpuprofile", b.cfg.pendingProfile, b.cfg.pendingProfileFor, 0)()
	}
	start := time.Now()
	n1, err := b.submit(ctx, specs)
	b.res.PendingSubmitS, b.res.PendingGangs = round2(time.Since(start).Seconds()), n1
	if err != nil {
		return err
	}
	b.say("pending: %d submitted in %.1f s", n1, b.res.PendingSubmitS)
	return nil
}

// submit submits gangs, --concurrency at once; a saturation refusal is retried after its
// hint. It returns how many were admitted.
func (b *scaleBench) submit(ctx context.Context, specs []api.GangSpec) (int, error) {
	var next, admitted atomic.Int64
	sctx, cancel := context.WithTimeout(ctx, b.cfg.setupTimeout)
	defer cancel()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	for range b.cfg.concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= len(specs) || sctx.Err() != nil {
					return
				}
				for {
					_, err := b.d.SpawnGang(sctx, specs[i])
					var se *api.SaturatedError
					switch {
					case err == nil || errors.Is(err, api.ErrExists):
						admitted.Add(1)
					case sctx.Err() != nil:
					case errors.As(err, &se):
						if sleepCtx(sctx, min(max(se.RetryAfter, 10*time.Millisecond), time.Second)) == nil {
							continue
						}
					case errors.Is(err, api.ErrUnavailable):
						if sleepCtx(sctx, 50*time.Millisecond) == nil {
							continue
						}
					default:
						mu.Lock()
						if first == nil {
							first = fmt.Errorf("submit %s/%s: %w", specs[i].Job, specs[i].Name, err)
						}
						mu.Unlock()
						cancel()
						return
					}
					break
				}
			}
		}()
	}
	wg.Wait()
	if first == nil && ctx.Err() != nil {
		first = ctx.Err()
	}
	return int(admitted.Load()), first
}

// schedLatency submits --probes 1-GPU gangs one after another and times each from its
// submission to its placement (the answer's record, or the gangs table's next records).
func (b *scaleBench) schedLatency(ctx context.Context) error {
	st, err := b.d.Status(ctx)
	if err != nil {
		return err
	}
	waiting := 0
	for _, g := range st.Gangs {
		if g.Job == scalePending && g.State == api.GangPending {
			waiting++
		}
	}
	b.res.PendingGangs = waiting
	b.say("scheduling latency: %d probes with %d gangs pending", b.cfg.probes, waiting)
	var lat []float64
	cp := &cpBench{cf: b.cf, d: b.d}
	before := cp.scrapeMetrics(ctx)
	profiled := make(chan error, 1)
	if b.cfg.probeProfile != "" {
		go func() {
			id, _, err := cp.leaderNow(ctx)
			if err == nil {
				err = b.headProfile(ctx, id, "profile", b.cfg.probeProfile, b.cfg.probeProfileFor)
			}
			profiled <- err
		}()
	} else {
		profiled <- nil
	}
	inAnswer := 0
	for i := range b.cfg.probes {
		spec := api.GangSpec{Job: scaleJob, Name: fmt.Sprintf("probe%05d", i), Kind: "hollow", Workers: 1, Resources: api.Resources{GPUs: 1}}
		start := time.Now()
		g, err := b.d.SpawnGang(ctx, spec)
		if err != nil {
			return fmt.Errorf("probe %d: %w", i, err)
		}
		if g.Placement != nil && g.State != api.GangPending {
			inAnswer++
		}
		for g.Placement == nil || g.State == api.GangPending {
			if time.Since(start) > time.Minute {
				return fmt.Errorf("probe %s not placed within a minute (%s: %s)", spec.Name, g.State, g.Reason)
			}
			if _, err := b.d.Get(ctx, api.TableGangs+spec.Key(), &g); err != nil {
				return err
			}
			if g.Placement == nil || g.State == api.GangPending {
				_ = sleepCtx(ctx, time.Millisecond)
			}
		}
		lat = append(lat, float64(time.Since(start).Microseconds())/1e3)
	}
	after := cp.scrapeMetrics(ctx)
	if err := <-profiled; err != nil {
		b.res.Notes = append(b.res.Notes, "probe-cpuprofile: "+err.Error())
	}
	slices.Sort(lat)
	p50, p99 := round2(percentile(lat, 0.50)), round2(percentile(lat, 0.99))
	b.res.SchedP50MS, b.res.SchedP99MS = &p50, &p99
	b.res.SchedMaxMS = round2(lat[len(lat)-1])
	b.res.ProbesPlacedInAnswer = inAnswer
	// What the heads did meanwhile (a follower counts nothing): cycles run and their mean,
	// commits and their mean, from the histograms' sums and counts.
	diff := func(name string) float64 { return after[name] - before[name] }
	if n := diff("atoll_schedule_cycle_seconds_count"); n > 0 {
		b.res.ProbeCycles = int(n)
		b.res.ProbeCycleMeanMS = round2(diff("atoll_schedule_cycle_seconds_sum") / n * 1e3)
	}
	if n := diff("atoll_paxos_commit_seconds_count"); n > 0 {
		b.res.ProbeCommits = int(n)
		b.res.ProbeCommitMeanMS = round2(diff("atoll_paxos_commit_seconds_sum") / n * 1e3)
	}
	return nil
}

// profileHeads starts the CPU profiles of every head but skip (0: none) over span, to
// PREFIX-head<ID>.pprof; the function it returns waits for them and notes their errors
// under flag's name.
func (b *scaleBench) profileHeads(ctx context.Context, flag, prefix string, span time.Duration, skip uint64) func() {
	var profiles []chan error
	for _, h := range b.cf.Heads {
		if h.ID == skip {
			continue
		}
		done := make(chan error, 1)
		profiles = append(profiles, done)
		file := fmt.Sprintf("%s-head%d.pprof", prefix, h.ID)
		go func() { done <- b.headProfile(ctx, h.ID, "profile", file, span) }()
		if b.cfg.profileTrace {
			done := make(chan error, 1)
			profiles = append(profiles, done)
			file := fmt.Sprintf("%s-head%d.trace", prefix, h.ID)
			go func() { done <- b.headProfile(ctx, h.ID, "trace", file, span) }()
		}
	}
	return func() {
		for _, done := range profiles {
			if err := <-done; err != nil {
				b.res.Notes = append(b.res.Notes, flag+": "+err.Error())
			}
		}
	}
}

// headProfile writes head id's CPU profile or execution trace (kind "profile" or "trace")
// over span to file (its /debug/pprof/KIND, with the bench's admin credential).
func (b *scaleBench) headProfile(ctx context.Context, id uint64, kind, file string, span time.Duration) error {
	var base string
	for _, h := range b.cf.Heads {
		if h.ID == id {
			base = h.API
		}
	}
	if base == "" {
		return fmt.Errorf("head %d is not in the cluster's file", id)
	}
	url := fmt.Sprintf("%s/debug/pprof/%s?seconds=%d", base, kind, max(1, int(span.Seconds())))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+b.d.token)
	resp, err := b.d.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, io.LimitReader(resp.Body, 1<<30)); err != nil {
		f.Close()
		return fmt.Errorf("%s: %w", url, err)
	}
	return f.Close()
}

// loseMachine SIGKILLs the process of the last hollow machine and times its death in the
// leader's status.
func (b *scaleBench) loseMachine(ctx context.Context) error {
	p := b.hollows[len(b.hollows)-1]
	name := hollowName(b.cfg.machines - 1)
	b.say("lost machine: killing %s (pid %d)", name, p.PID)
	start := time.Now()
	if !p.signal(syscall.SIGKILL) {
		return fmt.Errorf("could not kill %s (pid %d)", p.Name, p.PID)
	}
	lctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		var m api.Machine
		found, err := b.d.Get(lctx, api.TableMachines+name, &m)
		if err == nil && found && !m.Alive {
			s := round2(time.Since(start).Seconds())
			b.res.LostMachineDetectS = &s
			how := "its load reports alone"
			if b.cfg.gossip > 0 {
				how = "its serf member and its load reports"
			}
			b.res.Notes = append(b.res.Notes, fmt.Sprintf("lost_machine_detect_s: %s, watched by %s; the machines table read every 20 ms", name, how))
			return nil
		}
		if err := sleepCtx(lctx, 20*time.Millisecond); err != nil {
			return fmt.Errorf("%s not declared dead within a minute of its SIGKILL", name)
		}
	}
}

// failover SIGKILLs the leader and times the first submission a new leader admits.
func (b *scaleBench) failover(ctx context.Context) error {
	cp := &cpBench{cf: b.cf, d: b.d, gpm: 8, res: &cpResult{}}
	leader, p, err := cp.leaderNow(ctx)
	if err != nil {
		return err
	}
	if _, err := b.d.SubmitJob(ctx, api.Job{Name: "bench-cp-pending"}); err != nil && !errors.Is(err, api.ErrExists) {
		return err
	}
	var profiled func()
	if b.cfg.failoverProfile != "" {
		profiled = b.profileHeads(ctx, "failover-cpuprofile", b.cfg.failoverProfile, b.cfg.failoverProfileFor, leader)
		// The profile handlers start when the requests arrive: give them a moment, so that
		// the profiles hold the kill's first instants.
		_ = sleepCtx(ctx, 500*time.Millisecond)
	}
	b.say("failover: killing leader head %d", leader)
	elected, inOffice, _, err := cp.killAndProbe(ctx, leader, p)
	if profiled != nil {
		profiled()
	}
	if err != nil {
		return err
	}
	s, e := round2(inOffice.Seconds()), round2(elected.Seconds())
	b.res.FailoverS, b.res.FailoverElectedS = &s, &e
	return nil
}
